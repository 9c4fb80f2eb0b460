"""The trace-driven simulator: the scheduler core under a simulated clock, against a model world.

The world is the executor: it runs each started gang as a training job that makes progress at
full speed after its restart, snapshots every ``ckpt_interval_s`` of progress (training blocked
for ``ckpt_stall_s``), commits each snapshot ``ckpt_write_s`` later (asynchronously, training goes
on), and reports every commit and its exit back to the scheduler, as a live job would. On a
notice asking for a checkpoint it stops training, snapshots its step and exits once that commits;
on a plain notice it stops within ``STOP_S``; when killed it exits at once. Processes hold their
GPUs until they exit, whatever the scheduler believes: a gang started on GPUs an unreleased
victim still holds waits, and the wait is counted as double-booked.

Inputs reach the scheduler the moment they happen; its pass runs at most once per simulated
second (``cycle_s``, as Volcano's scheduling period), so a burst of exits is one pass.

Only the cluster file's events happen (and the failures or reclaims asked for), at the same
instants and on the same nodes for every policy, so runs are deterministic and comparable.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.events import EventLog
from ..core.executor import ManualClock
from ..core.model import Job, Pool, PoolKind
from ..core.policy import Policy
from ..core.scheduler import Scheduler
from .checker import CheckReport, check
from .formats import Cluster, ClusterEvent
from .ledger import Account, Ledger

STOP_S = 10.0  # a plain stop: processes torn down, NCCL aborted
CYCLE_S = 1.0  # passes at most once a simulated second (Volcano's schedulePeriod); inputs at once


@dataclass(slots=True)
class _Run:
    job: str
    tenant: str
    epoch: int
    nodes: tuple[str, ...]
    gpus_per_node: int
    pool: str
    start_t: float
    c0: float
    duration: float
    tau: float
    delta: float
    write: float
    restart: float
    avail_t: float = -1.0  # when its GPUs were physically free (-1: still waiting)
    p0: float = -1.0  # when progress began (after the restart)
    stop_t: float = -1.0  # when training stopped (-1: still training)
    committed: float = 0.0
    exited: bool = False
    token: int = 0  # bumps when a scheduled exit or finish is superseded
    cause: str = ""  # preempt | infra | failure | cancel ('' while nothing asked it to go)

    def progress_at(self, t: float) -> float:
        if self.p0 < 0 or t <= self.p0:
            return self.c0
        el = t - self.p0
        if self.tau <= 0:
            return min(self.duration, self.c0 + el)
        cyc = self.tau + self.delta
        k = math.floor(el / cyc)
        return min(self.duration, self.c0 + k * self.tau + min(el - k * cyc, self.tau))

    def snap_time(self, j: int) -> float:
        return self.p0 + j * self.tau + (j - 1) * self.delta


@dataclass
class SimResult:
    policy: str
    ledger: Ledger
    events: list[dict[str, Any]]
    check: CheckReport
    waits: list[float]
    jobs: dict[str, int]
    horizon_s: float
    wall_s: float
    world_events: int
    double_booked_starts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return len(self.events) / self.wall_s if self.wall_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.waits:
            return 0.0
        w = sorted(self.waits)
        return w[min(len(w) - 1, max(0, math.ceil(q * len(w)) - 1))]

    def metrics(self) -> dict[str, Any]:
        led = self.ledger
        tot = led.total
        return {
            "goodput": led.goodput(),
            "lost_gpu_hours": (tot.lost_preemption + tot.lost_failure) / 3600.0,
            "wait_p50_s": self.percentile(0.50),
            "wait_p99_s": self.percentile(0.99),
            "utilization": led.utilization(),
            "violations": self.check.total,
            "violations_by_kind": {k: v for k, v in self.check.violations.items() if v},
            "double_booked_gpu_hours": self.check.double_booked_gpu_s / 3600.0,
            "cost_usd": tot.cost_usd,
            "spot_gpu_hours": tot.spot_gpu_s / 3600.0,
            "cost_per_useful_gpu_hour": tot.cost_usd / (tot.useful / 3600.0) if tot.useful > 0 else math.inf,
            "ledger_gpu_hours": led.breakdown_hours(),
            "jobs": self.jobs,
            "horizon_h": self.horizon_s / 3600.0,
            "events": len(self.events),
            "events_per_s": self.events_per_s,
            "wall_s": self.wall_s,
        }


class World:
    """The executor of the simulation: a model of the training jobs and the machines."""

    sched: Scheduler  # the scheduler it executes for: set once both exist

    def __init__(self, cluster: Cluster, jobs: Sequence[Job]) -> None:
        self.clock = ManualClock(0.0)
        self.cluster = cluster
        self.pools: dict[str, Pool] = {p.name: p for p in cluster.pools}
        self.capacity = cluster.capacity()
        self.node_pool = {n: p.name for p in cluster.pools for n in cluster.node_names(p.name)}
        self.alive: dict[str, bool] = dict.fromkeys(self.capacity, True)
        self.alive_gpus = sum(self.capacity.values())
        self.specs = {j.id: j for j in jobs}
        self.runs: dict[str, _Run] = {}  # job id -> its current run
        self.on_node: dict[str, dict[str, None]] = {n: {} for n in self.capacity}  # runs physically there
        self.used: dict[str, int] = dict.fromkeys(self.capacity, 0)
        self.waiting: dict[str, dict[str, None]] = {}  # node -> runs waiting for its GPUs
        self.heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.ledger = Ledger()
        self.double_booked_starts = 0
        self.last_t = 0.0

    # executor ------------------------------------------------------------------

    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        now = self.clock.now()
        spec = self.specs[job.id]
        c = spec.ckpt
        tau = max(c.interval_s, c.write_s) if c.interval_s > 0 else 0.0
        run = _Run(
            job=job.id,
            tenant=spec.tenant,
            epoch=job.epoch,
            nodes=nodes,
            gpus_per_node=spec.gpus_per_node,
            pool=self.node_pool[nodes[0]],
            start_t=now,
            c0=resume_from_s,
            duration=spec.duration_s,
            tau=tau,
            delta=c.stall_s if tau > 0 else 0.0,
            write=c.write_s,
            restart=c.restart_s if job.epoch > 1 else 0.0,
            committed=resume_from_s,
        )
        self.runs[job.id] = run
        contended = False
        for n in nodes:
            self.on_node[n][job.id] = None
            self.used[n] += run.gpus_per_node
            contended |= self.used[n] > self.capacity[n] or not self.alive[n]
        if contended:
            self.double_booked_starts += 1
            for n in nodes:
                self.waiting.setdefault(n, {})[job.id] = None
        else:
            self._begin(run, now)

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        run = self.runs.get(job.id)
        if run is None or run.exited or run.epoch != job.epoch or run.stop_t >= 0:
            return
        now = self.clock.now()
        run.cause = {"node_loss": "infra", "drain": "infra", "cancel": "cancel", "time_limit": "failure"}.get(
            job.preempt_reason, "preempt"
        )
        run.stop_t = now
        run.token += 1
        p = run.progress_at(now)
        if checkpoint and run.tau > 0 and run.p0 >= 0 and now >= run.p0 and p > run.committed + 1e-9:
            t = now + run.delta + run.write
            self._push(t, "leave_commit", (run, run.token, p))
        else:
            self._push(now + min(STOP_S, max(0.0, deadline_s - now)), "exit", (run, run.token, "killed"))

    def kill(self, job: Job) -> None:
        run = self.runs.get(job.id)
        if run is None or run.exited or run.epoch != job.epoch:
            return
        now = self.clock.now()
        if not run.cause:
            run.cause = "infra" if job.preempt_reason in ("node_loss", "drain") else "failure"
        if run.stop_t < 0:
            run.stop_t = now
        run.token += 1
        self._push(now, "exit", (run, run.token, "killed"))

    # world ---------------------------------------------------------------------

    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, payload))

    def _begin(self, run: _Run, now: float) -> None:
        run.avail_t = now
        if run.stop_t >= 0:
            return
        run.p0 = now + run.restart
        need = run.duration - run.c0
        if run.tau > 0:
            m = max(0, math.ceil(need / run.tau) - 1)
            if run.c0 + run.tau < run.duration:
                self._push(run.snap_time(1) + run.delta + run.write, "commit", (run, 1))
        else:
            m = 0
        self._push(run.p0 + need + m * run.delta, "finish", (run, run.token))

    def handle(self, kind: str, payload: Any) -> None:
        now = self.clock.now()
        sched = self.sched
        if kind == "commit":
            run, j = payload
            if run.exited or (run.stop_t >= 0 and run.snap_time(j) >= run.stop_t):
                return
            progress = run.c0 + j * run.tau
            run.committed = max(run.committed, progress)
            sched.report_commit(run.job, run.epoch, progress)
            if run.c0 + (j + 1) * run.tau < run.duration:
                nxt = run.snap_time(j + 1)
                if run.stop_t < 0 or nxt < run.stop_t:
                    self._push(nxt + run.delta + run.write, "commit", (run, j + 1))
        elif kind == "finish":
            run, token = payload
            if run.exited or token != run.token or run.stop_t >= 0:
                return
            run.stop_t = now
            run.committed = run.duration
            self._exit(run, "finished")
        elif kind == "leave_commit":
            run, token, p = payload
            if run.exited or token != run.token:
                return
            run.committed = max(run.committed, p)
            sched.report_commit(run.job, run.epoch, p)
            self._exit(run, "preempted")
        elif kind == "exit":
            run, token, status = payload
            if run.exited or token != run.token:
                return
            self._exit(run, status)
        elif kind == "cluster":
            self._cluster_event(payload)
        elif kind == "lose":
            self._lose(payload)
        elif kind == "cycle":
            return
        elif kind == "up":
            names = [n for n in payload if not self.alive[n]]
            for n in names:
                self.alive[n] = True
                self.alive_gpus += self.capacity[n]
            if names:
                sched.node_up(names)

    def _exit(self, run: _Run, status: str) -> None:
        now = self.clock.now()
        run.exited = True
        if run.stop_t < 0:
            run.stop_t = now
        woken: dict[str, None] = {}
        for n in run.nodes:
            self.on_node[n].pop(run.job, None)
            self.used[n] -= run.gpus_per_node
            w = self.waiting.get(n)
            if w:
                w.pop(run.job, None)
                woken.update(w)
        self._charge(run, now, status)
        self.sched.report_exit(run.job, run.epoch, status)
        for jid in sorted(woken, key=self._seq_of):
            other = self.runs.get(jid)
            if other is None or other.exited or other.avail_t >= 0:
                continue
            if all(self.used[n] <= self.capacity[n] for n in other.nodes):
                for n in other.nodes:
                    self.waiting.get(n, {}).pop(jid, None)
                self._begin(other, now)

    def _charge(self, run: _Run, t_end: float, status: str) -> None:
        g = run.gpus_per_node * len(run.nodes)
        a_t = run.avail_t if run.avail_t >= 0 else t_end
        stop = max(min(run.stop_t, t_end), a_t)
        acct = Account()
        acct.double_booked = g * (a_t - run.start_t)
        acct.restart = g * max(0.0, min(stop, a_t + run.restart) - a_t)
        window = max(0.0, stop - (a_t + run.restart))
        progress = run.progress_at(stop) - run.c0 if run.p0 >= 0 else 0.0
        kept = run.duration if status == "finished" else run.committed
        useful = max(0.0, min(kept, run.c0 + progress) - run.c0)
        acct.useful = g * useful
        lost = g * max(0.0, progress - useful)
        if run.cause in ("preempt", "cancel"):
            acct.lost_preemption = lost
        else:
            acct.lost_failure = lost
        acct.checkpoint_stall = g * max(0.0, window - progress)
        acct.draining = g * max(0.0, t_end - stop)
        held_h = g * (t_end - run.start_t) / 3600.0
        pool = self.pools[run.pool]
        acct.cost_usd = held_h * pool.price_per_gpu_hour
        if pool.kind is PoolKind.SPOT:
            acct.spot_gpu_s = held_h * 3600.0
        self.ledger.charge(run.job, run.tenant, acct)

    def _seq_of(self, job_id: str) -> int:
        """Submission order: what orders jobs in the world, so that nothing depends on their ids."""
        return self.specs[job_id].seq

    def _pick(self, ev: ClusterEvent) -> list[str]:
        names = [n for n in self.cluster.node_names(ev.pool) if self.alive[n]]
        if not names:
            return []
        if ev.kind in ("node_loss", "job_failure") and ev.seed_key:
            start = ev.seed_key % len(names)
            return (names[start:] + names[:start])[: ev.nodes]
        rng = random.Random(f"{ev.kind}:{ev.pool}:{ev.t!r}:{ev.seed_key}")
        return sorted(rng.sample(names, min(ev.nodes, len(names))))

    def _cluster_event(self, ev: ClusterEvent) -> None:
        now = self.clock.now()
        names = self._pick(ev)
        if not names:
            return
        if ev.kind == "job_failure":
            victims = sorted(self.on_node[names[0]], key=self._seq_of)
            if victims:
                run = self.runs[victims[0]]
                if not run.exited:
                    run.cause = run.cause or "failure"
                    run.stop_t = now if run.stop_t < 0 else run.stop_t
                    run.token += 1
                    self._push(now, "exit", (run, run.token, "failed"))
            return
        if ev.notice_s > 0:
            self.sched.reclaim_notice(names, now + ev.notice_s, why="reclaim" if ev.kind == "reclaim" else "node_loss")
            self._push(now + ev.notice_s, "lose", (tuple(names), ev.return_s))
        else:
            self._lose((tuple(names), ev.return_s))

    def _lose(self, payload: tuple[tuple[str, ...], float | None]) -> None:
        names, return_s = payload
        now = self.clock.now()
        gone = [n for n in names if self.alive[n]]
        for n in gone:
            self.alive[n] = False
            self.alive_gpus -= self.capacity[n]
            for jid in sorted(self.on_node[n], key=self._seq_of):
                run = self.runs[jid]
                if not run.exited:
                    run.cause = "infra" if run.cause in ("", "failure") else run.cause
                    if run.stop_t < 0:
                        run.stop_t = now
                    run.token += 1
                    self._push(now, "exit", (run, run.token, "killed"))
        if gone:
            self.sched.node_lost(gone)
            if return_s is not None:
                self._push(now + return_s, "up", tuple(gone))


def fresh(job: Job) -> Job:
    """A new record for one policy's run (records are mutated by the scheduler)."""
    return replace(job)


