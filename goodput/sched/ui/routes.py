"""The dashboard's routes on the live service: the page at ``/ui``, its files, and the JSON it reads.

The page and its files carry no data and need no token; the JSON needs the same bearer token as
the API (the service's own dependency decides who the caller is), and is cut to what that caller
may see before it leaves the server (:mod:`.views`). The scheduler's state is copied under the
service's lock, as its endpoints do, and everything slow (the event replay, the views, reading a
job's log file) happens outside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

from ..model import JobState
from . import page
from .timeline import Timeline
from .views import JobFacts, LiveState, NodeFacts, Viewer, job_page, live_overview

LOG_TAIL_BYTES = 16_384
SHARED_FOR_S = 1.0  # the series and the ledger are recomputed at most this often (every viewer polls)
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
}


class LiveFeed:
    """The service's event log, replayed incrementally: each request feeds the records appended since."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.lock = threading.Lock()  # the timeline's own: never held while taking the service's lock
        self.timeline: Timeline | None = None
        self.cursor = 0
        self._records: Any = None  # the scheduler's log list the cursor counts in
        self._shared: tuple[float, int, tuple[dict[str, Any], dict[str, Any]]] | None = None

    def snapshot(self) -> tuple[LiveState, list[dict[str, Any]]]:
        svc = self.svc
        with svc.lock:
            sched = svc.sched
            now = sched.clock.now()
            nodes = [
                NodeFacts(
                    name=n.name,
                    pool=n.pool,
                    kind=n.kind.value,
                    gpus=n.gpus,
                    health=n.health.value,
                    alloc=dict(n.alloc),
                )
                for n in sched.cap.nodes.values()
            ]
            jobs = []
            for j in sched.jobs.values():
                if j.state not in (JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING):
                    continue
                fast = svc.last_fast_commit.get(j.id) if hasattr(svc, "last_fast_commit") else None
                durable = svc.last_commit.get(j.id)
                tier = _tier(durable, fast, j.epoch)
                jobs.append(
                    JobFacts(
                        id=j.id,
                        name=j.name or j.id,
                        tenant=j.tenant,
                        state=j.state.value,
                        substate=j.substate,
                        priority=j.priority,
                        nodes=j.nodes,
                        gpus_per_node=j.gpus_per_node,
                        spot=j.spot,
                        submit_s=j.submit_s,
                        seq=j.seq,
                        eligible_s=j.eligible_s,
                        epoch=j.epoch,
                        pool=j.pool,
                        placement=tuple(j.placement),
                        started_s=j.started_s,
                        run_limit_s=j.run_limit_s,
                        committed_s=j.committed_s,
                        committed_at=j.committed_at,
                        interval_s=j.ckpt.interval_s,
                        write_s=j.ckpt.write_s,
                        deadline_s=j.deadline_s,
                        victim_of=j.victim_of,
                        claim=tuple(j.claim),
                        tier=tier,
                    )
                )
            summary = sched.summary()
            res = summary.get("reservation")
            tenants = {t.name: (float(t.weight), int(t.quota_gpus), int(t.usage_gpus)) for t in sched.tenants.values()}
            records = sched.log.records
            n = len(records)
            if records is not self._records or n < self.cursor:
                # another log (the service rebuilt its scheduler from the store): replay it from the start
                self._records = records
                self.cursor = 0
                self.timeline = None
                self._shared = None
            new = list(records[self.cursor : n])
            self.cursor = n
            counts = dict(summary.get("jobs", {}))
            counts.update(
                gpus=int(summary.get("gpus", 0)),
                gpus_bound=int(summary.get("gpus_bound", 0)),
                gpus_draining=int(summary.get("gpus_draining", 0)),
                nodes_lost=int(summary.get("nodes_lost", 0)),
            )
        return LiveState(now=now, nodes=nodes, jobs=jobs, counts=counts, reservation=res, tenants=tenants), new

    def overview(self, viewer: Viewer) -> dict[str, Any]:
        with self.lock:
            st, new = self.snapshot()
            if self.timeline is None:
                self.timeline = Timeline({n.name: n.gpus for n in st.nodes}, {n.pool: n.kind for n in st.nodes})
            self.timeline.feed(new)
            for n in st.nodes:
                if n.health != "up":
                    n.notice_s = self.timeline.node_notice.get(n.name)
            tl = self.timeline
            hit = self._shared
            if hit is None or hit[1] != tl.count or not 0 <= st.now - hit[0] < SHARED_FOR_S:
                weights = {name: w for name, (w, _q, _u) in st.tenants.items()}
                hit = self._shared = (st.now, tl.count, (tl.series(st.now), tl.ledger(st.now, weights)))
            out = live_overview(st, tl, viewer, hit[2])
            # the service's store refused and memory could not be rebuilt: what is shown may be stale
            out["degraded"] = str(getattr(self.svc, "degraded", "") or "") or None
            return out

    def job(self, viewer: Viewer, job_id: str, extra: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            st, new = self.snapshot()
            if self.timeline is None:
                self.timeline = Timeline({n.name: n.gpus for n in st.nodes}, {n.pool: n.kind for n in st.nodes})
            self.timeline.feed(new)
            info = self.timeline.jobs.get(job_id)
            if info is None:
                raise HTTPException(404, f"no job {job_id!r}")
            owner = {jid: x.tenant for jid, x in self.timeline.jobs.items()}
            return job_page(info, self.timeline, st.now, extra, viewer, owner)


def _tier(durable: Any, fast: Any, epoch: int) -> str:
    """The tier of the run's newest accepted commit: fast when a fast report is ahead of the durable one."""
    d = durable if isinstance(durable, dict) and durable.get("epoch") == epoch else None
    f = fast if isinstance(fast, dict) and fast.get("epoch") == epoch else None
    if f is not None and (d is None or float(f.get("progress_s", 0.0)) > float(d.get("progress_s", 0.0))):
        return "fast"
    return "durable" if d is not None else ""


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - LOG_TAIL_BYTES))
        data = f.read(LOG_TAIL_BYTES)
    text = data.decode("utf-8", errors="replace")
    return text if size <= LOG_TAIL_BYTES else text.split("\n", 1)[-1]


