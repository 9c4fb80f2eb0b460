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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from sortedcontainers import SortedList

from . import events as ev
from .capacity import Capacity
from .eviction import EXACT_MAX, Candidate, VictimOrder, exact_fit, greedy_fit
from .executor import Clock, Executor
from .governance import Governance
from .model import EVICTION_REASONS, INFRA_REASONS, TERMINAL, Health, Job, JobState, Node, Pool, Tenant
from .placement import pools_for
from .policy import Policy
from .queue import Class, PendingQueue
from .transitions import apply

PREEMPT_SCANS_PER_PASS = 4  # victim searches per pass; needs beyond wait for the next pass (<= 1 s)
# a priority preemption evicts at most this many jobs (Policy.weigh_wait): a gang that needs more
# waits for its reservation, which time limits make hold, instead of disrupting a crowd
MAX_VICTIMS = 2
LOGGED_CANDIDATES = 8  # a preemption's record lists this many of the cheapest candidates
STOP_S = 10.0  # what a plain stop (no checkpoint) is expected to take, for pricing a victim


@dataclass(frozen=True, slots=True)
class Reservation:
    job: str
    pool: str
    t: float
    nodes: frozenset[str]

    def __reduce__(self) -> tuple[type[Reservation], tuple[Any, ...]]:
        """Rebuilt through its constructor (pickle, copy): compiled, a frozen dataclass refuses the
        attribute-by-attribute state they would set otherwise."""
        return (Reservation, tuple(getattr(self, f.name) for f in fields(self)))


class SchedulerError(ValueError):
    """A bad input (a job spec, an unknown job or node): the message names it."""


