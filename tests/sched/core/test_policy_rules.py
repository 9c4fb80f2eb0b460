"""Issue 23's policy rules, each driven by hand through the core and each failing on the code before
it: reservations that hold and never depend on a name, time limits, the churn guards, the
operator's governance (weights on decayed usage, quotas with borrowing and reclaim), reasons kept
apart from ids, and the missing edges (unkillable kills, the infrastructure backoff and budget, a
claim withdrawn)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from goodput.sched.core.executor import ManualClock, RecordingExecutor
from goodput.sched.core.governance import Governance, Limits, TenantSpec
from goodput.sched.core.model import Checkpointing, Health, Job, JobState, Pool, PoolKind
from goodput.sched.core.policy import POLICIES
from goodput.sched.core.scheduler import Scheduler
from goodput.sched.sim.checker import check
from goodput.sched.sim.simulator import simulate
from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

N = [f"od-{i:05d}" for i in range(8)]
CKPT = Checkpointing(interval_s=600.0, write_s=10.0, stall_s=1.0, restart_s=30.0, grace_s=60.0)
NO_CKPT = Checkpointing(grace_s=30.0)


def make(nodes: int = 2, gov: Governance | None = None, pol: str = "goodput") -> tuple[Scheduler, ManualClock]:
    clock = ManualClock(0.0)
    pools = [Pool("od", PoolKind.ON_DEMAND, nodes, 8, 4.0)]
    s = Scheduler(pools, clock=clock, executor=RecordingExecutor(), policy=POLICIES[pol], governance=gov)
    return s, clock


def job(jid: str, nodes: int = 1, gpn: int = 8, prio: int = 0, tenant: str = "a", limit: float = 100.0, **kw) -> Job:
    submit = kw.pop("submit_s", 0.0)
    return Job(jid, tenant, prio, nodes, gpn, submit, duration_s=limit, limit_s=limit, **kw)


def recs(s: Scheduler, event: str, jid: str | None = None) -> list[dict]:
    return [r for r in s.log.records if r["event"] == event and (jid is None or r.get("job") == jid)]


def at(s: Scheduler, clock: ManualClock, t: float) -> None:
    clock.t = float(t)
    s.advance()
    s.tick()


# ------------------------------------------------------------------------------------------------ 1. reservations


def _stream(head_tenant: str, small_tenant: str) -> float:
    """The issue's starvation: a 2x8 gang behind a stream of short 1x8 jobs of another tenant, all
    at one priority; returns when the gang starts."""
    s, clock = make(nodes=3)
    s.submit(job("x0", tenant=small_tenant, limit=300.0))
    s.submit(job("x1", tenant=small_tenant, limit=300.0))
    s.submit(job("x2", tenant=small_tenant, limit=300.0))
    s.tick()
    s.submit(job("gang", nodes=2, tenant=head_tenant, limit=1000.0))
    s.tick()
    n = 3
    t = 0.0
    while s.jobs["gang"].state is JobState.PENDING and t < 20_000:
        t += 100.0
        clock.t = t
        for j in list(s.jobs.values()):
            if j.state is JobState.RUNNING and j.id != "gang" and t >= j.started_s + 300.0:
                s.report_exit(j.id, j.epoch, "finished")
        s.submit(job(f"x{n}", tenant=small_tenant, limit=300.0, submit_s=t))
        n += 1
        s.advance()
        s.tick()
    assert check(s.log.records, {n_: 8 for n_ in N[:3]}).ok
    return s.jobs["gang"].first_start_s


def test_a_reservation_holds_whatever_the_tenants_are_called() -> None:
    # before: the gang started at 69,656 s when its tenant was `tA` and at 972 s when it was `A0`
    starts = {_stream(h, x) for h, x in [("tA", "B"), ("A0", "B"), ("zz", "aa"), ("aa", "zz")]}
    assert len(starts) == 1
    assert starts.pop() <= 400.0  # by its reservation: the first two small jobs' declared ends (+ margin)


def test_the_reserved_event_backfill_flag_and_t_never_later() -> None:
    s, clock = make(nodes=2)
    s.submit(job("x", limit=1000.0, ckpt=NO_CKPT))
    s.tick()
    s.submit(job("head", nodes=2))
    s.submit(job("short", limit=10.0, ckpt=NO_CKPT))  # done long before the reserved time
    s.tick()
    (r,) = recs(s, "reserved")
    # x's hold: its limit, then over_time_limit_s (60) and its grace (30)
    assert r["job"] == "head" and r["reserved_t"] == 1000.0 + 60 + 30 and r["nodes"] == [N[0], N[1]]
    (st,) = recs(s, "started", "short")
    assert st["backfill"] is True and "backfill" not in recs(s, "started", "x")[0]
    # passes go on: the reservation is kept (no new record) and never moves later
    for t in (5, 10, 20):
        clock.t = t
        if s.jobs["short"].state is JobState.RUNNING:
            s.report_exit("short", 1, "finished")
        s.submit(job(f"late{t}", limit=5000.0, submit_s=t))
        s.tick()
    assert len(recs(s, "reserved")) == 1
    # x finishes early: the reservation moves earlier (a new record) and the head starts
    clock.t = 500
    s.report_exit("x", 1, "finished")
    s.tick()
    assert s.jobs["head"].state is JobState.RUNNING and "backfill" not in recs(s, "started", "head")[0]
    assert all(s.jobs[f"late{t}"].state is JobState.PENDING for t in (5, 10, 20))


def _renamed(jobs: list[Job], seed: int) -> tuple[list[Job], dict[str, str], dict[str, str]]:
    rng = random.Random(seed)
    ids = [j.id for j in jobs]
    tenants = sorted({j.tenant for j in jobs})
    new_ids = [f"{rng.getrandbits(40):010x}" for _ in ids]
    new_tenants = [f"t{rng.getrandbits(30):08x}" for _ in tenants]
    rng.shuffle(new_ids)
    rng.shuffle(new_tenants)
    jmap = dict(zip(ids, new_ids))
    tmap = dict(zip(tenants, new_tenants))
    return [replace(j, id=jmap[j.id], tenant=tmap[j.tenant]) for j in jobs], jmap, tmap


def _same_schedule(a, b, jmap: dict[str, str], tmap: dict[str, str]) -> None:  # noqa: ANN001
    """Run ``b`` (renamed by ``jmap``/``tmap``) logged the same records as ``a``, name for name."""
    back = {v: k for k, v in jmap.items()}
    backt = {v: k for k, v in tmap.items()}

    def norm(rec: dict, undo: dict[str, str], undot: dict[str, str]) -> dict:
        out = {}
        for k, v in rec.items():
            if k == "candidates":
                continue  # the logged list's order among equal prices is not the schedule
            if k in ("job", "preemptor", "victim_of") and isinstance(v, str):
                v = undo.get(v, v)
            if k == "tenant":
                v = undot.get(v, v)
            out[k] = v
        return out

    assert len(a.events) == len(b.events)
    assert [norm(r, {}, {}) for r in a.events] == [norm(r, back, backt) for r in b.events]
    assert a.check.ok and b.check.ok


def test_a_head_that_arrives_on_a_full_cluster_gets_its_reservation_at_once() -> None:
    """X's 3-node gang is the first job of its priority when it arrives (X holds the least usage),
    and every node is busy. It is the head as much as it would be with a node free: its reservation
    is made now and binds the next passes, so Y's long job, first by fair share once Y's usage falls
    below X's, may not take the node Y's short job frees at 500. Without it (a full cluster planned
    no reservation) Y's job took that node and the gang waited until 5,590 instead of 1,000."""
    s, clock = make(nodes=3)
    s.submit(job("y0", tenant="Y", limit=1000.0))
    s.tick()
    at(s, clock, 9)
    s.submit(job("x0", nodes=2, tenant="X", limit=1000.0, submit_s=9.0))
    s.tick()
    at(s, clock, 10)
    s.submit(job("gang", nodes=3, tenant="X", limit=100.0, submit_s=10.0))
    s.submit(job("y1", tenant="Y", limit=5000.0, submit_s=10.0))
    s.tick()
    assert s.reservation is not None and s.reservation.job == "gang"
    assert s.reservation.t == 9.0 + 1000.0 + 60.0 + 30.0  # x0's hold: limit + over_time_limit_s + grace
    assert recs(s, "reserved", "gang")[0]["t"] == 10.0
    clock.t = 500.0
    s.report_exit("y0", 1, "finished")
    s.tick()
    assert s.jobs["y1"].state is JobState.PENDING  # 5,000 s would run past the gang's reserved start
    clock.t = 1000.0
    s.report_exit("x0", 1, "finished")
    s.tick()
    assert s.jobs["gang"].state is JobState.RUNNING and s.jobs["gang"].first_start_s == 1000.0
    assert check(s.log.records, {n: 8 for n in N[:3]}).ok


