"""load: the entry point of the load path; fill a state dict in place from a checkpoint, and verify.

What each rank reads is decided by the layout of the tensors it passes, whatever layout the
checkpoint was saved with: the metadata (:mod:`goodput.ckpt.reader`) is intersected with the
requested regions into a read plan (:mod:`goodput.ckpt.read_plan`), which is executed with
bounded memory and every block checksum verified (:mod:`goodput.ckpt.read_exec`). Targets that
cannot be read into directly go through :mod:`goodput.ckpt.load_staging`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .format import decode_value
from .load_staging import default_staging, staging_like, staging_rounds
from .read_exec import DEFAULT_READ_BUFFER, ReadStats
from .read_plan import Request
from .reader import Checkpoint
from .state import TensorLeaf, dest_bytes, flatten
from .storage import checkpoint_path


@dataclass
class LoadResult:
    path: Path
    step: int | None
    stats: ReadStats
    timings: dict[str, float] = field(default_factory=dict)


def load(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    process_group: Any = None,
    verify: bool = True,
    read_buffer: int = DEFAULT_READ_BUFFER,
    threads: int = 4,
    strict: bool = True,
    no_dist: bool = False,
    max_amplification: float = 1.1,
    staging_bytes: int | None = None,
) -> LoadResult:
    """Fill ``state_dict`` in place from the checkpoint at ``path``.

    What each rank reads is decided by the layout of the tensors it passes (DTensor placements,
    LocalShard/FlatShard declarations, or whole tensors), whatever layout the checkpoint was
    saved with. ``process_group`` and ``no_dist`` are accepted for DCP compatibility: a load needs
    no collective. Reads are coalesced across gaps while the bytes read stay within
    ``max_amplification`` × the bytes needed (raise it for fewer, larger reads).

    Tensors with no writable contiguous host memory (non-contiguous views, CUDA tensors) are
    filled through one reused staging buffer of ``staging_bytes`` (default
    ``min(64 MiB, max(read_buffer // 4, 1 MiB))``), piece by piece, so that a load's host memory
    stays within the targets plus ``read_buffer`` plus ``staging_bytes``, however large they are.
    """
    t0 = time.perf_counter()
    if staging_bytes is not None and not (isinstance(staging_bytes, int) and staging_bytes > 0):
        raise ValueError(f"staging_bytes must be a positive int, got {staging_bytes!r}")
    piece_cap = staging_bytes if staging_bytes is not None else default_staging(read_buffer)
    path = checkpoint_path(path, checkpoint_id)
    ck = Checkpoint(path)
    leaves, value_leaves = flatten(state_dict)
    saved = {t.name: t for t in ck.metadata.tensors}
    requests: list[Request] = []
    staged: list[TensorLeaf] = []
    for lf in leaves:
        t = saved.get(lf.name)
        if t is None:
            if lf.name in ck.metadata.values:
                raise CheckpointError(
                    f"{lf.name!r} was saved as a value ({ck.metadata.values[lf.name]!r}), not a tensor"
                )
            if strict:
                raise CheckpointError(
                    f"tensor {lf.name!r} is not in the checkpoint at {str(path)!r} ({_near(lf.name, saved)})"
                )
            continue
        if tuple(t.shape) != tuple(lf.global_shape):
            raise CheckpointError(
                f"tensor {lf.name!r}: saved with global shape {tuple(t.shape)}, loading into {tuple(lf.global_shape)}"
            )
        if t.dtype != lf.dtype:
            raise CheckpointError(f"tensor {lf.name!r}: saved as {t.dtype}, loading into {lf.dtype}")
        if lf.region.numel == 0:
            continue
        dest = dest_bytes(lf.local)
        if dest is None:
            staged.append(lf)
        else:
            requests.append(Request(lf.name, lf.region, dest))
    for v in value_leaves:
        if v.name not in ck.metadata.values:
            if v.name in saved:
                raise CheckpointError(
                    f"{v.name!r} was saved as a tensor, the state dict holds a {type(v.value).__name__}"
                )
            if strict:
                raise CheckpointError(f"value {v.name!r} is not in the checkpoint at {str(path)!r}")
            continue
        new = decode_value(ck.metadata.values[v.name])
        if isinstance(v.parent, tuple):
            if new != v.value:
                raise CheckpointError(f"{v.name!r} lives in a tuple and cannot be replaced in place")
            continue
        v.parent[v.key] = new
    rounds = staging_rounds(staged, piece_cap)
    buf = staging_like(staged, max((p.end for r in rounds for p in r), default=0))
    stats = ReadStats()
    for i, pieces in enumerate(rounds or [[]]):  # direct requests ride with the first round
        reqs = (requests if i == 0 else []) + [
            Request(p.leaf.name, p.region, buf.bytes[p.offset : p.end]) for p in pieces
        ]
        got = ck.read_into(
            reqs, verify=verify, read_buffer=read_buffer, threads=threads, max_amplification=max_amplification
        )
        stats.add(**got.as_dict())
        buf.copy_out(pieces)
    return LoadResult(path, ck.step, stats, {"total_s": time.perf_counter() - t0})


def _near(name: str, saved: dict) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(saved), n=3)
    return f"did you mean {', '.join(map(repr, close))}?" if close else f"it holds {len(saved)} tensors"


def verify(path: str | os.PathLike, progress: Any = None) -> int:
    """Check every chunk and block checksum of a committed checkpoint; returns bytes checked."""
    return Checkpoint(path).verify(progress)
