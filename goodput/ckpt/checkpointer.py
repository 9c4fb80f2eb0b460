"""The Checkpointer: what a training loop uses.

::

    ck = Checkpointer("ckpt", interval="30min", keep=3)      # or interval=500 (steps), or "auto"
    start = ck.restore(state) or 0                             # any layout, any world size
    for step in range(start, steps):
        train_step()
        ck.maybe_save(step + 1, state)                         # async, on cadence

- Cadence: an int is steps; a duration ("30min") is wall time; ``"auto"`` uses goodput.plan's
  exact optimum from the measured stall and write time and the given MTBF (or GPU count and
  per-GPU MTBF), never shorter than the write.
- Agreement: with a process group, each ``maybe_save`` all-reduces two flags (a save is due; a
  preemption signal arrived) so every rank saves at the same step even when only some ranks got
  the signal or their clocks differ.
- Preemption: on a configured signal (SIGTERM, SIGUSR1 by default) the next ``maybe_save`` waits
  for the in-flight save, saves now, waits for the commit, and exits with :data:`PREEMPTED_EXIT`
  (75, EX_TEMPFAIL: "try again"), which a scheduler reads as a preemption, not a failure.
- Retention: keep the last ``keep`` committed checkpoints and every ``keep_every``-th step; never
  delete the newest committed one or one being read; remove directories of saves that never
  committed; keep a ``latest`` pointer (replaced atomically; listing is the fallback).
- Commit events (step, time, path, bytes, stall, write time) go to registered listeners, on a
  background thread: the scheduler's protocol uses this.
- Data-loader position and RNG state are saved per rank and restored. When the world size
  changes from N to M, new rank r restores old rank r's state if r < N, else old rank r mod N's
  (RNG then re-seeded, see :mod:`goodput.ckpt.rng`): data positions of ranks ≥ M are dropped and
  positions may repeat. A loader that must see every sample exactly once across a resize should
  keep a *global* position (samples consumed by the whole job), which is the same on every rank.
  A loader whose state is keyed by rank (torchtitan's ``{"dp_rank_<r>": ...}``) finds its key
  missing on a rank the checkpoint has no state for: it is handed what the checkpoint holds
  (a warning names the keys), and its own ``load_state_dict`` decides (torchtitan's starts that
  rank's data afresh); the model and optimizer resume all the same.
- Tiers: with ``fast=`` (a local directory: NVMe, /dev/shm; it may differ per node) the
  Checkpointer commits every save there first and drains it to ``root`` (the durable tier: a
  parallel file system or an object store) in the background, at most ``drain_rate`` per rank,
  every ``drain_every`` steps (default: every save). ``fast_keep`` is the fast tier's retention,
  ``keep``/``keep_every`` the durable tier's. ``restore`` takes the newest checkpoint committed on
  any tier, each file from the fastest tier holding it, and says which (``restored_tier``). Commit
  events carry ``tier``: ``"fast"`` survives a restart on the same nodes, ``"durable"`` the loss of
  any node. See :mod:`goodput.ckpt.saving.tiers`.
- One Checkpointer per job and root: at start-up rank 0 removes step directories that never
  committed (no ``MANIFEST.json``). A step directory whose manifest is there but cannot be read
  (damaged, or written by a newer goodput) is never removed, by that or by retention, nor counted
  as one of the ``keep`` kept: it is logged once, and a person decides; ``restore`` refuses to
  resume from an older step while such a directory newer than it is there (the run would save
  over it on reaching its step), and says which. Do not point a second, concurrent Checkpointer at a live job's root (readers use
  :func:`goodput.ckpt.latest` and :func:`goodput.ckpt.open`, which never delete anything).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from . import collective, rng
from .errors import CheckpointError, SaveError, StorageError, describe
from .format.dtypes import dtype
from .format.format import LATEST, MANIFEST, MAX_MANIFEST_BYTES, STEP_DIR, decode_manifest, step_dir_name
from .loading.loader import CHECKPOINTER_KEY, load
from .loading.reader import Checkpoint, DamagedCheckpoint, latest, manifest_or_damage, scan_checkpoints
from .saving.async_saver import AsyncSave, AsyncSaver, SaveTimings
from .saving.background import abort_name
from .saving.commit import staged_name
from .saving.tiers import Drain, Drained, Drainer, TierView, drained_name, durable_state, fast_committed
from .state import _contains_array, flatten, is_stateful
from .storage.base import Storage
from .storage.location import as_location, display, storage_for

log = logging.getLogger("goodput.ckpt")

PREEMPTED_EXIT = 75
READER_TTL_S = 3600.0


@dataclass(frozen=True)
class CommitEvent:
    step: int | None
    time: float  # Unix time of the commit
    path: str
    bytes: int  # written by this rank
    stall_s: float
    write_s: float
    total_s: float
    rank: int
    preempted: bool
    # "fast": on the fast tier only (survives a restart on the same nodes); "durable": on the
    # Checkpointer's root (an untiered Checkpointer's only tier), surviving the loss of any node
    tier: str = "durable"
    # "commit": a checkpoint committed; "skipped": a save the cadence made due was not started,
    # because the previous one was still being written (if_busy="skip"); nothing was written
    kind: str = "commit"
    # "skipped": seconds since the newest commit of this run (None: none yet), and its step
    age_s: float | None = None
    newest_step: int | None = None


def step_dir(root: Path, step: int) -> Path:
    return root / step_dir_name(step)


class Checkpointer:
    def __init__(
        self,
        root: str | os.PathLike,
        interval: int | str = 1000,
        keep: int | None = 3,
        keep_every: int | None = None,
        *,
        process_group: Any = None,
        mode: str = "process",
        if_busy: str = "skip",
        staging: str = "eager",
        mtbf: str | float | None = None,
        gpus: int | None = None,
        gpu_mtbf: str | float | None = None,
        restart: str | float = "10min",
        preempt_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1),
        exit_on_preempt: bool = True,
        save_rng: bool = True,
        timeout: float = 600.0,
        fast: str | os.PathLike | None = None,
        fast_keep: int = 2,
        drain_every: int | None = None,
        drain_rate: str | float | None = None,
        drain_timeout: float = 3600.0,
        data: Any = None,
    ):
        """``data``: the data loader's per-rank state, saved with every save and restored by
        :meth:`restore` when those calls give none: a Stateful (``state_dict()`` /
        ``load_state_dict()``, as torchdata's and torchtitan's loaders) or a dict filled in place."""
        from goodput.plan.units import parse_bandwidth, parse_duration

        self.storage: Storage = storage_for(root)
        self.root = as_location(root)  # s3:// stays a URL in events, handles and messages
        self.group = process_group
        self.rank, self.world = collective.world(process_group)
        self.keep, self.keep_every = keep, keep_every
        self.save_rng = save_rng
        self.exit_on_preempt = exit_on_preempt
        self.interval_steps: int | None = None
        self.interval_s: float | None = None
        self.auto = interval == "auto"
        if isinstance(interval, int) and not isinstance(interval, bool):
            if interval <= 0:
                raise ValueError("interval (steps) must be positive")
            self.interval_steps = interval
        elif self.auto:
            if mtbf is not None:
                self.mtbi_s = parse_duration(mtbf)
            elif gpus and gpu_mtbf is not None:
                self.mtbi_s = parse_duration(gpu_mtbf) / gpus
            else:
                raise ValueError('interval="auto" needs mtbf=, or gpus= and gpu_mtbf=')
        else:
            self.interval_s = parse_duration(interval)
        self.restart_s = parse_duration(restart, allow_zero=True)
        self.saver = AsyncSaver(
            process_group=process_group, mode=mode, if_busy=if_busy, timeout=timeout, staging=staging
        )
        self.saver.listeners.append(self._on_commit)
        self.listeners: list[Callable[[CommitEvent], None]] = []
        self._skip_listeners: list[Callable[[CommitEvent], None]] = []
        self.data = data
        self.skipped: list[CommitEvent] = []  # every due save skipped because a write was in flight
        self._owed = False  # a due save was skipped: the next call saves as soon as the write ends
        self._newest: tuple[int | None, float] | None = None  # (step, wall time) of this run's newest commit
        self._last_handle: AsyncSave | None = None
        self.aborted_uploads = 0  # incomplete object-store uploads of earlier saves aborted by cleanup()
        self._last_save_time = time.monotonic()
        self._last_step: int | None = None
        self._preempt_signal: int | None = None
        self._preempt_step: int | None = None
        self._final_step: int | None = None  # close(step, state)'s: drained whatever drain_every says
        # the newest step committed under the root before this run's first save (listed once), and the
        # highest step this run has saved: a save below either is refused (_check_not_behind)
        self._root_newest: int | None = None
        self._root_listed = False
        self._max_saved: int | None = None
        self._lock = threading.Lock()
        self._damaged_seen: set[str] = set()  # damaged step directories already logged
        self.storage.prepare(self.root)
        self.fast: Path | None = Path(fast) if fast is not None else None
        self.fast_keep = fast_keep
        self.drain_every = drain_every
        self.restored_tier: str | None = None  # which tier the last restore read from
        self.drainer: Drainer | None = None
        if self.fast is not None:
            if fast_keep < 1:
                raise ValueError("fast_keep must be at least 1 (the newest fast checkpoint is always kept)")
            if drain_every is not None and drain_every <= 0:
                raise ValueError("drain_every (steps) must be positive")
            if str(self.fast).startswith("s3:/"):
                raise ValueError(f"the fast tier {display(self.fast)!r} must be a local directory")
            storage_for(self.fast).prepare(self.fast)
            rate = parse_bandwidth(drain_rate) if drain_rate is not None else None
            self.drainer = Drainer(self.rank, self.world, rate, drain_timeout, self._on_drained)
            self._fast_cleanup(startup=True)
        self._old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in preempt_signals:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        if self.rank == 0:
            try:
                self.cleanup(orphans=True)
            except OSError as e:  # retention waits for the next commit; the run need not
                log.warning("start-up cleanup of %r failed: %s", display(self.root), e)
        self.saver.start()

    # ------------------------------------------------------------------ cadence
    @property
    def timings(self) -> list[SaveTimings]:
        """Per-phase timings (plan, stage, stall, write, commit) of every save so far."""
        return list(self.saver.history)

    def current_interval_s(self) -> float | None:
        if not self.auto:
            return self.interval_s
        done = [t for t in self.saver.history if t.write_s > 0]
        if not done:
            return 0.0  # save once to measure
        from goodput.plan.interval import optimal_exact

        last = done[-1]
        return max(optimal_exact(max(last.stall_s, 1e-6), self.mtbi_s), last.write_s + last.commit_s)

    def _due(self, step: int) -> bool:
        if self.interval_steps is not None:
            return step % self.interval_steps == 0
        iv = self.current_interval_s()
        return iv is not None and time.monotonic() - self._last_save_time >= iv

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._preempt_signal = signum

    @property
    def preempt_requested(self) -> bool:
        return self._preempt_signal is not None

    # ------------------------------------------------------------------ saving
    def maybe_save(self, step: int, state: dict[str, Any], *, data: Any = None) -> AsyncSave | None:
        """Save asynchronously if the cadence says so; on a preemption signal, save and exit.

        A due save that finds the previous one still being written waits for it
        (``if_busy="wait"``) or is skipped (``"skip"``, the default): a skip is logged and sent
        to listeners as a :class:`CommitEvent` of kind ``"skipped"`` (with the age of the newest
        commit), and the save is owed: the first call after the write ends saves, due or not.
        So the newest commit is never more than one interval and one write behind."""
        self.saver.retire()
        due, preempt = self._due(step), self.preempt_requested
        if self.world > 1:
            flags = torch.tensor([int(due), int(preempt)], dtype=torch.int32, device=collective.device(self.group))
            collective.all_reduce(flags, dist.ReduceOp.MAX, self.group)
            due, preempt = bool(flags[0]), bool(flags[1])
        if preempt:
            self.preempt_now(step, state, data=data)
            return None
        if not (due or self._owed) or step == self._last_step:
            return None
        h = self._save(step, state, data, None)  # the busy choice is made by all ranks together
        if h is None:
            if due:
                self._report_skip(step)
            self._owed = True
        return h

    def save(self, step: int, state: dict[str, Any], *, data: Any = None) -> AsyncSave:
        """Save ``step`` now, asynchronously: never skipped. A save still being written is waited
        for first; a failed earlier save raises :class:`SaveError` here."""
        h = self._save(step, state, data, "wait")
        assert h is not None
        return h

    def _save(self, step: int, state: dict[str, Any], data: Any, if_busy: str | None) -> AsyncSave | None:
        if (if_busy or self.saver.if_busy) == "skip" and self.saver.busy():
            return None  # skipped before the RNG and the loader's state_dict() are taken for nothing
        self._check_not_behind(step)
        full = self._own_state(step, state, data if data is not None else self.data)
        if self.fast is not None:  # written to the fast tier, committed through the durable one
            h = self.saver.save(
                full,
                step_dir(self.fast, step),
                step=step,
                user={"step": step},
                control=step_dir(self.root, step),
                if_busy=if_busy,
            )
        else:
            h = self.saver.save(full, step_dir(self.root, step), step=step, user={"step": step}, if_busy=if_busy)
        if h is not None:
            self._last_save_time = time.monotonic()
            self._max_saved = step if self._max_saved is None else max(self._max_saved, step)
            self._last_step = step
            self._last_handle = h
            self._owed = False
        return h

    def _report_skip(self, step: int) -> None:
        now = time.time()
        newest = self._newest
        age = now - newest[1] if newest is not None else None
        inflight = self.saver.inflight.step if self.saver.inflight is not None else None
        ev = CommitEvent(
            step, now, str(step_dir(self.root, step)), 0, 0.0, 0.0, 0.0, self.rank, False,
            "fast" if self.fast is not None else "durable", kind="skipped", age_s=age,
            newest_step=newest[0] if newest is not None else None,
        )  # fmt: skip
        self.skipped.append(ev)
        if self.rank == 0:
            log.warning(
                "checkpoint of step %s skipped: the save of step %s is still being written (if_busy='skip'); "
                "newest commit: %s; the next step saves as soon as that write ends",
                step,
                inflight,
                f"step {newest[0]}, {age:.1f} s ago" if newest is not None and age is not None else "none in this run",
            )
        for fn in list(self._skip_listeners):
            _tell(fn, ev)

    def preempt_now(self, step: int, state: dict[str, Any], *, data: Any = None) -> None:
        """Finish the in-flight save, save ``step`` now, wait for its commit, then exit (75)."""
        self.saver.wait()
        try:
            self.saver.raise_pending()
        except SaveError as e:
            # an earlier failure must not stop the preemption save, nor go unsaid: its handle
            # may never be read, and this was the last call that would raise it
            log.error("%s; the preemption saves step %s all the same", e, step)
        newest = self.fast if self.fast is not None else self.root
        need = step != self._last_step or not storage_for(newest).exists(step_dir(newest, step), MANIFEST)
        if self.world > 1:  # every rank decides alike, or the save's collective would hang
            flag = torch.tensor([int(need)], dtype=torch.int32, device=collective.device(self.group))
            collective.all_reduce(flag, dist.ReduceOp.MAX, self.group)
            need = bool(flag[0])
        if need:
            self.saver.if_busy = "wait"
            self._preempt_step = step
            h = self.save(step, state, data=data)
            if h is not None:
                h.result()
        if self.drainer is not None:  # the step a scheduler will resume from drains first, unbounded
            assert self.fast is not None
            if not need and not self._drain_due(step):  # saved before the notice, and not drained
                got = fast_committed(self.fast).get(step)
                (everywhere,) = self._all([got is not None])
                if everywhere and got is not None:
                    d = Drain(step, got[0], step_dir(self.fast, step), step_dir(self.root, step), time.perf_counter())
                    self.drainer.submit(d)
            self.drainer.hurry(step)
        self.close()
        if self.exit_on_preempt:
            sys.exit(PREEMPTED_EXIT)

    def _check_not_behind(self, step: int) -> None:
        """Refuse a save of a step below one already committed under the root (or saved by this
        run): ``restore`` takes the highest step and retention keeps the highest ``keep``, so the
        lower saves would be deleted one by one as they commit (each is the oldest) and a resume
        would go back to the other timeline, both in silence. A run started again from step 0 in
        an old run's directory, or a rollback to an earlier step, meets this at its first save.
        Rank 0 lists the root once; every rank decides on its answer, so all raise together."""
        if not self._root_listed:
            answer: list = [None, None]
            if self.rank == 0:
                try:
                    committed = scan_checkpoints(self.root).committed
                    steps = [m.step for p, m in committed if STEP_DIR.match(p.name) and m.step is not None]
                    answer = [max(steps, default=None), None]
                except Exception as e:  # every rank raises it, none waits for rank 0
                    answer = [None, describe(e)]
            if self.world > 1:
                answer = collective.broadcast_obj(answer, 0, self.group)
            if answer[1] is not None:
                raise StorageError(f"save of step {step}: cannot list {display(self.root)!r}: {answer[1]}")
            self._root_newest, self._root_listed = answer[0], True
        ahead = max((s for s in (self._root_newest, self._max_saved) if s is not None), default=None)
        if ahead is not None and step < ahead:
            raise CheckpointError(
                f"save of step {step} refused: step {ahead} is already committed under {display(self.root)!r} "
                "(or saved by this run). A resume takes the highest step and retention keeps the highest "
                f"`keep`, so step {step} and the saves after it would be deleted as they commit and a resume "
                f"would go back to step {ahead}. Restarting from scratch or rolling back: move the step "
                f"directories above {step} out of {display(self.root)!r}, or save to another directory"
            )

    def _own_state(self, step: int, state: dict[str, Any], data: Any) -> dict[str, Any]:
        """:meth:`_full_state`, agreed by every rank before the save's planning collective: the
        loader's ``state_dict()`` (or the RNG's capture) failing on one rank must fail the save on
        every rank, naming it, not leave the others waiting in that collective for a rank that
        raised (they hung, or died of gloo's "connection closed by peer" when it exited)."""
        if self.world == 1:
            return self._full_state(state, data)
        error: Exception | None = None
        full: dict[str, Any] = state
        try:
            full = self._full_state(state, data)
        except Exception as e:  # every rank hears of it below
            error = e
        (fine,) = self._all([error is None])
        if fine:
            return full
        why = collective.all_gather_bytes(describe(error).encode() if error is not None else b"", self.group)
        errs = "; ".join(f"rank {r}: {w.decode(errors='replace')}" for r, w in enumerate(why) if w)
        msg = f"save of step {step} to {display(step_dir(self.root, step))!r} failed before planning: {errs}"
        raise SaveError(collective.name_ranks(msg, self.group)) from error

    def _full_state(self, state: dict[str, Any], data: Any) -> dict[str, Any]:
        if CHECKPOINTER_KEY in state:
            raise ValueError(f"the key {CHECKPOINTER_KEY!r} is reserved for the Checkpointer's per-rank state")
        mine: dict[str, Any] = {}
        if self.save_rng:
            mine["rng"] = rng.capture()
        if data is not None:
            mine["data"] = _data_state(data)
        if not mine:
            return state
        return {**state, "_goodput": {"rank": {self.rank: mine}}}

    # ------------------------------------------------------------------ restoring
    def restore(self, state: dict[str, Any], *, data: Any = None) -> int | None:
        """Load the newest committed checkpoint into ``state`` (in place); its step, or None.

        A step directory newer than that one whose manifest cannot be read (damaged, or written by
        a newer goodput) is refused with a :class:`CheckpointError` naming it: resuming before it
        would save over it. Move it away to resume from the older step.

        Tiered: the newest checkpoint committed on any tier, each file from the fastest tier that
        holds it; ``restored_tier`` says which ("fast", "durable", or "fast+durable")."""
        data = data if data is not None else self.data
        if self.fast is not None:
            return self._restore_tiered(state, data)
        if self.world > 1:  # rank 0 alone lists; every rank restores the checkpoint it chose
            answer: list = [None, None, False]
            if self.rank == 0:
                try:
                    found = self._latest_not_over_damage()
                    answer = [str(found) if found is not None else None, None, False]
                except Exception as e:  # every rank raises it, none waits for rank 0
                    answer = [None, describe(e), isinstance(e, StorageError)]
                    failure: BaseException | None = e
            chosen, why, listing_failed = collective.broadcast_obj(answer, 0, self.group)
            if why is not None:
                if self.rank == 0:
                    raise failure  # type: ignore[misc]
                if listing_failed:
                    raise StorageError(f"restore from {display(self.root)!r}: rank 0 could not list it: {why}")
                raise CheckpointError(f"restore from {display(self.root)!r} refused on rank 0: {why}")
            path = as_location(chosen) if chosen is not None else None
        else:
            path = self._latest_not_over_damage()
        if path is None:
            return None
        marker = f".reader-{socket.gethostname()}-{os.getpid()}"
        with contextlib.suppress(OSError):
            self.storage.put(path, marker, b"")
        try:
            step = self._load_into(state, data, path, None)
        finally:
            self.storage.remove(path, marker)
        self.restored_tier = "durable"
        return self._restored(step)

    def _latest_not_over_damage(self) -> Path | None:
        """:func:`latest`, unless a step directory newer than it holds a manifest that cannot be
        read: the run would go on from the older step and, reaching that step, save over it
        (a newer goodput's checkpoint, or one a person may repair). That is refused, naming it,
        before any work is done that the refusal would cost later."""
        found = latest(self.root)
        mt = STEP_DIR.match(found.name) if found is not None else None
        after = int(mt.group(1)) if mt else -1
        try:
            entries = self.storage.list(self.root)
        except FileNotFoundError:
            return found
        except StorageError:
            raise
        except OSError as e:
            raise StorageError(f"{display(self.root)!r} cannot be listed: {e.strerror or e}") from None
        damaged = []
        for e in entries:
            q = STEP_DIR.match(e.name)
            if q and e.kind == "dir" and int(q.group(1)) > after:
                got = manifest_or_damage(self.root / e.name, self.storage)
                if isinstance(got, DamagedCheckpoint):
                    damaged.append(got)
        if damaged:
            raise self._over_damage(damaged, display(found) if found is not None else "none")
        return found

    def _over_damage(self, damaged: list[DamagedCheckpoint], found: str) -> CheckpointError:
        """The refusal to resume from ``found`` while ``damaged`` step directories newer than it
        are there: the resumed run, reaching their steps, would save over them."""
        d = damaged[0]
        return CheckpointError(
            f"{display(d.path)!r} is newer than the newest readable checkpoint "
            f"({found}) and its {MANIFEST} cannot be read: {d.reason}"
            + (f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else "")
            + "; a run resumed before it would save over it. Look at it (a damaged checkpoint, or one written "
            f"by a newer goodput), move it out of {display(self.root)!r} or remove it, then restart"
        )

    def _restored(self, step: int | None) -> int | None:
        self._last_step = step
        self._last_save_time = time.monotonic()
        return step

    def _load_into(self, state: dict[str, Any], data: Any, path: Path, storage: Storage | None) -> int | None:
        error: BaseException | None = None
        differs: str | None = None  # why the data loader is not handed its own state_dict()'s keys
        try:
            ck = Checkpoint(path, storage)
            saved_world = ck.manifest.world_size
            src = self.rank if self.rank < saved_world else self.rank % saved_world
            names = set(ck.keys()) | set(ck.metadata.values)
            mine: dict[str, Any] = {}
            prefix = f"_goodput.rank.{src}.rng."
            saved_rng = {n[len(prefix) :] for n in names if n.startswith(prefix)}
            if self.save_rng and saved_rng:
                mine["rng"] = rng.template(saved_rng)
            held = {n for n in names if n.startswith(f"_goodput.rank.{src}.data.")}
            if data is not None and held:
                mine["data"], differs = _data_template(_data_state(data), held, f"_goodput.rank.{src}.data", ck)
            elif data is not None or held:
                # one side only: the loader goes on from where it is, or its saved place is left
                # unread; either way not the resume a user expects, so said
                log.warning(
                    "rank %s: %s; the data loader is not restored and goes on from where it is",
                    self.rank,
                    f"{display(path)!r} holds no data loader state for rank {src} (saved without data=)"
                    if data is not None
                    else f"{display(path)!r} holds the data loader's state, but restore was given no data=",
                )
            target = {**state, "_goodput": {"rank": {src: mine}}} if mine else state
        except Exception as e:  # every rank hears of it below
            error = e
        (opened,) = self._all([error is None])  # every rank goes on to the load's collective, or none
        if error is not None:
            raise error
        if not opened:
            raise CheckpointError(f"{display(path)!r} could not be opened on another rank")
        load(target, path, process_group=self.group, storage=storage)
        if "rng" in mine:
            rng.apply(mine["rng"], reseed_with=self.rank if self.rank >= saved_world else None)
        if "data" in mine:
            if differs is not None:
                log.warning(
                    "rank %s: the data loader state in %r (saved by rank %s of %s) does not have the keys of this "
                    "rank's loader (%s); the loader is handed what the checkpoint holds, and its own "
                    "load_state_dict decides (torchtitan's starts its data afresh when its rank's key is missing)",
                    self.rank,
                    display(path),
                    src,
                    saved_world,
                    differs,
                )
            if is_stateful(data):  # hand it the state loaded
                data.load_state_dict(mine["data"])
            elif mine["data"] is not data:  # a dict, filled in place: it now holds what was saved
                data.clear()
                data.update(mine["data"])
        return ck.step

    def _restore_tiered(self, state: dict[str, Any], data: Any) -> int | None:
        """Candidates newest first; each tried from the fast tier where every rank holds it, else
        file by file from both tiers, else from the durable tier alone. Every attempt ends in an
        agreement, so a failure on any rank (a file on no tier it can see, a checksum, a state
        that does not fit) moves every rank to the next attempt together; when none loads, the
        restore fails rather than starting the run afresh."""
        assert self.fast is not None
        mine = fast_committed(self.fast)
        offers = collective.all_gather_bytes(
            msgspec.msgpack.encode([[s, sid, _created(raw)] for s, (sid, raw) in mine.items()]), self.group
        )
        answer: list = [None, None, None, False]  # plan, the damage the plan stops at, why not, listing failed
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                # every save of every step any tier holds, newest step first, and within a step
                # the newest save first (a step number saved again after a fallback restore)
                saves: dict[tuple[int, str], list] = {}
                damaged: list[DamagedCheckpoint] = []
                for s, (sid, raw, committed) in durable_state(self.root, damaged).items():
                    saves[(s, sid)] = [s, sid, committed, _created(raw)]
                for raw in offers:
                    for s, sid, created in msgspec.msgpack.decode(raw):
                        saves.setdefault((int(s), str(sid)), [int(s), str(sid), False, float(created)])
                plan = [c[:3] for c in sorted(saves.values(), key=lambda c: (c[0], c[3]), reverse=True)]
                answer = [plan, None, None, False]
                if damaged:  # a run resumed before a damaged durable step would save over it
                    bad = max(damaged, key=lambda d: int(STEP_DIR.match(d.path.name).group(1)))  # type: ignore[union-attr]
                    newer = [c for c in plan if c[0] >= int(STEP_DIR.match(bad.path.name).group(1))]  # type: ignore[union-attr]
                    if not newer:
                        raise self._over_damage(damaged, f"step {plan[0][0]}" if plan else "none")
                    stops_at = (
                        f"{display(bad.path)!r} is newer and its {MANIFEST} cannot be read ({bad.reason}): "
                        "a run resumed before it would save over it"
                    )
                    answer = [newer, stops_at, None, False]
            except Exception as e:  # every rank raises it, none waits for rank 0
                failure, answer = e, [None, None, describe(e), isinstance(e, StorageError)]
        answer = collective.broadcast_obj(answer, 0, self.group) if self.world > 1 else answer
        plan, stops_at, why, listing_failed = answer
        if failure is not None:
            raise failure
        if why is not None:
            if listing_failed:
                raise StorageError(f"restore from {display(self.root)!r}: rank 0 could not list it: {why}")
            raise CheckpointError(f"restore from {display(self.root)!r} refused on rank 0: {why}")
        assert plan is not None
        errors: list[str] = []
        for step, save_id, committed in plan:
            fast_dir, durable_dir = step_dir(self.fast, step), step_dir(self.root, step)
            manifest = self._manifest_for(step, save_id, mine, durable_dir)
            here = mine.get(step, ("", b""))[0] == save_id
            ok, whole = self._all([manifest is not None, here])
            attempts = (["tiered"] if ok else []) + (["durable"] if committed else [])
            for how in attempts:
                error: BaseException | None = None
                moved = [0, 0]
                try:
                    if how == "tiered":
                        assert manifest is not None
                        view = TierView(fast_dir, durable_dir, manifest, on_fast=whole)
                        got = self._load_into(state, data, durable_dir, view)
                        moved = [view.bytes_from["fast"], view.bytes_from["durable"]]
                    else:
                        got = self._load_into(state, data, durable_dir, None)
                except Exception as e:  # agreed on below, with every rank
                    error = e
                (fine,) = self._all([error is None])
                if not fine:
                    why = describe(error) if error is not None else "it failed on another rank"
                    where = "each file from the fastest tier holding it" if how == "tiered" else "the durable tier"
                    errors.append(f"step {step} ({where}): {why}")
                    if self.rank == 0:
                        log.warning("restore of step %s (%s) failed, trying the next: %s", step, where, why)
                    continue
                if how == "tiered":
                    moved = self._sum(moved)
                    tier = "fast" if moved[1] == 0 else "durable" if moved[0] == 0 else "fast+durable"
                else:
                    tier = "durable"
                self.restored_tier = tier
                if self.rank == 0:
                    log.info("restored step %s from the %s tier", step, tier)
                self._after_tiered_restore(step, save_id, committed, whole, manifest, fast_dir, durable_dir)
                return self._restored(got)
        if errors:
            raise CheckpointError(
                f"no checkpoint under {display(self.root)!r} or {display(self.fast)!r} could be restored: "
                + "; ".join(errors[:4])
                + (f"; and {len(errors) - 4} more" if len(errors) > 4 else "")
                + (f"; no older step is tried: {stops_at}" if stops_at else "")
            )
        return None

    def _after_tiered_restore(
        self, step: int, save_id: str, committed: bool, whole: bool, manifest: bytes | None, fast_dir: Path,
        durable_dir: Path,
    ) -> None:  # fmt: skip
        """The run goes on from ``step``: newer fast saves are abandoned (their step numbers will
        be saved afresh), and a fast commit whose drain a crash cut short drains again when this
        world wrote it (each rank drains the files it wrote)."""
        assert self.fast is not None and self.drainer is not None
        fs = storage_for(self.fast)
        for s in fast_committed(self.fast):
            if s > step:
                _retire(fs, step_dir(self.fast, s))
        assert manifest is not None or committed
        same_world = manifest is not None and decode_manifest(manifest, "manifest").world_size == self.world
        if committed or not whole or not same_world or not self._drain_due(step):
            return
        if self.rank == 0:  # what an earlier attempt left must not fail this one at once
            for name in [abort_name(save_id), *(drained_name(save_id, r) for r in range(self.world))]:
                self.storage.remove(durable_dir, name)
        self._all([True])  # the markers are gone before any rank writes its own
        self.drainer.submit(Drain(step, save_id, fast_dir, durable_dir, time.perf_counter()))

    def _manifest_for(self, step: int, save_id: str, mine: dict, durable_dir: Path) -> bytes | None:
        """The chosen save's manifest bytes: this rank's fast copy, else the durable tier's."""
        if step in mine and mine[step][0] == save_id:
            return mine[step][1]
        for name in (MANIFEST, staged_name(save_id)):
            with contextlib.suppress(OSError, CheckpointError):
                raw = self.storage.get_if_exists(durable_dir, name, "manifest", MAX_MANIFEST_BYTES)
                if raw is not None and decode_manifest(raw, str(durable_dir / name)).save_id == save_id:
                    return raw
        return None

    def _all(self, flags: list[bool]) -> list[bool]:
        if self.world == 1:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=collective.device(self.group))
        collective.all_reduce(t, dist.ReduceOp.MIN, self.group)
        return [bool(x) for x in t.tolist()]

    def _sum(self, values: list[int]) -> list[int]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.int64, device=collective.device(self.group))
        collective.all_reduce(t, dist.ReduceOp.SUM, self.group)
        return [int(x) for x in t.tolist()]

    # ------------------------------------------------------------------ commits, retention
    def _on_commit(self, handle: AsyncSave) -> None:
        tm = handle.timings
        assert tm is not None
        self._newest = (handle.step, time.time())
        ev = CommitEvent(
            handle.step,
            time.time(),
            str(handle.path),
            tm.bytes,
            tm.stall_s,
            tm.write_s,
            tm.total_s,
            self.rank,
            handle.step is not None and handle.step == self._preempt_step,
            "fast" if self.fast is not None else "durable",
        )
        if self.fast is not None:
            assert self.drainer is not None and handle.step is not None
            # a preemption's step and the final step of close(step, state) always drain
            if self._drain_due(handle.step) or ev.preempted or handle.step == self._final_step:
                self.drainer.submit(
                    Drain(
                        handle.step,
                        handle.save_id,
                        Path(handle.path),
                        step_dir(self.root, handle.step),
                        time.perf_counter() - tm.total_s,
                        tm.stall_s,
                        ev.preempted,
                    )
                )
            with _said("the fast tier's retention after step %s", handle.step):
                self._fast_cleanup(committed_step=handle.step)
        elif self.rank == 0:
            with _said("the latest pointer of step %s", handle.step):
                self.storage.publish(self.root, LATEST, handle.path.name.encode())
            with _said("retention after step %s", handle.step):
                self.cleanup(orphans=False, committed_step=handle.step)
        self._emit(ev)

    def _emit(self, ev: CommitEvent) -> None:
        for fn in list(self.listeners):
            _tell(fn, ev)

    def _drain_due(self, step: int) -> bool:
        return self.drain_every is None or step % self.drain_every == 0

    def _on_drained(self, out: Drained) -> None:
        """The drain thread's report: a durable commit (an event, then durable retention), or why not."""
        d = out.drain
        if not out.ok:
            log.warning("step %s stays on the fast tier only: %s", d.step, out.error)
            return
        newest = self._newest
        if newest is None or newest[0] is None or d.step > newest[0]:
            # a drain commits a step the fast tier committed before: never a newer one than it
            self._newest = (d.step, out.time)
        if self.rank == 0:
            with _said("the latest pointer of step %s", d.step):
                self.storage.publish(self.root, LATEST, d.durable_dir.name.encode())
            with _said("retention after step %s", d.step):
                self.cleanup(orphans=False, committed_step=d.step)
        self._emit(
            CommitEvent(
                d.step,
                out.time,
                str(d.durable_dir),
                out.bytes,
                d.stall_s,
                out.drain_s,
                out.total_s,
                self.rank,
                d.preempted,
                "durable",
            )  # fmt: skip
        )
        with _said("the fast tier's retention after the drain of step %s", d.step):
            self._fast_cleanup()

    def _fast_cleanup(self, startup: bool = False, committed_step: int | None = None) -> list[Path]:
        """This rank's fast tier: keep the newest ``fast_keep`` checkpoints and every one not yet
        drained; remove saves that never committed there (older than the newest committed one, or
        all of them at start-up, when no save is in flight). Ranks sharing a node's directory
        decide alike.

        At start-up every committed one is kept: the drains a crash cut short are not pending in
        this process, and the newest fast commits may be damaged, so the older ones are what a
        restore falls back to; the first commit after it applies ``fast_keep`` again."""
        assert self.fast is not None and self.drainer is not None
        fs = storage_for(self.fast)
        with self._lock:
            committed = fast_committed(self.fast)
            steps = sorted(committed)
            keep = set(steps if startup else steps[-self.fast_keep :]) | self.drainer.pending()
            if committed_step is not None:  # the save that just committed, whatever its number
                keep.add(committed_step)
            removed = []
            try:
                entries = fs.list(self.fast)
            except OSError:
                return []
            for e in entries:
                mt = STEP_DIR.match(e.name)
                if not mt or e.kind != "dir":
                    continue
                s = int(mt.group(1))
                if s in keep:
                    continue
                if s not in committed and self._unreadable_manifest(fs, self.fast / e.name):
                    continue
                if (s in committed or startup or (steps and s < steps[-1])) and _retire(fs, self.fast / e.name):
                    removed.append(self.fast / e.name)
            return removed

    def _unreadable_manifest(self, fs: Storage, d: Path) -> bool:
        """A fast step directory that was not committed when listed but has a ``MANIFEST.json``:
        committed since (kept), or damaged or of a newer goodput, or it cannot be looked at
        (kept and logged, as on the durable tier)."""
        try:
            got = manifest_or_damage(d, fs)
        except (OSError, CheckpointError) as e:
            got = DamagedCheckpoint(d, f"it cannot be looked at: {e}")
        if isinstance(got, DamagedCheckpoint):
            self._report_damaged(got)
        return got is not None

    def add_listener(self, fn: Callable[[CommitEvent], None], *, skipped: bool = False) -> None:
        """Call ``fn`` with every commit's :class:`CommitEvent` (on a background thread); with
        ``skipped=True`` also with every skipped due save's (kind ``"skipped"``, on the thread
        that called :meth:`maybe_save`). Skips are opt-in: a listener written for commits (the
        scheduler's reporter) must not take a skip for a commit."""
        self.listeners.append(fn)
        if skipped:
            self._skip_listeners.append(fn)

    def cleanup(self, orphans: bool = True, committed_step: int | None = None) -> list[Path]:
        """Apply retention; remove never-committed step directories (all of them when no save is
        in flight, i.e. at start-up, else only those older than the step just committed).

        "Never committed" is a directory without a ``MANIFEST.json``. One whose manifest is there
        but cannot be read is kept, whatever its step, and logged: a flipped byte or a newer
        goodput's format must not turn a commit into garbage to delete."""
        removed: list[Path] = []
        with self._lock:
            listing = scan_checkpoints(self.root)
            committed = [(p, m.step) for p, m in listing.committed if STEP_DIR.match(p.name) and m.step is not None]
            spared = {p for p, _ in listing.committed} | {d.path for d in listing.damaged}
            for d in listing.damaged:
                self._report_damaged(d)
            try:
                entries = self.storage.list(self.root)
            except OSError:
                entries = []
            newest = max((s for _, s in committed), default=None)
            for e in entries:
                p = self.root / e.name
                mt = STEP_DIR.match(e.name)
                if not mt or e.kind != "dir" or p in spared:
                    continue
                s = int(mt.group(1))
                # tiered: a step newer than the newest durable one may be committed on the fast
                # tier and not yet drained; its directory holds what a restore on new nodes needs
                whole = orphans and (self.fast is None or (newest is not None and s < newest))
                if (whole or (committed_step is not None and s < committed_step)) and _retire(self.storage, p):
                    removed.append(p)
            if orphans:  # no save is in flight: every incomplete upload under the root is an orphan
                with contextlib.suppress(Exception):
                    self.aborted_uploads += self.storage.abort_uploads(self.root)
            if not committed:
                return removed
            steps = sorted(s for _, s in committed)
            keep = {steps[-1]} | ({committed_step} if committed_step is not None else set())
            if self.keep:
                keep.update(steps[-self.keep :])
            if self.keep_every:
                keep.update(s for s in steps if s % self.keep_every == 0)
            if self.keep is None and not self.keep_every:
                keep.update(steps)
            for p, s in committed:
                if s in keep or _being_read(self.storage, p):
                    continue
                if _retire(self.storage, p):
                    removed.append(p)
        return removed

    def _report_damaged(self, d: DamagedCheckpoint) -> None:
        """Once per directory and Checkpointer: retention runs at every commit."""
        key = f"{d.path}\0{d.reason}"
        if key in self._damaged_seen:
            return
        self._damaged_seen.add(key)
        log.warning(
            "keeping %r: its %s cannot be read (%s); a damaged checkpoint, or one written by a newer goodput, "
            "is never deleted nor restored: look at it, then remove it by hand",
            display(d.path),
            MANIFEST,
            d.reason,
        )

    def protect(self, *optimizers: Any) -> list[Any]:
        """With ``staging="lazy"``: make each optimizer's ``step()`` wait for the in-flight copy
        (see :meth:`AsyncSaver.protect`); harmless with eager staging."""
        return self.saver.protect(*optimizers)

    def wait(self) -> None:
        """Wait for the in-flight save's commit (on the fast tier, when tiered)."""
        self.saver.wait()

    def wait_drained(self, timeout: float | None = None) -> bool:
        """Wait until every fast checkpoint due for the durable tier is committed there (or has
        failed to be); False on a timeout. True at once when untiered."""
        self.saver.wait()
        return self.drainer.wait(timeout) if self.drainer is not None else True

    def close(self, step: int | None = None, state: dict[str, Any] | None = None, *, data: Any = None) -> None:
        """Save the final ``step`` of ``state`` (when given) and wait for its commit; wait for the
        in-flight save and its drain, stop the writer, give the signal handlers back.

        ``close(step, state)`` is how a run keeps its last step: it raises :class:`SaveError`
        when that save failed. An earlier save's failure does not cost the run its final step:
        the step is saved all the same, then the earlier failure is raised (saying that the final
        step was committed). Tiered, the final step is drained
        to the durable tier whatever ``drain_every`` says (the fast tier may go with the job's
        nodes), and a failure of that drain raises too. A plain ``close()`` never saves; a
        failure of the save in flight is logged, not lost."""
        if step is None:
            self._close()
            return
        if state is None:
            raise TypeError("close(step, state): the final save needs the state")
        earlier: SaveError | None = None
        try:
            h = self._last_handle
            if step != self._last_step or h is None:
                self.saver.wait()
                try:
                    self.saver.raise_pending()  # every rank takes its own: the save below goes on everywhere
                except SaveError as e:
                    earlier = e
                self._final_step = step
                h = self.save(step, state, data=data)
            h.result()
            if self.drainer is not None and not self.drainer.has(h.save_id):
                self.drainer.submit(  # saved before close, when its drain was not due
                    Drain(step, h.save_id, Path(h.path), step_dir(self.root, step), time.perf_counter())
                )
        except BaseException:
            if earlier is not None:  # raised only below, when the final step has been committed
                log.error("an earlier save was lost too: %s", earlier)
            self._close()
            raise
        self._close()
        out = self._drained(h.save_id) if self.drainer is not None else None
        if out is not None and not out.ok:
            raise SaveError(
                f"the final step {step} is committed on the fast tier only ({display(out.drain.fast_dir)!r}): "
                f"its drain to {display(out.drain.durable_dir)!r} failed: {out.error}"
            ) from earlier
        if earlier is not None:
            raise SaveError(
                f"the final step {step} was committed, but an earlier save was lost: {earlier}"
            ) from earlier

    def _drained(self, save_id: str) -> Drained | None:
        """This rank's outcome of the drain of one save, once it has ended."""
        assert self.drainer is not None
        return next((o for o in reversed(self.drainer.history) if o.drain.save_id == save_id), None)

    def _close(self) -> None:
        self.saver.wait()
        err, self.saver.pending_error = self.saver.pending_error, None  # said here, not again by the saver
        if err is not None:
            log.error("the last asynchronous save failed and nothing after it was saved: %s", err)
        if self._owed and self.skipped:  # the run ended before a skipped due save was made up
            # the newest *commit*: the save the skip found in flight (the last one started) may have failed
            newest = self._newest
            log.warning(
                "the due checkpoint of step %s was skipped and the run ended before it was made up: "
                "the newest checkpoint is %s; close(step, state) saves the final step",
                self.skipped[-1].step,
                f"step {newest[0]}" if newest is not None else "none committed by this run",
            )
        self.saver.close()
        if self.drainer is not None:
            self.drainer.close()
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, old)
        self._old_handlers = {}


