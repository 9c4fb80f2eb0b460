"""Run several policies over one workload and one cluster, each in its own process when asked.

Every policy sees the same jobs and the same cluster events (reclaims, node losses, failures at
the same instants on the same nodes), so each difference in the results is the policy's. A
worker returns only numbers (metrics, ledger, waits); the event log of one chosen policy is
written to a file by the worker that ran it.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.events import write_jsonl
from ..core.model import Job, PoolKind
from ..core.policy import POLICIES, Policy
from .checker import CheckReport, Rules, check
from .formats import Cluster, ClusterEvent
from .ledger import CATEGORIES
from .metrics import log_metrics, lost_by_cause
from .simulator import SimResult, simulate

# relative simulation cost of each policy on the default comparison (measured), for ordering work
_WEIGHT = {"spot-by-price": 4.0, "goodput": 3.0, "kueue-victims": 2.5, "release-at-decision": 2.5}
SPOT_NOTICE_S = 120.0  # AWS's two-minute interruption notice
SPOT_RETURN_S = 3600.0  # reclaimed capacity comes back after an hour


def poisson_reclaims(cluster: Cluster, horizon_s: float, *, seed: int = 0) -> list[ClusterEvent]:
    """Single-node reclaims on every spot pool at its ``reclaim_per_node_hour``: what the
    placement rule prices, so that the default comparison exercises it without a trace."""
    out: list[ClusterEvent] = []
    rng = random.Random(seed)
    for pool in cluster.pools:
        if pool.kind is not PoolKind.SPOT or pool.reclaim_per_node_hour <= 0:
            continue
        rate = pool.nodes * pool.reclaim_per_node_hour / 3600.0
        t = rng.expovariate(rate)
        while t < horizon_s:
            out.append(
                ClusterEvent(
                    t=t,
                    kind="reclaim",
                    pool=pool.name,
                    nodes=1,
                    notice_s=SPOT_NOTICE_S,
                    return_s=SPOT_RETURN_S,
                    seed_key=rng.randrange(1, 1 << 30),
                )
            )
            t += rng.expovariate(rate)
    return sorted(out, key=lambda e: e.t)


@dataclass
class PolicyResult:
    name: str
    metrics: dict[str, Any]
    tenants: dict[str, dict[str, float]]
    waits: list[float]
    examples: list[str]


# what every policy of one comparison shares, sent to each worker process once, not once per task
_shared: tuple[list[Job], Cluster, list[ClusterEvent]] | None = None


def _share(jobs: list[Job], cluster: Cluster, extra: list[ClusterEvent], parent: int = 0) -> None:
    """The worker initializer: keeps what every task shares and ties the worker's life to its parent's."""
    global _shared
    if parent:
        die_with_parent(parent)
    _shared = (jobs, cluster, extra)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_S = 0.5


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` goes, however it goes (SIGKILL, a closed terminal).

    A worker of a killed ``goodput sched sim`` was re-parented to init and kept burning a core for
    minutes. Linux's parent-death signal kills it the moment the parent dies (and is set before the
    check, so a parent already gone is seen); where prctl is missing, or the parent thread that
    forked it exits first, a daemon thread notices the new parent id within ``WATCH_S``.
    """
    import ctypes
    import signal
    import threading

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        import time

        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _run_one(args: tuple) -> PolicyResult:
    assert _shared is not None, "a worker runs a policy only after _share"
    jobs, cluster, extra = _shared
    policy, events_path, db_url, ledger_path = args
    if db_url:
        from ..live.store import open_store

        with open_store(db_url) as store:
            res = simulate(jobs, cluster, policy, extra_events=extra, store=store, check_log=False)
    else:
        res = simulate(jobs, cluster, policy, extra_events=extra, check_log=False)
    res.check = audit(res.events, cluster)
    if events_path:
        write_jsonl(res.events, events_path)
    if ledger_path:
        write_job_ledger(res, ledger_path)
    tenants = {
        t: {**{c: getattr(a, c) / 3600.0 for c in CATEGORIES}, "allocated": a.allocated / 3600.0}
        for t, a in sorted(res.ledger.tenants.items())
    }
    return PolicyResult(policy.name, full_metrics(res, jobs, cluster), tenants, res.waits, res.check.examples[:10])


def audit(records: Sequence[dict[str, Any]], cluster: Cluster) -> CheckReport:
    """The independent checker over a run's log, told what the cluster file says: which pool each
    node is in, which pools are on-demand, and the operator's limits."""
    node_pool = {n: p.name for p in cluster.pools for n in cluster.node_names(p.name)}
    kinds = {p.name: PoolKind(p.kind).value for p in cluster.pools}
    return check(records, cluster.capacity(), rules=rules_of(cluster), pools=node_pool, pool_kinds=kinds)