@pytest.mark.parametrize("seed", [1, 2])
def test_renaming_every_tenant_and_job_gives_the_same_schedule(seed: int) -> None:
    jobs = synthetic(600, seed=seed, nodes=24)
    cluster = synthetic_cluster(24, spot_share=0.0)  # every gang fits the on-demand pool
    a = simulate(jobs, cluster, POLICIES["goodput"])
    renamed, jmap, tmap = _renamed(jobs, seed)
    b = simulate(renamed, cluster, POLICIES["goodput"])
    _same_schedule(a, b, jmap, tmap)


def test_renaming_holds_with_spot_failures_reclaims_and_governed_tenants() -> None:
    """The same bijection where names could leak in most: tenants the cluster file names (weights,
    quotas that borrow and are reclaimed; renamed with their jobs), a spot pool with reclaims, node
    failures at the Llama 3 rate. The schedule is the same, name for name."""
    from goodput.sched.sim.compare import horizon_of, poisson_reclaims
    from goodput.sched.sim.interruptions import llama3_failures

    seed = 4
    jobs = [j for j in synthetic(500, seed=seed, nodes=18) if j.nodes <= 18]
    base = synthetic_cluster(24)  # od 18 nodes, spot 6
    tenants = sorted({j.tenant for j in jobs})
    spec = [
        {"name": t, "weight": 1 + i % 3, "quota_gpus": 32 * (i % 2), "max_priority": 9}
        for i, t in enumerate(tenants[:6])
    ]
    horizon = horizon_of(jobs)
    extra = llama3_failures(base, horizon, seed=seed) + poisson_reclaims(base, horizon, seed=seed)
    assert extra
    renamed, jmap, tmap = _renamed(jobs, seed)

    def run(js: list[Job], names: dict[str, str]):  # noqa: ANN202
        gov = Governance.from_obj([dict(t, name=names.get(t["name"], t["name"])) for t in spec], None)
        return simulate(js, replace(base, governance=gov), POLICIES["goodput"], extra_events=extra)

    a, b = run(jobs, {}), run(renamed, tmap)
    reasons = {r.get("reason") for r in a.events if r["event"] == "preempt_requested"}
    assert {"reclaim", "priority", "quota"} <= reasons, reasons  # each kind of eviction ran
    assert any(r["event"] == "node_lost" for r in a.events)
    _same_schedule(a, b, jmap, tmap)


