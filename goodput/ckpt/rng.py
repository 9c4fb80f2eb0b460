"""Per-rank random-number state: captured with a checkpoint, restored on resume.

Captured per rank: Python's ``random``, numpy's legacy global generator, torch's CPU generator
and, where CUDA is present, every device's generator. Semantics when the world size changes (N
ranks saved, M load): rank r restores the state rank r saved when r < N; a rank r ≥ N (the job
grew) takes rank ``r mod N``'s state and then re-seeds all generators from a hash of that state
and r, so no two ranks draw the same stream. Bitwise reproduction across a resize is possible
only where the new layout consumes random numbers as the old one did; the demo states what it
checks.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": np.asarray(keys, np.uint32).copy(), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state().clone(),
    }  # fmt: skip
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        state["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return state


def template(saved: set[str] | None = None) -> dict[str, Any]:
    """A state of the right shapes to load a captured one into (in place), holding only the
    generators the checkpoint has (``saved``: names below ``rng.``, e.g. ``cuda.0``): a state
    saved without CUDA restores on a GPU machine, and the other way round."""
    t = capture()
    t["numpy"]["keys"] = np.zeros_like(t["numpy"]["keys"])
    if saved is not None:
        tops = {n.split(".")[0] for n in saved}
        t = {k: v for k, v in t.items() if k in tops}
        if "cuda" in t:
            n = len({x for x in saved if x.startswith("cuda.")})
            t["cuda"] = t["cuda"][:n]  # where fewer devices are visible now, the rest stay saved
    return t


def apply(state: dict[str, Any], reseed_with: int | None = None) -> None:
    if "python" in state:
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
    if "numpy" in state:
        n = state["numpy"]
        np.random.set_state((n["kind"], n["keys"], n["pos"], n["has_gauss"], n["gauss"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # pragma: no cover - GPU machines
        torch.cuda.set_rng_state_all(state["cuda"])
    if reseed_with is not None:
        basis = state["torch"].numpy().tobytes() if "torch" in state else b""
        h = hashlib.sha256(basis + reseed_with.to_bytes(8, "little")).digest()
        seed = int.from_bytes(h[:8], "little")
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)
