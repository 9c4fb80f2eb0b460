"""save / load: the DCP-shaped entry points, and the commit protocol that makes a save atomic.

A save takes three rounds of collectives on the given group, all carrying errors as data so that
a failure on one rank makes every rank raise, never hang:

1. gather (to rank 0) of declarations (what each rank holds, as global regions); rank 0 checks
   them, plans the writes (replicas once, balanced), broadcasts the verdict, the save id and the
   bytes per rank, and scatters to each rank only its own orders: no rank but 0 ever decodes the
   other ranks' declarations (megabytes at 16k ranks);
2. (only if replicas exist) gather (to rank 0) of the replicas' checksums, verdict broadcast:
   replicas that differ fail the save and name the key, where DCP silently keeps one;
3. gather (to rank 0 only) of chunk records after each rank has written and fsynced its data
   file; rank 0 writes the metadata, then the manifest (temp, fsync, rename, fsync directory),
   then broadcasts the outcome. Files of older saves in the same directory are removed only after.

A load needs no collective at all: every rank reads the metadata and intersects it with the
layout of the tensors it was given.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import torch

from . import collective
from .commit import _dec_region, _enc_region, commit, file_records, replica_mismatch
from .dtypes import dtype as dtype_info
from .format import (
    DEFAULT_BLOCK,
    CheckpointError,
    decode_value,
    encode_value,
)
from .geometry import Region
from .index import tiling_errors
from .plan_save import Assignment, Decl, plan_writes
from .readengine import DEFAULT_READ_BUFFER, ReadStats, Request
from .reader import Checkpoint
from .state import TensorLeaf, dest_bytes, flatten, host_bytes
from .storage import remove_quietly
from .writer import FileResult, Piece, write_rank_files


class SaveError(CheckpointError):
    """A save failed; nothing was committed. The message names the rank, key or file at fault."""


@dataclass
class SaveResult:
    path: Path
    save_id: str
    step: int | None
    bytes_written: int  # by this rank
    total_bytes: int  # by all ranks
    bytes_per_rank: list[int]
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class LoadResult:
    path: Path
    step: int | None
    stats: ReadStats
    timings: dict[str, float] = field(default_factory=dict)


def _resolve(path: Any, checkpoint_id: Any) -> Path:
    if path is None and checkpoint_id is None:
        raise TypeError("give the checkpoint's path (or checkpoint_id=)")
    if path is not None and checkpoint_id is not None and Path(path) != Path(checkpoint_id):
        raise TypeError("give either path or checkpoint_id, not two different ones")
    return Path(path if path is not None else checkpoint_id)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _raise_errors(msgs: list[dict], what: str) -> None:
    errs = [f"rank {m['rank']}: {m['error']}" for m in msgs if m.get("error")]
    if errs:
        raise SaveError(f"{what}; nothing was committed. " + "; ".join(errs))


def _slice_local(leaf: TensorLeaf, piece: Region) -> torch.Tensor | np.ndarray:
    src = leaf.region
    if piece == src:
        return leaf.local
    if piece.is_flat:
        a = piece.flat_start - src.flat_start
        return leaf.local[a : a + piece.flat_count]
    idx = tuple(slice(p - s, p - s + n) for p, s, n in zip(piece.offsets, src.offsets, piece.sizes))
    return leaf.local[idx]


def check_block_bytes(block_bytes: int) -> None:
    """Checksum blocks are a power of two from 512 B to 1 MiB, so that they divide the writer's
    segments, the reader's pieces and the page size evenly."""
    if not (isinstance(block_bytes, int) and 512 <= block_bytes <= 1 << 20 and block_bytes & (block_bytes - 1) == 0):
        raise ValueError(f"block_bytes must be a power of two from 512 to 1 MiB, got {block_bytes}")