def simulate(
    jobs: Sequence[Job],
    cluster: Cluster,
    policy: Policy,
    *,
    extra_events: Iterable[ClusterEvent] = (),
    store: Any = None,
    crash_after: Iterable[int] = (),
    horizon_s: float = math.inf,
    progress: Callable[[float, int, int], None] | None = None,
    check_log: bool = True,
    cycle_s: float = CYCLE_S,
) -> SimResult:
    """Run one policy over the workload; ``crash_after`` rebuilds the scheduler from ``store``
    after those world-event counts, as a service killed and restarted on the same store would be."""
    t0 = time.perf_counter()  # the collector's set-up counts in the run's wall time
    with _rare_collections():
        return _simulate(
            jobs, cluster, policy, extra_events, store, crash_after, horizon_s, progress, check_log, cycle_s, t0
        )


GC_THRESHOLD = (50_000, 20, 100)


@contextmanager
def _rare_collections() -> Iterator[None]:
    """A run allocates millions of short-lived tuples and almost no cycles, while the cyclic
    collector, run every 700 allocations, kept walking the workload's long-lived records: about a
    tenth of the run. What exists is frozen out of its sight and it runs rarely; both undone after."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def _simulate(
    jobs: Sequence[Job],
    cluster: Cluster,
    policy: Policy,
    extra_events: Iterable[ClusterEvent],
    store: Any,
    crash_after: Iterable[int],
    horizon_s: float,
    progress: Callable[[float, int, int], None] | None,
    check_log: bool,
    cycle_s: float,
    t0: float,
) -> SimResult:
    jobs = sorted((fresh(j) for j in jobs), key=lambda j: (j.submit_s, j.seq))  # stable: ties keep input order
    for j in jobs:  # refused before the run, not minutes into it (SubmissionRejected names job and field)
        cluster.governance.check(j)
    world = World(cluster, jobs)
    log = EventLog()
    sched = Scheduler(
        cluster.pools,
        clock=world.clock,
        executor=world,
        policy=policy,
        store=store,
        log=log,
        governance=cluster.governance,
    )
    if store is not None:
        if store.event_count():
            raise ValueError("the store already holds a scheduler's run: give the simulation an empty one")
        sched.save_all()
    world.sched = sched
    for ev in sorted([*cluster.events, *extra_events], key=lambda e: e.t):
        world._push(ev.t, "cluster", ev)
    crash = sorted(set(crash_after), reverse=True)
    n_world = 0
    nxt_job = 0
    terminal = 0
    total = len(jobs)
    cap_gpu_s = 0.0
    last = 0.0
    last_report = time.perf_counter()
    next_pass = 0.0
    cycle_wake = -1.0
    while terminal < total:
        t_next = min(
            jobs[nxt_job].submit_s if nxt_job < total else math.inf,
            world.heap[0][0] if world.heap else math.inf,
            sched.next_timer(),
        )
        if not math.isfinite(t_next) or t_next > horizon_s:
            break
        cap_gpu_s += world.alive_gpus * (t_next - last)
        last = t_next
        world.clock.t = t_next
        while nxt_job < total and jobs[nxt_job].submit_s <= t_next:
            sched.submit(jobs[nxt_job])
            nxt_job += 1
        while world.heap and world.heap[0][0] <= t_next:
            _, _, kind, payload = heapq.heappop(world.heap)
            world.handle(kind, payload)
            n_world += 1
            if crash and n_world >= crash[-1]:
                crash.pop()
                sched = Scheduler.restore(
                    store,
                    cluster.pools,
                    clock=world.clock,
                    executor=world,
                    policy=policy,
                    governance=cluster.governance,
                )
                world.sched = sched
        sched.advance()
        if t_next >= next_pass:
            sched.tick()
            next_pass = t_next + cycle_s
        elif sched.needs_pass and cycle_wake < next_pass:
            world._push(next_pass, "cycle", None)
            cycle_wake = next_pass
        terminal = sched.terminal
        if progress is not None and time.perf_counter() - last_report > 0.25:
            last_report = time.perf_counter()
            progress(t_next, terminal, total)
    world.ledger.capacity_gpu_s = cap_gpu_s
    horizon = last
    waits = [
        (j.first_start_s if j.first_start_s >= 0 else horizon) - j.submit_s
        for j in sched.jobs.values()
        if j.first_start_s >= 0 or j.state.value != "cancelled"
    ]
    by_state: dict[str, int] = {}
    for j in sched.jobs.values():
        by_state[j.state.value] = by_state.get(j.state.value, 0) + 1
    records = sched.log.records
    report = check(records if check_log else [], world.capacity)
    return SimResult(
        policy=policy.name,
        ledger=world.ledger,
        events=records,
        check=report,
        waits=waits,
        jobs=by_state,
        horizon_s=horizon,
        wall_s=time.perf_counter() - t0,
        world_events=n_world,
        double_booked_starts=world.double_booked_starts,
        extra={"passes": sched.passes},
    )
