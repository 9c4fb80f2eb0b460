"""The simulator end to end: every policy on small workloads, audited by the checker and the ledger."""

from __future__ import annotations

import collections
import json
import math

import pytest

from goodput.sched.core.model import Checkpointing, Job, PoolKind, RetryPolicy
from goodput.sched.core.policy import POLICIES
from goodput.sched.sim.checker import check
from goodput.sched.sim.formats import ClusterEvent, read_cluster_json, read_workload_csv
from goodput.sched.sim.interruptions import llama3_failures
from goodput.sched.sim.ledger import CATEGORIES, Account
from goodput.sched.sim.simulator import SimResult, simulate
from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

# gangs of the synthetic workload are capped at ``nodes``: 12 fit the 12-node on-demand pool of a
# 16-node synthetic cluster (the other 4 are spot)
JOBS = synthetic(300, nodes=12, seed=1)
CLUSTER = synthetic_cluster(nodes=16)
EPS = 1e-6


@pytest.fixture(scope="module")
def runs() -> dict[str, SimResult]:
    return {name: simulate(JOBS, CLUSTER, policy) for name, policy in POLICIES.items()}


def events_of(r: SimResult, event: str) -> list[dict]:
    return [e for e in r.events if e["event"] == event]


def test_the_workload_fits_the_cluster_and_has_preemptions(runs) -> None:
    assert {p.name: p.nodes for p in CLUSTER.pools} == {"od": 12, "spot": 4}
    assert max(j.nodes for j in JOBS) == 12 and any(j.spot for j in JOBS)
    for name, r in runs.items():
        assert len(events_of(r, "preempt_requested")) > 0, name
        assert {e["job"] for e in events_of(r, "submitted")} == {j.id for j in JOBS}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_finishes_every_job(runs, name: str) -> None:
    r = runs[name]
    assert r.policy == name
    assert r.jobs == {"finished": len(JOBS)}
    assert len(events_of(r, "finished")) == len(JOBS)
    assert all(w >= 0 for w in r.waits) and len(r.waits) == len(JOBS)
    m = r.metrics()
    assert 0 < m["goodput"] <= 1 and 0 < m["utilization"] <= 1 + EPS
    assert m["violations"] == r.check.total


# what a baseline breaks by design: fifo-no-backfill leaves GPUs idle behind a blocked head
BY_DESIGN = {"fifo-no-backfill": {"not_work_conserving"}}


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"release-at-decision"}))
def test_the_checker_finds_nothing(runs, name: str) -> None:
    r = runs[name]
    broken = {k for k, n in r.check.violations.items() if n}
    assert broken <= BY_DESIGN.get(name, set()), (r.check.summary(), r.check.examples)
    assert r.double_booked_starts == 0 and r.ledger.total.double_booked == 0.0
    # the auditor run here on the log agrees with the one simulate ran
    again = check(r.events, CLUSTER.capacity())
    assert again.violations == r.check.violations and again.double_booked_gpu_s == 0.0


def test_release_at_decision_double_books(runs) -> None:
    r = runs["release-at-decision"]
    v = r.check.violations
    assert v["double_booked"] > 0 and v["released_before_gone"] > 0
    assert r.check.double_booked_gpu_s > 0
    assert r.double_booked_starts > 0 and r.ledger.total.double_booked > 0
    # what it gets wrong is the hand-over and nothing else
    assert {k for k, n in v.items() if n} == {"double_booked", "released_before_gone"}


def test_fifo_without_backfill_is_not_work_conserving(runs) -> None:
    """The checker sees the baseline's rule: jobs that fit wait behind the blocked head."""
    assert runs["fifo-no-backfill"].check.violations["not_work_conserving"] > 0
    assert runs["goodput"].check.violations["not_work_conserving"] == 0


