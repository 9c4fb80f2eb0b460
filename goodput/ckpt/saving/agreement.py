"""The save's agreement: from every rank's declarations, one verdict and one save plan, in columns.

The *save plan* says who writes what: chunks held by one rank are written by it; a chunk held by
several ranks (a replica) is written by one of them, and a large replica is first cut along a
dimension into pieces so that the load can be balanced (longest-processing-time first, onto the
least-loaded holder): with DDP, where everything is replicated, each rank writes about 1/N of the
bytes. (The read side has its own plan, :mod:`goodput.ckpt.loading.read_plan`.)

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import SaveError
from ..format.chunk_index import tiling_errors_columns
from ..format.dtypes import dtype as dtype_info
from ..format.format import shape_error
from ..format.geometry import Region
from ..storage.location import display

PIECE_FRACTION = 1 / 32  # a replica is cut into pieces of about this share of a rank's bytes
MIN_PIECE = 4 << 10  # but no smaller than a checksum block (pieces stay ~3 % of a share: balance holds)


# --------------------------------------------------------------------------- the save plan


@dataclass(frozen=True)
class Assignment:
    rank: int
    name: str
    piece: Region  # the region written
    source: Region  # the holder's local region it is cut from
    leaf: int = -1  # the holder's leaf, by index in its flatten order (its name may name several)


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


# --------------------------------------------------------------------------- one rank's side


@dataclass(frozen=True)
class Declaration:
    """What :func:`declare` reads of a leaf (``state.TensorLeaf`` has these fields and more):
    enough to plan a save without the data, as the benchmarks and tests do."""

    name: str
    dtype: str
    global_shape: tuple[int, ...]
    region: Region
    kind: str = "torch"


def declare(leaves: list[Any]) -> dict[str, Any]:
    """This rank's declarations as sent to rank 0, as a few byte strings rank 0 decodes in bulk:

    - ``names``: msgpack list of the leaves' names;
    - ``specs``: msgpack list of the distinct ``[dtype, global shape, kind]`` here, and
      ``spec_of``: int32 per leaf, its index in ``specs``;
    - ``ndim`` (D, the widest shape here) and ``regions``: int64 rows of offsets[D], sizes[D],
      flat_start, flat_count (flat_start -1 for a box).
    """
    specs: dict[tuple, int] = {}
    spec_of = np.empty(len(leaves), np.int32)
    for i, lf in enumerate(leaves):
        spec_of[i] = specs.setdefault((lf.dtype, tuple(lf.global_shape), lf.kind), len(specs))
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
    return {
        "names": msgspec.msgpack.encode([lf.name for lf in leaves]),
        "specs": msgspec.msgpack.encode([[dt, list(sh), k] for dt, sh, k in specs]),
        "spec_of": spec_of.astype("<i4").tobytes(),
        "ndim": D,
        "regions": rows.astype("<i8").tobytes(),
    }


DECL_FIELDS = ("names", "specs", "spec_of", "ndim", "regions")


def digest(decl: dict[str, Any]) -> bytes:
    """What identifies a rank's declarations (for the agreement cache): all of them, not values."""
    h = hashlib.blake2b(digest_size=16)
    for k in DECL_FIELDS:
        v = decl[k]
        h.update(v if isinstance(v, bytes) else int(v).to_bytes(8, "little", signed=True))
        h.update(b"|")
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


def _malformed(m: dict, what: str) -> SaveError:
    return SaveError(f"rank {m['rank']} sent malformed declarations ({what})")


@dataclass
class _Rows:
    """Every declared region, one row each, in rank order."""

    rank: np.ndarray
    local: np.ndarray  # index of the leaf on its rank
    tid: np.ndarray
    fs: np.ndarray
    fc: np.ndarray
    offs: np.ndarray  # (n, D)
    sizes: np.ndarray  # (n, D)

    def take(self, idx: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, f)[idx] for f in ("rank", "local", "tid", "fs", "fc", "offs", "sizes")))

    def region(self, i: int, ndim: int) -> Region:
        if self.fs[i] >= 0:
            return Region.flat(int(self.fs[i]), int(self.fc[i]), ndim)
        return Region.box(self.offs[i, :ndim].tolist(), self.sizes[i, :ndim].tolist())

    def keys(self) -> list[np.ndarray]:
        return [self.tid, self.fs, self.fc, *self.offs.T, *self.sizes.T]


