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
- One Checkpointer per job and root: at start-up rank 0 removes step directories that never
  committed, so do not point a second, concurrent Checkpointer at a live job's root (readers use
  :func:`goodput.ckpt.latest` and :func:`goodput.ckpt.open`, which never delete anything).
"""

from __future__ import annotations

import contextlib
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

import torch
import torch.distributed as dist

from . import collective, rng
from .async_saver import AsyncSave, AsyncSaver, SaveTimings
from .format import LATEST, MANIFEST, STEP_DIR, step_dir_name
from .loader import load
from .reader import Checkpoint, latest, list_checkpoints
from .storage import Storage, storage_for

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
    ):
        from goodput.plan.units import parse_duration

        self.storage: Storage = storage_for(root)
        self.root = Path(root)
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
        self.aborted_uploads = 0  # incomplete object-store uploads of earlier saves aborted by cleanup()
        self._last_save_time = time.monotonic()
        self._last_step: int | None = None
        self._preempt_signal: int | None = None
        self._preempt_step: int | None = None
        self._lock = threading.Lock()
        self.storage.prepare(self.root)
        self._old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in preempt_signals:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        if self.rank == 0:
            self.cleanup(orphans=True)
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
        """Save asynchronously if the cadence says so; on a preemption signal, save and exit."""
        due, preempt = self._due(step), self.preempt_requested
        if self.world > 1:
            flags = torch.tensor([int(due), int(preempt)], dtype=torch.int32, device=collective.device(self.group))
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            due, preempt = bool(flags[0]), bool(flags[1])
        if preempt:
            self.preempt_now(step, state, data=data)
            return None
        if not due or step == self._last_step:
            return None
        return self.save(step, state, data=data)

    def save(self, step: int, state: dict[str, Any], *, data: Any = None) -> AsyncSave | None:
        h = self.saver.save(self._full_state(state, data), step_dir(self.root, step), step=step, user={"step": step})
        if h is not None:
            self._last_save_time = time.monotonic()
            self._last_step = step
        return h

    def preempt_now(self, step: int, state: dict[str, Any], *, data: Any = None) -> None:
        """Finish the in-flight save, save ``step`` now, wait for its commit, then exit (75)."""
        self.saver.wait()
        with contextlib.suppress(Exception):
            self.saver.raise_pending()  # an earlier failure must not stop the preemption save
        need = step != self._last_step or not self.storage.exists(step_dir(self.root, step), MANIFEST)
        if self.world > 1:  # every rank decides alike, or the save's collective would hang
            flag = torch.tensor([int(need)], dtype=torch.int32, device=collective.device(self.group))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            need = bool(flag[0])
        if need:
            self.saver.if_busy = "wait"
            self._preempt_step = step
            h = self.save(step, state, data=data)
            if h is not None:
                h.result()
        self.close()
        if self.exit_on_preempt:
            sys.exit(PREEMPTED_EXIT)

    def _full_state(self, state: dict[str, Any], data: Any) -> dict[str, Any]:
        if "_goodput" in state:
            raise ValueError("the key '_goodput' is reserved for the Checkpointer's per-rank state")
        mine: dict[str, Any] = {}
        if self.save_rng:
            mine["rng"] = rng.capture()
        if data is not None:
            mine["data"] = data
        if not mine:
            return state
        return {**state, "_goodput": {"rank": {self.rank: mine}}}

    # ------------------------------------------------------------------ restoring
    def restore(self, state: dict[str, Any], *, data: Any = None) -> int | None:
        """Load the newest committed checkpoint into ``state`` (in place); its step, or None."""
        if self.world > 1:  # rank 0 alone lists; every rank restores the checkpoint it chose
            path = latest(self.root) if self.rank == 0 else None
            chosen = collective.broadcast_obj(str(path) if path is not None else None, 0, self.group)
            path = Path(chosen) if chosen is not None else None
        else:
            path = latest(self.root)
        if path is None:
            return None
        marker = f".reader-{socket.gethostname()}-{os.getpid()}"
        with contextlib.suppress(OSError):
            self.storage.put(path, marker, b"")
        try:
            ck = Checkpoint(path)
            saved_world = ck.manifest.world_size
            src = self.rank if self.rank < saved_world else self.rank % saved_world
            names = set(ck.keys()) | set(ck.metadata.values)
            mine: dict[str, Any] = {}
            prefix = f"_goodput.rank.{src}.rng."
            saved_rng = {n[len(prefix) :] for n in names if n.startswith(prefix)}
            if self.save_rng and saved_rng:
                mine["rng"] = rng.template(saved_rng)
            if data is not None and any(n.startswith(f"_goodput.rank.{src}.data") for n in names):
                mine["data"] = data
            target = {**state, "_goodput": {"rank": {src: mine}}} if mine else state
            load(target, path, process_group=self.group)
            if "rng" in mine:
                rng.apply(mine["rng"], reseed_with=self.rank if self.rank >= saved_world else None)
            step = ck.step
        finally:
            self.storage.remove(path, marker)
        self._last_step = step
        self._last_save_time = time.monotonic()
        return step

    # ------------------------------------------------------------------ commits, retention
    def _on_commit(self, handle: AsyncSave) -> None:
        tm = handle.timings
        assert tm is not None
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
        )
        if self.rank == 0:
            with contextlib.suppress(OSError):
                self.storage.publish(self.root, LATEST, handle.path.name.encode())
            with contextlib.suppress(OSError):
                self.cleanup(orphans=False, committed_step=handle.step)
        for fn in list(self.listeners):
            with contextlib.suppress(Exception):
                fn(ev)

    def add_listener(self, fn: Callable[[CommitEvent], None]) -> None:
        self.listeners.append(fn)

    def cleanup(self, orphans: bool = True, committed_step: int | None = None) -> list[Path]:
        """Apply retention; remove never-committed step directories (all of them when no save is
        in flight, i.e. at start-up, else only those older than the step just committed)."""
        removed: list[Path] = []
        with self._lock:
            committed = [
                (p, m.step) for p, m in list_checkpoints(self.root) if STEP_DIR.match(p.name) and m.step is not None
            ]
            committed_paths = {p for p, _ in committed}
            try:
                entries = self.storage.list(self.root)
            except OSError:
                entries = []
            for e in entries:
                p = self.root / e.name
                mt = STEP_DIR.match(e.name)
                if not mt or e.kind != "dir" or p in committed_paths:
                    continue
                s = int(mt.group(1))
                if orphans or (committed_step is not None and s < committed_step):
                    self.storage.remove_tree(p)
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
                self.storage.remove_tree(p)
                removed.append(p)
        return removed

    def protect(self, *optimizers: Any) -> list[Any]:
        """With ``staging="lazy"``: make each optimizer's ``step()`` wait for the in-flight copy
        (see :meth:`AsyncSaver.protect`); harmless with eager staging."""
        return self.saver.protect(*optimizers)

    def wait(self) -> None:
        self.saver.wait()

    def close(self) -> None:
        """Wait for the in-flight save, stop the writer, give the signal handlers back."""
        self.saver.close()
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, old)
        self._old_handlers = {}


def _being_read(storage: Storage, path: Path) -> bool:
    now = time.time()
    try:
        entries = storage.list(path)
    except OSError:
        return False
    return any(e.name.startswith(".reader-") and now - e.mtime < READER_TTL_S for e in entries)
