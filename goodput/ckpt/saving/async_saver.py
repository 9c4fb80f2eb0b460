"""Asynchronous save: the training loop waits only for the staging copy.

``async_save(state, path)`` returns an :class:`AsyncSave` with two futures: ``staged`` (the
state is copied out; training may change it now) and ``committed`` (the manifest is durable).
The collective that plans the save runs in the foreground, on the caller's thread, like every
other collective of the training loop; everything after the copy runs in the background and
talks through the file system only (:mod:`goodput.ckpt.saving.background`), so it can never deadlock
against the training loop's own collectives.

Background mode: ``"process"`` (default) is a persistent writer process per rank that maps the
shared staging buffer; ``"thread"`` runs the same code in a thread. Checksumming 4 KiB blocks is
many short calls that hold the interpreter lock, which slows a Python training loop when done in
a thread (``goodput bench async`` measures it), hence the process default.

Staging: ``staging="eager"`` (default) copies the whole state before ``save`` returns, on every
usable core. ``staging="lazy"`` returns after planning and copies behind the training loop, during
the next step's forward and backward, which leave parameters and optimizer state alone (the idea
of DataStates-LLM's lazy copy). Four things keep a lazy checkpoint exactly the state of its
step: until the copy is done, any torch call on the saving thread that may change a tensor's data
or hand its memory out (in place, ``out=``, ``.data``, ``.numpy()``, ``optimizer.step()``) waits
for it first (:class:`goodput.ckpt.saving.staging.CopyFirst`); any other call given a tensor still
being copied goes on watched, and fails the save, naming the tensor, if its version counter moved
across the call; :meth:`AsyncSaver.protect` makes an optimizer's ``step()`` wait too, on any
thread; and each tensor's version counter, read at the request and again after its copy, fails
the save when another thread changed it in place meanwhile (detect and fail). The guard is
popped by the saver's next call or the save's ``result()``. Leaves whose changes cannot be seen that way (numpy
arrays, inference-mode tensors) and small leaves are copied before ``save`` returns. See
docs/ASYNC.md, which also says what no guard sees.

Policy when a save is requested while one is in flight: ``if_busy="wait"`` (default) waits for it
to finish before staging (saves never interleave, and there is only one staging buffer);
``if_busy="skip"`` returns None. A background failure sets the exception on ``committed`` and is
raised again by the next call, with its cause. A failed save never leaves a manifest behind.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import collective
from ..dcp_compat import OVERWRITE_REFUSED, check_planner, checkpoint_exists, location, refuses_overwrite
from ..errors import SaveError, StorageError, StorageSaveError, save_error
from ..format.format import DEFAULT_BLOCK
from ..storage.location import checkpoint_path, display
from .background import abort_job, run_job
from .peers import Peers
from .saver import check_block_bytes, prepare
from .staging import CopyFirst, StagingPool, copier, layout, split_lazy, sweep_dead_segments, unguarded
from .writer_process import WriterProcess

STAGING = ("eager", "lazy")
log = logging.getLogger("goodput.ckpt")


@dataclass
class SaveTimings:
    """Per-phase seconds of one save: what the loop waited for, and what ran behind it."""

    step: int | None
    plan_s: float = 0.0  # collective planning (foreground)
    stage_s: float = 0.0  # copy into the staging buffer (foreground)
    stall_s: float = 0.0  # what the training loop lost: plan + stage (+ lazy: protected steps' wait)
    write_s: float = 0.0  # background: write + fsync of this rank's files
    commit_s: float = 0.0  # background: waiting for all ranks + metadata + manifest
    total_s: float = 0.0  # request to durable commit
    bytes: int = 0  # written by this rank
    staging: str = "eager"
    lazy_s: float = 0.0  # lazy: the copy that ran behind the training loop
    lazy_bytes: int = 0  # lazy: the bytes it copied
    wait_s: float = 0.0  # lazy: what protected optimizer steps (wait_staged) waited for it
    eager_because: str | None = None  # lazy asked for, every leaf copied at the call: why


class _LazyCopy:
    """The in-flight lazy copy of one save: a waiting step lends it its thread."""

    def __init__(self) -> None:
        self.job: Any = None  # the StageJob, once the copy has started
        self.done = threading.Event()  # set when the copy ended, whether it succeeded or not
        self.guard: Any = None  # the CopyFirst mode on the saving thread: the copy settles it


class AsyncSave(Future):
    """One asynchronous save: a :class:`concurrent.futures.Future` that completes when the save is
    committed (as the future DCP's ``async_save`` returns, so ``result()``, ``done()``,
    callbacks and ``concurrent.futures.wait`` work on it), with the save's name, step and
    timings. ``staged`` completes when the state may change again; ``committed`` is the handle
    itself, kept for the code that names it."""

    def __init__(self, path: Path, step: int | None, save_id: str, timings: SaveTimings | None = None) -> None:
        super().__init__()
        self.path = path
        self.step = step
        self.save_id = save_id
        self.timings = timings
        self.staged: Future = Future()
        self._lazy: _LazyCopy | None = None
        self._retire: Callable[[], None] | None = None  # the saver's: pops copy-first modes done with

    @property
    def committed(self) -> Future:
        return self

    def __repr__(self) -> str:
        state = "committed" if self.done() and self.exception() is None else "failed" if self.done() else "running"
        return f"AsyncSave(path={str(self.path)!r}, step={self.step}, save_id={self.save_id!r}, {state})"

    def result(self, timeout: float | None = None) -> SaveTimings:
        """Wait until the save is committed; raises :class:`SaveError` if it failed."""
        try:
            return super().result(timeout)
        finally:
            self._retire_modes()

    def _retire_modes(self) -> None:
        # a loop's last save is often followed by nothing of the saver's but this wait: its
        # copy-first mode must not stay pushed (a Python call per torch call) for the process's life
        if self._retire is not None:
            self._retire()

    @torch.compiler.disable  # the copy is goodput's, never traced into a compiled step (a graph break)
    def wait_staged(self) -> None:
        """Wait until this save's copy is complete, helping with it meanwhile (the waiting thread
        has nothing better to do); the wait counts as stall in :attr:`timings`. Never raises: a
        failed copy fails the save, which ``committed`` and the saver's next call report."""
        lz = self._lazy
        if lz is None or lz.done.is_set():
            return
        t0 = time.perf_counter()
        job = lz.job
        if job is not None:
            job.help()  # records its own errors: they fail the save, not the caller
        lz.done.wait()
        dt = time.perf_counter() - t0
        if self.timings is not None:
            self.timings.wait_s += dt
            self.timings.stall_s += dt


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
        staging: str = "eager",
    ):
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', got {mode!r}")
        if staging not in STAGING:
            raise ValueError(f"staging must be 'eager' or 'lazy', got {staging!r}")
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
        self.staging = staging
        self.pool = StagingPool(shared=mode == "process")
        sweep_dead_segments()
        self.inflight: AsyncSave | None = None
        self.pending_error: BaseException | None = None
        self.history: list[SaveTimings] = []
        self.listeners: list[Callable[[AsyncSave], None]] = []
        self._proc: WriterProcess | None = None
        self._lock = threading.Lock()
        self._hooks: list[Any] = []
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lazy_gate: threading.Event | None = None  # tests: hold the lazy copy back until set
        self._modes: list[CopyFirst] = []  # copy-first modes pushed by lazy saves, until retired
        # how a failed rank tells the others when the storage refuses its report too
        self._peers = Peers(process_group) if self.world > 1 else None
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
        overwrite: bool = True,
        control: str | os.PathLike | None = None,
        if_busy: str | None = None,
    ) -> AsyncSave | None:
        """Stage ``state_dict`` and return at once; the save is written and committed behind the
        training loop. ``overwrite=False`` refuses a path that already holds a checkpoint (DCP's
        ``FileSystemWriter(overwrite=False)``). Returns None when ``if_busy="skip"`` skipped it.

        ``control``: a tiered save's durable directory (:mod:`goodput.ckpt.saving.tiers`): ``path`` is
        then this rank's fast directory, perhaps node-local, and the ranks commit through
        ``control``, which every rank sees; the save resolves once committed on the fast tier.
        ``if_busy``: this call's policy, instead of the saver's (an explicit save waits)."""
        self.retire()
        policy = if_busy or self.if_busy
        if policy not in ("wait", "skip"):
            raise ValueError(f"if_busy must be 'wait' or 'skip', got {policy!r}")
        if policy == "wait":
            self.wait()
            self.retire()
        busy = self.inflight is not None and not self.inflight.done()
        failed = self.pending_error is not None
        if self.world > 1:
            # every rank must make the same choice, or the planning collective below would pair
            # with some other collective of the training loop
            flags = torch.tensor([int(busy), int(failed)], dtype=torch.int32, device=collective.device(self.group))
            collective.all_reduce(flags, dist.ReduceOp.MAX, self.group)
            busy, failed = bool(flags[0]), bool(flags[1])
        if failed:
            self.wait()  # this rank's own in-flight save ends first, so its error is reported once
            if self.pending_error is not None:
                self.raise_pending()
            raise SaveError("the previous asynchronous save failed on another rank (see that rank's error)")
        if busy:
            return None  # if_busy="skip" on some rank: every rank skips
        path = checkpoint_path(path, checkpoint_id)
        t0 = time.perf_counter()
        try:
            prep = prepare(state_dict, path, self.group, self.block_bytes, overwrite=overwrite)
        except SaveError as e:
            if OVERWRITE_REFUSED in str(e):
                raise checkpoint_exists(str(e)) from None
            raise
        t1 = time.perf_counter()
        slots, size = layout(prep.leaves)
        job = self._job(prep, path, step, slots, user)
        job["replace"] = overwrite
        if control is not None:  # made to exist by the background writer, off the training loop
            job["control"] = str(control)
        later: list = []
        try:
            self._ensure_buffer(size)
            now, ready, versions = prep.leaves, None, None
            why = unguarded() if self.staging == "lazy" else None
            if why is not None:
                log.warning("lazy save of %s copies at the call: %s", display(path), why)
            elif self.staging == "lazy":
                now, later, versions = split_lazy(prep.leaves)
                ready = _cuda_ready(later)
            self.pool.stage(now, slots, sync=not later)  # the lazy copy waits for queued CUDA copies
        except BaseException as e:
            msg = f"staging failed: {type(e).__name__}: {e}"
            threading.Thread(target=self._abort, args=(job, msg), daemon=True).start()
            if not isinstance(e, Exception):
                raise  # a Ctrl-C stops the loop as itself, not as a SaveError a retrying loop catches
            raise SaveError(f"asynchronous save to {display(path)!r}: {msg}") from e
        t2 = time.perf_counter()
        timings = SaveTimings(step, plan_s=t1 - t0, stage_s=t2 - t1, stall_s=t2 - t0, staging=self.staging)
        timings.eager_because = why
        timings.lazy_bytes = sum(slots[lf.ident].nbytes for lf in later)
        handle = AsyncSave(path, step, prep.save_id, timings=timings)
        handle._retire = self.retire
        self.inflight = handle
        if later:
            handle._lazy = _LazyCopy()
            mode = handle._lazy.guard = CopyFirst(handle.wait_staged, handle._lazy.done, later)
            mode.push()  # before the copy is handed on: no change on this thread can come first
            self._modes.append(mode)
            target: Callable[..., None] = self._lazy_background
            args: tuple = (handle, job, size, t0, later, slots, versions, ready, self._lazy_gate)
        else:
            handle.staged.set_result(timings.stall_s)
            target, args = self._background, (handle, job, size, t0)
        self._submit(target, args)
        return handle

    def busy(self) -> bool:
        """Whether a save is being written on any rank (a collective when there are several):
        what ``if_busy="skip"`` would skip for, asked before the state is gathered for nothing."""
        busy = self.inflight is not None and not self.inflight.done()
        if self.world > 1:
            flag = torch.tensor([int(busy)], dtype=torch.int32, device=collective.device(self.group))
            collective.all_reduce(flag, dist.ReduceOp.MAX, self.group)
            busy = bool(flag[0])
        return busy

    def _submit(self, fn: Callable[..., None], args: tuple) -> None:
        """Hand work to the saver's background thread. One persistent thread, not one per save:
        starting a thread blocks the caller until the new thread has run, which on a busy
        machine cost the training loop milliseconds per save."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=_serve, args=(self._jobs,), name="goodput-async-save", daemon=True
                )
                self._thread.start()
            self._jobs.put((fn, args))

    def _job(self, prep: Any, path: Path, step: int | None, slots: dict, user: dict[str, Any] | None) -> dict:
        """What the background writer needs: plain data, sent to the writer process as msgpack."""
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
            # by leaf index (a name can name several of this rank's shards of one tensor)
            "leaves": [
                [s.offset, s.nbytes, list(s.shape), s.itemsize] for s in (slots[lf.ident] for lf in prep.leaves)
            ],
            "pieces": [[a.name, a.leaf, a.piece.encode(), a.source.encode()] for a in prep.my_pieces()],
            "replicas": [[i, leaf] for i, leaf in prep.my_replicas] if prep.world > 1 else [],
            "commit": None,
        }
        if self._peers is not None:
            self._peers.prepare(job)
        # the global region/leaf shapes each piece is cut against
        for a in prep.my_pieces():
            job["leaves"][a.leaf][2] = list(prep.meta[a.name][1])
        if prep.rank == 0:
            job["commit"] = {
                "meta": {k: list(v) for k, v in prep.meta.items()},
                "values": prep.values,
                "replica_keys": [[n, r.encode()] for n, r in prep.replica_keys],
                "user": user or {},
            }
        return job

    def protect(self, *optimizers: Any) -> list[Any]:
        """Make each optimizer's ``step()`` wait for the in-flight lazy copy: the step is the one
        place where parameters and optimizer state change, so a protected loop never changes the
        state under its copy. Returns the hook handles (``.remove()`` undoes it; so does
        :meth:`close`). Harmless with eager staging: there is never a copy to wait for."""
        handles = [opt.register_step_pre_hook(self._before_step) for opt in optimizers]
        self._hooks.extend(handles)
        return handles

    @torch.compiler.disable  # a compiled optimizer step must not trace the copy it waits for
    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.wait_staged()

    def wait_staged(self) -> None:
        """:meth:`AsyncSave.wait_staged` of the in-flight save: call it before changing the state
        through an alias taken before the save, or from another thread."""
        h = self.inflight
        if h is not None:
            h.wait_staged()
        self.retire()

    def retire(self) -> None:
        """Pop this thread's copy-first modes whose copy is done (each costs a Python call per
        torch call while pushed). The saver does it at its next call; the Checkpointer at every
        ``maybe_save``; a protected optimizer at its ``step()``."""
        for m in reversed(list(self._modes)):  # newest first: each is popped only from the top
            if m.retire():
                self._modes.remove(m)

    def _ensure_buffer(self, size: int) -> None:
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

    def _abort(self, job: dict[str, Any], error: str) -> None:
        try:
            abort_job(job, error)
        finally:
            if self._peers is not None:
                self._peers.tell(job, False, error)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the in-flight save (if any) to finish, successfully or not."""
        h = self.inflight
        if h is not None:
            with contextlib.suppress(Exception):
                h.committed.result(timeout)

    def raise_pending(self) -> None:
        err, self.pending_error = self.pending_error, None
        if err is not None:
            msg = f"the previous asynchronous save failed: {err}"
            raise (StorageSaveError(msg) if isinstance(err, StorageError) else save_error(msg)) from err

    def close(self) -> None:
        """Wait for the save in flight, stop the writer, free the buffer. A failed save nobody
        was told of (its handle never read, no save after it) is logged: at the end of a run
        (``atexit`` for :func:`async_save`), this is the last word of it."""
        with contextlib.suppress(Exception):
            self.wait(self.timeout + 60)
        h = self.inflight
        if h is not None and not h.done():  # the writer is stopped below: this save's failure comes too late to be said
            log.error(
                "closing with the save of step %s to %s still being written after %.0f s: it is abandoned, "
                "and committed only if its write ends before this process does",
                h.step,
                display(h.path),
                self.timeout + 60,
            )
        err, self.pending_error = self.pending_error, None
        if err is not None:
            log.error("the last asynchronous save failed and nothing after it was saved: %s", err)
        with contextlib.suppress(Exception):
            self.retire()
        for hk in self._hooks:
            hk.remove()
        self._hooks.clear()
        with self._lock:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread = None
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

    def _lazy_background(
        self,
        handle: AsyncSave,
        job: dict[str, Any],
        size: int,
        t_request: float,
        leaves: list,
        slots: dict,
        versions: dict[tuple[str, int], int],
        ready: Any,
        gate: threading.Event | None,
    ) -> None:
        lz, tm = handle._lazy, handle.timings
        assert lz is not None and tm is not None
        t0 = time.perf_counter()
        err: BaseException | None = None
        try:
            if gate is not None:
                gate.wait()
            lz.job = self.pool.job(leaves, slots, versions, ready, lz.guard)
            # one core stays the training loop's: this copy runs while the loop computes
            lz.job.run(helpers=copier().threads - 2)
        except BaseException as e:  # noqa: BLE001 - fails this save, reported by the next call
            err = e
            with contextlib.suppress(Exception):
                self.pool.synchronize()  # nothing may still write into the buffer
        tm.lazy_s = time.perf_counter() - t0
        if err is None:
            handle.staged.set_result(tm.stall_s)
            lz.done.set()
            self._background(handle, job, size, t_request)
            return
        lz.done.set()
        msg = f"lazy staging failed: {type(err).__name__}: {err}"
        error = SaveError(f"asynchronous save to {str(handle.path)!r} (step {handle.step}) failed: {msg}")
        error.__cause__ = err
        handle.staged.set_exception(error)
        try:
            self._abort(job, msg)
        finally:
            self.pending_error = error
            handle.committed.set_exception(error)

    def _background(self, handle: AsyncSave, job: dict[str, Any], size: int, t_request: float) -> None:
        watch = self._peers.watch(job) if self._peers is not None else None
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
        if self._peers is not None:
            own = out.get("own_error") if job["rank"] != 0 else None
            self._peers.tell(job, bool(out.get("ok")), own or out.get("error"))
        if watch is not None:
            watch.end()
        tm = handle.timings
        assert tm is not None
        tm.write_s = out.get("timings", {}).get("write_s", 0.0)
        tm.commit_s = out.get("timings", {}).get("commit_s", 0.0)
        tm.total_s = time.perf_counter() - t_request
        tm.bytes = out.get("bytes", 0)
        self.history.append(tm)
        if out.get("ok"):
            for fn in list(self.listeners):  # before the future resolves: a waiter sees their effects
                try:
                    fn(handle)
                except BaseException:  # noqa: BLE001 - the commit stands (a sys.exit() too); what failed is said
                    log.exception(
                        "after the commit of %s (step %s), a listener failed", display(handle.path), handle.step
                    )
            handle.committed.set_result(tm)
        else:
            err = save_error(
                f"asynchronous save to {str(handle.path)!r} (step {handle.step}) failed: {out.get('error')}"
            )
            self.pending_error = err
            handle.committed.set_exception(err)


