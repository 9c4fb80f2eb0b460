"""Metrics that cannot flatter a policy, read from a run's event log, its jobs and its ledger.

``goodput`` (useful ÷ allocated) rewards a policy that leaves GPUs idle: what it never allocates
cannot be wasted, which is how ``fifo-no-backfill`` once beat ours on it. These numbers divide by
what the cluster *had*, count every way an hour was lost, and say how often and whom a policy
disturbed:

- ``useful_per_capacity``: useful GPU-seconds done inside the *window* ÷ the GPU-seconds the
  cluster had in it (nodes lost or reclaimed count for nothing while gone). The window runs from
  0 to the last arrival, the same for every policy of a comparison: a policy that pushes work past
  it has done less in it. A batch (every job at 0) runs it to the end of its longest job had that
  started at once. Useful is the progress that a later commit (or the finish) kept, placed
  in time as the simulated job made it (after its restart, minus checkpoint stalls, once its GPUs
  were physically free).
- ``lost_gpu_hours_total`` and ``lost_gpu_hours_by_cause``: preemption, failures, restart,
  draining and double-booked (the ledger's categories; checkpoint stall is listed apart).
- preemptions by ``reason``; for priority and quota: ``preemption_decisions``, ``victims``,
  ``victims_per_decision``, ``victim_run_p50_s`` (how long a victim had run in its current run when
  asked to leave), ``max_evictions_of_one_job``.
- ``tenants``: each tenant's ``share`` of allocated GPU-hours beside its ``entitlement`` (its weight
  over the weights of the tenants that submitted) and its ``demand`` (its share of submitted work).

Logs written before preemptions carried ``reason`` and ``preemptor`` are read from ``victim_of``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.model import Job

INFRA_REASONS = frozenset({"reclaim", "drain", "node_loss", "cancel", "time_limit"})
CHOSEN_REASONS = frozenset({"priority", "quota", "move"})  # a policy's own choice of victims


def preempt_reason(rec: Mapping[str, Any]) -> str:
    """A preemption's reason: its ``reason`` key, or (older logs) ``victim_of`` when it names one."""
    r = rec.get("reason")
    if isinstance(r, str) and r:
        return r
    v = rec.get("victim_of")
    return v if v in INFRA_REASONS else "priority"


def preemptor_of(rec: Mapping[str, Any]) -> str | None:
    if "preemptor" in rec:
        p = rec["preemptor"]
        return p if isinstance(p, str) and p else None
    v = rec.get("victim_of")
    return None if not isinstance(v, str) or v in INFRA_REASONS else v


