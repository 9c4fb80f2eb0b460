"""The simulator's run as a dashboard page: ``goodput sched sim --ui DIR`` writes ``DIR/index.html``.

The page is the static report of our policy's event log (:func:`.page.write_report`), with what the
simulation knows beyond the log: each job's checkpoint interval and limit, the simulator's exact
ledger beside the log's estimate, and every policy's metrics, so a comparison is a page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .page import write_report

POLICY_KEYS = (
    "goodput",
    "lost_gpu_hours",
    "wait_p50_s",
    "wait_p99_s",
    "utilization",
    "cost_usd",
    "violations",
    "ledger_gpu_hours",
)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return x


def sim_report(
    events: str | Path,
    directory: str | Path,
    results: Sequence[Any],
    jobs: Sequence[Any],
    cluster: Any,
    policy: str,
    notes: Sequence[str] = (),
) -> Path:
    """Write ``directory/index.html`` for the run of ``policy`` whose event log is ``events``."""
    from goodput.sched.core.capacity import Capacity

    meta = {
        j.id: {"interval_s": j.ckpt.interval_s, "write_s": j.ckpt.write_s, "limit_s": j.limit_s or j.duration_s}
        for j in jobs
    }
    capacity = {n.name: n.gpus for n in Capacity.build_nodes(cluster.pools)}
    kinds = {p.name: p.kind.value for p in cluster.pools}
    ours = next((r for r in results if r.name == policy), None)
    exact = dict(ours.metrics["ledger_gpu_hours"]) if ours is not None else None
    policies = [{"name": r.name, "metrics": _finite({k: r.metrics.get(k) for k in POLICY_KEYS})} for r in results]
    return write_report(
        events,
        Path(directory) / "index.html",
        capacity=capacity,
        pool_kinds=kinds,
        meta=meta,
        policies=policies,
        exact_ledger=exact,
        title=f"goodput sched sim: {policy}",
        notes=list(notes),
    )
