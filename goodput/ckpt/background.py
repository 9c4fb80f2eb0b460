"""The background half of an asynchronous save: write, report, commit — with no collective.

DCP users hit deadlocks when a background thread runs collectives on the training process group
while the training loop runs its own. Here the background talks through the file system only:

1. each rank writes and fsyncs its data files from the staged copy, then drops a *done file*
   (``.goodput-<save_id>-r<rank>.done``: its chunk records, the checksums of the replicas it
   holds, or its error);
2. rank 0 waits for every rank's done file, checks that replicas agree, writes the metadata and
   the manifest (the commit point, :func:`goodput.ckpt.commit.commit`), or on any error or
   timeout writes an *abort file* with the reason and commits nothing;
3. the other ranks wait for the manifest carrying their save id, or the abort file.

numpy only: it runs in a persistent worker process (no torch import) or in a thread.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from pathlib import Path
from typing import Any

import crc32c
import msgspec
import numpy as np

from .commit import _dec_region, commit, file_records, replica_mismatch
from .format import DATA_FILE, MANIFEST, CheckpointError, decode_manifest
from .geometry import Region, runs
from .storage import remove_quietly
from .writer import Piece, write_rank_files

POLL_S = 0.01


def report_failure(path: Path, save_id: str, rank: int, error: str) -> None:
    """Tell rank 0 at once that this rank will not write (it aborts instead of timing out)."""
    with contextlib.suppress(OSError):
        _put(path / done_name(save_id, rank), {"rank": rank, "error": error, "files": [], "crcs": []})


def done_name(save_id: str, rank: int) -> str:
    return f".goodput-{save_id}-r{rank:05d}.done"


def abort_name(save_id: str) -> str:
    return f".goodput-{save_id}.abort"


def _put(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(msgspec.msgpack.encode(obj))
    os.replace(tmp, path)


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
    save_id, rank = job["save_id"], job["rank"]
    timings: dict[str, float] = {}
    results = []
    error = None
    crcs: list[list[int]] = []
    try:
        leaves = job["leaves"]
        for idx, name in job["replicas"]:
            off, nbytes = leaves[name][0], leaves[name][1]
            crcs.append([idx, crc32c.crc32c(memoryview(buf[off : off + nbytes]), 0, 1)])
        pieces = []
        for name, piece_enc, source_enc in job["pieces"]:
            off, _nbytes, shape, item = leaves[name]
            piece, source = _dec_region(piece_enc), _dec_region(source_enc)
            if piece.is_flat and source.is_flat:
                a = off + (piece.flat_start - source.flat_start) * item
                data = buf[a : a + piece.flat_count * item]
            else:
                data = staged_piece(buf, off, source, piece, tuple(shape), item)
            pieces.append(Piece(name, piece, data))
        results = write_rank_files(
            str(path), save_id, rank, pieces, job["block_bytes"], job.get("files_per_rank"), job.get("direct", False)
        )
    except BaseException as e:  # noqa: BLE001 - reported to rank 0 and to the caller
        error = f"{type(e).__name__}: {e}"
    timings["write_s"] = time.perf_counter() - t0
    try:
        _put(
            path / done_name(save_id, rank),
            {"rank": rank, "error": error, "files": file_records(results), "crcs": crcs},
        )
    except OSError as e:
        error = error or f"cannot report to rank 0: {e}"
    t1 = time.perf_counter()
    if rank == 0:
        outcome = _commit_when_all_done(job, path, t1)
    else:
        outcome = _wait_for_commit(job, path, t1)
    timings["commit_s"] = time.perf_counter() - t1
    timings["total_s"] = time.perf_counter() - t0
    if error and outcome.get("ok"):
        outcome = {"ok": False, "error": error}
    written = sum(r.bytes for r in results)
    return {**outcome, "error": outcome.get("error") or error, "bytes": written, "timings": timings, "rank": rank}


def _commit_when_all_done(job: dict[str, Any], path: Path, t_start: float) -> dict[str, Any]:
    save_id, world = job["save_id"], job["world"]
    deadline = t_start + job["timeout"]
    reports: dict[int, dict] = {}
    error = None
    while len(reports) < world:
        for r in range(world):
            if r in reports:
                continue
            f = path / done_name(save_id, r)
            if f.exists():
                with contextlib.suppress(OSError, msgspec.DecodeError):
                    reports[r] = msgspec.msgpack.decode(f.read_bytes())
        if len(reports) < world:
            if time.perf_counter() > deadline:
                missing = sorted(set(range(world)) - set(reports))
                error = f"ranks {missing} did not finish writing within {job['timeout']:.0f} s (crashed or stalled)"
                break
            time.sleep(POLL_S)
    if error is None:
        errs = [f"rank {m['rank']}: {m['error']}" for m in reports.values() if m.get("error")]
        if errs:
            error = "; ".join(errs)
    if error is None:
        c = job["commit"]
        keys = [(name, _dec_region(reg)) for name, reg in c["replica_keys"]]
        error = replica_mismatch(path, keys, [reports[r] for r in range(world)])
    stale: list[Path] = []
    if error is None:
        try:
            meta = {k: (v[0], v[1], v[2]) for k, v in c["meta"].items()}
            written = [reports[r] for r in range(world)]
            stale = commit(path, save_id, job["step"], world, meta, c["values"], written, job["block_bytes"], c["user"])
        except Exception as e:  # noqa: BLE001 - raised before the manifest's rename: nothing committed
            error = f"commit failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    for p in stale:  # past the commit point: best effort, never an abort
        remove_quietly(p)
    if error is not None:
        with contextlib.suppress(OSError):
            _put(path / abort_name(save_id), {"error": error})
        for r in range(world):  # this save's files are orphans now
            for m in reports.get(r, {}).get("files", []):
                name = m[0][0]
                if isinstance(name, str) and DATA_FILE.match(name) and save_id in name:  # never a path from a file
                    remove_quietly(path / name)
    for r in range(world):
        remove_quietly(path / done_name(save_id, r))
    return {"ok": error is None, "error": error}


def _wait_for_commit(job: dict[str, Any], path: Path, t_start: float) -> dict[str, Any]:
    save_id = job["save_id"]
    # rank 0 may start its own wait later than this rank (it writes too): wait well past its deadline
    deadline = t_start + 2 * job["timeout"] + 60
    while True:
        ab = path / abort_name(save_id)
        if ab.exists():
            try:
                reason = msgspec.msgpack.decode(ab.read_bytes()).get("error")
            except (OSError, msgspec.DecodeError):
                reason = "unknown"
            return {"ok": False, "error": f"rank 0 aborted the save: {reason}"}
        mf = path / MANIFEST
        if mf.exists():
            with contextlib.suppress(OSError, CheckpointError):
                if decode_manifest(mf.read_bytes(), str(mf)).save_id == save_id:
                    return {"ok": True, "error": None}
        if time.perf_counter() > deadline:
            return {"ok": False, "error": f"no commit from rank 0 within {2 * job['timeout'] + 60:.0f} s"}
        time.sleep(POLL_S)


def _recv(f: Any) -> Any:
    head = f.read(8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    return msgspec.msgpack.decode(f.read(n))


def _send(f: Any, obj: Any) -> None:
    raw = msgspec.msgpack.encode(obj)
    f.write(len(raw).to_bytes(8, "little") + raw)
    f.flush()


class WriterProcess:
    """A persistent writer process, started with ``python -m goodput.ckpt.background`` (not
    multiprocessing's spawn, which would re-run the user's training script), fed length-prefixed
    msgpack jobs on stdin, answering on stdout."""

    def __init__(self) -> None:
        import subprocess
        import sys

        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "goodput.ckpt.background"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.attached: str | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def attach(self, shm_name: str) -> None:
        """Map the staging segment now, so that its name can be unlinked at once: a killed job
        then leaks no shared memory (the mappings keep it alive, nothing else does)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        _send(self.proc.stdin, ["attach", shm_name])
        out = _recv(self.proc.stdout)
        if not out or not out.get("ok"):
            raise RuntimeError(f"the writer process could not map the staging buffer: {out and out.get('error')}")
        self.attached = shm_name

    def run(self, job: dict[str, Any], shm_name: str, size: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        _send(self.proc.stdin, [job, shm_name, size])
        out = _recv(self.proc.stdout)
        if out is None:
            raise RuntimeError(f"the writer process exited (status {self.proc.poll()})")
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def serve() -> None:
    """The writer process's loop: one job at a time, from the trainer's shared staging buffer."""
    import sys

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    attached: dict[str, Any] = {}
    _lower_priority()

    def attach(name: str) -> Any:
        shm = attached.get(name)
        if shm is None:
            for old in attached.values():  # a grown buffer replaces the old one: one mapping at a time
                with contextlib.suppress(BufferError):
                    old.close()
            attached.clear()
            shm = attached[name] = _attach(name)
        return shm

    while True:
        msg = _recv(inp)
        if msg is None:
            break
        if msg[0] == "attach":
            try:
                attach(msg[1])
                _send(out, {"ok": True})
            except BaseException as e:  # noqa: BLE001
                _send(out, {"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        job, shm_name, size = msg
        try:
            shm = attach(shm_name)
            buf = np.ndarray((size,), np.uint8, buffer=shm.buf)
            res = run_job(job, buf)
            del buf
        except BaseException as e:  # noqa: BLE001
            res = {"ok": False, "error": f"writer process: {type(e).__name__}: {e}", "bytes": 0, "timings": {}}
        _send(out, res)
    for shm in attached.values():
        with contextlib.suppress(BufferError):
            shm.close()


def _lower_priority() -> None:
    """Stay out of the trainer's way: CPU only when it is idle, disk in the idle class."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(19)
    with contextlib.suppress(OSError, FileNotFoundError):
        import subprocess

        subprocess.run(["ionice", "-c", "3", "-p", str(os.getpid())], check=False, capture_output=True, timeout=5)


def _attach(name: str) -> Any:
    """Attach to the trainer's segment without letting this process's resource tracker own it."""
    from multiprocessing import resource_tracker, shared_memory

    shm = shared_memory.SharedMemory(name=name)
    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


if __name__ == "__main__":
    serve()