def _serve(jobs: queue.SimpleQueue) -> None:
    while (item := jobs.get()) is not None:
        fn, args = item
        try:
            fn(*args)  # each job reports its own failure on its handle's futures
        except BaseException as e:  # noqa: BLE001 - one that raised instead is failed here, and said
            _orphaned(fn, args[0], e)


def _orphaned(fn: Callable[..., None], handle: AsyncSave, e: BaseException) -> None:
    """A save's background job raised where it reports nothing itself (not a storage error: those
    fail the save through its futures): its handle fails with it, the saver holds it as its
    pending error, and a lazy copy's waiters are released, or ``wait()``, a protected step and
    the next save would wait for ever for a thread that went on to the next job."""
    log.error("the background work of the save of step %s to %s raised: %r", handle.step, display(handle.path), e)
    err = SaveError(
        f"asynchronous save to {display(handle.path)!r} (step {handle.step}) failed in the background: "
        f"{type(e).__name__}: {e}"
    )
    err.__cause__ = e
    if handle._lazy is not None:
        handle._lazy.done.set()
    if not handle.staged.done():
        handle.staged.set_exception(err)
    if not handle.done():
        saver = getattr(fn, "__self__", None)
        if isinstance(saver, AsyncSaver):
            saver.pending_error = err
        handle.set_exception(err)


