"""The save's agreement: from every rank's declarations, one verdict and one write plan, in columns.

Rank 0 receives what every rank holds and decides, for everyone: one dtype and shape per tensor,
equal values, shards that tile every tensor exactly, and who writes what (a chunk held by one
rank is written by it; a replica is written once, cut into pieces spread over its holders,
longest first onto the least-loaded holder). At 16,384 ranks that is millions of declarations, so
nothing here is a Python object per declaration:

- each rank sends its declarations as a name table (msgpack) and one int64 matrix of regions;
  DP replicas send byte-identical tables, which rank 0 decodes once;
- rows are grouped by (tensor, region) with a 64-bit hash and one sort (collisions are detected
  and fall back to a full lexicographic sort), so replicas are found without comparing pairs;
- the tiling check runs on the unique regions with the checkpoint's own box index;
- Python loops run only over replica *groups* (thousands), never over rows.

A save in a steady layout repeats the same declarations every time, so the agreement is cached:
each rank sends a digest of its declarations, and when rank 0 finds every digest unchanged since
the last agreement (and every rank still holds its orders from it), nothing else is gathered.
``agree`` is pure, so a cached agreement is exactly the one it would compute again.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .dtypes import dtype as dtype_info
from .format import CheckpointError
from .geometry import Region
from .index import tiling_errors_columns
from .plan_save import split_region

PIECE_FRACTION = 1 / 32  # a replica is cut into pieces of about this share of a rank's bytes
MIN_PIECE = 1 << 20  # but no smaller than this


class SaveError(CheckpointError):
    """A save failed; nothing was committed. The message names the rank, key or file at fault."""


# --------------------------------------------------------------------------- one rank's side


def declare(leaves: list[Any]) -> dict[str, Any]:
    """This rank's declarations as sent to rank 0: ``table`` (msgpack of ``[name, dtype, global
    shape, kind]`` per leaf), ``ndim`` (D, the widest shape here) and ``regions`` (int64 rows of
    offsets[D], sizes[D], flat_start, flat_count; flat_start -1 for a box)."""
    table = [[lf.name, lf.dtype, list(lf.global_shape), lf.kind] for lf in leaves]
    D = max([len(lf.global_shape) for lf in leaves], default=0)
    rows = np.zeros((len(leaves), 2 * D + 2), np.int64)
    for i, lf in enumerate(leaves):
        r = lf.region
        if r.is_flat:
            rows[i, 2 * D] = r.flat_start
            rows[i, 2 * D + 1] = r.flat_count
        else:
            rows[i, : len(r.offsets)] = r.offsets
            rows[i, D : D + len(r.sizes)] = r.sizes
            rows[i, 2 * D] = -1
    return {"table": msgspec.msgpack.encode(table), "ndim": D, "regions": rows.tobytes()}


def digest(decl: dict[str, Any]) -> bytes:
    """What identifies a rank's declarations (for the plan cache): tables and regions, not values."""
    h = hashlib.blake2b(digest_size=16)
    h.update(decl["table"])
    h.update(int(decl["ndim"]).to_bytes(4, "little"))
    h.update(decl["regions"])
    return h.digest()


# --------------------------------------------------------------------------- rank 0


@dataclass
class Agreement:
    """What :func:`agree` decides. ``orders[r]`` is all rank r is told (see :func:`decode_orders`)."""

    meta: dict[str, tuple[str, list[int], str]]
    values: dict[str, Any]
    replica_keys: list[tuple[str, Region]]  # every replica group, in index order
    orders: list[dict[str, Any]]
    bytes_per_rank: list[int]

    @property
    def has_replicas(self) -> bool:
        return bool(self.replica_keys)


@dataclass
class _Rows:
    """Every declared non-empty region, one row each, in rank order."""

    rank: np.ndarray
    local: np.ndarray  # index of the leaf on its rank
    tid: np.ndarray
    fs: np.ndarray
    fc: np.ndarray
    offs: np.ndarray  # (n, D)
    sizes: np.ndarray  # (n, D)

    def region(self, i: int, ndim: int) -> Region:
        if self.fs[i] >= 0:
            return Region.flat(int(self.fs[i]), int(self.fc[i]), ndim)
        return Region.box(self.offs[i, :ndim].tolist(), self.sizes[i, :ndim].tolist())

    def keys(self) -> list[np.ndarray]:
        return [self.tid, self.fs, self.fc, *self.offs.T, *self.sizes.T]


