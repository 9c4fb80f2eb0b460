"""The scheduler's records: jobs, nodes, pools and tenants.

Plain dataclasses so that the simulator, the store and a live service share one shape. A job keeps
its ORIGINAL submit time for life (a requeue never loses its place), and three counters that are
never mixed: preemptions (the scheduler or a spot provider asked it to leave), infrastructure
losses (a node died under it) and failures (its own non-zero exit, the only one that burns the
retry budget). Its checkpoint facts are what eviction reads to price a victim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum


class JobState(str, Enum):
    """The coarse states a user sees; a finer sub-state lives in ``Job.substate``."""

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTING = "preempting"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})


class PoolKind(str, Enum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Health(str, Enum):
    UP = "up"
    RECLAIMING = "reclaiming"  # a reclaim or drain notice is out: no new placements
    LOST = "lost"  # gone; its GPUs count for nothing


# why a running job is asked to leave (``preempt_requested``'s ``reason``); never a job id
PREEMPT_REASONS = ("priority", "quota", "move", "reclaim", "drain", "node_loss", "cancel", "time_limit")
# what min_run_s and max_preemptions guard against (``move``: checkpointed and restarted elsewhere so
# that a node frees whole for a job that needs all of it)
EVICTION_REASONS = frozenset({"priority", "quota", "move"})
INFRA_REASONS = frozenset({"drain", "node_loss"})  # requeued as an infrastructure loss
# why a job ended ``failed`` (``failed``'s ``reason``)
FAIL_REASONS = ("failure", "time_limit", "infrastructure", "unasked_yields")


class RequeueReason(str, Enum):
    PREEMPTED = "preempted"
    INFRASTRUCTURE = "infrastructure"
    FAILURE = "failure"


@dataclass(slots=True)
class Checkpointing:
    """What eviction needs to know about how a job checkpoints (seconds)."""

    interval_s: float = 0.0  # 0: never checkpoints (everything since the start is at risk)
    write_s: float = 0.0  # snapshot to durable commit (asynchronous: training goes on)
    stall_s: float = 0.0  # what each checkpoint blocks training for
    restart_s: float = 0.0  # resume cost: reschedule, load, warm up
    grace_s: float = 30.0  # notice a preemption gives before the kill

    def fits_grace(self, notice_s: float | None = None) -> bool:
        """Can the job commit a checkpoint of its current step before the kill?"""
        notice = self.grace_s if notice_s is None else notice_s
        return self.interval_s > 0 and self.stall_s + self.write_s <= notice


@dataclass(slots=True)
class RetryPolicy:
    max_failures: int = 3  # own failures allowed before the job is failed for good
    backoff_s: float = 60.0  # first retry delay after a failure; doubles each time
    backoff_max_s: float = 3600.0

    def delay(self, failures: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * (2 ** max(0, failures - 1)))


@dataclass(slots=True)
class Job:
    id: str
    tenant: str
    priority: int  # higher runs first
    nodes: int  # gang shape: nodes x gpus_per_node, all or nothing
    gpus_per_node: int
    submit_s: float  # the ORIGINAL submit time, kept across every requeue
    duration_s: float = 0.0  # the work at full speed (known to the simulator, not to the policy)
    limit_s: float = 0.0  # declared time limit: what backfill trusts
    spot: bool = False  # may run on spot
    ckpt: Checkpointing = field(default_factory=Checkpointing)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    seq: int = 0  # submission order: the last tie-break of the queue
    state: JobState = JobState.PENDING
    substate: str = "queued"
    eligible_s: float = 0.0  # not before this (failure backoff)
    epoch: int = 0  # run epoch: +1 at every start; commit reports carry it
    committed_s: float = 0.0  # progress of the last COMMITTED checkpoint: where a restart resumes
    committed_at: float = -1.0  # when it committed (-1: never)
    preemptions: int = 0
    infra_losses: int = 0
    failures: int = 0
    first_start_s: float = -1.0
    # the current run (meaningful while running or preempting)
    started_s: float = -1.0
    # the current run's resume point (committed_s at its start): what bounds its commits' progress;
    # -1 in a job stored before the field (committed_s bounds it then, more loosely)
    resume_from_s: float = -1.0
    pool: str = ""
    placement: tuple[str, ...] = ()
    run_limit_s: float = 0.0  # the current run's declared hold: restart + remaining limit, at its start
    deadline_s: float = math.inf  # hard kill time while preempting
    victim_of: str = ""  # the preemptor's id, else the reason word (kept for tools that read it)
    preempt_reason: str = ""  # why the current preemption (one of PREEMPT_REASONS): never read from an id
    preemptor: str = ""  # the job the current preemption makes room for ("" for none)
    evictions: int = 0  # preemptions for priority or quota: what max_preemptions bounds
    leave_crashes: int = 0  # non-zero exits while asked to leave: with infra_losses, the infrastructure budget
    unasked_yields: int = 0  # exits 75 while nobody asked it to leave: what max_unasked_yields bounds
    killed_at: float = -1.0  # when the current run's kill was sent (unkillable_s counts from it)
    fail_reason: str = ""  # why it ended failed (one of FAIL_REASONS)
    ckpt_requested: bool = False  # the notice asked for a checkpoint of the current step
    # a priority preemption refused as too dear is not searched for again before this (pending only)
    preempt_retry_s: float = 0.0
    end_s: float = -1.0
    # where the job will go once its victims are gone (pending only)
    claim: tuple[str, ...] = ()
    claim_pool: str = ""
    # a live executor's fields (the simulator leaves them empty)
    command: tuple[str, ...] = ()
    ckpt_root: str = ""
    name: str = ""  # what the user called it (ids are the service's)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nodes, self.gpus_per_node)

    def backfill_limit(self, max_restart_s: float = math.inf) -> float:
        """Seconds this run may hold its GPUs by its declaration: restart plus remaining work. The
        restart is counted within ``max_restart_s`` (the cluster's cap, which binds a job accepted
        before the operator lowered it: its declared day would otherwise be a day's time limit)."""
        limit = self.limit_s if self.limit_s > 0 else self.duration_s
        return min(self.ckpt.restart_s, max_restart_s) * (self.epoch > 0) + max(0.0, limit - self.committed_s)


@dataclass(slots=True)
class Pool:
    name: str
    kind: PoolKind
    nodes: int
    gpus_per_node: int
    price_per_gpu_hour: float = 0.0
    reclaim_per_node_hour: float = 0.0  # spot only: what the placement rule prices


@dataclass(slots=True)
class Node:
    name: str
    pool: str
    kind: PoolKind
    gpus: int
    health: Health = Health.UP
    alloc: dict[str, int] = field(default_factory=dict)  # job id -> GPUs bound (running or draining)
    draining: int = 0  # GPUs of alloc held by jobs that are leaving
    used: int = 0  # sum of alloc, kept by goodput.sched.core.capacity

    @property
    def free(self) -> int:
        return 0 if self.health is Health.LOST else self.gpus - self.used


@dataclass(slots=True)
class Tenant:
    name: str
    weight: float = 1.0  # fair share: usage is compared as usage / weight
    quota_gpus: int = 0  # 0: no cap on GPUs held at once
    usage_gpus: int = 0  # GPUs held now (running and draining)
    used_gpu_s: float = 0.0  # cumulative, for reports
    decayed_gpu_s: float = 0.0  # GPU-seconds held, decayed with the usage half-life, as of decayed_at
    decayed_at: float = 0.0

    def share(self) -> float:
        return self.usage_gpus / self.weight if self.weight > 0 else math.inf

    def decayed(self, now: float, half_life_s: float) -> float:
        """GPU-seconds held, each decayed by half every ``half_life_s`` (Slurm's multifactor usage),
        the GPUs held since ``decayed_at`` included."""
        dt = now - self.decayed_at
        if dt <= 0:
            return self.decayed_gpu_s
        keep = 0.5 ** (dt / half_life_s)
        return self.decayed_gpu_s * keep + self.usage_gpus * half_life_s / math.log(2.0) * (1.0 - keep)

    def fold(self, now: float, half_life_s: float) -> None:
        """Bring the decayed usage to ``now`` (before the GPUs held change)."""
        if now > self.decayed_at:
            self.decayed_gpu_s = self.decayed(now, half_life_s)
            self.decayed_at = now