def test_equal_declared_ends_are_replayed_in_submission_order_not_by_id() -> None:
    """Two running jobs end at the same declared instant on two nodes: which node the head
    reserves (and so where a later long job may backfill) followed their ids (the pool's ends
    were kept as (end, id)); swapping the two ids moved the reservation and the backfill."""
    from goodput.sched.sim.formats import Cluster

    def run(first: str, second: str) -> list[tuple]:
        jobs = [
            Job(first, "t", 0, 1, 6, 0.0, duration_s=1000.0, limit_s=1000.0),
            Job(second, "t", 0, 1, 6, 0.0, duration_s=1000.0, limit_s=1000.0),
            Job("head", "t", 0, 1, 8, 0.0, duration_s=100.0, limit_s=100.0),
            Job("long", "t", 0, 1, 2, 10.0, duration_s=5000.0, limit_s=5000.0),
        ]
        res = simulate(jobs, Cluster(pools=[Pool("od", PoolKind.ON_DEMAND, 2, 8, 1.0)]), POLICIES["goodput"])
        assert res.check.ok
        names = {first: "A", second: "B"}
        return [
            (r["t"], r["event"], names.get(r["job"], r["job"]), tuple(r["nodes"]))
            for r in res.events
            if r["event"] in ("started", "reserved")
        ]

    assert run("a", "b") == run("b", "a")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_renaming_holds_where_submit_times_and_limits_tie(seed: int) -> None:
    """The bijection where ties are everywhere: a handful of submit instants and limits, jobs
    running past their limits, ids and tenants at the edges of the id set. Ties break by
    submission order, never by a name (the running jobs' ends, the timers)."""
    from goodput.sched.sim.formats import Cluster

    rng = random.Random(seed)
    ck = Checkpointing(interval_s=100.0, write_s=5.0, stall_s=1.0, restart_s=20.0, grace_s=30.0)
    jobs = []
    for i in range(60):
        lim = rng.choice([300.0, 600.0, 900.0])
        jobs.append(
            Job(
                f"j{i:03d}",
                rng.choice("abcd"),
                rng.choice([0, 0, 5]),
                rng.choice([1, 1, 2]),
                rng.choice([4, 8]),
                rng.choice([0.0, 0.0, 700.0, 1400.0]),
                duration_s=lim * rng.choice([0.5, 1.0, 3.0]),
                limit_s=lim,
                ckpt=rng.choice([ck, NO_CKPT]),
            )
        )
    edge = ["0", "9", "A", "Z", "a", "z", "0-", "0.", "0:", "0@", "a-b", "Z@z", "9.9", "zz:zz", "a" * 128]
    new_ids = list(dict.fromkeys(edge + [f"{rng.choice('0aZ')}{rng.getrandbits(24):x}" for _ in jobs]))[: len(jobs)]
    rng.shuffle(new_ids)
    new_t = ["zz", "0", "A@b", "m.n"]
    rng.shuffle(new_t)
    jmap = {j.id: n for j, n in zip(jobs, new_ids)}
    tmap = dict(zip("abcd", new_t))
    renamed = [replace(j, id=jmap[j.id], tenant=tmap[j.tenant]) for j in jobs]
    gov = Governance.from_obj(None, {"min_run_s": 0, "max_preemptions": 3})
    cluster = Cluster(pools=[Pool("od", PoolKind.ON_DEMAND, 4, 8, 4.0)], governance=gov)
    a = simulate(jobs, cluster, POLICIES["goodput"])
    b = simulate(renamed, cluster, POLICIES["goodput"])
    _same_schedule(a, b, jmap, tmap)


# ------------------------------------------------------------------------------------------------ 2. time limits


def test_a_run_is_stopped_at_its_time_limit_and_fails_with_reason_time_limit() -> None:
    s, clock = make(nodes=1)
    s.submit(job("j", limit=500.0, ckpt=CKPT))
    s.tick()
    clock.t = 300
    s.report_commit("j", 1, 290.0)
    at(s, clock, 559)
    assert s.jobs["j"].state is JobState.RUNNING  # limit_s + over_time_limit_s = 560
    at(s, clock, 560)
    (p,) = recs(s, "preempt_requested", "j")
    assert p["reason"] == "time_limit" and p["preemptor"] is None and p["checkpoint"] is True
    assert p["deadline_s"] == 560 + 60  # its grace
    at(s, clock, 620)
    assert s.executor.calls[-1] == ("kill", "j", 1)  # the grace is over: killed
    clock.t = 621
    s.report_exit("j", 1, "killed")
    j = s.jobs["j"]
    assert j.state is JobState.FAILED and j.fail_reason == "time_limit" and j.committed_s == 290.0
    (f,) = recs(s, "failed", "j")
    assert f["reason"] == "time_limit"
    assert recs(s, "submitted", "j")[0]["limit_s"] == 500.0


