"""``goodput sched ...``: the checkpoint-aware scheduler, run by its trace-driven simulator."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=False)


def _fail(msg: str, code: int = 2) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


def _console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 160))


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    """The checkpoint-aware scheduler. `goodput sched sim` with no options runs the default comparison."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@app.command("sim")
def sim(
    workload: str = typer.Option("", "--workload", help="Workload CSV (docs/SCHED.md); default: synthetic (Acme)."),
    cluster: str = typer.Option("", "--cluster", help="Cluster JSON; default: 2048 x 8 GPUs, 25 % spot."),
    policy: list[str] = typer.Option([], "--policy", help="Policy to run (repeat); default: ours and every baseline."),
    events: str = typer.Option("", "--events", help="Write our policy's event log (JSONL) here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: str = typer.Option("", "--plot", help="Write PNG plots into this directory."),
    failures: str = typer.Option(
        "", "--failures", help="'llama3': node and job failures at the Llama 3 rate (default without --cluster)."
    ),
    reclaims: str = typer.Option("", "--reclaims", help="SkyPilot spot trace (JSON) replayed on every spot pool."),
    alibaba: str = typer.Option("", "--alibaba", help="Alibaba GPU trace directory (cluster-trace-gpu-v2023)."),
    jobs: int = typer.Option(100_000, "--jobs", help="Synthetic workload size."),
    nodes: int = typer.Option(2048, "--nodes", help="Synthetic cluster nodes."),
    seed: int = typer.Option(0, "--seed"),
    workers: int = typer.Option(0, "--workers", help="Processes (default: one per core, at most one per policy)."),
    ledger: str = typer.Option("", "--ledger", help="Write our policy's per-job ledger (CSV, GPU-hours) here."),
    db: str = typer.Option(
        "", "--db", help="Persist our policy's scheduler here: sqlite:///rel.db, sqlite:////abs.db, postgresql://..."
    ),
) -> None:
    """Compare policies on one workload and one cluster: goodput, lost GPU-hours, waits, cost, violations."""
    from goodput.sched import workload as W
    from goodput.sched.compare import compare, horizon_of, ours, poisson_reclaims, resolve
    from goodput.sched.report import plots, render

    try:
        chosen = resolve(policy)
    except ValueError as e:
        _fail(str(e))
    notes: list[str] = []
    try:
        if alibaba:
            job_list, cl = W.read_alibaba(alibaba, seed=seed)
            notes.append(f"Alibaba GPU trace {alibaba}: {len(job_list)} GPU tasks")
        elif workload:
            job_list = W.read_workload_csv(workload)
            notes.append(f"workload {workload}: {len(job_list)} jobs")
        else:
            if jobs < 1 or nodes < 1:
                _fail("--jobs and --nodes must be positive")
            job_list = W.synthetic(jobs, nodes=nodes, seed=seed)
            notes.append(f"synthetic workload: {jobs} jobs calibrated to Acme (Seren, Kalos), seed {seed}")
        if cluster:
            cl = W.read_cluster_json(cluster)
            notes.append(f"cluster {cluster}: {cl.gpus} GPUs, {len(cl.events)} listed events")
        elif not alibaba:
            cl = W.synthetic_cluster(nodes=nodes)
            notes.append(f"synthetic cluster: {cl.gpus} GPUs in {', '.join(p.name for p in cl.pools)}")
            if not failures:
                failures = "llama3"
        job_list = _fit(job_list, cl, notes)
        extra = []
        horizon = horizon_of(job_list)
        if failures:
            if failures != "llama3":
                _fail(f"--failures: unknown model {failures!r} (known: llama3)")
            fl = W.llama3_failures(cl, horizon, seed=seed)
            extra += fl
            notes.append(f"failures at the Llama 3 rate: {len(fl)} over {horizon / 3600:.0f} h")
        if reclaims:
            counts, gap = W.read_skypilot(reclaims)
            for p in cl.pools:
                if p.kind.value == "spot":
                    extra += W.reclaims_from_trace(counts, gap, pool=p.name, pool_nodes=p.nodes, seed=seed)
            notes.append(f"spot reclaims replayed from {reclaims}")
        elif not cluster and not alibaba:
            rc = poisson_reclaims(cl, horizon, seed=seed)
            extra += rc
            notes.append(f"spot reclaims at the pool's priced rate: {len(rc)} (120 s notice)")
    except (W.WorkloadError, OSError, ValueError) as e:
        _fail(str(e))
    if db and len(job_list) > 20_000:
        notes.append("--db: one durable transaction per input; expect minutes for a large workload")
    names = [p.name for p in chosen]
    ev_policy = ours(names) if events else None
    n_workers = workers or min(len(chosen), os.cpu_count() or 1)
    status = Console(stderr=True)
    done: list[str] = []
    with status.status(f"simulating {len(chosen)} policies on {len(job_list)} jobs ({n_workers} processes)") as st:

        def on_done(r) -> None:  # noqa: ANN001
            done.append(r.name)
            st.update(f"done: {', '.join(done)} ({len(done)}/{len(chosen)})")

        try:
            results = compare(
                job_list,
                cl,
                chosen,
                extra_events=extra,
                events_policy=ev_policy,
                events_path=events or None,
                workers=n_workers,
                on_done=on_done,
                db_url=db or None,
                ledger_path=ledger or None,
            )
        except (ValueError, OSError) as e:
            _fail(str(e))
    paths = plots(results, plot) if plot else []
    if as_json:
        out = {
            "policies": {r.name: _finite(r.metrics) for r in results},
            "tenants": {r.name: r.tenants for r in results},
            "notes": notes,
            "events_file": events or None,
            "events_policy": ev_policy,
            "plots": [str(p) for p in paths],
        }
        print(json.dumps(out, indent=2))
        return
    console = _console()
    render(results, console, header="\n".join(notes))
    if events:
        console.print(f"event log of {ev_policy}: {events}")
    for p in paths:
        console.print(f"plot: {p}")


def _fit(job_list, cl, notes):  # noqa: ANN001, ANN202
    """Drop jobs no pool can ever hold (a trace's node can be smaller than its task), saying so."""
    from goodput.sched.placement import pools_for

    pools = {p.name: p for p in cl.pools}
    keep = [j for j in job_list if pools_for(j, pools, "price")]
    if len(keep) < len(job_list):
        notes.append(f"{len(job_list) - len(keep)} jobs fit no pool of this cluster and were left out")
    return keep


def _finite(x):  # noqa: ANN001, ANN202
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@app.command("check")
def check_cmd(
    events: Path = typer.Argument(..., help="An event log (JSONL)."),
    cluster: str = typer.Option("", "--cluster", help="Cluster JSON giving node capacities (default: synthetic)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Replay an event log with the independent checker and count invariant violations."""
    from goodput.sched import workload as W
    from goodput.sched.checker import check_file

    try:
        cl = W.read_cluster_json(cluster) if cluster else W.synthetic_cluster()
        rep = check_file(events, cl.capacity())
    except (W.WorkloadError, OSError, ValueError) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps({"violations": rep.violations, "total": rep.total, "examples": rep.examples}, indent=2))
    else:
        _console().print(rep.summary())
        for e in rep.examples:
            _console().print(f"  {e}")
    if rep.total:
        raise typer.Exit(1)