@dataclass
class Prepared:
    """What this rank was told before any byte is written (the output of collective 1).

    Rank 0 decides for everyone and keeps the whole agreement (it commits); every other rank
    receives only its own part: the pieces it writes, the replicas it checksums, and the dtype
    and shape of those tensors. No rank but 0 ever holds the other ranks' declarations.
    """

    path: Path
    group: Any
    rank: int
    world: int
    save_id: str
    leaves: list[TensorLeaf]
    by_name: dict[str, TensorLeaf]
    meta: dict[str, tuple[str, list[int], str]]  # all tensors on rank 0; this rank's elsewhere
    values: dict[str, Any]  # rank 0 only
    replica_keys: list[tuple[str, Region]]  # rank 0 only: every replica group, in index order
    has_replicas: bool  # the same on every rank: whether the replica check runs at all
    my_replicas: list[tuple[int, str]]  # (replica group index, tensor) this rank checksums
    plan: list[Assignment]  # every rank's writes on rank 0; this rank's elsewhere
    bytes_per_rank: list[int]

    def my_replica_keys(self) -> list[int]:
        """Indices of the replica groups this rank holds (it reports their checksums)."""
        return [i for i, _ in self.my_replicas]

    def my_pieces(self) -> list[Assignment]:
        return [a for a in self.plan if a.rank == self.rank]


def _orders(ag: Agreement, world: int) -> list[dict]:
    """Each rank's part of the agreement, for the scatter."""
    orders: list[dict] = [{"pieces": [], "replicas": [], "meta": {}} for _ in range(world)]
    for a in ag.plan:
        o = orders[a.rank]
        o["pieces"].append([a.name, _enc_region(a.piece), _enc_region(a.source)])
        o["meta"][a.name] = list(ag.meta[a.name])
    for i, ((name, _), holders) in enumerate(zip(ag.replica_keys, ag.replica_holders)):
        for r in holders:
            orders[r]["replicas"].append([i, name])
            orders[r]["meta"][name] = list(ag.meta[name])
    return orders


def prepare(state_dict: dict[str, Any], path: Path, group: Any, block_bytes: int) -> Prepared:
    """Collective 1: every rank's declarations go to rank 0, which checks them, plans the writes
    and sends each rank its part; errors anywhere reach every rank as data, never a hang."""
    rank, world = collective.world(group)
    error = None
    leaves: list[TensorLeaf] = []
    vals: dict[str, Any] = {}
    decls: list[list] = []
    try:
        check_block_bytes(block_bytes)
        path.mkdir(parents=True, exist_ok=True)
        leaves, value_leaves = flatten(state_dict)
        vals = {v.name: encode_value(v.value, v.name) for v in value_leaves}
        for lf in leaves:
            nbytes = lf.region.numel * dtype_info(lf.dtype).itemsize
            decls.append([lf.name, lf.dtype, list(lf.global_shape), lf.kind, _enc_region(lf.region), nbytes])
    except Exception as e:  # carried to every rank, raised there
        error = _err(e)
    msg = {"rank": rank, "error": error, "decls": decls, "values": vals}
    gathered = collective.gather_obj(msg, 0, group)
    ag: Agreement | None = None
    orders: list[dict] | None = None
    common: dict[str, Any] = {"error": None}
    if rank == 0:
        assert gathered is not None
        try:
            _raise_errors(gathered, f"save to {str(path)!r} failed")
            ag = agree(gathered, world, path)
            orders = _orders(ag, world)
            common = {
                "error": None,
                "save_id": uuid.uuid4().hex[:16],
                "has_replicas": bool(ag.replica_keys),
                "bytes_per_rank": ag.bytes_per_rank,
            }
        except SaveError as e:
            common = {"error": str(e)}
        except Exception as e:  # a bug in planning: still every rank hears of it
            common = {"error": f"save to {str(path)!r} failed on rank 0 while planning: {_err(e)}"}
    common = collective.broadcast_obj(common, 0, group)
    if common["error"]:
        raise SaveError(common["error"])
    mine = collective.scatter_obj(orders, 0, group)
    by_name = {lf.name: lf for lf in leaves}
    my_meta = {k: (v[0], v[1], v[2]) for k, v in mine["meta"].items()}
    my_plan = [Assignment(rank, n, _dec_region(p), _dec_region(src)) for n, p, src in mine["pieces"]]
    return Prepared(
        path,
        group,
        rank,
        world,
        common["save_id"],
        leaves,
        by_name,
        ag.meta if ag is not None else my_meta,
        ag.values if ag is not None else {},
        ag.replica_keys if ag is not None else [],
        common["has_replicas"],
        [(int(i), n) for i, n in mine["replicas"]],
        ag.plan if ag is not None else my_plan,
        common["bytes_per_rank"],
    )


