"""The save agreement as it was before it went columnar: a slow, plain reading kept as the oracle
the columnar one (goodput.ckpt.saving.agreement) is tested against. Not used by the package."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goodput.ckpt.errors import SaveError
from goodput.ckpt.format.dtypes import dtype as dtype_info
from goodput.ckpt.format.geometry import Region
from goodput.ckpt.saving.agreement import Assignment, split_region
from tests.ckpt.format.geometry_oracle import tiling_errors


@dataclass(frozen=True)
class Decl:
    name: str
    region: Region
    nbytes: int


@dataclass
class OldAgreement:
    meta: dict[str, tuple[str, list[int], str]]
    values: dict[str, Any]
    replica_keys: list[tuple[str, Region]]
    replica_holders: list[list[int]]
    plan: list[Assignment]
    bytes_per_rank: list[int]


def agree(gathered: list[dict], world: int, path: Path) -> OldAgreement:
    """From every rank's declarations, the verdict every rank reaches on its own: one dtype and
    shape per tensor, equal values, shards that tile each tensor, and the write plan (replicas
    once, balanced). Pure: the same input gives the same plan on every rank."""
    # every rank checks the same gathered data and so reaches the same verdict
    meta: dict[str, tuple[str, list[int], str]] = {}
    per_rank: list[list[Decl]] = []
    values: dict[str, Any] = {}
    value_src: dict[str, int] = {}
    for m in gathered:
        ds = []
        for name, dt, shape, kind, reg, nbytes in m["decls"]:
            prev = meta.setdefault(name, (dt, shape, kind))
            if prev != (dt, shape, kind):
                raise SaveError(f"{name!r}: rank {m['rank']} holds {dt}{shape}, another rank {prev[0]}{prev[1]}")
            region = Region.decode(reg)
            if region.numel:
                ds.append(Decl(name, region, nbytes))
        per_rank.append(ds)
        for k, v in m["values"].items():
            if k in meta:
                raise SaveError(f"{k!r} is a tensor on one rank and a value on rank {m['rank']}")
            if k in values and values[k] != v:
                raise SaveError(
                    f"value {k!r} differs across ranks (rank {value_src[k]}: {values[k]!r}, rank {m['rank']}: {v!r})"
                )
            values.setdefault(k, v)
            value_src.setdefault(k, m["rank"])
    regions_of: dict[str, set[Region]] = {}
    holders: dict[tuple[str, Region], list[int]] = {}
    for r, ds in enumerate(per_rank):
        for d in ds:
            regions_of.setdefault(d.name, set()).add(d.region)
            holders.setdefault((d.name, d.region), []).append(r)
    names = list(regions_of)
    try:
        bad = tiling_errors(
            [tuple(meta[n][1]) for n in names], [(i, r) for i, n in enumerate(names) for r in regions_of[n]]
        )
    except ValueError as e:
        bad = (0, str(e))
    if bad:
        name = names[bad[0]] if names else "?"
        raise SaveError(f"save to {str(path)!r} failed: {name!r}: the ranks' shards do not tile it: {bad[1]}")
    replica_keys = sorted((k for k, hs in holders.items() if len(hs) > 1), key=lambda k: (k[0], k[1].encode()))
    plan = plan_writes(per_rank)
    bytes_per_rank = [0] * world
    for a in plan:
        bytes_per_rank[a.rank] += a.piece.numel * dtype_info(meta[a.name][0]).itemsize
    return OldAgreement(meta, values, replica_keys, [holders[k] for k in replica_keys], plan, bytes_per_rank)


def plan_writes(decls: list[list[Decl]], piece_fraction: float = 1 / 32, min_piece: int = 4 << 10) -> list[Assignment]:
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
        k = max(1, math.ceil(b / target)) if b > target else 1
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
