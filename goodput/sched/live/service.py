"""The live scheduler: an HTTP API (FastAPI) over the same core the simulator drives.

Only the clock (``WallClock``) and the executor (:class:`goodput.sched.live.local.LocalExecutor`) differ
from the simulator. One lock guards the scheduler: every request, the loop thread (``advance`` +
``tick`` about once a second, at once when something made a pass worth running) and the
executor's exit reports all take it, so the core stays single-threaded as it was written.

Crash safety comes from the core and the executor together: every input is committed to the store
with its records and events in one transaction; on start the service restores from a store that
has records (``Scheduler.restore``), then the executor re-adopts the run records it finds (live
process groups, or exits written by their supervisors while the service was down) and kills any
run the store does not count (a start that never committed), so nothing runs twice. A store write
that fails while the service runs (SQLite locked past the busy timeout by another process, a
read-only file, a lost PostgreSQL connection) is handled the same way in-process: the scheduler is
rebuilt from the store, runs it does not count are killed, and the request answers 503 with
``Retry-After`` having changed nothing; a keyed retry then creates its job exactly once.

Every input is validated (types, finite numbers in range, string lengths and contents, the
cluster's limits, the tenant's checkpoint prefix) and the job encoded for the store before the lock
is taken; nothing touches the file system under the lock.

Authentication: bearer tokens, stored as sha256 hashes only and cached in memory from a refresh of
the store's live tokens every half second (a revoked or expired token is refused within a second;
a token's first use is looked up on a small thread pool, never on the event loop). A tenant token
submits and sees its own jobs (another tenant's job is a 404: its existence is not disclosed, nor
named in any view or event); an admin token sees all and drains nodes; a job token (one per run,
an HMAC of the job and epoch under the state directory's secret, handed to the job as a file only
its user can read) may only report commits for its own run. Security model: docs/SCHED.md.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from ..core.executor import WallClock
from ..core.governance import Governance, SubmissionRejected, limit_value
from ..core.model import TERMINAL, Checkpointing, Health, Job, JobState, Pool
from ..core.scheduler import Scheduler, SchedulerError
from .local import LocalExecutor
from .runas import RunAs, RunAsError, UserMap, configured_from, myself
from .store import StoreError, StoreUnavailable, encode_job, open_store
from .tokens import NAME, digest, new_token

log = logging.getLogger("goodput.sched.live.service")
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}\.[0-9a-f]{8}\Z")
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")  # a submission's idempotency key
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

# bounds on what a request may carry (docs/SCHED.md, "Security model")
MAX_BODY = 1 << 20  # bytes of a request body
HISTORY_MAX = 1000  # event records of one job a view shows (its newest)
MAX_HEADER_BYTES = 64 << 10  # a request line and header block larger than this is refused (h11)
MAX_ARGS = 4096  # arguments of a command
MAX_ARG = 65536  # characters of one argument
MAX_ENV = 64  # variables of a spec's env
MAX_ENV_VALUE = 8192
# bytes (UTF-8) of a spec's command and env together (each variable counted as KEY=VALUE): every
# pending job keeps them in memory and in the store until it ends, so max_queued_per_tenant times
# this is what a tenant's queue may hold; Linux's own execve limits are of this order
MAX_SPEC_BYTES = 256 << 10
MAX_PATH = 4096
MAX_LIMIT_S = 366 * 86400.0  # a declared limit_s, and any interval
MAX_PROGRESS_S = 1e10  # a commit report's progress_s (seconds of work)
MAX_INT = 2**53  # step numbers, sequence numbers
RETRY_AFTER_S = 2  # what a 503 or 429 asks a client to wait
TOKEN_REFRESH_S = 0.5  # the token cache is rebuilt from the store this often
TOKEN_STALE_S = 5.0  # a cache not refreshed for this long is not trusted (each token is looked up)
QUEUED_PRUNE_S = 0.2  # a tenant at max_queued_per_tenant has its ended jobs counted out at most this often
_UNENDED = frozenset((JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING))
# retention of ended jobs (limits.ended_retention_s, limits.max_ended_per_tenant; docs/SCHED.md)
ENDED_COMMAND_BYTES = 4096  # of an ended job's command, what its record keeps (the rest is cut, said so)
RETIRE_BATCH = 500  # ended jobs trimmed, and pruned, per scheduling pass at most (one transaction each)
PRUNED_REMEMBERED = 100_000  # ids of pruned jobs remembered (until a restart) so that GET answers 410
# retention of events (limits.event_retention, limits.event_retention_s; docs/SCHED.md, "Retention of events")
EVENT_PRUNE_BATCH = 10_000  # events deleted per transaction at most (a backlog goes a batch per pass)
PRUNED_EVENT = "events_pruned"  # the last line of a stream whose next events the retention deleted
_CUT = re.compile(r"^<goodput: [0-9]+ more bytes of this command were dropped when the job ended>\Z")


def _checked_by_pydantic(p: re.Pattern[str]) -> str:
    """The pattern for pydantic, whose Rust regex engine has no ``\\Z``: there ``$`` already means
    the end of the text (Python's ``$`` also matches before a final newline, hence ``\\Z`` here)."""
    assert p.pattern.endswith("\\Z")
    return p.pattern[:-2] + "$"


def _command_bytes(command: tuple[str, ...] | list[str]) -> int:
    return sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in command)


def _trim_command(command: tuple[str, ...]) -> tuple[str, ...]:
    """An ended job's command as its record keeps it: whole while it is at most ``ENDED_COMMAND_BYTES``,
    else its first arguments (the last one cut) within that, then one argument saying how many bytes
    were dropped (``_CUT``): a view shows what ran, and no one runs an ended job's command again."""
    total = _command_bytes(command)
    if total <= ENDED_COMMAND_BYTES or (command and _CUT.match(command[-1])):
        return command
    budget = ENDED_COMMAND_BYTES - 128  # room for the note
    kept: list[str] = []
    for a in command:
        size = len(a.encode("utf-8", "surrogatepass")) + 1
        if size > budget:
            if budget > 1:
                kept.append(a.encode("utf-8", "surrogatepass")[: budget - 1].decode("utf-8", "ignore"))
            break
        kept.append(a)
        budget -= size
    dropped = total - _command_bytes(kept)
    return (*kept, f"<goodput: {dropped} more bytes of this command were dropped when the job ended>")


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


# ---------------------------------------------------------------------- request bodies


def _text(v: str) -> str:
    """A string the store and every consumer can hold: UTF-8 encodable (no lone surrogate), no NUL."""
    if "\x00" in v:
        raise ValueError("must not contain NUL characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (a lone surrogate is not)") from None
    return v


def _env_key(v: str) -> str:
    if v.startswith("GOODPUT_"):
        raise ValueError("GOODPUT_* variables are the run's own: set by the executor, not the spec")
    return v


Arg = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ARG), AfterValidator(_text)]
Path_ = Annotated[str, StringConstraints(max_length=MAX_PATH), AfterValidator(_text)]
EnvKey = Annotated[str, StringConstraints(pattern=_checked_by_pydantic(ENV_KEY)), AfterValidator(_env_key)]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE), AfterValidator(_text)]


def _seconds(default: float, *, gt: float | None = None, ge: float | None = None, le: float = MAX_LIMIT_S) -> Any:
    return Field(default, gt=gt, ge=ge, le=le, allow_inf_nan=False)


class JobSpec(BaseModel):
    """POST /jobs: the workload file's names where they overlap (docs/SCHED.md).

    Strict: a number is a JSON number (an integer for the integer fields; a float field takes an
    integer too), a flag a JSON boolean, a string a JSON string; anything else is a 422 naming the
    field. Lax pydantic would read ``"3"`` or ``true`` as 3 or 1, a priority or grace no one meant."""

    # a misspelt field is a 422 naming it, not silently dropped; a value of another JSON type too
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field("job", pattern=_checked_by_pydantic(NAME))
    command: list[Arg] = Field(min_length=1, max_length=MAX_ARGS)
    nodes: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(1, ge=1, le=64)
    priority: int = Field(0, ge=-1000, le=1000)
    limit_s: float = _seconds(3600.0, gt=0)
    ckpt_root: Path_ = ""
    spot: bool = False
    # bounded here; the cluster's limits (max_grace_s, max_restart_s) bound them further
    grace_s: float = _seconds(30.0, ge=0, le=86400.0)
    ckpt_interval_s: float = _seconds(60.0, ge=0)
    ckpt_write_s: float = _seconds(1.0, ge=0, le=86400.0)
    restart_s: float = _seconds(5.0, ge=0, le=86400.0)
    max_failures: int = Field(3, ge=0, le=100)
    # variables the job's processes get (besides an allowlist of the service's and its run's GOODPUT_*)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    # the client's idempotency key: a retried POST with the same key (same tenant) answers the first one's id
    key: str | None = Field(None, pattern=_checked_by_pydantic(KEY))

    def oversized(self) -> tuple[str, str] | None:
        """(field, message) when the command and env together exceed ``MAX_SPEC_BYTES``, else None."""
        cmd = sum(len(a.encode()) + 1 for a in self.command)
        env = sum(len(k) + len(v.encode()) + 2 for k, v in self.env.items())
        if cmd + env <= MAX_SPEC_BYTES:
            return None
        field = "command" if cmd > MAX_SPEC_BYTES else "env"
        return field, (
            f"the command and env come to {cmd + env} bytes (each argument and KEY=VALUE counted with a NUL), "
            f"more than the {MAX_SPEC_BYTES} a job spec may carry"
        )


