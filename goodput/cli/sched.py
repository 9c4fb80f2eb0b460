"""``goodput sched ...``: the checkpoint-aware scheduler, run by its trace-driven simulator."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=False)


def _fail(msg: str, code: int = 2) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[red]error:[/red] {escape(str(msg))}")  # text, never markup
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
    alibaba: str = typer.Option(
        "",
        "--alibaba",
        help="Alibaba GPU trace directory (cluster-trace-gpu-v2023): a pod list for packing studies, not an "
        "arrival stream (about 14 busy GPUs of 6,212: every policy schedules it alike).",
    ),
    philly: str = typer.Option(
        "", "--philly", help="Philly 2017 trace directory (philly.csv): a real arrival stream, 15 tenants."
    ),
    gpus: int = typer.Option(640, "--gpus", help="With --philly: the cluster's GPUs (8 per node; 640: ~74 % load)."),
    philly_from: str = typer.Option("2017-10-01", "--philly-from", help="With --philly: first day replayed."),
    philly_days: float = typer.Option(61.0, "--philly-days", help="With --philly: days of submissions replayed."),
    skip_unplaceable: bool = typer.Option(
        False, "--skip-unplaceable", help="Leave out jobs no pool can hold (their ids are printed); default: an error."
    ),
    jobs: int = typer.Option(100_000, "--jobs", help="Synthetic workload size."),
    nodes: int = typer.Option(2048, "--nodes", help="Synthetic cluster nodes."),
    seed: int = typer.Option(0, "--seed"),
    workers: int = typer.Option(0, "--workers", help="Processes (default: one per core, at most one per policy)."),
    ledger: str = typer.Option("", "--ledger", help="Write our policy's per-job ledger (CSV, GPU-hours) here."),
    db: str = typer.Option(
        "", "--db", help="Persist our policy's scheduler here: sqlite:///rel.db, sqlite:////abs.db, postgresql://..."
    ),
    ui: str = typer.Option(
        "", "--ui", help="Write the dashboard of our policy's run (DIR/index.html, self-contained) into this directory."
    ),
    seeds: int = typer.Option(
        1,
        "--seeds",
        help="Repeat with seeds SEED..SEED+N-1 (workload draws, failures, reclaims) and report each policy's "
        "mean and range: one run's dynamics can rank close policies by chance.",
    ),
) -> None:
    """Compare policies on one workload and one cluster: goodput, lost GPU-hours, waits, cost, violations."""
    from goodput.sched.core.governance import Governance
    from goodput.sched.sim import formats, interruptions, traces
    from goodput.sched.sim import synthetic as syn
    from goodput.sched.sim.compare import compare, horizon_of, ours, poisson_reclaims, resolve
    from goodput.sched.sim.report import plots, render

    try:
        chosen = resolve(policy)
    except ValueError as e:
        _fail(str(e))
    given = [f for f, v in (("--workload", workload), ("--alibaba", alibaba), ("--philly", philly)) if v]
    if len(given) > 1:
        _fail(f"give one workload, not {' and '.join(given)}")
    if seeds < 1:
        _fail("--seeds must be at least 1")
    if seeds > 1 and (events or ui or db or ledger or plot):
        _fail("--seeds compares means: --events, --ui, --db, --ledger and --plot describe one run (give --seed)")

    def build(seed: int, failures: str = failures):  # noqa: ANN202
        notes: list[str] = []
        try:
            cluster_file = formats.read_cluster_json(cluster) if cluster else None
            if philly:
                job_list, cl, replay = traces.read_philly(
                    philly, gpus=gpus, start=philly_from, days=philly_days, seed=seed
                )
                notes.append(replay.describe())
            elif alibaba:
                job_list, cl = traces.read_alibaba(alibaba, seed=seed)
                notes.append(
                    f"Alibaba GPU trace {alibaba}: {len(job_list)} GPU tasks (a pod list for packing studies, not an "
                    "arrival stream: it barely loads its cluster)"
                )
            elif workload:
                # the cluster's governance checks each row where it stands (file, line, column)
                gov = cluster_file.governance if cluster_file is not None else Governance()  # the defaults
                job_list = formats.read_workload_csv(workload, gov)
                notes.append(f"workload {workload}: {len(job_list)} jobs")
            else:
                if jobs < 1 or nodes < 1:
                    _fail("--jobs and --nodes must be positive")
                job_list = syn.synthetic(jobs, nodes=nodes, seed=seed)
                notes.append(f"synthetic workload: {jobs} jobs calibrated to Acme (Seren, Kalos), seed {seed}")
            if cluster_file is not None:
                cl = cluster_file
                notes.append(f"cluster {cluster}: {cl.gpus} GPUs, {len(cl.events)} listed events")
            elif not alibaba and not philly:
                cl = syn.synthetic_cluster(nodes=nodes)
                notes.append(f"synthetic cluster: {cl.gpus} GPUs in {', '.join(p.name for p in cl.pools)}")
                if not failures:
                    failures = "llama3"
            # our own generator's gangs are capped at --nodes, not at the largest pool: its misfits are
            # left out and listed; a user's workload (a file or a trace) is an error unless asked
            synthetic = not (philly or alibaba or workload)
            job_list, skipped = _fit(job_list, cl, notes, skip_unplaceable or synthetic)
            extra = []
            horizon = horizon_of(job_list)
            if failures:
                if failures != "llama3":
                    _fail(f"--failures: unknown model {failures!r} (known: llama3)")
                fl = interruptions.llama3_failures(cl, horizon, seed=seed)
                extra += fl
                notes.append(f"failures at the Llama 3 rate: {len(fl)} over {horizon / 3600:.0f} h")
            if reclaims:
                counts, gap = interruptions.read_skypilot(reclaims)
                for p in cl.pools:
                    if p.kind.value == "spot":
                        extra += interruptions.reclaims_from_trace(
                            counts, gap, pool=p.name, pool_nodes=p.nodes, seed=seed
                        )
                notes.append(f"spot reclaims replayed from {reclaims}")
            elif not cluster and not alibaba and not philly:
                rc = poisson_reclaims(cl, horizon, seed=seed)
                extra += rc
                notes.append(f"spot reclaims at the pool's priced rate: {len(rc)} (120 s notice)")
        except (formats.WorkloadError, OSError, ValueError) as e:
            _fail(str(e))
        return job_list, cl, extra, notes, skipped

    n_workers = workers or min(len(chosen), os.cpu_count() or 1)
    if seeds > 1:
        _sim_seeds(build, chosen, range(seed, seed + seeds), n_workers, as_json)
        return
    job_list, cl, extra, notes, skipped = build(seed)
    if db and len(job_list) > 20_000:
        notes.append("--db: one durable transaction per input; expect minutes for a large workload")
    names = [p.name for p in chosen]
    if ui and not events:  # the dashboard is drawn from our policy's event log: keep it beside the page
        events = str(Path(ui) / "events.jsonl")
        Path(ui).mkdir(parents=True, exist_ok=True)
    ev_policy = ours(names) if events else None
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
    if ui:
        from goodput.sched.ui.report import sim_report

        paths.append(sim_report(events, ui, results, job_list, cl, ev_policy or "", notes))
    if as_json:
        out = {
            "policies": {r.name: _finite(r.metrics) for r in results},
            "tenants": {r.name: r.tenants for r in results},
            "notes": notes,
            "window": {r.name: r.metrics.get("window") for r in results},
            "skipped_unplaceable": skipped,
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


def _sim_seeds(build, chosen, seeds, n_workers: int, as_json: bool) -> None:  # noqa: ANN001
    """The comparison once per seed, then each policy's mean and range over them."""
    from goodput.sched.sim.compare import compare
    from goodput.sched.sim.report import render_seeds, seeds_alike, seeds_summary

    per_seed: dict[int, list] = {}
    all_notes: list[str] = []
    status = Console(stderr=True)
    with status.status(f"simulating {len(chosen)} policies x {len(seeds)} seeds ({n_workers} processes)") as st:
        for s in seeds:
            job_list, cl, extra, notes, _ = build(s)
            all_notes.append(f"seed {s}: " + "; ".join(notes))
            st.update(f"seed {s}: {len(job_list)} jobs ({len(per_seed)}/{len(seeds)} seeds done)")
            try:
                per_seed[s] = compare(job_list, cl, chosen, extra_events=extra, workers=n_workers)
            except (ValueError, OSError) as e:
                _fail(str(e))
    summary = seeds_summary(per_seed)
    alike = seeds_alike(per_seed)
    if alike:
        all_notes.append(
            "every seed gave the same runs: nothing in this comparison depends on the seed (a workload and a "
            "cluster file, no --failures or --reclaims): the ranges and best-in counts below say nothing"
        )
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {all_notes[-1]}")
    if as_json:
        out = {
            "seeds": {str(s): {r.name: _finite(r.metrics) for r in rs} for s, rs in per_seed.items()},
            "summary": _finite(summary),
            "seeds_alike": alike,
            "notes": all_notes,
        }
        print(json.dumps(out, indent=2))
        return
    render_seeds(summary, _console(), header="\n".join(all_notes))


