"""``goodput bench sched``: the scheduler's pass at 10k and 100k queued jobs, against a full sort.

The cluster (:func:`~goodput.sched.sim.synthetic.synthetic_cluster`: an on-demand pool and a spot pool)
is filled with running jobs, then a backlog of pending jobs drawn like
:func:`~goodput.sched.sim.synthetic.synthetic` (mixed shapes, Zipf tenants, priorities 0-3) is
submitted behind them, so the backlog waits. Each measured tick is preceded by a small batch of
events, as a live cluster sends them: one arrival (more when the last pass started jobs, so the
queue stays at its size), one exit of a random running job (``finished``), one commit report of
a random running job, and the exits of the victims the last pass asked to leave (``preempted``).
Only :meth:`Scheduler.tick` is timed. The exit frees capacity, so every measured pass has work.

The baseline is the naive design, measured in the same run on the same 100k states: every pass
sorts the whole pending queue (priority, then fair share, then submit time) and places first fit
down the sorted list until the cluster is full. It does less than the real pass (no reservation,
backfill or preemption), so the speedup is a lower bound.

Simulator throughput is :func:`~goodput.sched.sim.simulator.simulate` of the goodput policy on
``synthetic(sim_jobs)``: scheduler log events per wall second, the checker off.
"""

from __future__ import annotations

import cProfile
import gc
import io
import math
import pstats
import random
import time
from collections.abc import Callable
from typing import Any

from goodput.sched import native
from goodput.sched.core.executor import ManualClock
from goodput.sched.core.model import Health, Job, JobState, Pool, PoolKind, Tenant
from goodput.sched.core.placement import pools_for
from goodput.sched.core.policy import POLICIES
from goodput.sched.core.scheduler import Scheduler
from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

GOAL_P50_MS = 5.0
GOAL_P99_MS = 50.0
GOAL_GROWTH = 1.5
GOAL_SPEEDUP = 50.0
GOAL_SIM_EVENTS_PER_S = 20_000.0

T0 = 86_400.0  # the clock when the backlog is submitted; its submit times spread over [0, T0)
STEP_S = 1.0  # simulated seconds between two measured passes
COMMIT_STEP_S = 60.0  # progress each commit report advances its job by
CHUNK = 4096  # specs drawn from synthetic() at a time


class NullExecutor:
    """Starts and notices cost a list append: the bench answers the notices with exits."""

    __slots__ = ("started", "leaving")

    def __init__(self) -> None:
        self.started: list[Job] = []
        self.leaving: list[tuple[str, int]] = []

    def start(self, job: Job, nodes: tuple[str, ...], resume_from_s: float) -> None:
        self.started.append(job)

    def notify(self, job: Job, *, checkpoint: bool, deadline_s: float) -> None:
        self.leaving.append((job.id, job.epoch))

    def kill(self, job: Job) -> None:
        self.leaving.append((job.id, job.epoch))


class _Bag:
    """Running job ids with O(1) add, remove and uniform random pick."""

    __slots__ = ("ids", "at")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.at: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, jid: str) -> None:
        if jid not in self.at:
            self.at[jid] = len(self.ids)
            self.ids.append(jid)

    def discard(self, jid: str) -> None:
        i = self.at.pop(jid, None)
        if i is None:
            return
        last = self.ids.pop()
        if i < len(self.ids):
            self.ids[i] = last
            self.at[last] = i

    def pick(self, rng: random.Random) -> str:
        return self.ids[rng.randrange(len(self.ids))]


def cap_gangs(jobs: list[Job], pools: list[Pool]) -> int:
    """Shrink gangs that no pool they may use could hold (a gang over the on-demand pool is refused
    for a job not allowed on spot); returns how many were shrunk."""
    shrunk = 0
    for job in jobs:
        room = max(
            (
                p.nodes
                for p in pools
                if p.gpus_per_node >= job.gpus_per_node and (p.kind is PoolKind.ON_DEMAND or job.spot)
            ),
            default=0,
        )
        if room and job.nodes > room:
            job.nodes = room
            shrunk += 1
    return shrunk


class _Specs:
    """Fresh pending job specs drawn like synthetic(), with unique ids and the submit time asked for."""

    def __init__(self, nodes: int, gpus_per_node: int, pools: list[Pool], seed: int) -> None:
        self.nodes, self.gpn, self.pools, self.seed = nodes, gpus_per_node, pools, seed
        self.buf: list[Job] = []
        self.n = 0
        self.chunks = 0

    def take(self, submit_s: float) -> Job:
        if not self.buf:
            jobs = synthetic(CHUNK, nodes=self.nodes, gpus_per_node=self.gpn, seed=self.seed * 100_003 + self.chunks)
            self.chunks += 1
            cap_gangs(jobs, self.pools)
            jobs.reverse()
            self.buf = jobs
        job = self.buf.pop()
        job.id = f"b{self.n:08d}"
        self.n += 1
        job.submit_s = job.eligible_s = submit_s
        return job