def test_a_rerun_is_held_to_its_restart_plus_the_work_left_not_to_limit_s() -> None:
    """The true bound (docs/SCHED.md, Time limits): a rerun may hold its GPUs for restart_s +
    limit_s - committed, then over_time_limit_s and its grace. This job yielded before any commit,
    so its rerun runs past limit_s + over_time_limit_s + grace (500 + 60 + 60) by its restart (300):
    it is stopped at 300 + 500 + 60 and killed 60 s later, and the checker's over_limit agrees."""
    ck = Checkpointing(interval_s=600.0, write_s=10.0, stall_s=1.0, restart_s=300.0, grace_s=60.0)
    s, clock = make(nodes=1)
    s.submit(job("j", limit=500.0, ckpt=ck))
    s.tick()
    clock.t = 10.0
    s.report_exit("j", 1, "preempted")  # unasked, before any commit
    s.tick()
    j = s.jobs["j"]
    assert j.state is JobState.RUNNING and j.epoch == 2 and j.run_limit_s == 800.0
    at(s, clock, 10.0 + 800.0 + 60.0 - 1.0)
    assert j.state is JobState.RUNNING  # past limit_s + over_time_limit_s already, not yet stopped
    at(s, clock, 10.0 + 800.0 + 60.0)
    assert j.state is JobState.PREEMPTING and j.preempt_reason == "time_limit"
    assert j.deadline_s == 10.0 + 800.0 + 60.0 + 60.0
    at(s, clock, j.deadline_s)
    s.report_exit("j", 2, "killed")
    assert j.state is JobState.FAILED and j.fail_reason == "time_limit"
    ran = j.end_s - j.started_s
    assert ran == 300.0 + 500.0 + 60.0 + 60.0 > 500.0 + 60.0 + 60.0
    assert check(s.log.records, {N[0]: 8}).ok


def test_a_job_over_its_limit_no_longer_holds_off_the_head() -> None:
    # before: a job declaring limit_s=500 ran 50,000 s and the head reserved for t=1000 waited
    s, clock = make(nodes=2)
    s.submit(job("liar", limit=500.0, ckpt=NO_CKPT))
    s.submit(job("other", limit=1000.0, ckpt=NO_CKPT))
    s.tick()
    s.submit(job("head", nodes=2, limit=100.0))
    s.tick()
    t = 0.0
    while s.jobs["head"].state is JobState.PENDING and t < 50_000:
        t += 10.0
        clock.t = t
        s.advance()
        for j in ("liar", "other"):
            jj = s.jobs[j]
            if jj.state is JobState.PREEMPTING and jj.substate == "killed":
                s.report_exit(j, jj.epoch, "killed")
        if t >= 1000 and s.jobs["other"].state is JobState.RUNNING:
            s.report_exit("other", 1, "finished")
        s.tick()
    assert s.jobs["head"].first_start_s <= 1000 + 60 + 30 + 10
    assert s.jobs["liar"].fail_reason == "time_limit"


# ------------------------------------------------------------------------------------------------ 3. churn


def test_a_young_run_is_no_candidate_for_priority_preemption() -> None:
    s, clock = make(nodes=1, gov=Governance(limits=Limits(min_run_s=600.0)))
    s.submit(job("low", limit=10_000.0, ckpt=CKPT))
    s.tick()
    at(s, clock, 100)
    s.submit(job("hi", prio=5, submit_s=100.0))
    s.tick()
    assert recs(s, "preempt_requested") == [] and s.jobs["hi"].state is JobState.PENDING
    at(s, clock, 600)  # low has run min_run_s: now a candidate
    (p,) = recs(s, "preempt_requested", "low")
    assert (p["reason"], p["preemptor"]) == ("priority", "hi")


def test_a_reclaim_still_takes_a_young_run() -> None:
    s, clock = make(nodes=1)
    s.submit(job("low", limit=10_000.0, ckpt=CKPT))
    s.tick()
    clock.t = 10
    s.reclaim_notice([N[0]], 130.0)
    (p,) = recs(s, "preempt_requested", "low")
    assert p["reason"] == "reclaim" and p["preemptor"] is None


def test_a_job_evicted_max_preemptions_times_is_no_candidate_any_more() -> None:
    s, clock = make(nodes=1, gov=Governance(limits=Limits(min_run_s=0.0, max_preemptions=2)))
    s.submit(job("low", limit=100_000.0, ckpt=CKPT))
    s.tick()
    t = 0.0
    for k in range(3):
        t += 100.0
        clock.t = t
        s.submit(job(f"hi{k}", prio=5, limit=10.0, submit_s=t))
        s.tick()
        if s.jobs["low"].state is JobState.PREEMPTING:
            clock.t = t + 1
            s.report_exit("low", s.jobs["low"].epoch, "preempted")
            s.tick()
            clock.t = t + 11
            s.report_exit(f"hi{k}", 1, "finished")
            s.tick()
    low = s.jobs["low"]
    assert low.evictions == 2 and low.state is JobState.RUNNING
    assert s.jobs["hi2"].state is JobState.PENDING  # it waits: low is no victim any more


