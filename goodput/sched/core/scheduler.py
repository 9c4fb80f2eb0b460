"""The scheduler core: inputs in, decisions out, the same code under a simulated or a wall clock.

Inputs are events (submit, commit report, observed exit, node loss, reclaim notice, node up,
cancel) and timers (a preemption's hard deadline, a failure's backoff). Each input updates the
records, marks the queue for a pass when it could change some job's fate, and persists what it
changed in one store transaction. ``tick`` runs the pass: it walks the queue by exact priority,
fair share between tenants at one priority (the tenant holding the fewest GPUs per unit of weight
goes first), then the original submit time, and never scans it: one heap per (priority, tenant,
class) and a class is skipped for the rest of the pass once one of its jobs fails to fit.

The first job that fails to fit is the head. It may preempt lower-priority gangs (eviction picks
the cheapest set by expected lost work; the freed nodes are claimed for it and handed over only
when the victims are observed gone), and otherwise gets a reservation: the earliest time the
running jobs' declared limits free enough nodes for it, and which nodes. Backfill then starts a
later job only where it cannot delay that start: on nodes outside the reservation, or anywhere if
its own declared limit ends before the reserved time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Any

from . import events as ev
from .capacity import Capacity
from .executor import Clock, Executor
from .governance import Governance
from .ids import check_id
from .model import INFRA_REASONS, TERMINAL, Health, Job, JobState, Pool
from .policy import Policy
from .preemption import Preemption
from .queue import Class
from .state import Reservation, SchedulerError

# what a commit's progress may run ahead of the scheduler's clock since the run's start: the job's clock and
# the service's tick at different instants and rates (a live run starts after its decision, so honest
# reports lag it)
COMMIT_SLACK_S = 1.0

__all__ = ["Reservation", "Scheduler", "SchedulerError"]


class Scheduler(Preemption):
    # ------------------------------------------------------------------ persistence

    @classmethod
    def restore(
        cls,
        store: Any,
        pools: Iterable[Pool],
        *,
        clock: Clock,
        executor: Executor,
        policy: Policy | None = None,
        log: ev.EventLog | None = None,
        governance: Governance | None = None,
    ) -> Scheduler:
        """A scheduler rebuilt from its store after a crash: every index derived from the records."""
        snap = store.load()
        pools = list(pools)
        order = {n.name: i for i, n in enumerate(Capacity.build_nodes(pools))}
        nodes = sorted(snap.nodes.values(), key=lambda n: (order.get(n.name, math.inf), n.name))
        if log is None:
            log = ev.EventLog()
            log.records.extend(snap.events)
        s = cls(
            pools,
            clock=clock,
            executor=executor,
            policy=policy,
            nodes=nodes or None,
            tenants=snap.tenants.values(),
            store=store,
            log=log,
            governance=governance,
        )
        s._load_meta(snap.meta)
        s._priorities = {j.priority for j in snap.jobs.values()}
        s.cap.set_thresholds(sorted(s._priorities)[1:])
        for job in sorted(snap.jobs.values(), key=lambda j: j.seq):
            s.jobs[job.id] = job
            s.terminal += job.state in TERMINAL
            s._classes[job.id] = s._class_of(job)
            if job.state is JobState.PENDING:
                if job.claim:
                    s.cap.claim(job.id, job.claim)
                    s._claimants[job.id] = None
                elif job.substate == "backoff":
                    s._timer(job.eligible_s, "eligible", job)
                else:
                    s._enqueue(job)
                if job.preempt_retry_s > clock.now():
                    s._timer(job.preempt_retry_s, "retry", job)
            elif job.state in (JobState.RUNNING, JobState.PREEMPTING):
                s._index_run(job)
                if job.state is JobState.PREEMPTING and job.placement:
                    s._leaving[job.tenant] = s._leaving.get(job.tenant, 0) + job.gpus
                if job.state is JobState.PREEMPTING and math.isfinite(job.deadline_s):
                    s._timer(job.deadline_s, "deadline", job)
                if job.state is JobState.RUNNING and job.limit_s > 0:
                    s._timer(job.started_s + job.run_limit_s + s.gov.limits.over_time_limit_s, "limit", job)
                if job.state is JobState.PREEMPTING and job.substate == "killed" and job.killed_at >= 0:
                    s._timer(job.killed_at + s.gov.limits.unkillable_s, "unkillable", job)
        s._dirty = bool(snap.meta.get("dirty", True))  # as persisted: re-queuing the jobs above marked it
        return s

    # ------------------------------------------------------------------ inputs

    def submit(self, job: Job) -> Job:
        """Queue a new job; a spec that cannot be valid is refused naming the job and the field."""
        for what, v in (("id", job.id), ("tenant", job.tenant)):
            try:
                check_id(v)
            except ValueError as e:
                raise SchedulerError(f"job {job.id!r}: {what}: {e}") from None
        if job.id in self.jobs:
            raise SchedulerError(f"job {job.id!r} already exists")
        for name in ("nodes", "gpus_per_node"):
            if not isinstance(getattr(job, name), int) or getattr(job, name) < 1:
                raise SchedulerError(f"job {job.id!r}: {name} must be an integer >= 1, got {getattr(job, name)!r}")
        if job.state is not JobState.PENDING or job.epoch != 0:
            raise SchedulerError(f"job {job.id!r}: a submitted job must be new (pending, epoch 0)")
        self.gov.check(job)  # SubmissionRejected naming the field: outside the operator's limits
        cls = self._class_of(job)
        if not cls[2]:
            raise SchedulerError(
                f"job {job.id!r}: no pool offers {job.nodes} nodes x {job.gpus_per_node} GPUs"
                + (" on on-demand (spot not allowed)" if not job.spot else "")
            )
        job.seq = self._seq
        self._seq += 1
        self._note_priority(job.priority)
        job.eligible_s = max(job.eligible_s, job.submit_s)
        self.jobs[job.id] = job
        self._classes[job.id] = cls
        self._tenant(job.tenant)
        self._touch(job)
        self._emit(
            ev.SUBMITTED,
            job=job.id,
            tenant=job.tenant,
            priority=job.priority,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            submit_s=job.submit_s,
            limit_s=job.limit_s,
        )
        if job.eligible_s > self.clock.now():
            job.substate = "backoff"
            self._timer(job.eligible_s, "eligible", job)
        else:
            self._enqueue(job)
        self._flush()
        return job

    def commit_rejection(self, job_id: str, epoch: int, progress_s: float) -> str:
        """Why a commit report would be rejected now ('' if it would be taken); changes nothing."""
        job = self.jobs.get(job_id)
        if job is None:
            return "unknown job"
        if job.state not in (JobState.RUNNING, JobState.PREEMPTING):
            return f"job is {job.state.value}"
        if epoch != job.epoch:
            return f"stale epoch {epoch} (current {job.epoch})"
        if not math.isfinite(progress_s) or progress_s < job.committed_s:
            return f"progress {progress_s} is behind the committed {job.committed_s}"
        # progress is seconds of work since the resume point: a run cannot have done more than it has
        # run (a tenant's number; an inflated one would also shrink its backfill_limit)
        resume = job.resume_from_s if job.resume_from_s >= 0 else job.committed_s
        ran = max(0.0, self.clock.now() - job.started_s)
        if progress_s > resume + ran + COMMIT_SLACK_S:
            return f"progress {progress_s} is beyond the run's resume point {resume} plus the {ran:g} s it has run"
        return ""

    def report_commit(self, job_id: str, epoch: int, progress_s: float, timing: dict[str, float] | None = None) -> bool:
        """A job's checkpoint committed: its resume point advances, if the report is current.
        ``timing`` (``trained_s``, ``stall_s``, ``write_s``, from the job's report) goes into the
        record as it is, so a ledger read from the log can tell restart and checkpoint stall apart."""
        job = self.jobs.get(job_id)
        reason = self.commit_rejection(job_id, epoch, progress_s)
        if reason:
            self._emit(ev.COMMIT_REJECTED, job=job_id, epoch=epoch, progress_s=progress_s, reason=reason)
            self._flush()
            return False
        assert job is not None  # commit_rejection refuses unknown jobs
        job.committed_s = progress_s
        job.committed_at = self.clock.now()
        if job.id in self._order:
            self._order_add(job)  # what it would lose restarts from this commit
        self._touch(job)
        if timing:
            self._emit(ev.CHECKPOINT_COMMITTED, job=job_id, epoch=epoch, progress_s=progress_s, **timing)
        else:
            self._emit(ev.CHECKPOINT_COMMITTED, job=job_id, epoch=epoch, progress_s=progress_s)
        self._flush()
        return True

    def report_exit(self, job_id: str, epoch: int, status: str) -> None:
        """The job's processes are observed gone with ``status``: finished, preempted, failed, killed,
        or lost (vanished with no status and no kill asked: an infrastructure loss, not a failure)."""
        job = self.jobs.get(job_id)
        if job is None or epoch != job.epoch or job.state not in (JobState.RUNNING, JobState.PREEMPTING):
            return  # an exit of a run already accounted for: nothing is bound to it any more
        if status not in ("finished", "preempted", "failed", "killed", "lost"):
            raise SchedulerError(f"job {job_id!r}: unknown exit status {status!r}")
        now = self.clock.now()
        self._emit(ev.EXITED, job=job_id, epoch=epoch, status=status)
        was = job.state
        self._unindex_candidate(job)
        self._release(job)
        job.end_s = now
        if status == "finished":
            self._move(job, "finish")
            self._emit(ev.FINISHED, job=job_id)
        elif was is JobState.PREEMPTING:
            self._gone(job, crashed=status == "failed")
        elif status == "preempted":
            # exit 75 unasked: checkpointed and yielding (a node-level notice may have reached it
            # first); on a budget of its own, so that a job yielding at every start ends
            job.preemptions += 1
            job.unasked_yields += 1
            if job.unasked_yields > self.gov.limits.max_unasked_yields:
                self._fail(job, "yield_final", "unasked_yields")
            else:
                self._move(job, "left", "queued")
                self._requeue(job, "preempted")
        elif status == "lost":
            job.infra_losses += 1
            self._infra_requeue(job, "lost")
        else:
            job.failures += 1
            if job.failures > job.retry.max_failures:
                self._fail(job, "fail_final", "failure")
            else:
                self._move(job, "fail_retry", "backoff")
                job.eligible_s = now + job.retry.delay(job.failures)
                self._requeue(job, "failure")
        self._touch(job)
        self._flush()

    def _gone(self, job: Job, *, crashed: bool) -> None:
        """A job asked to leave is gone (its GPUs released already): where it goes depends only on
        why it was asked (``preempt_reason``), never on who asked."""
        reason = job.preempt_reason
        if reason == "cancel":
            self._move(job, "gone_cancelled")
            self._emit(ev.CANCELLED, job=job.id)
        elif reason == "time_limit":
            self._fail(job, "timeout", "time_limit")
        elif reason in INFRA_REASONS:
            job.infra_losses += 1
            self._infra_requeue(job, "gone")
        else:
            job.preemptions += 1
            if crashed:  # a crash while leaving: requeued behind a backoff, on the infrastructure budget
                job.leave_crashes += 1
                self._infra_requeue(job, "gone", requeue_reason="preempted")
            else:
                self._move(job, "gone", "queued")
                self._requeue(job, "preempted")

    def _infra_requeue(self, job: Job, trigger: str, requeue_reason: str = "infrastructure") -> None:
        """Requeue after an infrastructure loss (or a crash while leaving) behind a backoff, or fail
        the job once its own budget, ``max_infra_losses``, is spent."""
        lim = self.gov.limits
        n = job.infra_losses + job.leave_crashes
        if n > lim.max_infra_losses:
            self._fail(job, "infra_final", "infrastructure")
            return
        self._move(job, trigger, "backoff")
        job.eligible_s = self.clock.now() + lim.infra_delay(n)
        self._requeue(job, requeue_reason)

    def _fail(self, job: Job, trigger: str, reason: str) -> None:
        self._move(job, trigger)
        job.fail_reason = reason
        job.deadline_s = math.inf
        job.placement = ()
        self._emit(ev.FAILED, job=job.id, failures=job.failures, reason=reason)

    def _requeue(self, job: Job, reason: str) -> None:
        job.deadline_s = math.inf
        job.victim_of = ""
        job.preempt_reason = ""
        job.preemptor = ""
        job.killed_at = -1.0
        job.ckpt_requested = False
        job.placement = ()
        # when it may start again (its backoff's end, or now): an auditor checks the start against it
        eligible = max(job.eligible_s, self.clock.now())
        self._emit(ev.REQUEUED, job=job.id, reason=reason, resume_from_s=job.committed_s, eligible_s=eligible)
        if job.eligible_s > self.clock.now():
            job.substate = "backoff"
            self._timer(job.eligible_s, "eligible", job)
        else:
            job.substate = "queued"
            self._enqueue(job)

    def node_lost(self, names: Iterable[str]) -> None:
        """Nodes died: their jobs are killed (and requeued as infrastructure losses once gone)."""
        for name in names:
            node = self._node(name)
            if node.health is Health.LOST:
                continue
            self.cap.set_health(name, Health.LOST)
            self._health_gen += 1
            self._touched_nodes.add(name)
            self._emit(ev.NODE_LOST, node=name)
            self._drop_claims_on(name)
            for jid in sorted(node.alloc, key=self._seq_of):
                job = self.jobs[jid]
                if job.state is JobState.RUNNING:
                    self._preempt(job, "node_loss", "", self.clock.now(), checkpoint=False, candidates=None)
                if job.state is JobState.PREEMPTING and job.substate != "killed":
                    if job.preempt_reason not in ("cancel", "time_limit"):
                        job.preempt_reason = "node_loss"
                        job.victim_of = "node_loss"
                    self._kill(job)
        self._dirty = True
        self._flush()

    def reclaim_notice(self, names: Iterable[str], deadline_s: float, *, why: str = "reclaim") -> None:
        """Nodes will go at ``deadline_s``: a spot reclaim (``why="reclaim"``) or a drain (``"drain"``;
        ``"node_loss"``, a node announced to die, is a drain too)."""
        if why not in ("reclaim", "drain", "node_loss"):
            raise SchedulerError(f"unknown reason {why!r} for a reclaim notice (reclaim, drain)")
        reason = "reclaim" if why == "reclaim" else "drain"
        now = self.clock.now()
        for name in names:
            node = self._node(name)
            if node.health is not Health.UP:
                continue
            self.cap.set_health(name, Health.RECLAIMING)
            self._health_gen += 1
            self._touched_nodes.add(name)
            self._emit(ev.NODE_RECLAIM_NOTICE, node=name, deadline_s=deadline_s)
            self._drop_claims_on(name)
            for jid in sorted(node.alloc, key=self._seq_of):
                job = self.jobs[jid]
                if job.state is JobState.RUNNING:
                    ask = self.policy.ask_checkpoint and job.ckpt.fits_grace(deadline_s - now)
                    self._preempt(job, reason, "", deadline_s, checkpoint=ask, candidates=None)
                elif job.state is JobState.PREEMPTING and deadline_s < job.deadline_s:
                    job.deadline_s = deadline_s
                    self._set_end(job, deadline_s)
                    self._timer(deadline_s, "deadline", job)
                    self._touch(job)
        self._dirty = True  # a node no longer offered may break the reservation that held others off
        self._flush()

    def node_up(self, names: Iterable[str]) -> None:
        for name in names:
            node = self._node(name)
            if node.health is Health.UP:
                continue
            self.cap.set_health(name, Health.UP)
            self._health_gen += 1
            self._freed[node.pool] += 1  # a node back: at most one more node can fit
            self._touched_nodes.add(name)
            self._emit(ev.NODE_UP, node=name)
        self._dirty = True
        self._flush()

    def resize(self, job_id: str, nodes: int, gpus_per_node: int | None = None) -> Job:
        """Give a pending job another gang shape for its next run (it resumes from its committed
        checkpoint, which reshards): a claim it held is dropped and it keeps its place in the order."""
        job = self.jobs.get(job_id)
        if job is None:
            raise SchedulerError(f"no job {job_id!r}")
        if job.state is not JobState.PENDING:
            raise SchedulerError(f"job {job_id!r} is {job.state.value}: only a pending job can be resized")
        gpn = job.gpus_per_node if gpus_per_node is None else gpus_per_node
        for name, v in (("nodes", nodes), ("gpus_per_node", gpn)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SchedulerError(f"job {job_id!r}: {name} must be an integer >= 1, got {v!r}")
        old = (job.nodes, job.gpus_per_node)
        job.nodes, job.gpus_per_node = nodes, gpn
        cls = self._class_of(job)
        if not cls[2]:
            job.nodes, job.gpus_per_node = old
            raise SchedulerError(f"job {job_id!r}: no pool offers {nodes} nodes x {gpn} GPUs")
        if job.claim:
            self._drop_claim(job, requeue=False)
        queued = self.queue.remove(job.id)
        self._classes[job.id] = cls
        self._reservation_cache = None  # it may have been computed for this job's old shape
        if queued or job.substate == "queued":
            self._enqueue(job)
        self._touch(job)
        self._emit(ev.RESIZED, job=job.id, nodes=nodes, gpus_per_node=gpn)
        self._dirty = True
        self._flush()
        return job

    def cancel(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            raise SchedulerError(f"no job {job_id!r}")
        if job.state in TERMINAL:
            return
        if job.state is JobState.PENDING:
            self.queue.remove(job.id)
            if job.claim:
                self._drop_claim(job, requeue=False)
            self._move(job, "cancel")
            job.end_s = self.clock.now()
            self._emit(ev.CANCELLED, job=job.id)
            self._dirty = True  # its claim or the reservation it was the head of may have held others off
        elif job.state is JobState.RUNNING:
            self._preempt(job, "cancel", "", self.clock.now() + self._grace(job), checkpoint=False, candidates=None)
        else:
            job.victim_of = "cancel"
            job.preempt_reason = "cancel"
        self._dirty = True  # a leaving or vanished job can change a reservation, a claim or a victim search
        self._touch(job)
        self._flush()

    def advance(self) -> None:
        """Fire the timers that are due: hard deadlines kill, backoffs end."""
        now = self.clock.now()
        while self._timers and self._timers[0][0] <= now:
            t, kind, _, jid, epoch = heapq.heappop(self._timers)
            job = self.jobs.get(jid)
            if job is None or job.epoch != epoch:
                continue
            if kind == "deadline" and job.state is JobState.PREEMPTING and job.substate != "killed":
                if job.deadline_s <= now:
                    self._kill(job)
            elif kind == "limit" and job.state is JobState.RUNNING:
                self._time_limit(job, now)
            elif kind == "mature" and job.state is JobState.RUNNING:
                self._mature(job)
            elif kind == "retry" and job.state is JobState.PENDING and job.preempt_retry_s == t:
                self._dirty = True  # its refused preemption may be searched for again
            elif (
                kind == "unkillable"
                and job.state is JobState.PREEMPTING
                and job.substate == "killed"
                and job.killed_at + self.gov.limits.unkillable_s <= now
            ):
                self._unkillable(job)
            elif (
                kind == "eligible"
                and job.state is JobState.PENDING
                and job.substate == "backoff"
                and job.eligible_s <= now
            ):
                job.substate = "queued"
                self._touch(job)
                self._enqueue(job)
        self._flush()

    def next_timer(self) -> float:
        while self._timers:
            t, kind, _, jid, epoch = self._timers[0]
            job = self.jobs.get(jid)
            live = (
                job is not None
                and job.epoch == epoch
                and (
                    (kind == "deadline" and job.state is JobState.PREEMPTING and job.substate != "killed")
                    or (kind == "eligible" and job.state is JobState.PENDING and job.substate == "backoff")
                    or (kind in ("limit", "mature") and job.state is JobState.RUNNING)
                    or (kind == "unkillable" and job.state is JobState.PREEMPTING and job.substate == "killed")
                    or (kind == "retry" and job.state is JobState.PENDING and job.preempt_retry_s == t)
                )
            )
            if live:
                return t
            heapq.heappop(self._timers)
        return math.inf

    # ------------------------------------------------------------------ the pass

    def tick(self) -> int:
        """One scheduling pass, if anything happened that could change a pending job's fate."""
        if not self._dirty:
            return 0
        self._dirty = False
        self.passes += 1
        now = self.clock.now()
        started = 0
        for jid in sorted(self._claimants, key=lambda j: (-self.jobs[j].priority, self.jobs[j].seq)):
            started += self._try_claim(self.jobs[jid])
        self._pass_scans = 0
        self._pass_failed = {}
        self._pass_below = {}
        self._outside = {}
        blocked: set[Class] = set()
        quota_blocked: set[tuple[str, Class]] = set()
        held_off: set[tuple[int, str, Class]] = set()  # keys whose jobs are all too long for the reservation
        long_failed: dict[tuple[int, Class], int] = {}  # (priority, class) -> self._mutations when it failed
        # (priority, class) whose every tenant's key is too long for the reservation: as held_off,
        # for the rest of the pass (nothing in a pass frees GPUs for a job that failed to place)
        held_off_classes: set[tuple[int, Class]] = set()
        reservation: Reservation | None = None
        self._pass_res = None
        head = self._held_head()
        halted = False
        pools = list(self.cap.pools)
        # a tenant under its quota may take borrowed GPUs back, at any priority
        reclaimable = self.policy.preemption and self._reclaimable()
        for prio in self.queue.priorities():
            if halted:
                break
            if (
                not any(self.cap.free_gpus(p) for p in pools)
                and not (self.policy.preemption and any(g for p in pools for q, g in self._held[p].items() if q < prio))
                and not reclaimable
            ):
                # nothing is free and nothing below can be evicted: no job here or below can start.
                # The first job of this level still is the head (unless the held head is, replanned
                # below): its reservation binds the next passes as if a node had been free now, or a
                # tenant served first once one is could take the nodes it waits for
                if reservation is None and (head is None or prio > head.priority):
                    first = self._first_at(prio, now)
                    if first is not None:
                        reservation = self._reserve(first[0], first[1], now)
                        self._set_pass_reservation(reservation)
                break
            if head is not None and reservation is None and prio <= head.priority:
                # the held head goes first at its level: no job of its priority, whatever its tenant
                # or its name, is looked at before the reservation is in force again
                hcls = self._classes[head.id]
                if self._try_place(head, hcls, None, now):
                    started += 1
                elif self.policy.preemption and (
                    self._preempt_for(head, hcls, now, None) or self._move_for(head, hcls, now)
                ):
                    started += head.state is JobState.RUNNING
                else:
                    reservation = self._reserve(head, hcls, now)
                    self._set_pass_reservation(reservation)
                    blocked.add(hcls)
                    if not self.policy.backfill:
                        halted = True
                        break
                # it no longer waits (started or claimed) and set no reservation: a head it
                # displaced holds its place again, at that head's level (never itself again)
                nxt = self._held_head() if reservation is None else None
                head = nxt if nxt is not head else None
            level = self.queue.tenants(prio)

            open_heads: dict[str, list[tuple[tuple[float, int, str], Class]]] = {}
            shares = self._shares(level, now)
            heap = [(shares[t], self._tenant_first(t, prio), t) for t in level]
            heapq.heapify(heap)
            while heap and not halted:
                share, _, tn = heapq.heappop(heap)  # shares hold still within a pass (usage is history)
                # the tenant's open classes, by their heads' queue order: built once per level
                heads = open_heads.get(tn)
                if heads is None:
                    heads = []
                    shut: list[tuple[tuple[float, int, str], Class]] = []  # blocked: a reclaim may still go
                    for cls in level.get(tn, ()):
                        h = self.queue.head((prio, tn, cls))
                        if h is None:
                            continue
                        if cls in blocked or (prio, cls) in held_off_classes:
                            if reclaimable:  # shut for backfill, not for a tenant's guarantee
                                shut.append((h, cls))
                            continue
                        heads.append((h, cls))
                    for _, cls in sorted(shut):  # queue order, never the set's
                        started += self._reclaim_blocked(prio, tn, cls, now, reservation, quota_blocked)
                    heapq.heapify(heads)
                    open_heads[tn] = heads
                best = None
                while heads:
                    h, cls = heads[0]
                    if (
                        cls in blocked
                        or (tn, cls) in quota_blocked
                        or (prio, tn, cls) in held_off
                        or (prio, cls) in held_off_classes
                    ):
                        if reclaimable and (cls in blocked or (prio, cls) in held_off_classes):
                            started += self._reclaim_blocked(prio, tn, cls, now, reservation, quota_blocked)
                        heapq.heappop(heads)
                        continue
                    cur = self.queue.head((prio, tn, cls))
                    if cur is None:
                        heapq.heappop(heads)
                    elif cur != h:
                        heapq.heapreplace(heads, (cur, cls))
                    else:
                        best = (h, cls)
                        break
                if best is None:
                    continue
                (_, _, jid), cls = best
                job = self.jobs[jid]
                # placing and evicting already failed for the class at this priority in this pass
                again = (
                    reservation is not None
                    and long_failed.get((prio, cls)) == self._mutations
                    and now + self._hold(job) > reservation.t
                )
                if not again and self._try_place(job, cls, reservation, now):
                    started += 1
                elif reservation is None:
                    if self.policy.preemption and (
                        self._preempt_for(job, cls, now, None) or self._move_for(job, cls, now)
                    ):
                        started += job.state is JobState.RUNNING
                    else:
                        reservation = self._reserve(job, cls, now)
                        self._set_pass_reservation(reservation)
                        blocked.add(cls)
                        if not self.policy.backfill:
                            halted = True
                else:
                    if not again and self.policy.preemption and self._preempt_for(job, cls, now, reservation):
                        started += job.state is JobState.RUNNING
                        reservation = self._earlier_after_claim(reservation, now)
                    elif reservation.pool not in cls[2] or now + self._hold(job) <= reservation.t:
                        blocked.add(cls)  # nothing was held off the reservation for it: it fits nowhere
                    else:
                        # every job of the class at this priority that runs past the reserved start
                        # fails as this one did, until the next start, claim or release
                        long_failed[(prio, cls)] = self._mutations
                        got = self._backfill_short(prio, tn, cls, reservation, now)
                        if got > 0:
                            started += got  # the class stays open: its next shortest job may fit too
                        elif got < 0:
                            blocked.add(cls)  # even a short one found no room: the class fits nowhere
                        else:
                            held_off.add((prio, tn, cls))  # too long here; other keys' short jobs may fit
                            shortest = self.queue.class_shortest(prio, cls)
                            if shortest is None or now + shortest > reservation.t:
                                held_off_classes.add((prio, cls))  # no tenant's is short enough
                if heads:  # the tenant's next job in queue order decides its place among equal shares
                    (h_submit, h_seq, _), _ = heads[0]
                    heapq.heappush(heap, (share, (h_submit, h_seq), tn))
        if reservation is None and head is not None and self._held_head() is head:
            # the pass never reached the head's level: its reservation still holds, replanned (a
            # higher-priority start may have taken its nodes)
            reservation = self._reserve(head, self._classes[head.id], now)
        self._note_reservation(reservation)
        self._flush()
        return started

    def _earlier_after_claim(self, reservation: Reservation, now: float) -> Reservation:
        """A claim made after the head's reservation may bring the head's start earlier: the
        claimed nodes come back at the claimant's declared end, which may come before the ends the
        reservation waits for. The reservation moves earlier then, never later (the backfill
        already placed in this pass was held to the later time, so it delays no earlier one). The
        claim moved ``_health_gen``, so ``_reserve`` plans afresh."""
        head = self.jobs.get(reservation.job)
        if head is None or head.id not in self._classes:
            return reservation
        r = self._reserve(head, self._classes[head.id], now)
        if r is None or r.t >= reservation.t:
            return reservation
        self._set_pass_reservation(r)
        return r

    def _reclaim_blocked(
        self,
        prio: int,
        tn: str,
        cls: Class,
        now: float,
        reservation: Reservation | None,
        tried: set[tuple[str, Class]],
    ) -> int:
        """A class the reservation blocks, or holds off (every tenant's job of it too long to
        backfill), is still a tenant's guarantee: a tenant under its quota whose job there fits no
        free GPUs takes borrowed ones back (once a pass a class), or a borrower's head of the same
        shape, or another tenant's job of it first by fair share, would keep it out until the head
        started."""
        if (tn, cls) in tried:
            return 0
        tried.add((tn, cls))
        h = self.queue.head((prio, tn, cls))
        if h is None:
            return 0
        job = self.jobs[h[2]]
        if self._reclaim_for(job, cls, now, reservation):
            return int(job.state is JobState.RUNNING)
        return 0

    def _reclaimable(self) -> bool:
        """Does some tenant hold less than its quota while another borrows beyond its own?"""
        under = over = False
        for t in self.tenants.values():
            held = self._quota_held(t)
            under = under or (t.quota_gpus > 0 and held < t.quota_gpus)
            over = over or held > t.quota_gpus
        return under and over

    def _held_head(self) -> Job | None:
        """The head whose reservation the last pass made, if it still waits in the queue; else the
        latest head a higher-priority one displaced that still waits (see ``_note_reservation``)."""
        r = self._head_res
        job = self.jobs.get(r.job) if r is not None else None
        if job is not None and job.state is JobState.PENDING and job.id in self.queue:
            return job
        while self._displaced:
            job = self.jobs.get(self._displaced[-1])
            if job is not None and job.state is JobState.PENDING and job.id in self.queue:
                return job
            self._displaced.pop()
        return None

    def _first_at(self, prio: int, now: float) -> tuple[Job, Class] | None:
        """The job a pass would look at first at this priority: the tenant first by fair share
        (ties by its earliest job), then its earliest job by queue order."""
        level = self.queue.tenants(prio)
        if not level:
            return None
        shares = self._shares(level, now)
        firsts = {t: self._tenant_first(t, prio) for t in level}
        waiting = [t for t in level if firsts[t][0] < math.inf]  # a tenant whose classes emptied has none
        if not waiting:
            return None
        tn = min(waiting, key=lambda t: (shares[t], firsts[t]))
        best = None
        for cls in level.get(tn, ()):
            h = self.queue.head((prio, tn, cls))
            if h is not None and (best is None or h < best[0]):
                best = (h, cls)
        if best is None:
            return None
        return self.jobs[best[0][2]], best[1]

    def _tenant_first(self, tn: str, prio: int) -> tuple[float, int]:
        """The tenant's earliest queued job at this priority (original submit time, submission
        order): what breaks a fair-share tie, never the tenant's name."""
        h = self.queue.tenant_head(prio, tn)
        return (math.inf, 0) if h is None else h

    def _shares(self, level: dict[str, set[Class]], now: float) -> dict[str, float]:
        """Fair share at one priority: each tenant's usage decayed with ``usage_half_life_s``
        (Slurm's multifactor), divided by its weight; lower goes first."""
        half = self.gov.limits.usage_half_life_s
        out: dict[str, float] = {}
        for tn in level:
            t = self.tenants[tn]
            w = t.weight
            out[tn] = t.decayed(now, half) / w if w > 0 else math.inf
        return out

    def _try_place(self, job: Job, cls: Class, reservation: Reservation | None, now: float) -> bool:
        for pool in cls[2]:
            exclude: frozenset[str] = frozenset()
            if reservation is not None and reservation.pool == pool and now + self._hold(job) > reservation.t:
                exclude = reservation.nodes
                # how many nodes fit outside the reservation, counted once per start in a pass
                key = (pool, job.gpus_per_node, reservation)
                seen = self._outside.get(key)
                if seen is None or seen[0] != self._starts:
                    seen = self._outside[key] = (self._starts, self.cap.count_fitting(pool, job.gpus_per_node, exclude))
                if seen[1] < job.nodes:
                    continue
            nodes = self._find(job, pool, exclude, now)
            if nodes is not None:
                self._start(job, pool, nodes, backfill=reservation is not None)
                return True
        return False

    # ------------------------------------------------------------------ preemption

    def _kill(self, job: Job) -> None:
        job.substate = "killed"
        job.killed_at = self.clock.now()
        self._touch(job)
        self._timer(job.killed_at + self.gov.limits.unkillable_s, "unkillable", job)
        self.executor.kill(job)

    def _unkillable(self, job: Job) -> None:
        """A kill whose exit never came (a hung process, an unreachable host): its nodes are taken
        out as Slurm drains a node on UnkillableStepTimeout, and the job is released and goes on as
        an infrastructure loss (a cancelled one ends cancelled, one at its time limit failed)."""
        names = [n for n in job.placement if self.cap.nodes[n].health is not Health.LOST]
        self._emit(ev.EXITED, job=job.id, epoch=job.epoch, status="lost", reason="unkillable")
        self._unindex_candidate(job)
        if names:
            self.node_lost(names)  # other jobs there are killed too: their nodes are gone
        self._release(job)
        job.end_s = self.clock.now()
        if job.preempt_reason == "cancel":
            self._move(job, "gone_cancelled")
            self._emit(ev.CANCELLED, job=job.id)
        elif job.preempt_reason == "time_limit":
            self._fail(job, "timeout", "time_limit")
        else:
            job.infra_losses += 1
            self._infra_requeue(job, "unkillable")
        self._touch(job)

    # ------------------------------------------------------------------ retention (the live service)

    def forgettable(self, job_id: str) -> bool:
        """Whether :meth:`forget` would drop this job: it has ended and holds nothing."""
        job = self.jobs.get(job_id)
        return (
            job is not None
            and job.state in TERMINAL
            and job_id not in self._claimants
            and job_id not in self._end_of
            and not job.claim
        )

    def forget(self, job_ids: Iterable[str]) -> list[str]:
        """Drop ended jobs from memory: the live service's retention of ended jobs, which deletes their
        rows from the store itself, first. Only a job in a terminal state that holds nothing (no
        claim, no GPUs, no end in the plan) is dropped; any other id is skipped. Nothing is emitted or
        committed, and no decision can change: a terminal job is in no queue, claim or index a pass
        reads (a timer naming it is skipped when it fires). The ids dropped."""
        out = []
        for jid in job_ids:
            if not self.forgettable(jid):
                continue
            del self.jobs[jid]
            self._classes.pop(jid, None)
            self._per_node_cache.pop(jid, None)
            self._touched_jobs.pop(jid, None)
            self.terminal -= 1
            out.append(jid)
        return out