def allocated_from_log(r: SimResult) -> dict[str, float]:
    """GPU-seconds each job's runs held, from its ``started`` and ``exited`` records alone."""
    start: dict[tuple[str, int], tuple[float, int]] = {}
    out: dict[str, float] = collections.defaultdict(float)
    for e in r.events:
        if e["event"] == "started":
            start[(e["job"], e["epoch"])] = (e["t"], len(e["nodes"]) * e["gpus_per_node"])
        elif e["event"] == "exited":
            t0, g = start.pop((e["job"], e["epoch"]))
            out[e["job"]] += g * (e["t"] - t0)
    assert not start, f"runs never seen to exit: {sorted(start)[:5]}"
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_ledger_accounts_for_every_allocated_gpu_second(runs, name: str) -> None:
    r = runs[name]
    led = r.ledger
    held = allocated_from_log(r)
    tenant_of = {j.id: j.tenant for j in JOBS}
    assert set(led.jobs) == set(held)
    for jid, acct in led.jobs.items():
        parts = sum(getattr(acct, c) for c in CATEGORIES)
        assert parts == pytest.approx(acct.allocated, rel=1e-12, abs=1e-6)
        assert acct.allocated == pytest.approx(held[jid], rel=1e-9, abs=1e-6), jid
        assert all(getattr(acct, c) >= -EPS for c in CATEGORIES), (jid, acct)
    # per tenant: the sum of its jobs; in total: the sum of the tenants
    by_tenant: dict[str, Account] = collections.defaultdict(Account)
    for jid, acct in led.jobs.items():
        by_tenant[tenant_of[jid]].add(acct)
    assert set(by_tenant) == set(led.tenants)
    for t, acct in led.tenants.items():
        for c in (*CATEGORIES, "cost_usd", "spot_gpu_s"):
            assert getattr(acct, c) == pytest.approx(getattr(by_tenant[t], c), rel=1e-9, abs=1e-6), (t, c)
    total = Account()
    for acct in led.tenants.values():
        total.add(acct)
    for c in (*CATEGORIES, "cost_usd", "spot_gpu_s"):
        assert getattr(led.total, c) == pytest.approx(getattr(total, c), rel=1e-9, abs=1e-6), c
    assert led.total.allocated == pytest.approx(sum(held.values()), rel=1e-9)
    # nothing held more GPUs than exist, except the double-booked wait of a release at the decision
    assert led.total.allocated - led.total.double_booked <= led.capacity_gpu_s * (1 + 1e-9)
    if led.total.double_booked == 0:
        assert led.total.allocated <= led.capacity_gpu_s * (1 + 1e-9)
    assert led.idle_gpu_s == pytest.approx(max(0.0, led.capacity_gpu_s - led.total.allocated))
    hours = led.breakdown_hours()
    assert set(hours) == {*CATEGORIES, "idle"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_useful_work_is_exactly_the_finished_work(runs, name: str) -> None:
    led = runs[name].ledger
    spec = {j.id: j for j in JOBS}
    for jid, acct in led.jobs.items():
        assert acct.useful == pytest.approx(spec[jid].gpus * spec[jid].duration_s, rel=1e-9, abs=1e-6), jid
    assert led.total.useful == pytest.approx(sum(j.gpus * j.duration_s for j in JOBS), rel=1e-9)


def test_cost_and_spot_hours_follow_the_pools(runs) -> None:
    r = runs["goodput"]
    price = {p.name: p.price_per_gpu_hour for p in CLUSTER.pools}
    spot = {p.name for p in CLUSTER.pools if p.kind is PoolKind.SPOT}
    cost = spot_s = 0.0
    start = {}
    for e in r.events:
        if e["event"] == "started":
            start[(e["job"], e["epoch"])] = e
        elif e["event"] == "exited":
            s = start.pop((e["job"], e["epoch"]))
            gs = len(s["nodes"]) * s["gpus_per_node"] * (e["t"] - s["t"])
            cost += gs / 3600.0 * price[s["pool"]]
            spot_s += gs if s["pool"] in spot else 0.0
    assert spot_s > 0
    assert r.ledger.total.cost_usd == pytest.approx(cost, rel=1e-9)
    assert r.ledger.total.spot_gpu_s == pytest.approx(spot_s, rel=1e-9)


@pytest.mark.parametrize("name", ["goodput", "release-at-decision"])
def test_simulation_is_deterministic(runs, name: str) -> None:
    again = simulate(JOBS, CLUSTER, POLICIES[name])
    assert again.events == runs[name].events
    assert again.ledger == runs[name].ledger
    assert again.jobs == runs[name].jobs
    assert again.check.violations == runs[name].check.violations


def test_simulation_does_not_touch_the_callers_jobs() -> None:
    jobs = synthetic(40, nodes=12, seed=3)
    before = [repr(j) for j in jobs]
    simulate(jobs, CLUSTER, POLICIES["goodput"])
    assert [repr(j) for j in jobs] == before


def test_resume_points_are_committed_progress(runs) -> None:
    # every restart resumes from exactly the progress of the job's last accepted commit
    for name, r in runs.items():
        last: dict[str, float] = collections.defaultdict(float)
        restarts = 0
        for e in r.events:
            if e["event"] == "checkpoint_committed":
                last[e["job"]] = e["progress_s"]
            elif e["event"] == "started":
                assert e["resume_from_s"] == last[e["job"]], (name, e)
                restarts += e["epoch"] > 1
        assert restarts > 0, name


# ------------------------------------------------------------------------------------------------ failures


LONG = [
    Job(
        id=f"L{i}",
        tenant=f"t{i % 3}",
        priority=i % 3,
        nodes=1 + i % 2,
        gpus_per_node=8,
        submit_s=i * 100.0,
        duration_s=4e6,
        limit_s=5e6,
        spot=i % 4 == 0,
        ckpt=Checkpointing(interval_s=36_000.0, write_s=30.0, stall_s=2.0, restart_s=120.0, grace_s=120.0),
        retry=RetryPolicy(max_failures=5),
    )
    for i in range(10)
]
SMALL = synthetic_cluster(nodes=8)  # od: 6 nodes, spot: 2


def failure_events() -> list[ClusterEvent]:
    """Llama 3's failure rate over months on 64 GPUs, a spot reclaim, and one failure by the job's fault."""
    return [
        *llama3_failures(SMALL, 2e7, seed=0),
        ClusterEvent(t=5e5, kind="reclaim", pool="spot", nodes=2, notice_s=120.0, return_s=3600.0),
        ClusterEvent(t=2e5, kind="job_failure", pool="od", nodes=1, seed_key=1),
    ]


@pytest.fixture(scope="module")
def failure_runs() -> dict[str, SimResult]:
    return {name: simulate(LONG, SMALL, POLICIES[name], extra_events=failure_events()) for name in POLICIES}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_failures_and_reclaims_requeue_for_the_right_reason(failure_runs, name: str) -> None:
    r = failure_runs[name]
    kinds = collections.Counter(e.kind for e in failure_events())
    assert kinds["node_loss"] >= 3  # llama3_failures drew some hardware failures
    lost = events_of(r, "node_lost")
    assert len(lost) >= 3
    reasons = collections.Counter(e["reason"] for e in events_of(r, "requeued"))
    assert reasons["infrastructure"] > 0 and reasons["preempted"] > 0 and reasons["failure"] >= 1
    own = [e for e in events_of(r, "exited") if e["status"] == "failed"]
    assert len(own) == reasons["failure"]  # only the jobs' own failures burn a retry
    notices = events_of(r, "node_reclaim_notice")
    assert {e["node"] for e in notices} == {"spot-00000", "spot-00001"}
    # exactly the jobs running on the spot nodes at the notice are asked to leave by its deadline
    on_spot: dict[str, int] = {}
    for e in r.events:
        if e["t"] >= 5e5:
            break
        if e["event"] == "started" and e["pool"] == "spot":
            on_spot[e["job"]] = e["epoch"]
        elif e["event"] == "exited" and on_spot.get(e["job"]) == e["epoch"]:
            del on_spot[e["job"]]
    reclaimed = [e for e in events_of(r, "preempt_requested") if e["victim_of"] == "reclaim"]
    assert {e["job"]: e["epoch"] for e in reclaimed} == on_spot
    assert all(e["deadline_s"] == 5e5 + 120.0 and e["t"] == 5e5 for e in reclaimed)
    if name == "spot-by-price":
        assert reclaimed and all(e["checkpoint"] for e in reclaimed)  # their 32 s write fits the notice
    if name == "goodput":
        # at 0.3 reclaims per node-hour a 10-hour checkpoint interval keeps 16 % useful on spot:
        # the placement rule never offers it
        assert not any(e["pool"] == "spot" for e in events_of(r, "started"))
    by_node_loss = [e for e in events_of(r, "preempt_requested") if e["victim_of"] == "node_loss"]
    assert len(by_node_loss) == reasons["infrastructure"]
    assert r.jobs == {"finished": len(LONG)}
    if name != "release-at-decision":
        assert r.check.ok, (r.check.summary(), r.check.examples)
    else:
        assert r.check.violations["preemption_counted_as_failure"] == 0
    # the ledger keeps losses to failures apart from losses to preemption
    assert r.ledger.total.lost_failure > 0


def test_failures_run_deterministically(failure_runs) -> None:
    again = simulate(LONG, SMALL, POLICIES["goodput"], extra_events=failure_events())
    assert again.events == failure_runs["goodput"].events


def test_a_job_out_of_retries_fails_and_the_ledger_keeps_its_committed_work() -> None:
    job = Job(
        id="fragile",
        tenant="t",
        priority=0,
        nodes=1,
        gpus_per_node=8,
        submit_s=0.0,
        duration_s=10_000.0,
        limit_s=10_000.0,
        ckpt=Checkpointing(interval_s=1000.0, write_s=10.0, restart_s=60.0),
        retry=RetryPolicy(max_failures=1, backoff_s=5.0),
    )
    cluster = synthetic_cluster(nodes=1, spot_share=0.0)
    fails = [ClusterEvent(t=t, kind="job_failure", pool="od", nodes=1) for t in (2500.0, 5000.0)]
    r = simulate([job], cluster, POLICIES["goodput"], extra_events=fails)
    assert r.jobs == {"failed": 1}
    assert [e["event"] for e in r.events if e["event"] in ("requeued", "failed")] == ["requeued", "failed"]
    failed = events_of(r, "failed")[0]
    assert failed["failures"] == 2
    committed = max(e["progress_s"] for e in events_of(r, "checkpoint_committed"))
    assert r.ledger.total.useful == pytest.approx(8 * committed)
    assert r.check.ok, r.check.examples


# ------------------------------------------------------------------------------------------------ files


def test_a_hand_made_csv_and_cluster_json_run(tmp_path) -> None:
    # two whole nodes; a holds one until t=100. b wants both (t=10): its reservation is t=100.
    # c (t=20) declares 40 s: done by 60 < 100, so it backfills; d (t=30) declares 500 s: it may
    # not delay b, and waits. A spot node is lost at t=200 and comes back an hour later.
    (tmp_path / "w.csv").write_text(
        "id,tenant,submit_s,nodes,gpus_per_node,priority,duration_s,limit_s,ckpt_interval_s,ckpt_write_s,"
        "restart_s,grace_s,spot,ckpt_stall_s,max_failures,extra\n"
        "a,t1,0,1,8,0,100,100,0,0,0,30,0,0,3,x\n"
        "b,t2,10,2,8,0,50,,,,,,,,,\n"
        "c,t1,20,1,8,0,30,40,,,,,,,,\n"
        "d,t2,30,1,8,0,100,500,,,,,,,,\n"
    )
    (tmp_path / "c.json").write_text(
        json.dumps(
            {
                "pools": [
                    {"name": "od", "kind": "on-demand", "nodes": 2, "gpus_per_node": 8, "price_per_gpu_hour": 4.0},
                    {
                        "name": "spot",
                        "kind": "spot",
                        "nodes": 1,
                        "gpus_per_node": 8,
                        "price_per_gpu_hour": 1.6,
                        "reclaim_per_node_hour": 0.02,
                    },
                ],
                "events": [{"t": 200, "kind": "node_loss", "pool": "spot", "nodes": 1, "return_s": 3600}],
            }
        )
    )
    jobs = read_workload_csv(tmp_path / "w.csv")
    cluster = read_cluster_json(tmp_path / "c.json")
    assert [j.id for j in jobs] == ["a", "b", "c", "d"] and len(cluster.events) == 1
    r = simulate(jobs, cluster, POLICIES["goodput"])
    starts = {e["job"]: (e["t"], tuple(e["nodes"])) for e in events_of(r, "started")}
    assert starts == {
        "a": (0.0, ("od-00000",)),
        "c": (20.0, ("od-00001",)),
        "b": (100.0, ("od-00000", "od-00001")),
        "d": (150.0, ("od-00000",)),
    }
    ends = {e["job"]: e["t"] for e in events_of(r, "finished")}
    assert ends == {"a": 100.0, "c": 50.0, "b": 150.0, "d": 250.0}
    assert [e["node"] for e in events_of(r, "node_lost")] == ["spot-00000"]
    assert r.jobs == {"finished": 4} and r.check.ok
    assert r.ledger.total.useful == pytest.approx(8 * (100 + 30 + 100) + 16 * 50)
    # the same run again, and under fifo-no-backfill c waits for b
    assert simulate(jobs, cluster, POLICIES["goodput"]).events == r.events
    fifo = simulate(jobs, cluster, POLICIES["fifo-no-backfill"])
    assert {e["job"]: e["t"] for e in events_of(fifo, "started")}["c"] >= 100.0


def test_horizon_stops_the_run_early() -> None:
    r = simulate(JOBS, CLUSTER, POLICIES["goodput"], horizon_s=2000.0)
    assert r.horizon_s <= 2000.0
    assert sum(r.jobs.values()) < len(JOBS) or r.jobs.get("finished", 0) < len(JOBS)
    assert r.check.ok
    assert math.isfinite(r.percentile(0.99))


@pytest.mark.parametrize("name", [n for n, p in POLICIES.items() if p.weigh_wait])
def test_churn_is_bounded_over_a_whole_run(runs, name: str) -> None:
    """Issue 23's churn figures over a whole simulation, read from the event log: no priority or
    quota victim younger than ``min_run_s`` in its run, none evicted for them more than
    ``max_preemptions`` times, at most ``MAX_VICTIMS`` a decision, at most 2 on average."""
    from goodput.sched.core.preemption import MAX_VICTIMS

    lim = CLUSTER.governance.limits
    r = runs[name]
    started: dict[tuple[str, int], float] = {}
    evicted: collections.Counter[str] = collections.Counter()
    decisions: collections.Counter[tuple[float, str]] = collections.Counter()
    for e in r.events:
        if e["event"] == "started":
            started[(e["job"], e["epoch"])] = e["t"]
        elif e["event"] == "preempt_requested" and e["reason"] in ("priority", "quota"):
            age = e["t"] - started[(e["job"], e["epoch"])]
            assert age >= lim.min_run_s - EPS, (e, age)
            evicted[e["job"]] += 1
            decisions[(e["t"], e["preemptor"])] += 1
    assert decisions, f"{name}: no priority or quota preemption: the test proved nothing"
    assert max(evicted.values()) <= lim.max_preemptions
    assert max(decisions.values()) <= MAX_VICTIMS
    assert sum(decisions.values()) / len(decisions) <= 2