def test_a_victims_price_counts_its_restart_and_the_work_it_would_redo() -> None:
    s, clock = make(nodes=2, gov=Governance(limits=Limits(min_run_s=0.0)))
    # same GPUs, same start: a never-checkpointing victim would redo 1000 s; a checkpointing one
    # pays only its restart (30 s) and its write
    s.submit(job("redo", limit=10_000.0, ckpt=Checkpointing(restart_s=30.0, grace_s=30.0)))
    s.submit(job("ckpt", limit=10_000.0, ckpt=CKPT))
    s.tick()
    at(s, clock, 1000)
    s.submit(job("hi", prio=5, submit_s=1000.0))
    s.tick()
    (p,) = recs(s, "preempt_requested")
    assert p["job"] == "ckpt"
    prices = {c["job"]: c["lost_gpu_s"] for c in p["candidates"]}
    assert prices["redo"] == 8 * (1000 + 30 + 10) and prices["ckpt"] == 8 * (0 + 30 + 11)


# ------------------------------------------------------------------------------------------------ 4. governance


def test_fair_share_remembers_usage() -> None:
    # before: a tenant that filled the cluster with 10 h jobs kept 2 of the next 3 nodes after
    # another tenant had waited 10 h (fair share read only the GPUs held at that instant)
    s, clock = make(nodes=3)
    for i in range(3):
        s.submit(job(f"big{i}", tenant="hog", limit=36_000.0))
    s.tick()
    for i in range(3):
        s.submit(job(f"w{i}", tenant="waiter", limit=36_000.0))
    for i in range(3):
        s.submit(job(f"h{i}", tenant="hog", limit=36_000.0, submit_s=0.0))
    clock.t = 36_000
    for i in range(3):
        s.report_exit(f"big{i}", 1, "finished")
    s.tick()
    got = sorted(j.tenant for j in s.jobs.values() if j.state is JobState.RUNNING)
    assert got == ["waiter"] * 3


def test_weight_divides_decayed_usage() -> None:
    gov = Governance(tenants={"A": TenantSpec("A", weight=4.0), "B": TenantSpec("B")})
    s, clock = make(nodes=3, gov=gov)
    s.submit(job("a1", tenant="A", limit=1000.0))
    s.submit(job("b1", tenant="B", limit=1000.0))
    s.submit(job("f", tenant="C", limit=100.0))
    s.tick()
    clock.t = 100
    s.submit(job("b2", tenant="B", submit_s=100.0))
    s.submit(job("a2", tenant="A", submit_s=100.0))
    s.report_exit("f", 1, "finished")
    s.tick()
    assert s.jobs["a2"].state is JobState.RUNNING and s.jobs["b2"].state is JobState.PENDING


def test_a_tenant_under_its_quota_reclaims_borrowed_gpus_by_preemption() -> None:
    gov = Governance(
        tenants={"g": TenantSpec("g", quota_gpus=16), "b": TenantSpec("b", quota_gpus=8)},
        limits=Limits(min_run_s=0.0),
    )
    s, clock = make(nodes=3, gov=gov)
    for i in range(3):
        s.submit(job(f"b{i}", tenant="b", prio=3, limit=10_000.0, ckpt=CKPT))
    s.tick()
    assert s.tenants["b"].usage_gpus == 24  # 16 borrowed beyond its quota of 8
    at(s, clock, 100)
    s.submit(job("g0", tenant="g", prio=0, nodes=2, submit_s=100.0))  # lower priority, but its quota
    s.tick()
    ps = recs(s, "preempt_requested")
    assert len(ps) == 2 and {p["reason"] for p in ps} == {"quota"} and {p["preemptor"] for p in ps} == {"g0"}
    assert s.jobs["g0"].claim  # b keeps its own quota: one of its jobs runs on
    assert sum(s.jobs[f"b{i}"].state is JobState.RUNNING for i in range(3)) == 1
    # a tenant at its quota reclaims nothing
    s.submit(job("g1", tenant="g", prio=0, submit_s=100.0))
    s.tick()
    assert len(recs(s, "preempt_requested")) == 2


def _leave(s: Scheduler) -> None:
    for j in list(s.jobs.values()):
        if j.state is JobState.PREEMPTING:
            s.report_exit(j.id, j.epoch, "killed")


def test_a_tenant_under_its_quota_reclaims_even_behind_a_borrowers_held_head_of_its_shape() -> None:
    """A borrows both nodes and its third 8-GPU job is the held head; B (quota 8) submits an
    8-GPU job of the same shape and priority. The reservation blocked the class for every
    tenant, so B never reached its reclaim: B held 0 for ever (no limits) or until one of A's
    jobs ended by itself (hostile review)."""
    gov = Governance(tenants={"A": TenantSpec("A", quota_gpus=8), "B": TenantSpec("B", quota_gpus=8)},
                     limits=Limits(min_run_s=0.0))  # fmt: skip
    s, clock = make(nodes=2, gov=gov)
    for i in range(3):
        s.submit(job(f"a{i}", tenant="A", limit=3600.0))
    s.tick()
    assert s.reservation is not None and s.reservation.job == "a2"
    s.submit(job("b0", tenant="B", limit=3600.0, submit_s=700.0))
    at(s, clock, 700)
    ps = recs(s, "preempt_requested")
    assert [(p["reason"], p["preemptor"]) for p in ps] == [("quota", "b0")]
    clock.t = 710.0
    _leave(s)
    at(s, clock, 710)
    assert s.jobs["b0"].state is JobState.RUNNING
    assert check(s.log.records, {n: 8 for n in N[:2]}).ok