@contextlib.contextmanager
def _said(what: str, *args: Any) -> Any:
    """Bookkeeping after a commit (the latest pointer, retention): its failure does not undo the
    commit, so it is not raised, and is logged, never dropped: retention that stops in silence
    fills the disk, and the run learns it only when a save fails for space."""
    try:
        yield
    except OSError as e:
        log.warning("%s failed: %s", what % args, describe(e))


def _retire(storage: Storage, directory: Path) -> bool:
    """Delete a checkpoint directory, its manifest first: a crash (or a failure) part-way then
    leaves a directory that is no longer committed, which start-up cleanup removes, never a
    committed one with data files missing. False (logged) when it could not be removed."""
    try:
        storage.remove(directory, MANIFEST)
        storage.remove_tree(directory)
    except OSError as e:
        log.warning("could not remove %r: %s (it stays; retention tries again after the next commit)",
                    display(directory), describe(e))  # fmt: skip
        return False
    return True


def _tell(fn: Callable[[CommitEvent], None], ev: CommitEvent) -> None:
    """Call one listener: its failure (a reporter that cannot reach its scheduler) stops neither
    the other listeners nor the run, and is logged, never dropped."""
    try:
        fn(ev)
    except Exception as e:  # noqa: BLE001 - logged: a listener is the user's code
        log.warning(
            "checkpoint listener %s failed on the %s event of step %s: %s",
            getattr(fn, "__qualname__", repr(fn)),
            ev.kind,
            ev.step,
            describe(e),
        )


