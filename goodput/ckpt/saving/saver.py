"""save: the DCP-shaped entry point of the save path, and the three rounds that make a save atomic.

A save takes three rounds of collectives on the given group, all carrying errors as data so that
a failure on one rank makes every rank raise, never hang:

1. the agreement round (:func:`prepare`): gather (to rank 0) of a 16-byte digest of each rank's
   declarations and its values. If every digest is the one the last agreement was made from,
   that agreement is reused (a broadcast says so). Otherwise a second gather brings the
   declarations themselves (what each rank holds, as global regions, in columns); rank 0 checks
   them, makes the save plan (replicas once, balanced; :mod:`goodput.ckpt.saving.agreement`),
   broadcasts the verdict, the save id and the bytes per rank, and scatters to each rank only its
   own orders: no rank but 0 ever decodes the other ranks' declarations (hundreds of megabytes
   at 16k ranks);
2. the replica round (only if replicas exist): gather (to rank 0) of the replicas' checksums,
   verdict broadcast: replicas that differ fail the save and name the key, where DCP silently
   keeps one;
3. the commit round: gather (to rank 0 only) of chunk records after each rank has written and
   fsynced its data files (:mod:`goodput.ckpt.saving.writer`); rank 0 decides and commits
   (:func:`goodput.ckpt.saving.commit.commit_round`: metadata, then the manifest), then broadcasts the
   outcome. Files of older saves in the same directory are removed only after.

The asynchronous save (:mod:`goodput.ckpt.saving.async_saver`) runs round 1 as it is here and the rest
in the background, through the file system.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import msgspec
import numpy as np
import torch

from .. import collective
from ..collective import name_ranks
from ..dcp_compat import (
    OVERWRITE_REFUSED,
    check_planner,
    checkpoint_exists,
    location,
    overwrite_refused,
    refuses_overwrite,
)
from ..errors import SaveError, describe, raise_rank_errors, save_error
from ..format.format import DEFAULT_BLOCK, MANIFEST, encode_value
from ..format.geometry import Region
from ..loading.reader import DCP_METADATA, is_committed
from ..state import TensorLeaf, flatten, host_bytes
from ..storage.base import Storage
from ..storage.location import checkpoint_path, display, storage_for
from .agreement import (
    Agreement,
    Assignment,
    CachedAgreement,
    agree,
    agree_values,
    agreement_id,
    declare,
    decode_orders,
    digest,
)
from .commit import commit, commit_round, file_records, replica_mismatch
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


def slice_local(leaf: TensorLeaf, piece: Region) -> torch.Tensor | np.ndarray:
    """The part of a leaf's local data that ``piece`` (global coordinates) covers."""
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
    meta: dict[str, tuple[str, list[int], str]]  # all tensors on rank 0; this rank's elsewhere
    values: dict[str, Any]  # rank 0 only
    replica_keys: list[tuple[str, Region]]  # rank 0 only: every replica group, in index order
    has_replicas: bool  # the same on every rank: whether the replica check runs at all
    my_replicas: list[tuple[int, int]]  # (replica group index, leaf index) this rank checksums
    plan: list[Assignment]  # this rank's writes
    bytes_per_rank: list[int]
    cached: bool = False  # the agreement was reused from the last save

    def my_replica_keys(self) -> list[int]:
        """Indices of the replica groups this rank holds (it reports their checksums)."""
        return [i for i, _ in self.my_replicas]

    def my_pieces(self) -> list[Assignment]:
        return [a for a in self.plan if a.rank == self.rank]


_AGREEMENTS: dict[tuple, CachedAgreement] = {}  # (group, world, rank) -> the last agreement's part kept here


def _agreement_key(group: Any, rank: int, world: int) -> tuple:
    return (id(group) if group is not None and group is not collective.LOCAL else None, world, rank)


def _planning_error(e: Exception, path: Path, group: Any) -> str:
    """Rank 0's failure while planning, as the message every rank raises: a SaveError as it is
    worded, anything else (a bug) as one, so that every rank still hears of it."""
    if isinstance(e, SaveError):
        return name_ranks(str(e), group)
    return name_ranks(f"save to {display(path)!r} failed on rank 0 while planning: {describe(e)}", group)


def refuse_unsafe_target(path: Path) -> None:
    """A save never lands where it would damage something that is not a goodput checkpoint: the
    filesystem's root (``gc.save(sd, "/")`` would write MANIFEST.json into ``/``), or a DCP
    checkpoint's directory, where two formats would lie mixed and neither tool could tell which
    files are its own."""
    if isinstance(path, Path) and (full := path.resolve()) == Path(full.anchor):
        raise SaveError(f"refusing to save a checkpoint into the filesystem root {str(path)!r}: name a directory")
    store = storage_for(path)
    if store.exists(path, DCP_METADATA) and not store.exists(path, MANIFEST):
        raise SaveError(
            f"{display(path)!r} holds a DCP checkpoint ({DCP_METADATA!r}): a goodput save there would mix "
            "two formats in one directory. Save to another directory, or convert it first with "
            "`goodput ckpt import-dcp`"
        )


