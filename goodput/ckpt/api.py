"""save / load: the DCP-shaped entry points, and the commit protocol that makes a save atomic.

A save takes three rounds of collectives on the given group, all carrying errors as data so that
a failure on one rank makes every rank raise, never hang:

1. gather (to rank 0) of a 16-byte digest of each rank's declarations and its values. If every
   digest is the one the last agreement was made from, that agreement is reused (a broadcast
   says so). Otherwise a second gather brings the declarations themselves (what each rank holds,
   as global regions, in columns); rank 0 checks them, plans the writes (replicas once,
   balanced; :mod:`goodput.ckpt.agreement`), broadcasts the verdict, the save id and the bytes
   per rank, and scatters to each rank only its own orders: no rank but 0 ever decodes the
   other ranks' declarations (hundreds of megabytes at 16k ranks);
2. (only if replicas exist) gather (to rank 0) of the replicas' checksums, verdict broadcast:
   replicas that differ fail the save and name the key, where DCP silently keeps one;
3. gather (to rank 0 only) of chunk records after each rank has written and fsynced its data
   file; rank 0 writes the metadata, then the manifest (temp, fsync, rename, fsync directory),
   then broadcasts the outcome. Files of older saves in the same directory are removed only after.

A load needs no collective at all: every rank reads the metadata and intersects it with the
layout of the tensors it was given.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import uuid
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import crc32c
import msgspec
import numpy as np
import torch

from . import collective
from .agreement import Agreement, CachedPlan, SaveError, agree, agree_values, declare, decode_orders, digest, plan_id
from .commit import commit, file_records, replica_mismatch
from .dtypes import dtype as dtype_info
from .format import (
    DEFAULT_BLOCK,
    CheckpointError,
    decode_value,
    encode_value,
)
from .geometry import Region
from .plan_save import Assignment
from .readengine import DEFAULT_READ_BUFFER, ReadStats, Request
from .reader import Checkpoint
from .state import TensorLeaf, dest_bytes, flatten, host_bytes
from .storage import make_dirs, remove_quietly
from .writer import FileResult, Piece, write_rank_files


@dataclass
class SaveResult:
    path: Path
    save_id: str
    step: int | None
    bytes_written: int  # by this rank
    total_bytes: int  # by all ranks
    bytes_per_rank: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    plan_cached: bool = False  # the write plan was the last save's (same declarations on every rank)


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


def _annotate(msg: str, group: Any) -> str:
    """Ranks in messages are positions in the save's group; on a sub-group, say which processes
    those are (global ranks), so the message names the process at fault."""
    import torch.distributed as dist

    if group is None or group is collective.LOCAL or not dist.is_initialized():
        return msg
    members = dist.get_process_group_ranks(group)
    if members == list(range(dist.get_world_size())):
        return msg
    shown = str(members) if len(members) <= 16 else f"[{members[0]}, {members[1]}, ..., {members[-1]}] ({len(members)})"
    return f"{msg} [ranks are numbered within the save's process group; its ranks 0, 1, ... are global ranks {shown}]"


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

    Rank 0 decides for everyone and keeps the whole agreement (it commits); every rank, rank 0
    included, receives only its own orders: the pieces it writes and the replicas it checksums,
    by index into its own leaves. No rank but 0 ever holds the other ranks' declarations.
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
    plan: list[Assignment]  # this rank's writes
    bytes_per_rank: list[int]
    cached: bool = False  # the agreement was reused from the last save

    def my_replica_keys(self) -> list[int]:
        """Indices of the replica groups this rank holds (it reports their checksums)."""
        return [i for i, _ in self.my_replicas]

    def my_pieces(self) -> list[Assignment]:
        return [a for a in self.plan if a.rank == self.rank]


_PLAN_CACHE: dict[tuple, CachedPlan] = {}  # (group, world, rank) -> the last agreement's part kept here


def _cache_key(group: Any, rank: int, world: int) -> tuple:
    return (id(group) if group is not None and group is not collective.LOCAL else None, world, rank)


def prepare(state_dict: dict[str, Any], path: Path, group: Any, block_bytes: int, cache: bool = True) -> Prepared:
    """Collective 1: every rank's declarations go to rank 0, which checks them, plans the writes
    and sends each rank its part; errors anywhere reach every rank as data, never a hang.

    First every rank sends only a digest of its declarations (16 bytes) and its values; when all
    digests match the agreement rank 0 made last time, and every rank still holds its part of it,
    that agreement is reused and no declaration crosses the network. Otherwise the declarations
    follow in a second gather (columns, see :mod:`goodput.ckpt.agreement`)."""
    rank, world = collective.world(group)
    key = _cache_key(group, rank, world)
    error = None
    leaves: list[TensorLeaf] = []
    vals = b""
    decl: dict[str, Any] = declare([])
    dg = b""
    try:
        check_block_bytes(block_bytes)
        make_dirs(path)
        leaves, value_leaves = flatten(state_dict)
        vals = msgspec.msgpack.encode({v.name: encode_value(v.value, v.name) for v in value_leaves})
        decl = declare(leaves)
        dg = digest(decl)
    except Exception as e:  # carried to every rank, raised there
        error = _err(e)
    held = _PLAN_CACHE.get(key) if cache else None
    held_id = held.plan_id if held is not None and held.digest == dg else b""
    msg = {"rank": rank, "error": error, "digest": dg, "cached": held_id, "values": vals}
    first = collective.gather_obj(msg, 0, group)
    common: dict[str, Any] = {"error": None}
    if rank == 0:
        assert first is not None
        try:
            _raise_errors(first, f"save to {str(path)!r} failed")
            mine = _PLAN_CACHE.get(key) if cache else None
            digests = [m["digest"] for m in first]
            hit = (
                mine is not None
                and mine.digests == digests
                and all(m["cached"] == mine.plan_id for m in first)
                and mine.agreement is not None
            )
            if hit:
                assert mine is not None and mine.agreement is not None
                values = agree_values(first, mine.agreement.meta)
                common = {"error": None, "save_id": uuid.uuid4().hex[:16], "cached": True, "values": None}
            else:
                common = {"error": None, "cached": False}
        except SaveError as e:
            common = {"error": _annotate(str(e), group)}
        except Exception as e:  # a bug in planning: still every rank hears of it
            common = {"error": _annotate(f"save to {str(path)!r} failed on rank 0 while planning: {_err(e)}", group)}
    common = collective.broadcast_obj(common, 0, group)
    if common["error"]:
        raise SaveError(common["error"])
    ag: Agreement | None = None
    cached = bool(common["cached"])
    if cached:
        assert held is not None
        mine_orders, has_replicas, bytes_per_rank = held.orders, held.has_replicas, held.bytes_per_rank
        if rank == 0:
            assert held.agreement is not None
            ag = dataclasses.replace(held.agreement, values=values)
        save_id = common["save_id"]
    else:
        full = collective.gather_obj({"rank": rank, **decl}, 0, group)
        orders: list[dict] | None = None
        common = {"error": None}
        if rank == 0:
            assert full is not None and first is not None
            try:
                for m, f in zip(full, first):
                    m["values"] = f["values"]
                ag = agree(full, world, path)
                orders = ag.orders
                pid = plan_id([m["digest"] for m in first])
                common = {
                    "error": None,
                    "save_id": uuid.uuid4().hex[:16],
                    "has_replicas": ag.has_replicas,
                    "bytes_per_rank": ag.bytes_per_rank,
                    "plan_id": pid,
                }
            except SaveError as e:
                common = {"error": _annotate(str(e), group)}
            except Exception as e:  # a bug in planning: still every rank hears of it
                common = {
                    "error": _annotate(f"save to {str(path)!r} failed on rank 0 while planning: {_err(e)}", group)
                }
        common = collective.broadcast_obj(common, 0, group)
        if common["error"]:
            raise SaveError(common["error"])
        mine_orders = collective.scatter_obj(orders, 0, group)
        has_replicas, bytes_per_rank, save_id = common["has_replicas"], common["bytes_per_rank"], common["save_id"]
        if cache:
            kept = CachedPlan(common["plan_id"], dg, mine_orders, has_replicas, bytes_per_rank)
            if rank == 0:
                assert ag is not None and first is not None
                kept.digests = [m["digest"] for m in first]
                kept.agreement = dataclasses.replace(ag, orders=[])
            _PLAN_CACHE[key] = kept
    whole, cut, reps = decode_orders(mine_orders, lambda i: len(leaves[i].global_shape))
    plan = [Assignment(rank, leaves[i].name, leaves[i].region, leaves[i].region) for i in whole]
    plan += [Assignment(rank, leaves[i].name, p, leaves[i].region) for i, p in cut]
    my_meta = {lf.name: (lf.dtype, list(lf.global_shape), lf.kind) for lf in leaves}
    return Prepared(
        path,
        group,
        rank,
        world,
        save_id,
        leaves,
        {lf.name: lf for lf in leaves},
        ag.meta if ag is not None else my_meta,
        ag.values if ag is not None else {},
        ag.replica_keys if ag is not None else [],
        has_replicas,
        [(g, leaves[i].name) for g, i in reps],
        plan,
        bytes_per_rank,
        cached,
    )


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
    files_per_rank: int | None = None,
    direct: bool = True,
) -> SaveResult:
    """Save ``state_dict`` to ``path`` from every rank of ``process_group``; atomic on success.

    ``no_dist=True`` saves from this process alone even inside a process group (as DCP's flag).
    ``files_per_rank > 1`` writes each rank's bytes as that many files in parallel streams; by
    default a rank writing 256 MiB or more writes two (``writer.auto_files``), 1 keeps one.
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
        mine: list[list[int]] = []
        error = None
        try:
            for i, name in prep.my_replicas:
                mine.append([i, crc32c.crc32c(host_bytes(prep.by_name[name].local))])
        except Exception as e:
            error = _err(e)
        reports = collective.gather_obj({"rank": rank, "error": error, "crcs": mine}, 0, group)
        verdict = None
        if rank == 0:
            assert reports is not None
            try:
                _raise_errors(reports, f"save to {str(path)!r} failed")
                verdict = replica_mismatch(path, prep.replica_keys, reports)
                verdict = _annotate(verdict, group) if verdict else None
            except SaveError as e:
                verdict = _annotate(str(e), group)
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
            outcome = {"ok": False, "error": _annotate(f"failed while writing; nothing was committed. {errs}", group)}
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
    return SaveResult(
        path, prep.save_id, step, mine_bytes, sum(prep.bytes_per_rank), prep.bytes_per_rank, timings, prep.cached
    )


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