def _declared(msgs: list[dict]) -> tuple[list[str], dict[str, tuple[str, list[int], str]], _Rows]:
    """Every rank's declarations decoded in bulk: the tensors (sorted names, one dtype, shape
    and kind each, conflicts naming two ranks) and one row per declared region."""
    names_of: dict[bytes, list[str]] = {}
    counts = []
    for m in msgs:
        b = m["names"]
        if b not in names_of:
            # a name may repeat: a rank can hold several shards of one tensor (two copies of one
            # region are refused once rows are grouped, in ``agree``)
            names_of[b] = msgspec.msgpack.decode(b, type=list[str])
        counts.append(len(names_of[b]))
    distinct: set[str] = set()
    for ns in names_of.values():
        distinct.update(ns)
    names = sorted(distinct)
    tid_of = {n: i for i, n in enumerate(names)}
    tids_of = {b: np.fromiter(map(tid_of.__getitem__, ns), np.int64, len(ns)) for b, ns in names_of.items()}
    spec_ids: dict[tuple, int] = {}
    specs: list[tuple[str, list[int], str]] = []
    spec_map: dict[bytes, np.ndarray] = {}
    for m in msgs:
        sb = m["specs"]
        if sb in spec_map:
            continue
        ids = []
        for dt, shape, kind in msgspec.msgpack.decode(sb):
            key = (dt, tuple(shape), kind)
            if key not in spec_ids:
                spec_ids[key] = len(specs)
                specs.append((dt, list(shape), kind))
            ids.append(spec_ids[key])
        spec_map[sb] = np.asarray(ids, np.int64)
    dims = [int(m["ndim"]) for m in msgs]
    for m, c, d in zip(msgs, counts, dims):
        if d < 0 or len(m["regions"]) != c * (2 * d + 2) * 8 or len(m["spec_of"]) != 4 * c:
            raise _malformed(m, f"{c} names, {len(m['spec_of'])} bytes of specs, {len(m['regions'])} bytes of regions")
    n = sum(counts)
    D = max(dims, default=0)
    cnt = np.asarray(counts, np.int64)
    rank = np.repeat(np.asarray([m["rank"] for m in msgs], np.int64), cnt)
    local = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    tid = np.concatenate([tids_of[m["names"]] for m in msgs]) if msgs else np.zeros(0, np.int64)
    # each rank's spec indices, through its own table into the global one
    maps = [spec_map[m["specs"]] for m in msgs]
    allmap = np.concatenate(maps) if maps else np.zeros(0, np.int64)
    mlen = np.asarray([len(x) for x in maps], np.int64)
    so = np.frombuffer(b"".join(m["spec_of"] for m in msgs), "<i4").astype(np.int64)
    out_of_range = (so < 0) | (so >= np.repeat(mlen, cnt))
    if out_of_range.any():
        bad = int(np.searchsorted(np.cumsum(cnt), int(np.argmax(out_of_range)), "right"))
        raise _malformed(msgs[bad], "a spec index out of range")
    spec = allmap[so + np.repeat(np.cumsum(mlen) - mlen, cnt)]
    fs = np.empty(n, np.int64)
    fc = np.empty(n, np.int64)
    offs = np.zeros((n, D), np.int64)
    sizes = np.zeros((n, D), np.int64)
    row_d = np.repeat(np.asarray(dims, np.int64), cnt)
    for d in sorted(set(dims)):
        a = np.frombuffer(b"".join(m["regions"] for m, x in zip(msgs, dims) if x == d), "<i8").reshape(-1, 2 * d + 2)
        at = np.flatnonzero(row_d == d)
        offs[at, :d] = a[:, :d]
        sizes[at, :d] = a[:, d : 2 * d]
        fs[at] = a[:, 2 * d]
        fc[at] = a[:, 2 * d + 1]
    # one spec per tensor: compare every row's spec with its tensor's first
    T = len(names)
    first_row = np.full(T, n, np.int64)
    np.minimum.at(first_row, tid, np.arange(n))
    differ = np.flatnonzero(spec != spec[first_row[tid]])
    if len(differ):
        i = int(differ[0])
        j = int(first_row[tid[i]])
        a_, b_ = specs[spec[i]], specs[spec[j]]
        raise SaveError(
            f"{names[tid[i]]!r}: rank {rank[i]} holds {a_[0]}{a_[1]} ({a_[2]}), rank {rank[j]} {b_[0]}{b_[1]} ({b_[2]})"
        )
    meta = {names[t]: specs[spec[first_row[t]]] for t in range(T)}
    return names, meta, _Rows(rank, local, tid, fs, fc, offs, sizes)