def prepare(
    state_dict: dict[str, Any], path: Path, group: Any, block_bytes: int, cache: bool = True, overwrite: bool = True
) -> Prepared:
    """Collective 1: every rank's declarations go to rank 0, which checks them, plans the writes
    and sends each rank its part; errors anywhere reach every rank as data, never a hang.

    First every rank sends only a digest of its declarations (16 bytes) and its values; when all
    digests match the agreement rank 0 made last time, and every rank still holds its part of it,
    that agreement is reused and no declaration crosses the network. Otherwise the declarations
    follow in a second gather (columns, see :mod:`goodput.ckpt.saving.agreement`)."""
    rank, world = collective.world(group)
    key = _agreement_key(group, rank, world)
    error = None
    leaves: list[TensorLeaf] = []
    vals = b""
    decl: dict[str, Any] = declare([])
    dg = b""
    try:
        check_block_bytes(block_bytes)
        if not overwrite and is_committed(path):
            raise overwrite_refused(path)
        if rank == 0:
            refuse_unsafe_target(path)
        storage_for(path).prepare(path)
        leaves, value_leaves = flatten(state_dict)
        vals = msgspec.msgpack.encode({v.name: encode_value(v.value, v.name) for v in value_leaves})
        decl = declare(leaves)
        dg = digest(decl)
    except Exception as e:  # carried to every rank, raised there
        error = describe(e)
    held = _AGREEMENTS.get(key) if cache else None
    held_id = held.agreement_id if held is not None and held.digest == dg else b""
    msg = {"rank": rank, "error": error, "digest": dg, "cached": held_id, "values": vals}
    first = collective.gather_obj(msg, 0, group)
    common: dict[str, Any] = {"error": None}
    if rank == 0:
        assert first is not None
        try:
            raise_rank_errors(first, f"save to {display(path)!r} failed")
            mine = _AGREEMENTS.get(key) if cache else None
            digests = [m["digest"] for m in first]
            hit = (
                mine is not None
                and mine.digests == digests
                and all(m["cached"] == mine.agreement_id for m in first)
                and mine.agreement is not None
            )
            if hit:
                assert mine is not None and mine.agreement is not None
                values = agree_values(first, mine.agreement.meta)
                common = {"error": None, "save_id": uuid.uuid4().hex[:16], "cached": True, "values": None}
            else:
                common = {"error": None, "cached": False}
        except Exception as e:
            common = {"error": _planning_error(e, path, group)}
    common = collective.broadcast_obj(common, 0, group)
    if common["error"]:
        raise save_error(common["error"])
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
                pid = agreement_id([m["digest"] for m in first])
                common = {
                    "error": None,
                    "save_id": uuid.uuid4().hex[:16],
                    "has_replicas": ag.has_replicas,
                    "bytes_per_rank": ag.bytes_per_rank,
                    "agreement_id": pid,
                }
            except Exception as e:
                common = {"error": _planning_error(e, path, group)}
        common = collective.broadcast_obj(common, 0, group)
        if common["error"]:
            raise save_error(common["error"])
        mine_orders = collective.scatter_obj(orders, 0, group)
        has_replicas, bytes_per_rank, save_id = common["has_replicas"], common["bytes_per_rank"], common["save_id"]
        if cache:
            kept = CachedAgreement(common["agreement_id"], dg, mine_orders, has_replicas, bytes_per_rank)
            if rank == 0:
                assert ag is not None and first is not None
                kept.digests = [m["digest"] for m in first]
                kept.agreement = dataclasses.replace(ag, orders=[])
            _AGREEMENTS[key] = kept
    whole, cut, reps = decode_orders(mine_orders, lambda i: len(leaves[i].global_shape))
    plan = [Assignment(rank, leaves[i].name, leaves[i].region, leaves[i].region, i) for i in whole]
    plan += [Assignment(rank, leaves[i].name, p, leaves[i].region, i) for i, p in cut]
    my_meta = {lf.name: (lf.dtype, list(lf.global_shape), lf.kind) for lf in leaves}
    return Prepared(
        path,
        group,
        rank,
        world,
        save_id,
        leaves,
        ag.meta if ag is not None else my_meta,
        ag.values if ag is not None else {},
        ag.replica_keys if ag is not None else [],
        has_replicas,
        reps,
        plan,
        bytes_per_rank,
        cached,
    )