def _tables(msgs: list[dict]) -> tuple[dict[str, tuple[str, list[int], str]], dict[bytes, list]]:
    """The tensors all ranks declared (each distinct table decoded once); conflicts name ranks."""
    meta: dict[str, tuple[str, list[int], str]] = {}
    first: dict[str, int] = {}
    blobs: dict[bytes, list] = {}
    for m in msgs:
        b = m["table"]
        if b in blobs:
            continue
        entries = msgspec.msgpack.decode(b)
        blobs[b] = entries
        for name, dt, shape, kind in entries:
            cur = (dt, list(shape), kind)
            prev = meta.get(name)
            if prev is None:
                meta[name] = cur
                first[name] = m["rank"]
            elif prev != cur:
                raise SaveError(
                    f"{name!r}: rank {m['rank']} holds {dt}{list(shape)} ({kind}), "
                    f"rank {first[name]} {prev[0]}{prev[1]} ({prev[2]})"
                )
    return meta, blobs


def agree_values(msgs: list[dict], meta: dict) -> dict[str, Any]:
    values: dict[str, Any] = {}
    src: dict[str, int] = {}
    seen: set[bytes] = set()
    for m in msgs:
        b = m["values"]
        if b in seen:
            continue
        seen.add(b)
        for k, v in msgspec.msgpack.decode(b).items():
            if k in meta:
                raise SaveError(f"{k!r} is a tensor on one rank and a value on rank {m['rank']}")
            if k in values and values[k] != v:
                raise SaveError(
                    f"value {k!r} differs across ranks (rank {src[k]}: {values[k]!r}, rank {m['rank']}: {v!r})"
                )
            values.setdefault(k, v)
            src.setdefault(k, m["rank"])
    return values


def _rows(msgs: list[dict], blobs: dict[bytes, list], tid_of: dict[str, int], D: int) -> _Rows:
    gids: dict[bytes, np.ndarray] = {b: np.array([tid_of[e[0]] for e in es], np.int64) for b, es in blobs.items()}
    counts = [len(blobs[m["table"]]) for m in msgs]
    n = sum(counts)
    rank = np.empty(n, np.int64)
    local = np.empty(n, np.int64)
    tid = np.empty(n, np.int64)
    fs = np.empty(n, np.int64)
    fc = np.empty(n, np.int64)
    offs = np.zeros((n, D), np.int64)
    sizes = np.zeros((n, D), np.int64)
    at = 0
    for m, c in zip(msgs, counts):
        d = int(m["ndim"])
        raw = m["regions"]
        if not 0 <= d <= D or len(raw) != c * (2 * d + 2) * 8:
            raise SaveError(f"rank {m['rank']} sent malformed declarations ({c} tensors, {len(raw)} bytes of regions)")
        a = np.frombuffer(raw, np.int64).reshape(c, 2 * d + 2)
        s = slice(at, at + c)
        rank[s] = m["rank"]
        local[s] = np.arange(c)
        tid[s] = gids[m["table"]]
        offs[s, :d] = a[:, :d]
        sizes[s, :d] = a[:, d : 2 * d]
        fs[s] = a[:, 2 * d]
        fc[s] = a[:, 2 * d + 1]
        at += c
    return _Rows(rank, local, tid, fs, fc, offs, sizes)


def _group(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal keys: ``(order, starts)`` with the rows of group g at
    ``order[starts[g]:starts[g+1]]``, in their original (rank) order within the group."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    h = np.full(n, 0x243F6A8885A308D3, np.uint64)
    with np.errstate(over="ignore"):
        for k in keys:
            h ^= k.astype(np.uint64)
            h *= np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same_h = hs[1:] == hs[:-1]
    pos = np.flatnonzero(same_h)
    equal = np.ones(len(pos), bool)
    for k in keys:
        equal &= k[order[pos]] == k[order[pos + 1]]
    if not equal.all():  # a 64-bit collision: sort by the keys themselves
        order = np.lexsort(keys[::-1])
        same = np.ones(n - 1, bool)
        for k in keys:
            ks = k[order]
            same &= ks[1:] == ks[:-1]
    else:
        same = same_h
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1, [n]]).astype(np.int64)
    return order, starts


