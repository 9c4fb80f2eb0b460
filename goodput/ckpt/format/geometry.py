"""Pure geometry of chunks: boxes, flat ranges, intersections and the byte runs between layouts.

A saved chunk and a requested piece are both *regions* of a global tensor: either an N-D box
(offsets, sizes), stored row-major inside the box, or a flat range of the tensor flattened
row-major (ZeRO / FSDP1 optimizer state). Every region has an affine address map
``addr(x) = base + strides . x`` (in elements) from global coordinates to its own storage, so one
routine turns "intersection of two regions" into "runs of contiguous bytes to copy": that is all
resharding is. A flat range is cut into at most ``2*ndim - 1`` boxes for intersection.

numpy only: the torch-free reader uses this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np


def row_major_strides(shape: tuple[int, ...] | list[int] | np.ndarray) -> np.ndarray:
    shape = [int(s) for s in shape]
    strides = np.ones(len(shape), dtype=np.int64)
    for j in range(len(shape) - 2, -1, -1):
        strides[j] = strides[j + 1] * shape[j + 1]
    return strides


@dataclass(frozen=True)
class Region:
    """A box (``offsets``/``sizes``) or, when ``flat_start >= 0``, a flat range of the tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    flat_start: int = -1
    flat_count: int = 0

    @staticmethod
    def box(offsets: tuple[int, ...] | list[int], sizes: tuple[int, ...] | list[int]) -> Region:
        return Region(tuple(int(o) for o in offsets), tuple(int(s) for s in sizes))

    @staticmethod
    def whole(shape: tuple[int, ...] | list[int]) -> Region:
        return Region((0,) * len(shape), tuple(int(s) for s in shape))

    @staticmethod
    def flat(start: int, count: int, ndim: int) -> Region:
        return Region((0,) * ndim, (0,) * ndim, int(start), int(count))

    @property
    def is_flat(self) -> bool:
        return self.flat_start >= 0

    @property
    def numel(self) -> int:
        return self.flat_count if self.is_flat else prod(self.sizes)

    def boxes(self, shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        if self.is_flat:
            return flat_to_boxes(self.flat_start, self.flat_count, shape)
        if self.numel == 0:
            return []
        return [(self.offsets, self.sizes)]

    def affine(self, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
        """(strides, base) with ``addr(x) = base + strides . x`` in elements of this region."""
        if self.is_flat:
            return row_major_strides(shape), -self.flat_start
        strides = row_major_strides(self.sizes)
        return strides, -int(np.dot(strides, np.asarray(self.offsets, dtype=np.int64)))

    def encode(self) -> list:
        """As sent between ranks and processes (msgpack): ``[offsets, sizes, flat_start, flat_count]``."""
        return [list(self.offsets), list(self.sizes), self.flat_start, self.flat_count]

    @staticmethod
    def decode(x: list) -> Region:
        return Region(tuple(x[0]), tuple(x[1]), int(x[2]), int(x[3]))

    def describe(self) -> str:
        if self.is_flat:
            return f"flat[{self.flat_start}:{self.flat_start + self.flat_count}]"
        return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(self.offsets, self.sizes)) + "]"


def flat_to_boxes(start: int, count: int, shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Cut the row-major range ``[start, start+count)`` of ``shape`` into at most 2d-1 boxes."""
    shape = tuple(int(s) for s in shape)
    if count <= 0:
        return []
    if len(shape) == 0:
        return [((), ())]
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    _flat_boxes(start, start + count, shape, (), out)
    return out


def _flat_boxes(a: int, b: int, shape: tuple[int, ...], prefix: tuple[int, ...], out: list) -> None:
    if a >= b:
        return
    d = len(shape)
    inner_shape = shape[1:]
    inner = prod(inner_shape)
    rest = (0,) * (d - 1)
    if d == 1:
        out.append((prefix + (a,), (1,) * len(prefix) + (b - a,)))
        return
    ones = (1,) * len(prefix)
    first, last = a // inner, (b - 1) // inner
    if first == last:
        _flat_boxes(a - first * inner, b - first * inner, inner_shape, prefix + (first,), out)
        return
    lo_full = -(-a // inner)  # first whole slab
    hi_full = b // inner  # one past the last whole slab
    if a % inner:
        _flat_boxes(a % inner, inner, inner_shape, prefix + (first,), out)
    if hi_full > lo_full:
        out.append((prefix + (lo_full,) + rest, ones + (hi_full - lo_full,) + inner_shape))
    if b % inner:
        _flat_boxes(0, b % inner, inner_shape, prefix + (hi_full,), out)


def runs(
    lo: np.ndarray,
    hi: np.ndarray,
    src: tuple[np.ndarray, int],
    dst: tuple[np.ndarray, int],
) -> tuple[np.ndarray, np.ndarray, int]:
    """Contiguous runs that copy the box ``[lo, hi)`` from one region's storage to another's.

    Returns ``(src_start, dst_start, run_elems)``: element offsets of each run in the source and
    destination storage, and the common length. Trailing dimensions that are contiguous in both
    layouts are merged, so a whole-chunk copy is one run.
    """
    s_strides, s_base = src
    d_strides, d_base = dst
    lo = np.asarray(lo, dtype=np.int64)
    size = np.asarray(hi, dtype=np.int64) - lo
    d = len(size)
    s0 = s_base + int(np.dot(s_strides, lo)) if d else s_base
    d0 = d_base + int(np.dot(d_strides, lo)) if d else d_base
    if d == 0:
        return np.array([s0], np.int64), np.array([d0], np.int64), 1
    if s_strides[-1] != 1 or d_strides[-1] != 1:
        raise ValueError("innermost dimension must be contiguous in both layouts")
    run = int(size[-1])
    j = d - 1  # dims [j, d) are merged into one run
    while j > 0 and s_strides[j - 1] == run and d_strides[j - 1] == run:
        run *= int(size[j - 1])
        j -= 1
    src_start = np.array([s0], np.int64)
    dst_start = np.array([d0], np.int64)
    for k in range(j - 1, -1, -1):
        steps = np.arange(int(size[k]), dtype=np.int64)
        src_start = (src_start[None, :] + (steps * s_strides[k])[:, None]).reshape(-1)
        dst_start = (dst_start[None, :] + (steps * d_strides[k])[:, None]).reshape(-1)
    # dims were expanded from inner to outer; sort so runs follow source order (sequential I/O)
    order = np.argsort(src_start, kind="stable")
    return src_start[order], dst_start[order], run


# --------------------------------------------------------------------------- vectorised forms
#
# The planner works on many regions of many tensors at once. Tensors of different rank share one
# array by padding every shape on the right to ``D`` dimensions with extent 1 (as the metadata's
# box columns are padded): a row-major address does not change, and a padded dimension never
# adds a run.


def row_major_strides_many(sizes: np.ndarray) -> np.ndarray:
    """Row-major strides of each row of ``sizes`` (n × D)."""
    strides = np.ones_like(sizes)
    for k in range(sizes.shape[1] - 2, -1, -1):
        strides[:, k] = strides[:, k + 1] * sizes[:, k + 1]
    return strides


def cut_flat_many(start: np.ndarray, count: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut flat ranges into boxes, all at once: ``(owner, lo, hi)`` with ``owner`` the row.

    Row ``i`` is the range ``[start[i], start[i] + count[i])`` of a tensor of ``shape[i]`` (n × D).
    Each range becomes at most ``2D - 1`` boxes: whole units of ever larger dimensions up to an
    aligned point (head), whole slabs of dimension 0 (middle), then ever smaller units down to the
    end (tail). The same cut as :func:`flat_to_boxes`, without a Python loop per range.
    """
    n, D = shape.shape
    strides = np.maximum(row_major_strides_many(shape), 1)  # an empty tensor has no pieces anyway
    total = strides[:, 0] * shape[:, 0] if D else np.ones(n, np.int64)
    parent = np.maximum(np.concatenate([total[:, None], strides[:, :-1]], axis=1), 1)  # unit of level k-1
    b = start.astype(np.int64) + count.astype(np.int64)
    down = b[:, None] // strides * strides  # b rounded down to each level's unit
    levels = [*range(D - 1, 0, -1), *range(D)]  # head, then middle (level 0) and tail
    bounds = np.empty((len(levels) + 1, n), np.int64)
    bounds[0] = start
    cur = bounds[0]
    for i, k in enumerate(levels):
        end = np.maximum(cur, down[:, k])
        if i < D - 1:  # a head piece stops at its parent's boundary
            end = np.minimum(end, -(-cur // parent[:, k]) * parent[:, k])
        bounds[i + 1] = end
        cur = end
    p, q = bounds[:-1], bounds[1:]  # (pieces, n)
    piece, owner = np.nonzero(q > p)
    if len(owner) == 0:
        return owner, np.zeros((0, D), np.int64), np.zeros((0, D), np.int64)
    k = np.asarray(levels, np.int64)[piece][:, None]
    p, q = p[piece, owner], q[piece, owner]
    st, sh = strides[owner], shape[owner]
    dims = np.arange(D)[None, :]
    lo = np.where(dims <= k, (p[:, None] // st) % sh, 0)
    size = np.where(dims < k, 1, np.where(dims == k, ((q - p)[:, None] // st), sh))
    return owner, lo, lo + size


def run_shape(
    size: np.ndarray, s_strides: np.ndarray, d_strides: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For boxes of ``size`` copied between two affine layouts: ``(run, j, nruns)``: elements per
    run (trailing dimensions contiguous in both layouts merged), the first merged dimension, and
    the number of runs (the product of the extents of the dimensions before ``j``)."""
    P, D = size.shape
    if D == 0:
        one = np.ones(P, np.int64)
        return one, np.zeros(P, np.int64), one
    run = size[:, D - 1].copy()
    j = np.full(P, D - 1, np.int64)
    active = np.ones(P, bool)
    for k in range(D - 2, -1, -1):
        active &= (s_strides[:, k] == run) & (d_strides[:, k] == run)
        run = np.where(active, run * size[:, k], run)
        j = np.where(active, k, j)
    outer = np.where(np.arange(D)[None, :] < j[:, None], size, 1)
    return run, j, outer.prod(axis=1)


def split_by_runs(
    lo: np.ndarray, hi: np.ndarray, j: np.ndarray, nruns: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut the boxes with more than ``budget`` runs along their outer dimensions (those before
    ``j``, so no run is cut) into boxes of at most ``budget`` runs (recursing into inner outer
    dimensions where one index of a dimension alone holds more): ``(owner, lo, hi)``, every box
    that needed no cut first. A column
    of a tall matrix is millions of one-element runs in one box: expanded whole, its runs alone
    would outgrow the read buffer a load promises to stay within."""
    big = np.flatnonzero(nruns > budget)
    if not len(big):
        return np.arange(len(lo), dtype=np.int64), lo, hi
    owners: list[int] = []
    los: list[np.ndarray] = []
    his: list[np.ndarray] = []

    def cut(i: int, a: np.ndarray, b: np.ndarray) -> None:
        ext = b - a
        outer = [k for k in range(int(j[i])) if ext[k] > 1]
        n = int(np.prod(ext[: int(j[i])], dtype=np.int64))
        if n <= budget or not outer:
            owners.append(i)
            los.append(a)
            his.append(b)
            return
        k = outer[0]
        per = n // int(ext[k])  # runs in one index of dimension k
        step = max(1, budget // per)
        for s in range(int(a[k]), int(b[k]), step):
            a2, b2 = a.copy(), b.copy()
            a2[k], b2[k] = s, min(int(b[k]), s + step)
            cut(i, a2, b2)

    for i in big.tolist():
        cut(i, lo[i].copy(), hi[i].copy())
    small = np.flatnonzero(nruns <= budget)
    D = lo.shape[1]
    return (
        np.concatenate([small, np.asarray(owners, np.int64)]),
        np.concatenate([lo[small], np.asarray(los, np.int64).reshape(-1, D)]),
        np.concatenate([hi[small], np.asarray(his, np.int64).reshape(-1, D)]),
    )


def expand_runs(
    lo: np.ndarray,
    hi: np.ndarray,
    s_strides: np.ndarray,
    s_base: np.ndarray,
    d_strides: np.ndarray,
    d_base: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`runs` for many boxes at once: ``(pair, src_start, dst_start, run_elems)``.

    Row ``i`` copies the box ``[lo[i], hi[i])`` between two affine layouts. Trailing dimensions
    contiguous in both are merged; each remaining outer index is one run, tagged by its row.
    """
    P, D = lo.shape
    size = hi - lo
    s0 = s_base + (lo * s_strides).sum(axis=1)
    d0 = d_base + (lo * d_strides).sum(axis=1)
    if D == 0:
        ones = np.ones(P, np.int64)
        return np.arange(P, dtype=np.int64), s0, d0, ones
    run, j, nruns = run_shape(size, s_strides, d_strides)
    if int(nruns.max(initial=1)) <= 1:
        return np.arange(P, dtype=np.int64), s0, d0, run
    outer = np.where(np.arange(D)[None, :] < j[:, None], size, 1)
    pair = np.repeat(np.arange(P, dtype=np.int64), nruns)
    k_idx = np.arange(len(pair), dtype=np.int64) - np.repeat(np.cumsum(nruns) - nruns, nruns)
    src = s0[pair]
    dst = d0[pair]
    for k in range(D - 1, -1, -1):
        ext = outer[pair, k]
        if not (ext > 1).any():
            continue
        idx = k_idx % ext
        k_idx //= ext
        src += idx * s_strides[pair, k]
        dst += idx * d_strides[pair, k]
    return pair, src, dst, run[pair]


def split_dims(group: np.ndarray, lo: np.ndarray, ngroups: int) -> np.ndarray:
    """For each group (tensor), the dimension its boxes are cut along: the one where the most
    boxes start past 0 (rows for row shards, columns for column shards, the finer cut of a grid:
    in an a x b grid that count is (a-1)b against a(b-1)). Sorting by starts along it keeps the
    window of boxes a query must look at small."""
    D = lo.shape[1]
    if D <= 1 or len(group) == 0:
        return np.zeros(ngroups, np.int64)
    counts = np.stack([np.bincount(group, weights=lo[:, d] > 0, minlength=ngroups) for d in range(D)])
    return np.argmax(counts, axis=0)