def _data_state(data: Any) -> Any:
    """What is saved of the data loader: a Stateful's ``state_dict()``, or the dict itself."""
    if is_stateful(data):
        try:
            sd = data.state_dict()
        except Exception as e:  # its own exception, as raised, named (see state.expand_stateful)
            e.add_note(f"goodput: raised by the state_dict() of the Checkpointer's data ({type(data).__name__})")
            raise
        if not isinstance(sd, dict):
            raise TypeError(f"data: state_dict() returned a {type(sd).__name__}, not a dict")
        return sd
    return data


_GONE = object()  # a leaf (or a container of leaves) the checkpoint does not hold


def _data_template(
    live: dict[str, Any], held: set[str], prefix: str, ck: Checkpoint
) -> tuple[dict[str, Any], str | None]:
    """What to load the data loader's state into, and, when that is not ``live`` (the loader's
    own ``state_dict()``), why. A loader's state may be keyed by rank (torchtitan's
    ``{"dp_rank_<r>": ...}``): after a resize a rank's loader asks for keys the checkpoint does
    not hold, and a load into ``live`` would fail the whole resume over the data position. The
    loader gets what the checkpoint holds instead (``live``'s leaves that it holds, as they are,
    and what it holds beside them), so that its ``load_state_dict`` sees its key missing and
    applies its own policy."""
    tensors, values = flatten({prefix: live})
    names = {t.name for t in tensors} | {v.name for v in values}
    if names == held:
        return live, None

    def kept(v: Any, name: str) -> Any:
        if isinstance(v, dict):
            out = {k: x for k, x in ((k, kept(x, f"{name}.{k}")) for k, x in v.items()) if x is not _GONE}
            return _GONE if v and not out else out
        if isinstance(v, (list, tuple)) and _contains_array(v):  # whole, or not at all (indices stay)
            items = [kept(x, f"{name}.{i}") for i, x in enumerate(v)]
            if any(x is _GONE for x in items):
                return _GONE
            return type(v)._make(items) if hasattr(type(v), "_make") else type(v)(items)
        return v if name in held else _GONE

    target = kept(live, prefix)
    if target is _GONE:
        target = {}
    lacking = sorted(n[len(prefix) + 1 :] for n in names - held)
    extra = sorted(n[len(prefix) + 1 :] for n in held - names)
    saved = {t.name: t for t in ck.metadata.tensors}
    for rest in extra:
        node, key = target, rest
        while True:  # down the dicts whose keys (an int, or one with a dot) the name goes through
            sub = max(
                (k for k in node if isinstance(node[k], dict) and key.startswith(f"{k}.")),
                key=lambda k: len(str(k)),
                default=None,
            )
            if sub is not None:
                node, key = node[sub], key[len(str(sub)) + 1 :]
                continue
            head, dot, tail = key.partition(".")
            if not dot or head in node:
                break
            node[head] = {}
            node, key = node[head], tail
        node[key] = _placeholder(saved.get(f"{prefix}.{rest}"))
    why = "; ".join(
        [f"the checkpoint lacks {_few(lacking)}"] * bool(lacking) + [f"it holds {_few(extra)} instead"] * bool(extra)
    )
    return target, why


def _placeholder(t: Any) -> Any:
    """A target for a saved leaf the loader did not ask for: a value's is replaced by the value
    (None is one); a tensor's is filled, so it has the saved shape, dtype and kind."""
    if t is None:
        return None
    if t.kind == "bytes":
        return io.BytesIO()
    if t.kind == "numpy" and dtype(t.dtype).numpy is not None:
        return np.empty(tuple(t.shape), dtype(t.dtype).numpy)
    return torch.empty(tuple(t.shape), dtype=getattr(torch, t.dtype))


def _few(names: list[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _created(manifest: bytes) -> float:
    try:
        return decode_manifest(manifest, "manifest").created
    except CheckpointError:
        return 0.0


def _being_read(storage: Storage, path: Path) -> bool:
    now = time.time()
    try:
        entries = storage.list(path)
    except OSError:
        return False
    return any(e.name.startswith(".reader-") and now - e.mtime < READER_TTL_S for e in entries)
