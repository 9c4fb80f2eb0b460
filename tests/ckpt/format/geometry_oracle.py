"""Plain, slow readings of the chunk geometry, kept as oracles the vectorised code in
goodput.ckpt (chunk_index, read_plan, agreement) is tested against. Not used by the package."""

from __future__ import annotations

from math import prod

import numpy as np

from goodput.ckpt.format.chunk_index import tiling_errors_columns
from goodput.ckpt.format.geometry import Region


class BoxIndex:
    """Finds the saved boxes that meet a query box without looking at all of them.

    Boxes are sorted by their start along dimension 0; a query looks only at the window of starts
    that could reach it (``[q_lo - max_extent, q_hi)``), then tests the other dimensions
    vectorised. For row-sharded layouts (the common case: TP, FSDP, DP shards along dim 0) the
    window holds just the boxes that meet the query, so a plan costs O(log n + hits) per query.
    """

    def __init__(self, owner: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        self.ndim = lo.shape[1] if lo.ndim == 2 else 0
        if self.ndim == 0 or len(owner) == 0:
            self.owner, self.lo, self.hi = owner, lo, hi
            self.max_extent = 0
            return
        order = np.argsort(lo[:, 0], kind="stable")
        self.owner, self.lo, self.hi = owner[order], lo[order], hi[order]
        self.max_extent = int((self.hi[:, 0] - self.lo[:, 0]).max())

    def query(self, qlo: np.ndarray, qhi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(owner, lo, hi) of each non-empty intersection of the query with an indexed box."""
        if self.ndim == 0:
            return self.owner, self.lo, self.hi
        starts = self.lo[:, 0]
        a = int(np.searchsorted(starts, qlo[0] - self.max_extent, side="right"))
        b = int(np.searchsorted(starts, qhi[0], side="left"))
        lo = np.maximum(self.lo[a:b], qlo)
        hi = np.minimum(self.hi[a:b], qhi)
        keep = np.all(hi > lo, axis=1)
        return self.owner[a:b][keep], lo[keep], hi[keep]


def build_index(shape: tuple[int, ...], regions: list[Region], owners: list[int]) -> BoxIndex:
    """Index the boxes of saved regions (flat ranges cut into boxes), each tagged by its owner."""
    d = len(shape)
    own: list[int] = []
    los: list[tuple[int, ...]] = []
    his: list[tuple[int, ...]] = []
    for region, owner in zip(regions, owners):
        for offs, sizes in region.boxes(shape):
            own.append(owner)
            los.append(offs)
            his.append(tuple(o + s for o, s in zip(offs, sizes)))
    lo = np.array(los, dtype=np.int64).reshape(len(los), d)
    hi = np.array(his, dtype=np.int64).reshape(len(his), d)
    return BoxIndex(np.array(own, dtype=np.int64), lo, hi)


def tiling_error(shape: tuple[int, ...], regions: list[Region]) -> str | None:
    """Why ``regions`` do not tile a tensor of ``shape`` exactly (an overlap or a gap), or None."""
    numel = prod(shape)
    if len(regions) > 1:
        idx = build_index(shape, regions, list(range(len(regions))))
        for i, r in enumerate(regions):
            for offs, sizes in r.boxes(shape):
                lo = np.asarray(offs, np.int64)
                owners, _, _ = idx.query(lo, lo + np.asarray(sizes, np.int64))
                if np.any(owners != i):
                    j = int(owners[owners != i][0])
                    return f"{r.describe()} and {regions[j].describe()} overlap"
    total = sum(r.numel for r in regions)
    if total != numel:
        return f"the pieces hold {total} of the tensor's {numel} elements (shape {shape})"
    return None


def tiling_errors(shapes: list[tuple[int, ...]], regions: list[tuple[int, Region]]) -> tuple[int, str] | None:
    """Why the regions do not tile their tensors exactly, as ``(tensor index, reason)``, or None.

    ``regions`` pairs a tensor index with a region of it; see :func:`tiling_errors_columns`.
    """
    T = len(shapes)
    D = max([len(s) for s in shapes], default=0)
    shape_t = np.ones((T, max(D, 1)), np.int64)
    for i, s in enumerate(shapes):
        shape_t[i, : len(s)] = s
    ndims = np.array([len(s) for s in shapes], np.int64)
    n = len(regions)
    tid = np.array([t for t, _ in regions], np.int64)
    fs = np.array([r.flat_start for _, r in regions], np.int64)
    fc = np.array([r.flat_count for _, r in regions], np.int64)
    offs = np.zeros((n, D), np.int64)
    sizes = np.zeros((n, D), np.int64)
    for i, (_, r) in enumerate(regions):
        if not r.is_flat and r.sizes:
            offs[i, : len(r.offsets)] = r.offsets
            sizes[i, : len(r.sizes)] = r.sizes
    return tiling_errors_columns(shape_t, ndims, tid, fs, fc, offs, sizes, lambda i: regions[i][1])
