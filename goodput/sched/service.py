"""The live scheduler: an HTTP API (FastAPI) over the same core the simulator drives.

Only the clock (``WallClock``) and the executor (:class:`goodput.sched.local.LocalExecutor`) differ
from the simulator. One lock guards the scheduler: every request, the loop thread (``advance`` +
``tick`` about once a second, at once when something made a pass worth running) and the
executor's exit reports all take it, so the core stays single-threaded as it was written.

Crash safety comes from the core and the executor together: every input is committed to the store
with its records and events in one transaction; on start the service restores from a store that
has records (``Scheduler.restore``), then the executor re-adopts the run records it finds (live
process groups, or exits written by their supervisors while the service was down) and kills any
run the store does not count (a start that never committed), so nothing runs twice.

Authentication: bearer tokens, stored as sha256 hashes only. A tenant token submits and sees its
own jobs (another tenant's job is a 404: its existence is not disclosed); an admin token sees all
and drains nodes; a job token (minted per run, handed to the job in its environment) may only
report commits for its own job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .executor import WallClock
from .local import LocalExecutor
from .model import Checkpointing, Health, Job, JobState, Pool
from .scheduler import Scheduler, SchedulerError
from .store import open_store

log = logging.getLogger("goodput.sched.service")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}\.[0-9a-f]{8}$")
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")  # a submission's idempotency key
CALLER_CACHE = 100_000  # token hashes remembered after their first lookup


class FairLock:
    """A reentrant lock handed to its waiters in arrival order (``threading.RLock`` is not: a thread
    that releases and re-acquires at once, or a lucky waiter, may pass the queue, and the loop thread
    or a request can wait behind many later ones). Same use as an RLock (``with``)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiters: deque[tuple[int, threading.Lock]] = deque()

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None:
                self._owner, self._depth = me, 1
                return True
            gate = threading.Lock()
            gate.acquire()
            self._waiters.append((me, gate))
        gate.acquire()  # released by the owner that hands the lock over to us (owner already set to us)
        return True

    def release(self) -> None:
        with self._mutex:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a lock not held by this thread")
            self._depth -= 1
            if self._depth:
                return
            if self._waiters:
                nxt, gate = self._waiters.popleft()
                self._owner, self._depth = nxt, 1
                gate.release()
            else:
                self._owner = None

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(store: Any, tenant: str, role: str = "tenant", job: str = "") -> str:
    """A fresh random token for ``tenant``; only its hash is stored."""
    if not NAME.match(tenant):
        raise ValueError(f"tenant {tenant!r}: letters, digits, '-' and '_' only (at most 48)")
    tok = f"gp_{secrets.token_urlsafe(32)}"
    store.add_token(digest(tok), tenant, role, job)
    return tok


# ---------------------------------------------------------------------- request bodies


