"""The JSON the dashboard's page reads: one overview and one job page, for a live service or a log.

What a viewer may see is decided here, on the server, not in the browser: a tenant gets its own
jobs' details and the cluster's shape (every GPU's state, anonymous where another tenant's job holds
it), counts of the rest, and cluster-wide aggregates; never another tenant's job ids (which carry the
job's name), tenant names or logs. An admin (and the static report, written by whoever holds the
log) sees everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .timeline import PRIORITY_VICTIM_OF, JobInfo, Preemption, Timeline

OTHER = "(another tenant)"
PREEMPTIONS_SHOWN = 200
QUEUE_SHOWN = 500  # pending jobs listed (the rest are counted, "more")
STATIC_JOB_PAGES = 400  # job pages embedded in a static report (preempted and running ones first)
# a job's page lists at most this many of its newest records, runs and checkpoints: a job that posts
# commit reports for weeks must not make its page (built under the dashboard's lock) megabytes long
HISTORY_SHOWN = 500
RUNS_SHOWN = 200
CHECKPOINTS_SHOWN = 200
LEDGER_NOTE = (
    "from the event log: restart from each run's start to its resume being done and checkpoint stall as its"
    " jobs' commit reports say; a run whose reports do not say (an older job, or one that ended before its first"
    " commit) has its restart in 'unattributed' and its stalls inside 'useful'"
)


@dataclass(frozen=True, slots=True)
class Viewer:
    tenant: str
    admin: bool

    def sees(self, tenant: str) -> bool:
        return self.admin or tenant == self.tenant


@dataclass(slots=True)
class JobFacts:
    """What the live overview needs of one unfinished job, copied under the service's lock."""

    id: str
    name: str
    tenant: str
    state: str
    substate: str
    priority: int
    nodes: int
    gpus_per_node: int
    spot: bool
    submit_s: float
    seq: int
    eligible_s: float
    epoch: int
    pool: str
    placement: tuple[str, ...]
    started_s: float
    run_limit_s: float
    committed_s: float
    committed_at: float
    interval_s: float
    write_s: float
    deadline_s: float
    victim_of: str
    claim: tuple[str, ...]
    tier: str  # of its newest accepted commit report: fast | durable | "" (none this run)


@dataclass(slots=True)
class NodeFacts:
    name: str
    pool: str
    kind: str
    gpus: int
    health: str
    alloc: dict[str, int]
    notice_s: float | None = None


@dataclass(slots=True)
class LiveState:
    """A copy of the scheduler's state taken under its lock; everything else is built outside it."""

    now: float
    nodes: list[NodeFacts]
    jobs: list[JobFacts]
    counts: dict[str, int]
    reservation: dict[str, Any] | None
    tenants: dict[str, tuple[float, int, int]]  # name -> (weight, quota GPUs, GPUs held)
    # (id, tenant) of every pending job in queue order; ``jobs`` then holds the facts of only those shown
    order: list[tuple[str, str]] | None = None
    index: dict[str, list[tuple[int, str]]] | None = None  # queue_index(order), computed once per copy


def shown_ref(ref: str, viewer: Viewer | None, owner: Any) -> str:
    """A record's reference to a job (``victim_of``, ``preemptor``) as ``viewer`` may see it: a cluster
    event's word (reclaim, drain, ...) or a job of the viewer's own tenant as it is; any other job,
    including one whose owner is not known here, anonymous (fail closed: an unknown id may be another
    tenant's, and its id carries its name)."""
    if viewer is None or viewer.admin or not ref or ref in PRIORITY_VICTIM_OF:
        return ref
    return ref if viewer.sees(owner.get(ref, "") or "") else OTHER


class Owners:
    """Job -> tenant over several maps, first hit wins (no copy of a 100,000-entry map per request)."""

    def __init__(self, *maps: dict[str, str]) -> None:
        self.maps = maps

    def get(self, jid: str, default: str = "") -> str:
        for m in self.maps:
            t = m.get(jid)
            if t is not None:
                return t
        return default


