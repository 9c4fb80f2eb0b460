"""Asynchronous save: the training loop waits only for the staging copy.

``async_save(state, path)`` returns an :class:`AsyncSave` with two futures: ``staged`` (the
state is copied out; training may change it now) and ``committed`` (the manifest is durable).
The collective that plans the save runs in the foreground, on the caller's thread, like every
other collective of the training loop; everything after the copy runs in the background and
talks through the file system only (:mod:`goodput.ckpt.background`), so it can never deadlock
against the training loop's own collectives.

Background mode: ``"process"`` (default) is a persistent writer process per rank that maps the
shared staging buffer; ``"thread"`` runs the same code in a thread. Checksumming 4 KiB blocks is
many short calls that hold the interpreter lock, which slows a Python training loop when done in
a thread (``goodput bench async`` measures it), hence the process default.

Policy when a save is requested while one is in flight: ``if_busy="wait"`` (default) waits for it
to finish before staging (saves never interleave, and there is only one staging buffer);
``if_busy="skip"`` returns None. A background failure sets the exception on ``committed`` and is
raised again by the next call, with its cause. A failed save never leaves a manifest behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import collective
from .api import SaveError, _resolve, check_block_bytes, prepare
from .background import WriterProcess, report_failure, run_job
from .commit import _enc_region
from .format import DEFAULT_BLOCK
from .staging import StagingPool, layout, sweep_dead_segments


@dataclass
class SaveTimings:
    """Per-phase seconds of one save: what the loop waited for, and what ran behind it."""

    step: int | None
    plan_s: float = 0.0  # collective planning (foreground)
    stage_s: float = 0.0  # copy into the staging buffer (foreground)
    stall_s: float = 0.0  # plan + stage: what the training loop lost
    write_s: float = 0.0  # background: write + fsync of this rank's files
    commit_s: float = 0.0  # background: waiting for all ranks + metadata + manifest
    total_s: float = 0.0  # request to durable commit
    bytes: int = 0  # written by this rank


@dataclass
class AsyncSave:
    path: Path
    step: int | None
    save_id: str
    staged: Future = field(default_factory=Future)
    committed: Future = field(default_factory=Future)
    timings: SaveTimings | None = None

    def result(self, timeout: float | None = None) -> SaveTimings:
        """Wait until the save is committed; raises :class:`SaveError` if it failed."""
        return self.committed.result(timeout)

    def done(self) -> bool:
        return self.committed.done()


class AsyncSaver:
    def __init__(
        self,
        *,
        process_group: Any = None,
        mode: str = "process",
        if_busy: str = "wait",
        timeout: float = 600.0,
        block_bytes: int = DEFAULT_BLOCK,
        files_per_rank: int | None = None,
        direct: bool = True,
    ):
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        if if_busy not in ("wait", "skip"):
            raise ValueError(f"if_busy must be 'wait' or 'skip', got {if_busy!r}")
        check_block_bytes(block_bytes)
        self.group = process_group
        self.rank, self.world = collective.world(process_group)
        self.mode = mode
        self.if_busy = if_busy
        self.timeout = timeout
        self.block_bytes = block_bytes
        self.files_per_rank = files_per_rank
        self.direct = direct
        self.pool = StagingPool(shared=mode == "process")
        sweep_dead_segments()
        self.inflight: AsyncSave | None = None
        self.pending_error: BaseException | None = None
        self.history: list[SaveTimings] = []
        self.listeners: list[Callable[[AsyncSave], None]] = []
        self._proc: WriterProcess | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    # ------------------------------------------------------------------ public
    def save(
        self,
        state_dict: dict[str, Any],
        path: str | os.PathLike | None = None,
        *,
        checkpoint_id: str | os.PathLike | None = None,
        step: int | None = None,
        user: dict[str, Any] | None = None,
    ) -> AsyncSave | None:
        if self.if_busy == "wait":
            self.wait()
        busy = self.inflight is not None and not self.inflight.done()
        failed = self.pending_error is not None
        if self.world > 1:
            # every rank must make the same choice, or the planning collective below would pair
            # with some other collective of the training loop
            flags = torch.tensor([int(busy), int(failed)], dtype=torch.int32, device=collective._device(self.group))
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            busy, failed = bool(flags[0]), bool(flags[1])
        if failed:
            self.wait()  # this rank's own in-flight save ends first, so its error is reported once
            if self.pending_error is not None:
                self.raise_pending()
            raise SaveError("the previous asynchronous save failed on another rank (see that rank's error)")
        if busy:
            return None  # if_busy="skip" on some rank: every rank skips
        path = _resolve(path, checkpoint_id)
        t0 = time.perf_counter()
        prep = prepare(state_dict, path, self.group, self.block_bytes)
        t1 = time.perf_counter()
        slots, size = layout(prep.leaves)
        try:
            self._stage(prep.leaves, slots, size)
        except BaseException as e:
            report_failure(path, prep.save_id, prep.rank, f"staging failed: {type(e).__name__}: {e}")
            raise SaveError(f"asynchronous save to {str(path)!r}: staging failed: {type(e).__name__}: {e}") from e
        t2 = time.perf_counter()
        timings = SaveTimings(step, plan_s=t1 - t0, stage_s=t2 - t1, stall_s=t2 - t0)
        handle = AsyncSave(path, step, prep.save_id, timings=timings)
        handle.staged.set_result(timings.stall_s)
        job = {
            "path": str(path),
            "save_id": prep.save_id,
            "rank": prep.rank,
            "world": prep.world,
            "step": step,
            "block_bytes": self.block_bytes,
            "files_per_rank": self.files_per_rank,
            "direct": self.direct,
            "timeout": self.timeout,
            "leaves": {n: [s.offset, s.nbytes, list(s.shape), s.itemsize] for n, s in slots.items()},
            "pieces": [[a.name, _enc_region(a.piece), _enc_region(a.source)] for a in prep.my_pieces()],
            "replicas": [[i, name] for i, name in prep.my_replicas] if prep.world > 1 else [],
            "commit": None,
        }
        # the global region/leaf shapes each piece is cut against
        for a in prep.my_pieces():
            job["leaves"][a.name][2] = list(prep.meta[a.name][1])
        if prep.rank == 0:
            job["commit"] = {
                "meta": {k: list(v) for k, v in prep.meta.items()},
                "values": prep.values,
                "replica_keys": [[n, _enc_region(r)] for n, r in prep.replica_keys],
                "user": user or {},
            }
        self.inflight = handle
        threading.Thread(
            target=self._background, args=(handle, job, size), name="goodput-async-save", daemon=True
        ).start()
        return handle

    def _stage(self, leaves: list, slots: dict, size: int) -> None:
        if self.mode == "process":
            w = self._worker()
            if self.pool.array is not None and w.attached != self.pool.name and not self.pool.named:
                self.pool.release()  # a new writer cannot map a segment whose name is gone
            self.pool.ensure(size)
            if w.attached != self.pool.name:
                assert self.pool.name is not None
                w.attach(self.pool.name)
                self.pool.unlink_name()
        else:
            self.pool.ensure(size)
        self.pool.stage(leaves, slots)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the in-flight save (if any) to finish, successfully or not."""
        h = self.inflight
        if h is not None:
            with contextlib.suppress(Exception):
                h.committed.result(timeout)

    def raise_pending(self) -> None:
        err, self.pending_error = self.pending_error, None
        if err is not None:
            raise SaveError(f"the previous asynchronous save failed: {err}") from err

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.wait(self.timeout + 60)
        with self._lock:
            if self._proc is not None:
                self._proc.close()
                self._proc = None
        self.pool.release()

    # ------------------------------------------------------------------ background
    def _worker(self) -> WriterProcess:
        with self._lock:
            if self._proc is None or not self._proc.alive():
                self._proc = WriterProcess()
            return self._proc

    def start(self) -> None:
        """Start the writer process now (it takes a moment), not at the first save."""
        if self.mode == "process":
            self._worker()

    def _background(self, handle: AsyncSave, job: dict[str, Any], size: int) -> None:
        t0 = time.perf_counter()
        try:
            if self.mode == "process":
                assert self.pool.name is not None
                out = self._worker().run(job, self.pool.name, size)
            else:
                assert self.pool.array is not None
                out = run_job(job, self.pool.array)
        except BaseException as e:  # noqa: BLE001 - the writer process died, or the pipe broke
            out = {
                "ok": False,
                "error": f"background writer failed: {type(e).__name__}: {e}",
                "timings": {},
                "bytes": 0,
            }
        tm = handle.timings
        assert tm is not None
        tm.write_s = out.get("timings", {}).get("write_s", 0.0)
        tm.commit_s = out.get("timings", {}).get("commit_s", 0.0)
        tm.total_s = tm.stall_s + (time.perf_counter() - t0)
        tm.bytes = out.get("bytes", 0)
        self.history.append(tm)
        if out.get("ok"):
            for fn in list(self.listeners):  # before the future resolves: a waiter sees their effects
                with contextlib.suppress(Exception):
                    fn(handle)
            handle.committed.set_result(tm)
        else:
            err = SaveError(
                f"asynchronous save to {str(handle.path)!r} (step {handle.step}) failed: {out.get('error')}"
            )
            self.pending_error = err
            handle.committed.set_exception(err)


_default: dict[Any, AsyncSaver] = {}


def async_save(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    process_group: Any = None,
    step: int | None = None,
    user: dict[str, Any] | None = None,
    mode: str = "process",
    if_busy: str = "wait",
) -> AsyncSave | None:
    """Stage ``state_dict`` and write it in the background; see :class:`AsyncSaver`."""
    key = (id(process_group), mode, if_busy, collective.world(process_group))
    saver = _default.get(key)
    if saver is None:
        saver = _default[key] = AsyncSaver(process_group=process_group, mode=mode, if_busy=if_busy)
    return saver.save(state_dict, path, checkpoint_id=checkpoint_id, step=step, user=user)
