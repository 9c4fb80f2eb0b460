"""save / load: the DCP-shaped entry points, and the commit protocol that makes a save atomic.

A save takes three collectives on the given group, all of them carrying errors as data so that
a failure on one rank makes every rank raise, never hang:

1. all-gather of declarations (what each rank holds, as global regions) and rank 0's save id;
   every rank then computes the same write plan (replicas once, balanced) on its own;
2. (only if replicas exist) all-gather of the replicas' checksums: replicas that differ fail
   the save and name the key, where DCP silently keeps one;
3. all-gather of chunk records after each rank has written and fsynced its data file; rank 0
   writes the metadata, then the manifest (temp, fsync, rename, fsync directory), then
   broadcasts the outcome. Files of older saves in the same directory are removed only after.

A load needs no collective at all: every rank reads the metadata and intersects it with the
layout of the tensors it was given.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
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
from .geometry import Region, tiling_error
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
    """What every rank agreed on before any byte is written (the output of collective 1)."""

    path: Path
    group: Any
    rank: int
    world: int
    save_id: str
    leaves: list[TensorLeaf]
    by_name: dict[str, TensorLeaf]
    meta: dict[str, tuple[str, list[int], str]]
    values: dict[str, Any]
    replica_keys: list[tuple[str, Region]]
    plan: list[Assignment]
    bytes_per_rank: list[int]

    def my_replica_keys(self) -> list[int]:
        """Indices of the replica groups this rank holds (it reports their checksums)."""
        return [
            i
            for i, (name, region) in enumerate(self.replica_keys)
            if name in self.by_name and self.by_name[name].region == region
        ]

    def my_pieces(self) -> list[Assignment]:
        return [a for a in self.plan if a.rank == self.rank]


def prepare(state_dict: dict[str, Any], path: Path, group: Any, block_bytes: int) -> Prepared:
    """Collective 1: declarations and rank 0's save id; then every rank plans the same writes."""
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
    msg = {
        "rank": rank,
        "error": error,
        "save_id": uuid.uuid4().hex[:16] if rank == 0 else "",
        "decls": decls,
        "values": vals,
    }
    gathered = collective.all_gather_obj(msg, group)
    _raise_errors(gathered, f"save to {str(path)!r} failed")
    save_id = gathered[0]["save_id"]

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
    for name, regs in regions_of.items():
        try:
            bad = tiling_error(tuple(meta[name][1]), sorted(regs, key=lambda r: (r.flat_start, r.offsets)))
        except ValueError as e:
            bad = str(e)
        if bad:
            raise SaveError(f"save to {str(path)!r} failed: {name!r}: the ranks' shards do not tile it: {bad}")
    replica_keys = sorted((k for k, hs in holders.items() if len(hs) > 1), key=lambda k: (k[0], _enc_region(k[1])))
    plan = plan_writes(per_rank)
    bytes_per_rank = [0] * world
    for a in plan:
        bytes_per_rank[a.rank] += a.piece.numel * dtype_info(meta[a.name][0]).itemsize
    by_name = {lf.name: lf for lf in leaves}
    return Prepared(
        path, group, rank, world, save_id, leaves, by_name, meta, values, replica_keys, plan, bytes_per_rank
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
    if prep.replica_keys:
        mine = {}
        error = None
        try:
            for i in prep.my_replica_keys():
                mine[str(i)] = crc32c.crc32c(host_bytes(prep.by_name[prep.replica_keys[i][0]].local))
        except Exception as e:
            error = _err(e)
        crcs = collective.all_gather_obj({"rank": rank, "error": error, "crcs": mine}, group)
        _raise_errors(crcs, f"save to {str(path)!r} failed")
        bad = replica_mismatch(path, prep.replica_keys, crcs)
        if bad:
            raise SaveError(bad)
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
    written = collective.all_gather_obj(rec, group)

    def discard() -> None:
        for r in results:
            remove_quietly(path / r.name)

    outcome = {"ok": True, "error": None}
    stale: list[Path] = []
    if any(m["error"] for m in written):
        discard()
        errs = "; ".join(f"rank {m['rank']}: {m['error']}" for m in written if m["error"])
        raise SaveError(f"save to {str(path)!r} failed while writing; nothing was committed. {errs}")
    if rank == 0:
        try:
            stale = commit(
                path, prep.save_id, step, prep.world, prep.meta, prep.values, written, block_bytes, user or {}
            )
        except Exception as e:
            outcome = {"ok": False, "error": _err(e)}
    outcome = collective.broadcast_obj(outcome, 0, group)
    if not outcome["ok"]:
        discard()
        raise SaveError(f"save to {str(path)!r} failed at commit on rank 0: {outcome['error']}")
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
) -> LoadResult:
    """Fill ``state_dict`` in place from the checkpoint at ``path``.

    What each rank reads is decided by the layout of the tensors it passes (DTensor placements,
    LocalShard/FlatShard declarations, or whole tensors), whatever layout the checkpoint was
    saved with. ``process_group`` and ``no_dist`` are accepted for DCP compatibility: a load needs
    no collective. Reads are coalesced across gaps while the bytes read stay within
    ``max_amplification`` × the bytes needed (raise it for fewer, larger reads).
    """
    t0 = time.perf_counter()
    path = _resolve(path, checkpoint_id)
    ck = Checkpoint(path)
    leaves, value_leaves = flatten(state_dict)
    saved = {t.name: t for t in ck.metadata.tensors}
    requests: list[Request] = []
    finish: list[tuple[Any, Any]] = []
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
            staging = _staging_like(lf)
            finish.append((lf.local, staging))
            dest = dest_bytes(staging)
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
    stats = ck.read_into(
        requests, verify=verify, read_buffer=read_buffer, threads=threads, max_amplification=max_amplification
    )
    for target, staging in finish:
        if isinstance(target, np.ndarray):
            np.copyto(target, staging)
        else:
            with torch.no_grad():
                target.copy_(staging, non_blocking=False)
    return LoadResult(path, ck.step, stats, {"total_s": time.perf_counter() - t0})


def _staging_like(lf: TensorLeaf) -> torch.Tensor | np.ndarray:
    shape = (lf.region.flat_count,) if lf.region.is_flat else lf.region.sizes
    if isinstance(lf.local, np.ndarray):
        return np.empty(shape, dtype=lf.local.dtype)
    pin = lf.local.device.type == "cuda" and torch.cuda.is_available()
    return torch.empty(shape, dtype=lf.local.dtype, pin_memory=pin)


def _near(name: str, saved: dict) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(saved), n=3)
    return f"did you mean {', '.join(map(repr, close))}?" if close else f"it holds {len(saved)} tensors"


def verify(path: str | os.PathLike, progress: Any = None) -> int:
    """Check every chunk and block checksum of a committed checkpoint; returns bytes checked."""
    return Checkpoint(path).verify(progress)
