"""The dashboard's routes on the live service: the page at ``/ui``, its files, and the JSON it reads.

The page and its files carry no data and need no token; the JSON needs the same bearer token as
the API (the service's own dependency decides who the caller is), and is cut to what that caller
may see before it leaves the server (:mod:`.views`). The scheduler's state is copied under the
service's lock, as its endpoints do, and everything slow (the event replay, the views, reading a
job's log file) happens outside it.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute

from ..core.model import JobState
from . import page
from .timeline import JobInfo, Timeline
from .views import QUEUE_SHOWN, JobFacts, LiveState, NodeFacts, Viewer, job_page, live_overview, queue_index

LOG_TAIL_BYTES = 16_384
SHARED_FOR_S = 1.0  # the series and the ledger are recomputed at most this often (every viewer polls)
# the dashboard's work runs on threads of its own, never more than this many at once: however many
# tabs poll (or one tenant's burst of requests), the service's own worker threads stay free for the API
UI_THREADS = 2
UI_WAITING_MAX = 64  # requests waiting for one of those threads beyond this are refused (503)
BUSY_WAIT_S = 10.0  # a request that cannot take the feed's lock in this long is refused (503)
RETRY_AFTER_S = 2
DEGRADED_FOR_TENANTS = "the scheduler's store cannot be read now; what is shown may be stale"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
}


def _facts(svc: Any, j: Any) -> JobFacts:
    """What the overview shows of one job (the service's lock held)."""
    fast = getattr(svc, "last_fast_commit", {}).get(j.id)
    return JobFacts(
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
        tier=_tier(svc.last_commit.get(j.id), fast, j.epoch),
    )


class LiveFeed:
    """The service's state and event log as the dashboard reads them.

    The service's lock is held only to copy: the nodes, the running jobs, the queue's order as
    (key, id, tenant) tuples (not every pending job's facts: with 100,000 queued that copy alone held
    the lock for over a second), the counts, and the log's new records; that copy is shared by every
    viewer for ``SHARED_FOR_S``, or ten times as long as it held the lock when that was longer. The facts of the pending jobs a viewer is shown (at most ``QUEUE_SHOWN``)
    are copied in a second short hold. Replay, sorting and views run outside it."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        # the feed's own lock: taken before the service's, never while holding it
        self.lock = threading.Lock()
        self.timeline: Timeline | None = None
        self.cursor = 0
        self._records: Any = None  # the scheduler's log list the cursor counts in
        self._base: tuple[float, LiveState, list[tuple[str, str]]] | None = None
        self._keep_s = SHARED_FOR_S
        self._shared: tuple[float, int, tuple[dict[str, Any], dict[str, Any]]] | None = None

    def _copy(self) -> tuple[LiveState, list[tuple[Any, ...]], list[dict[str, Any]]]:
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
            draining = sum(n.draining for n in sched.cap.nodes.values())
            running: list[JobFacts] = []
            keys: list[tuple[Any, ...]] = []
            by_state: dict[JobState, int] = dict.fromkeys(JobState, 0)
            pending, active = JobState.PENDING, (JobState.RUNNING, JobState.PREEMPTING)
            for j in sched.jobs.values():  # one pass: the queue's order, the running jobs, the counts
                state = j.state
                by_state[state] += 1
                if state is pending:
                    keys.append((-j.priority, j.submit_s, j.seq, j.id, j.tenant))
                elif state in active:
                    running.append(_facts(svc, j))
            r = sched.reservation
            reservation = None
            if r is not None:  # its tenant decides who may see whose it is (never sent to the page)
                held = sched.jobs.get(r.job)
                reservation = {"job": r.job, "pool": r.pool, "t": r.t, "tenant": held.tenant if held else ""}
            tenants = {t.name: (float(t.weight), int(t.quota_gpus), int(t.usage_gpus)) for t in sched.tenants.values()}
            records = sched.log.records
            # the cursor counts records since the list began: the service's event retention deletes its
            # head (log_base records so far), so the list's index is the cursor less that
            base = getattr(svc, "log_base", 0)
            n = len(records)
            if records is not self._records or base + n < self.cursor or self.cursor < base:
                # another log (the service rebuilt its scheduler from the store), or records deleted
                # before the feed read them (no viewer while the retention deleted past its place):
                # replay the log as kept from its start, never a timeline with records skipped
                self._records = records
                self.cursor = base
                self.timeline = None
                self._shared = None
            new = list(records[max(0, self.cursor - base) : n])
            self.cursor = base + n
        counts = {state.value: c for state, c in by_state.items()}
        up = [n for n in nodes if n.health != "lost"]
        counts.update(
            gpus=sum(n.gpus for n in up),
            gpus_bound=sum(sum(n.alloc.values()) for n in nodes),
            gpus_draining=draining,
            nodes_lost=len(nodes) - len(up),
        )
        st = LiveState(now=now, nodes=nodes, jobs=running, counts=counts, reservation=reservation, tenants=tenants)
        return st, keys, new

    def _state(self) -> tuple[LiveState, list[tuple[str, str]]]:
        """The shared copy (at most ``SHARED_FOR_S`` old), the timeline fed up to it; the feed's lock held."""
        base = self._base
        if base is not None and 0 <= time.monotonic() - base[0] < self._keep_s and self.timeline is not None:
            return base[1], base[2]
        t0 = time.monotonic()
        st, keys, new = self._copy()
        # a copy that held the lock long (a very long queue) is kept longer: at most a tenth of the time
        self._keep_s = max(SHARED_FOR_S, 10.0 * (time.monotonic() - t0))
        keys.sort()
        order = [(k[3], k[4]) for k in keys]
        st.order, st.index = order, queue_index(order)
        if self.timeline is None:
            self.timeline = Timeline({n.name: n.gpus for n in st.nodes}, {n.pool: n.kind for n in st.nodes})
        self.timeline.feed(new)
        for n in st.nodes:
            if n.health != "up":
                n.notice_s = self.timeline.node_notice.get(n.name)
        self._base = (time.monotonic(), st, order)
        return st, order

    def _locked(self) -> Any:
        """The feed's lock, or a 503 when another request has held it for ``BUSY_WAIT_S`` (a replay of
        a long log after a restart): a request waits a bounded time, never for ever."""
        if not self.lock.acquire(timeout=BUSY_WAIT_S):
            raise HTTPException(503, "the dashboard is busy; retry", headers={"Retry-After": str(RETRY_AFTER_S)})
        return _Held(self.lock)

    def overview(self, viewer: Viewer) -> dict[str, Any]:
        with self._locked():
            base, order = self._state()
            res = base.reservation
            if viewer.admin:
                wanted = [jid for jid, _t in order[:QUEUE_SHOWN]]
            else:
                wanted = [jid for _p, jid in (base.index or {}).get(viewer.tenant, [])[:QUEUE_SHOWN]]
            if res is not None and viewer.sees(str(res.get("tenant", ""))):
                wanted.append(str(res["job"]))
            svc = self.svc
            with svc.lock:  # the second short hold: the facts of the pending jobs this viewer is shown
                shown = [_facts(svc, j) for j in (svc.sched.jobs.get(i) for i in wanted) if j is not None]
            shown = [j for j in shown if j.state == "pending"]
            st = LiveState(
                now=base.now,
                nodes=base.nodes,
                jobs=base.jobs + shown,
                counts=base.counts,
                reservation=res,
                tenants=base.tenants,
                order=order,
                index=base.index,
            )
            tl = self.timeline
            assert tl is not None
            hit = self._shared
            if hit is None or hit[1] != tl.count or not 0 <= st.now - hit[0] < SHARED_FOR_S:
                weights = {name: w for name, (w, _q, _u) in st.tenants.items()}
                hit = self._shared = (st.now, tl.count, (tl.series(st.now), tl.ledger(st.now, weights)))
            out = live_overview(st, tl, viewer, hit[2])
            # the service's store refused and memory could not be rebuilt: what is shown may be stale.
            # Its reason is the store's own error (a database's host, user, a row's content): admins only
            why = str(getattr(self.svc, "degraded", "") or "")
            out["degraded"] = (why if viewer.admin else DEGRADED_FOR_TENANTS) if why else None
            return out

    def job(self, viewer: Viewer, job_id: str, extra: dict[str, Any]) -> dict[str, Any]:
        with self._locked():
            st, _order = self._state()
            tl = self.timeline
            assert tl is not None
            info = tl.jobs.get(job_id)
            if info is None:
                # the service knows it (own_job let it through) but the replay has forgotten it: an ended
                # job older than the newest JOBS_ENDED_KEPT. Its facts, without its log's history
                info = JobInfo(job_id, tenant=str(extra.get("tenant", "")))
                extra = {**extra, "forgotten": True}
            return job_page(info, tl, st.now, extra, viewer, tl.owner)


class _Held:
    """A lock already acquired, released on leaving the ``with``."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _tier(durable: Any, fast: Any, epoch: int) -> str:
    """The tier of the run's newest accepted commit: fast when a fast report is ahead of the durable one."""
    d = durable if isinstance(durable, dict) and durable.get("epoch") == epoch else None
    f = fast if isinstance(fast, dict) and fast.get("epoch") == epoch else None
    if f is not None and (d is None or float(f.get("progress_s", 0.0)) > float(d.get("progress_s", 0.0))):
        return "fast"
    return "durable" if d is not None else ""


def _tail(path: Path) -> str:
    """The last ``LOG_TAIL_BYTES`` of a job's log: a regular file only, its last component never a
    link (a link or a FIFO where a log should be is an error, not someone else's file or a hang)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        size = os.fstat(fd).st_size
        f.seek(max(0, size - LOG_TAIL_BYTES))
        data = f.read(LOG_TAIL_BYTES)
    text = data.decode("utf-8", errors="replace")
    return text if size <= LOG_TAIL_BYTES else text.split("\n", 1)[-1]


class _Guarded(APIRoute):
    """A /ui route whose every answer, an error (401, 404, 503) included, carries the dashboard's
    security headers (:data:`.page.SECURITY_HEADERS` for the page, :data:`.page.DATA_HEADERS` for the
    JSON and the files)."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        inner = super().get_route_handler()
        headers = page.SECURITY_HEADERS if self.path == "/ui" else page.DATA_HEADERS

        async def handler(request: Request) -> Response:
            try:
                resp = await inner(request)
            except HTTPException as e:
                e.headers = {**headers, **(e.headers or {})}
                raise
            for k, v in headers.items():
                resp.headers.setdefault(k, v)
            return resp

        return handler


class _Worker:
    """Runs the dashboard's blocking work on at most ``UI_THREADS`` threads of its own (made on first
    use: a limiter belongs to the running event loop)."""

    def __init__(self) -> None:
        self.limiter: anyio.CapacityLimiter | None = None

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.limiter is None:
            self.limiter = anyio.CapacityLimiter(UI_THREADS)
        if self.limiter.statistics().tasks_waiting >= UI_WAITING_MAX:
            raise HTTPException(503, "the dashboard is busy; retry", headers={"Retry-After": str(RETRY_AFTER_S)})
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)