def full_sort_pass(
    pending: list[Job],
    tenants: dict[str, Tenant],
    nodes_by_pool: dict[str, list[Any]],
    claimed: dict[str, str],
    pools_of: dict[str, tuple[str, ...]],
) -> list[tuple[str, str, list[int]]]:
    """The naive pass: sort every pending job, then first fit down the list until the cluster is full.

    Returns (job, pool, node indices) for each job it would start; nothing is changed."""
    order = sorted(pending, key=lambda j: (-j.priority, tenants[j.tenant].share(), j.submit_s, j.seq))
    free: dict[str, list[list[int]]] = {}
    left = 0
    for pool, nodes in nodes_by_pool.items():
        fr = [[i, n.gpus - n.used] for i, n in enumerate(nodes) if n.health is Health.UP and n.name not in claimed]
        fr = [x for x in fr if x[1] > 0]
        free[pool] = fr
        left += sum(x[1] for x in fr)
    placed: list[tuple[str, str, list[int]]] = []
    for job in order:
        if left <= 0:
            break
        if job.gpus > left:
            continue
        g = job.gpus_per_node
        for pool in pools_of[job.id]:
            picked = [x for x in free[pool] if x[1] >= g][: job.nodes]
            if len(picked) == job.nodes:
                for x in picked:
                    x[1] -= g
                left -= job.gpus
                placed.append((job.id, pool, [x[0] for x in picked]))
                break
    return placed


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _stats_ms(ns: list[int]) -> dict[str, float]:
    ms = [x / 1e6 for x in ns]
    return {
        "p50_ms": _pct(ms, 0.50),
        "p99_ms": _pct(ms, 0.99),
        "max_ms": max(ms) if ms else 0.0,
        "mean_ms": sum(ms) / len(ms) if ms else 0.0,
    }