class JobSpec(BaseModel):
    """POST /jobs: the workload file's names where they overlap (docs/SCHED.md)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422 naming it, not silently dropped

    name: str = Field("job", pattern=NAME.pattern)
    command: list[str] = Field(min_length=1)
    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(1, ge=1, le=64)
    priority: int = Field(0, ge=-1000, le=1000)
    limit_s: float = Field(3600.0, gt=0, allow_inf_nan=False)
    ckpt_root: str = Field("", max_length=4096)
    spot: bool = False
    grace_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    ckpt_interval_s: float = Field(60.0, ge=0, allow_inf_nan=False)
    ckpt_write_s: float = Field(1.0, ge=0, allow_inf_nan=False)
    restart_s: float = Field(5.0, ge=0, allow_inf_nan=False)
    max_failures: int = Field(3, ge=0, le=100)
    # the client's idempotency key: a retried POST with the same key (same tenant) answers the first one's id
    key: str | None = Field(None, pattern=KEY.pattern)


class ResizeSpec(BaseModel):
    """POST /jobs/{id}/resize: the new gang shape of a pending job."""

    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(ge=1, le=4096)
    gpus_per_node: int | None = Field(None, ge=1, le=64)


class CommitReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    epoch: int = Field(ge=1)
    progress_s: float = Field(ge=0, allow_inf_nan=False)
    step: int | None = Field(None, ge=0)
    time: float = Field(0.0, allow_inf_nan=False)
    path: str = Field("", max_length=4096)
    # "fast": committed on a tiered Checkpointer's fast tier only, which a restart on the same
    # nodes restores and the loss of a node does not; "durable" (the default) survives both
    tier: Literal["fast", "durable"] = "durable"


@dataclass(frozen=True)
class Caller:
    tenant: str
    role: str  # tenant | admin | job
    job: str = ""


def _field_error(field: str, msg: str) -> HTTPException:
    return HTTPException(422, detail=[{"loc": ["body", field], "msg": msg, "type": "value_error"}])


# ---------------------------------------------------------------------- the service


class Service:
    """The scheduler, its store, its executor and the loop thread, behind one lock."""

    def __init__(
        self,
        db: str,
        pools: list[Pool],
        *,
        state_dir: str | Path,
        url: str,
        tick_s: float = 1.0,
        poll_s: float = 0.1,
        executor: str = "local",
        executor_options: dict[str, Any] | None = None,
    ) -> None:
        # first come, first served: neither the loop thread nor a request waits behind later ones
        self.lock = FairLock()
        self.wake = threading.Event()
        self.tick_s = tick_s
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = open_store(db)
        self.pools = pools
        # the last accepted commit report of each job, kept in the store with the job (Store.along)
        self.last_commit: dict[str, dict[str, Any]] = self.store.last_commits()
        self.last_fast_commit: dict[str, dict[str, Any]] = {}  # in memory: a fast commit counts for nothing
        # (tenant, idempotency key) -> (job id, spec digest), and job id -> key: POST /jobs's replays
        self.keys: dict[tuple[str, str], tuple[str, str]] = self.store.job_keys()
        self.key_of: dict[str, str] = {j: k for (_t, k), (j, _s) in self.keys.items()}
        # token hash -> caller, filled on a token's first successful lookup: tokens are never revoked or
        # changed in the store, so a hit stays right, and a request no longer reads the store to
        # authenticate; an unknown hash is not cached (a token added later by the CLI works at once)
        self._callers: dict[str, Caller] = {}
        nodes = None
        if executor == "slurm":  # Slurm launches; pools and nodes are the partition's (goodput.sched.slurm)
            from .slurm import service_executor

            pools, nodes, self.executor = service_executor(self, url=url, **(executor_options or {}))
            self.pools = pools
        else:
            gpn = {f"{p.name}-{i:05d}": p.gpus_per_node for p in pools for i in range(p.nodes)}
            self.executor = LocalExecutor(
                self.state_dir,
                url=url,
                gpus_per_node=gpn,
                token_for=self._job_token,
                on_exit=self._on_exit,
                poll_s=poll_s,
            )
        snap = self.store.load()
        with self.lock:
            if snap.nodes:
                self.sched = Scheduler.restore(self.store, pools, clock=WallClock(), executor=self.executor)
                self.restored = True
            else:
                self.sched = Scheduler(pools, clock=WallClock(), executor=self.executor, store=self.store, nodes=nodes)
                self.sched.save_all()
                self.restored = False
            self.adopted = self.executor.adopt(self.sched.jobs)
        # (wall end, pass seconds, lock wait seconds) of recent loop iterations that ran a pass: GET /stats
        self.pass_times: deque[tuple[float, float, float]] = deque(maxlen=100_000)
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run, name="goodput-sched-loop", daemon=True)

    def start(self) -> None:
        self.executor.start_watcher()
        self._loop.start()

    def close(self) -> None:
        self._stop.set()
        self.wake.set()
        self._loop.join(timeout=5)
        self.executor.close()
        self.store.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            nxt = math.inf
            try:
                t0 = time.perf_counter()
                with self.lock:
                    t1 = time.perf_counter()
                    passes = self.sched.passes
                    if self.sched.next_timer() <= self.sched.clock.now():
                        # only when a timer is due: advance() always commits (its meta), an fsync that
                        # would otherwise be paid, under the lock, on every wake-up
                        self.sched.advance()
                    self.sched.tick()
                    after = getattr(self.executor, "after_pass", None)  # Slurm: release what the pass started
                    if after is not None:
                        after()
                    nxt = self.sched.next_timer()
                    ran = self.sched.passes != passes
                    t2 = time.perf_counter()
                if ran:
                    self.pass_times.append((time.time(), t2 - t1, t1 - t0))
            except Exception:  # noqa: BLE001 - one bad pass must not stop the service; it is logged
                log.exception("scheduling pass failed")
            wait = self.tick_s if not math.isfinite(nxt) else max(0.01, min(self.tick_s, nxt - time.time()))
            self.wake.wait(wait)
            self.wake.clear()

    # -- executor callbacks (watcher thread) -----------------------------------------------------------

    def _on_exit(self, job_id: str, epoch: int, status: str) -> None:
        with self.lock:
            self.sched.report_exit(job_id, epoch, status)
        self.wake.set()

    def _job_token(self, job: Job) -> str:
        return new_token(self.store, job.tenant, "job", job.id)

    # -- auth --------------------------------------------------------------------------------------------

    def caller(self, authorization: str | None) -> Caller:
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        tok = authorization[len("Bearer ") :].strip()
        if not tok or len(tok) > 256:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        h = digest(tok)
        hit = self._callers.get(h)
        if hit is not None:
            return hit
        found = self.store.token(h)
        if found is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        if len(self._callers) >= CALLER_CACHE:  # job tokens are minted per run: keep the cache bounded
            self._callers.clear()
        self._callers[h] = c = Caller(*found)
        return c

    def replay(self, tenant: str, key: str, spec_digest: str) -> JSONResponse | None:
        """The answer to a POST /jobs whose idempotency key this tenant already used, or None (a new key):
        200 with the first submission's id, or 409 when the key came with a different spec."""
        hit = self.keys.get((tenant, key))
        if hit is None:
            return None
        job_id, first = hit
        if first != spec_digest:
            raise HTTPException(409, f"key {key!r} was used for another submission ({job_id}) with a different spec")
        job = self.sched.jobs.get(job_id)
        state = job.state.value if job is not None else None
        return JSONResponse({"id": job_id, "state": state, "replayed": True}, status_code=200)

    def own_job(self, caller: Caller, job_id: str) -> Job:
        """The job if the caller may see it; 404 otherwise, so another tenant's ids are not disclosed."""
        if not JOB_ID.match(job_id):
            raise HTTPException(404, f"no job {job_id!r}")
        job = self.sched.jobs.get(job_id)
        if job is None or (caller.role != "admin" and job.tenant != caller.tenant):
            raise HTTPException(404, f"no job {job_id!r}")
        return job

    # -- views -------------------------------------------------------------------------------------------

    def view(self, job: Job, *, detail: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": job.id,
            "name": job.name,
            "tenant": job.tenant,
            "state": job.state.value,
            "substate": job.substate,
            "priority": job.priority,
            "nodes": job.nodes,
            "gpus_per_node": job.gpus_per_node,
            "spot": job.spot,
            "limit_s": job.limit_s,
            "epoch": job.epoch,
            "restarts": max(0, job.epoch - 1),
            "preemptions": job.preemptions,
            "infra_losses": job.infra_losses,
            "failures": job.failures,
            "submit_s": job.submit_s,
            "placement": list(job.placement),
            "pool": job.pool if job.placement else "",
            "key": self.key_of.get(job.id),
        }
        if detail:
            from goodput.ckpt import latest

            try:
                on_disk = latest(job.ckpt_root) if job.ckpt_root else None
            except Exception:  # a damaged root must not break the detail view
                on_disk = None
            d["command"] = list(job.command)
            d["ckpt_root"] = job.ckpt_root
            d["checkpoint"] = {
                "committed_s": job.committed_s,
                "committed_at": job.committed_at if job.committed_at >= 0 else None,
                "last_report": self.last_commit.get(job.id),
                "last_fast_report": self.last_fast_commit.get(job.id),
                "latest_on_disk": str(on_disk) if on_disk is not None else None,
                "interval_s": job.ckpt.interval_s,
                "grace_s": job.ckpt.grace_s,
            }
            d["deadline_s"] = job.deadline_s if math.isfinite(job.deadline_s) else None
            d["victim_of"] = job.victim_of
            d["history"] = [r for r in self.sched.log.records if r.get("job") == job.id]
        return d


