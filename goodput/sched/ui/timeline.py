"""The dashboard's reading of an event log: jobs, runs, nodes, preemptions and where GPU-time went.

The live page and the static report read the same records (docs/SCHED.md's schema), so both are built
from this one replay; a live service feeds it the records its scheduler appended since the last
request. Records of other versions are tolerated: unknown keys are ignored, and keys added later
(``reason`` and ``preemptor`` on ``preempt_requested``, ``reason`` on ``failed``, ``limit_s`` on
``submitted``, the ``reserved`` event) are used when present and derived or left empty when not.

The event log times runs, commits, notices and exits, not restarts or checkpoint stalls, so the
ledger built here is an estimate in fewer causes than the simulator's own (:mod:`..ledger`): a run's
*useful* GPU-time is the progress its commits (or its finish) kept, *draining* runs from the notice
to the exit, *lost* is the rest of a run that ended (restart and stall included), charged to
preemption when the run was asked to leave and to failures otherwise, and *at risk* is the
uncommitted part of a run still going.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# victim_of words that name what asked, not a job (docs/SCHED.md; older records carry only victim_of)
PRIORITY_VICTIM_OF = frozenset({"reclaim", "node_loss", "cancel", "drain", "time_limit"})


@dataclass(slots=True)
class Run:
    """One epoch of a job: from its start to the release of its GPUs."""

    job: str
    tenant: str
    epoch: int
    pool: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    start: float
    resume_from: float
    commits: list[tuple[float, float]] = field(default_factory=list)  # (t, progress_s)
    preempt_t: float | None = None
    preemption: int = -1  # index into Timeline.preemptions
    exit_t: float | None = None
    status: str = ""  # the exit's status
    release_t: float | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    def account(self, now: float) -> dict[str, float]:
        """This run's GPU-seconds by cause, as of ``now`` (an estimate: see the module's docstring)."""
        end = self.release_t if self.release_t is not None else now
        g = self.gpus
        alloc = g * max(0.0, end - self.start)
        drain = 0.0
        if self.preempt_t is not None:
            drain = g * max(0.0, (self.exit_t if self.exit_t is not None else end) - self.preempt_t)
        drain = min(drain, alloc)
        if self.status == "finished":
            useful = alloc - drain
        else:
            useful = g * max(0.0, self.committed() - self.resume_from)
        useful = min(useful, alloc - drain)
        rest = max(0.0, alloc - useful - drain)
        out = {"allocated": alloc, "useful": useful, "draining": drain, "lost_preemption": 0.0}
        out["lost_failure"] = out["at_risk"] = 0.0
        if self.exit_t is None:
            out["at_risk"] = rest
        elif self.preempt_t is not None and self.status in ("preempted", "killed", "failed"):
            out["lost_preemption"] = rest
        else:
            out["lost_failure"] = rest
        return out

    def committed(self) -> float:
        return self.commits[-1][1] if self.commits else self.resume_from

    def useful_segments(self, now: float) -> Iterable[tuple[float, float, float]]:
        """(t0, t1, GPU-seconds) of useful work, spread between the commits that kept it."""
        g = self.gpus
        t, p = self.start, self.resume_from
        for ct, cp in self.commits:
            if cp > p:
                yield t, ct, g * (cp - p)
            t, p = ct, max(p, cp)
        if self.status == "finished" and self.exit_t is not None:
            stop = self.preempt_t if self.preempt_t is not None else self.exit_t
            if stop > t:
                yield t, stop, g * (stop - t)


@dataclass(slots=True)
class JobInfo:
    id: str
    tenant: str = ""
    priority: int = 0
    nodes: int = 0
    gpus_per_node: int = 0
    submit_s: float = 0.0
    limit_s: float | None = None
    state: str = "pending"
    substate: str = "queued"
    records: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    failed_reason: str = ""


@dataclass(slots=True)
class Preemption:
    t: float
    job: str
    tenant: str
    epoch: int
    victim_of: str
    reason: str
    preemptor: str  # a job id, or "" when a cluster event asked (reclaim, node loss, drain, cancel)
    lost_s: float
    gpus: int
    checkpoint: bool
    deadline_s: float
    candidates: list[dict[str, Any]]
    realized_gpu_s: float | None = None  # what the run lost in fact, once it ended


def _reason_of(rec: dict[str, Any]) -> tuple[str, str]:
    """(reason, preemptor) of a preempt_requested record, new keys first, else derived from victim_of."""
    victim_of = str(rec.get("victim_of", ""))
    reason = rec.get("reason")
    preemptor = rec.get("preemptor")
    if not isinstance(reason, str) or not reason:
        reason = victim_of if victim_of in PRIORITY_VICTIM_OF else ("priority" if victim_of else "unknown")
    if "preemptor" in rec:  # a newer record says it: a job id, or null when no job asked
        preemptor = preemptor if isinstance(preemptor, str) else ""
    else:  # an older one: victim_of is the job it makes room for, or what asked
        preemptor = "" if victim_of in PRIORITY_VICTIM_OF else victim_of
    return reason, preemptor


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


class Timeline:
    """An incremental replay of one event log (records applied in order, as the checker does)."""

    def __init__(self, capacity: dict[str, int] | None = None, pool_kinds: dict[str, str] | None = None) -> None:
        self.capacity: dict[str, int] = dict(capacity or {})
        self.inferred = capacity is None  # node sizes guessed from what ran on them
        self.pool_kinds = dict(pool_kinds or {})
        self.jobs: dict[str, JobInfo] = {}
        self.owner: dict[str, str] = {}  # job -> tenant, as submitted
        self.runs: list[Run] = []
        self.active: dict[str, Run] = {}  # job -> its run not yet released
        self.preemptions: list[Preemption] = []
        # tenant -> indices into ``preemptions`` where its job was the victim or the preemptor: a
        # tenant's view reads its own, not every preemption of the cluster on every poll
        self.preemptions_of: dict[str, list[int]] = {}
        self.node_health: dict[str, str] = {}  # absent: up
        self.node_notice: dict[str, float] = {}
        self.node_down: dict[str, list[list[float]]] = {}  # node -> [[lost_t, up_t or inf], ...]
        self.alloc: dict[str, dict[str, int]] = {}  # node -> job -> GPUs bound
        self.reservation: dict[str, Any] | None = None
        self.t0 = math.inf
        self.t1 = -math.inf
        self.count = 0

    # ------------------------------------------------------------------ replay

    def feed(self, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            try:
                self._apply(rec)
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                # a record of a shape this reader does not know (or ``int(Infinity)``, which Python's JSON
                # reads): skipped, the rest still counts
                continue
            self.count += 1

    def _job(self, jid: str) -> JobInfo:
        j = self.jobs.get(jid)
        if j is None:
            j = self.jobs[jid] = JobInfo(jid)
        return j

    def _apply(self, rec: dict[str, Any]) -> None:
        t = _num(rec.get("t"))
        self.t0, self.t1 = min(self.t0, t), max(self.t1, t)
        kind = rec.get("event")
        if "node" in rec and "job" not in rec:
            self._node_event(kind, str(rec["node"]), t, rec)
            return
        jid = rec.get("job")
        if not isinstance(jid, str):
            return
        if kind == "reserved":
            self.reservation = {
                "job": jid,
                "t": _num(rec.get("reserved_t"), math.inf),
                "nodes": [str(n) for n in rec.get("nodes") or []],
                "pool": str(rec.get("pool", "")) or None,
                "at": t,
            }
            return
        j = self._job(jid)
        j.records.append(rec)
        if kind == "submitted":
            j.tenant = self.owner[jid] = str(rec.get("tenant", ""))
            j.priority = int(rec.get("priority", 0))
            j.nodes = int(rec.get("nodes", 0))
            j.gpus_per_node = int(rec.get("gpus_per_node", 0))
            j.submit_s = _num(rec.get("submit_s"), t)
            if rec.get("limit_s") is not None:
                j.limit_s = _num(rec.get("limit_s"))
            j.state, j.substate = "pending", "queued"
        elif kind == "started":
            if not isinstance(rec.get("nodes"), list):
                raise ValueError(f"job {jid!r}: started without a list of nodes")
            nodes = tuple(str(n) for n in rec["nodes"])
            gpn = int(rec.get("gpus_per_node", j.gpus_per_node or 1))
            run = Run(
                job=jid,
                tenant=j.tenant,
                epoch=int(rec.get("epoch", len(j.runs) + 1)),
                pool=str(rec.get("pool", "")),
                nodes=nodes,
                gpus_per_node=gpn,
                start=t,
                resume_from=_num(rec.get("resume_from_s")),
            )
            j.runs.append(run)
            self.runs.append(run)
            self.active[jid] = run
            for n in nodes:
                held = self.alloc.setdefault(n, {})
                held[jid] = held.get(jid, 0) + gpn
                if self.inferred:
                    self.capacity[n] = max(self.capacity.get(n, 0), sum(held.values()))
            j.state, j.substate = "running", "running"
            if self.reservation is not None and self.reservation["job"] == jid:
                self.reservation = None
        elif kind == "checkpoint_committed":
            run = self.active.get(jid)
            if run is not None:
                run.commits.append((t, _num(rec.get("progress_s"))))
        elif kind == "preempt_requested":
            run = self.active.get(jid)
            reason, preemptor = _reason_of(rec)
            p = Preemption(
                t=t,
                job=jid,
                tenant=j.tenant,
                epoch=int(rec.get("epoch", run.epoch if run else 0)),
                victim_of=str(rec.get("victim_of", "")),
                reason=reason,
                preemptor=preemptor,
                lost_s=_num(rec.get("lost_s")),
                gpus=run.gpus if run else j.nodes * j.gpus_per_node,
                checkpoint=bool(rec.get("checkpoint", False)),
                deadline_s=_num(rec.get("deadline_s"), math.inf),
                candidates=[c for c in rec.get("candidates") or [] if isinstance(c, dict)],
            )
            self.preemptions.append(p)
            k = len(self.preemptions) - 1
            for tn in {j.tenant, self.owner.get(preemptor, "") if preemptor else ""} - {""}:
                self.preemptions_of.setdefault(tn, []).append(k)
            if run is not None and run.preempt_t is None:
                run.preempt_t = t
                run.preemption = len(self.preemptions) - 1
            j.state, j.substate = "preempting", "checkpointing" if p.checkpoint else "stopping"
        elif kind == "exited":
            run = self.active.get(jid)
            if run is not None:
                run.exit_t, run.status = t, str(rec.get("status", ""))
        elif kind == "released":
            run = self.active.pop(jid, None)
            if run is not None:
                run.release_t = t
                if run.exit_t is None:  # released at the decision (a baseline): its exit comes later, if logged
                    run.exit_t = t
                for n in run.nodes:
                    held = self.alloc.get(n)
                    if held is not None:
                        left = held.get(jid, 0) - run.gpus_per_node
                        if left > 0:
                            held[jid] = left
                        else:
                            held.pop(jid, None)
                if run.preemption >= 0:
                    acct = run.account(t)
                    self.preemptions[run.preemption].realized_gpu_s = acct["lost_preemption"] + acct["lost_failure"]
            if j.state in ("running", "preempting"):
                j.state, j.substate = "pending", "released"
        elif kind == "requeued":
            j.state = "pending"
            j.substate = "backoff" if rec.get("reason") == "failure" else "queued"
        elif kind == "resized":
            j.nodes = int(rec.get("nodes", j.nodes))
            j.gpus_per_node = int(rec.get("gpus_per_node", j.gpus_per_node))
        elif kind in ("finished", "failed", "cancelled"):
            j.state, j.substate = kind, kind
            if kind == "failed":
                j.failed_reason = str(rec.get("reason", ""))

    def _node_event(self, kind: Any, node: str, t: float, rec: dict[str, Any]) -> None:
        if kind == "node_lost":
            self.node_health[node] = "lost"
            self.node_notice.pop(node, None)
            self.node_down.setdefault(node, []).append([t, math.inf])
        elif kind == "node_reclaim_notice":
            if self.node_health.get(node) != "lost":
                self.node_health[node] = "reclaiming"
            self.node_notice[node] = _num(rec.get("deadline_s"), t)
        elif kind == "node_up":
            self.node_health.pop(node, None)
            self.node_notice.pop(node, None)
            spans = self.node_down.get(node)
            if spans and math.isinf(spans[-1][1]):
                spans[-1][1] = t

    # ------------------------------------------------------------------ summaries

    def ledger(self, now: float, weights: dict[str, float] | None = None) -> dict[str, Any]:
        """GPU-hours by cause for the cluster and per tenant, with each tenant's entitlement."""
        causes = ("useful", "lost_preemption", "lost_failure", "draining", "at_risk")
        total = dict.fromkeys(("allocated", *causes), 0.0)
        tenants: dict[str, dict[str, float]] = {}
        for run in self.runs:
            a = run.account(now)
            acc = tenants.setdefault(run.tenant, dict.fromkeys(("allocated", *causes), 0.0))
            for k, v in a.items():
                total[k] += v / 3600.0
                acc[k] += v / 3600.0
        capacity = self.capacity_gpu_s(self.t0 if math.isfinite(self.t0) else now, now) / 3600.0
        total["idle"] = max(0.0, capacity - total["allocated"])
        names = set(tenants) | {j.tenant for j in self.jobs.values() if j.tenant}
        w = {n: (weights or {}).get(n, 1.0) for n in names}
        wsum = sum(w.values()) or 1.0
        for n in names:
            tenants.setdefault(n, dict.fromkeys(("allocated", *causes), 0.0))["entitled"] = capacity * w[n] / wsum
        return {"capacity_gpu_h": capacity, "total": total, "tenants": tenants}

    def capacity_gpu_s(self, t0: float, t1: float) -> float:
        total = sum(self.capacity.values()) * max(0.0, t1 - t0)
        for node, spans in self.node_down.items():
            g = self.capacity.get(node, 0)
            for a, b in spans:
                lo, hi = max(a, t0), min(b, t1)
                if hi > lo:
                    total -= g * (hi - lo)
        return max(0.0, total)

    def series(self, now: float, buckets: int = 240) -> dict[str, Any]:
        """Average GPUs per time bucket: capacity, allocated, useful, and goodput (useful / allocated)."""
        t0 = self.t0 if math.isfinite(self.t0) else now
        t1 = max(now, t0 + 1.0)
        n = max(1, buckets)
        width = (t1 - t0) / n
        cap = [0.0] * n
        alloc = [0.0] * n
        useful = [0.0] * n

        def spread(arr: list[float], a: float, b: float, amount: float) -> None:
            a, b = max(a, t0), min(b, t1)
            if b <= a or amount == 0:
                if b == a and t0 <= a < t1 and amount:
                    arr[min(n - 1, int((a - t0) / width))] += amount
                return
            rate = amount / (b - a)
            i = min(n - 1, int((a - t0) / width))
            while i < n:
                lo, hi = t0 + i * width, t0 + (i + 1) * width
                ov = min(hi, b) - max(lo, a)
                if ov > 0:
                    arr[i] += rate * ov
                if hi >= b:
                    break
                i += 1

        total_gpus = sum(self.capacity.values())
        for i in range(n):
            cap[i] = total_gpus * width
        for node, spans in self.node_down.items():
            g = self.capacity.get(node, 0)
            for a, b in spans:
                spread(cap, a, min(b, t1), -g * (min(b, t1) - max(a, t0)) if min(b, t1) > max(a, t0) else 0.0)
        for run in self.runs:
            end = run.release_t if run.release_t is not None else now
            spread(alloc, run.start, end, run.gpus * max(0.0, end - run.start))
            for a, b, amount in run.useful_segments(now):
                spread(useful, a, b, amount)
        ts = [t0 + (i + 0.5) * width for i in range(n)]
        to_gpus = [1.0 / width] * n
        a_g = [x * k for x, k in zip(alloc, to_gpus)]
        u_g = [min(x * k, y) for x, k, y in zip(useful, to_gpus, a_g)]
        return {
            "t": ts,
            "width_s": width,
            "capacity": [max(0.0, x * k) for x, k in zip(cap, to_gpus)],
            "allocated": a_g,
            "useful": u_g,
            "goodput": [u / a if a > 1e-9 else None for u, a in zip(u_g, a_g)],
        }


__all__ = ["JobInfo", "Preemption", "Run", "Timeline"]