def rules_of(cluster: Cluster) -> Rules:
    lim = getattr(getattr(cluster, "governance", None), "limits", None)
    if lim is None:
        return Rules()
    return Rules(
        over_time_limit_s=float(lim.over_time_limit_s),
        max_grace_s=float(lim.max_grace_s),
        max_restart_s=float(lim.max_restart_s),  # a rerun's hold: the cap stands in for its restart
    )


def full_metrics(res: SimResult, jobs: Sequence[Job], cluster: Cluster) -> dict[str, Any]:
    """The simulator's metrics and those that cannot flatter (:mod:`goodput.sched.sim.metrics`)."""
    m = res.metrics()
    by_cause, total = lost_by_cause(m["ledger_gpu_hours"])
    gov = getattr(cluster, "governance", None)
    specs = getattr(gov, "tenants", None) or {}
    weights = {name: float(getattr(spec, "weight", 1.0)) for name, spec in specs.items()}
    allocated = {t: a.allocated for t, a in res.ledger.tenants.items()}
    extra = log_metrics(res.events, jobs, cluster.capacity(), weights=weights, allocated_by_tenant=allocated)
    m["lost_gpu_hours_total"] = total
    m["lost_gpu_hours_by_cause"] = by_cause
    m.update(extra)
    m["window"]["run_end_s"] = res.horizon_s  # the ledger's totals run to the last job's end
    return m


def _worker_context() -> mp.context.BaseContext:
    """Spawn, never fork: the caller may be threaded (a service, a test run that saved
    checkpoints), and a child forked from a threaded parent can inherit a lock some other thread
    held at that instant and hang for ever. Not forkserver either: its server is a child of ours
    and the workers its children, so when we were killed it and they lived on under init; spawned
    workers are our own children and :func:`die_with_parent` ends them with us."""
    return mp.get_context("spawn")


def compare(
    jobs: Sequence[Job],
    cluster: Cluster,
    policies: Sequence[Policy],
    *,
    extra_events: Sequence[ClusterEvent] = (),
    events_policy: str | None = None,
    events_path: str | None = None,
    workers: int = 1,
    on_done: Callable[[PolicyResult], None] | None = None,
    db_url: str | None = None,
    ledger_path: str | None = None,
) -> list[PolicyResult]:
    """Results in the order of ``policies``; ``db_url`` persists ``events_policy``'s scheduler
    (or ours) in a store, one transaction per input, as a live service would."""
    keep = events_policy or ours([p.name for p in policies])
    shared = (list(jobs), cluster, list(extra_events))
    tasks = [
        (
            p,
            events_path if p.name == events_policy else None,
            db_url if p.name == keep else None,
            ledger_path if p.name == keep else None,
        )
        for p in policies
    ]
    results: dict[str, PolicyResult] = {}
    if workers <= 1 or len(tasks) == 1:
        global _shared
        saved, _shared = _shared, shared
        try:
            for t in tasks:
                r = _run_one(t)
                results[r.name] = r
                if on_done:
                    on_done(r)
        finally:
            _shared = saved
    else:
        # the longest runs first, so that the last one to start is a short one
        order = sorted(tasks, key=lambda t: -_WEIGHT.get(t[0].name, 1.0))
        ctx = _worker_context()
        with ctx.Pool(min(workers, len(tasks)), initializer=_share, initargs=(*shared, os.getpid())) as pool:
            for r in pool.imap_unordered(_run_one, order, chunksize=1):
                results[r.name] = r
                if on_done:
                    on_done(r)
    return [results[p.name] for p in policies]


def write_job_ledger(res, path: str) -> None:  # noqa: ANN001
    """One CSV row per job: its tenant and every ledger category in GPU-hours."""
    import csv

    tenant_of = {r["job"]: r["tenant"] for r in res.events if r["event"] == "submitted"}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["job", "tenant", "allocated_gpu_h", *(f"{c}_gpu_h" for c in CATEGORIES)])
        for job, a in res.ledger.jobs.items():
            w.writerow(
                [
                    job,
                    tenant_of.get(job, ""),
                    f"{a.allocated / 3600:.6f}",
                    *(f"{getattr(a, c) / 3600:.6f}" for c in CATEGORIES),
                ]
            )


def ours(names: Sequence[str]) -> str:
    """The policy whose event log ``--events`` writes: ours (its name contains goodput), else the first."""
    return next((n for n in names if "goodput" in n), names[0])


def resolve(names: Sequence[str]) -> list[Policy]:
    if not names:
        return list(POLICIES.values())
    out = []
    for n in names:
        if n not in POLICIES:
            raise ValueError(f"unknown policy {n!r} (known: {', '.join(POLICIES)})")
        out.append(POLICIES[n])
    return out


def horizon_of(jobs: Sequence[Job]) -> float:
    """A horizon for generated events: past the last arrival by the longest job, at most 30 days."""
    last = max((j.submit_s for j in jobs), default=0.0)
    longest = max((j.duration_s for j in jobs), default=0.0)
    return min(last + longest, last + 30 * 86400.0) if math.isfinite(last) else 0.0