@dataclass(slots=True)
class _Run:
    gpus_per_node: int
    nodes: tuple[str, ...]
    start: float
    c0: float
    restart: float
    tau: float
    delta: float
    duration: float
    avail: float = -1.0  # when its GPUs were physically free
    stop: float = math.inf  # when training stopped (a notice or its exit)

    def progress_at(self, t: float) -> float:
        """Progress as :class:`goodput.sched.sim.simulator.World` makes it: full speed after the restart,
        blocked ``delta`` every ``tau`` of progress."""
        if self.avail < 0:
            return self.c0
        p0 = self.avail + self.restart
        t = min(t, self.stop)
        if t <= p0:
            return self.c0
        el = t - p0
        if self.tau <= 0:
            return min(self.duration, self.c0 + el)
        cyc = self.tau + self.delta
        k = math.floor(el / cyc)
        return min(self.duration, self.c0 + k * self.tau + min(el - k * cyc, self.tau))


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def log_metrics(
    records: Iterable[Mapping[str, Any]],
    jobs: Sequence[Job],
    capacity: Mapping[str, int],
    *,
    window_end_s: float | None = None,
    weights: Mapping[str, float] | None = None,
    allocated_by_tenant: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The numbers above for one run. ``window_end_s`` defaults to the last arrival of ``jobs``;
    ``weights`` are the tenants' fair-share weights (1 when absent); ``allocated_by_tenant`` is the
    ledger's allocated GPU-seconds per tenant (else the log's held GPU-seconds are used)."""
    specs = {j.id: j for j in jobs}
    w_end = max((j.submit_s for j in jobs), default=0.0) if window_end_s is None else window_end_s
    what = "0 to the last arrival, the same for every policy; work done after it is not counted here"
    if window_end_s is None and w_end <= 0.0:
        # a batch (every job at 0) has no arrival stream to measure over: the window runs to the
        # earliest instant its longest job could end, still the same for every policy (it read 0
        # capacity and 0.0 for every policy)
        w_end = max((j.submit_s + j.duration_s for j in jobs), default=0.0)
        what = "a batch (every job arrives at 0): 0 to the end of its longest job had it started at once"
    cap = {str(k): int(v) for k, v in capacity.items()}
    used = dict.fromkeys(cap, 0)
    total_cap = sum(cap.values())
    alive = total_cap
    lost: set[str] = set()
    cap_gpu_s = 0.0
    last_t = 0.0

    runs: dict[str, _Run] = {}
    waiting: dict[str, _Run] = {}
    committed: dict[str, float] = {}
    useful_in = 0.0
    by_reason: dict[str, int] = {}
    decisions: set[tuple[float, str]] = set()
    victims = 0
    victim_run: list[float] = []
    evictions: dict[str, int] = {}
    held: dict[str, float] = {}  # tenant -> GPU-seconds from start to release (when no ledger is given)
    tenant_of: dict[str, str] = {}
    bound_at: dict[str, tuple[float, int]] = {}

    def advance(t: float) -> None:
        nonlocal cap_gpu_s, last_t
        if t > last_t:
            lo, hi = last_t, min(t, w_end)
            if hi > lo:
                cap_gpu_s += alive * (hi - lo)
            last_t = t

    def close(jid: str, run: _Run, t: float, kept: float) -> None:
        nonlocal useful_in
        if run.stop > t:
            run.stop = t
        done = run.progress_at(min(w_end, run.stop))
        g = run.gpus_per_node * len(run.nodes)
        useful_in += g * max(0.0, min(kept, done) - run.c0)

    def try_begin(run: _Run, t: float) -> bool:
        if all(used.get(n, 0) <= cap.get(n, 0) for n in run.nodes):
            run.avail = t
            return True
        return False

    for rec in records:
        t = float(rec["t"])
        advance(t)
        ev = rec["event"]
        if ev == "submitted":
            tenant_of[rec["job"]] = str(rec.get("tenant", ""))
        elif ev == "started":
            jid = rec["job"]
            spec = specs.get(jid)
            if spec is None:
                continue
            c = spec.ckpt
            tau = max(c.interval_s, c.write_s) if c.interval_s > 0 else 0.0
            epoch = int(rec["epoch"])
            run = _Run(
                gpus_per_node=int(rec["gpus_per_node"]),
                nodes=tuple(rec["nodes"]),
                start=t,
                c0=float(rec["resume_from_s"]),
                restart=c.restart_s if epoch > 1 else 0.0,
                tau=tau,
                delta=c.stall_s if tau > 0 else 0.0,
                duration=spec.duration_s,
            )
            for n in run.nodes:
                used[n] = used.get(n, 0) + run.gpus_per_node
            if not try_begin(run, t):
                waiting[jid] = run
            runs[jid] = run
            bound_at[jid] = (t, run.gpus_per_node * len(run.nodes))
        elif ev == "preempt_requested":
            jid = rec["job"]
            reason = preempt_reason(rec)
            by_reason[reason] = by_reason.get(reason, 0) + 1
            run = runs.get(jid)
            if run is not None and run.stop > t:
                run.stop = t  # training stops at the notice; what it writes then is a commit
            if reason in CHOSEN_REASONS:
                victims += 1
                decisions.add((t, preemptor_of(rec) or ""))
                evictions[jid] = evictions.get(jid, 0) + 1
                if run is not None:
                    victim_run.append(t - run.start)
        elif ev == "checkpoint_committed":
            committed[rec["job"]] = float(rec["progress_s"])
        elif ev == "exited":
            jid = rec["job"]
            run = runs.pop(jid, None)
            waiting.pop(jid, None)
            if run is None:
                continue
            if run.avail < 0:
                run.avail = t  # never got its GPUs: no progress
            kept = run.duration if rec.get("status") == "finished" else committed.get(jid, run.c0)
            close(jid, run, t, kept)
            for n in run.nodes:
                used[n] = used.get(n, 0) - run.gpus_per_node
            for other_id in sorted(k for k, r in waiting.items() if not set(r.nodes).isdisjoint(run.nodes)):
                if try_begin(waiting[other_id], t):
                    del waiting[other_id]
        elif ev == "released":
            jid = rec["job"]
            b = bound_at.pop(jid, None)
            if b is not None:
                ten = tenant_of.get(jid, "")
                held[ten] = held.get(ten, 0.0) + b[1] * (t - b[0])
        elif ev == "node_lost":
            n = rec["node"]
            if n in cap and n not in lost:
                lost.add(n)
                alive -= cap[n]
        elif ev == "node_up":
            n = rec["node"]
            if n in lost:
                lost.discard(n)
                alive += cap[n]
    if last_t < w_end:
        advance(w_end)
    for jid, run in runs.items():  # still running when the log ends: what it committed is kept
        close(jid, run, last_t, committed.get(jid, run.c0))

    n_dec = len(decisions)
    demand: dict[str, float] = {}
    for j in jobs:
        demand[j.tenant] = demand.get(j.tenant, 0.0) + j.gpus * j.duration_s
    alloc = dict(allocated_by_tenant) if allocated_by_tenant is not None else held
    tenants = sorted(set(demand) | set(alloc))
    wsum = sum((weights or {}).get(t, 1.0) for t in demand) or 1.0
    a_sum = sum(alloc.values()) or 1.0
    d_sum = sum(demand.values()) or 1.0
    per_tenant = {
        t: {
            "share": alloc.get(t, 0.0) / a_sum,
            "entitlement": ((weights or {}).get(t, 1.0) / wsum) if t in demand else 0.0,
            "demand": demand.get(t, 0.0) / d_sum,
            "allocated_gpu_hours": alloc.get(t, 0.0) / 3600.0,
        }
        for t in tenants
    }
    return {
        "useful_per_capacity": useful_in / cap_gpu_s if cap_gpu_s > 0 else 0.0,
        "window": {
            "start_s": 0.0,
            "end_s": w_end,
            "what": what,
            "useful_gpu_hours": useful_in / 3600.0,
            "capacity_gpu_hours": cap_gpu_s / 3600.0,
        },
        "preemptions_by_reason": dict(sorted(by_reason.items())),
        "preemption_decisions": n_dec,
        "victims": victims,
        "victims_per_decision": victims / n_dec if n_dec else 0.0,
        "victim_run_p50_s": _pct(victim_run, 0.5),
        "max_evictions_of_one_job": max(evictions.values(), default=0),
        "tenant_shares": per_tenant,
    }


LOST_CAUSES = {  # key in lost_gpu_hours_by_cause -> the ledger's category
    "preemption": "lost_preemption",
    "failures": "lost_failure",
    "restart": "restart",
    "draining": "draining",
    "double_booked": "double_booked",
    "checkpoint_stall": "checkpoint_stall",
}
LOST_TOTAL = ("preemption", "failures", "restart", "draining", "double_booked")


def lost_by_cause(ledger_hours: Mapping[str, float]) -> tuple[dict[str, float], float]:
    """(GPU-hours lost per cause, their total over :data:`LOST_TOTAL`) from the ledger's breakdown."""
    by = {k: float(ledger_hours.get(c, 0.0)) for k, c in LOST_CAUSES.items()}
    return by, sum(by[k] for k in LOST_TOTAL)