class _Bench:
    """One scheduler holding a full cluster and a backlog of ``queued`` pending jobs, and its event stream."""

    def __init__(self, queued: int, nodes: int, gpus_per_node: int, seed: int, say: Callable[[str], None]) -> None:
        self.cluster = synthetic_cluster(nodes=nodes, gpus_per_node=gpus_per_node)
        self.pools = list(self.cluster.pools)
        self.target = queued
        self.clock = ManualClock(T0)
        self.ex = NullExecutor()
        self.sched = Scheduler(self.pools, clock=self.clock, executor=self.ex, policy=POLICIES["goodput"])
        self.specs = _Specs(nodes, gpus_per_node, self.pools, seed)
        self.rng = random.Random(seed)
        self.running = _Bag()
        self.leaving: list[tuple[str, int]] = []
        self.counts = {"arrivals": 0, "exits": 0, "commits": 0, "victim_exits": 0, "preemptions": 0}
        t0 = time.perf_counter()
        say(f"{queued:,} queued: filling {nodes} nodes x {gpus_per_node} GPUs with running jobs")
        self._fill()
        say(f"{queued:,} queued: submitting the backlog")
        for k in range(max(0, queued - len(self.sched.queue))):
            self.sched.submit(self.specs.take(T0 * k / max(1, queued)))
        say(f"{queued:,} queued: first pass and its preemptions")
        self.settle_passes = self._settle()
        self.setup_s = time.perf_counter() - t0

    def _drain(self) -> None:
        for job in self.ex.started:
            if job.state is JobState.RUNNING:
                self.running.add(job.id)
        self.ex.started.clear()
        for jid, epoch in self.ex.leaving:
            self.running.discard(jid)
            self.leaving.append((jid, epoch))
            self.counts["preemptions"] += 1
        self.ex.leaving.clear()

    def _fill(self) -> None:
        """Submit and start jobs until a pass leaves some pending: the cluster is full."""
        s = self.sched
        while True:
            for _ in range(256):
                s.submit(self.specs.take(0.0))
            s.tick()
            self._drain()
            if len(s.queue) >= 64 or (len(s.queue) and s.cap.free_gpus() == 0):
                return

    def _victims_gone(self) -> None:
        s = self.sched
        todo, self.leaving = self.leaving, []
        for jid, epoch in todo:
            job = s.jobs[jid]
            if job.epoch == epoch and job.state in (JobState.RUNNING, JobState.PREEMPTING):
                s.report_exit(jid, epoch, "preempted")
                self.counts["victim_exits"] += 1
        self._drain()

    def _settle(self, limit: int = 500) -> int:
        """Passes (victims answered between them) until one asks nobody to leave."""
        s = self.sched
        for i in range(limit):
            s.tick()
            self._drain()
            if not self.leaving:
                return i + 1
            self._victims_gone()
        return limit

    def events(self) -> None:
        """The batch before a pass: victims' exits, one exit, one commit, arrivals back to the queue size."""
        s = self.sched
        self.clock.t += STEP_S
        now = self.clock.t
        self._victims_gone()
        if len(self.running):
            jid = self.running.pick(self.rng)
            self.running.discard(jid)
            s.report_exit(jid, s.jobs[jid].epoch, "finished")
            self.counts["exits"] += 1
            self._drain()
        if len(self.running):
            job = s.jobs[self.running.pick(self.rng)]
            # no more work than the run has had time for, or the core rejects it (a commit, not a rejection, is timed)
            ran = job.resume_from_s + now - job.started_s
            s.report_commit(job.id, job.epoch, max(job.committed_s, min(job.committed_s + COMMIT_STEP_S, ran)))
            self.counts["commits"] += 1
        for _ in range(max(1, self.target + 1 - len(s.queue))):
            s.submit(self.specs.take(now))
            self.counts["arrivals"] += 1
        s.advance()
        self._drain()

    def measure(self, ticks: int, profile: cProfile.Profile | None = None) -> dict[str, Any]:
        s = self.sched
        lat: list[int] = []
        starts = worked = 0
        queue_min, queue_max = math.inf, 0  # the queue as each timed pass finds it
        counts0 = dict(self.counts)
        passes0 = s.passes
        clock = time.perf_counter_ns
        for _ in range(ticks):
            self.events()
            queue_min, queue_max = min(queue_min, len(s.queue)), max(queue_max, len(s.queue))
            if profile is not None:
                profile.enable()
            t0 = clock()
            n = s.tick()
            t1 = clock()
            if profile is not None:
                profile.disable()
            lat.append(t1 - t0)
            starts += n
            worked += n > 0
            self._drain()
        out: dict[str, Any] = _stats_ms(lat)
        out.update(
            ticks=ticks,
            passes=s.passes - passes0,
            starts_per_tick=starts / max(1, ticks),
            ticks_with_starts=worked / max(1, ticks),
            queue_min=queue_min,
            queue_max=queue_max,
            running=len(self.running),
            **{f"{k}_per_tick": (self.counts[k] - counts0[k]) / max(1, ticks) for k in self.counts},
        )
        return out

    def baseline(self, ticks: int) -> dict[str, Any]:
        """The full-sort pass timed on the states our passes see (then our pass moves the state on)."""
        s = self.sched
        pools_of: dict[str, tuple[str, ...]] = {}
        nodes_by_pool = {p: [s.cap.nodes[n] for n in names] for p, names in s.cap.pool_nodes.items()}
        lat: list[int] = []
        placed = 0
        clock = time.perf_counter_ns
        for _ in range(ticks):
            self.events()
            pending = [s.jobs[j] for j in s.queue.jobs()]
            for j in pending:
                if j.id not in pools_of:
                    pools_of[j.id] = pools_for(j, s.cap.pools, s.policy.spot_rule)
            t0 = clock()
            got = full_sort_pass(pending, s.tenants, nodes_by_pool, s.cap.claimed, pools_of)
            t1 = clock()
            lat.append(t1 - t0)
            placed += len(got)
            s.tick()
            self._drain()
        out: dict[str, Any] = _stats_ms(lat)
        out.update(ticks=ticks, starts_per_tick=placed / max(1, ticks), queued=len(s.queue))
        return out


def _top(prof: cProfile.Profile, n: int = 15) -> list[dict[str, Any]]:
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {"function": f"{file.rsplit('/', 1)[-1]}:{line}:{fn}", "calls": nc, "tottime_s": tt, "cumtime_s": ct}
        )
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:n]