def queue_index(order: list[tuple[str, str]]) -> dict[str, list[tuple[int, str]]]:
    """Each tenant's pending jobs as (place in the whole queue, id), in queue order."""
    out: dict[str, list[tuple[int, str]]] = {}
    for place, (jid, tenant) in enumerate(order, 1):
        out.setdefault(tenant, []).append((place, jid))
    return out


def _f(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# ---------------------------------------------------------------------- the cluster


def cluster_view(nodes: list[NodeFacts], states: dict[str, str], viewer: Viewer, owner: dict[str, str]) -> dict:
    """Nodes with their GPUs as segments: who holds how many (anonymous if not the viewer's), draining or not."""
    out = []
    pools: dict[str, str] = {}
    for n in nodes:
        pools.setdefault(n.pool, n.kind)
        segs = []
        anonymous: dict[str, int] = {}
        used = 0
        for jid, g in sorted(n.alloc.items()):
            used += g
            st = "draining" if states.get(jid) == "preempting" else "busy"
            if viewer.sees(owner.get(jid, "")):
                segs.append({"job": jid, "gpus": g, "state": st})
            else:  # merged per state, after the viewer's own: neither their number nor their ids' order shows
                anonymous[st] = anonymous.get(st, 0) + g
        segs += [{"job": None, "gpus": anonymous[st], "state": st} for st in ("busy", "draining") if st in anonymous]
        out.append(
            {
                "name": n.name,
                "pool": n.pool,
                "kind": n.kind,
                "gpus": n.gpus,
                "health": n.health,
                "notice_s": _f(n.notice_s),
                "used": used,
                "segments": segs,
            }
        )
    return {"pools": [{"name": p, "kind": k} for p, k in pools.items()], "nodes": out}


# ---------------------------------------------------------------------- preemptions


def preemption_view(p: Preemption, viewer: Viewer, owner: Any) -> dict[str, Any] | None:
    if p.preemptor and p.preemptor_tenant:  # the preemptor's owner as submitted, even once it is forgotten
        owner = Owners(owner, {p.preemptor: p.preemptor_tenant})
    victim_mine = viewer.sees(p.tenant)
    pre_mine = bool(p.preemptor) and viewer.sees(owner.get(p.preemptor, ""))
    if not (victim_mine or pre_mine):
        return None
    return {
        "t": p.t,
        "job": p.job if victim_mine else None,
        "tenant": p.tenant if victim_mine else None,
        "epoch": p.epoch,
        "reason": p.reason,
        "victim_of": shown_ref(p.victim_of, viewer, owner) if (not p.preemptor or pre_mine) else None,
        "preemptor": (p.preemptor if pre_mine else OTHER) if p.preemptor else None,
        "checkpoint": p.checkpoint,
        "deadline_s": _f(p.deadline_s),
        "gpus": p.gpus,
        "expected_loss_gpu_s": p.lost_s * p.gpus,
        "lost_s": p.lost_s,
        "realized_loss_gpu_s": p.realized_gpu_s,
        "candidates": [
            {
                "job": c.get("job") if viewer.sees(owner.get(str(c.get("job")), "")) else None,
                "lost_gpu_s": c.get("lost_gpu_s"),
                "lost_s": c.get("lost_s"),
                "checkpoint": c.get("checkpoint"),
                "chosen": c.get("job") == p.job,
            }
            for c in p.candidates
        ],
    }


def preemptions_view(tl: Timeline, viewer: Viewer, owner: dict[str, str]) -> dict[str, Any]:
    """The newest ``PREEMPTIONS_SHOWN`` preemptions the viewer may see, and how many it may see: an
    admin's of every preemption, a tenant's of those of its own jobs (the timeline's index, so a poll
    costs what it shows, not the length of the cluster's history)."""
    if viewer.admin:
        kept, total = tl.preemptions, tl.preemptions_total
    else:
        kept, total = tl.preemptions_of.get(viewer.tenant, ()), tl.preemptions_of_total.get(viewer.tenant, 0)
    shown: list[dict[str, Any]] = []
    for p in reversed(kept):
        if len(shown) >= PREEMPTIONS_SHOWN:
            break
        v = preemption_view(p, viewer, owner)
        if v is None:
            total -= 1
            continue
        shown.append(v)
    return {"items": shown, "total": total}


# ---------------------------------------------------------------------- ledger


def ledger_view(
    tl: Timeline, now: float, viewer: Viewer, weights: dict[str, float] | None, led: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ledger cut for ``viewer`` (``led``: ``tl.ledger(now, weights)`` already computed)."""
    led = led if led is not None else tl.ledger(now, weights)
    tenants = []
    others: dict[str, float] = {}
    for name, acct in sorted(led["tenants"].items()):
        if viewer.sees(name):
            tenants.append({"tenant": name, **acct})
        else:
            for k, v in acct.items():
                others[k] = others.get(k, 0.0) + v
    if others:
        tenants.append({"tenant": "other tenants", **others})
    return {
        "capacity_gpu_h": led["capacity_gpu_h"],
        "total": led["total"],
        "tenants": tenants,
        "untimed_gpu_h": led.get("untimed_gpu_h", 0.0),
        "exact": None,
    }


# ---------------------------------------------------------------------- job pages


JOB_REFS = ("victim_of", "preemptor")  # keys of a job's own records that may name another job


def _redact(rec: dict[str, Any], viewer: Viewer | None, owner: dict[str, str]) -> dict[str, Any]:
    """A record of the viewer's job without the candidates, and without another tenant's job ids."""
    out = {k: v for k, v in rec.items() if k != "candidates"}
    if viewer is not None and not viewer.admin:
        for k in JOB_REFS:
            v = out.get(k)
            if v is not None:
                out[k] = shown_ref(v, viewer, owner) if isinstance(v, str) else OTHER
    return out


def job_page(
    j: JobInfo,
    tl: Timeline,
    now: float,
    extra: dict[str, Any] | None = None,
    viewer: Viewer | None = None,
    owner: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A job's page from the log: state history, runs with their commits and ends, its preemptions.
    For a tenant ``viewer`` (its own job), another tenant's job named in a record is anonymous."""
    owner = owner if owner is not None else tl.owner
    runs = []
    for r in list(j.runs)[-RUNS_SHOWN:]:
        runs.append(
            {
                "epoch": r.epoch,
                "pool": r.pool,
                "nodes": list(r.nodes),
                "gpus": r.gpus,
                "start": r.start,
                "resume_from_s": r.resume_from,
                "commits": r.commits,
                "last_commit_t": r.last_commit[0] if r.last_commit else None,
                "ready_t": r.ready_t,
                "committed_s": r.committed(),
                "preempt_t": r.preempt_t,
                "exit_t": r.exit_t,
                "status": r.status or ("running" if r.exit_t is None else ""),
                "release_t": r.release_t,
                "account_gpu_s": r.account(now),
            }
        )
    history = [_redact(rec, viewer, owner) for rec in list(j.records)[-HISTORY_SHOWN:]]
    out: dict[str, Any] = {
        "id": j.id,
        "name": j.id.rsplit(".", 1)[0] if "." in j.id else j.id,
        "tenant": j.tenant,
        "state": j.state,
        "substate": j.substate,
        "priority": j.priority,
        "nodes": j.nodes,
        "gpus_per_node": j.gpus_per_node,
        "submit_s": j.submit_s,
        "limit_s": j.limit_s,
        "epoch": j.runs_total,
        "restarts": max(0, j.runs_total - 1),
        "failed_reason": j.failed_reason or None,
        "history": history,
        "history_total": j.records_total,
        "runs": runs,
        "runs_total": j.runs_total,
        "checkpoints": list(j.checkpoints)[-CHECKPOINTS_SHOWN:],
        "checkpoints_total": j.checkpoints_total,
        "commits_rejected": j.rejected,
        "reports": None,
        "log": None,
    }
    if extra:
        out.update(extra)
    return out


# ---------------------------------------------------------------------- the live overview


def why_waits(j: JobFacts, st: LiveState, free_fit: dict[tuple[str, int], int], pool_kind: dict[str, str]):
    """(reason, detail) for a pending job: backoff, awaiting victims, quota, reservation or no fit."""
    if j.substate == "backoff" or j.eligible_s > st.now:
        return "backoff", f"after its failure, eligible at {j.eligible_s:.0f}"
    if j.claim:
        return "awaiting victims", f"its nodes are claimed; {len(j.claim)} node(s) wait for preempted jobs to leave"
    w = st.tenants.get(j.tenant)
    if w is not None and w[1] > 0 and w[2] + j.nodes * j.gpus_per_node > w[1]:
        return "quota", f"its tenant holds {w[2]} of {w[1]} GPUs"
    res = st.reservation
    if res is not None and res.get("job") == j.id:
        return "reservation", "the head: nodes are reserved for it"
    fits = any(
        cnt >= j.nodes
        for (pool, g), cnt in free_fit.items()
        if g >= j.gpus_per_node and (j.spot or pool_kind.get(pool) != "spot")
    )
    if fits and res is not None:
        return "reservation", "it would fit, but starting it could delay the head's reservation"
    if fits:
        return "next pass", "it fits now: the next scheduling pass starts it"
    return "no fit", f"no pool has {j.nodes} node(s) with {j.gpus_per_node} free GPU(s)"


def live_overview(
    st: LiveState, tl: Timeline, viewer: Viewer, shared: tuple[dict[str, Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The overview for ``viewer``; ``shared`` is (series, ledger) of ``tl`` when computed for another
    viewer moments ago (both are the same for every viewer before the ledger's per-tenant cut)."""
    now = st.now
    owner = Owners({j.id: j.tenant for j in st.jobs}, tl.owner)
    states = {j.id: j.state for j in st.jobs}
    pool_kind = {n.pool: n.kind for n in st.nodes}
    # free-GPU counts per (pool, GPUs free) over nodes that take new work, for "why it waits"
    free_by: dict[tuple[str, int], int] = {}
    for n in st.nodes:
        if n.health == "up":
            free = n.gpus - sum(n.alloc.values())
            if free > 0:
                free_by[(n.pool, free)] = free_by.get((n.pool, free), 0) + 1
    free_fit: dict[tuple[str, int], int] = {}
    for (pool, free), cnt in free_by.items():  # nodes with at least g free, per g
        for (p2, g2), _ in free_by.items():
            if p2 == pool and g2 <= free:
                free_fit[(pool, g2)] = free_fit.get((pool, g2), 0) + cnt

    facts = {j.id: j for j in st.jobs if j.state == "pending"}
    order = st.order
    if order is None:
        order = [(j.id, j.tenant) for j in sorted(facts.values(), key=lambda j: (-j.priority, j.submit_s, j.seq))]
    index = st.index if st.index is not None else queue_index(order)
    if viewer.admin:
        entries = [(place, jid) for place, (jid, _t) in enumerate(order[:QUEUE_SHOWN], 1)]
        visible, others_pending = len(order), 0
    else:
        own = index.get(viewer.tenant, [])
        entries, visible, others_pending = own[:QUEUE_SHOWN], len(own), len(order) - len(own)
    mine_pending = len(index.get(viewer.tenant, []))
    queue: list[dict[str, Any]] = []
    for place, jid in entries:
        j = facts.get(jid)
        if j is None:  # it left the queue between the copies
            continue
        why, detail = why_waits(j, st, free_fit, pool_kind)
        queue.append(
            {
                "id": j.id,
                "name": j.name,
                "tenant": j.tenant,
                "priority": j.priority,
                "place": place,
                "wait_s": max(0.0, now - j.submit_s),
                "why": why,
                "why_detail": detail,
                "nodes": j.nodes,
                "gpus_per_node": j.gpus_per_node,
                "restarts": max(0, j.epoch - 1) if j.epoch else 0,
            }
        )
    res = st.reservation
    reservation = None
    if res is not None:
        vis = viewer.sees(res.get("tenant") or owner.get(str(res.get("job")), ""))
        reservation = {
            "job": res.get("job") if vis else None,
            "pool": res.get("pool"),
            "t": _f(res.get("t")),
            "in_s": _f(res.get("t", math.inf) - now) if res.get("t") is not None else None,
        }

    running, others_running = [], 0
    for j in st.jobs:
        if j.state not in ("running", "preempting"):
            continue
        if not viewer.sees(j.tenant):
            others_running += 1
            continue
        since = max(j.started_s, j.committed_at)
        committed_this_run = j.committed_at >= j.started_s
        age = now - since
        overdue = j.interval_s > 0 and age > j.interval_s + j.write_s
        gpus = j.nodes * j.gpus_per_node
        running.append(
            {
                "id": j.id,
                "name": j.name,
                "tenant": j.tenant,
                "state": j.state,
                "substate": j.substate,
                "priority": j.priority,
                "pool": j.pool,
                "nodes": list(j.placement),
                "gpus": gpus,
                "epoch": j.epoch,
                "started_s": j.started_s,
                "commit_age_s": age,
                "committed_this_run": committed_this_run,
                "interval_s": j.interval_s,
                "overdue": overdue,
                "tier": j.tier or None,
                "at_risk_gpu_s": gpus * max(0.0, age),
                "to_limit_s": j.started_s + j.run_limit_s - now,
                "deadline_s": _f(j.deadline_s),
                "victim_of": shown_ref(j.victim_of, viewer, owner) or None,
            }
        )
    running.sort(key=lambda r: -r["at_risk_gpu_s"])

    weights = {name: w for name, (w, _q, _u) in st.tenants.items()}
    counts = dict(st.counts)
    if not viewer.admin:
        active = [j for j in st.jobs if j.state in ("running", "preempting")]
        counts = {
            "pending_all": len(order),
            "running_all": len(active),
            "pending": mine_pending,
            "running": sum(1 for j in active if j.tenant == viewer.tenant),
        }
    return {
        "mode": "live",
        "clock": "wall",
        "now": now,
        "viewer": {"tenant": viewer.tenant, "admin": viewer.admin},
        "counts": counts,
        "cluster": cluster_view(st.nodes, states, viewer, owner),
        "queue": {"jobs": queue, "others": others_pending, "more": visible - len(queue), "reservation": reservation},
        "running": {"jobs": running, "others": others_running},
        "preemptions": preemptions_view(tl, viewer, owner),
        "series": shared[0] if shared else tl.series(now),
        "ledger": ledger_view(tl, now, viewer, weights, shared[1] if shared else None),
        "ledger_note": LEDGER_NOTE,
    }


# ---------------------------------------------------------------------- the static report


def static_report(
    tl: Timeline,
    *,
    now: float | None = None,
    meta: dict[str, dict[str, Any]] | None = None,
    policies: list[dict[str, Any]] | None = None,
    exact_ledger: dict[str, Any] | None = None,
    title: str = "goodput sched report",
    clock: str = "sim",
    snapshots: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The overview (as an admin sees it) of an event log at its last record, plus embedded job pages.

    ``meta`` adds what the log does not carry per job (``interval_s``, ``limit_s``, ``write_s``);
    ``policies`` and ``exact_ledger`` come from a simulation (the simulator's own books)."""
    meta = meta or {}
    end = now if now is not None else (tl.t1 if math.isfinite(tl.t1) else 0.0)
    viewer = Viewer("", True)
    owner = {jid: j.tenant for jid, j in tl.jobs.items()}
    queue = []
    pend = [j for j in tl.jobs.values() if j.state == "pending"]
    pend.sort(key=lambda j: (-j.priority, j.submit_s))
    res = tl.reservation
    for place, j in enumerate(pend, 1):
        if j.substate == "backoff":
            why, detail = "backoff", "requeued after a failure"
        elif res is not None and res["job"] == j.id:
            why, detail = "reservation", "the head: nodes are reserved for it"
        else:
            why, detail = "not recorded", "the event log does not say why a job waits"
        queue.append(
            {
                "id": j.id,
                "name": j.id,
                "tenant": j.tenant,
                "priority": j.priority,
                "place": place,
                "wait_s": max(0.0, end - j.submit_s),
                "why": why,
                "why_detail": detail,
                "nodes": j.nodes,
                "gpus_per_node": j.gpus_per_node,
                "restarts": max(0, j.runs_total - 1),
            }
        )
    running = []
    for jid, run in tl.active.items():
        j = tl.jobs[jid]
        m = meta.get(jid, {})
        since = run.last_commit[0] if run.last_commit else run.start
        interval = float(m.get("interval_s", 0.0) or 0.0)
        limit = m.get("limit_s", j.limit_s)
        age = end - since
        running.append(
            {
                "id": jid,
                "name": jid,
                "tenant": j.tenant,
                "state": j.state,
                "substate": j.substate,
                "priority": j.priority,
                "pool": run.pool,
                "nodes": list(run.nodes),
                "gpus": run.gpus,
                "epoch": run.epoch,
                "started_s": run.start,
                "commit_age_s": age,
                "committed_this_run": run.commits > 0,
                "interval_s": interval or None,
                "overdue": bool(interval) and age > interval + float(m.get("write_s", 0.0) or 0.0),
                "tier": "durable" if run.commits else None,
                "at_risk_gpu_s": run.gpus * max(0.0, age),
                "to_limit_s": (run.start + float(limit) - run.resume_from - end) if limit else None,
                "deadline_s": None,
                "victim_of": None,
            }
        )
    running.sort(key=lambda r: -r["at_risk_gpu_s"])
    reservation = None
    if res is not None:
        reservation = {"job": res["job"], "pool": res.get("pool"), "t": _f(res["t"]), "in_s": _f(res["t"] - end)}
    # job pages: preempted jobs, running ones, then the most recent others, at most STATIC_JOB_PAGES
    chosen: dict[str, None] = {}
    for p in reversed(tl.preemptions):
        chosen.setdefault(p.job)
        if len(chosen) >= STATIC_JOB_PAGES // 2:
            break
    for jid in list(tl.active)[: STATIC_JOB_PAGES // 4]:
        chosen.setdefault(jid)
    for jid in reversed(list(tl.jobs)):
        if len(chosen) >= STATIC_JOB_PAGES:
            break
        chosen.setdefault(jid)
    pages = {jid: job_page(tl.jobs[jid], tl, end) for jid in chosen if jid in tl.jobs}
    counts = {state: n for state, n in tl.states.items() if n > 0}  # every job the log named, forgotten ones too
    ledger = ledger_view(tl, end, viewer, None)
    ledger["exact"] = exact_ledger
    return {
        "mode": "static",
        "title": title,
        "clock": clock,
        "now": end,
        "viewer": {"tenant": "", "admin": True},
        "counts": counts,
        "records": tl.count,
        "capacity_inferred": tl.inferred,
        "cluster": static_cluster(tl),
        "cluster_at": list(snapshots or []),
        "queue": {
            "jobs": queue[:QUEUE_SHOWN],
            "others": 0,
            "more": max(0, len(queue) - QUEUE_SHOWN),
            "reservation": reservation,
        },
        "running": {"jobs": running[:500], "others": max(0, len(running) - 500)},
        "preemptions": preemptions_view(tl, viewer, owner),
        "series": tl.series(end),
        "ledger": ledger,
        "ledger_note": LEDGER_NOTE + ("; the simulator's exact books are shown beside it" if exact_ledger else ""),
        "policies": policies or [],
        "job_pages": pages,
    }


def static_cluster(tl: Timeline) -> dict[str, Any]:
    """The cluster view (as an admin sees it) of the replay as it stands: at the log's end, or at a
    snapshot taken while the log is fed (the static report's time slider)."""
    nodes = []
    for name in sorted(set(tl.capacity) | set(tl.alloc), key=_node_key):
        pool = name.rsplit("-", 1)[0] if "-" in name else name
        held = tl.alloc.get(name, {})
        nodes.append(
            NodeFacts(
                name=name,
                pool=pool,
                kind=tl.pool_kinds.get(pool, "on-demand"),
                gpus=tl.capacity.get(name, sum(held.values())),
                health=tl.node_health.get(name, "up"),
                alloc=dict(held),
                notice_s=tl.node_notice.get(name),
            )
        )
    states = {jid: tl.jobs[jid].state for n in nodes for jid in n.alloc if jid in tl.jobs}
    owner = {jid: tl.jobs[jid].tenant for jid in states}
    return cluster_view(nodes, states, Viewer("", True), owner)


def _node_key(name: str) -> tuple[str, int, str]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail), name) if tail.isdigit() else (name, 0, name)


__all__ = ["JobFacts", "LiveState", "NodeFacts", "Viewer", "job_page", "live_overview", "static_report"]
