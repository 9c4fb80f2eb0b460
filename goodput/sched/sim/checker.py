"""An independent auditor of a scheduler's event log.

It replays the records of :mod:`goodput.sched.core.events` and counts broken invariants. It is written
from the log schema alone and imports nothing of the scheduler: a checker that shared the
scheduler's code would share its bugs, and then a passing check would prove nothing.

Two ledgers are kept per node because they disagree exactly when the scheduler is wrong: what the
scheduler has *bound* (``started`` to ``released``: its own accounting) and what is *physically
occupied* (``started`` to ``exited``: processes hold their GPUs until they are observed gone). A
scheduler that releases GPUs at the preemption decision rather than at the exit keeps its own books
straight (no ``overcommit``) while two jobs share a GPU (``double_booked``); only the second ledger
sees it.

Records are applied strictly in log order, equal ``t`` included: the scheduler logs the exits and
releases that make room before the starts that use it, so a start that over-subscribes at the moment
it is logged is a violation.

Every record costs O(1) amortized (per-node counters, a small object per job, no scanning), so a log
of a million records checks in a few seconds.

Beyond safety it checks the policy's promises, each from the log alone and never stricter than the
log can prove (a log that cannot tell, e.g. one written before ``limit_s`` was logged, is not
flagged): ``start_under_notice`` (a start on a node whose reclaim or drain notice is out),
``progress_faster_than_time`` (a run's committed progress beyond the time it has run),
``over_limit`` (a run longer than its ``limit_s`` + ``over_time_limit_s`` + its grace),
``reservation_delayed`` (a start on a reserved head's nodes by a job of no higher priority whose
declared end is past the reserved time, or the reserved time moving later with no capacity lost and
no higher-priority start; every head's last reservation binds until that head starts or leaves,
whichever head was reserved since), ``priority_inversion`` (a job started while one of higher
priority that could use that pool was pending and fitted; a ``backfill`` start is judged against
the reservation its pass logs, and like any other where none is in force) and ``not_work_conserving`` (a pending job that fitted
the free GPUs for longer than a pass). The last two count free GPUs as the scheduler must: bound
GPUs are taken, nodes lost or under notice hold none, a claimant's gang is held back in its pool, a
pending job no higher than the reserved head does not count the reserved nodes, and a job requeued
for a failure or an infrastructure loss may sit out its backoff (:attr:`Rules.max_backoff_s`).
A ``nodes`` or ``gpus_per_node`` that is not a whole number >= 1 is a malformed record
(``illegal_transition``): the job is followed, never counted as pending, and such a start books nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from goodput.sched.core import events as ev

KINDS: tuple[str, ...] = (
    "overcommit",
    "double_booked",
    "released_before_gone",
    "not_all_or_nothing",
    "start_on_lost_node",
    "resume_not_committed",
    "progress_backwards",
    "stale_commit_accepted",
    "illegal_transition",
    "preemption_counted_as_failure",
    "time_backwards",
    "lost_job",
    "start_before_eligible",
    # the policy's promises (docs/SCHED.md, "The checker")
    "start_under_notice",
    "progress_faster_than_time",
    "over_limit",
    "reservation_delayed",
    "priority_inversion",
    "not_work_conserving",
    "claim_dropped",
)
SAFETY_KINDS: tuple[str, ...] = KINDS[:13]  # what no policy may break (a baseline included)
POLICY_KINDS: tuple[str, ...] = KINDS[13:]  # what ours promises; a baseline may break them by design
# what a log whose head is gone (``partial``) cannot prove: each counts the free GPUs, the reservations
# or the victims of a cluster where jobs started before the log began hold GPUs the log never shows
UNJUDGED_IF_PARTIAL: tuple[str, ...] = (
    "reservation_delayed",
    "priority_inversion",
    "not_work_conserving",
    "claim_dropped",
)

EXIT_STATUSES = frozenset({"finished", "preempted", "failed", "killed", "lost"})
EPS = 1e-6  # progress and resume points are floats written by another program

# job phases (ints: the replay loop compares them a million times)
_PENDING = 0  # submitted or requeued: may start
_ACTIVE = 1  # started, processes not yet observed gone (running or preempting)
_AWAIT = 2  # exited: waits for its disposition (requeued, finished, failed, cancelled)
_TERMINAL = 3
_PHASE_NAMES = ("pending", "running", "exited", "terminal")
_INFRA = frozenset({"reclaim", "drain", "node_loss", "cancel", "time_limit"})


@dataclass(frozen=True)
class Rules:
    """What the policy invariants measure against: the cluster's ``limits`` (defaults as the cluster
    JSON's) and the scheduler's timing. ``pass_s``: the longest a correct scheduler waits between
    an input and the pass that acts on it; ``slack_s``: clock tolerance between a live service and
    its jobs."""

    over_time_limit_s: float = 60.0
    max_grace_s: float = 600.0
    max_restart_s: float = 1800.0  # a rerun's hold adds its restart_s, which the log does not carry
    pass_s: float = 1.0
    slack_s: float = 1.0
    max_backoff_s: float = 3600.0

    @classmethod
    def from_limits(cls, limits: Mapping[str, Any] | None, **kw: Any) -> Rules:
        """From the cluster JSON's ``limits`` object (unknown keys ignored, bad values refused)."""
        vals: dict[str, float] = {}
        for key in ("over_time_limit_s", "max_grace_s", "max_restart_s"):
            v = (limits or {}).get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"limits.{key}: expected a number >= 0, got {v!r}")
            vals[key] = float(v)
        return cls(**vals, **kw)


@dataclass
class CheckReport:
    """What the replay found; ``violations`` always lists every kind so reports can be diffed."""

    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: list[str] = field(default_factory=list)
    double_booked_gpu_s: float = 0.0  # over-capacity GPUs x seconds: how much physical sharing
    records: int = 0
    jobs: int = 0
    # a partial log (its head deleted by a live service's event retention): jobs first seen after
    # their submission are not followed (``joined``), and the kinds it cannot prove are not judged
    partial: bool = False
    joined: int = 0
    not_judged: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    def summary(self) -> str:
        """One line for a CLI or a test failure; the examples say where to look."""
        scope = (
            f" (a partial log: {self.joined} jobs first seen after their submission not followed; "
            f"not judged: {', '.join(self.not_judged)})"
            if self.partial
            else ""
        )
        if self.ok:
            return f"ok: {self.records} records, {self.jobs} jobs, no violations{scope}"
        bad = ", ".join(f"{k}={v}" for k, v in self.violations.items() if v)
        extra = f", double_booked_gpu_s={self.double_booked_gpu_s:g}" if self.double_booked_gpu_s else ""
        return f"{self.total} violations in {self.records} records ({bad}{extra}){scope}"