def test_a_priority_preemption_takes_no_tenant_below_its_quota() -> None:
    """A and B each hold exactly their quota; A's priority-5 job evicted B's job, and B then
    reclaimed A's other job: two evictions where A's own job was the one to go."""
    gov = Governance(tenants={"A": TenantSpec("A", quota_gpus=8), "B": TenantSpec("B", quota_gpus=8)},
                     limits=Limits(min_run_s=0.0))  # fmt: skip
    s, clock = make(nodes=2, gov=gov)
    s.submit(job("a1", tenant="A", limit=50_000.0))
    s.tick()
    s.submit(job("b1", tenant="B", limit=50_000.0, submit_s=100.0))
    at(s, clock, 100)  # b1 started later: by price alone it is the cheaper victim
    s.submit(job("aH", tenant="A", prio=5, limit=100.0, submit_s=1000.0))
    for t in range(1000, 1100, 10):
        clock.t = float(t)
        _leave(s)
        at(s, clock, t)
    ps = recs(s, "preempt_requested")
    assert [(p["job"], p["reason"]) for p in ps] == [("a1", "priority")]
    assert s.jobs["b1"].state is JobState.RUNNING and s.jobs["aH"].state is JobState.RUNNING


def test_caps_lowered_by_the_operator_bind_jobs_accepted_before(tmp_path) -> None:  # noqa: ANN001
    """A job accepted under a cap of a day keeps its declared grace and restart in the store; the
    operator lowers the caps and restarts the scheduler on the same store. A priority preemption
    (and a cancel) gives it the new cap's notice, not its own day, and prices its restart at the
    cap: a new submission above the caps is refused as before."""
    from goodput.sched.core.governance import SubmissionRejected
    from goodput.sched.live.store import open_store

    url = f"sqlite:///{tmp_path}/s.db"
    pools = [Pool("od", PoolKind.ON_DEMAND, 2, 8, 1.0)]
    old = Governance.from_obj(None, {"max_grace_s": 86400, "max_restart_s": 86400, "min_run_s": 0})
    new = Governance.from_obj(None, {"max_grace_s": 60, "max_restart_s": 100, "min_run_s": 0})
    clock = ManualClock(0.0)
    st = open_store(url)
    s = Scheduler(pools, clock=clock, executor=RecordingExecutor(), store=st, governance=old)
    s.save_all()
    hog = Checkpointing(grace_s=86400.0, restart_s=86400.0)
    s.submit(Job("hog", "m", 0, 1, 8, 0.0, duration_s=1e6, limit_s=1e6, ckpt=hog))
    s.submit(Job("hog2", "m", 0, 1, 8, 0.0, duration_s=1e6, limit_s=1e6, ckpt=hog))
    s.tick()
    st.close()
    clock.t = 100.0
    st = open_store(url)
    s = Scheduler.restore(st, pools, clock=clock, executor=RecordingExecutor(), governance=new)
    s.submit(Job("urgent", "a", 9, 1, 8, 100.0, duration_s=100.0, limit_s=100.0))
    s.tick()
    p = recs(s, "preempt_requested")[-1]
    assert p["reason"] == "priority" and p["deadline_s"] == 160.0
    assert s._price(s.jobs["hog2"], 100.0).restart_s == 100.0
    s.cancel("hog2")
    assert recs(s, "preempt_requested", "hog2")[-1]["deadline_s"] == 160.0
    with pytest.raises(SubmissionRejected, match="grace_s"):
        s.submit(Job("again", "m", 0, 1, 8, 100.0, duration_s=10.0, limit_s=10.0, ckpt=hog))
    st.close()


# ------------------------------------------------------------------------------------------------ 5. reasons


@pytest.mark.parametrize("name", ["cancel", "node_loss", "reclaim", "drain", "time_limit"])
def test_no_job_id_is_ever_read_as_a_reason(name: str) -> None:
    s, clock = make(nodes=1, gov=Governance(limits=Limits(min_run_s=0.0)))
    s.submit(job("v", limit=10_000.0, ckpt=CKPT))
    s.tick()
    clock.t = 10
    s.submit(job(name, prio=5, submit_s=10.0))
    s.tick()
    (p,) = recs(s, "preempt_requested", "v")
    assert (p["reason"], p["preemptor"], p["victim_of"]) == ("priority", name, name)
    clock.t = 20
    s.report_exit("v", 1, "preempted")
    v = s.jobs["v"]
    assert v.state is JobState.PENDING and (v.preemptions, v.infra_losses, v.evictions) == (1, 0, 1)
    assert recs(s, "requeued", "v")[0]["reason"] == "preempted"
    assert s.jobs[name].state is JobState.RUNNING


def test_failed_carries_its_reason() -> None:
    s, clock = make(nodes=1)
    s.submit(job("j", limit=100.0, retry=replace(Job("x", "t", 0, 1, 1, 0.0).retry, max_failures=0)))
    s.tick()
    clock.t = 5
    s.report_exit("j", 1, "failed")
    (f,) = recs(s, "failed", "j")
    assert f["reason"] == "failure" and f["failures"] == 1


# ------------------------------------------------------------------------------------------------ 6. missing edges