def _fit(job_list, cl, notes, skip: bool):  # noqa: ANN001, ANN202
    """Jobs no pool can ever hold (a trace's node can be smaller than its task) are an error listing
    their ids, or, with ``skip``, left out with their ids printed: never dropped in silence."""
    from goodput.sched.core.placement import pools_for

    pools = {p.name: p for p in cl.pools}
    keep, out = [], []
    for j in job_list:
        (keep if pools_for(j, pools, "price") else out).append(j)
    if not out:
        return keep, []
    ids = [j.id for j in out]
    shapes = sorted({f"{j.nodes}x{j.gpus_per_node}" for j in out})
    if not skip:
        shown = ", ".join(ids[:50]) + (f", ... ({len(ids) - 50} more)" if len(ids) > 50 else "")
        _fail(
            f"{len(ids)} jobs fit no pool of this cluster (shapes {', '.join(shapes)}): {shown}; "
            "give --skip-unplaceable to leave them out"
        )
    Console(stderr=True).print(f"left out, no pool can hold them ({len(ids)}): {' '.join(ids)}", soft_wrap=True)
    notes.append(f"{len(ids)} jobs fit no pool of this cluster (shapes {', '.join(shapes)}) and were left out")
    return keep, ids


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
    nodes: int = typer.Option(0, "--nodes", help="A live service's local slots (as `serve --nodes`), no --cluster."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="With --nodes, as `serve --gpus-per-node`."),
    as_json: bool = typer.Option(False, "--json"),
    partition: str = typer.Option("", "--partition", help="--executor slurm: this Slurm partition's nodes (sinfo)."),
    slurm_conf: str = typer.Option("", "--slurm-conf", help="With --partition: slurm.conf (default: $SLURM_CONF)."),
    partial: bool = typer.Option(
        False,
        "--partial",
        help="The log's head is gone (the service's event retention deleted it): jobs first seen after their "
        "submission are not followed, and the checks a partial log cannot prove are not judged.",
    ),
) -> None:
    """Replay an event log with the independent checker and count invariant violations."""
    from goodput.sched.core.capacity import Capacity
    from goodput.sched.sim import formats, synthetic
    from goodput.sched.sim.checker import check_file
    from goodput.sched.sim.compare import rules_of

    try:
        if cluster and partition:  # over Slurm the file's pools are optional (goodput.sched.live.slurm)
            from goodput.sched.live.slurm import read_cluster_json

            cl = read_cluster_json(cluster)
        elif cluster:
            cl = formats.read_cluster_json(cluster)
        elif nodes:
            cl = formats.Cluster(pools=list(_pools("", nodes, gpus_per_node)))
        else:
            cl = synthetic.synthetic_cluster()
        built = Capacity.build_nodes(cl.pools)
        if partition:  # the nodes as Slurm names them (goodput.sched.live.slurm.discover, as serve does)
            import dataclasses

            from goodput.sched.live.slurm import Slurm, check_pools, discover

            slurm_pools, built, _ = discover(Slurm(conf=slurm_conf), partition)
            cl = dataclasses.replace(cl, pools=check_pools(cl.pools, slurm_pools, partition))
        capacity = {n.name: n.gpus for n in built}
        node_pool = {n.name: n.pool for n in built}
        kinds = {p.name: p.kind.value for p in cl.pools}
        rep = check_file(events, capacity, rules=rules_of(cl), pools=node_pool, pool_kinds=kinds, partial=partial)
    except (formats.WorkloadError, OSError, ValueError) as e:
        _fail(str(e))
    if as_json:
        out = {"violations": rep.violations, "total": rep.total, "examples": rep.examples}
        if partial:
            out.update(partial=True, joined=rep.joined, not_judged=list(rep.not_judged))
        print(json.dumps(out, indent=2))
    else:
        _console().print(rep.summary())
        for e in rep.examples:
            _console().print(f"  {e}")
    if rep.total:
        raise typer.Exit(1)