class _Job:
    """The auditor's own view of one job, rebuilt from the log alone."""

    __slots__ = (
        "id",
        "nodes",
        "gpn",
        "phase",
        "epoch",
        "live",
        "where",
        "run_gpn",
        "held",
        "bound_epoch",
        "bound",
        "bound_names",
        "committed",
        "preempted",
        "lost_under",
        "prio",
        "limit_s",
        "grace_s",
        "sub_pools",
        "ran_pools",
        "gkey",
        "claimant",
        "claim_pool",
        "backoff_until",
        "start_t",
        "resume",
        "run_pool",
        "last_exit",
        "pools_seen",
        "preempt_reason",
        "eligible",
        "victims",
        "leaves_for",
        "claim_due",
        "claim_excused",
        "shape_ok",
    )

    def __init__(self, jid: str, nodes: int, gpn: int) -> None:
        self.id = jid
        self.nodes = nodes  # submitted gang shape
        self.gpn = gpn
        self.phase = _PENDING
        self.epoch = 0  # epoch of the latest start
        self.live = False  # processes of ``epoch`` not yet observed gone
        self.where: tuple[str, ...] = ()  # known nodes the live processes occupy
        self.run_gpn = 0  # GPUs per node of the latest start (as logged, which may be wrong)
        self.held = False  # the scheduler still holds GPUs for ``bound_epoch``
        self.bound_epoch = 0
        self.bound: tuple[str, ...] = ()  # known nodes of that binding
        self.bound_names: tuple[str, ...] = ()  # every name it was started on, for the release check
        self.committed = 0.0  # progress of the latest accepted commit: where a restart must resume
        self.preempted = False  # a preempt_requested was seen in the current epoch
        self.lost_under = False  # a node it was running on was lost during the current epoch
        self.prio = 0
        self.limit_s = 0.0  # declared limit (0: not logged or none)
        self.grace_s = -1.0  # declared grace (-1: not logged)
        self.sub_pools: tuple[str, ...] | None = None  # pools the scheduler may use for it, when logged
        self.ran_pools: tuple[str, ...] = ()  # pools it started on: it may use them
        self.gkey: tuple | None = None  # its key among the pending jobs the policy checks track
        self.claimant = False  # it preempted others and waits for them (its gang held back)
        self.claim_pool = ""
        self.backoff_until = -math.inf
        self.start_t = 0.0  # the current run's start
        self.resume = 0.0  # and its resume point
        self.run_pool = ""
        self.last_exit = ""
        self.pools_seen: tuple[str, ...] | None = None  # allowed(): cached until its inputs change
        self.preempt_reason = ""  # why the current run was asked to leave
        self.eligible = -math.inf  # not before this, as its last requeued record said (-inf: not said)
        # a claimant's victims not yet released (kept across a new claim: conservative, never sooner)
        self.victims: dict[str, None] | None = None
        self.leaves_for = ""  # the claimant this run was asked to leave for ("" for none)
        self.claim_due = math.inf  # every victim gone: it must start on its claim by then
        self.claim_excused = False  # a node of its pool was lost or noticed: its claim may be dropped
        self.shape_ok = True  # its submitted (or resized) shape was whole numbers >= 1: the policy checks count it


