"""The two seams between the scheduler core and the world: a clock and an executor.

The simulator and a live service differ only here. An executor starts a gang, delivers a
preemption notice (checkpoint-and-stop, or stop), and kills; what happens then comes back to the
scheduler as inputs: commit reports (``Scheduler.report_commit``) and observed exits
(``Scheduler.report_exit``). Nothing in the core waits on the executor.
"""

from __future__ import annotations

import time
from typing import Protocol

from .model import Job


class Clock(Protocol):
    def now(self) -> float: ...


class Executor(Protocol):
    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        """Launch every process of the gang on ``nodes``, resuming from committed progress."""

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        """Ask the job to leave by ``deadline_s``: committing a checkpoint of its step first if asked."""

    def kill(self, job: Job) -> None:
        """Stop every process of the job now; its exit is still to be observed and reported."""


class WallClock:
    """Seconds since the Unix epoch."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told: the simulator's, and the tests'."""

    __slots__ = ("t",)

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class RecordingExecutor:
    """Remembers what it was asked to do; tests drive exits and commits by hand."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        self.calls.append(("start", job.id, job.epoch, nodes, resume_from_s))

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        self.calls.append(("notify", job.id, job.epoch, checkpoint, deadline_s))

    def kill(self, job: Job) -> None:
        self.calls.append(("kill", job.id, job.epoch))
