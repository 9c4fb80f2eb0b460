"""The metrics that cannot flatter, on a hand-written log whose every figure is worked out below,
and on real simulations where the window's useful work must equal the ledger's when the window
covers the whole run."""

from __future__ import annotations

from typing import Any

import pytest

from goodput.sched.core.model import Checkpointing, Job
from goodput.sched.core.placement import pools_for
from goodput.sched.core.policy import POLICIES
from goodput.sched.sim import formats, interruptions, synthetic
from goodput.sched.sim.compare import horizon_of, poisson_reclaims
from goodput.sched.sim.metrics import log_metrics, lost_by_cause
from goodput.sched.sim.simulator import simulate

CAP = {"a": 8, "b": 8, "c": 8}


def job(jid: str, tenant: str, duration: float, **ck: float) -> Job:
    return Job(jid, tenant, 0, 1, 8, submit_s=0.0, duration_s=duration, limit_s=duration, ckpt=Checkpointing(**ck))


JOBS = [
    job("x", "A", 1000, interval_s=100, write_s=10, restart_s=50),
    job("w", "A", 2000, restart_s=50),
    job("y", "B", 100),
    job("z", "B", 10),
]
JOBS[3].submit_s = 700.0  # the last arrival: the window is [0, 700]


def log(reasons: bool = True) -> list[dict[str, Any]]:
    def pre(t: float, j: str) -> dict[str, Any]:
        r: dict[str, Any] = {"t": t, "event": "preempt_requested", "job": j, "epoch": 1, "victim_of": "y"}
        if reasons:
            r |= {"reason": "priority", "preemptor": "y"}
        return r

    def start(t: float, j: str, epoch: int, node: str, resume: float = 0.0) -> dict[str, Any]:
        return {
            "t": t, "event": "started", "job": j, "epoch": epoch, "pool": "p", "nodes": [node], "gpus_per_node": 8,
            "resume_from_s": resume,
        }  # fmt: skip

    def ev(t: float, event: str, j: str, **kw: Any) -> dict[str, Any]:
        return {"t": t, "event": event, "job": j, **kw}

    return [
        *(ev(0, "submitted", j.id, tenant=j.tenant) for j in JOBS[:3]),
        start(0, "x", 1, "a"),
        start(0, "w", 1, "b"),
        {"t": 100, "event": "node_lost", "node": "c"},
        ev(100, "checkpoint_committed", "x", epoch=1, progress_s=100.0),
        {"t": 300, "event": "node_up", "node": "c"},
        pre(350, "x"),
        pre(350, "w"),
        ev(350, "preempt_requested", "z", epoch=1, victim_of="reclaim", reason="reclaim", preemptor=None),
        ev(360, "checkpoint_committed", "x", epoch=1, progress_s=350.0),
        ev(360, "exited", "x", epoch=1, status="preempted"),
        ev(360, "exited", "w", epoch=1, status="killed"),
        start(360, "y", 1, "a"),
        ev(400, "requeued", "x", reason="preempted", resume_from_s=350.0),
        start(400, "x", 2, "c", 350.0),
        ev(460, "exited", "y", epoch=1, status="finished"),
        ev(700, "submitted", "z", tenant="B"),
        start(700, "z", 1, "a"),
        ev(710, "exited", "z", epoch=1, status="finished"),
        ev(1100, "exited", "x", epoch=2, status="finished"),
        start(1200, "w", 2, "b"),
        ev(3250, "exited", "w", epoch=2, status="finished"),
    ]