def test_a_kill_whose_exit_never_comes_takes_its_nodes_out_and_requeues_the_job() -> None:
    s, clock = make(nodes=2)
    s.submit(job("hung", limit=10_000.0, ckpt=NO_CKPT))
    s.tick()
    clock.t = 10
    s.cancel("hung")  # asked to stop by t=40, killed then, its exit never reported
    s.submit(job("next", nodes=2, submit_s=10.0))
    at(s, clock, 40)
    assert s.executor.calls[-1] == ("kill", "hung", 1)
    at(s, clock, 339)
    assert s.jobs["hung"].state is JobState.PREEMPTING
    at(s, clock, 340)  # unkillable_s (300) after the kill: the node is taken out, the job released
    hung = s.jobs["hung"]
    assert hung.state is JobState.CANCELLED
    assert s.cap.nodes[N[0]].health is Health.LOST and s.cap.nodes[N[0]].used == 0
    assert [r["node"] for r in recs(s, "node_lost")] == [N[0]]
    assert recs(s, "exited", "hung")[-1]["status"] == "lost"
    assert check(s.log.records, {N[0]: 8, N[1]: 8}).ok


def test_an_unkillable_preemption_victim_is_requeued_as_an_infrastructure_loss() -> None:
    s, clock = make(nodes=1, gov=Governance(limits=Limits(min_run_s=0.0)))
    s.submit(job("v", limit=10_000.0, ckpt=NO_CKPT))
    s.tick()
    at(s, clock, 10)
    s.submit(job("hi", prio=5, submit_s=10.0))
    s.tick()
    at(s, clock, 40)  # the grace is over: killed
    at(s, clock, 340)
    v = s.jobs["v"]
    assert v.state is JobState.PENDING and v.substate == "backoff" and v.infra_losses == 1
    assert recs(s, "requeued", "v")[0]["reason"] == "infrastructure"
    assert s.jobs["hi"].state is JobState.PENDING and not s.jobs["hi"].claim  # its claimed node is gone


def test_infrastructure_losses_back_off_and_have_their_own_budget() -> None:
    s, clock = make(nodes=1, gov=Governance(limits=Limits(max_infra_losses=2, infra_backoff_s=60.0)))
    s.submit(job("j", limit=10_000.0))
    s.tick()
    t = 0.0
    delays = []
    for _ in range(3):
        t += 10.0
        clock.t = t
        s.report_exit("j", s.jobs["j"].epoch, "lost")
        j = s.jobs["j"]
        if j.state is JobState.FAILED:
            break
        delays.append(j.eligible_s - t)
        t = j.eligible_s
        at(s, clock, t)
        assert j.state is JobState.RUNNING
    j = s.jobs["j"]
    assert delays == [60.0, 120.0]
    assert j.state is JobState.FAILED and j.fail_reason == "infrastructure" and j.failures == 0
    assert recs(s, "failed", "j")[0]["reason"] == "infrastructure"


def test_a_job_that_always_yields_unasked_fails_once_its_yield_budget_is_spent() -> None:
    """Exit 75 means "checkpointed, yielding". Nobody asked this job to leave, and it yields at
    every start: requeued as a preemption (retry budget untouched) up to ``max_unasked_yields``
    times, then ``failed`` with reason ``unasked_yields``, not requeued for ever."""
    s, clock = make(nodes=1, gov=Governance(limits=Limits(max_unasked_yields=3)))
    s.submit(job("j", limit=10_000.0, ckpt=CKPT))
    s.tick()
    starts = 0
    for t in range(1, 20):
        j = s.jobs["j"]
        if j.state is not JobState.RUNNING:
            break
        starts += 1
        clock.t = float(t)
        assert s.report_commit("j", j.epoch, float(t))
        s.report_exit("j", j.epoch, "preempted")
        s.tick()
    j = s.jobs["j"]
    assert starts == 4  # three yields requeued, the fourth spends the budget
    assert j.state is JobState.FAILED and j.fail_reason == "unasked_yields"
    assert (j.unasked_yields, j.preemptions, j.failures) == (4, 4, 0)
    assert j.committed_s == 4.0  # its checkpoint is kept
    assert [r["reason"] for r in recs(s, "requeued", "j")] == ["preempted"] * 3
    assert recs(s, "failed", "j")[0]["reason"] == "unasked_yields"
    assert check(s.log.records, {N[0]: 8}).ok


def test_a_yield_that_was_asked_for_is_not_counted_against_the_yield_budget() -> None:
    """A job asked to leave (here by a reclaim) that exits 75 is a preemption like any other: its
    ``unasked_yields`` stay 0 however often it happens."""
    s, clock = make(nodes=1, gov=Governance(limits=Limits(max_unasked_yields=0)))
    s.submit(job("j", limit=10_000.0, ckpt=CKPT))
    s.tick()
    for t in (1.0, 2.0, 3.0):
        clock.t = t
        s.reclaim_notice([N[0]], t + 60.0)
        s.report_exit("j", s.jobs["j"].epoch, "preempted")
        s.node_up([N[0]])
        s.tick()
        assert s.jobs["j"].state is JobState.RUNNING
    assert s.jobs["j"].unasked_yields == 0 and s.jobs["j"].preemptions == 3


@pytest.mark.parametrize("how", ["cancel", "resize"])
def test_cancelling_or_resizing_a_claimant_withdraws_its_claim(how: str) -> None:
    s, clock = make(nodes=2, gov=Governance(limits=Limits(min_run_s=0.0)))
    s.submit(job("v", limit=10_000.0, ckpt=CKPT))
    s.tick()
    at(s, clock, 10)
    s.submit(job("hi", nodes=2, prio=5, submit_s=10.0))
    s.tick()
    assert s.jobs["hi"].claim == (N[0], N[1]) and s.jobs["v"].state is JobState.PREEMPTING
    s.submit(job("other", submit_s=10.0))
    if how == "cancel":
        s.cancel("hi")
    else:
        s.resize("hi", 1)
    s.tick()
    assert not s.cap.claimed  # nothing held back for a claim that is gone
    # N1 is offered again at once: to the other job, or to hi itself on its new shape
    first = "other" if how == "cancel" else "hi"
    assert s.jobs[first].state is JobState.RUNNING and s.jobs[first].placement == (N[1],)
    clock.t = 20
    s.report_exit("v", 1, "preempted")  # the victim already asked goes on leaving; nobody waits for it
    s.tick()
    assert s.jobs["hi"].state is (JobState.CANCELLED if how == "cancel" else JobState.RUNNING)
    assert check(s.log.records, {N[0]: 8, N[1]: 8}).ok


