"""Who writes what: replicas written once, the writing spread evenly over the ranks.

Pure and deterministic: every rank runs it on the same gathered declarations and gets the same
answer, so no plan has to be sent back from a coordinator (DCP gathers plans to rank 0 and
scatters them back; that round trip and its O(n^2) validation is what costs minutes at 1k+ ranks).

Chunks held by one rank are written by it. A chunk held by several ranks (a replica) is written
by one of them, and a large replica is first cut along a dimension into pieces so that the load
can be balanced (longest-processing-time first, onto the least-loaded holder): with DDP, where
everything is replicated, each rank writes about 1/N of the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .geometry import Region


@dataclass(frozen=True)
class Decl:
    name: str
    region: Region
    nbytes: int


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


def plan_writes(decls: list[list[Decl]], piece_fraction: float = 1 / 32, min_piece: int = 1 << 20) -> list[Assignment]:
    world = len(decls)
    holders: dict[tuple[str, Region], list[int]] = {}
    nbytes: dict[tuple[str, Region], int] = {}
    for rank, ds in enumerate(decls):
        for d in ds:
            key = (d.name, d.region)
            holders.setdefault(key, []).append(rank)
            nbytes[key] = d.nbytes
    total = sum(nbytes.values())
    load = [0] * world
    out: list[Assignment] = []
    pieces: list[tuple[int, str, Region, Region, list[int]]] = []
    target = max(min_piece, int(total / max(world, 1) * piece_fraction))
    for key in sorted(holders, key=_order):
        name, region = key
        hs = sorted(set(holders[key]))
        if len(hs) == 1:
            out.append(Assignment(hs[0], name, region, region))
            load[hs[0]] += nbytes[key]
            continue
        b = nbytes[key]
        k = min(len(hs) * 4, max(1, math.ceil(b / target))) if b > target else 1
        parts = split_region(region, k)
        per_elem = b / max(region.numel, 1)
        for p in parts:
            pieces.append((int(p.numel * per_elem), name, p, region, hs))
    pieces.sort(key=lambda x: (-x[0], x[1], _region_key(x[2])))
    for b, name, piece, source, hs in pieces:
        r = min(hs, key=lambda h: (load[h], h))
        load[r] += b
        out.append(Assignment(r, name, piece, source))
    return out


def _region_key(r: Region) -> tuple:
    return (r.flat_start, r.flat_count, r.offsets, r.sizes)


def _order(key: tuple[str, Region]) -> tuple:
    return (key[0], _region_key(key[1]))