class _Auditor:
    """The replay state; one instance per check."""

    def __init__(
        self,
        capacity: dict[str, int],
        max_examples: int,
        rules: Rules | None = None,
        pools: Mapping[str, str] | None = None,
        pool_kinds: Mapping[str, str] | None = None,
        partial: bool = False,
    ) -> None:
        self.cap: dict[str, int] = {str(k): int(v) for k, v in capacity.items()}
        # a partial log: what jobs started before it began hold is unknown, so only a lower bound of
        # each node's use is known (an overcommit found is real; free GPUs are not provably free)
        self.partial = partial
        self.unjudged = frozenset(UNJUDGED_IF_PARTIAL if partial else ())
        self.joined: set[str] = set()
        self.hinted = False
        self.bound: dict[str, int] = dict.fromkeys(self.cap, 0)
        self.occ: dict[str, int] = dict.fromkeys(self.cap, 0)
        self.on_node: dict[str, set[str]] = {n: set() for n in self.cap}  # live job ids per node
        self.lost: set[str] = set()
        self.jobs: dict[str, _Job] = {}
        self.report = CheckReport()
        self.counts = self.report.violations
        self.max_examples = max_examples
        self.excess = 0  # sum over nodes of max(0, occupied - capacity), kept incrementally
        # -- the policy's promises
        self.rules = rules or Rules()
        self.window = self.rules.pass_s + self.rules.slack_s
        self.kinds: dict[str, str] = dict(pool_kinds or {})
        self.node_pool: dict[str, str] = {}
        self.eff: dict[str, int] = {}  # node -> free GPUs counted in cnt (lost or under notice: 0)
        self.cnt: dict[str, list[int]] = {}  # pool -> [nodes with at least g free GPUs for g = 0..]
        self.pool_nodes: dict[str, int] = {}
        self.pool_gpn: dict[str, int] = {}
        self.notice: set[str] = set()
        for n, pname in (pools or {}).items():
            if n in self.cap:
                self.learn(n, pname)
        self.groups: dict[tuple, dict[str, None]] = {}  # (gpn, nodes, pools, prio) -> pending jobs
        self.prio_count: dict[int, int] = {}
        self.claimed: dict[str, int] = {}  # pool -> nodes held back for claimants
        self.res: tuple[str, float, str, frozenset[str], int] | None = None  # job, t, pool, nodes, prio
        # every head's latest reservation, kept until that head starts or leaves (the in-force one is
        # ``res``): head -> (reserved_t, pool, nodes, prio, seq when set); and node -> heads reserving it
        self.held_res: dict[str, tuple[float, str, frozenset[str], int, int]] = {}
        self.reserved_on: dict[str, dict[str, None]] = {}
        # heads whose reservation a capacity loss made impossible: the scheduler dropped it unlogged
        self.dropped: set[str] = set()
        # what lets a reservation move later: a sequence number per event, the last capacity loss and,
        # per priority, the last start, preemption or reservation of a job of that priority
        self.seq = 0
        self.cap_seq = -1
        self.prio_seq: dict[int, int] = {}
        # backfilled starts whose priority_inversion waits for the reservation their pass logs at its
        # end: (job, prio, pool, t, the pool's free-node counts then, its claimed nodes then, index
        # into pass_starts, [(group key, a member)] of higher priority that fitted, reservations aside)
        self.deferred: list[tuple[str, int, str, float, list[int], int, int, list[tuple[tuple, str]]]] = []
        self.pass_starts: list[tuple[tuple[str, ...], int]] = []  # starts since the first deferred one
        self.backoffs: list[tuple[float, str]] = []
        self.armed = False
        self.t_inc = -math.inf
        self.backfilled: list[tuple[str, frozenset[str], float, int, float]] = []
        self.claimants: dict[str, None] = {}  # pending jobs holding a claim
        self.leaving: dict[str, float] = {}  # live runs asked to leave -> their deadline_s
        self.claim_dues: list[tuple[float, str]] = []  # (claim_due, claimant): starts that must come
        self.dispatch = {
            ev.SUBMITTED: self.on_submitted,
            ev.STARTED: self.on_started,
            ev.PREEMPT_REQUESTED: self.on_preempt_requested,
            ev.CHECKPOINT_COMMITTED: self.on_checkpoint_committed,
            ev.COMMIT_REJECTED: self.on_commit_rejected,
            ev.EXITED: self.on_exited,
            ev.RELEASED: self.on_released,
            ev.REQUEUED: self.on_requeued,
            ev.FINISHED: self.on_finished,
            ev.FAILED: self.on_failed,
            ev.CANCELLED: self.on_cancelled,
            ev.RESIZED: self.on_resized,
            ev.NODE_LOST: self.on_node_lost,
            ev.NODE_UP: self.on_node_up,
            ev.NODE_RECLAIM_NOTICE: self.on_notice,
            "reserved": self.on_reserved,
        }

    # -- bookkeeping ---------------------------------------------------------------------------

    def flag(self, kind: str, t: float, who: str, msg: str) -> None:
        if kind in self.unjudged:
            return
        self.counts[kind] += 1
        ex = self.report.examples
        if len(ex) < self.max_examples:
            ex.append(f"t={t:g} {who}: {kind}: {msg}")

    def run(self, records: Iterable[dict[str, Any]]) -> CheckReport:
        dispatch = self.dispatch
        last = float("-inf")
        acc = 0.0
        n = 0
        for rec in records:
            n += 1
            try:
                t = float(rec["t"])
                event = rec["event"]
            except (KeyError, TypeError, ValueError) as e:
                self.flag("illegal_transition", last, f"record {n}", f"malformed record ({e!r})")
                continue
            if t < last:
                self.flag("time_backwards", t, _who(rec), f"{event} at t={t:g} after t={last:g}")
            elif t > last:
                if self.excess:
                    acc += self.excess * (t - last)
                last = t
                if self.backfilled or self.deferred:
                    self.flush_backfilled()
                if self.armed or self.backoffs or self.claim_dues:
                    self.until(t)
            handler = dispatch.get(event)
            if handler is None:
                continue  # the schema lets writers add events outside tools do not know
            try:
                handler(rec, t)
            except (KeyError, TypeError, ValueError) as e:
                self.flag("illegal_transition", t, _who(rec), f"malformed {event} record ({e!r})")
        self.flush_backfilled()
        self.report.double_booked_gpu_s = acc
        self.report.records = n
        self.report.jobs = len(self.jobs)
        if self.partial:
            self.report.partial = True
            self.report.joined = len(self.joined)
            self.report.not_judged = UNJUDGED_IF_PARTIAL
        self.finish(last)
        return self.report

    def finish(self, t: float) -> None:
        """A job the scheduler stopped tracking is neither running nor queued: it fell out."""
        for j in self.jobs.values():
            if j.live:
                self.check_limit(j, t, "still running when the log ends")
            if j.phase == _AWAIT:
                self.flag("lost_job", t, f"job {j.id}", f"exited in epoch {j.epoch} but never requeued or ended")
            elif j.phase == _ACTIVE and not j.held:
                self.flag("lost_job", t, f"job {j.id}", f"released in epoch {j.epoch} but never requeued or ended")

    def job(self, rec: dict[str, Any], t: float, event: str) -> _Job | None:
        """The job a record names, or None (flagged) when no lifecycle event may name it now."""
        jid = rec["job"]
        j = self.jobs.get(jid)
        if j is None:
            self.never_submitted(jid, t, event)
            return None
        if j.phase == _TERMINAL:
            self.flag("illegal_transition", t, f"job {jid}", f"{event} after the job ended")
            return None
        return j

    def never_submitted(self, jid: Any, t: float, event: str) -> None:
        """A record of a job the log never submitted: illegal in a whole log; in a partial one, a job
        submitted before the log begins, which is not followed (its state is unknown)."""
        if self.partial:
            self.joined.add(str(jid))
            return
        hint = "" if self.hinted else " (a log whose head is gone? `goodput sched check --partial`)"
        self.hinted = True
        self.flag("illegal_transition", t, f"job {jid}", f"{event} for a job never submitted{hint}")

    def occupy(self, j: _Job, names: tuple[str, ...], gpn: int) -> bool:
        """Put a run's processes on its nodes; True when that over-subscribes one."""
        occ, cap, on_node = self.occ, self.cap, self.on_node
        over = False
        for n in names:
            c = cap[n]
            before = occ[n]
            after = before + gpn
            occ[n] = after
            if after > c:
                over = True
                self.excess += after - c - (before - c if before > c else 0)
            on_node[n].add(j.id)
        j.where = names
        j.live = True
        return over

    def vacate(self, j: _Job) -> None:
        occ, cap, on_node = self.occ, self.cap, self.on_node
        gpn = j.run_gpn
        for n in j.where:
            c = cap[n]
            before = occ[n]
            after = before - gpn
            occ[n] = after
            if before > c:
                self.excess -= before - c - (after - c if after > c else 0)
            on_node[n].discard(j.id)
        j.where = ()
        j.live = False
        if self.leaving:
            self.leaving.pop(j.id, None)

    def bind(self, j: _Job, names: tuple[str, ...], gpn: int, epoch: int) -> bool:
        """Charge the scheduler's own books; True when they exceed a node's capacity."""
        bound, cap = self.bound, self.cap
        over = False
        eff = self.eff
        for n in names:
            b = bound[n] + gpn
            bound[n] = b
            if b > cap[n]:
                over = True
            if n in eff:
                self.refresh(n)
        j.bound = names
        j.bound_epoch = epoch
        j.held = True
        return over

    def unbind(self, j: _Job) -> None:
        bound = self.bound
        gpn = j.run_gpn
        eff = self.eff
        for n in j.bound:
            bound[n] -= gpn
            if n in eff:
                self.refresh(n)
        j.bound = ()
        j.bound_names = ()
        j.held = False

    # -- the policy's promises: free capacity, pending jobs, reservations ---------------------

    def learn(self, node: str, pool: str) -> None:
        """Count ``node`` in ``pool``'s free-capacity index (given, or first seen in a start)."""
        self.node_pool[node] = pool
        c = self.cap[node]
        arr = self.cnt.setdefault(pool, [0])
        if len(arr) <= c:
            arr.extend([0] * (c + 1 - len(arr)))
        self.pool_nodes[pool] = self.pool_nodes.get(pool, 0) + 1
        self.pool_gpn[pool] = max(self.pool_gpn.get(pool, 0), c)
        self.eff[node] = 0
        self.refresh(node)

    def refresh(self, node: str) -> None:
        """Bring ``node``'s free GPUs in its pool's index up to date."""
        old = self.eff[node]
        new = 0 if node in self.lost or node in self.notice else max(0, self.cap[node] - self.bound[node])
        if new == old:
            return
        arr = self.cnt[self.node_pool[node]]
        if new > old:
            for g in range(old + 1, new + 1):
                arr[g] += 1
        else:
            for g in range(new + 1, old + 1):
                arr[g] -= 1
        self.eff[node] = new

    def fits(self, pool: str, gpn: int, nodes: int, exclude_reserved: bool) -> bool:
        """Could a gang of ``nodes`` x ``gpn`` start in ``pool`` on what is free now? Claimants'
        gangs are held back whole; ``exclude_reserved``: the reserved head's nodes are not offered."""
        arr = self.cnt.get(pool)
        if arr is None or not 0 < gpn < len(arr) or nodes < 1:
            return False
        avail = arr[gpn] - self.claimed.get(pool, 0)
        if avail < nodes:
            return False
        res = self.res
        if exclude_reserved and res is not None and res[2] == pool:
            eff = self.eff
            avail -= sum(1 for n in res[3] if eff.get(n, 0) >= gpn)
        return avail >= nodes

    def allowed(self, j: _Job) -> tuple[str, ...] | None:
        """The pools ``j`` may use, as far as the log (and the cluster given) tells; None: unknown."""
        if j.sub_pools is not None:
            return j.sub_pools
        if j.pools_seen is not None:
            return j.pools_seen
        got = set(j.ran_pools)
        if self.kinds:  # every on-demand pool its shape fits is offered to every job
            for p, k in self.kinds.items():
                if k == "on-demand" and self.pool_gpn.get(p, 0) >= j.gpn and self.pool_nodes.get(p, 0) >= j.nodes:
                    got.add(p)
        elif not got and len(self.cnt) == 1:
            got.update(self.cnt)
            return tuple(got)  # not cached: a pool learned later may be another
        j.pools_seen = tuple(sorted(got)) if got else None
        return j.pools_seen

    def mark(self, t: float) -> None:
        """Something that can let a pending job start happened: a pass must follow within the window."""
        self.armed = True
        self.t_inc = t

    def track(self, j: _Job, t: float) -> None:
        """``j`` waits and may start now: count it among the pending jobs the checks look at."""
        if j.gkey is not None or j.phase != _PENDING or j.claimant or j.backoff_until > t or not j.shape_ok:
            return
        pools = self.allowed(j)
        if pools is None:
            return
        key = (j.gpn, j.nodes, pools, j.prio)
        self.groups.setdefault(key, {})[j.id] = None
        self.prio_count[j.prio] = self.prio_count.get(j.prio, 0) + 1
        j.gkey = key
        self.mark(t)

    def untrack(self, j: _Job) -> None:
        key = j.gkey
        if key is None:
            return
        del self.groups[key][j.id]
        left = self.prio_count[j.prio] - 1
        if left:
            self.prio_count[j.prio] = left
        else:
            del self.prio_count[j.prio]  # so that max() over the keys is the highest waiting priority
        j.gkey = None

    def withdraw_claim(self, j: _Job, t: float) -> None:
        if j.claimant:
            j.claimant = False
            self.claimed[j.claim_pool] -= j.nodes
            self.mark(t)
        self.claimants.pop(j.id, None)
        j.claim_due = math.inf

    def excuse_claims(self, node: str) -> None:
        """A node lost or under notice: a claim on it is dropped without a record (its claimant
        goes back to the queue), so no claimant of its pool is held to its claim any more."""
        pool = self.node_pool.get(node)
        for jid in self.claimants:
            c = self.jobs[jid]
            if pool is None or c.claim_pool == pool:
                c.claim_excused = True
                c.claim_due = math.inf

    def clear_reservation(self, jid: str, t: float) -> None:
        """``jid`` started or left: its reservation, in force or remembered, is over."""
        self.dropped.discard(jid)
        if self.res is not None and self.res[0] == jid:
            self.res = None
            self.mark(t)
        if jid in self.held_res:
            self.forget_held(jid)

    def forget_held(self, jid: str) -> None:
        old = self.held_res.pop(jid)
        on = self.reserved_on
        for n in old[2]:
            heads = on.get(n)
            if heads is not None:
                heads.pop(jid, None)
                if not heads:
                    del on[n]

    def bump(self, prio: int | None) -> None:
        """Something that may move a reservation later happened: a capacity loss (``prio`` None),
        or a start, preemption or reservation at ``prio`` (it excuses heads of lower priority)."""
        self.seq += 1
        if prio is None:
            self.cap_seq = self.seq
        else:
            self.prio_seq[prio] = self.seq

    def excused(self, held: tuple[float, str, frozenset[str], int, int], t: float) -> bool:
        """May the head of ``held`` start later than it says? Capacity was lost, or a job of higher
        priority started, preempted or was reserved since it was set, or a run asked to leave is
        still there past its ``deadline_s`` (its kill not answered yet: the plan moves with the clock)."""
        _, _, _, prio, since = held
        if self.cap_seq > since:
            return True
        if any(s > since for q, s in self.prio_seq.items() if q > prio):
            return True
        return any(d < t - EPS for d in self.leaving.values())

    def until(self, t: float) -> None:
        """Everything due before a record at ``t``: backoffs that end, and passes that must have run."""
        while True:
            due_bo = self.backoffs[0][0] if self.backoffs else math.inf
            due_pass = self.t_inc + self.window if self.armed else math.inf
            due_claim = self.claim_dues[0][0] if self.claim_dues else math.inf
            if min(due_bo, due_pass, due_claim) >= t:
                return
            if due_claim < min(due_bo, due_pass):
                due, jid = heapq.heappop(self.claim_dues)
                c = self.jobs.get(jid)
                if c is not None and c.claimant and c.phase == _PENDING and c.claim_due == due:
                    self.flag(
                        "claim_dropped",
                        due,
                        f"job {jid}",
                        f"its victims were gone by t={due - self.window:g}, and it neither started on its claim "
                        "nor withdrew it within a pass",
                    )
                continue
            if due_pass <= due_bo:
                self.armed = False
                self.work_conserved(due_pass)
            else:
                until, jid = heapq.heappop(self.backoffs)
                j = self.jobs.get(jid)
                if j is not None and j.backoff_until == until:
                    self.track(j, until)

    def fitting(self, pool_filter: str | None, above: int | None) -> tuple[str, tuple] | None:
        """A pending job that fits the free GPUs now (in ``pool_filter``, of priority above ``above``)."""
        res = self.res
        head = self.jobs.get(res[0]) if res is not None else None
        for key, members in self.groups.items():
            if not members:
                continue
            gpn, nodes, pools, prio = key
            if above is not None and prio <= above:
                continue
            excl = res is not None and prio <= res[4]
            for p in pools:
                if pool_filter is not None and p != pool_filter:
                    continue
                if self.fits(p, gpn, nodes, excl):
                    return next(iter(members)), (p, gpn, nodes, prio)
                if excl and head is not None and head.gkey == key and self.fits(p, gpn, nodes, False):
                    return head.id, (p, gpn, nodes, prio)
        return None

    def work_conserved(self, t: float) -> None:
        got = self.fitting(None, None)
        if got is not None:
            jid, (p, gpn, nodes, prio) = got
            self.flag(
                "not_work_conserving",
                t,
                f"job {jid}",
                f"pending ({nodes} x {gpn} GPUs, priority {prio}) while free GPUs in pool {p} fitted it "
                f"from t={self.t_inc:g} past the next pass",
            )

    def check_limit(self, j: _Job, t: float, how: str) -> None:
        r = self.rules
        if j.limit_s <= 0 or not math.isfinite(r.over_time_limit_s):
            return
        grace = j.grace_s if j.grace_s >= 0 else r.max_grace_s
        # a run's hold is its declared limit, restart (on a rerun) + limit_s - committed progress:
        # a first run's is limit_s; a rerun's restart_s is not logged, so the cluster's cap stands in
        if j.epoch > 1:
            hold = r.max_restart_s + max(0.0, j.limit_s - j.resume)
            what = f"max_restart_s {r.max_restart_s:g} + limit_s {j.limit_s:g} - resume_from_s {j.resume:g}"
        else:
            hold = j.limit_s
            what = f"limit_s {j.limit_s:g}"
        allowed = hold + r.over_time_limit_s + grace
        if t - j.start_t > allowed + r.slack_s:
            self.flag(
                "over_limit",
                t,
                f"job {j.id}",
                f"epoch {j.epoch} ran {t - j.start_t:g} s ({how}), more than {what} + "
                f"over_time_limit_s {r.over_time_limit_s:g} + grace {grace:g}",
            )

    def check_backfill(self, start: tuple[str, frozenset[str], float, int, float], res: tuple | None) -> None:
        """A start on a reserved head's nodes by a job of no higher priority must end, by its
        declaration, no later than the reserved time: the head's in force (``res``), and that of
        every other head still pending whose reservation nothing has let move later since."""
        jid, nodes, end, prio, t = start
        # a backfilled run asked to leave later in its own pass (a claim evicted it) ends by its
        # deadline: the pass's reservation, planned after that, counts it so
        end = min(end, self.leaving.get(jid, math.inf))
        if (
            res is not None
            and res[0] != jid
            and prio <= res[4]
            and end > res[1] + EPS
            and not res[3].isdisjoint(nodes)
            and res[0] not in self.dropped
            and not self.leaves_room(res[0], jid, nodes & res[3], end, res[1])
        ):
            self.flag(
                "reservation_delayed",
                t,
                f"job {jid}",
                f"started on nodes reserved for job {res[0]} at t={res[1]:g} with a declared end at t={end:g}",
            )
            return
        # the reservations of other heads still pending bind too, until something lets them move
        on = self.reserved_on
        if not on:
            return
        for n in nodes:
            for hid in on.get(n, ()):
                if hid == jid or (res is not None and hid == res[0]):
                    continue
                held = self.held_res[hid]
                if (
                    prio <= held[3]
                    and end > held[0] + EPS
                    and not self.excused(held, t)
                    and not self.leaves_room(hid, jid, frozenset((n,)), end, held[0])
                ):
                    self.flag(
                        "reservation_delayed",
                        t,
                        f"job {jid}",
                        f"started on node {n}, reserved for job {hid} (still pending) at t={held[0]:g}, "
                        f"with a declared end at t={end:g}",
                    )
                    return

    def leaves_room(self, head_id: str, jid: str, nodes: frozenset[str], end: float, rt: float) -> bool:
        """Does the head still fit each of these reserved nodes at its reserved time ``rt``, beside
        every job declared to hold GPUs there past it (``jid``, ending at ``end``, included)? Then
        the start delays nothing. The scheduler keeps a long backfill off reserved nodes whole, but
        a reservation a claim moves earlier in the same pass (``_earlier_after_claim``) may land on
        a node where such a job started around the earlier plan: a head of 2 x 1 GPU reserved
        beside a 4-GPU job on an 8-GPU node was flagged."""
        head = self.jobs.get(head_id)
        me = self.jobs.get(jid)
        if head is None or me is None or not isinstance(head.gpn, int) or not isinstance(me.gpn, int):
            return False
        jobs, leaving = self.jobs, self.leaving
        for n in nodes:
            busy = me.gpn if end > rt + EPS else 0  # its shape: judged at its start, before its run is booked
            for k in self.on_node.get(n, ()):
                if k == jid:
                    continue
                o = jobs[k]
                if not isinstance(o.run_gpn, int):
                    return False
                e = o.start_t + max(0.0, o.limit_s - o.resume) if o.limit_s > 0 else math.inf
                if min(e, leaving.get(k, math.inf)) > rt + EPS:
                    busy += o.run_gpn
            if self.cap.get(n, 0) - busy < head.gpn:
                return False
        return True

    def note_unplaceable(self) -> None:
        """Capacity was lost: if the reserved head in force can no longer start anywhere in its
        pool, the scheduler drops its reservation without a record (it plans no time for a gang
        the pool cannot hold, and cannot know when a node returns), and with it the head's place:
        its last ``reserved`` binds no start until a new one is logged for it. Without this, a
        start on the one node left after the other was lost was flagged as delaying a two-node head
        that could not start at all (and, once the node was back, a job that went first by fair
        share while that head held no reservation)."""
        res = self.res
        if res is not None and self.unplaceable(res):
            self.dropped.add(res[0])

    def unplaceable(self, res: tuple[str, float, str, frozenset[str], int]) -> bool:
        """Has the reserved head lost the capacity it could ever start on? Fewer nodes of its pool
        big enough for its gang are left up and without a notice."""
        head = self.jobs.get(res[0])
        if head is None or head.phase != _PENDING or not isinstance(head.nodes, int) or not isinstance(head.gpn, int):
            return False
        pool, gpn = res[2], head.gpn
        usable = 0
        # the reserved nodes are the pool's even where no start has named them yet
        for n in res[3] | {n for n, p in self.node_pool.items() if p == pool}:
            if n not in self.lost and n not in self.notice and self.cap.get(n, 0) >= gpn:
                usable += 1
                if usable >= head.nodes:
                    return False
        return True

    def flush_backfilled(self) -> None:
        """The pass is over (its reservation logged, or the clock moved): judge its backfilled starts."""
        for start in self.backfilled:
            self.check_backfill(start, self.res)
        self.backfilled.clear()
        if self.deferred:
            self.judge_deferred()

    def defer_inversion(self, j: _Job, pool: str, t: float) -> None:
        """A ``backfill`` start: the jobs of higher priority that fitted its pool's free GPUs now,
        reservations aside, kept with the pool's free counts to be judged once the pass's
        reservation is known (a start with none in force is judged like any other)."""
        cands: list[tuple[tuple, str]] = []
        for key, members in self.groups.items():
            if members and key[3] > j.prio and pool in key[2] and self.fits(pool, key[0], key[1], False):
                cands.append((key, next(iter(members))))
        if cands:
            arr = self.cnt[pool]
            self.deferred.append(
                (j.id, j.prio, pool, t, list(arr), self.claimed.get(pool, 0), len(self.pass_starts), cands)
            )

    def judge_deferred(self) -> None:
        """Each deferred start against the reservation in force now: a pending job of higher priority
        no higher than the head's was not offered the reserved nodes (as they were at that start:
        the starts logged since give their GPUs back); any other that fitted is an inversion."""
        res = self.res
        cap, bound, eff, lost, notice = self.cap, self.bound, self.eff, self.lost, self.notice
        rnodes = [n for n in res[3] if n in eff] if res is not None else []
        added = dict.fromkeys(rnodes, 0)
        head = self.jobs.get(res[0]) if res is not None else None
        starts = self.pass_starts
        k = len(starts)
        for jid, prio, pool, t, arr, claimed, idx, cands in reversed(self.deferred):
            while k > idx:
                k -= 1
                names, g = starts[k]
                for n in names:
                    if n in added:
                        added[n] += g
            for key, member in cands:
                gpn, nodes, _, kprio = key
                who = member
                if res is not None and res[2] == pool and kprio <= res[4]:
                    taken = 0
                    for n in rnodes:
                        free = 0 if n in lost or n in notice else cap[n] - bound[n] + added[n]
                        if free >= gpn and self.node_pool.get(n) == pool:
                            taken += 1
                    if arr[gpn] - claimed - taken < nodes:
                        if head is None or head.gkey != key:
                            continue
                        who = head.id  # the head itself is offered its reserved nodes
                how = "no reservation in force" if res is None else f"around job {res[0]}'s reservation"
                self.flag(
                    "priority_inversion",
                    t,
                    f"job {jid}",
                    f"started (backfill, {how}) at priority {prio} in pool {pool} while job {who} "
                    f"({nodes} x {gpn} GPUs, priority {kprio}) was pending and fitted there",
                )
                break
        self.deferred.clear()
        self.pass_starts.clear()

    def on_notice(self, rec: dict[str, Any], t: float) -> None:
        """A reclaim or drain notice: no start may use the node until it is lost or back up."""
        node = rec["node"]
        if node in self.cap:
            self.notice.add(node)
            if node in self.eff:
                self.refresh(node)
        self.bump(None)  # capacity is going: a reservation may move later
        self.note_unplaceable()
        self.excuse_claims(node)

    def on_reserved(self, rec: dict[str, Any], t: float) -> None:
        """The head's reservation: set, or moved. It may move later only when capacity was lost or
        a job of higher priority went first since it was set."""
        jid = rec["job"]
        j = self.jobs.get(jid)
        rt = float(rec["reserved_t"])
        held = self.held_res.get(jid)
        # compared with the head's own last reservation, however many other heads were reserved since
        if held is not None and rt > held[0] + EPS and not self.excused(held, t):
            self.flag("reservation_delayed", t, f"job {jid}", f"reserved start moved later, t={held[0]:g} -> t={rt:g}")
        pool = str(rec.get("pool") or (self.node_pool.get(rec["nodes"][0], "") if rec["nodes"] else ""))
        nodes = frozenset(rec["nodes"])
        prio = j.prio if j is not None else 0
        self.res = (jid, rt, pool, nodes, prio)
        self.dropped.discard(jid)
        if held is not None:
            self.forget_held(jid)
        if j is not None and j.phase == _PENDING:
            self.held_res[jid] = (rt, pool, nodes, prio, self.seq)
            on = self.reserved_on
            for n in nodes:
                on.setdefault(n, {})[jid] = None
        self.bump(prio)  # a head of lower priority may wait longer behind this one
        self.flush_backfilled()  # the pass's backfilled starts, against the reservation it made
        self.mark(t)

    # -- job events ----------------------------------------------------------------------------

    def shape(self, rec: dict[str, Any], t: float, who: str, event: str) -> tuple[int, int]:
        """A record's gang shape; a field that is not a whole number >= 1 is flagged (malformed) and
        reads as 0, which no start matches and the policy checks never count."""
        out = []
        for key in ("nodes", "gpus_per_node"):
            v = _count(rec[key])
            if v == 0:
                self.flag(
                    "illegal_transition",
                    t,
                    who,
                    f"malformed {event} record: {key} {rec[key]!r} (expected a whole number >= 1)",
                )
            out.append(v)
        return out[0], out[1]

    def on_submitted(self, rec: dict[str, Any], t: float) -> None:
        jid = rec["job"]
        if jid in self.jobs:
            self.flag("illegal_transition", t, f"job {jid}", "submitted twice")
            return
        nodes, gpn = self.shape(rec, t, f"job {jid}", "submitted")
        j = self.jobs[jid] = _Job(jid, nodes, gpn)
        j.shape_ok = nodes > 0 and gpn > 0
        j.prio = int(rec.get("priority", 0))
        lim = rec.get("limit_s")
        j.limit_s = float(lim) if _num(lim) and lim > 0 else 0.0
        g = rec.get("grace_s")
        j.grace_s = float(g) if _num(g) and g >= 0 else -1.0
        if isinstance(rec.get("pools"), list):
            j.sub_pools = tuple(sorted(str(p) for p in rec["pools"]))
        self.track(j, t)

    def on_resized(self, rec: dict[str, Any], t: float) -> None:
        """A pending job's shape changes for its next run; its starts are checked against it."""
        j = self.job(rec, t, "resized")
        if j is None:
            return
        if j.phase != _PENDING or j.held:
            self.flag("illegal_transition", t, f"job {j.id}", "resized while not pending")
            return
        self.untrack(j)
        self.withdraw_claim(j, t)  # a resize withdraws a claim; its victims stay where they are
        self.clear_reservation(j.id, t)
        nodes, gpn = self.shape(rec, t, f"job {j.id}", "resized")
        j.nodes, j.gpn = nodes, gpn
        j.shape_ok = nodes > 0 and gpn > 0
        j.pools_seen = None
        if isinstance(rec.get("pools"), list):
            j.sub_pools = tuple(sorted(str(p) for p in rec["pools"]))
        self.track(j, t)

    def on_started(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "started")
        if j is None:
            return
        epoch = int(rec["epoch"])
        names = tuple(rec["nodes"])
        gpn = _count(rec["gpus_per_node"])
        resume = float(rec["resume_from_s"])
        who = f"job {j.id}"
        if not gpn:  # followed, but it books nothing: a GPU count below 1 may not offset another job's
            self.flag(
                "illegal_transition",
                t,
                who,
                f"malformed started record: gpus_per_node {rec['gpus_per_node']!r} (expected a whole number >= 1)",
            )
        # at most one illegal_transition per start: the causes below are one mistake seen twice
        if j.phase != _PENDING:
            self.flag("illegal_transition", t, who, f"started while {_PHASE_NAMES[j.phase]} (epoch {j.epoch})")
        elif epoch != j.epoch + 1:
            self.flag("illegal_transition", t, who, f"started epoch {epoch} after epoch {j.epoch}")
        elif j.held:
            self.flag("illegal_transition", t, who, f"started while epoch {j.bound_epoch} was never released")
        if j.eligible > t + EPS:
            self.flag("start_before_eligible", t, who, f"started before t={j.eligible:g}, when its requeue said it may")
        j.eligible = -math.inf
        # the previous run is replaced so that one mistake does not cascade into every later check
        if j.live:
            self.vacate(j)
        if j.held:
            self.unbind(j)
        cap = self.cap
        if (
            len(set(names)) != len(names)
            or any(n not in cap for n in names)
            or (j.shape_ok and gpn and (len(names) != j.nodes or gpn != j.gpn))
        ):
            unknown = [n for n in names if n not in cap]
            self.flag(
                "not_all_or_nothing",
                t,
                who,
                f"started on {list(names)} x {gpn} GPUs, submitted {j.nodes} nodes x {j.gpn} GPUs"
                + (
                    f"; {unknown[:3]} not in the cluster checked against (is --cluster / --nodes the cluster "
                    "that wrote this log?)"
                    if unknown
                    else ""
                ),
            )
        lost = self.lost
        if lost and any(n in lost for n in names):
            self.flag("start_on_lost_node", t, who, f"started on lost node(s) {[n for n in names if n in lost]}")
        if abs(resume - j.committed) > EPS:
            self.flag(
                "resume_not_committed", t, who, f"resumes from {resume:g}, last committed progress {j.committed:g}"
            )
        if not gpn:
            known: tuple[str, ...] = ()  # malformed (flagged above): nothing is booked
        else:
            known = names if all(n in cap for n in names) else tuple(n for n in names if n in cap)
        self.policy_on_start(j, rec, t, known, gpn, resume)
        # as logged, so that its release (which books nothing back for a malformed start) compares alike
        j.run_gpn = gpn or rec["gpus_per_node"]
        if self.bind(j, known, gpn, epoch):
            hot = [n for n in known if self.bound[n] > cap[n]]
            self.flag("overcommit", t, who, f"scheduler bound more GPUs than exist on {hot}")
        if self.occupy(j, known, gpn):
            hot = [n for n in known if self.occ[n] > cap[n]]
            self.flag("double_booked", t, who, f"started on {hot} while earlier processes still hold their GPUs")
        j.bound_names = names
        j.phase = _ACTIVE
        j.epoch = epoch
        j.preempted = False
        j.lost_under = False

    def policy_on_start(
        self, j: _Job, rec: dict[str, Any], t: float, known: tuple[str, ...], gpn: int, resume: float
    ) -> None:
        """The policy checks of a start, on the state just before it binds its GPUs."""
        if j.gkey is not None:
            self.untrack(j)
        pool = str(rec.get("pool", ""))
        if pool:
            node_pool = self.node_pool
            for n in known:
                if n not in node_pool:
                    self.learn(n, pool)
            if pool not in j.ran_pools:
                j.ran_pools += (pool,)
                j.pools_seen = None
        if self.notice:
            noticed = [n for n in known if n in self.notice]
            if noticed:
                self.flag(
                    "start_under_notice",
                    t,
                    f"job {j.id}",
                    f"started on {noticed}, whose reclaim or drain notice is out",
                )
        backfill = bool(rec.get("backfill"))
        res = self.res
        if j.limit_s > 0 and (backfill or res is not None or self.reserved_on):
            start = (j.id, frozenset(known), t + max(0.0, j.limit_s - resume), j.prio, t)
            if backfill:  # the pass's reservation is logged at the pass's end: checked against it then
                self.backfilled.append(start)
            else:
                self.check_backfill(start, res)
        self.bump(j.prio)  # a higher priority goes first: a head of lower priority may wait longer
        if j.claimant:  # it starts on what it claimed: its own victims' nodes
            self.withdraw_claim(j, t)
        elif backfill:
            # backfill's rule: judged against the reservation its pass logs at the pass's end (a job
            # of higher priority no higher than the head's is not offered the reserved nodes); with
            # no reservation in force, like any other start
            if self.prio_count and max(self.prio_count) > j.prio:
                self.defer_inversion(j, pool, t)
        elif self.prio_count and max(self.prio_count) > j.prio:
            got = self.fitting(pool, j.prio)
            if got is not None:
                hid, (_, hg, hn, hp) = got
                self.flag(
                    "priority_inversion",
                    t,
                    f"job {j.id}",
                    f"started at priority {j.prio} in pool {pool} while job {hid} ({hn} x {hg} GPUs, priority {hp}) "
                    "was pending and fitted there",
                )
        self.clear_reservation(j.id, t)
        if self.deferred:
            self.pass_starts.append((known, gpn))
        j.start_t = t
        j.resume = resume
        j.run_pool = pool
        j.backoff_until = -math.inf

    def on_preempt_requested(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "preempt_requested")
        if j is None:
            return
        epoch = int(rec["epoch"])
        if j.phase != _ACTIVE or epoch != j.epoch:
            self.flag(
                "illegal_transition",
                t,
                f"job {j.id}",
                f"preempt_requested for epoch {epoch} while {_PHASE_NAMES[j.phase]} in epoch {j.epoch}",
            )
            return
        j.preempted = True
        d = rec.get("deadline_s")
        if _num(d):
            self.leaving[j.id] = float(d)
        r = rec.get("reason")
        j.preempt_reason = r if isinstance(r, str) else ("" if rec.get("victim_of") not in _INFRA else rec["victim_of"])
        if "preemptor" in rec:
            pid = rec["preemptor"]
        else:
            v = rec.get("victim_of")
            pid = v if v not in _INFRA else None
        p = self.jobs.get(pid) if isinstance(pid, str) else None
        if p is not None and p.phase == _PENDING:
            if not p.claimant or p.claim_pool != j.run_pool:
                if p.claimant:  # its claim was dropped (a node of it went) and it claims in another pool now
                    self.claimed[p.claim_pool] -= p.nodes
                p.claimant = True
                p.claim_pool = j.run_pool
                self.claimed[j.run_pool] = self.claimed.get(j.run_pool, 0) + p.nodes
                self.untrack(p)
                self.clear_reservation(p.id, t)
            if p.claim_excused:  # a claimant that evicts again had its claim dropped: this is a new one
                p.claim_excused = False
            self.claimants[p.id] = None
            if p.victims is None:
                p.victims = {}
            p.victims[j.id] = None
            p.claim_due = math.inf
            j.leaves_for = p.id
        if p is not None:
            self.bump(p.prio)  # a higher priority goes first: a head of lower priority may wait longer

    def on_checkpoint_committed(self, rec: dict[str, Any], t: float) -> None:
        jid = rec["job"]
        j = self.jobs.get(jid)
        if j is None:
            self.never_submitted(jid, t, "checkpoint_committed")
            return
        epoch = rec.get("epoch")
        progress = float(rec["progress_s"])
        who = f"job {jid}"
        if j.phase != _ACTIVE or epoch != j.epoch:
            self.flag(
                "stale_commit_accepted",
                t,
                who,
                f"accepted a commit of epoch {epoch} while {_PHASE_NAMES[j.phase]} in epoch {j.epoch}",
            )
        if progress < j.committed - EPS:
            self.flag("progress_backwards", t, who, f"committed progress {progress:g} below {j.committed:g}")
        elif (
            j.phase == _ACTIVE
            and epoch == j.epoch
            and j.start_t <= t < j.start_t + progress - j.resume - self.rules.slack_s - EPS
        ):
            self.flag(
                "progress_faster_than_time",
                t,
                who,
                f"committed {progress - j.resume:g} s of progress after {t - j.start_t:g} s of running (epoch {epoch})",
            )
        # the scheduler accepted it, so it is where a restart must resume, right or wrong
        j.committed = progress

    def on_commit_rejected(self, rec: dict[str, Any], t: float) -> None:
        """A rejection changes nothing and may name a stale or foreign run, so it is never checked."""

    def on_exited(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "exited")
        if j is None:
            return
        epoch = int(rec["epoch"])
        status = rec["status"]
        who = f"job {j.id}"
        if status not in EXIT_STATUSES:
            self.flag("illegal_transition", t, who, f"exited with unknown status {status!r}")
            return
        if not (j.live and epoch == j.epoch):
            self.flag("illegal_transition", t, who, f"exited epoch {epoch} while not running (epoch {j.epoch})")
            return
        self.vacate(j)
        j.last_exit = status
        self.check_limit(j, t, f"exited {status}")
        if j.phase == _ACTIVE:
            j.phase = _AWAIT
        # else a disposition came before the exit; it was flagged when it came

    def on_released(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "released")
        if j is None:
            return
        epoch = int(rec["epoch"])
        who = f"job {j.id}"
        if not j.held or epoch != j.bound_epoch:
            self.flag("illegal_transition", t, who, f"released epoch {epoch} which holds no GPUs")
            return
        if j.live and j.epoch == epoch:
            self.flag("released_before_gone", t, who, f"released epoch {epoch} before its processes exited")
        names = rec["nodes"]
        gpus = int(rec["gpus"])
        if sorted(names) != sorted(j.bound_names) or gpus != len(j.bound_names) * j.run_gpn:
            self.flag(
                "illegal_transition",
                t,
                who,
                f"released {gpus} GPUs on {list(names)}, bound {len(j.bound_names) * j.run_gpn} on {list(j.bound_names)}",
            )
        self.unbind(j)
        self.mark(t)
        if j.leaves_for:  # a victim gone: once the last is, its claimant must start within a pass
            p = self.jobs.get(j.leaves_for)
            j.leaves_for = ""
            if p is not None and p.claimant and p.victims and j.id in p.victims:
                del p.victims[j.id]
                if not p.victims and not p.claim_excused:
                    p.claim_due = t + self.window
                    heapq.heappush(self.claim_dues, (p.claim_due, p.id))

    def dispose(self, j: _Job, t: float, event: str, failure: bool) -> None:
        """The checks every end of a run shares: the processes must be gone first."""
        who = f"job {j.id}"
        if j.phase != _AWAIT:
            self.flag(
                "illegal_transition", t, who, f"{event} while {_PHASE_NAMES[j.phase]} (no exit of epoch {j.epoch})"
            )
        if failure and (j.preempted or j.lost_under):
            why = "it was asked to leave" if j.preempted else "a node under it was lost"
            self.flag("preemption_counted_as_failure", t, who, f"{event} as a failure though {why}")
        j.preempted = False
        j.lost_under = False
        j.preempt_reason = ""

    def on_requeued(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "requeued")
        if j is None:
            return
        reason = rec["reason"]
        who = f"job {j.id}"
        if reason not in ev.REQUEUE_REASONS:
            self.flag("illegal_transition", t, who, f"requeued with unknown reason {reason!r}")
            return
        self.dispose(j, t, f"requeued ({reason})", reason == "failure")
        resume = rec.get("resume_from_s")
        if resume is not None and abs(float(resume) - j.committed) > EPS:
            self.flag(
                "resume_not_committed",
                t,
                who,
                f"requeued to resume from {float(resume):g}, last committed progress {j.committed:g}",
            )
        j.phase = _PENDING
        eligible = rec.get("eligible_s")
        if _num(eligible):
            j.backoff_until = float(eligible)
            j.eligible = float(eligible)
        elif reason != "preempted" or j.last_exit == "failed":
            j.backoff_until = t + self.rules.max_backoff_s  # it may sit out a backoff the log does not state
        if j.backoff_until > t:
            heapq.heappush(self.backoffs, (j.backoff_until, j.id))
        self.track(j, t)

    def end(self, j: _Job, t: float, event: str, flagged: bool) -> None:
        """A terminal job must not hold GPUs: no release may legally follow its end."""
        if j.held and not flagged:
            self.flag("illegal_transition", t, f"job {j.id}", f"{event} while epoch {j.bound_epoch} was never released")
        if j.live:
            self.vacate(j)  # it was flagged; forget it rather than double-book forever
        if j.held:
            self.unbind(j)
        j.phase = _TERMINAL
        self.untrack(j)
        self.withdraw_claim(j, t)
        self.clear_reservation(j.id, t)

    def on_finished(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "finished")
        if j is None:
            return
        flagged = j.phase != _AWAIT
        self.dispose(j, t, "finished", False)
        self.end(j, t, "finished", flagged)

    def on_failed(self, rec: dict[str, Any], t: float) -> None:
        j = self.job(rec, t, "failed")
        if j is None:
            return
        flagged = j.phase != _AWAIT
        # a run stopped at its time limit ends failed (Slurm's TIMEOUT), and a job whose
        # infrastructure budget is spent ends failed for it: neither is its own failure
        reason = rec.get("reason")
        ok = (reason == "time_limit" and j.preempt_reason == "time_limit") or (
            reason == "infrastructure" and (j.preempted or j.lost_under)
        )
        self.dispose(j, t, f"failed ({reason})" if reason else "failed", not ok)
        self.end(j, t, "failed", flagged)

    def on_cancelled(self, rec: dict[str, Any], t: float) -> None:
        """Cancelling a queued or exited job is fine; a running one must leave (and exit) first."""
        j = self.job(rec, t, "cancelled")
        if j is None:
            return
        flagged = j.live or j.phase == _ACTIVE
        if flagged:
            self.flag("illegal_transition", t, f"job {j.id}", f"cancelled while running (epoch {j.epoch} not exited)")
        self.end(j, t, "cancelled", flagged)

    # -- node events ---------------------------------------------------------------------------

    def on_node_lost(self, rec: dict[str, Any], t: float) -> None:
        node = rec["node"]
        self.lost.add(node)
        self.notice.discard(node)
        if node in self.eff:
            self.refresh(node)
        self.bump(None)
        self.note_unplaceable()
        self.excuse_claims(node)
        jobs = self.jobs
        for jid in self.on_node.get(node, ()):
            jobs[jid].lost_under = True

    def on_node_up(self, rec: dict[str, Any], t: float) -> None:
        node = rec["node"]
        self.lost.discard(node)
        self.notice.discard(node)
        if node in self.eff:
            self.refresh(node)
        self.mark(t)