def save(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    storage_writer: Any = None,
    planner: Any = None,
    process_group: Any = None,
    step: int | None = None,
    block_bytes: int = DEFAULT_BLOCK,
    user: dict[str, Any] | None = None,
    no_dist: bool = False,
    use_collectives: bool = True,
    files_per_rank: int | None = None,
    direct: bool = True,
) -> SaveResult:
    """Save ``state_dict`` to ``path`` from every rank of ``process_group``; atomic on success.

    DCP's call shapes work as in DCP: ``checkpoint_id=``, ``storage_writer=FileSystemWriter(path)``
    (``overwrite=False`` refuses an existing checkpoint), ``planner=`` (DCP's default planner only),
    Stateful values (saved through their ``state_dict()``). ``no_dist=True`` saves from this
    process alone even inside a process group (as DCP's flag); ``use_collectives=False`` is
    accepted only where there is nothing to coordinate (one process): the atomic commit needs it.
    ``files_per_rank > 1`` writes each rank's bytes as that many files in parallel streams; by
    default a rank writing 256 MiB or more writes two (``writer.auto_files``), 1 keeps one.
    ``direct`` writes with O_DIRECT where the file system allows it (see ``writer.write_data_file``).
    """
    t0 = time.perf_counter()
    path = checkpoint_path(location(path, checkpoint_id, storage_writer, "storage_writer"), None)
    check_planner(planner, "save")
    storage: Storage = storage_for(path)
    group = collective.LOCAL if no_dist else process_group
    if not use_collectives and collective.world(group)[1] > 1:
        raise ValueError(
            "use_collectives=False: a goodput save commits atomically through rank 0, which needs the group; "
            "pass no_dist=True to save from one process alone"
        )
    timings: dict[str, float] = {}
    try:
        overwrite = not refuses_overwrite(storage_writer)
        prep = prepare(state_dict, path, group, block_bytes, overwrite=overwrite)
    except SaveError as e:
        if OVERWRITE_REFUSED in str(e):
            raise checkpoint_exists(str(e)) from None
        raise
    rank = prep.rank

    # ---- 2. replicas must agree -------------------------------------------------------------
    if prep.has_replicas and prep.world > 1:  # one process: nothing to compare with
        mine: list[list[int]] = []
        error = None
        try:
            for i, leaf in prep.my_replicas:
                mine.append([i, crc32c.crc32c(host_bytes(prep.leaves[leaf].local))])
        except Exception as e:
            error = describe(e)
        reports = collective.gather_obj({"rank": rank, "error": error, "crcs": mine}, 0, group)
        verdict = None
        if rank == 0:
            assert reports is not None
            try:
                raise_rank_errors(reports, f"save to {display(path)!r} failed")
                verdict = replica_mismatch(prep.replica_keys, reports)
                verdict = name_ranks(f"save to {display(path)!r} failed: {verdict}", group) if verdict else None
            except SaveError as e:
                verdict = name_ranks(str(e), group)
        verdict = collective.broadcast_obj(verdict, 0, group)
        if verdict:
            raise save_error(verdict)
    timings["plan_s"] = time.perf_counter() - t0

    # ---- 3. write, then commit --------------------------------------------------------------
    t1 = time.perf_counter()
    error = None
    results: list[FileResult] = []
    try:
        pieces = [
            Piece(a.name, a.piece, host_bytes(slice_local(prep.leaves[a.leaf], a.piece))) for a in prep.my_pieces()
        ]
        results = write_rank_files(storage, str(path), prep.save_id, rank, pieces, block_bytes, files_per_rank, direct)
    except Exception as e:
        error = describe(e)
    rec = {"rank": rank, "error": error, "files": file_records(results)}
    timings["write_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    written = collective.gather_obj(rec, 0, group)  # only rank 0 commits, so only it decodes

    def discard() -> None:
        for r in results:
            storage.remove(path, r.name)

    outcome: dict[str, Any] = {"ok": True, "error": None}
    stale: list[str] = []
    if rank == 0:
        assert written is not None
        decided = commit_round(
            written,
            None,  # replicas were compared before anything was written (round 2)
            lambda: commit(
                storage,
                path,
                prep.save_id,
                step,
                prep.world,
                prep.meta,
                prep.values,
                written,
                block_bytes,
                user or {},
                replace=overwrite,
            ),
        )
        stale = decided.stale
        outcome = {"ok": decided.ok, "error": name_ranks(decided.error, group) if decided.error else None}
    outcome = collective.broadcast_obj(outcome, 0, group)
    if not outcome["ok"]:
        discard()
        raise save_error(f"save to {display(path)!r} {outcome['error']}")
    for name in stale:  # after the other ranks were released: not on their critical path
        storage.remove(path, name)
    timings["commit_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    mine_bytes = sum(r.bytes for r in results)
    return SaveResult(
        path, prep.save_id, step, mine_bytes, sum(prep.bytes_per_rank), prep.bytes_per_rank, timings, prep.cached
    )


def save_state_dict(
    state_dict: dict[str, Any],
    storage_writer: Any,
    process_group: Any = None,
    coordinator_rank: int = 0,
    no_dist: bool = False,
    planner: Any = None,
) -> Any:
    """DCP's deprecated ``save_state_dict``: :func:`goodput.ckpt.save` (rank 0 always commits)."""
    if coordinator_rank != 0:
        raise ValueError("coordinator_rank: goodput's commit always runs on rank 0 of the group")
    return save(
        state_dict, storage_writer=storage_writer, process_group=process_group, no_dist=no_dist, planner=planner
    )