@dataclass
class Agreement:
    """What :func:`agree` decides from the gathered declarations."""

    meta: dict[str, tuple[str, list[int], str]]
    values: dict[str, Any]
    replica_keys: list[tuple[str, Region]]
    replica_holders: list[list[int]]  # the ranks holding each replica group
    plan: list[Assignment]
    bytes_per_rank: list[int]


def agree(gathered: list[dict], world: int, path: Path) -> Agreement:
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
            region = _dec_region(reg)
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
    replica_keys = sorted((k for k, hs in holders.items() if len(hs) > 1), key=lambda k: (k[0], _enc_region(k[1])))
    plan = plan_writes(per_rank)
    bytes_per_rank = [0] * world
    for a in plan:
        bytes_per_rank[a.rank] += a.piece.numel * dtype_info(meta[a.name][0]).itemsize
    return Agreement(meta, values, replica_keys, [holders[k] for k in replica_keys], plan, bytes_per_rank)


def save(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    process_group: Any = None,
    step: int | None = None,
    block_bytes: int = DEFAULT_BLOCK,
    user: dict[str, Any] | None = None,
    no_dist: bool = False,
    files_per_rank: int = 1,
    direct: bool = True,
) -> SaveResult:
    """Save ``state_dict`` to ``path`` from every rank of ``process_group``; atomic on success.

    ``no_dist=True`` saves from this process alone even inside a process group (as DCP's flag).
    ``files_per_rank > 1`` writes each rank's bytes as that many files in parallel streams.
    ``direct`` writes with O_DIRECT where the file system allows it (see ``writer.write_data_file``).
    """
    t0 = time.perf_counter()
    path = _resolve(path, checkpoint_id)
    group = collective.LOCAL if no_dist else process_group
    timings: dict[str, float] = {}
    prep = prepare(state_dict, path, group, block_bytes)
    rank = prep.rank

    # ---- 2. replicas must agree -------------------------------------------------------------
    if prep.has_replicas and prep.world > 1:  # one process: nothing to compare with
        mine = {}
        error = None
        try:
            for i, name in prep.my_replicas:
                mine[str(i)] = crc32c.crc32c(host_bytes(prep.by_name[name].local))
        except Exception as e:
            error = _err(e)
        reports = collective.gather_obj({"rank": rank, "error": error, "crcs": mine}, 0, group)
        verdict = None
        if rank == 0:
            assert reports is not None
            try:
                _raise_errors(reports, f"save to {str(path)!r} failed")
                verdict = replica_mismatch(path, prep.replica_keys, reports)
            except SaveError as e:
                verdict = str(e)
        verdict = collective.broadcast_obj(verdict, 0, group)
        if verdict:
            raise SaveError(verdict)
    timings["plan_s"] = time.perf_counter() - t0

    # ---- 3. write, then commit --------------------------------------------------------------
    t1 = time.perf_counter()
    error = None
    results: list[FileResult] = []
    try:
        pieces = [
            Piece(a.name, a.piece, host_bytes(_slice_local(prep.by_name[a.name], a.piece))) for a in prep.my_pieces()
        ]
        results = write_rank_files(str(path), prep.save_id, rank, pieces, block_bytes, files_per_rank, direct)
    except Exception as e:
        error = _err(e)
    rec = {"rank": rank, "error": error, "files": file_records(results)}
    timings["write_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    written = collective.gather_obj(rec, 0, group)  # only rank 0 commits, so only it decodes

    def discard() -> None:
        for r in results:
            remove_quietly(path / r.name)

    outcome = {"ok": True, "error": None}
    stale: list[Path] = []
    if rank == 0:
        assert written is not None
        if any(m["error"] for m in written):
            errs = "; ".join(f"rank {m['rank']}: {m['error']}" for m in written if m["error"])
            outcome = {"ok": False, "error": f"failed while writing; nothing was committed. {errs}"}
        else:
            try:
                stale = commit(
                    path, prep.save_id, step, prep.world, prep.meta, prep.values, written, block_bytes, user or {}
                )
            except Exception as e:
                outcome = {"ok": False, "error": f"failed at commit on rank 0: {_err(e)}"}
    outcome = collective.broadcast_obj(outcome, 0, group)
    if not outcome["ok"]:
        discard()
        raise SaveError(f"save to {str(path)!r} {outcome['error']}")
    for p in stale:  # after the other ranks were released: not on their critical path
        remove_quietly(p)
    timings["commit_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    mine_bytes = sum(r.bytes for r in results)
    return SaveResult(path, prep.save_id, step, mine_bytes, sum(prep.bytes_per_rank), prep.bytes_per_rank, timings)


def load(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    process_group: Any = None,
    verify: bool = True,
    read_buffer: int = DEFAULT_READ_BUFFER,
    threads: int = 4,
    strict: bool = True,
    no_dist: bool = False,
    max_amplification: float = 1.1,
    staging_bytes: int | None = None,
) -> LoadResult:
    """Fill ``state_dict`` in place from the checkpoint at ``path``.

    What each rank reads is decided by the layout of the tensors it passes (DTensor placements,
    LocalShard/FlatShard declarations, or whole tensors), whatever layout the checkpoint was
    saved with. ``process_group`` and ``no_dist`` are accepted for DCP compatibility: a load needs
    no collective. Reads are coalesced across gaps while the bytes read stay within
    ``max_amplification`` × the bytes needed (raise it for fewer, larger reads).

    Tensors with no writable contiguous host memory (non-contiguous views, CUDA tensors) are
    filled through one reused staging buffer of ``staging_bytes`` (default
    ``min(64 MiB, max(read_buffer // 4, 1 MiB))``), piece by piece, so that a load's host memory
    stays within the targets plus ``read_buffer`` plus ``staging_bytes``, however large they are.
    """
    t0 = time.perf_counter()
    if staging_bytes is not None and not (isinstance(staging_bytes, int) and staging_bytes > 0):
        raise ValueError(f"staging_bytes must be a positive int, got {staging_bytes!r}")
    piece_cap = staging_bytes if staging_bytes is not None else _default_staging(read_buffer)
    path = _resolve(path, checkpoint_id)
    ck = Checkpoint(path)
    leaves, value_leaves = flatten(state_dict)
    saved = {t.name: t for t in ck.metadata.tensors}
    requests: list[Request] = []
    staged: list[TensorLeaf] = []
    for lf in leaves:
        t = saved.get(lf.name)
        if t is None:
            if lf.name in ck.metadata.values:
                raise CheckpointError(
                    f"{lf.name!r} was saved as a value ({ck.metadata.values[lf.name]!r}), not a tensor"
                )
            if strict:
                raise CheckpointError(
                    f"tensor {lf.name!r} is not in the checkpoint at {str(path)!r} ({_near(lf.name, saved)})"
                )
            continue
        if tuple(t.shape) != tuple(lf.global_shape):
            raise CheckpointError(
                f"tensor {lf.name!r}: saved with global shape {tuple(t.shape)}, loading into {tuple(lf.global_shape)}"
            )
        if t.dtype != lf.dtype:
            raise CheckpointError(f"tensor {lf.name!r}: saved as {t.dtype}, loading into {lf.dtype}")
        if lf.region.numel == 0:
            continue
        dest = dest_bytes(lf.local)
        if dest is None:
            staged.append(lf)
        else:
            requests.append(Request(lf.name, lf.region, dest))
    for v in value_leaves:
        if v.name not in ck.metadata.values:
            if v.name in saved:
                raise CheckpointError(
                    f"{v.name!r} was saved as a tensor, the state dict holds a {type(v.value).__name__}"
                )
            if strict:
                raise CheckpointError(f"value {v.name!r} is not in the checkpoint at {str(path)!r}")
            continue
        new = decode_value(ck.metadata.values[v.name])
        if isinstance(v.parent, tuple):
            if new != v.value:
                raise CheckpointError(f"{v.name!r} lives in a tuple and cannot be replaced in place")
            continue
        v.parent[v.key] = new
    rounds = _staging_rounds(staged, piece_cap)
    buf = _staging_like(staged, max((p.end for r in rounds for p in r), default=0))
    stats = ReadStats()
    for i, pieces in enumerate(rounds or [[]]):  # direct requests ride with the first round
        reqs = (requests if i == 0 else []) + [
            Request(p.leaf.name, p.region, buf.bytes[p.offset : p.end]) for p in pieces
        ]
        got = ck.read_into(
            reqs, verify=verify, read_buffer=read_buffer, threads=threads, max_amplification=max_amplification
        )
        stats.add(**got.as_dict())
        buf.copy_out(pieces)
    return LoadResult(path, ck.step, stats, {"total_s": time.perf_counter() - t0})


_STAGING_ALIGN = 64  # every dtype's alignment, so any piece's bytes can be viewed as its dtype


def _default_staging(read_buffer: int) -> int:
    """A quarter of the read buffer keeps the staged load's extra memory proportionate to what
    the caller already allowed; the 1 MiB floor keeps tiny read buffers from forcing thousands
    of rounds, and the 64 MiB cap is where a round's fixed costs (planning, opening files) are
    already small next to the bytes it moves."""
    return min(64 << 20, max(read_buffer // 4, 1 << 20))


@dataclass
class _StagedPiece:
    """One sub-region of a staged leaf, read into ``[offset, end)`` of the staging buffer."""

    leaf: TensorLeaf
    region: Region  # global coordinates, as the reader wants
    index: tuple[slice, ...]  # the same part of ``leaf.local``
    shape: tuple[int, ...]
    offset: int
    end: int


def _split_leaf(lf: TensorLeaf, cap: int) -> list[tuple[Region, tuple[slice, ...], tuple[int, ...]]]:
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
            index = tuple(slice(a, a + s) for a, s in zip(local, shape))
            region = Region.box(tuple(o + a for o, a in zip(src.offsets, local)), shape)
            out.append((region, index, shape))
    return out


def _staging_rounds(staged: list[TensorLeaf], cap: int) -> list[list[_StagedPiece]]:
    """Pack the staged leaves' pieces, in order, into rounds that each fit one buffer of ``cap``
    bytes (or one piece, if a single element is larger)."""
    rounds: list[list[_StagedPiece]] = []
    cur: list[_StagedPiece] = []
    off = 0
    for lf in staged:
        item = dtype_info(lf.dtype).itemsize
        for region, index, shape in _split_leaf(lf, cap):
            nbytes = region.numel * item
            start = -(-off // _STAGING_ALIGN) * _STAGING_ALIGN
            if cur and start + nbytes > cap:
                rounds.append(cur)
                cur, start = [], 0
            cur.append(_StagedPiece(lf, region, index, shape, start, start + nbytes))
            off = start + nbytes
    if cur:
        rounds.append(cur)
    return rounds


class _StagingBuffer:
    """The one host buffer every staged piece passes through; pinned when a CUDA target needs it,
    so the host-to-device copies run at full speed and may be asynchronous."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.bytes: np.ndarray = self.tensor.numpy()
        self.pinned = pin

    def copy_out(self, pieces: list[_StagedPiece]) -> None:
        """Copy each piece to its target; returns only once the buffer may be overwritten."""
        devices: set[torch.device] = set()
        with torch.no_grad():
            for p in pieces:
                target = p.leaf.local
                if isinstance(target, np.ndarray):
                    view = self.bytes[p.offset : p.end].view(target.dtype).reshape(p.shape)
                    np.copyto(target[p.index] if p.index else target[...], view)
                    continue
                view = self.tensor[p.offset : p.end].view(target.dtype).view(p.shape)
                dst = target[p.index] if p.index else target
                if self.pinned and dst.device.type == "cuda":
                    dst.copy_(view, non_blocking=True)
                    devices.add(dst.device)
                else:
                    dst.copy_(view, non_blocking=False)
        for dev in devices:  # pragma: no cover - exercised on GPU machines
            torch.cuda.current_stream(dev).synchronize()


def _staging_like(staged: list[TensorLeaf], nbytes: int) -> _StagingBuffer:
    """Pinned only when some target is on a GPU and CUDA is usable: pinning costs page-locked
    memory and a CUDA context, which a CPU-only load must never pay for."""
    pin = (
        nbytes > 0
        and any(isinstance(lf.local, torch.Tensor) and lf.local.device.type == "cuda" for lf in staged)
        and torch.cuda.is_available()
    )
    return _StagingBuffer(nbytes, pin)


def _near(name: str, saved: dict) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(saved), n=3)
    return f"did you mean {', '.join(map(repr, close))}?" if close else f"it holds {len(saved)} tensors"


def verify(path: str | os.PathLike, progress: Any = None) -> int:
    """Check every chunk and block checksum of a committed checkpoint; returns bytes checked."""
    return Checkpoint(path).verify(progress)