def router(svc: Any, person: Callable[..., Any]) -> APIRouter:
    """The dashboard's routes for ``svc``; ``person`` is the service's dependency that authenticates a
    tenant or admin token (and refuses job tokens)."""
    r = APIRouter(include_in_schema=False)
    feed = LiveFeed(svc)

    def viewer_of(c: Any) -> Viewer:
        return Viewer(tenant=c.tenant, admin=c.role == "admin")

    @r.get("/ui", response_class=HTMLResponse)
    def ui_page() -> HTMLResponse:
        return HTMLResponse(page.live_html(), headers=page.SECURITY_HEADERS)

    @r.get("/ui/static/{name}")
    def ui_static(name: str) -> Response:
        body = page.static_file(name)
        if body is None:
            raise HTTPException(404, f"no file {name!r}")
        return Response(body, media_type=_TYPES.get(Path(name).suffix, "application/octet-stream"))

    @r.get("/ui/api/overview")
    def ui_overview(c: Any = Depends(person)) -> JSONResponse:
        return JSONResponse(feed.overview(viewer_of(c)), headers={"Cache-Control": "no-store"})

    @r.get("/ui/api/jobs/{job_id}")
    def ui_job(job_id: str, c: Any = Depends(person)) -> JSONResponse:
        with svc.lock:
            job = svc.own_job(c, job_id)  # 404 for another tenant's job: its existence is not disclosed
            reports = {
                "last_report": svc.last_commit.get(job.id),
                "last_fast_report": getattr(svc, "last_fast_commit", {}).get(job.id),
            }
            extra = {
                "name": job.name or job.id,
                "state": job.state.value,
                "substate": job.substate,
                "epoch": job.epoch,
                "restarts": max(0, job.epoch - 1),
                "preemptions": job.preemptions,
                "infra_losses": job.infra_losses,
                "failures": job.failures,
                "limit_s": job.limit_s,
                "interval_s": job.ckpt.interval_s,
                "committed_s": job.committed_s,
                "committed_at": job.committed_at if job.committed_at >= 0 else None,
                "reports": reports,
            }
            jid, epoch = job.id, job.epoch
        # the log is read outside the lock; only for a caller own_job let through (its tenant, or admin)
        logs = Path(svc.state_dir) / "logs"
        log = None
        for e in range(epoch, 0, -1):
            p = logs / f"{jid}.{e}.log"
            try:
                log = {"epoch": e, "tail": _tail(p), "bytes_max": LOG_TAIL_BYTES}
                break
            except FileNotFoundError:
                continue
            except OSError as err:
                log = {"epoch": e, "tail": "", "error": f"cannot read {p.name}: {err.strerror}"}
                break
        extra["log"] = log
        return JSONResponse(feed.job(viewer_of(c), jid, extra), headers={"Cache-Control": "no-store"})

    return r


__all__ = ["LiveFeed", "router"]
