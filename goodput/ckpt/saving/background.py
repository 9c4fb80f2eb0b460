"""The background half of an asynchronous save: write, report, commit — with no collective.

DCP users hit deadlocks when a background thread runs collectives on the training process group
while the training loop runs its own. Here the background talks through the file system only:

1. each rank writes and fsyncs its data files from the staged copy, then drops a *done file*
   (``.goodput-<save_id>-r<rank>.done``: its chunk records, the checksums of the replicas it
   holds, or its error);
2. rank 0 waits for every rank's done file (or a rank's failure heard through the process
   group's store, :mod:`goodput.ckpt.saving.peers`), checks that replicas agree, writes the metadata and
   the manifest (the commit point, :func:`goodput.ckpt.saving.commit.commit`), or on any error or
   timeout writes an *abort file* with the reason and commits nothing;
3. the other ranks wait for the manifest carrying their save id, or the abort file (then each
   removes its own files: rank 0 may have aborted without its report).

A rank whose own write failed waits for nobody: the save cannot commit without its error-free
report, so it fails at once, and rank 0 in that case aborts without gathering the others'
reports. Those reports and the abort travel through the same storage that failed the write, and
in a 503 storm they are refused like the data: waiting for them waited out the whole timeout.

A tiered save (``job["control"]``, :mod:`goodput.ckpt.saving.tiers`) writes its data files to the rank's
fast directory, which may be node-local, and talks through the durable directory instead, which
every rank sees: the done and abort files go there, rank 0 writes the metadata and a *staged*
manifest there, and every rank then copies both into its own fast directory (the fast tier's
commit on that node). The drain later makes the staged manifest the durable one.

numpy only: it runs in the persistent writer process (:mod:`goodput.ckpt.saving.writer_process`, no
torch import) or in a thread of the trainer.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import crc32c
import msgspec
import numpy as np

from ..errors import CheckpointError, describe
from ..format.format import DATA_FILE, MANIFEST, MAX_MANIFEST_BYTES, decode_manifest
from ..format.geometry import Region, runs
from ..storage.base import Storage
from ..storage.location import storage_for
from .commit import commit, commit_round, file_records, staged_name
from .peers import read_note
from .writer import Piece, write_rank_files

POLL_S = 0.01
# seconds every rank's writer adds to its write: emulates a slow storage (a write longer than a
# training step) in tests and in the skip-vs-wait measurement of docs/ASYNC.md
SLOW_WRITE_ENV = "GOODPUT_CKPT_SLOW_WRITE_S"


def control(job: dict[str, Any]) -> Path:
    """Where the ranks of a save talk: the checkpoint directory, or a tiered save's durable one."""
    return Path(job.get("control") or job["path"])


def report_failure(path: Path, save_id: str, rank: int, error: str) -> None:
    """Tell rank 0 at once that this rank will not write (it aborts instead of timing out)."""
    storage = storage_for(path)
    with contextlib.suppress(Exception):
        storage.prepare(path)  # a tiered save's durable directory may not exist yet
    with contextlib.suppress(OSError):
        _put(storage, path, done_name(save_id, rank), {"rank": rank, "error": error, "files": [], "crcs": []})


def abort_job(job: dict[str, Any], error: str) -> None:
    """This rank will not write the job (its staging failed): tell rank 0, which aborts. Rank 0
    itself runs the commit round its writer would have run (its own report carries the error, so
    the round aborts), once every rank has reported, removing what they wrote."""
    if job["world"] == 1:
        return  # nothing was written, no one is waiting
    path = control(job)
    report_failure(path, job["save_id"], job["rank"], error)
    if job["rank"] == 0:
        own = {"rank": 0, "error": error, "files": [], "crcs": []}
        _commit_when_all_done(storage_for(path), job, path, time.perf_counter(), own)


def done_name(save_id: str, rank: int) -> str:
    return f".goodput-{save_id}-r{rank:05d}.done"


def abort_name(save_id: str) -> str:
    return f".goodput-{save_id}.abort"


REPORT_LIMIT = 1 << 30  # a done or abort file: one rank's chunk records, or a reason


def _put(storage: Storage, path: Path, name: str, obj: Any) -> None:
    """Atomically: rank 0 polls for these files and must never read half of one."""
    storage.publish(path, name, msgspec.msgpack.encode(obj))


def _get(storage: Storage, path: Path, name: str, what: str) -> Any:
    raw = storage.get_if_exists(path, name, what, REPORT_LIMIT)
    if raw is None:
        return None
    try:
        return msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return None


def staged_piece(
    buf: np.ndarray, off: int, source: Region, piece: Region, shape: tuple[int, ...], item: int
) -> np.ndarray:
    """The bytes of ``piece`` cut from a staged region: a view when contiguous, else a copy."""
    n = piece.numel * item
    if piece == source:
        return buf[off : off + n]
    src_start, dst_start, run = runs(*_bounds(piece, shape), source.affine(shape), piece.affine(shape))
    if len(src_start) == 1:
        a = off + int(src_start[0]) * item
        return buf[a : a + n]
    out = np.empty(n, np.uint8)
    for s, d in zip(src_start.tolist(), dst_start.tolist()):
        out[d * item : (d + run) * item] = buf[off + s * item : off + (s + run) * item]
    return out


