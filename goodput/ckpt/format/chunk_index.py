"""The spatial index of a checkpoint's chunks, built once when its metadata is read.

Every saved chunk becomes boxes (a flat range is cut into at most 2D-1) in one matrix, sorted by
(tensor, start along the dimension the tensor is split along). Starts are shifted per tensor so
one sorted key array serves every tensor: a planner finds the chunks that can meet a requested
box with two binary searches, and validation proves that no two chunks of a tensor overlap by
comparing each box only with the boxes that start before it ends. Built in numpy for all chunks
at once; the torch-free reader uses it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .geometry import Region, cut_flat_many, row_major_strides_many, split_dims

# proving disjointness compares each box with the boxes that start inside it along the chosen
# dimension: about (boxes sharing a start) per box for real layouts (a 128 x 128 grid: 64);
# beyond this the metadata is refused rather than spending minutes on it
MAX_PAIRS_PER_BOX = 256
MAX_PAIRS = 1 << 25


@dataclass(frozen=True)
class BoxTable:
    """Saved boxes as rows of ``boxes``: lo | hi | strides | base | chunk row | tensor.

    ``strides`` and ``base`` map global coordinates to element offsets inside the chunk's stored
    bytes. Rows are sorted by ``keys`` = ``offset[tensor] + start along split_dim[tensor]``.
    """

    ndim: int
    boxes: np.ndarray  # (n, 3D + 3) int64
    keys: np.ndarray  # (n,)
    offset: np.ndarray  # (T,) key offset of each tensor
    split_dim: np.ndarray  # (T,)
    reach: np.ndarray  # (T,) longest extent along the split dimension

    @property
    def cols(self) -> tuple[slice, slice, slice, int, int, int]:
        D = self.ndim
        return slice(0, D), slice(D, 2 * D), slice(2 * D, 3 * D), 3 * D, 3 * D + 1, 3 * D + 2


def build_box_table_from(
    shapes: np.ndarray,
    ndims: np.ndarray,
    tid: np.ndarray,
    flat_start: np.ndarray,
    flat_count: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
) -> BoxTable:
    """The index of regions given as metadata-style columns: ``shapes`` (T × D, padded with 1)
    and ``ndims`` per tensor; per region its tensor, flat range (start -1 for a box) and box
    (``offsets``/``sizes``, D wide or 0 wide when every tensor is a scalar)."""
    T, D = shapes.shape
    ncol = 3 * D + 3
    LO, HI, ST, BASE, ROW, TEN = slice(0, D), slice(D, 2 * D), slice(2 * D, 3 * D), 3 * D, 3 * D + 1, 3 * D + 2
    is_flat = flat_start >= 0
    brow = np.flatnonzero(~is_flat)
    B = np.empty((len(brow), ncol), np.int64)
    B[:, ROW] = brow
    B[:, TEN] = tid[brow]
    if offsets.shape[1] == D:
        B[:, LO] = offsets[brow]
        size = np.where(np.arange(D)[None, :] < ndims[tid[brow]][:, None], sizes[brow], 1)
    else:  # only scalar tensors: no box columns
        B[:, LO] = 0
        size = np.ones((len(brow), D), np.int64)
    B[:, HI] = B[:, LO] + size
    B[:, ST] = row_major_strides_many(size)
    B[:, BASE] = -(B[:, LO] * B[:, ST]).sum(axis=1)
    frow = np.flatnonzero(is_flat)
    if len(frow):
        fs = flat_start[frow]
        shape = shapes[tid[frow]]
        own, lo, hi = cut_flat_many(fs, flat_count[frow], shape)
        F = np.empty((len(own), ncol), np.int64)
        F[:, LO], F[:, HI] = lo, hi
        F[:, ST] = row_major_strides_many(shape)[own]
        F[:, BASE] = -fs[own]
        F[:, ROW] = frow[own]
        F[:, TEN] = tid[frow][own]
        B = np.concatenate([B, F])
    B = B[np.all(B[:, HI] > B[:, LO], axis=1)]  # empty chunks hold nothing to find
    if np.any(B[:, LO] < 0) or np.any(B[:, HI] > shapes[B[:, TEN]]):
        raise ValueError("a chunk lies outside its tensor")
    # each tensor's keys live in [offset, offset + span) along its split dimension, so a box
    # inside the tensor never reaches the next tensor's keys; sum the spans in floating point
    # first so that hostile shapes cannot wrap the int64 offsets
    if T and float(shapes.max(axis=1).astype(np.float64).sum() + T) >= 2.0**62:
        raise ValueError("tensor extents too large to index together")
    kd = _best_dims(B, shapes, T)
    k_of = kd[B[:, TEN]]
    idx = np.arange(len(B))
    start, stop = B[idx, k_of], B[idx, D + k_of]
    span = (shapes[np.arange(T), kd] if T else np.zeros(0, np.int64)) + 1
    offset = np.concatenate([[0], np.cumsum(span)[:-1]]).astype(np.int64)
    keys = offset[B[:, TEN]] + start
    order = np.argsort(keys, kind="stable")
    B, keys = B[order], keys[order]
    reach = np.zeros(T, np.int64)
    if len(B):
        ten = B[:, TEN]
        first = np.flatnonzero(np.concatenate([[True], ten[1:] != ten[:-1]]))
        reach[ten[first]] = np.maximum.reduceat((stop - start)[order], first)
    return BoxTable(D, B, keys, offset, kd, reach)


def _window_pairs(B: np.ndarray, shapes: np.ndarray, T: int, d: int) -> np.ndarray:
    """Per tensor, how many (box, later box) pairs a scan sorted along dimension ``d`` compares."""
    D = shapes.shape[1]
    ten = B[:, 3 * D + 2]
    span = shapes[:, d] + 1
    offset = np.concatenate([[0], np.cumsum(span)[:-1]]).astype(np.int64)
    keys = offset[ten] + B[:, d]
    order = np.argsort(keys, kind="stable")
    end = np.searchsorted(keys[order], (offset[ten] + B[:, D + d])[order], side="left")
    count = np.maximum(end - np.arange(1, len(B) + 1), 0)
    return np.bincount(ten[order], weights=count, minlength=T)


def _best_dims(B: np.ndarray, shapes: np.ndarray, T: int) -> np.ndarray:
    """Per tensor, the dimension whose sorted scan compares the fewest pairs: the one it is split
    along for row, column and grid shards, and never a poor one for a layout built to fool a
    cheaper guess (one counted by :func:`goodput.ckpt.format.geometry.split_dims`, say)."""
    D = shapes.shape[1]
    if D <= 1 or len(B) == 0:
        return np.zeros(T, np.int64)
    guess = split_dims(B[:, 3 * D + 2], B[:, :D], T)
    pairs = np.stack([_window_pairs(B, shapes, T, d) for d in range(D)])  # (D, T)
    best = np.argmin(pairs, axis=0)
    # keep the cheap guess where it is as good (ties between dims resolve the same way as before)
    return np.where(pairs[guess, np.arange(T)] <= pairs[best, np.arange(T)], guess, best)


def overlapping_chunks(t: BoxTable, batch: int | None = None) -> tuple[int, int] | None:
    """Chunk rows of two boxes of one tensor that share an element, or None.

    A box can only meet boxes sorted after it whose start lies before its end, so each is compared
    with that window only, in batches of at most ``batch`` pairs (bounded memory for any input)."""
    B = t.boxes
    n = len(B)
    if n < 2:
        return None
    LO, HI, _, _, ROW, TEN = t.cols
    ten = B[:, TEN]
    k_of = t.split_dim[ten]
    stop = B[np.arange(n), t.ndim + k_of]
    end = np.searchsorted(t.keys, t.offset[ten] + stop, side="left")
    first = np.arange(1, n + 1)  # sorted box i meets at most boxes [i + 1, end[i])
    count = np.maximum(end - first, 0)
    cum = np.cumsum(count)
    total = int(cum[-1])
    if total > MAX_PAIRS_PER_BOX * n + MAX_PAIRS:
        raise ValueError(
            f"{n} chunk boxes would need {total} comparisons to prove them disjoint: "
            "not a layout any parallelism produces"
        )
    step = batch or max(1 << 12, (1 << 24) // (8 * max(t.ndim, 1)))  # about 16 MiB per gathered array
    for p0 in range(0, total, step):
        p = np.arange(p0, min(p0 + step, total), dtype=np.int64)
        i = np.searchsorted(cum, p, side="right")  # the box whose window holds pair p
        j = first[i] + (p - (cum[i] - count[i]))
        meet = np.all(np.minimum(B[i, HI], B[j, HI]) > np.maximum(B[i, LO], B[j, LO]), axis=1)
        meet &= B[i, ROW] != B[j, ROW]  # pieces of one flat chunk never overlap each other
        if meet.any():
            k = int(np.argmax(meet))
            return int(B[i[k], ROW]), int(B[j[k], ROW])
    return None


def tiling_errors_columns(
    shape_t: np.ndarray,
    ndims: np.ndarray,
    tid: np.ndarray,
    fs: np.ndarray,
    fc: np.ndarray,
    offs: np.ndarray,
    sizes: np.ndarray,
    region_at: Callable[[int], Region],
) -> tuple[int, str] | None:
    """Why the rows do not tile their tensors exactly, as ``(tensor index, reason)``, or None.

    All tensors are checked at once (the save path checks every tensor the ranks declared, 16k
    ranks × thousands of tensors): each region lies inside its tensor, no two share an element,
    and their elements add up to every tensor's. ``shape_t`` is (tensors, D) right-padded with 1,
    (at least one column), ``offs``/``sizes`` are (rows, D) padded with 0 (D may be 0 when every
    tensor is a scalar); ``region_at(i)`` names row i in messages.
    """
    T = len(shape_t)
    D = offs.shape[1]
    numel = shape_t.prod(axis=1)
    real = np.arange(D)[None, :] < ndims[tid][:, None]
    box = fs < 0
    outside = np.where(
        box,
        np.any(real & ((offs < 0) | (sizes < 0) | (offs > shape_t[tid][:, :D] - sizes)), axis=1),
        (fc < 0) | (fs > numel[tid] - fc),
    )

    def shape_of(t: int) -> tuple[int, ...]:
        return tuple(int(x) for x in shape_t[t, : int(ndims[t])])

    if outside.any():
        i = int(np.argmax(outside))
        return int(tid[i]), f"{region_at(i).describe()} lies outside the tensor (shape {shape_of(int(tid[i]))})"
    table = build_box_table_from(shape_t, ndims, tid, fs, fc, offs, sizes)
    pair = overlapping_chunks(table)
    if pair is not None:
        a, b = pair
        return int(tid[a]), f"{region_at(a).describe()} and {region_at(b).describe()} overlap"
    held = np.zeros(T, np.int64)
    elems = np.where(box, np.where(real, sizes, 1).prod(axis=1) if D else 1, fc)
    np.add.at(held, tid, elems)
    short = np.flatnonzero(held != numel)
    if len(short):
        t = int(short[0])
        return t, f"the pieces hold {int(held[t])} of the tensor's {int(numel[t])} elements (shape {shape_of(t)})"
    return None