@app.command("report")
def report_cmd(
    events: Path = typer.Argument(..., help="An event log (JSONL): `sim --events`, `sched events`."),
    html: Path = typer.Option(..., "--html", help="Write the dashboard of this log here: one self-contained page."),
    cluster: str = typer.Option("", "--cluster", help="Cluster JSON: node capacities (default: from the log)."),
    nodes: int = typer.Option(0, "--nodes", help="A live service's local slots (as `serve --nodes`), no --cluster."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="With --nodes, as `serve --gpus-per-node`."),
) -> None:
    """Write the dashboard's views (cluster, queue, preemptions, goodput, ledger, job pages) of an event log."""
    from goodput.sched.core.capacity import Capacity
    from goodput.sched.sim import formats
    from goodput.sched.ui import write_report

    try:
        capacity, kinds = None, None
        if cluster or nodes:
            pools = formats.read_cluster_json(cluster).pools if cluster else _pools("", nodes, gpus_per_node)
            capacity = {n.name: n.gpus for n in Capacity.build_nodes(pools)}
            kinds = {p.name: p.kind.value for p in pools}
        out = write_report(events, html, capacity=capacity, pool_kinds=kinds)
    except (formats.WorkloadError, OSError, ValueError) as e:
        _fail(str(e))
    print(out)