def _bounds(r: Region, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    (offs, sizes), *rest = r.boxes(shape)
    if rest:
        raise ValueError("a flat piece spanning several boxes is cut from a flat source directly")
    lo = np.asarray(offs, np.int64)
    return lo, lo + np.asarray(sizes, np.int64)


def run_job(job: dict[str, Any], buf: np.ndarray) -> dict[str, Any]:
    """Write this rank's share of a save from ``buf`` (the staged copy), and commit if rank 0."""
    t0 = time.perf_counter()
    path = Path(job["path"])
    storage = storage_for(job["path"])
    cpath = control(job)
    cstorage = storage_for(cpath)
    save_id, rank = job["save_id"], job["rank"]
    timings: dict[str, float] = {}
    results = []
    error = None
    crcs: list[list[int]] = []
    try:
        if job.get("control"):
            cstorage.prepare(cpath)
        leaves = job["leaves"]
        for idx, leaf in job["replicas"]:
            off, nbytes = leaves[leaf][0], leaves[leaf][1]
            crcs.append([idx, crc32c.crc32c(memoryview(buf[off : off + nbytes]), 0, 1)])
        pieces = []
        for name, leaf, piece_enc, source_enc in job["pieces"]:
            off, _nbytes, shape, item = leaves[leaf]
            piece, source = Region.decode(piece_enc), Region.decode(source_enc)
            if piece.is_flat and source.is_flat:
                a = off + (piece.flat_start - source.flat_start) * item
                data = buf[a : a + piece.flat_count * item]
            else:
                data = staged_piece(buf, off, source, piece, tuple(shape), item)
            pieces.append(Piece(name, piece, data))
        results = write_rank_files(
            storage,
            str(path),
            save_id,
            rank,
            pieces,
            job["block_bytes"],
            job.get("files_per_rank"),
            job.get("direct", False),
        )
        slow = float(os.environ.get(SLOW_WRITE_ENV) or 0)
        if slow > 0:  # tests and measurements: a storage slower than this machine's disk
            time.sleep(slow)
    except BaseException as e:  # noqa: BLE001 - reported to rank 0 and to the caller
        error = describe(e)
    timings["write_s"] = time.perf_counter() - t0
    report = {"rank": rank, "error": error, "files": file_records(results), "crcs": crcs}
    try:
        if rank != 0:  # rank 0 knows its own report: its failure must not wait on the storage that failed it
            _put(cstorage, cpath, done_name(save_id, rank), report)
    except OSError as e:
        error = error or f"cannot report to rank 0: {describe(e)}"
    t1 = time.perf_counter()
    if rank == 0:
        outcome = _commit_when_all_done(cstorage, job, cpath, t1, report)
    elif report["error"]:
        # this rank's write failed: no word from rank 0 is needed, it cannot commit without this
        # rank's error-free report, which was never sent. Waiting for its abort file would wait out
        # the timeout whenever the storage that failed the write refuses that file too (a storm)
        outcome = {"ok": False, "error": f"failed while writing; nothing was committed. rank {rank}: {error}"}
    else:
        outcome = _wait_for_commit(cstorage, job, cpath, t1)
        if outcome.pop("aborted", False):
            # rank 0 may have aborted without this rank's report (its own write failed): the
            # files it never heard of are this rank's to remove, and so is the report. Only on
            # its word: after a mere wait past the deadline, a late rank 0 may still commit them
            for r in results:
                with contextlib.suppress(OSError):
                    storage.remove(path, r.name)
            storage.remove(cpath, done_name(save_id, rank))
    if job.get("control"):
        if outcome.get("ok") and not error:
            try:
                install(cstorage, cpath, storage, path, save_id)
            except (OSError, CheckpointError) as e:
                why = f"rank {rank} could not commit on its fast tier: {describe(e)}"
                outcome = {"ok": False, "error": why}
                # this rank will not drain the save: say so, or rank 0's drain would wait for it
                with contextlib.suppress(OSError):
                    _put(cstorage, cpath, abort_name(save_id), {"error": why})
        else:  # this rank's fast files are orphans (rank 0 may not see them: they may be node-local)
            for r in results:
                with contextlib.suppress(OSError):
                    storage.remove(path, r.name)
    timings["commit_s"] = time.perf_counter() - t1
    timings["total_s"] = time.perf_counter() - t0
    if error and outcome.get("ok"):
        outcome = {"ok": False, "error": error}
    written = sum(r.bytes for r in results)
    return {
        **outcome,
        "error": outcome.get("error") or error,
        "own_error": error,
        "bytes": written,
        "timings": timings,
        "rank": rank,
    }


def install(cstorage: Storage, cpath: Path, storage: Storage, path: Path, save_id: str) -> None:
    """The fast tier's commit on this rank's node: the metadata, then the staged manifest as
    ``MANIFEST.json``, copied from the durable directory into the fast one."""
    raw = cstorage.get(cpath, staged_name(save_id), "staged manifest", MAX_MANIFEST_BYTES)
    m = decode_manifest(raw, str(cpath / staged_name(save_id)))
    meta = cstorage.get(cpath, m.metadata.name, "metadata file", m.metadata.bytes)
    if crc32c.crc32c(meta) != m.metadata.crc32c:
        raise CheckpointError(f"{str(cpath / m.metadata.name)!r}: checksum differs from the staged manifest's")
    # atomic replace, not a plain write: the ranks of one node share its fast directory and each
    # installs the same two files, so one must never truncate what another has published
    storage.publish(path, m.metadata.name, meta)
    storage.publish(path, MANIFEST, raw)


def _commit_when_all_done(
    storage: Storage, job: dict[str, Any], path: Path, t_start: float, own: dict[str, Any]
) -> dict[str, Any]:
    """Rank 0: gather the other ranks' done files, then commit or abort. Its own report is
    ``own``, never read back from storage: when the storage failed rank 0's write, it would fail
    that read too, and a one-rank save would wait out its whole timeout instead of failing."""
    save_id, world = job["save_id"], job["world"]
    tiered = bool(job.get("control"))
    deadline = t_start + job["timeout"]
    reports: dict[int, dict] = {0: own}
    error = None
    if own.get("error"):
        # rank 0's own write failed: the save cannot commit, whatever the others report, so it
        # aborts now instead of waiting for reports the failing storage may refuse to carry (a
        # storm refuses them like the data: every rank then waited out the timeout). The other
        # ranks remove their own files when they see the abort, or do not wait (they failed too)
        error = f"failed while writing; nothing was committed. rank 0: {own['error']}"
    while error is None and len(reports) < world:
        for r in range(world):
            if r in reports:
                continue
            with contextlib.suppress(OSError):
                got = _get(storage, path, done_name(save_id, r), f"rank {r}'s done file")
                if isinstance(got, dict):
                    reports[r] = got
        if len(reports) < world:
            peer = read_note(job)  # a rank that could not report through the storage, by the store
            if peer is not None:
                error = f"failed while writing; nothing was committed. {peer}"
                break
            if time.perf_counter() > deadline:
                missing = sorted(set(range(world)) - set(reports))
                error = f"ranks {missing} did not finish writing within {job['timeout']:.0f} s (crashed or stalled)"
                break
            time.sleep(POLL_S)
    stale: list[str] = []
    if error is None:
        c = job["commit"]
        written = [reports[r] for r in range(world)]
        meta = {k: (v[0], v[1], v[2]) for k, v in c["meta"].items()}
        outcome = commit_round(
            written,
            [(name, Region.decode(reg)) for name, reg in c["replica_keys"]],
            lambda: commit(
                storage,
                path,
                save_id,
                job["step"],
                world,
                meta,
                c["values"],
                written,
                job["block_bytes"],
                c["user"],
                staged=tiered,
                replace=job.get("replace", True),
            ),
        )
        error, stale = outcome.error, outcome.stale
    for name in stale:  # past the commit point: best effort, never an abort
        storage.remove(path, name)
    if error is not None:
        with contextlib.suppress(OSError):
            _put(storage, path, abort_name(save_id), {"error": error})
        for r in range(world):  # this save's files are orphans now
            for m in reports.get(r, {}).get("files", []):
                name = m[0][0]
                if isinstance(name, str) and DATA_FILE.match(name) and save_id in name:  # never a path from a file
                    storage.remove(path, name)
    for r in range(world):  # a rank that reports after this removes its own
        storage.remove(path, done_name(save_id, r))
    return {"ok": error is None, "error": error}


def _wait_for_commit(storage: Storage, job: dict[str, Any], path: Path, t_start: float) -> dict[str, Any]:
    save_id = job["save_id"]
    # rank 0 may start its own wait later than this rank (it writes too): wait well past its deadline
    deadline = t_start + 2 * job["timeout"] + 60
    while True:
        # the commit first: once it is there the save is committed, whatever a rank that failed
        # to install it on its fast tier wrote afterwards
        with contextlib.suppress(OSError, CheckpointError):
            name = staged_name(save_id) if job.get("control") else MANIFEST
            raw = storage.get_if_exists(path, name, "manifest", MAX_MANIFEST_BYTES)
            if raw is not None and decode_manifest(raw, str(path / name)).save_id == save_id:
                return {"ok": True, "error": None}
        peer = read_note(job)  # rank 0's abort, by the store: the storage may refuse the abort file
        if peer is not None:
            return {"ok": False, "error": f"rank 0 aborted the save: {peer}", "aborted": True}
        if storage.exists(path, abort_name(save_id)):
            try:
                got = _get(storage, path, abort_name(save_id), "abort file")
                reason = got.get("error") if isinstance(got, dict) else "unknown"
            except OSError:
                reason = "unknown"
            return {"ok": False, "error": f"rank 0 aborted the save: {reason}", "aborted": True}
        if time.perf_counter() > deadline:
            return {"ok": False, "error": f"no commit from rank 0 within {2 * job['timeout'] + 60:.0f} s"}
        time.sleep(POLL_S)