def agree(msgs: list[dict], world: int, path: Path | str) -> Agreement:
    """The verdict and write plan from every rank's message (``declare`` output plus ``rank``
    and ``values``, msgpack bytes). Pure: the same messages give the same agreement."""
    meta, blobs = _tables(msgs)
    values = agree_values(msgs, meta)
    names = sorted(meta)
    tid_of = {n: i for i, n in enumerate(names)}
    T = len(names)
    ndims = np.array([len(meta[n][1]) for n in names], np.int64)
    D = int(ndims.max()) if T else 0
    shape_t = np.ones((T, max(D, 1)), np.int64)
    for i, n in enumerate(names):
        shape_t[i, : ndims[i]] = meta[n][1]
    itemsize = np.array([dtype_info(meta[n][0]).itemsize for n in names], np.int64)
    rows = _rows(msgs, blobs, tid_of, D)

    real = np.arange(D)[None, :] < ndims[rows.tid][:, None]
    numel = np.where(rows.fs >= 0, rows.fc, np.where(real, rows.sizes, 1).prod(axis=1) if D else 1)
    if (numel < 0).any():
        i = int(np.argmax(numel < 0))
        raise SaveError(f"{names[rows.tid[i]]!r}: rank {rows.rank[i]} declared a region of negative size")
    keep = np.flatnonzero(numel > 0)
    rows = _Rows(*(getattr(rows, f)[keep] for f in ("rank", "local", "tid", "fs", "fc", "offs", "sizes")))
    numel = numel[keep]

    order, starts = _group(rows.keys())
    first = order[starts[:-1]]  # one row per distinct (tensor, region)
    count = np.diff(starts)
    bad = tiling_errors_columns(
        shape_t,
        ndims,
        rows.tid[first],
        rows.fs[first],
        rows.fc[first],
        rows.offs[first],
        rows.sizes[first],
        lambda i: rows.region(int(first[i]), int(ndims[rows.tid[first[i]]])),
    )
    if bad:
        raise SaveError(f"save to {str(path)!r} failed: {names[bad[0]]!r}: the ranks' shards do not tile it: {bad[1]}")

    nbytes = numel * itemsize[rows.tid]
    load = np.zeros(world, np.int64)
    single = first[count == 1]
    np.add.at(load, rows.rank[single], nbytes[single])
    whole_r = [rows.rank[single]]
    whole_l = [rows.local[single]]

    # replica groups, in (tensor, region) order: that order names them (index) and breaks ties
    rep = np.flatnonzero(count > 1)
    rf = first[rep]
    rep = rep[
        np.lexsort(
            [rows.sizes[rf, j] for j in range(D - 1, -1, -1)]
            + [rows.offs[rf, j] for j in range(D - 1, -1, -1)]
            + [rows.fc[rf], rows.fs[rf], rows.tid[rf]]
        )
    ]
    replica_keys: list[tuple[str, Region]] = []
    holders: list[np.ndarray] = []
    locals_: list[np.ndarray] = []
    total = int(nbytes[first].sum())
    target = max(MIN_PIECE, int(total / max(world, 1) * PIECE_FRACTION))
    pieces: list[tuple[int, int, tuple, int, Region]] = []
    for gi, g in enumerate(rep):
        members = order[starts[g] : starts[g + 1]]
        row = int(members[0])
        t = int(rows.tid[row])
        region = rows.region(row, int(ndims[t]))
        replica_keys.append((names[t], region))
        hs = rows.rank[members]
        holders.append(hs)
        locals_.append(rows.local[members])
        b = int(nbytes[row])
        k = min(len(hs) * 4, max(1, math.ceil(b / target))) if b > target else 1
        per_elem = b / max(int(numel[row]), 1)
        for p in split_region(region, k):
            key = (p.flat_start, p.flat_count, p.offsets, p.sizes)
            pieces.append((int(p.numel * per_elem), t, key, gi, p))
    pieces.sort(key=lambda x: (-x[0], x[1], x[2]))
    assigned = _lpt(pieces, holders, load)

    cut: list[list[list]] = [[] for _ in range(world)]
    for (_, _, _, gi, p), r in zip(pieces, assigned):
        hs = holders[gi]
        lc = int(locals_[gi][int(np.searchsorted(hs, r))])
        if p == replica_keys[gi][1]:
            whole_r.append(np.array([r], np.int64))
            whole_l.append(np.array([lc], np.int64))
        else:
            cut[r].append([lc, [list(p.offsets), list(p.sizes), p.flat_start, p.flat_count]])
    w_rank = np.concatenate(whole_r)
    w_local = np.concatenate(whole_l)
    if holders:
        rp_rank = np.concatenate(holders)
        rp_pair = np.stack([np.repeat(np.arange(len(holders)), [len(h) for h in holders]), np.concatenate(locals_)], 1)
    else:
        rp_rank = np.zeros(0, np.int64)
        rp_pair = np.zeros((0, 2), np.int64)
    whole = _split_by_rank(w_rank, w_local, world)
    reps = _split_by_rank(rp_rank, rp_pair, world)
    orders = [
        {"whole": np.sort(whole[r]).astype("<i8").tobytes(), "cut": cut[r], "replicas": reps[r].astype("<i8").tobytes()}
        for r in range(world)
    ]
    return Agreement(meta, values, replica_keys, orders, load.tolist())