class ResizeSpec(BaseModel):
    """POST /jobs/{id}/resize: the new gang shape of a pending job (strict, as :class:`JobSpec`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    nodes: int = Field(ge=1, le=4096)
    gpus_per_node: int | None = Field(None, ge=1, le=64)


class CommitReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    epoch: int = Field(ge=1, le=2**31)
    progress_s: float = Field(ge=0, le=MAX_PROGRESS_S, allow_inf_nan=False)
    step: int | None = Field(None, ge=0, le=MAX_INT)
    time: float = Field(0.0, ge=0, le=1e11, allow_inf_nan=False)
    path: Path_ = ""
    # "fast": committed on a tiered Checkpointer's fast tier only, which a restart on the same
    # nodes restores and the loss of a node does not; "durable" (the default) survives both
    tier: Literal["fast", "durable"] = "durable"
    # optional (older jobs omit them; docs/PROTOCOL.md): when the run's resume was done and training
    # began (the job's clock, as ``time``), what this save stalled the loop and how long it wrote
    ready_time: float | None = Field(None, ge=0, le=1e11, allow_inf_nan=False)
    stall_s: float | None = Field(None, ge=0, le=MAX_PROGRESS_S, allow_inf_nan=False)
    write_s: float | None = Field(None, ge=0, le=MAX_PROGRESS_S, allow_inf_nan=False)

    @field_validator("epoch", "progress_s", "step", "time", "ready_time", "stall_s", "write_s", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        """A number, never a boolean: pydantic's lax mode reads ``true`` as 1, a time or duration no job meant."""
        if isinstance(v, bool):
            raise ValueError("a number, not a boolean")
        return v

    def timing(self) -> dict[str, float]:
        """The record's timing fields: seconds trained since the resume (both times on the job's
        clock, so no clock skew enters), this save's stall and write; absent ones left out. A resume
        done after the report's own time is no timing at all (trained_s 0 would charge the run's
        training to restart)."""
        out = {"stall_s": self.stall_s, "write_s": self.write_s}
        if self.ready_time is not None and self.time > 0 and self.ready_time <= self.time:
            out["trained_s"] = max(0.0, self.time - self.ready_time)
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class Caller:
    tenant: str
    role: str  # tenant | admin | job
    job: str = ""
    epoch: int = 0  # a run's job token: the run it reports for (0: a stored job token, any run)
    key: str = ""  # what its requests are counted under (rate limits)


def _event_retention(gov: Governance, count: int | None, age_s: float | None) -> tuple[int, float | None]:
    """The event retention's bounds: the Service's arguments (checked as the cluster file's are),
    else the cluster's ``limits``."""
    count = gov.limits.event_retention if count is None else limit_value("event_retention", count)
    age_s = gov.limits.event_retention_s if age_s is None else limit_value("event_retention_s", age_s)
    return count, age_s


def _event_time(rec: dict[str, Any]) -> float:
    """A record's ``t``, or +inf where it has none (never pruned for its age)."""
    t = rec.get("t")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else math.inf


def _field_error(field: str, msg: str) -> HTTPException:
    return HTTPException(422, detail=[{"loc": ["body", field], "msg": msg, "type": "value_error"}])


def _unavailable(msg: str) -> HTTPException:
    return HTTPException(503, msg, headers={"Retry-After": str(RETRY_AFTER_S)})


