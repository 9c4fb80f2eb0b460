"""Preemption: the cheapest victims for a job that does not fit, whether evicting them is worth the
wait, the request to leave, and quota reclaims; and the time limit's preemption."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from . import events as ev
from .eviction import EXACT_MAX, Candidate, exact_fit, greedy_fit
from .model import EVICTION_REASONS, Job, JobState
from .queue import Class
from .reservations import Reservations
from .state import Reservation

PREEMPT_SCANS_PER_PASS = 4  # victim searches per pass; needs beyond wait for the next pass (<= 1 s)
# a job whose priority preemption was refused (every set that would free it costs more than its wait
# is worth, or needs more than MAX_VICTIMS jobs) is searched for again this long after, not every
# pass: prices and waits move slowly, and a refusal re-searched each second of a long wait was most
# of a simulation's time (Slurm's backfill, where its preemption is planned, runs every 30 s)
PREEMPT_RETRY_S = 30.0
# a priority preemption evicts at most this many jobs (Policy.weigh_wait): a gang that needs more
# waits for its reservation, which time limits make hold, instead of disrupting a crowd
MAX_VICTIMS = 2
LOGGED_CANDIDATES = 8  # a preemption's record lists this many of the cheapest candidates


class Preemption(Reservations):
    # ------------------------------------------------------------------ indices

    def _time_limit(self, job: Job, now: float) -> None:
        """The run reached its time limit plus ``over_time_limit_s``: asked to checkpoint (when the
        write fits its grace) and stop, killed at the grace's end; gone, it fails with reason
        ``time_limit``."""
        if job.limit_s <= 0 or now < job.started_s + job.run_limit_s + self.gov.limits.over_time_limit_s:
            return
        grace = self._grace(job)
        ask = self.policy.ask_checkpoint and job.ckpt.fits_grace(grace)
        self._preempt(job, "time_limit", "", now + grace, checkpoint=ask, candidates=None)
        self._dirty = True

    def _limit_kill(self, job: Job) -> float:
        """When the time limit's kill of the current run comes: its hold, ``over_time_limit_s``,
        then its grace (never, without a declared limit or with time limits not enforced)."""
        over = self.gov.limits.over_time_limit_s
        if job.limit_s <= 0 or not math.isfinite(over):
            return math.inf
        return job.started_s + job.run_limit_s + over + self._grace(job)

    # ------------------------------------------------------------------ preemption

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

    def _preempt_for(self, job: Job, cls: Class, now: float, reservation: Reservation | None) -> bool:
        """Free room for ``job`` by evicting lower-priority gangs, if some set of them is enough."""
        if self._pass_scans >= PREEMPT_SCANS_PER_PASS:
            self._dirty = True  # the search is only put off: the next pass must come
            return False
        prio = job.priority
        reason = "priority"
        refused = False
        for pool in cls[2] if now >= job.preempt_retry_s else ():
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
                refused = True
                continue
            if self._evict(job, pool, victims, free, considered, excluded, now, reason):
                return True
        if refused:
            job.preempt_retry_s = now + PREEMPT_RETRY_S
            self._touch(job)
            self._timer(job.preempt_retry_s, "retry", job)
        return self.policy.preemption and self._reclaim_for(job, cls, now, reservation)

    def _worth(self, job: Job, cls: Class, victims: list[Candidate], now: float, rate: float | None = None) -> bool:
        """Is evicting ``victims`` cheaper than letting ``job`` wait? Their expected loss (the work
        they would redo, the restart they would pay again, their drain: GPU-seconds, all waste) must
        be at most ``Policy.wait_worth`` (0.1) times the GPU-seconds the job would wait for its own
        reservation by the declared ends (a wait wastes nothing: others use the GPUs meanwhile;
        no end frees enough: it is worth it), and at most ``MAX_VICTIMS`` jobs. ``Policy.weigh_wait`` False (the
        Kueue baseline): evict whatever it costs, as Kueue and Slurm do. ``rate``: another exchange
        rate than ``wait_worth`` (a move's, ``Policy.move_worth``)."""
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
        return cost <= (self.policy.wait_worth if rate is None else rate) * job.gpus * (r.t - now)

    def _move_for(self, job: Job, cls: Class, now: float) -> bool:
        """Free a whole node for a one-node ``job`` that fits no node by moving the few jobs left on
        a nearly free one: they are asked to checkpoint and stop (reason ``move``), and requeued
        they start again on GPUs free on other nodes, which must hold them all.

        Without it a job needing all of a node's GPUs waits until some node drains while backfill
        refills each freed GPU with a small job: on the Philly replay, 41 h of the 14 days had
        only whole-node jobs waiting with on average 117 GPUs idle, all on partly used nodes
        (docs/SCHED.md, "Moving jobs to free a node"). A move is priced as an eviction (the
        restart it pays again and its drain) and made only when that is at most
        ``Policy.move_worth`` times the GPU-seconds the job would wait, with at most
        ``MAX_VICTIMS`` jobs of no higher priority, each one node, able to checkpoint within its
        grace, past ``min_run_s`` and under ``max_preemptions``; the node kept is the cheapest to
        empty, ties by node order."""
        if not self.policy.defrag or not self.policy.ask_checkpoint or job.nodes != 1:
            return False
        if self._move_failed == (job.id, self._mutations):
            return False
        g, prio, jobs = job.gpus_per_node, job.priority, self.jobs
        best: tuple[float, str, str, list[Candidate]] | None = None
        for pool in cls[2]:
            spare = self.cap.free_gpus(pool)
            if spare < g:
                continue  # the job and what moves must both fit in what is free now
            for f in range(g - 1, 0, -1):
                for name in self.cap.with_free(pool, f):
                    node = self.cap.nodes[name]
                    if node.draining or len(node.alloc) > MAX_VICTIMS or node.gpus < g or spare - f < node.used:
                        continue
                    moved: list[Candidate] = []
                    for jid in node.alloc:
                        v = jobs[jid]
                        if (
                            v.state is not JobState.RUNNING
                            or v.nodes != 1
                            or v.priority > prio
                            or not self._asks_checkpoint(v)
                            or not self._victim_ok(v, now)
                        ):
                            break
                        moved.append(self._price(v, now))
                    else:
                        cost = sum(c.cost for c in moved)
                        if (best is None or cost < best[0]) and self._fits_elsewhere(pool, name, moved):
                            best = (cost, pool, name, moved)
        if best is None or not self._worth(job, cls, best[3], now, self.policy.move_worth):
            self._move_failed = (job.id, self._mutations)
            return False
        _, pool, name, moved = best
        free = {name: self.cap.nodes[name].free}
        return self._evict(job, pool, moved, free, moved, frozenset(), now, "move")

    def _fits_elsewhere(self, pool: str, name: str, moved: list[Candidate]) -> bool:
        """Would the moved jobs (one node each) all fit the GPUs free now on the pool's other nodes?
        Largest first, each on the fullest node it fits (as best fit will place them)."""
        taken: dict[str, int] = {}
        top = self.cap.nodes[name].gpus
        for c in sorted(moved, key=lambda c: -c.gpus):
            placed = False
            for f in range(c.gpus, top + 1):
                for other in self.cap.with_free(pool, f):
                    if other != name and f - taken.get(other, 0) >= c.gpus:
                        taken[other] = taken.get(other, 0) + c.gpus
                        placed = True
                        break
                if placed:
                    break
            if not placed:
                return False
        return True

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
                    self.jobs[c.job], reason, job.id, now + self._grace(self.jobs[c.job]), c.checkpoint, logged
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
            self._preempt(self.jobs[c.job], reason, job.id, now + self._grace(self.jobs[c.job]), c.checkpoint, logged)
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
        so many of one tenant's that it falls below its own quota. A priority preemption keeps the
        same floor for every other tenant with a quota: it may take what such a tenant borrows, not
        what it is guaranteed (that tenant would reclaim it at once from someone else: a cascade
        of two evictions where one of the preemptor's own jobs, or a borrower's, was the victim)."""
        prio, g = job.priority, job.gpus_per_node
        running = self._running[pool]
        tiers = sorted(p for p in running if quota or p < prio)
        if not tiers:
            return None
        # GPUs each tenant may still lose and stay at its quota; a reclaim takes only from tenants
        # here, a priority preemption from any tenant not here as well (no quota: nothing to keep)
        room: dict[str, int] = {}
        if quota:
            tiers = tiers[-1:]
        for t in self.tenants.values():
            if t.name == job.tenant or not (quota or t.quota_gpus > 0):
                continue
            held = self._quota_held(t)
            if held > t.quota_gpus or not quota:
                room[t.name] = max(0, held - t.quota_gpus)
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
                        and room.get(other.tenant, gpus) >= gpus
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
                if quota or v.tenant in left:
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
        # a notice never outlasts the run's time limit: a drain or a reclaim an hour away given to
        # a run due to stop in a minute kept it going for the hour (a run lasts at most its hold,
        # over_time_limit_s and its grace, whatever asks it to leave first)
        deadline_s = min(deadline_s, self._limit_kill(job))
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
