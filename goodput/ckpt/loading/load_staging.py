"""The load's staging buffer: how tensors with no writable contiguous host memory are filled.

Non-contiguous views and CUDA tensors cannot be read into directly. They are filled through one
reused host buffer (pinned when a CUDA target needs it), piece by piece, so that a load's host
memory stays within the targets plus the read buffer plus this buffer, however large they are.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import prod

import numpy as np
import torch

from ..errors import CheckpointError
from ..format.dtypes import dtype as dtype_info
from ..format.geometry import Region
from ..state import TensorLeaf

STAGING_ALIGN = 64  # every dtype's alignment, so any piece's bytes can be viewed as its dtype


def default_staging(read_buffer: int) -> int:
    """A quarter of the read buffer keeps the staged load's extra memory proportionate to what
    the caller already allowed; the 1 MiB floor keeps tiny read buffers from forcing thousands
    of rounds, and the 64 MiB cap is where a round's fixed costs (planning, opening files) are
    already small next to the bytes it moves."""
    return min(64 << 20, max(read_buffer // 4, 1 << 20))


@dataclass
class StagedPiece:
    """One sub-region of a staged leaf, read into ``[offset, end)`` of the staging buffer."""

    leaf: TensorLeaf
    region: Region  # global coordinates, as the reader wants
    slices: tuple[slice, ...]  # the same part of ``leaf.local``
    shape: tuple[int, ...]
    offset: int
    end: int


def split_leaf(lf: TensorLeaf, cap: int) -> list[tuple[Region, tuple[slice, ...], tuple[int, ...]]]:
    """Cut a leaf into row-major sub-regions of at most ``cap`` bytes (never under one element),
    splitting the outermost dimensions first so that each piece is as few, long runs as possible
    in both the saved chunks and the target."""
    item = dtype_info(lf.dtype).itemsize
    per = max(1, cap // item)  # elements per piece
    src = lf.region
    if src.is_flat:
        n = src.flat_count
        ndim = len(src.offsets)
        return [
            (
                Region.flat(src.flat_start + a, min(per, n - a), ndim),
                (slice(a, a + min(per, n - a)),),
                (min(per, n - a),),
            )
            for a in range(0, n, per)
        ]
    sizes = src.sizes
    if not sizes:
        return [(src, (), ())]
    k = 0
    while prod(sizes[k + 1 :]) > per:
        k += 1
    inner = prod(sizes[k + 1 :])
    blk = max(1, per // inner)
    out = []
    for outer in itertools.product(*(range(s) for s in sizes[:k])):
        for j in range(0, sizes[k], blk):
            n = min(blk, sizes[k] - j)
            local = (*outer, j) + (0,) * (len(sizes) - k - 1)
            shape = (1,) * k + (n,) + tuple(sizes[k + 1 :])
            slices = tuple(slice(a, a + s) for a, s in zip(local, shape))
            region = Region.box(tuple(o + a for o, a in zip(src.offsets, local)), shape)
            out.append((region, slices, shape))
    return out


def staging_rounds(staged: list[TensorLeaf], cap: int) -> list[list[StagedPiece]]:
    """Pack the staged leaves' pieces, in order, into rounds that each fit one buffer of ``cap``
    bytes (or one piece, if a single element is larger)."""
    rounds: list[list[StagedPiece]] = []
    cur: list[StagedPiece] = []
    off = 0
    for lf in staged:
        item = dtype_info(lf.dtype).itemsize
        for region, slices, shape in split_leaf(lf, cap):
            nbytes = region.numel * item
            start = -(-off // STAGING_ALIGN) * STAGING_ALIGN
            if cur and start + nbytes > cap:
                rounds.append(cur)
                cur, start = [], 0
            cur.append(StagedPiece(lf, region, slices, shape, start, start + nbytes))
            off = start + nbytes
    if cur:
        rounds.append(cur)
    return rounds


class StagingBuffer:
    """The one host buffer every staged piece passes through; pinned when a CUDA target needs it,
    so the host-to-device copies run at full speed and may be asynchronous."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.bytes: np.ndarray = self.tensor.numpy()
        self.pinned = pin

    def copy_out(self, pieces: list[StagedPiece]) -> None:
        """Copy each piece to its target; returns only once the buffer may be overwritten."""
        devices: set[torch.device] = set()
        with torch.no_grad():
            for p in pieces:
                target = p.leaf.local
                # the bytes are the saved dtype's (``leaf.dtype``); copying into the target casts
                # where the target's dtype differs (DCP's load does, unless strict_dtype)
                if isinstance(target, np.ndarray):
                    saved = dtype_info(p.leaf.dtype).numpy
                    view = self.bytes[p.offset : p.end].view(saved or target.dtype).reshape(p.shape)
                    _fits(p.leaf.name, view, target.dtype)
                    np.copyto(target[p.slices] if p.slices else target[...], view, casting="unsafe")
                    continue
                view = self.tensor[p.offset : p.end].view(getattr(torch, p.leaf.dtype)).view(p.shape)
                if not (view.dtype.is_floating_point or view.dtype.is_complex or view.dtype == torch.bool):
                    _fits(p.leaf.name, view.numpy(), target.dtype)
                dst = target[p.slices] if p.slices else target
                if self.pinned and dst.device.type == "cuda":
                    dst.copy_(view, non_blocking=True)
                    devices.add(dst.device)
                else:
                    dst.copy_(view, non_blocking=False)
        for dev in devices:  # pragma: no cover - exercised on GPU machines
            torch.cuda.current_stream(dev).synchronize()


def _fits(name: str, saved: np.ndarray, target: torch.dtype | np.dtype) -> None:
    """An integer tensor cast into a narrower integer or a bool target: every value must fit, or
    the cast would wrap around (int64 300 into int8 is 44) or fold to True, in silence. Checked
    on the saved values as read; a widening cast, or one between floats, is not checked."""
    if saved.dtype.kind not in "iu" or saved.size == 0:
        return
    t = np.dtype(target) if not isinstance(target, torch.dtype) else torch.empty((), dtype=target).numpy().dtype
    if t.kind == "b":
        lo, hi = 0, 1
    elif t.kind in "iu":
        lo, hi = int(np.iinfo(t).min), int(np.iinfo(t).max)
    else:
        return
    src = np.iinfo(saved.dtype)
    if lo <= int(src.min) and int(src.max) <= hi:
        return  # every value of the saved dtype fits
    mn, mx = int(saved.min()), int(saved.max())
    if mn < lo or mx > hi:
        bad = mn if mn < lo else mx
        raise CheckpointError(
            f"tensor {name!r}: saved as {saved.dtype}, loading into {t}: the value {bad} does not fit "
            f"({lo} to {hi}); the cast would change it in silence"
        )


def staging_like(staged: list[TensorLeaf], nbytes: int) -> StagingBuffer:
    """Pinned only when some target is on a GPU and CUDA is usable: pinning costs page-locked
    memory and a CUDA context, which a CPU-only load must never pay for."""
    pin = (
        nbytes > 0
        and any(isinstance(lf.local, torch.Tensor) and lf.local.device.type == "cuda" for lf in staged)
        and torch.cuda.is_available()
    )
    return StagingBuffer(nbytes, pin)