class Scheduler:
    def __init__(
        self,
        pools: Iterable[Pool],
        *,
        clock: Clock,
        executor: Executor,
        policy: Policy | None = None,
        nodes: Iterable[Node] | None = None,
        tenants: Iterable[Tenant] = (),
        store: Any = None,
        log: ev.EventLog | None = None,
        governance: Governance | None = None,
    ) -> None:
        pools = list(pools)
        self.policy = policy or Policy()
        self.gov = governance if governance is not None else Governance()
        self.clock = clock
        self.executor = executor
        self.cap = Capacity(pools, nodes if nodes is not None else Capacity.build_nodes(pools))
        self.jobs: dict[str, Job] = {}
        self.tenants: dict[str, Tenant] = {t.name: t for t in tenants}
        for spec in self.gov.tenants.values():  # the operator's word wins over a stored record
            t = self.tenants.get(spec.name)
            if t is None:
                t = self.tenants[spec.name] = Tenant(spec.name)
            t.weight, t.quota_gpus = spec.weight, spec.quota_gpus or 0
        self.queue = PendingQueue()
        self.log = log if log is not None else ev.EventLog()
        self.store = store
        self._seq = 0
        self._classes: dict[str, Class] = {}
        self._ends: dict[str, SortedList] = {p: SortedList() for p in self.cap.pools}
        self._end_of: dict[str, tuple[str, float]] = {}
        self._running: dict[str, dict[int, dict[str, None]]] = {p: {} for p in self.cap.pools}
        self._held: dict[str, dict[int, int]] = {p: {} for p in self.cap.pools}
        self._claimants: dict[str, None] = {}
        self._leaving: dict[str, int] = {}  # tenant -> GPUs of its jobs asked to leave, not yet gone
        self._order = VictimOrder(self.policy.victims)  # running jobs as victim searches draw them
        self._priorities: set[int] = set()  # every job priority seen: the thresholds of cap.reachable
        self._timers: list[tuple[float, str, str, int]] = []
        self._dirty = True
        self._touched_jobs: dict[str, Job] = {}
        self._touched_nodes: set[str] = set()
        self._touched_tenants: set[str] = set()
        self._unflushed: list[dict[str, Any]] = []
        self.reservation: Reservation | None = None
        # the head's reservation binds every pass until the head starts (or a higher-priority head
        # takes its place): the next pass begins with it, before any other job is looked at
        self._head_res: Reservation | None = None
        self._pass_res: Reservation | None = None  # the reservation in force during this pass
        self._plan_on_clock = False  # the last plan depended on the clock alone (see _reserve)
        self.passes = 0
        self.refused = 0  # priority preemptions found but not made: the victims would lose more than the wait
        self.terminal = 0  # jobs finished, failed or cancelled
        # a preemption that failed short of d nodes stays failed until at least d node-releases
        # happened in its pool: free plus evictable capacity grows only when GPUs are released,
        # nodes return or claims drop, and each node so touched can make at most one node fit
        self._freed: dict[str, int] = dict.fromkeys(self.cap.pools, 0)
        # (``_gained``); a claim handed to its claimant also counts (its nodes are no longer held back,
        # so a job beside it becomes evictable), and the release of a running job that a search above
        # its priority could evict anyway does not: its GPUs go from evictable to free
        self._unheld: dict[str, int] = dict.fromkeys(self.cap.pools, 0)
        self._freed_evictable: dict[str, dict[int, int]] = {p: {} for p in self.cap.pools}
        self._no_victims: dict[tuple, int] = {}
        # the reservation the _no_victims entries made under one belong to: entries of another go
        # when it changes, so a release is judged against the reservation its entries excluded
        self._memo_reservation: Reservation | None = None
        self._reservation_cache: tuple | None = None
        self._pass_below: dict[tuple[str, int], int] = {}
        self._outside: dict[tuple, tuple[int, int]] = {}
        self._starts = 0  # starts ever: per-pass counts keyed by it stay exact
        self._mutations = 0  # starts, releases, claims and notices ever: what can change a pass's outcome
        self._pass_scans = 0
        self._pass_failed: dict[str, list[tuple[int, int, int]]] = {}
        self._health_gen = 0  # bumps whenever a node goes down, under notice, up, or is claimed
        self._per_node_cache: dict[str, tuple[int, tuple[tuple[str, int], ...]]] = {}
        # called with each pass's reservation when it is made: nothing is logged for one, and a
        # compiled Scheduler's methods cannot be wrapped, so observers (tests, tracing) hook here
        self.on_reservation: Callable[[Reservation], None] | None = None

    # ------------------------------------------------------------------ persistence

    def _touch(self, job: Job) -> None:
        self._touched_jobs[job.id] = job

    def _emit(self, event: str, **fields: Any) -> None:
        rec = self.log.emit(self.clock.now(), event, **fields)
        if self.store is not None:
            self._unflushed.append(rec)

    def _flush(self) -> None:
        if self.store is None:
            self._touched_jobs.clear()
            self._touched_nodes.clear()
            self._touched_tenants.clear()
            return
        self.store.commit(
            jobs=list(self._touched_jobs.values()),
            nodes=[self.cap.nodes[n] for n in sorted(self._touched_nodes)],
            tenants=[self.tenants[t] for t in sorted(self._touched_tenants)],
            meta=self._meta(),
            events=self._unflushed,
        )
        self._touched_jobs.clear()
        self._touched_nodes.clear()
        self._touched_tenants.clear()
        self._unflushed = []

    def _meta(self) -> dict[str, Any]:
        rc = self._reservation_cache
        cache = None
        if rc is not None:
            (jid, freed, gen), r = rc
            cache = {
                "job": jid,
                "freed": list(freed),
                "gen": gen,
                "reservation": None
                if r is None
                else {"job": r.job, "pool": r.pool, "t": r.t, "nodes": sorted(r.nodes, key=self.cap.index.__getitem__)},
            }
        return {
            "seq": self._seq,
            "policy": self.policy.name,
            "dirty": self._dirty,
            "health_gen": self._health_gen,
            "freed": self._freed,
            "reservation_cache": cache,
            "head_reservation": None
            if self._head_res is None
            else {
                "job": self._head_res.job,
                "pool": self._head_res.pool,
                "t": self._head_res.t,
                "nodes": sorted(self._head_res.nodes, key=self.cap.index.__getitem__),
            },
        }

    def _load_meta(self, meta: dict[str, Any]) -> None:
        self._seq = int(meta.get("seq", 0))
        self._dirty = bool(meta.get("dirty", True))
        self._health_gen = int(meta.get("health_gen", 0))
        for pool, n in (meta.get("freed") or {}).items():
            if pool in self._freed:
                self._freed[pool] = int(n)
        head = meta.get("head_reservation")
        if isinstance(head, dict) and head.get("pool") in self.cap.pools:
            names = [n for n in head.get("nodes", ()) if n in self.cap.nodes]
            self._head_res = Reservation(str(head["job"]), head["pool"], float(head["t"]), frozenset(names))
            self.reservation = self._head_res
        cache = meta.get("reservation_cache")
        if isinstance(cache, dict):
            r = cache.get("reservation")
            res = None
            if isinstance(r, dict) and r.get("pool") in self.cap.pools:
                names = [n for n in r.get("nodes", ()) if n in self.cap.nodes]
                res = Reservation(str(r["job"]), r["pool"], float(r["t"]), frozenset(names))
            key = (str(cache.get("job")), tuple(int(x) for x in cache.get("freed", ())), int(cache.get("gen", 0)))
            self._reservation_cache = (key, res)

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

    def save_all(self) -> None:
        """Write every record (the first commit of a new store)."""
        if self.store is None:
            return
        self.store.commit(
            jobs=list(self.jobs.values()),
            nodes=list(self.cap.nodes.values()),
            tenants=list(self.tenants.values()),
            meta=self._meta(),
            events=self._unflushed,
        )
        self._unflushed = []

    # ------------------------------------------------------------------ indices

    def _class_of(self, job: Job) -> Class:
        return (job.nodes, job.gpus_per_node, pools_for(job, self.cap.pools, self.policy.spot_rule))

    def _note_priority(self, priority: int) -> None:
        if priority not in self._priorities:
            self._priorities.add(priority)
            # nothing runs below the lowest priority: a search there never happens
            self.cap.set_thresholds(sorted(self._priorities)[1:])

    def _hold(self, job: Job) -> float:
        """The longest this job's next run may hold its GPUs: its declared limit (restart plus the
        work left), then ``over_time_limit_s`` and its grace before the time limit's kill. What a
        reservation and backfill reckon with, so that a backfilled job can never delay a head.
        With time limits not enforced (``over_time_limit_s`` infinite) the declaration alone."""
        return job.backfill_limit() + self._margin(job)

    def _margin(self, job: Job) -> float:
        lim = self.gov.limits
        if not math.isfinite(lim.over_time_limit_s) or job.limit_s <= 0:
            return 0.0
        return lim.over_time_limit_s + min(job.ckpt.grace_s, lim.max_grace_s)

    def _enqueue(self, job: Job) -> None:
        limit = self._hold(job)
        self.queue.push(job.id, job.priority, job.tenant, self._classes[job.id], job.submit_s, job.seq, limit)
        self._dirty = True

    def _index_run(self, job: Job, *, evictable_counted: bool = False) -> None:
        """Count a running or leaving job in the per-pool indices (its GPUs are bound already, and
        counted as evictable by the capacity index when ``evictable_counted``)."""
        if job.state is JobState.RUNNING:
            self._running[job.pool].setdefault(job.priority, {})[job.id] = None
            if not evictable_counted:
                self.cap.add_evictable(job.placement, job.priority, job.gpus_per_node)
            if self._victim_ok(job, self.clock.now()):
                self._order_add(job)
            elif job.evictions < self.gov.limits.max_preemptions:
                self._timer(job.started_s + self.gov.limits.min_run_s, "mature", job)
            held = self._held[job.pool]
            held[job.priority] = held.get(job.priority, 0) + job.gpus
            end = job.started_s + job.run_limit_s + self._margin(job)
        else:
            end = job.deadline_s if math.isfinite(job.deadline_s) else self.clock.now() + STOP_S
        self._set_end(job, end)

    def _victim_ok(self, job: Job, now: float) -> bool:
        """May a priority or quota preemption take this running job? Not before it has run
        ``min_run_s`` in this run, and never once it was evicted ``max_preemptions`` times."""
        lim = self.gov.limits
        return job.evictions < lim.max_preemptions and now >= job.started_s + lim.min_run_s

    def _mature(self, job: Job) -> None:
        """A run reached ``min_run_s``: from now on a victim search may draw it."""
        if job.id in self._order or job.evictions >= self.gov.limits.max_preemptions:
            return  # (its age is the timer's: started_s + min_run_s, whatever the float rounding)
        self._order_add(job)
        # a search that failed before may succeed now: count its nodes as releases for the memo
        self._unheld[job.pool] += len(job.placement)
        self._mutations += 1
        if len(self.queue):
            self._dirty = True

    def _time_limit(self, job: Job, now: float) -> None:
        """The run reached its time limit plus ``over_time_limit_s``: asked to checkpoint (when the
        write fits its grace) and stop, killed at the grace's end; gone, it fails with reason
        ``time_limit``."""
        if job.limit_s <= 0 or now < job.started_s + job.run_limit_s + self.gov.limits.over_time_limit_s:
            return
        grace = min(job.ckpt.grace_s, self.gov.limits.max_grace_s)
        ask = self.policy.ask_checkpoint and job.ckpt.fits_grace(grace)
        self._preempt(job, "time_limit", "", now + grace, checkpoint=ask, candidates=None)
        self._dirty = True

    def _seq_of(self, job_id: str) -> int:
        return self.jobs[job_id].seq

    def _unindex_candidate(self, job: Job) -> None:
        level = self._running[job.pool].get(job.priority)
        if level is not None and level.pop(job.id, 0) is None:
            self._held[job.pool][job.priority] -= job.gpus
            self.cap.add_evictable(job.placement, job.priority, job.gpus_per_node, sign=-1)
            self._order.remove(job.id)
            if not level:
                del self._running[job.pool][job.priority]

    def _set_end(self, job: Job, end: float) -> None:
        old = self._end_of.pop(job.id, None)
        if old is not None:
            self._ends[old[0]].discard((old[1], job.id))
        if end is not None:
            self._ends[job.pool].add((end, job.id))
            self._end_of[job.id] = (job.pool, end)

    def _drop_end(self, job: Job) -> None:
        old = self._end_of.pop(job.id, None)
        if old is not None:
            self._ends[old[0]].discard((old[1], job.id))

    def _tenant(self, name: str) -> Tenant:
        t = self.tenants.get(name)
        if t is None:
            spec = self.gov.tenant(name)
            t = self.tenants[name] = Tenant(name, weight=spec.weight, quota_gpus=spec.quota_gpus or 0)
            self._touched_tenants.add(name)
        return t

    def _timer(self, t: float, kind: str, job: Job) -> None:
        heapq.heappush(self._timers, (t, kind, job.id, job.epoch))

    # ------------------------------------------------------------------ inputs

    def submit(self, job: Job) -> Job:
        """Queue a new job; a spec that cannot be valid is refused naming the job and the field."""
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
        return ""

    def report_commit(self, job_id: str, epoch: int, progress_s: float) -> bool:
        """A job's checkpoint committed: its resume point advances, if the report is current."""
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
            self._move(job, "left", "queued")
            job.preemptions += 1
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

    def _move(self, job: Job, trigger: str, substate: str = "") -> None:
        apply(job, trigger, substate)
        if job.state in TERMINAL:
            self.terminal += 1

    def _requeue(self, job: Job, reason: str) -> None:
        job.deadline_s = math.inf
        job.victim_of = ""
        job.preempt_reason = ""
        job.preemptor = ""
        job.killed_at = -1.0
        job.ckpt_requested = False
        job.placement = ()
        self._emit(ev.REQUEUED, job=job.id, reason=reason, resume_from_s=job.committed_s)
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
            self._preempt(job, "cancel", "", self.clock.now() + job.ckpt.grace_s, checkpoint=False, candidates=None)
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
            _, kind, jid, epoch = heapq.heappop(self._timers)
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
            t, kind, jid, epoch = self._timers[0]
            job = self.jobs.get(jid)
            live = (
                job is not None
                and job.epoch == epoch
                and (
                    (kind == "deadline" and job.state is JobState.PREEMPTING and job.substate != "killed")
                    or (kind == "eligible" and job.state is JobState.PENDING and job.substate == "backoff")
                    or (kind in ("limit", "mature") and job.state is JobState.RUNNING)
                    or (kind == "unkillable" and job.state is JobState.PREEMPTING and job.substate == "killed")
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
                break  # nothing is free and nothing below can be evicted: no job here or below can start
            if head is not None and reservation is None and prio <= head.priority:
                # the held head goes first at its level: no job of its priority, whatever its tenant
                # or its name, is looked at before the reservation is in force again
                hcls = self._classes[head.id]
                if self._try_place(head, hcls, None, now):
                    started += 1
                elif self.policy.preemption and self._preempt_for(head, hcls, now, None):
                    started += head.state is JobState.RUNNING
                else:
                    reservation = self._reserve(head, hcls, now)
                    self._set_pass_reservation(reservation)
                    blocked.add(hcls)
                    if not self.policy.backfill:
                        halted = True
                        break
                head = None
            level = self.queue.tenants(prio)
            open_heads: dict[str, list[tuple[tuple[float, int, str], Class]]] = {}
            shares = self._shares(level, now)
            heap = [(shares[t], self._tenant_first(t, prio, level), t) for t in level]
            heapq.heapify(heap)
            while heap and not halted:
                share, _, tn = heapq.heappop(heap)  # shares hold still within a pass (usage is history)
                # the tenant's open classes, by their heads' queue order: built once per level
                heads = open_heads.get(tn)
                if heads is None:
                    heads = []
                    for cls in level.get(tn, ()):
                        if cls in blocked or (prio, cls) in held_off_classes:
                            continue
                        h = self.queue.head((prio, tn, cls))
                        if h is not None:
                            heads.append((h, cls))
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
                    if self.policy.preemption and self._preempt_for(job, cls, now, None):
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

    def _reclaimable(self) -> bool:
        """Does some tenant hold less than its quota while another borrows beyond its own?"""
        under = over = False
        for t in self.tenants.values():
            held = self._quota_held(t)
            under = under or (t.quota_gpus > 0 and held < t.quota_gpus)
            over = over or held > t.quota_gpus
        return under and over

    def _quota_held(self, t: Tenant) -> int:
        """What counts against a tenant's quota: GPUs of its running jobs and of its claims (a
        claimant will hold them), not those of its jobs already leaving."""
        held = t.usage_gpus - self._leaving.get(t.name, 0)
        for jid in self._claimants:
            c = self.jobs[jid]
            if c.tenant == t.name:
                held += c.gpus
        return held

    def _held_head(self) -> Job | None:
        """The head whose reservation the last pass made, if it still waits in the queue."""
        r = self._head_res
        if r is None:
            return None
        job = self.jobs.get(r.job)
        if job is None or job.state is not JobState.PENDING or job.id not in self.queue:
            return None
        return job

    def _set_pass_reservation(self, r: Reservation | None) -> None:
        self._pass_res = r
        if r is not None:
            self.cap.watch(r.nodes)
            if self.on_reservation is not None:
                self.on_reservation(r)

    def _note_reservation(self, r: Reservation | None) -> None:
        """Keep the pass's reservation for the next passes; log it whenever it is set or moves."""
        old = self._head_res
        self.reservation = r
        self._head_res = r
        self._pass_res = None
        if r is not None and (old is None or old.job != r.job or old.t != r.t or old.nodes != r.nodes):
            self._emit(
                ev.RESERVED,
                job=r.job,
                reserved_t=r.t,
                pool=r.pool,
                nodes=sorted(r.nodes, key=self.cap.index.__getitem__),
            )

    def _tenant_first(self, tn: str, prio: int, level: dict[str, set[Class]]) -> tuple[float, int]:
        """The tenant's earliest queued job at this priority (original submit time, submission
        order): what breaks a fair-share tie, never the tenant's name."""
        best = (math.inf, 0)
        for cls in level.get(tn, ()):
            h = self.queue.head((prio, tn, cls))
            if h is not None and (h[0], h[1]) < best:
                best = (h[0], h[1])
        return best

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
            nodes = self.cap.find(pool, job.nodes, job.gpus_per_node, exclude)
            if nodes is not None:
                self._start(job, pool, nodes, backfill=reservation is not None)
                return True
        return False

    def _backfill_short(self, prio: int, tn: str, cls: Class, reservation: Reservation, now: float) -> int:
        """A blocked class may still hold a job short enough to finish before the reserved start.

        1: it started; 0: none of the key is short enough; -1: the shortest is, but fits nowhere."""
        short = self.queue.shortest((prio, tn, cls))
        if short is None or now + short[0] > reservation.t:
            return 0
        job = self.jobs[short[1]]
        for pool in cls[2]:
            nodes = self.cap.find(pool, job.nodes, job.gpus_per_node)
            if nodes is not None:
                self._start(job, pool, nodes, backfill=True)
                return 1
        return -1  # short enough, but no room anywhere

    def _start(self, job: Job, pool: str, nodes: tuple[str, ...], *, backfill: bool = False) -> None:
        """Bind the gang and start it; ``backfill``: it starts while a head's reservation is in
        force (around it, or done before its time), which its ``started`` record says."""
        now = self.clock.now()
        self._starts += 1
        self._mutations += 1
        self.queue.remove(job.id)
        limit = job.backfill_limit()
        held = self._reservation_cache[1] if self._reservation_cache is not None else None
        if held is not None and now + limit + self._margin(job) > held.t and not held.nodes.isdisjoint(nodes):
            self._reservation_cache = None  # it did not go around the reservation: that one no longer holds
        self._move(job, "start", "running")
        job.epoch += 1
        job.started_s = now
        job.pool = pool
        job.placement = nodes
        job.claim, job.claim_pool = (), ""
        if job.first_start_s < 0:
            job.first_start_s = now
        job.run_limit_s = limit
        self.cap.bind(job.id, nodes, job.gpus_per_node, evictable_priority=job.priority)
        self._touched_nodes.update(nodes)
        tenant = self._tenant(job.tenant)
        tenant.fold(now, self.gov.limits.usage_half_life_s)
        tenant.usage_gpus += job.gpus
        self._touched_tenants.add(tenant.name)
        self._index_run(job, evictable_counted=True)
        if job.limit_s > 0:
            self._timer(now + limit + self.gov.limits.over_time_limit_s, "limit", job)
        self._touch(job)
        extra: dict[str, Any] = {"backfill": True} if backfill else {}
        self._emit(
            ev.STARTED,
            job=job.id,
            epoch=job.epoch,
            pool=pool,
            nodes=list(nodes),
            gpus_per_node=job.gpus_per_node,
            resume_from_s=job.committed_s,
            **extra,
        )
        self.executor.start(job, nodes, job.committed_s)

    def _release(self, job: Job) -> None:
        """Hand the job's GPUs back: called when it is observed gone (or, in one baseline, at the decision)."""
        self._drop_end(job)
        self._mutations += 1
        if not job.placement:
            return
        if job.state is JobState.PREEMPTING:
            self._leaving[job.tenant] = self._leaving.get(job.tenant, 0) - job.gpus
        for name in job.placement:
            node = self.cap.nodes[name]
            if job.state is JobState.PREEMPTING:
                node.draining = max(0, node.draining - job.gpus_per_node)
        self.cap.unbind(job.id, job.placement)
        self._freed[job.pool] += len(job.placement)
        if job.state is JobState.RUNNING and not self._unevictable(job) and self._victim_ok(job, self.clock.now()):
            low = self._freed_evictable[job.pool]
            low[job.priority] = low.get(job.priority, 0) + len(job.placement)
        self._touched_nodes.update(job.placement)
        tenant = self._tenant(job.tenant)
        tenant.fold(self.clock.now(), self.gov.limits.usage_half_life_s)
        tenant.usage_gpus -= job.gpus
        tenant.used_gpu_s += job.gpus * max(0.0, self.clock.now() - job.started_s)
        self._touched_tenants.add(tenant.name)
        self._emit(ev.RELEASED, job=job.id, epoch=job.epoch, nodes=list(job.placement), gpus=job.gpus)
        job.placement = ()
        self._touch(job)
        self._dirty = True
        claimant = self.jobs.get(job.preemptor) if job.preemptor else None
        if claimant is not None and claimant.id in self._claimants:
            self._try_claim(claimant)

    # ------------------------------------------------------------------ preemption

    def _unevictable(self, job: Job) -> bool:
        """Would a victim search pass over this running job (a node of it claimed, leaving or in a
        reservation a search may exclude)?"""
        bad = self.cap.held_back(job.pool)
        r = self._memo_reservation
        if r is not None and r.pool == job.pool:
            bad |= r.nodes
        return bool(bad) and not bad.isdisjoint(job.placement)

    def _memo_for(self, reservation: Reservation | None) -> None:
        """Forget failed searches made under another reservation than ``reservation``."""
        if reservation is not None and reservation != self._memo_reservation:
            if self._memo_reservation is not None:
                self._no_victims = {k: v for k, v in self._no_victims.items() if k[4] is None}
            self._memo_reservation = reservation

    def _gained(self, pool: str, prio: int) -> int:
        """Node-releases in the pool that can make a node reachable for a search at ``prio``."""
        low = sum(n for p, n in self._freed_evictable[pool].items() if p < prio)
        return self._freed[pool] + self._unheld[pool] - low

    def _uncommitted(self, job: Job, now: float) -> float:
        """Run time a kill now would throw away: everything since the run began or last committed,
        the part of its restart already spent included (it is paid again at the next start)."""
        since = job.committed_at if job.committed_at >= job.started_s else job.started_s
        return max(0.0, now - since)

    def _sunk_restart(self, job: Job, now: float) -> float:
        restart = job.ckpt.restart_s if job.epoch > 1 else 0.0
        return max(0.0, min(now - job.started_s, restart))

    def _asks_checkpoint(self, job: Job) -> bool:
        """Is this victim asked to checkpoint first (its grace period fits its stall and write)?"""
        c = job.ckpt
        return self.policy.ask_checkpoint and c.interval_s > 0 and c.stall_s + c.write_s <= c.grace_s

    def _drain(self, job: Job, ask: bool) -> float:
        c = job.ckpt
        return c.stall_s + c.write_s if ask else min(STOP_S, c.grace_s)

    def _price(self, job: Job, now: float) -> Candidate:
        """The victim's expected loss if it were asked to leave now, at its own grace period."""
        c = job.ckpt
        ask = self._asks_checkpoint(job)
        lost = self._sunk_restart(job, now) if ask else self._uncommitted(job, now)
        drain = self._drain(job, ask)
        return Candidate(
            job.id, job.priority, job.started_s, job.gpus, self._per_node(job), lost, drain, c.restart_s, ask
        )

    def _order_add(self, job: Job) -> None:
        """Index a running job in the victim order: its price per GPU is linear in time from its
        last commit (or start), or constant once the restart a checkpointing victim pays is sunk
        (see :class:`VictimOrder`; the same prices as :meth:`_price`)."""
        ask = self._asks_checkpoint(job)
        fixed = job.ckpt.restart_s + self._drain(job, ask)
        if ask:
            sunk = job.ckpt.restart_s if job.epoch > 1 else 0.0
            linear = fixed - job.started_s if sunk > 0 else None
            const: float | None = fixed + sunk
        else:
            since = job.committed_at if job.committed_at >= job.started_s else job.started_s
            linear, const = fixed - since, None
        self._order.add(job.id, job.pool, job.priority, job.started_s, linear=linear, const=const, seq=job.seq)

    def _per_node(self, job: Job) -> tuple[tuple[str, int], ...]:
        got = self._per_node_cache.get(job.id)
        if got is None or got[0] != job.epoch:
            got = self._per_node_cache[job.id] = (job.epoch, tuple((n, job.gpus_per_node) for n in job.placement))
        return got[1]

    def _preempt_for(self, job: Job, cls: Class, now: float, reservation: Reservation | None) -> bool:
        """Free room for ``job`` by evicting lower-priority gangs, if some set of them is enough."""
        if self._pass_scans >= PREEMPT_SCANS_PER_PASS:
            self._dirty = True  # the search is only put off: the next pass must come
            return False
        prio = job.priority
        reason = "priority"
        for pool in cls[2]:
            below = self._pass_below.get((pool, prio))
            if below is None:
                below = self._pass_below[(pool, prio)] = sum(g for p, g in self._held[pool].items() if p < prio)
            if below == 0:
                continue  # nothing of lower priority runs there
            # a failure for n x g at priority p is a failure for any bigger need at p or below
            failed = self._pass_failed.setdefault(pool, [])
            if any(n <= job.nodes and g_ <= job.gpus_per_node and p >= prio for n, g_, p in failed):
                continue
            memo = (pool, job.nodes, job.gpus_per_node, prio, reservation)
            self._memo_for(reservation)
            gained = self._gained(pool, prio)
            if gained < self._no_victims.get(memo, -1):
                continue
            if len(self._no_victims) > 100_000:
                self._no_victims.clear()
            shape = (job.nodes, job.gpus_per_node, prio)
            excluded = reservation.nodes if reservation is not None and reservation.pool == pool else frozenset()
            if below + self.cap.free_gpus(pool) < job.gpus:
                self._no_victims[memo] = gained + 1
                failed.append(shape)
                continue
            upper = self.cap.reachable(pool, prio, job.gpus_per_node)
            if upper is not None and upper < job.nodes:  # even with every job below gone: no scan
                self._no_victims[memo] = gained + (job.nodes - upper)
                failed.append(shape)
                continue
            self._pass_scans += 1
            got = self._search(job, pool, excluded, now)
            if got is None:
                continue
            victims, free, considered, reachable = got
            if victims is None:
                self._no_victims[memo] = gained + max(1, job.nodes - reachable)
                failed.append(shape)
                continue
            if not self._worth(job, cls, victims, now):
                self.refused += 1
                continue
            if self._evict(job, pool, victims, free, considered, excluded, now, reason):
                return True
        return self.policy.preemption and self._reclaim_for(job, cls, now, reservation)

    def _worth(self, job: Job, cls: Class, victims: list[Candidate], now: float) -> bool:
        """Is evicting ``victims`` cheaper than letting ``job`` wait? Their expected loss (the work
        they would redo, the restart they would pay again, their drain: GPU-seconds, all waste) must
        be at most ``Policy.wait_worth`` (0.1) times the GPU-seconds the job would wait for its own
        reservation by the declared ends (a wait wastes nothing: others use the GPUs meanwhile;
        no end frees enough: it is worth it), and at most ``MAX_VICTIMS`` jobs. ``Policy.weigh_wait`` False (the
        Kueue baseline): evict whatever it costs, as Kueue and Slurm do."""
        if not self.policy.weigh_wait:
            return True
        if len(victims) > MAX_VICTIMS:
            return False
        cost = 0.0
        for c in victims:
            cost += c.cost
        r = self._reserve_now(job, cls, now)
        if r is None:
            return True
        return cost <= self.policy.wait_worth * job.gpus * (r.t - now)

    def _reclaim_for(self, job: Job, cls: Class, now: float, reservation: Reservation | None) -> bool:
        """A tenant under its quota takes borrowed GPUs back (Kueue's reclaim within a cohort):
        victims are running jobs, of any priority, of tenants holding more than their own quota,
        and never enough of one tenant's to take it below its quota."""
        tenant = self.tenants.get(job.tenant)
        if tenant is None or not tenant.quota_gpus or self._quota_held(tenant) + job.gpus > tenant.quota_gpus:
            return False
        if not any(self._quota_held(t) > t.quota_gpus for t in self.tenants.values() if t.name != job.tenant):
            return False  # nobody borrows
        for pool in cls[2]:
            if self._pass_scans >= PREEMPT_SCANS_PER_PASS:
                self._dirty = True
                return False
            excluded = reservation.nodes if reservation is not None and reservation.pool == pool else frozenset()
            self._pass_scans += 1
            got = self._search(job, pool, excluded, now, quota=True)
            if got is None or got[0] is None:
                continue
            victims, free, considered, _ = got
            if self._evict(job, pool, victims, free, considered, excluded, now, "quota"):
                return True
        return False

    def _evict(
        self,
        job: Job,
        pool: str,
        victims: list[Candidate],
        free: dict[str, int],
        considered: list[Candidate],
        excluded: frozenset[str],
        now: float,
        reason: str,
    ) -> bool:
        """Ask the victims to leave and claim the nodes their going frees for ``job``."""
        freed: dict[str, int] = {}
        for c in victims:
            for n, g in c.per_node:
                freed[n] = freed.get(n, 0) + g
        target = [n for n in sorted(freed, key=self.cap.index.__getitem__) if free[n] + freed[n] >= job.gpus_per_node]
        target = target[: job.nodes]
        if len(target) < job.nodes:
            more = self.cap.find(pool, job.nodes - len(target), job.gpus_per_node, excluded | set(target))
            if more is None:
                return False
            target += list(more)
        ranked = sorted(considered, key=lambda c: (c.cost, self.jobs[c.job].seq))[:LOGGED_CANDIDATES]
        logged = [
            {"job": c.job, "lost_gpu_s": round(c.cost, 3), "lost_s": round(c.lost_s, 3), "checkpoint": c.checkpoint}
            for c in ranked
        ]
        self.queue.remove(job.id)
        if self.policy.release == "decision":
            for c in victims:
                self._preempt(
                    self.jobs[c.job], reason, job.id, now + self.jobs[c.job].ckpt.grace_s, c.checkpoint, logged
                )
                self._release(self.jobs[c.job])
            self._start(job, pool, tuple(sorted(target, key=self.cap.index.__getitem__)))
            return True
        job.claim = tuple(sorted(target, key=self.cap.index.__getitem__))
        job.claim_pool = pool
        job.substate = "awaiting victims"
        self.cap.claim(job.id, job.claim)
        self._mutations += 1
        self._health_gen += 1
        self._claimants[job.id] = None
        self._touch(job)
        for c in victims:
            self._preempt(self.jobs[c.job], reason, job.id, now + self.jobs[c.job].ckpt.grace_s, c.checkpoint, logged)
        self._try_claim(job)
        return True
        return False

    def _search(self, job: Job, pool: str, excluded: frozenset[str], now: float, *, quota: bool = False):
        """The cheapest victims in ``pool`` for ``job``: lowest priority tier first, each tier's
        running jobs drawn cheapest per GPU first and priced only when drawn.

        A victim touching a claimed, leaving or excluded node frees nothing usable, and one on no
        node where the need could fit frees nothing needed: both are passed over. Returns None
        when nothing below runs there, else (victims or None, free GPUs of the nodes drawn, the
        candidates of the deciding tier, nodes reachable when it failed).

        ``quota``: a reclaim for a tenant under its quota: one tier of every priority (a quota is a
        guarantee, Kueue's reclaimWithinCohort: Any), only jobs of other tenants that borrow, never
        so many of one tenant's that it falls below its own quota."""
        prio, g = job.priority, job.gpus_per_node
        running = self._running[pool]
        tiers = sorted(p for p in running if quota or p < prio)
        if not tiers:
            return None
        room: dict[str, int] = {}  # quota: GPUs each tenant may still lose and stay at its quota
        if quota:
            tiers = tiers[-1:]
            for t in self.tenants.values():
                held = self._quota_held(t)
                if t.name != job.tenant and held > t.quota_gpus:
                    room[t.name] = held - t.quota_gpus
        nodes, jobs = self.cap.nodes, self.jobs
        bad = self.cap.held_back(pool) | excluded
        free: dict[str, int] = {}
        below: dict[str, int] = {}  # node -> GPUs there of jobs a search may evict

        def evictable_on(name: str) -> int:
            got = below.get(name)
            if got is None:
                got = 0
                for jid, gpus in nodes[name].alloc.items():
                    other = jobs[jid]
                    if (
                        other.state is JobState.RUNNING
                        and (other.tenant in room if quota else other.priority < prio)
                        and not (bad and not bad.isdisjoint(other.placement))
                    ):
                        got += gpus
                below[name] = got
            return got

        def drawn(allowed: list[int], seen: list[Candidate]) -> Iterator[Candidate]:
            left = dict(room)
            for jid in self._order.draw(pool, allowed, now):
                v = jobs[jid]
                if bad and not bad.isdisjoint(v.placement):
                    continue
                if quota:
                    if left.get(v.tenant, 0) < v.gpus:
                        continue
                    left[v.tenant] -= v.gpus
                useful = False
                for n in v.placement:
                    f = free.get(n)
                    if f is None:
                        f = free[n] = nodes[n].free
                    useful = useful or f + evictable_on(n) >= g
                if useful:
                    c = self._price(v, now)
                    seen.append(c)
                    yield c

        ok0 = self.cap.count_fitting(pool, g, excluded)
        rule = self.policy.victims
        if rule == "oblivious":
            tiers = tiers[-1:]  # Kueue's order is one list over every priority below
        reach = ok0
        seen: list[Candidate] = []
        for tier in tiers:
            if quota:
                allowed = list(running)
            elif rule != "oblivious":
                allowed = [p for p in running if p <= tier]
            else:
                allowed = [p for p in running if p < prio]
            seen = []
            victims, reach = greedy_fit(job.nodes, g, free, drawn(allowed, seen), ok0, rule)
            if victims is None:
                continue
            if rule != "oblivious":
                # a tier of few candidates is searched exactly: draw them all (stop past EXACT_MAX)
                every: list[Candidate] = []
                for _c in drawn(allowed, every):
                    if len(every) > EXACT_MAX:
                        break
                if len(every) <= EXACT_MAX:
                    seen = every
                    victims = exact_fit(job.nodes, g, free, every, ok0 - sum(1 for f in free.values() if f >= g))
            return victims, free, seen, reach
        return None, free, seen, reach

    def _preempt(self, job: Job, reason: str, preemptor: str, deadline_s: float, checkpoint: bool, candidates) -> None:
        """Ask a running job to leave by ``deadline_s``; ``reason`` says why (never a job id) and
        ``preemptor`` which job it makes room for ('' for none)."""
        now = self.clock.now()
        victim_of = preemptor or reason
        lost = self._sunk_restart(job, now) if checkpoint else self._uncommitted(job, now)
        self._mutations += 1
        self._unindex_candidate(job)
        self._move(job, "preempt", "checkpointing" if checkpoint else "stopping")
        self._health_gen += 1  # its declared end becomes its deadline: a cached reservation may move
        job.deadline_s = deadline_s
        job.victim_of = victim_of
        job.preempt_reason = reason
        job.preemptor = preemptor
        if reason in EVICTION_REASONS:
            job.evictions += 1
        job.ckpt_requested = checkpoint
        for name in job.placement:
            self.cap.nodes[name].draining += job.gpus_per_node
        self._leaving[job.tenant] = self._leaving.get(job.tenant, 0) + job.gpus
        self._touched_nodes.update(job.placement)
        self._set_end(job, deadline_s)
        self._touch(job)
        fields: dict[str, Any] = {}
        if candidates is not None:
            fields["candidates"] = candidates
        self._emit(
            ev.PREEMPT_REQUESTED,
            job=job.id,
            epoch=job.epoch,
            victim_of=victim_of,
            reason=reason,
            preemptor=preemptor or None,
            lost_s=lost,
            deadline_s=deadline_s,
            checkpoint=checkpoint,
            **fields,
        )
        self._timer(deadline_s, "deadline", job)
        self.executor.notify(job, checkpoint=checkpoint, deadline_s=deadline_s)

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

    def _try_claim(self, job: Job) -> int:
        """Start a claimant once every node it claimed has room (its victims are gone)."""
        if job.id not in self._claimants:
            return 0
        nodes = [self.cap.nodes[n] for n in job.claim]
        if any(n.health is not Health.UP for n in nodes):
            self._drop_claim(job, requeue=True)
            return 0
        if any(n.gpus - n.used < job.gpus_per_node for n in nodes):
            return 0
        del self._claimants[job.id]
        claim = job.claim
        self._unheld[job.claim_pool] += len(claim)
        self.cap.unclaim(claim)
        self._start(job, job.claim_pool, claim)
        return 1

    def _drop_claim(self, job: Job, *, requeue: bool) -> None:
        self._mutations += 1
        self._claimants.pop(job.id, None)
        if job.claim_pool:
            self._freed[job.claim_pool] += len(job.claim)
        self.cap.unclaim(job.claim)
        job.claim, job.claim_pool = (), ""
        job.substate = "queued"
        self._touch(job)
        if requeue and job.state is JobState.PENDING:
            self._enqueue(job)

    def _drop_claims_on(self, name: str) -> None:
        owner = self.cap.claimed.get(name)
        if owner is not None:
            self._drop_claim(self.jobs[owner], requeue=True)

    # ------------------------------------------------------------------ reservations

    def _reserve(self, job: Job, cls: Class, now: float) -> Reservation | None:
        """When, at the earliest by declared limits, and where the head could start.

        Kept while nothing was released, returned or lost in its pools: jobs started since then
        went around the reservation, so it still holds."""
        key = (job.id, tuple(self._freed[p] for p in cls[2]), self._health_gen)
        cached = self._reservation_cache
        if cached is not None and cached[0] == key and (cached[1] is None or cached[1].t >= now):
            return cached[1]
        self._plan_on_clock = False
        best = self._reserve_now(job, cls, now)
        # a claim whose victims' ends are past comes back at now + its hold: a plan that moves
        # with the clock alone is not kept
        self._reservation_cache = None if self._plan_on_clock else (key, best)
        return best

    def _reserve_now(self, job: Job, cls: Class, now: float) -> Reservation | None:
        best: Reservation | None = None
        for pool in cls[2]:
            r = self._shadow(job, pool, now)
            if r is not None and (best is None or r.t < best.t):
                best = r
        return best

    def _shadow(self, job: Job, pool: str, now: float) -> Reservation | None:
        """Replay the pool's declared ends in time order until the gang fits (Slurm's backfill
        shadow time). A node claimed by a preemptor comes back when that claimant, started once its
        victims are gone, reaches its own declared end."""
        g, n = job.gpus_per_node, job.nodes
        ok = self.cap.count_fitting(pool, g)
        freed: dict[str, int] = {}
        new: list[str] = []
        t = now
        claim_ends: list[tuple[float, str]] = []
        for cid in self._claimants:
            c = self.jobs[cid]
            if c.claim_pool != pool:
                continue
            start = now
            for name in c.claim:
                for jid in self.cap.nodes[name].alloc:
                    e = self._end_of.get(jid)
                    if e is not None and e[1] > start:
                        start = e[1]
            if start == now:
                self._plan_on_clock = True
            claim_ends.append((start + self._hold(c), cid))
        claim_ends.sort(key=lambda e: (e[0], self.jobs[e[1]].seq))
        released: set[str] = set()
        k = 0
        ends = iter(self._ends[pool])
        nxt = next(ends, None)
        while ok < n and (nxt is not None or k < len(claim_ends)):
            if nxt is not None and (k >= len(claim_ends) or nxt[0] <= claim_ends[k][0]):
                end, jid = nxt
                nxt = next(ends, None)
                other = self.jobs[jid]
                for name in other.placement:
                    node = self.cap.nodes[name]
                    if node.health is not Health.UP:
                        continue
                    before = node.free + freed.get(name, 0)
                    freed[name] = freed.get(name, 0) + other.gpus_per_node
                    if (
                        name not in self.cap.claimed or name in released
                    ) and before < g <= before + other.gpus_per_node:
                        new.append(name)
                        ok += 1
            else:
                end, cid = claim_ends[k]
                k += 1
                for name in self.jobs[cid].claim:
                    node = self.cap.nodes[name]
                    released.add(name)
                    if node.health is Health.UP and node.free + freed.get(name, 0) >= g:
                        new.append(name)
                        ok += 1
            t = max(now, end)
        if ok < n:
            return None
        new = new[:n]
        rest = self.cap.find(pool, n - len(new), g, frozenset(new)) if len(new) < n else ()
        if rest is None:
            return None
        return Reservation(job.id, pool, t, frozenset(new) | frozenset(rest))

    # ------------------------------------------------------------------ helpers

    def _node(self, name: str) -> Node:
        node = self.cap.nodes.get(name)
        if node is None:
            raise SchedulerError(f"no node {name!r}")
        return node

    @property
    def needs_pass(self) -> bool:
        """Something happened since the last pass that could start a pending job."""
        return self._dirty

    def pending(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state is JobState.PENDING)

    def summary(self) -> dict[str, Any]:
        by_state: dict[str, int] = {}
        for j in self.jobs.values():
            by_state[j.state.value] = by_state.get(j.state.value, 0) + 1
        nodes = self.cap.nodes.values()
        return {
            "jobs": by_state,
            "queued": len(self.queue),
            "classes": self.queue.classes(),
            "gpus": sum(n.gpus for n in nodes if n.health is not Health.LOST),
            "gpus_bound": sum(n.used for n in nodes),
            "gpus_draining": sum(n.draining for n in nodes),
            "nodes_lost": sum(1 for n in nodes if n.health is Health.LOST),
            "reservation": None
            if self.reservation is None
            else {"job": self.reservation.job, "pool": self.reservation.pool, "t": self.reservation.t},
        }
