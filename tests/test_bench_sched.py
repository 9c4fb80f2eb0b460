"""``goodput bench sched`` end to end at a toy size: the numbers are not asserted (speed goals live in
the command), what is asserted is that every contract key is a positive number and that the timed
passes did scheduling work."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from goodput.bench.sched import cap_gangs, full_sort_pass, run
from goodput.cli.main import app
from goodput.sched.core.model import Job, JobState
from goodput.sched.sim.synthetic import synthetic, synthetic_cluster

CONTRACT = ("tick_p50_ms", "tick_p99_ms", "growth_100k_over_10k", "speedup_vs_full_sort", "sim_events_per_s")


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_run_small() -> None:
    out = run(2000, 64, 8, ticks=50, baseline_ticks=5, warmup=10, sim_jobs=500)
    for key in CONTRACT:
        assert _positive(out[key]), (key, out[key])
    for key in ("tick_p50_ms_10k", "baseline_p50_ms", "sim_wall_s"):
        assert _positive(out[key]), (key, out[key])
    assert out["tick_p99_ms"] >= out["tick_p50_ms"]
    for queued in ("200", "2000"):
        s = out["scales"][queued]
        assert s["ticks"] == s["passes"] == 50  # every timed tick ran a pass (the events made it dirty)
        assert s["starts_per_tick"] > 0 and s["exits_per_tick"] == 1.0 and s["commits_per_tick"] == 1.0
        assert s["queue_min"] >= int(queued)  # the backlog stayed queued
    assert out["sim"]["events"] > 0 and out["sim"]["jobs_by_state"].get("finished", 0) > 0
    assert set(out["goals"].values()) <= {True, False} and len(out["goals"]) == 5
    assert out["pass"] == all(out["goals"].values())


def test_run_no_sim() -> None:
    out = run(200, 16, 8, ticks=5, baseline_ticks=2, warmup=2, sim=False)
    assert out["sim_events_per_s"] is None and "sim" not in out and len(out["goals"]) == 4


def test_cap_gangs_fits_the_pools() -> None:
    """A gang over the on-demand pool would be refused at submit for a job not allowed on spot."""
    cluster = synthetic_cluster(nodes=64)
    jobs = synthetic(3000, nodes=64, seed=1)
    assert any(j.nodes > 48 for j in jobs)
    assert cap_gangs(jobs, list(cluster.pools)) > 0
    assert max(j.nodes for j in jobs) <= 48


def test_full_sort_pass_orders_and_fits() -> None:
    from goodput.sched.core.model import Node, PoolKind, Tenant

    nodes = {"od": [Node(f"n{i}", "od", PoolKind.ON_DEMAND, 8) for i in range(2)]}
    nodes["od"][0].used = 8
    jobs = [
        Job("low", "a", 0, 1, 4, 0.0, seq=0),
        Job("big", "a", 3, 2, 8, 5.0, seq=1),  # needs both nodes: skipped
        Job("high", "b", 2, 1, 4, 9.0, seq=2),
        Job("late", "a", 0, 1, 4, 1.0, seq=3),
    ]
    tenants = {"a": Tenant("a"), "b": Tenant("b")}
    placed = full_sort_pass(jobs, tenants, nodes, {}, {j.id: ("od",) for j in jobs})
    assert [(j, p, n) for j, p, n in placed] == [("high", "od", [1]), ("low", "od", [1])]
    assert all(j.state is JobState.PENDING for j in jobs)  # nothing changed


def test_cli_json_small() -> None:
    args = ["bench", "sched", "--jobs", "500", "--nodes", "32", "--ticks", "20", "--baseline-ticks", "3"]
    r = CliRunner().invoke(app, [*args, "--sim-jobs", "300", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    for key in CONTRACT:
        assert _positive(out[key]), (key, out[key])
    assert isinstance(out["goals"], dict) and isinstance(out["pass"], bool)


def test_cli_table_small() -> None:
    args = ["bench", "sched", "--jobs", "200", "--nodes", "16", "--ticks", "5", "--baseline-ticks", "2", "--no-sim"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "goals" in r.output and "full sort" in r.output
