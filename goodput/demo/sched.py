"""``goodput demo --part sched``: the scheduler on a small cluster, killed and restarted from SQLite.

1. Every policy runs the same synthetic workload and the same cluster events (Llama 3 failures,
   spot reclaims); the independent checker audits each event log.
2. Our policy runs again with a SQLite store, and the scheduler is thrown away and rebuilt from
   the store three times mid-run, as a service killed with SIGKILL and restarted would be: the
   event log must equal the uninterrupted run's, record for record.
Exits non-zero if a check fails.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

console = Console()
JOBS, NODES = 3000, 256


def run_sched_demo(workdir: str | None = None) -> int:
    from goodput.sched.core.policy import POLICIES
    from goodput.sched.live.store import open_store
    from goodput.sched.sim import interruptions, synthetic
    from goodput.sched.sim.compare import compare, horizon_of, poisson_reclaims, resolve
    from goodput.sched.sim.report import render
    from goodput.sched.sim.simulator import simulate

    console.rule("[bold]goodput demo: the checkpoint-aware scheduler")
    jobs = synthetic.synthetic(JOBS, nodes=NODES, seed=1)
    cluster = synthetic.synthetic_cluster(nodes=NODES)
    pools = {p.name: p for p in cluster.pools}
    from goodput.sched.core.placement import pools_for

    jobs = [j for j in jobs if pools_for(j, pools, "price")]
    horizon = horizon_of(jobs)
    extra = interruptions.llama3_failures(cluster, horizon, seed=1) + poisson_reclaims(cluster, horizon, seed=1)
    with console.status(f"{len(POLICIES)} policies on {len(jobs)} jobs, {cluster.gpus} GPUs…"):
        results = compare(jobs, cluster, resolve([]), extra_events=extra, workers=1)
    render(results, console)
    checks: list[tuple[str, bool, str]] = []
    ours = results[0]
    checks.append(("checker: no violation under goodput", ours.metrics["violations"] == 0, ""))
    rad = next(r for r in results if r.name == "release-at-decision")
    checks.append(
        (
            "checker: release-at-decision double-books",
            rad.metrics["violations_by_kind"].get("released_before_gone", 0) > 0,
            f"{rad.metrics['violations']} violations",
        )
    )

    base = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-sched-"))
    base.mkdir(parents=True, exist_ok=True)
    small = jobs[:400]
    with console.status("our policy with a SQLite store, the scheduler killed and restarted 3 times…"):
        plain = simulate(small, cluster, POLICIES["goodput"], extra_events=extra)
        n = plain.world_events
        with open_store(f"sqlite:///{base / 'sched.db'}") as store:
            crashed = simulate(
                small,
                cluster,
                POLICIES["goodput"],
                extra_events=extra,
                store=store,
                crash_after=[n // 4, n // 2, 3 * n // 4],
            )
            stored = store.event_count()
    checks.append(
        (
            "restart from SQLite changes nothing",
            crashed.events == plain.events,
            f"{len(plain.events)} events, 3 restarts",
        )
    )
    checks.append(("every event is in the store", stored == len(crashed.events), f"{stored} stored"))
    ok = all(c[1] for c in checks)
    for name, passed, detail in checks:
        console.print(f"{'[green]ok[/green]' if passed else '[red]FAILED[/red]'}  {name}  {detail}")
    return 0 if ok else 1
