"""The scheduler's records and indices: what every other part of it reads and keeps exact.

Construction, persistence (each input's changes and events in one store transaction), the pending
queue's classes and the per-pool indices of running jobs, their declared ends and timers, and the
victim order (each running job priced as a victim, cheapest per GPU first). The parts above
(:mod:`.claims`, :mod:`.reservations`, :mod:`.preemption`, :mod:`.scheduler`) each subclass the one
below it, so that one object holds the state and the code reads in layers without import circles.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from sortedcontainers import SortedList

from . import events as ev
from .capacity import Capacity
from .eviction import Candidate, VictimOrder
from .executor import Clock, Executor
from .governance import Governance
from .model import TERMINAL, Health, Job, JobState, Node, Pool, Tenant
from .placement import pools_for
from .policy import Policy
from .queue import Class, PendingQueue
from .transitions import apply

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


class SchedulerState:
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
        self._ends: dict[str, SortedList] = {p: SortedList() for p in self.cap.pools}  # (end, seq, id)
        self._end_of: dict[str, tuple[str, float]] = {}
        self._running: dict[str, dict[int, dict[str, None]]] = {p: {} for p in self.cap.pools}
        self._held: dict[str, dict[int, int]] = {p: {} for p in self.cap.pools}
        self._claimants: dict[str, None] = {}
        self._leaving: dict[str, int] = {}  # tenant -> GPUs of its jobs asked to leave, not yet gone
        self._order = VictimOrder(self.policy.victims)  # running jobs as victim searches draw them
        self._priorities: set[int] = set()  # every job priority seen: the thresholds of cap.reachable
        # (when, what, seq, id, epoch): equal instants fire in submission order, never by name
        self._timers: list[tuple[float, str, int, str, int]] = []
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
        # heads displaced by a head of higher priority, the latest last: one holds again once the
        # heads above it no longer wait (reservations.py, _note_reservation)
        self._displaced: list[str] = []
        self._plan_on_clock = False  # the last plan depended on the clock alone (see _reserve)
        self._plan_until = math.inf  # and the clock past this makes it stale (see _reserve)
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
        # (job, self._mutations) of the last move search that found nothing: not repeated before a
        # start, release, claim or notice could change its answer
        self._move_failed: tuple[str, int] | None = None
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
            (jid, freed, gen), r, until = rc
            cache = {
                "job": jid,
                "freed": list(freed),
                "gen": gen,
                "until": until,
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
            "displaced": list(self._displaced),
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
        self._displaced = [str(j) for j in meta.get("displaced") or ()]
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
            until = cache.get("until")
            # a plan stored without the time it holds until may be stale: planned again instead
            if isinstance(until, (int, float)) and not isinstance(until, bool):
                self._reservation_cache = (key, res, float(until))

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
        return job.backfill_limit(self.gov.limits.max_restart_s) + self._margin(job)

    def _margin(self, job: Job) -> float:
        lim = self.gov.limits
        if not math.isfinite(lim.over_time_limit_s) or job.limit_s <= 0:
            return 0.0
        return lim.over_time_limit_s + self._grace(job)

    def _grace(self, job: Job) -> float:
        """The notice this job gets: its declared grace within the cluster's cap, which binds a job
        accepted before the operator lowered it too (a queued grace of a day must not hold a
        preemptor for a day once the cap says 60 s)."""
        return min(job.ckpt.grace_s, self.gov.limits.max_grace_s)

    def _restart(self, job: Job) -> float:
        """The resume cost priced for this job: its declaration within the cluster's cap (a
        declared day would make it never the cheapest victim)."""
        return min(job.ckpt.restart_s, self.gov.limits.max_restart_s)

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
            self._ends[old[0]].discard((old[1], job.seq, job.id))
        if end is not None:
            self._ends[job.pool].add((end, job.seq, job.id))
            self._end_of[job.id] = (job.pool, end)

    def _drop_end(self, job: Job) -> None:
        old = self._end_of.pop(job.id, None)
        if old is not None:
            self._ends[old[0]].discard((old[1], job.seq, job.id))

    def _tenant(self, name: str) -> Tenant:
        t = self.tenants.get(name)
        if t is None:
            spec = self.gov.tenant(name)
            t = self.tenants[name] = Tenant(name, weight=spec.weight, quota_gpus=spec.quota_gpus or 0)
            self._touched_tenants.add(name)
        return t

    def _timer(self, t: float, kind: str, job: Job) -> None:
        heapq.heappush(self._timers, (t, kind, job.seq, job.id, job.epoch))

    # ------------------------------------------------------------------ inputs

    def _move(self, job: Job, trigger: str, substate: str = "") -> None:
        apply(job, trigger, substate)
        if job.state in TERMINAL:
            self.terminal += 1

    # ------------------------------------------------------------------ the pass

    def _quota_held(self, t: Tenant) -> int:
        """What counts against a tenant's quota: GPUs of its running jobs and of its claims (a
        claimant will hold them), not those of its jobs already leaving."""
        held = t.usage_gpus - self._leaving.get(t.name, 0)
        for jid in self._claimants:
            c = self.jobs[jid]
            if c.tenant == t.name:
                held += c.gpus
        return held

    # ------------------------------------------------------------------ preemption

    def _unevictable(self, job: Job) -> bool:
        """Would a victim search pass over this running job (a node of it claimed, leaving or in a
        reservation a search may exclude)?"""
        bad = self.cap.held_back(job.pool)
        r = self._memo_reservation
        if r is not None and r.pool == job.pool:
            bad |= r.nodes
        return bool(bad) and not bad.isdisjoint(job.placement)

    def _uncommitted(self, job: Job, now: float) -> float:
        """Run time a kill now would throw away: everything since the run began or last committed,
        the part of its restart already spent included (it is paid again at the next start)."""
        since = job.committed_at if job.committed_at >= job.started_s else job.started_s
        return max(0.0, now - since)

    def _sunk_restart(self, job: Job, now: float) -> float:
        restart = self._restart(job) if job.epoch > 1 else 0.0
        return max(0.0, min(now - job.started_s, restart))

    def _asks_checkpoint(self, job: Job) -> bool:
        """Is this victim asked to checkpoint first (its grace period fits its stall and write)?"""
        c = job.ckpt
        return self.policy.ask_checkpoint and c.interval_s > 0 and c.stall_s + c.write_s <= self._grace(job)

    def _drain(self, job: Job, ask: bool) -> float:
        c = job.ckpt
        return c.stall_s + c.write_s if ask else min(STOP_S, self._grace(job))

    def _price(self, job: Job, now: float) -> Candidate:
        """The victim's expected loss if it were asked to leave now, at its own grace period."""
        ask = self._asks_checkpoint(job)
        lost = self._sunk_restart(job, now) if ask else self._uncommitted(job, now)
        drain = self._drain(job, ask)
        return Candidate(
            job.id, job.priority, job.started_s, job.gpus, self._per_node(job), lost, drain, self._restart(job), ask
        )

    def _order_add(self, job: Job) -> None:
        """Index a running job in the victim order: its price per GPU is linear in time from its
        last commit (or start), or constant once the restart a checkpointing victim pays is sunk
        (see :class:`VictimOrder`; the same prices as :meth:`_price`)."""
        ask = self._asks_checkpoint(job)
        fixed = self._restart(job) + self._drain(job, ask)
        if ask:
            sunk = self._restart(job) if job.epoch > 1 else 0.0
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