@pytest.mark.parametrize("reasons", [True, False], ids=["reason keys", "victim_of only (older logs)"])
def test_hand_log(reasons: bool) -> None:
    m = log_metrics(log(reasons), JOBS, CAP, weights={"A": 3.0}, allocated_by_tenant={"A": 300.0, "B": 100.0})
    # x: 350 s kept of run 1 (committed at the notice), then from 450 (restart 50) to 700: 250 s;
    # y: 100 s; w: its 350 s were never committed; z: nothing before 700. Node c was gone 200 s.
    useful = 8 * (350 + 250 + 100)
    capacity = 24 * 700 - 8 * 200
    assert m["window"]["end_s"] == 700.0
    assert m["window"]["useful_gpu_hours"] == pytest.approx(useful / 3600)
    assert m["window"]["capacity_gpu_hours"] == pytest.approx(capacity / 3600)
    assert m["useful_per_capacity"] == pytest.approx(useful / capacity)
    assert m["preemptions_by_reason"] == {"priority": 2, "reclaim": 1}
    assert (m["preemption_decisions"], m["victims"], m["victims_per_decision"]) == (1, 2, 2.0)
    assert m["victim_run_p50_s"] == 350.0 and m["max_evictions_of_one_job"] == 1
    a, b = m["tenant_shares"]["A"], m["tenant_shares"]["B"]
    assert (a["share"], b["share"]) == (0.75, 0.25)
    assert (a["entitlement"], b["entitlement"]) == (0.75, 0.25)
    assert a["demand"] == pytest.approx(8 * 3000 / (8 * 3110))


def test_a_later_window_counts_the_rest() -> None:
    """The whole run as the window: every finished job's work, nothing more."""
    m = log_metrics(log(), JOBS, CAP, window_end_s=4000.0)
    assert m["window"]["useful_gpu_hours"] == pytest.approx(8 * (1000 + 2000 + 100 + 10) / 3600)


def test_lost_by_cause_sums_the_issue_categories() -> None:
    hours = {"lost_preemption": 1.0, "lost_failure": 2.0, "restart": 4.0, "draining": 8.0, "double_booked": 16.0}
    by, total = lost_by_cause(hours | {"checkpoint_stall": 32.0, "useful": 64.0})
    assert total == 31.0 and by["checkpoint_stall"] == 32.0


@pytest.fixture(scope="module")
def runs() -> tuple[list[Job], formats.Cluster, dict]:
    jobs = synthetic.synthetic(1200, nodes=48, seed=5)
    cluster = synthetic.synthetic_cluster(nodes=48)
    pools = {p.name: p for p in cluster.pools}
    jobs = [j for j in jobs if pools_for(j, pools, "price")]
    h = horizon_of(jobs)
    extra = interruptions.llama3_failures(cluster, h, seed=2) + poisson_reclaims(cluster, h, seed=2)
    return jobs, cluster, {n: simulate(jobs, cluster, p, extra_events=extra) for n, p in POLICIES.items()}


@pytest.mark.parametrize("name", list(POLICIES))
def test_window_over_the_whole_run_is_the_ledger(runs, name: str) -> None:
    """Placed in time as the world makes progress, the useful work adds up to the ledger's, and the
    capacity to the simulator's, double-booked waits and lost nodes included."""
    jobs, cluster, res = runs
    r = res[name]
    m = log_metrics(r.events, jobs, cluster.capacity(), window_end_s=r.horizon_s)
    assert m["window"]["useful_gpu_hours"] == pytest.approx(r.ledger.total.useful / 3600, rel=1e-9)
    assert m["window"]["capacity_gpu_hours"] == pytest.approx(r.ledger.capacity_gpu_s / 3600, rel=1e-9)
    half = log_metrics(r.events, jobs, cluster.capacity(), window_end_s=r.horizon_s / 2)
    assert 0 < half["window"]["useful_gpu_hours"] < m["window"]["useful_gpu_hours"]
    assert 0 < half["useful_per_capacity"] <= 1.0


def test_a_batch_at_time_zero_is_measured_to_its_longest_job() -> None:
    """Every job at t=0: the window to the last arrival was empty, capacity 0 and every policy's
    useful / capacity 0.0 (hostile review). By hand: two 8-GPU hours on one 8-GPU node, the
    window is the first hour, and the first job fills it."""
    from goodput.sched.core.model import Pool, PoolKind

    jobs = [Job(j, "t", 0, 1, 8, 0.0, duration_s=3600.0) for j in ("a", "b")]
    cluster = formats.Cluster(pools=[Pool("od", PoolKind.ON_DEMAND, 1, 8, 1.0)])
    m = log_metrics(simulate(jobs, cluster, POLICIES["goodput"]).events, jobs, cluster.capacity())
    assert m["window"]["end_s"] == 3600.0 and m["window"]["what"].startswith("a batch")
    assert m["useful_per_capacity"] == pytest.approx(1.0)
    assert m["window"]["capacity_gpu_hours"] == pytest.approx(8.0)
