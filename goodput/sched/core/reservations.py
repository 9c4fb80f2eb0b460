"""The head's reservation (Slurm's backfill shadow time: the earliest start by the running jobs'
declared ends, and on which nodes) and the backfill that may not delay it."""

from __future__ import annotations

import math

from . import events as ev
from .claims import Claims
from .model import Health, Job, JobState
from .queue import Class
from .state import Reservation

# displaced heads remembered (each displaced by one of higher priority: at most one per priority level
# in a pass's order, so a few): past this the oldest is forgotten
MAX_DISPLACED = 16


class Reservations(Claims):
    # ------------------------------------------------------------------ the pass

    def _set_pass_reservation(self, r: Reservation | None) -> None:
        self._pass_res = r
        if r is not None:
            self.cap.watch(r.nodes)
            if self.on_reservation is not None:
                self.on_reservation(r)

    def _note_reservation(self, r: Reservation | None) -> None:
        """Keep the pass's reservation for the next passes; log it whenever it is set or moves.

        A head that a head of higher priority displaces is remembered (``_displaced``): once that
        one no longer waits (it started, or claimed nodes its victims leave, or was cancelled), the
        displaced head is the held head again. Before, it fell back into fair-share order, and a
        job of another tenant took the nodes it was reserved although the higher-priority job
        never did: a refused preemptor that took the reservation and, 30 s later, evicted
        elsewhere moved a gang's start from 1,090 s to 51,090 s."""
        old = self._head_res
        if r is not None and r.job in self._displaced:
            self._displaced.remove(r.job)
        if r is not None and old is not None and old.job != r.job:
            was, now_head = self.jobs.get(old.job), self.jobs.get(r.job)
            if (
                was is not None
                and now_head is not None
                and now_head.priority > was.priority
                and was.state is JobState.PENDING
                and was.id in self.queue
            ):
                if was.id in self._displaced:
                    self._displaced.remove(was.id)
                self._displaced.append(was.id)
                del self._displaced[:-MAX_DISPLACED]
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

    def _backfill_short(self, prio: int, tn: str, cls: Class, reservation: Reservation, now: float) -> int:
        """A blocked class may still hold a job short enough to finish before the reserved start.

        1: it started; 0: none of the key is short enough; -1: the shortest is, but fits nowhere."""
        short = self.queue.shortest((prio, tn, cls))
        if short is None or now + short[0] > reservation.t:
            return 0
        job = self.jobs[short[1]]
        for pool in cls[2]:
            nodes = self._find(job, pool, frozenset(), now)
            if nodes is not None:
                self._start(job, pool, nodes, backfill=True)
                return 1
        return -1  # short enough, but no room anywhere

    def _find(self, job: Job, pool: str, exclude: frozenset[str], now: float) -> tuple[str, ...] | None:
        """Best fit, and for a one-node job, among the nodes best fit cannot tell apart, the one it
        keeps busy the least past its current jobs' declared ends.

        A node frees whole only when its last job ends, and a whole-node job (61 % of the Philly
        replay's GPU-hours, 335 of its 24,134 jobs) can start nowhere else. Index order put a long
        job on a node about to drain and kept it from draining; backfill refilled the other nodes as
        they freed, so whole-node jobs waited a day or more with GPUs idle on every node
        (docs/SCHED.md, "Draining nodes"). The job goes where the node's latest declared end covers
        its own (the earliest such: the long-busy nodes are kept for long jobs), else where that end
        is latest. Declared ends only, never a name: a rename or a restore places alike."""
        nodes = self.cap.find(pool, job.nodes, job.gpus_per_node, exclude)
        if nodes is None or job.nodes != 1:
            return nodes
        first = self.cap.nodes[nodes[0]]
        if first.used == 0:
            return nodes  # an empty node: no drain to protect, each frees when this job ends
        mine = now + self._hold(job)
        best: tuple[tuple[int, float], str] | None = None
        end_of = self._end_of
        for name in self.cap.equals(pool, nodes[0], exclude):
            last = now
            for jid in self.cap.nodes[name].alloc:
                e = end_of.get(jid)
                if e is not None and e[1] > last:
                    last = e[1]
            key = (0, last) if last >= mine else (1, -last)
            if best is None or key < best[0]:
                best = (key, name)
        return nodes if best is None else (best[1],)

    # ------------------------------------------------------------------ reservations

    def _reserve(self, job: Job, cls: Class, now: float) -> Reservation | None:
        """When, at the earliest by declared limits, and where the head could start.

        Kept while nothing was released, returned or lost in its pools: jobs started since then
        went around the reservation, so it still holds."""
        key = (job.id, tuple(self._freed[p] for p in cls[2]), self._health_gen)
        cached = self._reservation_cache
        if cached is not None and cached[0] == key and now <= cached[2] and (cached[1] is None or cached[1].t >= now):
            return cached[1]
        self._plan_on_clock = False
        self._plan_until = math.inf
        best = self._reserve_now(job, cls, now)
        # a claim whose victims' ends are past comes back at now + its hold: a plan that moves
        # with the clock alone is not kept, and one that will once a victim outlives its end (a
        # kill whose exit has not come) is kept only until that end
        self._reservation_cache = None if self._plan_on_clock else (key, best, self._plan_until)
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
            elif start < self._plan_until:
                self._plan_until = start
            claim_ends.append((start + self._hold(c), cid))
        claim_ends.sort(key=lambda e: (e[0], self.jobs[e[1]].seq))
        released: set[str] = set()
        k = 0
        ends = iter(self._ends[pool])
        nxt = next(ends, None)
        while ok < n and (nxt is not None or k < len(claim_ends)):
            if nxt is not None and (k >= len(claim_ends) or nxt[0] <= claim_ends[k][0]):
                end, _, jid = nxt
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