def agree_values(msgs: list[dict], meta: dict) -> dict[str, Any]:
    """The JSON-able values, which every rank that has one must agree on."""
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


def group_rows(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
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


def _pieces(rows: _Rows, ndims: np.ndarray, nbytes: np.ndarray, numel: np.ndarray, k: np.ndarray) -> _Rows:
    """Each row cut into ``k[i]`` nearly equal pieces along one dimension (the first of size >= 2;
    a flat range along itself), as :func:`split_region` cuts one region."""
    n = len(rows.tid)
    D = rows.offs.shape[1]
    flat = rows.fs >= 0
    real = np.arange(D)[None, :] < ndims[rows.tid][:, None]
    big = real & (rows.sizes >= 2)
    has = big.any(axis=1) if D else np.zeros(n, bool)
    j = np.argmax(big, axis=1) if D else np.zeros(n, np.int64)
    length = np.where(flat, rows.fc, np.where(has, rows.sizes[np.arange(n), j] if D else 0, 1))
    k = np.where(flat | has, np.minimum(k, np.maximum(length, 1)), 1)
    k = np.where(numel <= 1, 1, k)
    src = np.repeat(np.arange(n), k)
    i = np.arange(len(src)) - np.repeat(np.cumsum(k) - k, k)
    kk, ln = k[src], length[src]
    lo, hi = (ln * i) // kk, (ln * (i + 1)) // kk
    p = rows.take(src)
    p.offs = p.offs.copy()
    p.sizes = p.sizes.copy()
    cut = k[src] > 1
    fl = cut & flat[src]
    bx = np.flatnonzero(cut & ~flat[src])
    p.fs = np.where(fl, p.fs + lo, p.fs)
    p.fc = np.where(fl, hi - lo, p.fc)
    if len(bx):
        jj = j[src[bx]]
        p.offs[bx, jj] += lo[bx]
        p.sizes[bx, jj] = hi[bx] - lo[bx]
    p.local = src  # which row each piece is cut from
    return p


def agree(msgs: list[dict], world: int, path: Path | str) -> Agreement:
    """The verdict and save plan from every rank's message (``declare`` output plus ``rank``
    and ``values``, msgpack bytes). Pure: the same messages give the same agreement."""
    names, meta, rows = _declared(msgs)
    values = agree_values(msgs, meta)
    T = len(names)
    ndims = np.array([len(meta[n][1]) for n in names], np.int64)
    D = rows.offs.shape[1]
    shape_t = np.ones((T, max(D, 1)), np.int64)
    for i, n in enumerate(names):
        bad = shape_error(meta[n][1])
        if bad:
            raise SaveError(f"{n!r} {bad} (declared by rank {int(rows.rank[int(np.argmax(rows.tid == i))])})")
        if len(meta[n][1]) > D:
            raise SaveError(f"{n!r}: declared with {len(meta[n][1])} dimensions but regions of at most {D}")
        shape_t[i, : ndims[i]] = meta[n][1]
    itemsize = np.array([dtype_info(meta[n][0]).itemsize for n in names], np.int64)

    real = np.arange(D)[None, :] < ndims[rows.tid][:, None]
    numel = np.where(rows.fs >= 0, rows.fc, np.where(real, rows.sizes, 1).prod(axis=1) if D else 1)
    if (numel < 0).any():
        i = int(np.argmax(numel < 0))
        raise SaveError(f"{names[rows.tid[i]]!r}: rank {rows.rank[i]} declared a region of negative size")
    if (numel == 0).any():
        keep = np.flatnonzero(numel > 0)
        rows = rows.take(keep)
        numel = numel[keep]

    order, starts = group_rows(rows.keys())
    first = order[starts[:-1]]  # one row per distinct (tensor, region)
    count = np.diff(starts)
    # within a group rows keep rank order: one rank twice in a group holds one region twice
    ranks_in_order = rows.rank[order]
    group_of = np.repeat(np.arange(len(count)), count)
    twice = np.flatnonzero((ranks_in_order[1:] == ranks_in_order[:-1]) & (group_of[1:] == group_of[:-1]))
    if len(twice):
        i = int(order[twice[0]])
        t = int(rows.tid[i])
        raise SaveError(
            f"{names[t]!r}: rank {int(rows.rank[i])} holds the region {rows.region(i, int(ndims[t])).describe()} twice"
        )
    u = rows.take(first)
    bad = tiling_errors_columns(
        shape_t, ndims, u.tid, u.fs, u.fc, u.offs, u.sizes, lambda i: u.region(i, int(ndims[u.tid[i]]))
    )
    if bad:
        raise SaveError(
            f"save to {display(path)!r} failed: {names[bad[0]]!r}: the ranks' shards do not tile it: {bad[1]}"
        )

    nbytes = numel * itemsize[rows.tid]
    load = np.zeros(world, np.int64)
    single = first[count == 1]
    np.add.at(load, rows.rank[single], nbytes[single])

    # replica groups, in (tensor, region) order: that order names them (index) and breaks ties
    rep = np.flatnonzero(count > 1)
    rf = first[rep]
    sort_keys = [rows.sizes[rf, j] for j in range(D - 1, -1, -1)] + [rows.offs[rf, j] for j in range(D - 1, -1, -1)]
    rep = rep[np.lexsort([*sort_keys, rows.fc[rf], rows.fs[rf], rows.tid[rf]])]
    rf = first[rep]
    g = rows.take(rf)
    replica_keys = [(names[t], g.region(i, int(ndims[t]))) for i, t in enumerate(g.tid.tolist())]
    nhold = count[rep]
    pos_in_rep = np.full(len(count), -1, np.int64)
    pos_in_rep[rep] = np.arange(len(rep))
    grp = np.repeat(pos_in_rep, count)  # replica group of each row in ``order`` (-1: a single)
    sel = np.flatnonzero(grp >= 0)
    members = order[sel[np.argsort(grp[sel], kind="stable")]]
    gof = np.repeat(np.arange(len(rep)), nhold)  # replica group of each member row
    hold_rank = rows.rank[members]
    hold_local = rows.local[members]

    total = int(nbytes[first].sum())
    target = max(MIN_PIECE, int(total / max(world, 1) * PIECE_FRACTION))
    gb = nbytes[rf]
    # pieces of about ``target`` bytes whatever the number of holders: a replica held by few
    # ranks next to a large unique tensor still balances (4 pieces a holder left 14 % over)
    want = np.where(gb > target, np.maximum(1, -(-gb // target)), 1)
    pieces = _pieces(g, ndims, gb, numel[rf], want)
    src = pieces.local
    per_elem = gb[src] / np.maximum(numel[rf][src], 1)
    pnumel = np.where(
        pieces.fs >= 0,
        pieces.fc,
        np.where(np.arange(D)[None, :] < ndims[pieces.tid][:, None], pieces.sizes, 1).prod(axis=1) if D else 1,
    )
    pbytes = np.floor(pnumel * per_elem).astype(np.int64)
    pk = [pieces.sizes[:, j] for j in range(D - 1, -1, -1)] + [pieces.offs[:, j] for j in range(D - 1, -1, -1)]
    porder = np.lexsort([*pk, pieces.fc, pieces.fs, pieces.tid, -pbytes])
    hstart = np.concatenate([[0], np.cumsum(nhold)])
    assigned = _lpt(pbytes[porder].tolist(), src[porder].tolist(), hold_rank, hstart, load)
    prank = np.empty(len(porder), np.int64)
    prank[porder] = assigned
    # the writing holder's own leaf: members are sorted by (group, rank)
    at = np.searchsorted(gof * world + hold_rank, src * world + prank)
    plocal = hold_local[at]
    whole = np.bincount(src, minlength=len(rep)) == 1
    wp = np.flatnonzero(whole[src])
    cp = np.flatnonzero(~whole[src])
    w_rank = np.concatenate([rows.rank[single], prank[wp]])
    w_local = np.concatenate([rows.local[single], plocal[wp]])
    cut_rows = np.column_stack([plocal[cp], pieces.fs[cp], pieces.fc[cp], pieces.offs[cp], pieces.sizes[cp]])
    whole_by = _split_by_rank(w_rank, w_local, world)
    cut_by = _split_by_rank(prank[cp], cut_rows, world)
    reps_by = _split_by_rank(hold_rank, np.column_stack([gof, hold_local]), world)
    orders = [
        {
            "whole": np.sort(whole_by[r]).astype("<i8").tobytes(),
            "ndim": D,
            "cut": cut_by[r].astype("<i8").tobytes(),
            "replicas": reps_by[r].astype("<i8").tobytes(),
        }
        for r in range(world)
    ]
    return Agreement(meta, values, replica_keys, orders, load.tolist())


def _lpt(pbytes: list[int], group: list[int], holders: np.ndarray, hstart: np.ndarray, load: np.ndarray) -> list[int]:
    """Each piece (largest first) onto its group's least-loaded holder, ties to the lowest rank.

    One heap of ``(load, rank)`` per distinct holder set. A rank in several sets (a norm replicated
    over TP x DP, a projection over DP) leaves stale entries in the sets it was not loaded
    through; loads only grow, so a stale entry is found at the top, refreshed and pushed back,
    and the first fresh top is the true minimum: exactly ``min(holders, key=(load, rank))``."""
    sets: dict[bytes, int] = {}
    set_of: list[int] = []
    heaps: list[list[tuple[int, int]]] = []
    cur = load.tolist()
    for x in range(len(hstart) - 1):
        h = holders[hstart[x] : hstart[x + 1]]
        s = sets.setdefault(h.tobytes(), len(sets))
        if s == len(heaps):
            hp = [(cur[r], r) for r in h.tolist()]
            heapq.heapify(hp)
            heaps.append(hp)
        set_of.append(s)
    out: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    for b, x in zip(pbytes, group):
        hp = heaps[set_of[x]]
        lo, r = pop(hp)
        while lo != cur[r]:  # stale: loaded through another set since it was pushed
            push(hp, (cur[r], r))
            lo, r = pop(hp)
        cur[r] = lo + b
        push(hp, (cur[r], r))
        out.append(r)
    load[:] = cur
    return out


def _split_by_rank(rank: np.ndarray, data: np.ndarray, world: int) -> list[np.ndarray]:
    o = np.argsort(rank, kind="stable")
    cuts = np.cumsum(np.bincount(rank, minlength=world))[:-1]
    return np.split(data[o], cuts)


# --------------------------------------------------------------------------- orders


def decode_orders(
    o: dict[str, Any], ndim_of: Callable[[int], int]
) -> tuple[list[int], list[tuple[int, Region]], list[tuple[int, int]]]:
    """One rank's orders: leaves it writes whole, ``(leaf, piece)`` it writes in part, and
    ``(replica group, leaf)`` it checksums, leaves named by their index in its own flatten order
    (``ndim_of(leaf)``: its number of dimensions, to which a piece's padded columns are cut)."""
    whole = np.frombuffer(o["whole"], "<i8").tolist()
    D = int(o["ndim"])
    cut = []
    for row in np.frombuffer(o["cut"], "<i8").reshape(-1, 2 * D + 3).tolist():
        lc, fs, fc = row[0], row[1], row[2]
        d = ndim_of(lc)
        cut.append((lc, Region(tuple(row[3 : 3 + d]), tuple(row[3 + D : 3 + D + d]), fs, fc)))
    reps = np.frombuffer(o["replicas"], "<i8").reshape(-1, 2).tolist()
    return whole, cut, [(int(g), int(lc)) for g, lc in reps]


# --------------------------------------------------------------------------- the cache


@dataclass
class CachedAgreement:
    """What a rank keeps of the last agreement: its id and this rank's part of it."""

    agreement_id: bytes
    digest: bytes  # this rank's declarations it was made from
    orders: dict[str, Any]
    has_replicas: bool
    bytes_per_rank: list[int]
    # rank 0 only: every rank's digest and the whole agreement
    digests: list[bytes] | None = None
    agreement: Agreement | None = None


def agreement_id(digests: list[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.digest()
