"""The comparison's tables stay whole where output is piped or 80 columns wide.

``make demo`` once printed "goo…", "kue…", "0.8…" in every cell that mattered: a cut number
reads as another number. Each table is rendered at 80 columns and every figure must appear whole.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from goodput.sched.core.placement import pools_for
from goodput.sched.sim import interruptions, synthetic
from goodput.sched.sim.compare import compare, horizon_of, poisson_reclaims, resolve
from goodput.sched.sim.report import plots, render


@pytest.fixture(scope="module")
def results():
    jobs = synthetic.synthetic(600, nodes=32, seed=2)
    cluster = synthetic.synthetic_cluster(nodes=32)
    pools = {p.name: p for p in cluster.pools}
    jobs = [j for j in jobs if pools_for(j, pools, "price")]
    h = horizon_of(jobs)
    extra = interruptions.llama3_failures(cluster, h, seed=1) + poisson_reclaims(cluster, h, seed=1)
    return compare(jobs, cluster, resolve([]), extra_events=extra)


@pytest.mark.parametrize("width", [80, 100])
def test_tables_fit_and_nothing_is_cut(results, width: int) -> None:
    buf = io.StringIO()
    render(results, Console(width=width, file=buf, force_terminal=False), header="a header")
    out = buf.getvalue()
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= width
    assert "…" not in out
    for r in results:  # every policy's name whole at the start of its rows, and its figures whole
        rows = [x for x in lines if x.strip().startswith(r.name + " ")]
        assert len(rows) >= 5, (r.name, out)
        m = r.metrics
        for figure in (f"{m['useful_per_capacity']:.4f}", f"{m['goodput']:.4f}", f"{m['utilization']:.3f}"):
            assert any(figure in x for x in rows), (r.name, figure)
    assert "window of useful/capacity: 0 to" in " ".join(out.split())
    for title in ("lost GPU-hours by cause", "preemptions by the policy", "per tenant", "entitle"):
        assert title in out


def test_every_policy_has_the_new_keys(results) -> None:
    for r in results:
        m = r.metrics
        assert 0 < m["useful_per_capacity"] <= 1
        assert set(m["lost_gpu_hours_by_cause"]) >= {"preemption", "failures", "restart", "draining", "double_booked"}
        assert m["lost_gpu_hours_total"] == pytest.approx(
            sum(
                m["lost_gpu_hours_by_cause"][k]
                for k in ("preemption", "failures", "restart", "draining", "double_booked")
            )
        )
        for key in ("preemption_decisions", "victims", "victims_per_decision", "victim_run_p50_s"):
            assert m[key] >= 0
        assert m["max_evictions_of_one_job"] >= 0 and isinstance(m["preemptions_by_reason"], dict)
        shares = m["tenant_shares"]
        assert sum(s["share"] for s in shares.values()) == pytest.approx(1.0)
        assert sum(s["entitlement"] for s in shares.values()) == pytest.approx(1.0)
    ends = {r.metrics["window"]["end_s"] for r in results}
    assert len(ends) == 1  # one window for every policy of a comparison


def test_plots_are_written(results, tmp_path) -> None:
    paths = plots(results, tmp_path)
    assert [p.name for p in paths] == ["sched_badput.png", "sched_wait_cdf.png", "sched_goodput.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