def run(
    jobs: int = 100_000,
    nodes: int = 2048,
    gpus_per_node: int = 8,
    *,
    ticks: int = 2000,
    baseline_ticks: int = 50,
    warmup: int = 50,
    sim_jobs: int = 100_000,
    sim: bool = True,
    seed: int = 0,
    profile: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    if jobs < 10 or nodes < 1 or gpus_per_node < 1 or ticks < 1 or baseline_ticks < 1 or sim_jobs < 1:
        raise ValueError("jobs >= 10, nodes >= 1, gpus_per_node >= 1, ticks >= 1, baseline ticks >= 1, sim jobs >= 1")
    say = on_step or (lambda s: None)
    small = jobs // 10
    out: dict[str, Any] = {
        "config": {
            "jobs": jobs,
            "small_jobs": small,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "pools": {p.name: p.nodes for p in synthetic_cluster(nodes=nodes, gpus_per_node=gpus_per_node).pools},
            "ticks": ticks,
            "warmup_ticks": warmup,
            "baseline_ticks": baseline_ticks,
            "sim_jobs": sim_jobs if sim else 0,
            "seed": seed,
            "policy": "goodput",
            "core": native.status().label,  # compiled (mypyc) or pure Python: say which was timed
        },
        "scales": {},
    }
    prof = cProfile.Profile() if profile else None
    for queued in (small, jobs):
        b = _Bench(queued, nodes, gpus_per_node, seed, say)
        for i in range(warmup):
            if i % 10 == 0:
                say(f"{queued:,} queued: warm-up pass {i}/{warmup}")
            b.events()
            b.sched.tick()
            b._drain()
        say(f"{queued:,} queued: timing {ticks} passes")
        gc.collect()
        res = b.measure(ticks)
        res.update(
            queued_target=queued,
            setup_s=b.setup_s,
            settle_passes=b.settle_passes,
            classes=b.sched.queue.classes(),
            jobs_known=len(b.sched.jobs),
        )
        if queued == jobs:
            say(f"{queued:,} queued: timing {baseline_ticks} full-sort passes (the naive baseline)")
            gc.collect()
            out["baseline"] = b.baseline(baseline_ticks)
            if prof is not None:
                say(f"{queued:,} queued: profiling {ticks} more passes")
                res["profiled"] = b.measure(ticks, prof)
        out["scales"][str(queued)] = res
        del b
        gc.collect()
    big, lo = out["scales"][str(jobs)], out["scales"][str(small)]
    out.update(
        tick_p50_ms=big["p50_ms"],
        tick_p99_ms=big["p99_ms"],
        tick_max_ms=big["max_ms"],
        tick_p50_ms_10k=lo["p50_ms"],
        tick_p99_ms_10k=lo["p99_ms"],
        tick_max_ms_10k=lo["max_ms"],
        growth_100k_over_10k=big["p50_ms"] / lo["p50_ms"] if lo["p50_ms"] > 0 else math.inf,
        baseline_p50_ms=out["baseline"]["p50_ms"],
        speedup_vs_full_sort=out["baseline"]["p50_ms"] / big["p50_ms"] if big["p50_ms"] > 0 else math.inf,
        starts_per_tick=big["starts_per_tick"],
        sim_events_per_s=None,
        sim_wall_s=None,
    )
    if prof is not None:
        prof.dump_stats(profile)
        out["profile"] = {"path": profile, "top_tottime": _top(prof)}
    if sim:
        out["sim"] = _simulate(sim_jobs, nodes, gpus_per_node, seed, say)
        out["sim_events_per_s"] = out["sim"]["events_per_s"]
        out["sim_wall_s"] = out["sim"]["wall_s"]
    goals = {
        f"tick p50 <= {GOAL_P50_MS:g} ms @ {jobs:,} queued": out["tick_p50_ms"] <= GOAL_P50_MS,
        f"tick p99 <= {GOAL_P99_MS:g} ms @ {jobs:,} queued": out["tick_p99_ms"] <= GOAL_P99_MS,
        f"p50 growth {small:,} -> {jobs:,} queued <= {GOAL_GROWTH:g}x": out["growth_100k_over_10k"] <= GOAL_GROWTH,
        f"speedup vs full-sort pass >= {GOAL_SPEEDUP:g}x @ {jobs:,}": out["speedup_vs_full_sort"] >= GOAL_SPEEDUP,
    }
    if sim:
        goals[f"simulator >= {GOAL_SIM_EVENTS_PER_S:,.0f} events/s"] = out["sim_events_per_s"] >= GOAL_SIM_EVENTS_PER_S
    out["goals"] = goals
    out["pass"] = all(goals.values())
    return out


def _simulate(n: int, nodes: int, gpus_per_node: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    from goodput.sched.sim.simulator import simulate

    cluster = synthetic_cluster(nodes=nodes, gpus_per_node=gpus_per_node)
    say(f"simulator: drawing {n:,} jobs")
    jobs = synthetic(n, nodes=nodes, gpus_per_node=gpus_per_node, seed=seed)
    shrunk = cap_gangs(jobs, list(cluster.pools))
    t0 = time.perf_counter()

    def progress(t: float, done: int, total: int) -> None:
        el = time.perf_counter() - t0
        say(f"simulator: {done:,}/{total:,} jobs done, simulated {t / 3600:.1f} h, {el:.0f} s wall")

    say(f"simulator: {n:,} jobs on {nodes} nodes")
    r = simulate(jobs, cluster, POLICIES["goodput"], check_log=False, progress=progress)
    return {
        "jobs": n,
        "gangs_shrunk": shrunk,
        "events": len(r.events),
        "world_events": r.world_events,
        "passes": r.extra.get("passes", 0),
        "wall_s": r.wall_s,
        "events_per_s": len(r.events) / r.wall_s if r.wall_s > 0 else 0.0,
        "horizon_h": r.horizon_s / 3600.0,
        "jobs_by_state": r.jobs,
    }


def render(res: dict, console: Any) -> None:
    from rich.table import Table

    cfg = res["config"]
    console.print(
        f"[bold]goodput bench sched[/bold]: {cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs "
        f"(pools {', '.join(f'{k} {v}' for k, v in cfg['pools'].items())}), full of running jobs; "
        f"each pass preceded by one arrival, one finished exit, one commit report and the victims' exits; "
        f"{cfg['ticks']} timed passes after {cfg['warmup_ticks']} warm-up, only tick() timed; "
        f"scheduler core: {cfg['core']}"
    )
    t = Table(title="scheduling pass latency (Scheduler.tick; the naive pass on the same states)")
    for c in (
        "pass",
        "queued",
        "p50 ms",
        "p99 ms",
        "max ms",
        "mean ms",
        "starts",
        "with a start",
        "preempts",
        "queue seen",
    ):
        t.add_column(c, justify="right")
    for q, s in res["scales"].items():
        t.add_row(
            "goodput",
            f"{int(q):,}",
            f"{s['p50_ms']:.3f}",
            f"{s['p99_ms']:.3f}",
            f"{s['max_ms']:.3f}",
            f"{s['mean_ms']:.3f}",
            f"{s['starts_per_tick']:.2f}",
            f"{100 * s['ticks_with_starts']:.0f} %",
            f"{s['preemptions_per_tick']:.2f}",
            f"{s['queue_min']:,}-{s['queue_max']:,}",
        )
    b = res["baseline"]
    t.add_row(
        "full sort",
        f"{b['queued']:,}",
        f"{b['p50_ms']:.3f}",
        f"{b['p99_ms']:.3f}",
        f"{b['max_ms']:.3f}",
        f"{b['mean_ms']:.3f}",
        f"{b['starts_per_tick']:.2f}",
        "",
        "",
        "",
    )
    console.print(t)
    console.print(
        f"growth of the p50 from {cfg['small_jobs']:,} to {cfg['jobs']:,} queued: {res['growth_100k_over_10k']:.2f}x; "
        f"the naive pass (sort everything, first fit; {b['ticks']} passes on the same states): "
        f"{res['speedup_vs_full_sort']:.1f}x slower than ours at p50; starts and preempts are per pass; "
        f"queue classes (shape x pools x tenant x priority): "
        + ", ".join(f"{int(q):,} queued {s['classes']:,}" for q, s in res["scales"].items())
    )
    if res.get("sim"):
        s = res["sim"]
        console.print(
            f"simulator (goodput policy, {s['jobs']:,} synthetic jobs, checker off): {s['events']:,} events in "
            f"{s['wall_s']:.1f} s = {s['events_per_s']:,.0f} events/s; {s['passes']:,} passes; "
            f"{s['horizon_h']:.1f} h simulated"
        )
    if res.get("profile"):
        p = Table(
            title=f"profile of {cfg['ticks']} more passes @ {cfg['jobs']:,} (by own time; {res['profile']['path']})"
        )
        for c in ("function", "calls", "own s", "cumulative s"):
            p.add_column(c)
        for r in res["profile"]["top_tottime"]:
            p.add_row(r["function"], f"{r['calls']:,}", f"{r['tottime_s']:.3f}", f"{r['cumtime_s']:.3f}")
        console.print(p)
    g = Table(title="goals")
    g.add_column("goal")
    g.add_column("result")
    for k, v in res["goals"].items():
        g.add_row(k, "[green]PASS[/green]" if v else "[red]MISS[/red]")
    console.print(g)