_default: dict[Any, AsyncSaver] = {}


def async_save(
    state_dict: dict[str, Any],
    path: str | os.PathLike | None = None,
    *,
    checkpoint_id: str | os.PathLike | None = None,
    storage_writer: Any = None,
    planner: Any = None,
    process_group: Any = None,
    async_checkpointer_type: Any = None,
    async_stager: Any = None,
    no_dist: bool = False,
    use_collectives: bool = True,
    step: int | None = None,
    user: dict[str, Any] | None = None,
    mode: str | None = None,
    if_busy: str = "wait",
    staging: str | None = None,
) -> AsyncSave | Any | None:
    """Stage ``state_dict`` and write it in the background; see :class:`AsyncSaver`. Returns an
    :class:`AsyncSave`, a ``concurrent.futures.Future`` of the commit. With ``staging="lazy"``,
    call the handle's ``wait_staged()`` before the state changes (or keep an
    :class:`AsyncSaver` and :meth:`~AsyncSaver.protect` the optimizer).

    DCP's call shapes work: ``storage_writer=`` (``overwrite=False`` refuses an existing
    checkpoint), ``planner=`` (the default planner only), ``no_dist=``, ``use_collectives=`` as
    in :func:`save`; ``async_checkpointer_type=`` THREAD or PROCESS picks ``mode``; and
    ``async_stager=`` DCP's ``DefaultStager``: with ``use_async_staging`` (DCP's zero-overhead
    checkpointing) the copy runs behind the loop (``staging="lazy"``) and the answer is DCP's
    ``AsyncSaveResponse``, whose ``staging_completion`` must be awaited before the state changes
    (as in DCP) and whose ``upload_completion`` is the :class:`AsyncSave`. Its other options
    (pinned, shared memory, non-blocking copies) are goodput's own choices here; the stager is
    not used and stays the caller's to close."""
    path = checkpoint_path(location(path, checkpoint_id, storage_writer, "storage_writer"), None)
    check_planner(planner, "async_save")
    respond = False
    if async_stager is not None:
        respond = _async_staging(async_stager)
        if respond and staging == "eager":
            raise ValueError(
                "async_stager with use_async_staging=True stages behind the loop; it contradicts staging='eager'"
            )
        staging = "lazy" if respond else staging
    staging = staging or "eager"
    if async_checkpointer_type is not None:
        kind = str(getattr(async_checkpointer_type, "value", async_checkpointer_type)).lower()
        if kind not in ("thread", "process"):
            raise ValueError(f"async_checkpointer_type must be THREAD or PROCESS, got {async_checkpointer_type!r}")
        if mode is not None and mode != kind:
            raise ValueError(f"async_checkpointer_type={kind!r} contradicts mode={mode!r}")
        mode = kind
    mode = mode or "process"
    group = collective.LOCAL if no_dist else process_group
    if not use_collectives and collective.world(group)[1] > 1:
        raise ValueError(
            "use_collectives=False: a goodput save commits atomically through rank 0, which needs the group; "
            "pass no_dist=True to save from one process alone"
        )
    key = (id(group), mode, if_busy, staging, collective.world(group))
    saver = _default.get(key)
    if saver is None:
        saver = _default[key] = AsyncSaver(process_group=group, mode=mode, if_busy=if_busy, staging=staging)
    handle = saver.save(state_dict, path, step=step, user=user, overwrite=not refuses_overwrite(storage_writer))
    if not respond or handle is None:
        return handle
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    staged: Future = Future()  # DCP's staging_completion holds None
    handle.staged.add_done_callback(
        lambda f: staged.set_exception(f.exception()) if f.exception() is not None else staged.set_result(None)
    )
    return AsyncSaveResponse(staging_completion=staged, upload_completion=handle)


def _async_staging(stager: Any) -> bool:
    """Whether DCP's stager asks for staging behind the loop. Only DCP's own stagers are taken:
    goodput stages into its own buffer, so a stager's code would never run."""
    cls = type(stager)
    if not cls.__module__.startswith("torch.distributed.checkpoint"):
        raise ValueError(
            f"async_stager={cls.__name__}: goodput stages into its own buffer and cannot run a custom stager; "
            "pass DCP's DefaultStager (its use_async_staging picks goodput's lazy staging) or nothing"
        )
    config = getattr(stager, "_config", None)
    return bool(getattr(config, "use_async_staging", False))


def _cuda_ready(leaves: list) -> Any:
    """An event on the requester's current stream: a lazy copy, issued later from another
    thread, must read the tensors as the work queued up to the request leaves them."""
    dev = next((lf.local.device for lf in leaves if lf.local.device.type == "cuda"), None)
    if dev is None:
        return None
    ev = torch.cuda.Event()  # pragma: no cover - GPU machines
    ev.record(torch.cuda.current_stream(dev))  # pragma: no cover
    return ev  # pragma: no cover