def router(svc: Any, person: Callable[..., Any]) -> APIRouter:
    """The dashboard's routes for ``svc``; ``person`` is the service's dependency that authenticates a
    tenant or admin token (and refuses job tokens)."""
    r = APIRouter(include_in_schema=False, route_class=_Guarded)
    feed = LiveFeed(svc)
    work = _Worker()

    def viewer_of(c: Any) -> Viewer:
        return Viewer(tenant=c.tenant, admin=c.role == "admin")

    @r.get("/ui", response_class=HTMLResponse)
    async def ui_page() -> HTMLResponse:
        return HTMLResponse(page.live_html())

    @r.get("/ui/static/{name}")
    async def ui_static(name: str) -> Response:
        body = page.static_file(name)
        if body is None:
            raise HTTPException(404, "no such file")
        return Response(body, media_type=_TYPES.get(Path(name).suffix, "application/octet-stream"))

    # encoded on the dashboard's thread too (an admin's overview of a large cluster is not small), with
    # non-finite numbers as null: JSON has no infinity, and one job's must not make the page a 500
    @r.get("/ui/api/overview")
    async def ui_overview(c: Any = Depends(person)) -> Response:
        body = await work(lambda v: page.to_json(feed.overview(v)).encode(), viewer_of(c))
        return Response(body, media_type="application/json")

    @r.get("/ui/api/jobs/{job_id}")
    async def ui_job(job_id: str, c: Any = Depends(person)) -> Response:
        body = await work(lambda: page.to_json(_job_page(job_id, c)).encode())
        return Response(body, media_type="application/json")

    def _job_page(job_id: str, c: Any) -> dict[str, Any]:
        with svc.lock:
            job = svc.own_job(c, job_id)  # 404 for another tenant's job: its existence is not disclosed
            reports = {
                "last_report": svc.last_commit.get(job.id),
                "last_fast_report": getattr(svc, "last_fast_commit", {}).get(job.id),
            }
            extra = {
                "name": job.name or job.id,
                "tenant": job.tenant,
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
        return feed.job(viewer_of(c), jid, extra)

    svc.ui_feed = feed  # the service's dashboard feed, for tools and tests (the service does not use it)
    return r


__all__ = ["LiveFeed", "router"]