class _Bucket:
    """A token bucket: ``rate`` requests a second, bursts of ``burst``."""

    __slots__ = ("level", "t")

    def __init__(self, burst: float, t: float) -> None:
        self.level, self.t = burst, t


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
        governance: Governance | None = None,
        allow_root_jobs: bool = False,
        rate_per_s: float = 100.0,
        rate_burst: float = 200.0,
        streams_per_tenant: int = 4,
        streams_total: int = 64,
        store_timeout_s: float = 2.0,
        max_user_procs: int | None = None,
        event_retention: int | None = None,
        event_retention_s: float | None = None,
    ) -> None:
        # first come, first served: neither the loop thread nor a request waits behind later ones
        self.lock = FairLock()
        self.wake = threading.Event()
        self.tick_s = tick_s
        self.state_dir = Path(state_dir).absolute()
        self.gov = governance if governance is not None else Governance()
        # the event log's bound (events kept, and their age): see prune_events
        self.event_retention, self.event_retention_s = _event_retention(self.gov, event_retention, event_retention_s)
        # a busy timeout short enough that a store locked by another process is a quick 503, not a
        # request (and the lock it holds) hanging for half a minute
        # deferred_sync: a commit's fsync happens after the lock is released (durable() below), shared
        # by every request that committed meanwhile, instead of one fsync per request under the lock
        self.store = open_store(db, busy_timeout_s=store_timeout_s, deferred_sync=True)
        self._check_state_dir()
        # reads that must not queue behind the scheduler's commits (tokens, the event stream) use a
        # connection of their own (SQLite in WAL mode reads while another connection writes)
        memory = db in (":memory:", "sqlite://:memory:", "sqlite:///:memory:")
        self.reader = self.store if memory else open_store(db, busy_timeout_s=store_timeout_s)
        self.pools = pools
        self.me = myself()
        self.users = UserMap(
            configured_from({t: s.user for t, s in self.gov.tenants.items()}, self.store.tenant_users()),
            allow_root=allow_root_jobs,
        )
        self.allow_root_jobs = allow_root_jobs
        self._secret = self._load_secret()
        self.degraded = ""  # why the scheduler could not be rebuilt from the store ('' when healthy)
        self.rate_per_s, self.rate_burst = rate_per_s, max(1.0, rate_burst)
        self.streams_per_tenant, self.streams_total = streams_per_tenant, streams_total
        self._streams: dict[str, int] = {}
        self._prefixes: set[str] = set()  # tenants whose default checkpoint prefix exists
        self._prefix_of: dict[str, str] = {}  # tenant -> its checkpoint prefix (ckpt_prefix)
        self._buckets: dict[str, _Bucket] = {}
        self._tokens: dict[str, tuple[str, str, str, float | None]] = {}
        self._tokens_at = 0.0
        self._auth_limiter = anyio.CapacityLimiter(4)  # first uses of tokens: the store, never the event loop
        self._read_limiter = anyio.CapacityLimiter(8)  # the event stream's store reads
        # listings of checkpoint roots (a tenant's job decides how big its root is): never on the shared
        # worker threads; one at a time per tenant, 4 in all, and concurrent views of a root share one
        self._disk_limiter = anyio.CapacityLimiter(4)
        self._tenant_disk: dict[str, anyio.CapacityLimiter] = {}
        self._listing: dict[tuple[str, str], tuple[anyio.Event, dict]] = {}
        self._load_facts()
        nodes = None
        if executor == "slurm":  # Slurm launches; pools and nodes are the partition's (goodput.sched.live.slurm)
            from .slurm import service_executor

            opts = dict(executor_options or {})
            opts.setdefault("allow_root_jobs", allow_root_jobs)
            pools, nodes, self.executor = service_executor(self, url=url, **opts)
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
                run_as=self._run_as,
                env_for=lambda job: self.envs.get(job.id, {}),
                max_user_procs=max_user_procs,
                max_log_bytes=self.gov.limits.max_log_bytes,
            )
        self._private_dirs()
        # retention of ended jobs: the store names each job it writes in an ended state (under the lock)
        self._noticed: list[tuple[str, str]] = []
        self._queued: dict[str, set[str]] = {}  # filled by _count_queued
        self.pruned: OrderedDict[str, tuple[str, str]] = OrderedDict()  # job id -> (tenant, why)
        self.store.on_ended = self._on_ended
        # not Store.load: Scheduler.restore reads the store itself, and a restart should read it once
        restoring = self.store.has_nodes()
        with self.lock:
            if restoring:
                self.sched = Scheduler.restore(
                    self.store, self.pools, clock=WallClock(), executor=self.executor, governance=self.gov
                )
                self.restored = True
            else:
                self.sched = Scheduler(
                    self.pools,
                    clock=WallClock(),
                    executor=self.executor,
                    store=self.store,
                    nodes=nodes,
                    governance=self.gov,
                )
                self.sched.save_all()
                self.restored = False
            self.adopted = self.executor.adopt(self.sched.jobs)
            self._count_queued()
            self._index_ended()
            self._load_event_marks()
            self._index_history()
        self.refresh_tokens()
        # (wall end, pass seconds, lock wait seconds) of recent loop iterations that ran a pass: GET /stats
        self.pass_times: deque[tuple[float, float, float]] = deque(maxlen=100_000)
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run, name="goodput-sched-loop", daemon=True)
        self._refresher = threading.Thread(target=self._refresh_loop, name="goodput-sched-tokens", daemon=True)

    # -- start-up ----------------------------------------------------------------------------------------

    def _check_state_dir(self) -> None:
        """The store records the state directory its runs live in: a restart with another one would
        never find (nor kill) the running jobs' groups, so it is refused, naming the recorded one."""
        recorded = self.store.service_meta().get("state_dir")
        here = str(self.state_dir.resolve())
        if recorded is None:
            self.store.set_service_meta("state_dir", here)
        elif recorded != here:
            self.store.close()
            raise StoreError(
                f"this store's jobs run from the state directory {recorded!r}, not {here!r}: start the service "
                f"with --state-dir {recorded} (the run records, logs and job tokens are there)"
            )

    def _private_dirs(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.state_dir.stat().st_uid == os.geteuid():
            os.chmod(self.state_dir, 0o711)  # traversable: jobs reach their work and ckpt dirs; not listable
        ck = self.state_dir / "ckpt"
        ck.mkdir(exist_ok=True)
        os.chmod(ck, 0o711)

    def _load_secret(self) -> bytes:
        """The key job tokens are made with: 32 random bytes in ``STATE/secret`` (0600)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / "secret"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not os.path.isfile(path) or os.path.islink(path):
                raise StoreError(f"{path}: the job-token key must be a file of ours, mode 0600") from None
            data = path.read_bytes()
            if len(data) != 32:
                raise StoreError(f"{path}: the job-token key is {len(data)} bytes, not 32") from None
            return data
        data = secrets.token_bytes(32)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return data

    def _load_facts(self) -> None:
        """The service's own facts about jobs, from the store (at start, and after a rebuild)."""
        # the last accepted commit report of each job, kept in the store with the job (Store.along)
        self.last_commit: dict[str, dict[str, Any]] = self.store.last_commits()
        if not hasattr(self, "last_fast_commit"):
            self.last_fast_commit: dict[str, dict[str, Any]] = {}  # in memory: a fast commit counts for nothing
        # (tenant, idempotency key) -> (job id, spec digest), and job id -> key: POST /jobs's replays
        self.keys: dict[tuple[str, str], tuple[str, str]] = self.store.job_keys()
        self.key_of: dict[str, str] = {j: k for (_t, k), (j, _s) in self.keys.items()}
        self.envs: dict[str, dict[str, str]] = self.store.job_envs()

    def startup_notes(self) -> list[str]:
        """What the operator should know about how jobs will run (printed by ``serve``)."""
        if self.me.uid != 0:
            return [
                f"this service runs as {self.me.user!r} (uid {self.me.uid}), not root: every job runs as "
                f"{self.me.user!r} too, so tenants are not isolated from each other or from the service "
                "(run it as root with tenants mapped to users for that)"
            ]
        if self.allow_root_jobs:
            return ["--allow-root-jobs: tenants without a Unix user run their jobs as root (a single-user machine)"]
        return ["jobs run as their tenant's Unix user; tenants without one are refused"]

    def start(self, *, notes: bool = True) -> None:
        """Start the loop and the watchers. ``notes``: log :meth:`startup_notes` (``serve`` prints
        them itself, once)."""
        self.executor.start_watcher()
        self._loop.start()
        self._refresher.start()
        for note in self.startup_notes() if notes else ():
            log.warning("%s", note)

    def close(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._loop.is_alive():
            self._loop.join(timeout=5)
        if self._refresher.is_alive():
            self._refresher.join(timeout=5)
        self.executor.close()
        if self.reader is not self.store:
            self.reader.close()
        self.store.close()

    # -- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            nxt = math.inf
            try:
                nxt = self.pass_once()
            except Exception:  # noqa: BLE001 - one bad pass must not stop the service; it is logged
                log.exception("scheduling pass failed")
            wait = self.tick_s if not math.isfinite(nxt) else max(0.01, min(self.tick_s, nxt - time.time()))
            self.wake.wait(wait)
            self.wake.clear()

    def pass_once(self) -> float:
        """One iteration of the loop thread (timers due, a pass); the next timer's time. A store that
        refuses the pass's commit, or any error in it, rebuilds memory from the store."""
        nxt = math.inf
        t0 = time.perf_counter()
        ran = False
        with self.lock:
            t1 = time.perf_counter()
            if self.degraded:
                self._rebuild("retrying")
                return nxt
            passes = self.sched.passes
            try:
                if self.sched.next_timer() <= self.sched.clock.now():
                    # only when a timer is due: advance() always commits (its meta), an fsync that
                    # would otherwise be paid, under the lock, on every wake-up
                    self.sched.advance()
                self.sched.tick()
                after = getattr(self.executor, "after_pass", None)  # Slurm: release what it started
                if after is not None:
                    self.store.sync()  # only once the starts are durable (its hold is the safety)
                    after()
            except StoreUnavailable as e:
                self._rebuild(f"a scheduling pass: {e}")
            except Exception:
                log.exception("scheduling pass failed")
                self._rebuild("an unexpected error in a scheduling pass")
            if not self.degraded:
                self._catch_up_history()  # the pass's records: a view seldom pays for them
                self._upkeep("retiring ended jobs", self.retire_ended)
            if not self.degraded:
                self._upkeep("pruning the event log", self.prune_events)
            nxt = self.sched.next_timer() if not self.degraded else math.inf
            ran = self.sched.passes != passes
            t2 = time.perf_counter()
        if ran:
            self.pass_times.append((time.time(), t2 - t1, t1 - t0))
        try:
            self.store.sync()  # the pass's commits, outside the lock
        except StoreUnavailable:
            log.exception("the store cannot make a pass's commits durable; next pass retries")
        return nxt

    def _rebuild(self, why: str) -> None:
        """Memory back to what the store holds (the lock held): the scheduler restored from it, the
        service's facts reread, and every run the store does not count killed (its start never
        committed), exactly as a restart would. If even that fails the service is degraded: requests
        that need the scheduler answer 503 and the loop retries."""
        log.warning("store write failed (%s): rebuilding the scheduler from the store", why)
        try:
            self.sched = Scheduler.restore(
                self.store, self.pools, clock=WallClock(), executor=self.executor, governance=self.gov
            )
            self._load_facts()
            self._count_queued()
            self._index_ended()
            self._load_event_marks()
            self._index_history()
            reconcile = getattr(self.executor, "reconcile", None)
            if reconcile is not None:
                killed = reconcile(self.sched.jobs)
                if killed:
                    log.warning("runs whose start never reached the store were killed: %s", sorted(killed))
            self.degraded = ""
        except Exception as e:  # noqa: BLE001 - reported by /healthz and 503s until a retry succeeds
            self.degraded = f"the store cannot be read: {e}"
            log.exception("rebuilding the scheduler from the store failed; retrying")

    def durable(self) -> None:
        """Before a request that changed state answers: its commit is durable (Store.sync, outside the
        lock; one fsync for every request that committed meanwhile)."""
        try:
            self.store.sync()
        except StoreUnavailable as e:
            raise _unavailable(
                f"the change was written but the store cannot make it durable ({e}); a retry with the same "
                "key answers the same job"
            ) from None

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """The lock, for a request that changes state: a store write that fails inside rolls memory back
        (:meth:`_rebuild`) and answers 503 with Retry-After; nothing of the request remains."""
        with self.lock:
            if self.degraded:
                raise _unavailable(f"the scheduler's store is unavailable ({self.degraded}); retry")
            try:
                yield
            except StoreUnavailable as e:
                self._rebuild(str(e))
                raise _unavailable(f"the store refused the change, nothing was changed: {e}") from None
            except (HTTPException, SchedulerError, SubmissionRejected):
                raise  # refusals: decided before anything changed
            except Exception:
                # a bug may have left memory half-changed: back to the store before anyone else looks
                self._rebuild("an unexpected error in a request")
                raise

    # -- the per-tenant bound on queued work (limits.max_queued_per_tenant) ----------------------------

    def _count_queued(self) -> None:
        """Each tenant's jobs not yet ended, from the scheduler (the lock held): at start and after a rebuild."""
        self._queued: dict[str, set[str]] = {}
        self._queued_pruned: dict[str, float] = {}
        for j in self.sched.jobs.values():
            if j.state in _UNENDED:
                self._queued.setdefault(j.tenant, set()).add(j.id)

    def check_queued(self, tenant: str) -> None:
        """429 when ``tenant`` already has the cluster's ``max_queued_per_tenant`` jobs not yet ended
        (the lock held). The count is a set of ids added at submission; a job is counted out when the
        store writes it ended (:meth:`_on_ended`), and, should one be missed, the set is pruned of ended
        jobs when it reaches the limit, at most every ``QUEUED_PRUNE_S``: a submission costs O(1), and a
        tenant at its limit cannot make each refused request walk its whole queue."""
        limit = self.gov.limits.max_queued_per_tenant
        ids = self._queued.get(tenant)
        if ids is None or len(ids) < limit:
            return
        now = time.monotonic()
        if now - self._queued_pruned.get(tenant, -math.inf) >= QUEUED_PRUNE_S:
            self._queued_pruned[tenant] = now
            jobs = self.sched.jobs
            ended = [i for i in ids if i not in jobs or jobs[i].state not in _UNENDED]
            ids.difference_update(ended)
            if len(ids) < limit:
                return
        raise HTTPException(
            429,
            f"tenant {tenant!r} has {len(ids)} jobs queued or running, the cluster's max_queued_per_tenant "
            f"is {limit}: retry once some have ended",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def note_queued(self, job: Job) -> None:
        self._queued.setdefault(job.tenant, set()).add(job.id)

    # -- retention of ended jobs (limits.ended_retention_s, limits.max_ended_per_tenant) ---------------

    def _on_ended(self, ended: list[tuple[str, str]]) -> None:
        """The store's report of jobs it wrote in an ended state (a scheduler step, the lock held):
        counted out of their tenant's queued jobs at once, and noted for :meth:`retire_ended`."""
        self._noticed.extend(ended)
        for jid, tenant in ended:
            queued = self._queued.get(tenant)
            if queued is not None:
                queued.discard(jid)

    def _index_ended(self) -> None:
        """The ended jobs, per tenant in the order they ended, and those whose environment or long
        command is still kept (the lock held): at start and after a rebuild, from the scheduler."""
        self._noticed.clear()
        self._ended: dict[str, deque[tuple[float, str]]] = {}
        self._ended_ids: set[str] = set()
        self._to_trim: deque[str] = deque()
        ended = [j for j in self.sched.jobs.values() if j.state in TERMINAL]
        ended.sort(key=lambda j: (j.end_s, j.seq))
        for j in ended:
            self._note_ended(j)

    def _note_ended(self, job: Job) -> None:
        end = job.end_s if job.end_s >= 0 else self.sched.clock.now()
        self._ended.setdefault(job.tenant, deque()).append((end, job.id))
        self._ended_ids.add(job.id)
        if job.id in self.envs or _command_bytes(job.command) > ENDED_COMMAND_BYTES:
            self._to_trim.append(job.id)

    def retire_ended(self) -> bool:
        """One batch of the retention of ended jobs (the lock held; the loop thread, after a pass):
        jobs that ended since the last batch lose their environment and all but ``ENDED_COMMAND_BYTES``
        of their command (only a run needs them), and the oldest ended jobs past the tenant's
        ``max_ended_per_tenant``, or ended longer than ``ended_retention_s`` ago, are removed from the
        store and then from memory. At most ``RETIRE_BATCH`` of each, in one transaction: a store that
        refuses it changes nothing. Whether more is left for the next batch."""
        if self._noticed:
            noticed, self._noticed[:] = list(self._noticed), []
            for jid, _tenant in noticed:
                job = self.sched.jobs.get(jid)
                if job is not None and job.state in TERMINAL and jid not in self._ended_ids:
                    self._note_ended(job)
        lim = self.gov.limits
        cutoff = self.sched.clock.now() - lim.ended_retention_s
        prune: dict[str, tuple[str, str]] = {}  # job id -> (tenant, why)
        counts: dict[str, int] = {}  # tenant -> entries of its deque to drop
        more = False
        for tenant, dq in self._ended.items():
            n = 0
            while n < len(dq) and len(prune) < RETIRE_BATCH:
                end, jid = dq[n]
                if len(dq) - n > lim.max_ended_per_tenant:
                    why = f"it was one of more than max_ended_per_tenant ({lim.max_ended_per_tenant}) ended jobs"
                elif end < cutoff:
                    why = f"it ended more than ended_retention_s ({lim.ended_retention_s:g} s) ago"
                else:
                    break
                if self.sched.forgettable(jid):  # ended and holding nothing: never a pending or running job
                    prune[jid] = (tenant, why)
                n += 1
            if n:
                counts[tenant] = n
            more = more or len(prune) >= RETIRE_BATCH
        trim: list[Job] = []
        while self._to_trim and len(trim) < RETIRE_BATCH:
            jid = self._to_trim[0]
            job = self.sched.jobs.get(jid)
            if job is not None and job.state in TERMINAL and jid not in prune:
                trim.append(job)
            self._to_trim.popleft()
        more = more or bool(self._to_trim)
        if not prune and not trim:
            for tenant, n in counts.items():  # entries of jobs already gone
                self._drop_ended(tenant, n)
            return more
        old = [(j, j.command) for j in trim]
        for j in trim:
            j.command = _trim_command(j.command)
        try:
            self.store.retire(trimmed=trim, pruned=list(prune))
        except BaseException:
            for j, cmd in old:
                j.command = cmd
            raise
        for j in trim:
            self.envs.pop(j.id, None)
            self.last_fast_commit.pop(j.id, None)
        for tenant, n in counts.items():
            self._drop_ended(tenant, n)
        gone = set(self.sched.forget(list(prune)))
        for jid, (tenant, why) in prune.items():
            self._forget_facts(jid, tenant)
            if jid in gone:
                self.pruned[jid] = (tenant, why)
        while len(self.pruned) > PRUNED_REMEMBERED:
            self.pruned.popitem(last=False)
        if prune:
            log.info("removed %d ended jobs (retention)", len(prune))
        return more

    def _upkeep(self, what: str, batch: Callable[[], bool]) -> None:
        """One batch of a retention after a pass (the lock held): a backlog (a restart, a lowered
        limit) wakes the loop for the next batch soon; a store that refuses changed nothing and the
        next pass tries again; anything else rebuilds the scheduler from the store."""
        try:
            if batch():
                self.wake.set()
        except StoreUnavailable as e:
            log.warning("%s: the store refused (retried next pass): %s", what, e)
        except Exception:
            log.exception("%s failed", what)
            self._rebuild(f"an unexpected error {what}")

    # -- retention of events (limits.event_retention, limits.event_retention_s) ------------------------

    def _load_event_marks(self) -> None:
        """The log's low-water mark and each job's count of pruned records, from the store (the lock
        held; at start and after a rebuild, right after the scheduler read its retained events)."""
        self.events_first = self.store.first_event_seq()  # seq of sched.log.records[0]
        self._history_pruned: dict[str, int] = self.store.events_pruned()
        # records removed from the head of the scheduler's current log list (the dashboard's feed
        # keeps its place in the log by this plus its index): 0 for a fresh list
        self.log_base = 0

    def prune_events(self) -> bool:
        """One batch of the event retention (the lock held; the loop thread, after a pass): the oldest
        events past the newest ``event_retention``, or older than ``event_retention_s``, at most
        ``EVENT_PRUNE_BATCH``, are deleted from the store (which raises its low-water mark: seqs are
        never reused) and then from memory: the scheduler's log, the per-job history index (each job's
        pruned records counted into its ``history_dropped``). A store that refuses changes nothing.
        Whether more is left for the next batch."""
        records = self.sched.log.records
        n = len(records)
        drop = max(0, n - self.event_retention)
        if self.event_retention_s is not None:
            cutoff = self.sched.clock.now() - self.event_retention_s
            while drop < min(n, EVENT_PRUNE_BATCH) and _event_time(records[drop]) < cutoff:
                drop += 1
        drop = min(drop, EVENT_PRUNE_BATCH)
        if drop <= 0:
            return False
        self._catch_up_history()  # every record to drop is indexed, so its job's list loses it
        jobs, counts = self.sched.jobs, {}
        for rec in records[:drop]:
            jid = rec.get("job")
            if isinstance(jid, str) and jid in jobs:
                counts[jid] = counts.get(jid, 0) + 1
        first = self.events_first
        got = self.store.prune_events(first + drop, counts)
        if got != first + drop:  # memory and the store disagree on the log: trust the store
            raise RuntimeError(f"the store's low-water mark moved from {first} to {got}, not to {first + drop}")
        del records[:drop]
        self.events_first = got
        self.log_base += drop
        self._history_at -= drop
        for jid, k in counts.items():
            lst = self._history.get(jid)
            if lst is not None:
                del lst[:k]
                if not lst:
                    del self._history[jid]
            self._history_pruned[jid] = self._history_pruned.get(jid, 0) + k
        log.info("pruned %d events (retention); the log keeps seq %d on", drop, got)
        return drop >= EVENT_PRUNE_BATCH

    # -- each job's event records (GET /jobs/{id}'s history) ---------------------------------------------

    def _index_history(self) -> None:
        """The event records by job, from the scheduler's whole log (the lock held): at start, where the
        log holds every event the store kept, and after a rebuild. Records of jobs the scheduler no
        longer holds (removed by retention) are left out."""
        self._history: dict[str, list[dict[str, Any]]] = {}
        self._history_log: list[dict[str, Any]] = self.sched.log.records
        self._history_at = 0
        self._catch_up_history()

    def _catch_up_history(self) -> None:
        """Index the records emitted since the last call (the lock held; the log only grows, so each
        record is looked at once): a view costs the records of its job, not the whole log."""
        records = self.sched.log.records
        if records is not self._history_log or len(records) < self._history_at:
            self._index_history()  # another log (a scheduler rebuilt some other way): index it whole
            return
        n = len(records)
        if n == self._history_at:
            return
        jobs, index = self.sched.jobs, self._history
        for i in range(self._history_at, n):
            rec = records[i]
            jid = rec.get("job")
            if isinstance(jid, str) and jid in jobs:
                lst = index.get(jid)
                if lst is None:
                    index[jid] = [rec]
                else:
                    lst.append(rec)
        self._history_at = n

    def history(self, job_id: str) -> tuple[list[dict[str, Any]], int]:
        """The newest ``HISTORY_MAX`` event records of a job, oldest first, and how many older ones were
        left out (the lock held): past ``HISTORY_MAX``, or deleted by the event retention."""
        self._catch_up_history()
        recs = self._history.get(job_id, [])
        cut = max(0, len(recs) - HISTORY_MAX)
        return recs[cut:], cut + self._history_pruned.get(job_id, 0)

    def _drop_ended(self, tenant: str, n: int) -> None:
        dq = self._ended[tenant]
        for _ in range(n):
            self._ended_ids.discard(dq.popleft()[1])
        if not dq:
            del self._ended[tenant]

    def _forget_facts(self, jid: str, tenant: str) -> None:
        """Drop the service's own facts about a pruned job (the store's rows went with its record)."""
        self.envs.pop(jid, None)
        self.last_commit.pop(jid, None)
        self.last_fast_commit.pop(jid, None)
        self._history.pop(jid, None)
        self._history_pruned.pop(jid, None)
        key = self.key_of.pop(jid, None)
        if key is not None and self.keys.get((tenant, key), ("",))[0] == jid:
            del self.keys[(tenant, key)]  # a retry with that key now submits anew
        last_exit = getattr(self.executor, "last_exit", None)
        if isinstance(last_exit, dict):
            last_exit.pop(jid, None)
        queued = self._queued.get(tenant)
        if queued is not None:
            queued.discard(jid)

    # -- executor callbacks (watcher thread) -----------------------------------------------------------

    def _on_exit(self, job_id: str, epoch: int, status: str) -> None:
        """Raises when the store refuses the step: the executor keeps the exit and reports it again."""
        with self.lock:
            if self.degraded:
                raise StoreUnavailable(self.degraded)
            try:
                self.sched.report_exit(job_id, epoch, status)
            except StoreUnavailable as e:
                self._rebuild(f"an exit report: {e}")
                raise
        try:
            self.store.sync()  # outside the lock: the step is taken; a failed fsync is the disk's, said here
        except StoreUnavailable:
            log.exception("job %s: its exit is committed but could not be made durable", job_id)
        self.wake.set()

    def _job_token(self, job: Job) -> str:
        """The run's own token: ``gpj_<mac>.<epoch>.<job id>``, the mac an HMAC-SHA256 of the job and
        epoch under the state directory's secret. Nothing is written to the store for it (a start
        cannot fail for a store that refuses a write), and it is useless for any other run."""
        return f"gpj_{self._mac(job.id, job.epoch)}.{job.epoch}.{job.id}"

    def _mac(self, job_id: str, epoch: int) -> str:
        mac = hmac.new(self._secret, f"{job_id}\x00{epoch}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def _run_as(self, job: Job) -> RunAs | None:
        return self.users.for_tenant(job.tenant)

    # -- auth --------------------------------------------------------------------------------------------

    def refresh_tokens(self) -> None:
        """The cache, rebuilt from the store's live tokens and tenant users (another process adds and
        revokes them: ``goodput sched token``)."""
        live = self.reader.live_tokens()
        users = self.reader.tenant_users()
        self._tokens = live
        self.users.configured = configured_from({t: s.user for t, s in self.gov.tenants.items()}, users)
        self._tokens_at = time.monotonic()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(TOKEN_REFRESH_S):
            try:
                self.refresh_tokens()
            except Exception:  # noqa: BLE001 - a store that cannot be read now may be readable next time
                log.exception("refreshing the token cache failed; retrying")

    def _lookup(self, h: str) -> tuple[str, str, str, float | None] | None:
        found = self.reader.token(h)
        return None if found is None else (*found, None)

    async def authenticate(self, authorization: str | None) -> Caller:
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        tok = authorization[len("Bearer ") :].strip()
        if not tok or len(tok) > 256:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        if tok.startswith("gpj_"):
            c = self._job_caller(tok)
        else:
            h = digest(tok)
            ent = self._tokens.get(h)
            if ent is None or time.monotonic() - self._tokens_at > TOKEN_STALE_S:
                self._rate("unknown tokens", rate=50.0)  # lookups of tokens not cached: the store's, bounded
                try:  # a token added since the last refresh, or a cache too old to trust
                    ent = await anyio.to_thread.run_sync(self._lookup, h, limiter=self._auth_limiter)
                except StoreError as e:
                    raise _unavailable(f"cannot check the token now: {e}") from None
                if ent is not None:
                    self._tokens[h] = ent
            if ent is None:
                raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
            tenant, role, job, expires = ent
            if expires is not None and expires <= time.time():
                raise HTTPException(401, "token expired", headers={"WWW-Authenticate": "Bearer"})
            c = Caller(tenant, role, job, 0, h)
        self._rate(c.key)
        return c

    def _job_caller(self, tok: str) -> Caller:
        unknown = HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        parts = tok[4:].split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 10 or not JOB_ID.match(parts[2]):
            raise unknown
        mac, epoch, job_id = parts[0], int(parts[1]), parts[2]
        if not hmac.compare_digest(mac, self._mac(job_id, epoch)):
            raise unknown
        job = self.sched.jobs.get(job_id)
        if job is None:
            raise unknown
        return Caller(job.tenant, "job", job_id, epoch, f"job:{job_id}")

    def _rate(self, key: str, rate: float | None = None) -> None:
        """At most ``rate_per_s`` requests a second per token (``rate`` for ``key``), in bursts of twice
        as many: 429 beyond. On the event loop's thread only."""
        per_s = self.rate_per_s if rate is None else rate
        if per_s <= 0:
            return
        burst = self.rate_burst if rate is None else 2 * rate
        now = time.monotonic()
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) > 100_000:
                self._buckets.clear()
            b = self._buckets[key] = _Bucket(burst, now)
        b.level = min(burst, b.level + (now - b.t) * per_s)
        b.t = now
        if b.level < 1.0:
            wait = max(1, math.ceil((1.0 - b.level) / per_s))
            what = "with this token" if rate is None else f"for {key}"
            raise HTTPException(429, f"more than {per_s:g} requests a second {what}", {"Retry-After": str(wait)})
        b.level -= 1.0

    def caller(self, authorization: str | None) -> Caller:
        """:meth:`authenticate` from a thread that is not the event loop's (tests, tools)."""
        return anyio.run(self.authenticate, authorization)

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
        if job is None:
            gone = self.pruned.get(job_id)
            if gone is not None and (caller.role == "admin" or gone[0] == caller.tenant):
                raise HTTPException(
                    410,
                    f"job {job_id!r} ended and was removed: {gone[1]} (the cluster's limits.ended_retention_s "
                    "and limits.max_ended_per_tenant bound the ended jobs kept)",
                )
        if job is None or (caller.role != "admin" and job.tenant != caller.tenant):
            raise HTTPException(
                404, f"no job {job_id!r} (an ended job is removed once past the cluster's retention of ended jobs)"
            )
        return job

    # -- checkpoint roots --------------------------------------------------------------------------------

    def ckpt_prefix(self, tenant: str) -> str:
        """Where the tenant's checkpoint roots must live: the cluster JSON's ``tenants[].ckpt_prefix``,
        else ``STATE/ckpt/<tenant>``."""
        got = self._prefix_of.get(tenant)
        if got is None:  # a function of the configuration alone: kept, it costs a submission nothing
            spec = self.gov.tenants.get(tenant)
            if spec is not None and spec.ckpt_prefix:
                got = os.path.normpath(os.path.abspath(spec.ckpt_prefix))
            else:
                got = str(self.state_dir / "ckpt" / tenant)
            if len(self._prefix_of) > 100_000:
                self._prefix_of.clear()
            self._prefix_of[tenant] = got
        return got

    def confine(self, tenant: str, root: str, job_id: str) -> str:
        """The job's checkpoint root, normalised, inside the tenant's prefix (422 naming ckpt_root)."""
        prefix = self.ckpt_prefix(tenant)
        if not root:
            return os.path.join(prefix, job_id)
        if not os.path.isabs(root):
            raise _field_error("ckpt_root", "must be an absolute path")
        norm = os.path.normpath(root)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        if norm != prefix and not norm.startswith(prefix.rstrip("/") + "/"):
            raise _field_error("ckpt_root", f"must be under this tenant's checkpoint prefix {prefix}")
        return norm

    def ensure_default_prefix(self, tenant: str, who: RunAs | None) -> None:
        """``STATE/ckpt/<tenant>`` exists, 0700, owned by the tenant's user (made by the service in a
        directory only it can write, so no link is followed). An operator's prefix is the operator's."""
        if tenant in self._prefixes:
            return
        prefix = Path(self.ckpt_prefix(tenant))
        if prefix.parent != self.state_dir / "ckpt":
            return
        try:
            os.mkdir(prefix, 0o700)
        except FileExistsError:
            self._prefixes.add(tenant)
            return
        if who is not None:
            os.chown(prefix, who.uid, who.gid, follow_symlinks=False)
        self._prefixes.add(tenant)

    def latest_on_disk(self, tenant: str, root: str) -> str | None:
        """The newest committed checkpoint under ``root``, only while ``root`` really is inside the
        tenant's prefix (a link a tenant made to another's directory shows nothing). Outside the lock."""
        from goodput.ckpt import latest

        if not root:
            return None
        try:
            real, prefix = os.path.realpath(root), os.path.realpath(self.ckpt_prefix(tenant))
            if real != prefix and not real.startswith(prefix.rstrip("/") + "/"):
                return None
            on_disk = latest(real)
            # again after reading: a root swapped for a link while it was read shows nothing either
            if on_disk is None or not os.path.realpath(on_disk).startswith(prefix.rstrip("/") + "/"):
                return None
        except Exception:  # noqa: BLE001 - a damaged root must not break the detail view
            return None
        return str(on_disk)

    def log_dropped(self, job_id: str, epoch: int) -> int | None:
        """Bytes of a running run's output its log has dropped so far (``limits.max_log_bytes``): what
        its supervisor last wrote to ``STATE/runs/<job>.<epoch>.logcut`` (none: 0); None when it cannot
        be read (the view says unknown rather than 0). Outside the lock."""
        runs_dir = getattr(self.executor, "runs_dir", None)
        if runs_dir is None or not JOB_ID.match(job_id):
            return None
        try:
            fd = os.open(runs_dir / f"{job_id}.{int(epoch)}.logcut", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        except OSError:
            return None
        try:
            n = json.loads(os.read(fd, 4096)).get("log_dropped_bytes")
        except (OSError, ValueError, AttributeError):
            return None
        finally:
            os.close(fd)
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    async def latest_listed(self, tenant: str, root: str) -> str | None:
        """:meth:`latest_on_disk` from the event loop: on the listing pool, one listing at a time per
        tenant (a tenant whose root holds millions of entries waits for its own views only), and a view
        of a root already being listed waits for that listing's answer instead of listing it again."""
        if not root:
            return None
        key = (tenant, root)
        running = self._listing.get(key)
        if running is not None:
            await running[0].wait()
            return running[1].get("latest")
        done, box = anyio.Event(), {}
        self._listing[key] = (done, box)
        try:
            lim = self._tenant_disk.get(tenant)
            if lim is None:
                lim = self._tenant_disk[tenant] = anyio.CapacityLimiter(1)
            async with lim:
                box["latest"] = await anyio.to_thread.run_sync(
                    self.latest_on_disk, tenant, root, limiter=self._disk_limiter
                )
        finally:
            self._listing.pop(key, None)
            done.set()
        return box["latest"]

    # -- event streams -----------------------------------------------------------------------------------

    def stream_slot(self, tenant: str, *, check_only: bool = False, release: bool = False) -> None:
        """Count ``/events`` streams, follow or not (on the event loop's thread only): 429 past the caps.
        A stream that is not followed still holds its slot while its client has not read it all."""
        if release:
            n = self._streams.get(tenant, 0) - 1
            if n > 0:
                self._streams[tenant] = n
            else:
                self._streams.pop(tenant, None)
            return
        if self._streams.get(tenant, 0) >= self.streams_per_tenant:
            raise HTTPException(
                429, f"at most {self.streams_per_tenant} event streams per tenant", {"Retry-After": str(RETRY_AFTER_S)}
            )
        if sum(self._streams.values()) >= self.streams_total:
            raise HTTPException(
                429, f"at most {self.streams_total} event streams in all", {"Retry-After": str(RETRY_AFTER_S)}
            )
        if not check_only:
            self._streams[tenant] = self._streams.get(tenant, 0) + 1

    # -- views -------------------------------------------------------------------------------------------

    def _foreign(self, caller: Caller, job_id: Any) -> bool:
        """Whether ``job_id`` names a job of another tenant than the caller's (admins see everything)."""
        if caller.role == "admin" or not isinstance(job_id, str):
            return False
        other = self.sched.jobs.get(job_id)
        if other is None:  # a removed ended job (or a reason such as "cancel", no job id): named only to its own
            gone = self.pruned.get(job_id)
            return gone[0] != caller.tenant if gone is not None else bool(JOB_ID.match(job_id))
        return other.tenant != caller.tenant

    def redact(self, caller: Caller, rec: dict[str, Any]) -> dict[str, Any]:
        """An event record as the caller may see it: another tenant's job is never named."""
        if caller.role == "admin":
            return rec
        out = rec
        for k in ("victim_of", "preemptor"):
            if self._foreign(caller, rec.get(k)):
                out = dict(out) if out is rec else out
                out[k] = "another tenant's job"
        cands = rec.get("candidates")
        if isinstance(cands, list):
            kept = [
                x
                for x in cands
                if not self._foreign(
                    caller, x if isinstance(x, str) else (x.get("job") if isinstance(x, dict) else None)
                )
            ]
            if len(kept) != len(cands):
                out = dict(out) if out is rec else out
                out["candidates"] = kept
        return out

    def view(self, job: Job, *, detail: bool = False, caller: Caller | None = None) -> dict[str, Any]:
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
            "leave_crashes": job.leave_crashes,  # non-zero exits while asked to leave (the infrastructure budget)
            "failures": job.failures,
            "unasked_yields": job.unasked_yields,
            "fail_reason": job.fail_reason or None,
            "submit_s": job.submit_s,
            "placement": list(job.placement),
            "pool": job.pool if job.placement else "",
            "key": self.key_of.get(job.id),
        }
        if detail:
            c = caller or Caller(job.tenant, "admin")
            d["command"] = list(job.command)
            d["env"] = dict(self.envs.get(job.id, {}))
            # retention: an ended job keeps neither its env nor more than ENDED_COMMAND_BYTES of its command
            d["command_cut"] = bool(job.command) and _CUT.match(job.command[-1]) is not None
            d["env_dropped"] = job.state in TERMINAL and job.id not in self.envs
            d["ckpt_root"] = job.ckpt_root
            d["checkpoint"] = {
                "committed_s": job.committed_s,
                "committed_at": job.committed_at if job.committed_at >= 0 else None,
                "last_report": self.last_commit.get(job.id),
                "last_fast_report": self.last_fast_commit.get(job.id),
                "latest_on_disk": None,  # filled outside the lock (file-system I/O)
                "interval_s": job.ckpt.interval_s,
                "grace_s": job.ckpt.grace_s,
            }
            d["last_exit"] = getattr(self.executor, "last_exit", {}).get(job.id)
            d["deadline_s"] = job.deadline_s if math.isfinite(job.deadline_s) else None
            d["victim_of"] = "another tenant's job" if self._foreign(c, job.victim_of) else job.victim_of
            # the job's records from an index by job (never a scan of the whole log under the lock):
            # its newest HISTORY_MAX, and how many older ones were left out
            recs, dropped = self.history(job.id)
            d["history"] = [self.redact(c, r) for r in recs]
            d["history_dropped"] = dropped
        return d


# ---------------------------------------------------------------------- the app


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is a 413 before it is read into memory: by
    its Content-Length, or, when there is none (a chunked body), read here up to ``max_bytes`` + 1
    bytes and refused once past the limit, else handed to the app as it came. (Raising inside the
    app's ``receive`` instead would reach FastAPI, which answers any error reading a body with 400.)"""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sized = False
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                if not v.isdigit() or int(v) > self.max_bytes:
                    await self._refuse(send)
                    return
                sized = True
        seen = 0
        started = False
        if not sized:  # no Content-Length: read the body here, at most max_bytes + 1 of it
            buffered: deque[dict] = deque()
            while True:
                msg = await receive()
                buffered.append(msg)
                if msg["type"] != "http.request":
                    break  # http.disconnect: the app sees it as it would have
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    await self._refuse(send)
                    return
                if not msg.get("more_body", False):
                    break
            outer = receive

            async def replayed() -> dict:
                return buffered.popleft() if buffered else await outer()

            receive = replayed

        async def counted() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        async def sending(msg: dict) -> None:
            nonlocal started
            started = True
            await send(msg)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"the request body is larger than {self.max_bytes} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _summary_for(svc: Service, c: Caller) -> dict[str, Any]:
    """The scheduler's summary as this caller may see it: the head's reservation names its job only
    to an admin or to the job's own tenant (a job id carries its name); others learn that one holds."""
    s = svc.sched.summary()
    res = s.get("reservation")
    if res is not None and c.role != "admin":
        owner = svc.sched.jobs.get(res["job"])
        if owner is None or owner.tenant != c.tenant:
            s["reservation"] = {**res, "job": None}
    return s


def create_app(svc: Service) -> FastAPI:
    # every status any endpoint may answer, listed for every operation (the API fuzz test holds us to it)
    common: dict[int | str, dict[str, Any]] = {
        400: {"description": "malformed body"},
        401: {"description": "no, an unknown, a revoked or an expired token"},
        403: {"description": "the token's role may not do this"},
        404: {"description": "no such job or node (or another tenant's)"},
        410: {"description": "the job ended and was removed (the cluster's retention of ended jobs)"},
        409: {"description": "conflicts with the job's state"},
        413: {"description": "body larger than 1 MiB"},
        422: {"description": "a field is invalid (named)"},
        429: {"description": "rate limited, or too many streams; see Retry-After"},
        503: {"description": "the store refused the change (nothing changed); see Retry-After"},
    }
    # no /docs or /redoc: their pages load scripts from a CDN, on the origin whose sessionStorage
    # holds the dashboard's token; /openapi.json stays
    app = FastAPI(
        title="goodput.sched",
        version="1",
        description="The checkpoint-aware scheduler's live service.",
        responses=common,
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY)

    # async: FastAPI runs a plain ``def`` dependency in its thread pool, one hand-off per dependency
    # per request; these only hash the token and read the in-memory cache (a token's first use is
    # looked up on a small pool of their own), so a request makes one hand-off (its endpoint)
    async def caller(authorization: str | None = Header(None)) -> Caller:
        return await svc.authenticate(authorization)

    async def admin(c: Caller = Depends(caller)) -> Caller:
        if c.role != "admin":
            raise HTTPException(403, "an admin token is required")
        return c

    # straight from the header, not through ``caller``: one dependency level less on every request
    async def person(authorization: str | None = Header(None)) -> Caller:
        c = await svc.authenticate(authorization)
        if c.role == "job":
            raise HTTPException(403, "a job token may only report its own commits")
        return c

    # answers a JSONResponse itself: FastAPI serialises a plain ``def`` endpoint's returned dict in its
    # thread pool, a second hand-off per request on the hottest endpoint
    @app.post(
        "/jobs",
        status_code=201,
        response_class=JSONResponse,
        responses={
            200: {"description": "a replay of an earlier submission with the same key"},
            403: {"description": "the tenant's jobs may not run here (no Unix user)"},
            409: {"description": "the key was used with another spec"},
            413: {"description": "body too large"},
            429: {"description": "rate limited, or the tenant has max_queued_per_tenant jobs not yet ended"},
            503: {"description": "the store refused the change; retry"},
        },
    )
    def submit(spec: JobSpec, c: Caller = Depends(person)) -> JSONResponse:
        # 1. validate everything and build the job, touching nothing shared
        if (big := spec.oversized()) is not None:
            raise _field_error(*big)
        try:
            who = svc.users.for_tenant(c.tenant)
        except RunAsError as e:
            raise HTTPException(403, str(e)) from None
        spec_digest = ""
        if spec.key is not None:
            spec_digest = hashlib.sha256(spec.model_dump_json(exclude={"key"}).encode()).hexdigest()
            replay = svc.replay(c.tenant, spec.key, spec_digest)  # before any work: a retry is cheap
            if replay is not None:
                svc.durable()  # the first submission may be committed and not yet synced
                return replay
        job_id = f"{spec.name}.{secrets.token_hex(4)}"
        root = svc.confine(c.tenant, spec.ckpt_root, job_id)
        job = Job(
            id=job_id,
            tenant=c.tenant,
            priority=spec.priority,
            nodes=spec.nodes,
            gpus_per_node=spec.gpus_per_node,
            submit_s=time.time(),
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
        try:
            svc.gov.check(job)  # the cluster's limits and the tenant's max_priority
        except SubmissionRejected as e:
            raise _field_error(e.field, e.message) from None
        # 2. encode for the store: a record it cannot write is refused here, not found at the commit
        try:
            encode_job(job)
        except (TypeError, ValueError, OverflowError) as e:
            raise _field_error("body", f"cannot be stored: {e}") from None
        # file-system work before the lock: the tenant's default prefix
        try:
            svc.ensure_default_prefix(c.tenant, who)
        except OSError as e:
            raise _unavailable(f"cannot make the checkpoint prefix: {e.strerror}") from None
        # 3. change, under the lock, all or nothing
        replay = None
        with svc.changing():
            if spec.key is not None:  # again under the lock: the same key may be racing in another request
                replay = svc.replay(c.tenant, spec.key, spec_digest)
            if replay is None:
                if job_id in svc.sched.jobs:
                    raise _unavailable("a job id collided; retry")
                svc.check_queued(c.tenant)  # after the replay: a retry of an accepted submission is never refused
                job.submit_s = svc.sched.clock.now()
                keyed = [(c.tenant, spec.key, job_id, spec_digest)] if spec.key is not None else []
                try:
                    # the key and the env are stored in the submission's own transaction
                    with svc.store.along(keys=keyed, envs={job_id: spec.env} if spec.env else None):
                        svc.sched.submit(job)
                except SchedulerError as e:
                    field = "gpus_per_node" if "GPUs" in str(e) else "nodes"
                    raise _field_error(field, str(e)) from None
                except SubmissionRejected as e:
                    raise _field_error(e.field, e.message) from None
                svc.note_queued(job)
                if spec.env:
                    svc.envs[job_id] = dict(spec.env)
                if spec.key is not None:
                    svc.keys[(c.tenant, spec.key)] = (job_id, spec_digest)
                    svc.key_of[job_id] = spec.key
                state = job.state.value
        if replay is not None:
            svc.durable()  # its first submission may be committed and not yet synced
            return replay
        svc.wake.set()
        svc.durable()
        return JSONResponse({"id": job_id, "state": state}, status_code=201)

    @app.get("/jobs")
    def list_jobs(
        state: str | None = Query(None, pattern="^(pending|running|preempting|finished|failed|cancelled)$"),
        name: str | None = Query(None, pattern=_checked_by_pydantic(NAME)),
        tenant: str | None = Query(None, pattern=_checked_by_pydantic(NAME)),
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
    async def show(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        def locked() -> tuple[dict[str, Any], str, str]:
            with svc.lock:
                job = svc.own_job(c, job_id)
                return svc.view(job, detail=True, caller=c), job.tenant, job.ckpt_root

        d, tenant, root = await anyio.to_thread.run_sync(locked)
        # the checkpoint root is listed outside the lock and off the shared worker threads: a tenant's
        # root of 30,000 entries, viewed 40 times at once, holds up no one else (test_isolation)
        d["checkpoint"]["latest_on_disk"] = await svc.latest_listed(tenant, root)
        if d["state"] in ("running", "preempting"):
            dropped = await anyio.to_thread.run_sync(svc.log_dropped, d["id"], d["epoch"], limiter=svc._disk_limiter)
        else:
            dropped = (d.get("last_exit") or {}).get("log_dropped_bytes", 0)
        d["log"] = {"max_bytes": svc.gov.limits.max_log_bytes, "dropped_bytes": dropped}
        return d

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.changing():
            job = svc.own_job(c, job_id)
            svc.sched.cancel(job.id)
            out = {"id": job.id, "state": job.state.value, "substate": job.substate}
        svc.wake.set()
        svc.durable()
        return out

    @app.delete("/jobs/{job_id}")
    def delete(job_id: str, c: Caller = Depends(person)) -> dict[str, Any]:
        return cancel(job_id, c)

    @app.post("/jobs/{job_id}/resize")
    def resize(job_id: str, spec: ResizeSpec, c: Caller = Depends(person)) -> dict[str, Any]:
        """A pending job's gang shape for its next run (it resumes from its committed checkpoint,
        which reshards onto the new number of workers); 409 unless it is pending."""
        with svc.changing():
            job = svc.own_job(c, job_id)
            if job.state is not JobState.PENDING:
                raise HTTPException(409, f"job {job.id!r} is {job.state.value}: only a pending job can be resized")
            try:
                svc.sched.resize(job.id, spec.nodes, spec.gpus_per_node)
            except SchedulerError as e:
                raise _field_error("nodes", str(e)) from None
            out = {"id": job.id, "state": job.state.value, "nodes": job.nodes, "gpus_per_node": job.gpus_per_node}
        svc.wake.set()
        svc.durable()
        return out

    @app.post("/jobs/{job_id}/commits")
    def commit(job_id: str, rep: CommitReport, c: Caller = Depends(caller)) -> JSONResponse:
        if c.role != "job":
            raise HTTPException(403, "only a run's job token reports its commits")
        if c.job != job_id:
            raise HTTPException(403, "this token reports for another job")
        if c.epoch and rep.epoch != c.epoch:
            raise HTTPException(403, f"this token reports for run (epoch) {c.epoch}, not {rep.epoch}")
        with svc.changing():
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
                ok = svc.sched.report_commit(job.id, rep.epoch, rep.progress_s, rep.timing())
            if ok:
                svc.last_commit[job.id] = report
            elif not reason:  # the core refused for a reason its dry run did not give: say so, never ''
                reason = "rejected"
        svc.durable()
        return JSONResponse({"accepted": ok, "reason": reason}, status_code=200 if ok else 409)

    @app.get("/cluster")
    def cluster(c: Caller = Depends(person)) -> dict[str, Any]:
        with svc.lock:
            s = _summary_for(svc, c)
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
            return {"pending": len(pend), "jobs": mine, "summary": _summary_for(svc, c)}

    @app.get(
        "/events",
        responses={
            410: {
                "description": "since is below the log's low-water mark: the event retention deleted events after it"
            },
            429: {"description": "too many event streams open"},
        },
    )
    async def events(
        request: Request,
        since: int | None = Query(None, ge=0, le=MAX_INT),
        limit: int = Query(10000, ge=1, le=100000),
        follow: bool = False,
        c: Caller = Depends(person),
    ) -> Any:
        """The event log as JSONL (the simulator's schema); ``follow`` keeps streaming new records.

        Async: a stream holds no worker thread (its store reads go to a small pool of their own), it
        notices a closed connection within half a second, and streams (followed or not: one that
        is never read holds its place as long as one that follows) are capped per tenant and in total
        (429 beyond). A tenant's stream reads its own rows by the store's (tenant, seq) index, never the
        cluster's whole log. Events the retention deleted are never skipped in silence: without
        ``since`` the log starts at its low-water mark (header ``X-Goodput-First-Seq``), a ``since``
        below it is a 410 naming ``first_seq``, and a stream that falls below it while
        it runs ends with one ``events_pruned`` record saying so (docs/SCHED.md, "Event retention").
        A tenant's mark is its own (the store's: one past the last of its events deleted): other
        tenants' deleted events, which it could never read, cut no tenant's stream."""
        svc.stream_slot(c.tenant, check_only=True)
        tenant = None if c.role == "admin" else c.tenant
        first = await anyio.to_thread.run_sync(
            functools.partial(svc.reader.first_event_seq, tenant), limiter=svc._read_limiter
        )
        if since is None:  # no place asked for: the log as kept, from its low-water mark (in a header)
            since = first - 1
        elif since + 1 < first:
            return JSONResponse(
                {
                    "detail": f"events {since + 1} to {first - 1} were deleted by the event retention (the cluster's "
                    f"limits.event_retention and limits.event_retention_s): the log keeps seq {first} on; ask "
                    f"again with since={first - 1} to read from there",
                    "first_seq": first,
                    "since": since,
                },
                status_code=410,
            )

        def visible(rec: dict[str, Any]) -> bool:
            if c.role == "admin":
                return True
            jid = str(rec.get("job", ""))
            job = svc.sched.jobs.get(jid)
            if job is None:  # removed by the retention of ended jobs: its tenant, if still remembered
                gone = svc.pruned.get(jid)
                return gone is not None and gone[0] == c.tenant
            return job.tenant == c.tenant

        async def gen() -> AsyncIterator[bytes]:
            held = False
            try:
                try:
                    svc.stream_slot(c.tenant)
                except HTTPException:
                    return  # the cap was reached between the check and the start
                held = True
                seq = since
                sent = 0
                while True:
                    want = min(1000, limit - sent)
                    low, last, rows = await anyio.to_thread.run_sync(
                        functools.partial(svc.reader.read_events, seq, want, tenant=tenant), limiter=svc._read_limiter
                    )
                    if seq + 1 < low:  # deleted while this stream was behind: said, and the stream ends
                        gone = {"t": time.time(), "event": PRUNED_EVENT, "first_seq": low, "since": seq}
                        yield (json.dumps(gone, separators=(",", ":")) + "\n").encode()
                        return
                    chunk = []
                    for s, rec in rows:
                        seq = s
                        # the tenant's own rows (the index), still filtered as before: a job's events
                        # are its tenant's, a removed job's only while the service remembers whose it was
                        if visible(rec):
                            sent += 1
                            # its place in the log: what a reader passes as since to go on after it
                            # (a tenant's stream skips other tenants' seqs, so it cannot count them)
                            out = {**svc.redact(c, rec), "seq": s}
                            chunk.append(json.dumps(out, separators=(",", ":")) + "\n")
                    if len(rows) < want:
                        seq = max(seq, last)  # nothing more of ours up to the log's last seq
                    if chunk:
                        yield "".join(chunk).encode()
                    if sent >= limit or (not rows and not follow):
                        return
                    if not rows:
                        for _ in range(5):  # about half a second, listening for the client's going
                            if await request.is_disconnected():
                                return
                            await anyio.sleep(0.1)
            finally:
                if held:
                    svc.stream_slot(c.tenant, release=True)

        return StreamingResponse(gen(), media_type="application/x-ndjson", headers={"X-Goodput-First-Seq": str(first)})

    @app.post("/nodes/{name}/drain")
    def drain(name: str, grace_s: float = Query(30.0, ge=0, le=86400), c: Caller = Depends(admin)) -> dict[str, Any]:
        if not NODE.match(name) or name not in svc.sched.cap.nodes:
            raise HTTPException(404, f"no node {name!r}")
        with svc.changing():
            ask = getattr(svc.executor, "node_request", None)  # Slurm: the drain is goodput's own now
            if ask is not None and (why := ask(name, "drain")):
                raise HTTPException(409, why)
            svc.sched.reclaim_notice([name], svc.sched.clock.now() + grace_s, why="node_loss")
            health = svc.sched.cap.nodes[name].health.value
        svc.wake.set()
        svc.durable()
        return {"node": name, "health": health}

    @app.post("/nodes/{name}/up")
    def up(name: str, c: Caller = Depends(admin)) -> dict[str, Any]:
        if not NODE.match(name) or name not in svc.sched.cap.nodes:
            raise HTTPException(404, f"no node {name!r}")
        with svc.changing():
            ask = getattr(svc.executor, "node_request", None)  # Slurm: refused while Slurm holds the node
            if ask is not None and (why := ask(name, "up")):
                raise HTTPException(409, why)
            svc.sched.node_up([name])
        svc.wake.set()
        svc.durable()
        return {"node": name, "health": Health.UP.value}

    @app.get("/stats")
    def stats(
        since: float = Query(0.0, ge=0, le=1e11, allow_inf_nan=False), c: Caller = Depends(admin)
    ) -> dict[str, Any]:
        """Scheduling passes of the loop thread that ended at or after ``since`` (unix seconds): how long
        each held the lock (advance + tick + their store commits) and how long it waited for it."""
        rows = [r for r in list(svc.pass_times) if r[0] >= since]
        return {
            "passes": len(rows),
            "pass_ms": _dist([r[1] for r in rows]),
            "lock_wait_ms": _dist([r[2] for r in rows]),
            "kept": svc.pass_times.maxlen,
        }

    @app.get("/service")
    async def service(c: Caller = Depends(admin)) -> dict[str, Any]:
        """For the operator: how this process started (restored, adopted runs), whom jobs run as."""
        return {
            "restored": svc.restored,
            "adopted": svc.adopted,
            "state_dir": str(svc.state_dir),
            "runs_as": svc.me.user,
            "notes": svc.startup_notes(),
            "degraded": svc.degraded or None,
            "streams": dict(svc._streams),
        }

    @app.get("/healthz", responses={503: {"description": "down"}})
    async def healthz() -> JSONResponse:
        """Up or down, nothing else (no job, tenant or count is disclosed without a token); async and
        lock-free, so it answers while every worker thread is busy."""
        up = not svc.degraded and svc._loop.is_alive()
        return JSONResponse({"ok": up}, status_code=200 if up else 503)

    from ..ui import router as ui_router  # the dashboard at /ui (docs/DASHBOARD.md), behind the same tokens

    app.include_router(ui_router(svc, person))

    @app.exception_handler(SchedulerError)
    def _sched_error(request: Request, exc: SchedulerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        """422 naming the field, without echoing the input: a lone surrogate in it cannot be encoded
        (FastAPI's own handler would answer 500), and a 30 MB value need not come back."""
        detail = [
            {
                "loc": [_printable(x) for x in e.get("loc", ())],
                "msg": _printable(e.get("msg", "")),
                "type": e.get("type"),
            }
            for e in exc.errors()[:20]
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(RecursionError)
    def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return JSONResponse({"detail": "the request body is nested too deeply"}, status_code=400)

    return app


def _printable(x: Any) -> Any:
    """``x`` if JSON can carry it as UTF-8, else with the offending characters escaped (bounded)."""
    if isinstance(x, int):
        return x
    return str(x)[:200].encode("utf-8", "backslashreplace").decode("utf-8")


def _dist(xs: list[float]) -> dict[str, float | None]:
    """p50 / p99 / max / mean in milliseconds of durations in seconds (nearest rank; None when empty)."""
    if not xs:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    xs = sorted(xs)

    def pct(q: float) -> float:
        return 1000 * xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]

    return {"p50": pct(0.50), "p99": pct(0.99), "max": 1000 * xs[-1], "mean": 1000 * sum(xs) / len(xs)}


def local_pools(nodes: int, gpus_per_node: int, name: str = "local") -> list[Pool]:
    from ..core.model import PoolKind

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
    governance: Governance | None = None,
    allow_root_jobs: bool = False,
    rate_per_s: float = 100.0,
    on_start: Any = None,
    max_user_procs: int | None = None,
) -> None:
    """Run the service until interrupted (uvicorn in this thread). Files it creates are private
    (umask 077): the store, the state directory, logs and run records."""
    import uvicorn

    os.umask(0o077)
    svc = Service(
        db,
        pools,
        state_dir=state_dir,
        url=f"http://{host}:{port}",
        tick_s=tick_s,
        executor=executor,
        executor_options=executor_options,
        governance=governance,
        allow_root_jobs=allow_root_jobs,
        rate_per_s=rate_per_s,
        rate_burst=2 * rate_per_s,
        max_user_procs=max_user_procs,
    )
    if on_start is not None:
        on_start(svc.startup_notes())
    svc.start(notes=on_start is None)
    try:
        # h11, not httptools: httptools buffers a header block of any size (4 connections of 100 MiB
        # of unfinished headers grew the service by 400 MB, no token needed); h11 refuses one past
        # MAX_HEADER_BYTES with a 400 and closes the connection
        uvicorn.run(
            create_app(svc),
            host=host,
            port=port,
            log_level="warning",
            http="h11",
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
    finally:
        svc.close()


__all__ = ["Service", "create_app", "local_pools", "new_token", "serve"]