def test_the_default_limits_are_the_documented_ones() -> None:
    lim = Limits()
    assert (lim.max_grace_s, lim.max_restart_s, lim.min_run_s, lim.max_preemptions) == (600, 1800, 600, 5)
    assert (lim.over_time_limit_s, lim.unkillable_s, lim.usage_half_life_s) == (60, 300, 604800)
    assert lim.max_unasked_yields == 10
    assert math.isclose(lim.decay(604800.0), 0.5)


def test_a_priority_preemption_is_made_only_when_cheaper_than_waiting() -> None:
    # low never checkpoints and has run 2000 s: evicting it loses 8 x (2000 + 30 + 10) GPU-s; hi
    # would otherwise wait for other's hold (its limit, over_time_limit_s 60, grace 30): that wait
    # in GPU-seconds times Policy.wait_worth (0.1) must cover the loss
    gov = Governance(limits=Limits(min_run_s=0.0))
    for pol, wait_s, preempted in [
        ("goodput", 100.0, False),
        ("goodput", 30_000.0, True),
        ("kueue-victims", 100.0, True),
    ]:
        s, clock = make(nodes=2, gov=gov, pol=pol)
        s.submit(job("low", limit=100_000.0, ckpt=Checkpointing(restart_s=30.0, grace_s=30.0)))
        s.tick()
        at(s, clock, 1990)
        s.submit(job("other", prio=5, limit=wait_s - 80, ckpt=NO_CKPT, submit_s=1990.0))  # no victim
        s.tick()
        at(s, clock, 2000)
        s.submit(job("hi", prio=5, submit_s=2000.0))
        s.tick()
        got = [r["job"] for r in recs(s, "preempt_requested") if r["reason"] == "priority"]
        assert got == (["low"] if preempted else []), (pol, wait_s)
        assert s.refused == (0 if preempted else 1)


def test_a_simulation_refuses_a_job_outside_the_limits_before_it_runs() -> None:
    from goodput.sched.core.governance import SubmissionRejected
    from goodput.sched.sim.formats import Cluster

    gov = Governance(tenants={"a": TenantSpec("a", max_priority=3)})
    cluster = Cluster(pools=[Pool("od", PoolKind.ON_DEMAND, 2, 8, 4.0)], governance=gov)
    ok = job("ok", limit=10.0)
    bad = job("bad", prio=4, limit=10.0, submit_s=1e6)
    with pytest.raises(SubmissionRejected) as e:
        simulate([ok, bad], cluster, POLICIES["goodput"])
    assert e.value.field == "priority" and "'bad'" in str(e.value)


def test_a_refused_preemption_is_searched_for_again_only_after_preempt_retry_s() -> None:
    """A refusal is not re-searched every pass (that was most of a simulation's time): the job's
    ``preempt_retry_s`` (stored with it) and a timer bring the next search PREEMPT_RETRY_S later,
    even when nothing else happens; a victim that became cheap meanwhile is taken then."""
    from goodput.sched.core.preemption import PREEMPT_RETRY_S

    gov = Governance(limits=Limits(min_run_s=0.0))
    s, clock = make(nodes=2, gov=gov)
    # low cannot checkpoint within its grace: evicting it loses everything since its last commit
    slow = Checkpointing(interval_s=600.0, write_s=100.0, stall_s=1.0, restart_s=30.0, grace_s=30.0)
    s.submit(job("low", limit=100_000.0, ckpt=slow))
    s.tick()
    at(s, clock, 1990)
    s.submit(job("other", prio=5, limit=5000.0, ckpt=NO_CKPT, submit_s=1990.0))
    s.tick()
    at(s, clock, 2000)
    s.submit(job("hi", prio=5, submit_s=2000.0))
    s.tick()
    assert s.refused == 1 and not recs(s, "preempt_requested")  # 2000 s of low's work: too dear
    assert s.jobs["hi"].preempt_retry_s == 2000.0 + PREEMPT_RETRY_S
    clock.t = 2010.0
    assert s.report_commit("low", 1, 2010.0)  # now evicting low loses 20 s of work, not 2000
    s.tick()
    clock.t = 2020.0
    s.submit(job("filler", gpn=1, submit_s=2020.0))  # a pass: hi is not searched for in it
    s.tick()
    assert s.refused == 1 and not recs(s, "preempt_requested")
    assert s.next_timer() == 2000.0 + PREEMPT_RETRY_S  # nothing else is due: the timer brings the pass
    at(s, clock, s.next_timer())
    (r,) = recs(s, "preempt_requested")
    assert (r["job"], r["reason"], r["preemptor"], r["t"]) == ("low", "priority", "hi", 2030.0)
    assert check(s.log.records, {n: 8 for n in N[:2]}).ok