# ---------------------------------------------------------------------- the live service


def _pools(cluster: str, nodes: int, gpus_per_node: int):  # noqa: ANN202
    from goodput.sched.live.service import local_pools
    from goodput.sched.sim import formats

    if cluster:
        try:
            return formats.read_cluster_json(cluster).pools
        except (formats.WorkloadError, OSError, ValueError) as e:
            _fail(str(e))
    if nodes < 1 or gpus_per_node < 1:
        _fail("--nodes and --gpus-per-node must be >= 1")
    return local_pools(nodes, gpus_per_node)


@app.command("serve")
def serve_cmd(
    db: str = typer.Option(
        "sqlite:///goodput-sched.db", "--db", help="sqlite:///rel.db, sqlite:////abs.db, postgresql://..."
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8765, "--port"),
    cluster: str = typer.Option(
        "", "--cluster", help="Cluster JSON (docs/SCHED.md); default: --nodes x --gpus-per-node."
    ),
    nodes: int = typer.Option(2, "--nodes", help="Local slots (nodes) when no --cluster is given."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    state_dir: str = typer.Option(".goodput-sched", "--state-dir", help="Run records, job logs, default checkpoints."),
    tick_s: float = typer.Option(1.0, "--tick-s", help="Longest wait between scheduling passes."),
    executor: str = typer.Option(
        "", "--executor", help="local (process groups on this machine) or slurm (docs/SLURM.md); default: local."
    ),
    partition: str = typer.Option("", "--partition", help="--executor slurm: the Slurm partition goodput drives."),
    slurm_conf: str = typer.Option("", "--slurm-conf", help="--executor slurm: slurm.conf (default: $SLURM_CONF)."),
    job_python: str = typer.Option(
        "", "--job-python", help="--executor slurm: the Python each job's batch step runs (default: this one)."
    ),
    allow_root_jobs: bool = typer.Option(
        False,
        "--allow-root-jobs",
        help="Run as root, let tenants without a Unix user (or mapped to root) run jobs as root: single-user "
        "machines only (docs/SCHED.md, Security model).",
    ),
    rate_limit: float = typer.Option(100.0, "--rate-limit", help="Requests a second per token (0: no limit)."),
    max_user_procs: int = typer.Option(
        0,
        "--max-user-procs",
        help="Processes and threads a tenant's Unix user may hold, all its jobs together (RLIMIT_NPROC); "
        "0: a quarter of the kernel's pid_max.",
    ),
) -> None:
    """Run the live scheduler: an HTTP API (OpenAPI at /openapi.json) that runs jobs as local process groups
    (or as Slurm jobs: --executor slurm --partition P)."""
    from goodput.sched.live.service import serve
    from goodput.sched.live.store import StoreError

    opts = _slurm_options(cluster, executor, partition, slurm_conf, job_python)
    pools = _pools(cluster, nodes, gpus_per_node) if opts is None else []
    gov = _governance(cluster, slurm=opts is not None)
    if opts is not None:
        opts["allow_root_jobs"] = allow_root_jobs
        opts["pools"] = _slurm_cluster(cluster).pools if cluster else []  # checked against Slurm's at start
    notes = Console(stderr=True)
    try:
        serve(
            db, pools, host=host, port=port, state_dir=state_dir, tick_s=tick_s,
            executor="slurm" if opts is not None else "local", executor_options=opts,
            governance=gov, allow_root_jobs=allow_root_jobs, rate_per_s=rate_limit,
            max_user_procs=max_user_procs or None,
            on_start=lambda lines: [notes.print(f"goodput sched serve: {x}") for x in lines],
        )  # fmt: skip
    except (StoreError, ValueError, OSError) as e:
        _fail(str(e))


def _slurm_cluster(cluster: str):  # noqa: ANN202
    """The cluster JSON of ``serve --executor slurm``: pools optional (goodput.sched.live.slurm.read_cluster_json)."""
    from goodput.sched.live.slurm import read_cluster_json

    try:
        return read_cluster_json(cluster)
    except (OSError, ValueError) as e:
        _fail(str(e))


def _governance(cluster: str, *, slurm: bool = False):  # noqa: ANN202
    """The cluster JSON's tenants (users, checkpoint prefixes, priority caps) and limits, or the defaults."""
    from goodput.sched.core.governance import Governance
    from goodput.sched.sim import formats

    if not cluster:
        return Governance()
    if slurm:
        return _slurm_cluster(cluster).governance
    try:
        return formats.read_cluster_json(cluster).governance
    except (formats.WorkloadError, OSError, ValueError) as e:
        _fail(str(e))


def _slurm_options(cluster: str, executor: str, partition: str, conf: str, python: str) -> dict | None:
    """The Slurm executor's options from the flags, else from the cluster JSON's ``"slurm"`` object
    (``{"partition": P, "slurm_conf": ..., "job_python": ...}``); None for the local executor."""
    section: dict = {}
    if cluster:
        try:
            raw = json.loads(Path(cluster).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            _fail(f"{cluster}: {e}")
        section = raw.get("slurm") if isinstance(raw, dict) and isinstance(raw.get("slurm"), dict) else {}
    kind = executor or ("slurm" if section else "local")
    if kind not in ("local", "slurm"):
        _fail(f"--executor: {kind!r} is not local or slurm")
    if kind == "local":
        return None
    partition = partition or str(section.get("partition", ""))
    if not partition:
        _fail("--executor slurm needs --partition (or the cluster JSON's slurm.partition)")
    return {
        "partition": partition,
        "slurm_conf": conf or str(section.get("slurm_conf", "")),
        "python": python or str(section.get("job_python", "")),
        "drain_grace_s": section.get("drain_grace_s", 30.0),
        "slurmrestd": str(section.get("slurmrestd", "")),
    }


token_app = typer.Typer(no_args_is_help=True)
app.add_typer(token_app, name="token", help="Bearer tokens of the live service.")


@token_app.command("add")
def token_add(
    tenant: str = typer.Argument(..., help="Tenant the token acts for."),
    db: str = typer.Option(..., "--db", help="The service's store URL."),
    admin: bool = typer.Option(False, "--admin", help="An admin token (all jobs, nodes, drain)."),
    user: str = typer.Option("", "--user", help="The Unix user this tenant's jobs run as (kept for the tenant)."),
    expires: str = typer.Option("", "--expires", help="Lifetime: 3600s, 90m, 12h, 30d (default: until revoked)."),
) -> None:
    """Create a token; it is printed once, alone on the last line, and only its hash is stored."""
    import time

    from goodput.sched.live import tokens
    from goodput.sched.live.runas import RunAsError
    from goodput.sched.live.store import StoreError

    until = time.time() + _duration(expires) if expires else None
    try:
        tok = tokens.add(db, tenant, admin=admin, user=user, expires=until)
    except (ValueError, StoreError, RunAsError) as e:
        _fail(str(e))
    extra = (" (admin)" if admin else "") + (f", jobs run as {user!r}" if user else "")
    extra += f", expires {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(until))}" if until else ""
    Console(stderr=True).print(f"token for tenant {tenant!r}{extra}; it is not shown again:")
    print(tok)


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    num, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        v = float(num) * units[unit]
    except ValueError:
        _fail(f"--expires {text!r}: expected a number with s, m, h or d (e.g. 12h)")
    if not math.isfinite(v) or v <= 0 or v > 10 * 365 * 86400:
        _fail(f"--expires {text!r}: must be positive and at most 10 years")
    return v


@token_app.command("ls")
def token_ls(
    db: str = typer.Option(..., "--db", help="The service's store URL."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The tokens (never their secrets): tenant, role, prefix, created, expires, revoked; and tenants' users."""
    import time

    from rich.table import Table

    from goodput.sched.live.store import StoreError, open_store

    try:
        with open_store(db) as store:
            rows = [r for r in store.tokens() if r["role"] != "job"]
            users = store.tenant_users()
    except (ValueError, StoreError) as e:
        _fail(str(e))
    for r in rows:
        r["user"] = users.get(r["tenant"])
    if as_json:
        print(json.dumps(rows, indent=2))
        return

    def when(t: float | None) -> str:
        return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    t = Table("prefix", "tenant", "role", "user", "created", "expires", "revoked")
    for r in rows:
        t.add_row(r["prefix"] or "?", r["tenant"], r["role"], r["user"] or "", when(r["created"]),
                  when(r["expires"]), when(r["revoked"]))  # fmt: skip
    _console().print(t)


@token_app.command("revoke")
def token_revoke(
    name: str = typer.Argument(..., help="A tenant (all its tokens) or a token's prefix as `token ls` shows it."),
    db: str = typer.Option(..., "--db", help="The service's store URL."),
) -> None:
    """Revoke tokens: a running service refuses them within a second."""
    from goodput.sched.live.store import StoreError, open_store

    try:
        with open_store(db) as store:
            n = store.revoke_tokens(name)
    except (ValueError, StoreError) as e:
        _fail(str(e))
    if n == 0:
        _fail(f"no live token matches {name!r}", 1)
    print(f"revoked {n} token{'s' if n != 1 else ''}")


def _call(url: str, method: str, path: str, body: dict | None = None, *, stream: bool = False,
          retry: frozenset[int] | None = None):  # noqa: ANN202 # fmt: skip
    """One request to the service; an HTTP error fails the command (exit 2). ``retry``: the HTTP
    codes (and an unreachable service) that raise :class:`_StreamBroke` instead, for a caller that
    tries again."""
    import urllib.error
    import urllib.request

    token = os.environ.get("GOODPUT_TOKEN", "")
    if not token:
        _fail("set GOODPUT_TOKEN to your token (goodput sched token add TENANT --db URL)")
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        r = urllib.request.urlopen(req, timeout=None if stream else 30)
    except urllib.error.HTTPError as e:
        if retry is not None and e.code in retry:
            raise _StreamBroke(f"HTTP {e.code}") from None
        try:
            detail = json.loads(e.read()).get("detail")
        except ValueError:
            detail = e.reason
        _fail(f"HTTP {e.code}: {detail}")
    except OSError as e:  # URLError is one: refused, reset, unreachable
        if retry is not None:
            raise _StreamBroke(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
        _fail(f"cannot reach {url}: {getattr(e, 'reason', e)}")
    if stream:
        return r
    with r:
        return json.loads(r.read())


_URL = typer.Option("http://127.0.0.1:8765", "--url", envvar="GOODPUT_URL", help="The service.")


@app.command("submit")
def submit_cmd(
    command: list[str] = typer.Argument(..., help="The job's command (after --)."),
    name: str = typer.Option("job", "--name"),
    nodes: int = typer.Option(1, "--nodes"),
    gpus_per_node: int = typer.Option(1, "--gpus-per-node"),
    priority: int = typer.Option(0, "--priority"),
    limit_s: float = typer.Option(3600.0, "--limit-s"),
    ckpt_root: str = typer.Option("", "--ckpt-root"),
    spot: bool = typer.Option(False, "--spot"),
    grace_s: float = typer.Option(30.0, "--grace-s"),
    key: str = typer.Option(
        "", "--key", help="Idempotency key: a retry with the same key answers the first submission's id."
    ),
    url: str = _URL,
) -> None:
    """Submit a job; prints its id alone on the last line."""
    body = {
        "name": name,
        "command": command,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "priority": priority,
        "limit_s": limit_s,
        "ckpt_root": os.path.abspath(ckpt_root) if ckpt_root else "",
        "spot": spot,
        "grace_s": grace_s,
    }
    if key:
        body["key"] = key
    print(_call(url, "POST", "/jobs", body)["id"])


@app.command("ls")
def ls_cmd(
    state: str = typer.Option("", "--state"),
    name: str = typer.Option("", "--name"),
    as_json: bool = typer.Option(False, "--json"),
    url: str = _URL,
) -> None:
    """List your jobs (an admin token: everyone's)."""
    from urllib.parse import urlencode

    from rich.table import Table

    q = urlencode({k: v for k, v in (("state", state), ("name", name)) if v})
    jobs = _call(url, "GET", "/jobs" + (f"?{q}" if q else ""))["jobs"]
    if as_json:
        print(json.dumps(jobs, indent=2))
        return
    t = Table("id", "tenant", "state", "substate", "prio", "shape", "restarts", "placement")
    for j in jobs:
        t.add_row(
            j["id"], j["tenant"], j["state"], j["substate"], str(j["priority"]),
            f"{j['nodes']}x{j['gpus_per_node']}", str(j["restarts"]), ",".join(j["placement"]),
        )  # fmt: skip
    _console().print(t)


@app.command("show")
def show_cmd(job_id: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json"), url: str = _URL) -> None:
    """A job's detail: state, checkpoint facts, restarts and its state history."""
    from rich.table import Table

    j = _call(url, "GET", f"/jobs/{job_id}")
    if as_json:
        print(json.dumps(j, indent=2))
        return
    c = _console()
    c.print(f"[bold]{j['id']}[/bold] {j['state']} ({j['substate']}) epoch {j['epoch']} restarts {j['restarts']}")
    c.print(f"checkpoint: {json.dumps(j['checkpoint'])}")
    t = Table("t", "event", "details")
    for r in j["history"]:
        rest = {k: v for k, v in r.items() if k not in ("t", "event", "job", "candidates")}
        t.add_row(f"{r['t']:.2f}", r["event"], json.dumps(rest))
    c.print(t)


@app.command("cancel")
def cancel_cmd(job_id: str = typer.Argument(...), url: str = _URL) -> None:
    """Cancel a job (a running one is asked to leave, then released)."""
    r = _call(url, "POST", f"/jobs/{job_id}/cancel")
    print(f"{r['id']} {r['state']} {r['substate']}")


@app.command("resize")
def resize_cmd(
    job_id: str = typer.Argument(...),
    nodes: int = typer.Option(..., "--nodes", help="Its new gang size (slots)."),
    gpus_per_node: int = typer.Option(0, "--gpus-per-node", help="Its new GPUs per node (default: unchanged)."),
    url: str = _URL,
) -> None:
    """Give a pending job another gang shape: its next run resumes from its committed checkpoint there."""
    body: dict = {"nodes": nodes} | ({"gpus_per_node": gpus_per_node} if gpus_per_node else {})
    r = _call(url, "POST", f"/jobs/{job_id}/resize", body)
    print(f"{r['id']} {r['state']} {r['nodes']}x{r['gpus_per_node']}")


EVENTS_PAGE = 10_000  # records a request asks for (the service's default limit; at most 100,000)
_SEQ_AT_END = re.compile(rb',"seq":(\d+)}\s*$')  # the service appends each record's seq last


@dataclass
class EventRelay:
    """What ``goodput sched events`` has printed of a log: how many records, the seq of the last one
    (where the next request goes on from) and the ``events_pruned`` record that ended a stream whose
    next events the retention deleted (a pipeline must not take the output for the whole log)."""

    out: Callable[..., Any]
    count: int = 0
    seq: int | None = None
    gap: dict[str, Any] | None = None

    def feed(self, lines: Iterable[bytes]) -> int:
        """Print each JSONL line of one response; how many records it held. Stops at a gap record."""
        n = 0
        for line in lines:
            if not line.strip():
                continue
            self.out(line.decode().rstrip("\n"), flush=True)
            m = _SEQ_AT_END.search(line)
            if m is not None:
                self.seq = int(m.group(1))
                n += 1
                self.count += 1
            elif b'"events_pruned"' in line:
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict) and rec.get("event") == "events_pruned":
                        self.gap = rec
                        return n
        return n


def relay_events(lines: Iterable[bytes], out: Callable[..., Any]) -> dict[str, Any] | None:
    """Print each JSONL line of an /events stream; the ``events_pruned`` record that ends a stream
    whose next events were deleted is printed too, and returned (None when the stream had no gap)."""
    relay = EventRelay(out)
    relay.feed(lines)
    return relay.gap


class _StreamBroke(Exception):
    """The service could not be reached, or answered that it cannot serve now (restarting, busy)."""


def _events_request(url: str, since: int | None, follow: bool, page: int):  # noqa: ANN202
    """One ``GET /events`` (a response to read as lines). A 410 (the retention deleted events after
    ``since``) or another HTTP error fails the command; an unreachable service, a 502/503/504 (restarting,
    its store busy) or, for a follower, a 429 (its stream slot not yet freed after a broken
    connection) raises :class:`_StreamBroke`: the same request may succeed."""
    at = "" if since is None else f"since={since}&"
    path = f"/events?{at}limit={page}&follow={'true' if follow else 'false'}"
    return _call(url, "GET", path, stream=True, retry=frozenset({502, 503, 504} | ({429} if follow else set())))


@app.command("events")
def events_cmd(
    since: int | None = typer.Option(
        None,
        "--since",
        help="Start after this sequence number (an error if the event retention deleted events after it); "
        "default: from the oldest event the service keeps.",
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep streaming new records (through the service's restarts)."
    ),
    page: int = typer.Option(EVENTS_PAGE, "--page", min=1, max=100_000, help="Records asked for per request."),
    url: str = _URL,
) -> None:
    """The event log as JSONL (the simulator's schema, each record with its `seq`): pipe it into
    `goodput sched check`. The whole log is read, a page of records per request; with --follow, a
    broken connection is resumed after the last record printed, never skipped or repeated."""
    import http.client
    import time

    relay = EventRelay(print)
    err = Console(stderr=True)
    first_request = True
    wait = 0.5
    while True:
        try:
            r = _events_request(url, relay.seq if relay.seq is not None else since, follow, page)
            if first_request:
                first = r.headers.get("X-Goodput-First-Seq", "1")
                if since is None and first.isdigit() and int(first) > 1:
                    # the head of the log is gone: a job's first records may be missing; said, never hidden
                    err.print(
                        f"note: the service's event retention deleted events 1 to {int(first) - 1}: the log starts "
                        f"at seq {first} (check it with `goodput sched check --partial`)"
                    )
                first_request = False
            with r:
                got = relay.feed(r)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except (_StreamBroke, http.client.HTTPException, OSError) as e:
            if not follow:
                where = f"after seq {relay.seq}: go on with --since {relay.seq}" if relay.seq is not None else ""
                # records printed: a partial output (1); none: the command failed (2)
                _fail(f"the event stream broke {where or 'before any record'} ({e})", 1 if relay.count else 2)
            err.print(f"note: the event stream broke ({e}); resuming after seq {relay.seq} in {wait:g} s")
            time.sleep(wait)
            wait = min(wait * 2, 5.0)
            continue
        if relay.gap is None and follow and got == 0:
            time.sleep(wait)  # a follow stream the service ended with nothing (shutting down): not a busy loop
            wait = min(wait * 2, 5.0)
        else:
            wait = 0.5
        if relay.gap is not None:
            # the service deleted events this stream had not read yet (the record itself was printed, last)
            _fail(
                f"events after seq {relay.gap.get('since')} were deleted by the service's event retention before "
                f"they were read: the log keeps seq {relay.gap.get('first_seq')} on (the stream ends here)",
                1,
            )
        if not follow and got < page:
            return  # the log as it stood: a short page is its end
