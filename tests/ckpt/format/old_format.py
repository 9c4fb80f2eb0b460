"""Checkpoints written by an earlier build, kept so that every later build must still read them.

``tests/ckpt/format/data/v1-5fe0497/`` was written by commit 5fe0497 (format version 1, before the
ckpt-house restructuring) with ``python -m tests.ckpt.format.old_format <dir>``; the test rebuilds the
same state from the same seeds and compares it bit for bit with what the current code loads.
Never regenerate it with newer code: its worth is that older code wrote it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

WORLD = 2
GLOBAL = (6, 10)  # the sharded tensor: rank r holds rows [3r, 3r + 3)
FLAT_N = 37  # the flat-sharded tensor: rank 0 holds [0, 20), rank 1 [20, 37)
STEP = 1234
USER = {"run": "old-format", "tokens": 987654321}


def replicated_state() -> dict[str, Any]:
    """What every rank holds whole (saved once, by one rank)."""
    g = torch.Generator().manual_seed(7)
    return {
        "model": {
            "w32": torch.randn(5, 7, generator=g),
            "bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16),
            "f16": torch.randn(9, generator=g).to(torch.float16),
            "f64": torch.randn(2, 2, 2, generator=g, dtype=torch.float64),
            "i8": torch.randint(-128, 127, (11,), generator=g, dtype=torch.int8),
            "i64": torch.randint(-(2**40), 2**40, (3, 4), generator=g, dtype=torch.int64),
            "flags": torch.randint(0, 2, (13,), generator=g).bool(),
            "scalar": torch.tensor(3.25),
            "empty": torch.zeros(0, 4),
        },
        "np": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "step": STEP,
        "lr": 3e-4,
        "nan": math.nan,
        "pair": (1, "two"),
        "groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0, 1, 2]}],
        "name": "run-α",
        "none": None,
    }


def global_sharded() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    return torch.randn(*GLOBAL, generator=g)


def global_flat() -> torch.Tensor:
    g = torch.Generator().manual_seed(13)
    return torch.randn(FLAT_N, generator=g)


def rank_state(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s whole state dict as it was saved."""
    from goodput.ckpt import FlatShard, LocalShard

    rows = GLOBAL[0] // WORLD
    lo, hi = (0, 20) if rank == 0 else (20, FLAT_N)
    return {
        **replicated_state(),
        "tp": LocalShard(global_sharded()[rank * rows : (rank + 1) * rows].clone(), GLOBAL, (rank * rows, 0)),
        "zero": FlatShard(global_flat()[lo:hi].clone(), (FLAT_N,), lo),
    }


def _save_rank(rank: int, world: int, path: str) -> None:
    import goodput.ckpt as gc

    gc.save(rank_state(rank), path, step=STEP, user=USER)


def main(out: str) -> None:
    from tests.distributed import run_ranks

    Path(out).mkdir(parents=True, exist_ok=False)
    run_ranks(_save_rank, WORLD, out)


if __name__ == "__main__":
    main(sys.argv[1])


# ``tests/ckpt/format/data/v1-5fe0497-tagkeys/``: version 1 knew three value tags (__tuple__,
# __float__, __dict__) and wrote any other one-key dict of a user's as it was, among them dicts
# keyed by the five names version 2 made tags. Written by commit 5fe0497's goodput, single
# process, with ``TAG_KEYS_STEP``, ``TAG_KEYS_USER`` and ``{"w": tag_keys_tensor(), **tag_keyed_values()}``
# (``gc.save(state, dir, step=..., user=...)``, that build's code on PYTHONPATH ahead of this one).
TAG_KEYS_STEP = 42
TAG_KEYS_USER = {"why": "dicts keyed by tags that format version 1 did not have"}


def tag_keys_tensor() -> torch.Tensor:
    return torch.arange(6.0).reshape(2, 3)


def tag_keyed_values() -> dict[str, Any]:
    """Values whose dicts a version-2 reader would take for tags (two of them malformed ones)."""
    return {
        "blobs": [{"__bytes__": "aGk="}, {"__bytes__": "not base64!"}],
        "big": [{"__int__": "12345678901234567890123"}, {"__int__": "x"}],
        "pair": ({"__numpy__": ["<i4", 3]}, {"__torch__": ["dtype", "float32"]}),
        "groups": [{"__complex__": [1.0, 2.0]}, {"__torch__": ["Size", [2, 3]]}],
        "escaped": [{"__tuple__": [1, 2]}, {"__dict__": []}],
    }