def _num(v: Any) -> bool:
    """A finite number as JSON carries one (a bool is not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> int:
    """A count of nodes or GPUs as JSON carries one (an int, or a whole float) when >= 1, else 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 1:
        return 0
    return int(v)


def _who(rec: dict[str, Any]) -> str:
    if "job" in rec:
        return f"job {rec['job']}"
    if "node" in rec:
        return f"node {rec['node']}"
    return "record"


def check(
    records: Iterable[dict[str, Any]],
    capacity: dict[str, int],
    *,
    max_examples: int = 20,
    rules: Rules | None = None,
    pools: Mapping[str, str] | None = None,
    pool_kinds: Mapping[str, str] | None = None,
    partial: bool = False,
) -> CheckReport:
    """Replay ``records`` (log order) against ``capacity`` (node name -> GPUs) and count violations.

    ``pools`` (node -> pool) and ``pool_kinds`` (pool -> "on-demand" | "spot") let the policy checks
    count every free node from the start and know that every job may use an on-demand pool its shape
    fits; without them a node counts once a start names its pool, and a job may use the pools it
    started on (or the only pool). ``partial``: the log's head is gone (a live service's event
    retention deleted it): a job first seen after its submission is not followed, and
    :data:`UNJUDGED_IF_PARTIAL` is not judged; the rest holds, on what the log shows."""
    return _Auditor(capacity, max_examples, rules, pools, pool_kinds, partial).run(records)


def check_file(
    path: str | Path,
    capacity: dict[str, int],
    *,
    max_examples: int = 20,
    rules: Rules | None = None,
    pools: Mapping[str, str] | None = None,
    pool_kinds: Mapping[str, str] | None = None,
    partial: bool = False,
) -> CheckReport:
    """Check a JSONL event log as the scheduler or a live service wrote it."""
    return check(
        ev.read_jsonl(path),
        capacity,
        max_examples=max_examples,
        rules=rules,
        pools=pools,
        pool_kinds=pool_kinds,
        partial=partial,
    )
