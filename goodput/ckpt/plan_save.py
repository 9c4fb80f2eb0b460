"""The pieces of a save's write plan (the plan itself is made in :mod:`goodput.ckpt.agreement`).

Chunks held by one rank are written by it. A chunk held by several ranks (a replica) is written
by one of them, and a large replica is first cut along a dimension into pieces so that the load
can be balanced (longest-processing-time first, onto the least-loaded holder): with DDP, where
everything is replicated, each rank writes about 1/N of the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .geometry import Region


@dataclass(frozen=True)
class Assignment:
    rank: int
    name: str
    piece: Region  # the region written
    source: Region  # the holder's local region it is cut from


def split_region(region: Region, k: int) -> list[Region]:
    """Cut a region into up to ``k`` pieces of nearly equal size, along one dimension."""
    if k <= 1 or region.numel <= 1:
        return [region]
    if region.is_flat:
        n = region.flat_count
        k = min(k, n)
        edges = [region.flat_start + (n * i) // k for i in range(k + 1)]
        d = len(region.offsets)
        return [Region.flat(a, b - a, d) for a, b in zip(edges, edges[1:]) if b > a]
    dims = [j for j, s in enumerate(region.sizes) if s >= 2]
    if not dims:
        return [region]
    j = dims[0]
    n = region.sizes[j]
    k = min(k, n)
    edges = [(n * i) // k for i in range(k + 1)]
    out = []
    for a, b in zip(edges, edges[1:]):
        offs = list(region.offsets)
        sizes = list(region.sizes)
        offs[j] += a
        sizes[j] = b - a
        out.append(Region.box(offs, sizes))
    return out