def _lpt(pieces: list[tuple], holders: list[np.ndarray], load: np.ndarray) -> list[int]:
    """Each piece (largest first) onto its least-loaded holder, ties to the lowest rank. When the
    holder sets are disjoint (DP groups) a heap per set gives the same answer in O(log n)."""
    sets: dict[bytes, int] = {}
    members: list[np.ndarray] = []
    set_of = []
    for h in holders:
        s = sets.setdefault(h.tobytes(), len(sets))
        if s == len(members):
            members.append(h)
        set_of.append(s)
    disjoint = sum(len(m) for m in members) == len(np.unique(np.concatenate(members))) if members else True
    out: list[int] = []
    if disjoint:
        heaps = [[(int(load[h]), int(h)) for h in m] for m in members]
        for hp in heaps:
            heapq.heapify(hp)
        for b, _, _, gi, _ in pieces:
            hp = heaps[set_of[gi]]
            lo, r = heapq.heappop(hp)
            heapq.heappush(hp, (lo + b, r))
            out.append(r)
        for hp in heaps:
            for lo, r in hp:
                load[r] = lo
        return out
    for b, _, _, gi, _ in pieces:
        hs = holders[gi]
        r = int(hs[int(np.argmin(load[hs]))])
        load[r] += b
        out.append(r)
    return out


def _split_by_rank(rank: np.ndarray, data: np.ndarray, world: int) -> list[np.ndarray]:
    o = np.argsort(rank, kind="stable")
    cuts = np.cumsum(np.bincount(rank, minlength=world))[:-1]
    return np.split(data[o], cuts)


# --------------------------------------------------------------------------- orders


def decode_orders(o: dict[str, Any]) -> tuple[list[int], list[tuple[int, Region]], list[tuple[int, int]]]:
    """One rank's orders: leaves it writes whole, ``(leaf, piece)`` it writes in part, and
    ``(replica group, leaf)`` it checksums, leaves named by their index in its own flatten order."""
    whole = np.frombuffer(o["whole"], "<i8").tolist()
    cut = [(int(lc), Region(tuple(p[0]), tuple(p[1]), int(p[2]), int(p[3]))) for lc, p in o["cut"]]
    reps = np.frombuffer(o["replicas"], "<i8").reshape(-1, 2).tolist()
    return whole, cut, [(int(g), int(lc)) for g, lc in reps]


# --------------------------------------------------------------------------- the cache


@dataclass
class CachedPlan:
    """What a rank keeps of the last agreement: its id and this rank's part of it."""

    plan_id: bytes
    digest: bytes  # this rank's declarations it was made from
    orders: dict[str, Any]
    has_replicas: bool
    bytes_per_rank: list[int]
    # rank 0 only: every rank's digest and the whole agreement
    digests: list[bytes] | None = None
    agreement: Agreement | None = None


def plan_id(digests: list[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.digest()