# ---------------------------------------------------------------------- the app


def create_app(svc: Service) -> FastAPI:
    app = FastAPI(title="goodput.sched", version="1", description="The checkpoint-aware scheduler's live service.")

    # async: FastAPI runs a plain ``def`` dependency in its thread pool, one hand-off per dependency
    # per request; these only hash the token and read the in-memory cache (the store on a token's
    # first use), so they run on the event loop and a request makes one hand-off (its endpoint)
    async def caller(authorization: str | None = Header(None)) -> Caller:
        return svc.caller(authorization)

    async def admin(c: Caller = Depends(caller)) -> Caller:
        if c.role != "admin":
            raise HTTPException(403, "an admin token is required")
        return c

    async def person(c: Caller = Depends(caller)) -> Caller:
        if c.role == "job":
            raise HTTPException(403, "a job token may only report its own commits")
        return c

    # answers a JSONResponse itself: FastAPI serialises a plain ``def`` endpoint's returned dict in its
    # thread pool, a second hand-off per request on the hottest endpoint
    @app.post("/jobs", status_code=201, response_class=JSONResponse)
    def submit(spec: JobSpec, c: Caller = Depends(person)) -> JSONResponse:
        if spec.ckpt_root and not Path(spec.ckpt_root).is_absolute():
            raise _field_error("ckpt_root", "must be an absolute path")
        if any(not a or "\x00" in a for a in spec.command):
            raise _field_error("command", "arguments must be non-empty strings without NUL")
        spec_digest = ""
        if spec.key is not None:
            spec_digest = hashlib.sha256(spec.model_dump_json(exclude={"key"}).encode()).hexdigest()
            replay = svc.replay(c.tenant, spec.key, spec_digest)  # before any work: a retry is cheap
            if replay is not None:
                return replay
        job_id = f"{spec.name}.{secrets.token_hex(4)}"
        root = spec.ckpt_root or str(svc.state_dir / "ckpt" / job_id)
        try:  # before taking the lock: a filesystem call need not hold up the scheduler
            Path(root).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _field_error("ckpt_root", f"cannot create {root!r}: {e.strerror}") from None
        with svc.lock:
            if spec.key is not None:  # again under the lock: the same key may be racing in another request
                replay = svc.replay(c.tenant, spec.key, spec_digest)
                if replay is not None:
                    return replay
            now = svc.sched.clock.now()
            job = Job(
                id=job_id,
                tenant=c.tenant,
                priority=spec.priority,
                nodes=spec.nodes,
                gpus_per_node=spec.gpus_per_node,
                submit_s=now,
                limit_s=spec.limit_s,
                spot=spec.spot,
                ckpt=Checkpointing(
                    interval_s=spec.ckpt_interval_s,
                    write_s=spec.ckpt_write_s,
                    restart_s=spec.restart_s,
                    grace_s=spec.grace_s,
                ),
                command=tuple(spec.command),
                ckpt_root=root,
                name=spec.name,
            )
            job.retry.max_failures = spec.max_failures
            keyed = [(c.tenant, spec.key, job_id, spec_digest)] if spec.key is not None else []
            try:
                with svc.store.along(keys=keyed):  # the key is stored in the submission's own transaction
                    svc.sched.submit(job)
            except SchedulerError as e:
                field = "gpus_per_node" if "GPUs" in str(e) else "nodes"
                raise _field_error(field, str(e)) from None
            if spec.key is not None:
                svc.keys[(c.tenant, spec.key)] = (job_id, spec_digest)
                svc.key_of[job_id] = spec.key
        svc.wake.set()
        return JSONResponse({"id": job_id, "state": job.state.value}, status_code=201)

    @app.get("/jobs")
    def list_jobs(
        state: str | None = Query(None, pattern="^(pending|running|preempting|finished|failed|cancelled)$"),
        name: str | None = Query(None, pattern=NAME.pattern),
        tenant: str | None = Query(None, pattern=NAME.pattern),
        limit: int = Query(1000, ge=1, le=100000),
        c: Caller = Depends(person),
    ) -> dict[str, Any]:
        with svc.lock:
            out = []
            for j in svc.sched.jobs.values():
                if c.role != "admin" and j.tenant != c.tenant:
                    continue
                if state and j.state.value != state or tenant and j.tenant != tenant:
                    continue
                if name and j.name != name:
                    continue
                out.append(svc.view(j))
                if len(out) >= limit:
                    break
        return {"jobs": out}

    @app.get("/jobs/{job_id}")
    def show(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.lock:
            return svc.view(svc.own_job(c, job_id), detail=True)

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.lock:
            job = svc.own_job(c, job_id)
            svc.sched.cancel(job.id)
            out = {"id": job.id, "state": job.state.value, "substate": job.substate}
        svc.wake.set()
        return out

    @app.delete("/jobs/{job_id}")
    def delete(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        return cancel(job_id, c)

    @app.post("/jobs/{job_id}/resize")
    def resize(job_id: str, spec: ResizeSpec, c: Caller = Depends(person)) -> dict[str, Any]:
        """A pending job's gang shape for its next run (it resumes from its committed checkpoint,
        which reshards onto the new number of workers); 409 unless it is pending."""
        with svc.lock:
            job = svc.own_job(c, job_id)
            if job.state is not JobState.PENDING:
                raise HTTPException(409, f"job {job.id!r} is {job.state.value}: only a pending job can be resized")
            try:
                svc.sched.resize(job.id, spec.nodes, spec.gpus_per_node)
            except SchedulerError as e:
                raise _field_error("nodes", str(e)) from None
            out = {"id": job.id, "state": job.state.value, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node}
        svc.wake.set()
        return out

    @app.post("/jobs/{job_id}/commits")
    def commit(job_id: str, rep: CommitReport, c: Caller = Depends(caller)) -> JSONResponse:
        if c.role == "job" and c.job != job_id:
            raise HTTPException(403, "this token reports for another job")
        with svc.lock:
            job = svc.own_job(c, job_id)
            reason = svc.sched.commit_rejection(job.id, rep.epoch, rep.progress_s)
            report = rep.model_dump()
            if rep.tier == "fast":
                # shown, never counted: the scheduler may resume the job on other nodes, where only
                # the durable tier's checkpoints exist; its durable commit follows from the drain
                if not reason:
                    svc.last_fast_commit[job.id] = report
                return JSONResponse({"accepted": not reason, "reason": reason}, status_code=409 if reason else 200)
            # an accepted report is stored with the job's step (one transaction), so a restarted service shows it
            # (report_commit judges by commit_rejection itself, so the dry run and the step agree)
            with svc.store.along(commits={job.id: report} if not reason else None):
                ok = svc.sched.report_commit(job.id, rep.epoch, rep.progress_s)
            if ok:
                svc.last_commit[job.id] = report
            elif not reason:  # the core refused for a reason its dry run did not give: say so, never ''
                reason = "rejected"
        return JSONResponse({"accepted": ok, "reason": reason}, status_code=200 if ok else 409)

    @app.get("/cluster")
    def cluster(c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.lock:
            s = svc.sched.summary()
            s["nodes"] = [
                {
                    "name": n.name,
                    "pool": n.pool,
                    "gpus": n.gpus,
                    "used": n.used,
                    "draining": n.draining,
                    "health": n.health.value,
                    "jobs": sorted(n.alloc) if c.role == "admin" else [],
                }
                for n in svc.sched.cap.nodes.values()
            ]
        return s

    @app.get("/queue")
    def queue(c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.lock:
            pend = [j for j in svc.sched.jobs.values() if j.state is JobState.PENDING]
            pend.sort(key=lambda j: (-j.priority, j.submit_s, j.seq))
            mine = [svc.view(j) for j in pend if c.role == "admin" or j.tenant == c.tenant]
            return {"pending": len(pend), "jobs": mine, "summary": svc.sched.summary()}

    @app.get("/events")
    def events(
        since: int = Query(0, ge=0),
        limit: int = Query(10000, ge=1, le=100000),
        follow: bool = False,
        c: Caller = Depends(person),
    ) -> StreamingResponse:
        """The event log as JSONL (the simulator's schema); ``follow`` keeps streaming new records."""

        def visible(rec: dict[str, Any]) -> bool:
            if c.role == "admin":
                return True
            job = svc.sched.jobs.get(str(rec.get("job", "")))
            return job is not None and job.tenant == c.tenant

        def gen() -> Iterator[bytes]:
            seq = since
            sent = 0
            while True:
                rows = svc.store.events_since(seq, min(1000, limit - sent))
                for s, rec in rows:
                    seq = s
                    if visible(rec):
                        sent += 1
                        yield (json.dumps(rec, separators=(",", ":")) + "\n").encode()
                if sent >= limit or (not rows and not follow):
                    return
                if not rows:
                    time.sleep(0.5)

        return StreamingResponse(gen(), media_type="application/x-ndjson")

    @app.post("/nodes/{name}/drain")
    def drain(name: str, grace_s: float = Query(30.0, ge=0, le=86400), c: Caller = Depends(admin)) -> dict[str, Any]:
        if not NODE.match(name) or name not in svc.sched.cap.nodes:
            raise HTTPException(404, f"no node {name!r}")
        with svc.lock:
            svc.sched.reclaim_notice([name], svc.sched.clock.now() + grace_s, why="node_loss")
        svc.wake.set()
        return {"node": name, "health": svc.sched.cap.nodes[name].health.value}

    @app.post("/nodes/{name}/up")
    def up(name: str, c: Caller = Depends(admin)) -> dict[str, Any]:
        if not NODE.match(name) or name not in svc.sched.cap.nodes:
            raise HTTPException(404, f"no node {name!r}")
        with svc.lock:
            svc.sched.node_up([name])
        svc.wake.set()
        return {"node": name, "health": Health.UP.value}

    @app.get("/stats")
    def stats(since: float = Query(0.0, ge=0), c: Caller = Depends(admin)) -> dict[str, Any]:
        """Scheduling passes of the loop thread that ended at or after ``since`` (unix seconds): how long
        each held the lock (advance + tick + their store commits) and how long it waited for it."""
        rows = [r for r in list(svc.pass_times) if r[0] >= since]
        return {
            "passes": len(rows),
            "pass_ms": _dist([r[1] for r in rows]),
            "lock_wait_ms": _dist([r[2] for r in rows]),
            "kept": svc.pass_times.maxlen,
        }

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "restored": svc.restored, "adopted": svc.adopted}

    from .ui import router as ui_router  # the dashboard at /ui (docs/DASHBOARD.md), behind the same tokens

    app.include_router(ui_router(svc, person))

    @app.exception_handler(SchedulerError)
    def _sched_error(request: Request, exc: SchedulerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    return app


def _dist(xs: list[float]) -> dict[str, float | None]:
    """p50 / p99 / max / mean in milliseconds of durations in seconds (nearest rank; None when empty)."""
    if not xs:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    xs = sorted(xs)

    def pct(q: float) -> float:
        return 1000 * xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]

    return {"p50": pct(0.50), "p99": pct(0.99), "max": 1000 * xs[-1], "mean": 1000 * sum(xs) / len(xs)}


def local_pools(nodes: int, gpus_per_node: int, name: str = "local") -> list[Pool]:
    from .model import PoolKind

    return [Pool(name=name, kind=PoolKind.ON_DEMAND, nodes=nodes, gpus_per_node=gpus_per_node)]


def serve(
    db: str,
    pools: list[Pool],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    state_dir: str | Path = ".goodput-sched",
    tick_s: float = 1.0,
    executor: str = "local",
    executor_options: dict[str, Any] | None = None,
) -> None:
    """Run the service until interrupted (uvicorn in this thread)."""
    import uvicorn

    svc = Service(
        db,
        pools,
        state_dir=state_dir,
        url=f"http://{host}:{port}",
        tick_s=tick_s,
        executor=executor,
        executor_options=executor_options,
    )
    svc.start()
    try:
        uvicorn.run(create_app(svc), host=host, port=port, log_level="warning")
    finally:
        svc.close()


__all__ = ["Service", "create_app", "local_pools", "new_token", "serve"]
