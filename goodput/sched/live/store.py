"""The scheduler's persistence: its records, a little metadata and the event log, in SQLite or PostgreSQL.

The scheduler keeps nothing else (its indices are rebuilt from the records on restart), so the store's one
promise is that a SIGKILL at any instant loses or doubles nothing: each scheduler step hands its changed
records, metadata and events to :meth:`Store.commit`, which writes them in ONE transaction that is durable
when it returns (SQLite: WAL with synchronous=FULL; PostgreSQL: its own commit). A restart therefore reads
the state after some whole number of steps, never a torn one.

A SQLite store opened with ``deferred_sync=True`` (the live service's) splits the commit in two: the
transaction is written to the WAL when :meth:`Store.commit` returns (synchronous=NORMAL: safe against a
SIGKILL of the process, which leaves the written WAL to the OS), and it is durable against power loss
once :meth:`Store.sync` returns, which fsyncs the WAL once for every commit made before it: concurrent
callers share one fsync (group commit), and the caller does it after releasing its own locks. The
service calls it before it answers any request that changed state and after each scheduling pass, so
what it acknowledges is as durable as with synchronous=FULL; only the fsync moved out of its lock.

Bodies are JSON text, never pickles, because storage is not trusted: a row that does not decode into its
record is an error naming the table and key, not code run. Records go through msgspec, which is what makes a
100,000-job first commit take seconds rather than minutes. JSON has no infinity and msgspec writes one as
``null``, which would lose a preempting job's ``deadline_s``; a non-finite float is therefore stored as the
string ``"inf"``, ``"-inf"`` or ``"nan"`` and turned back into a float where the record's type says a float
goes (nowhere else, so a string field that happens to read "inf" stays a string). Events and metadata are
free-form, so they use the event log's own encoding (:func:`json.dumps` with ``Infinity`` tokens): a stored
event is byte for byte the line :mod:`goodput.sched.core.events` writes to JSONL. For the same reason bodies are
TEXT in PostgreSQL too, not JSONB, which would reorder keys and refuse ``Infinity``.

URLs follow SQLAlchemy's spelling: ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` (so
``f"sqlite:///{path}"`` works for either), ``sqlite://:memory:``, a bare file path, or
``postgresql://user@host:port/db``. psycopg is imported only for the latter, so SQLite users need not
install it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import msgspec.inspect as mi

from goodput.sched.core.model import TERMINAL, Job, Node, Tenant

# 2: events carry their job's tenant, the log a low-water mark (retention); 3: each tenant a mark of its own
SCHEMA_VERSION = 3
WAL_KEEP_BYTES = 4 << 20  # SQLite: what a WAL is truncated to once checkpointed (journal_size_limit)
_ENDED_STATES = frozenset(s.value for s in TERMINAL)  # a job row in one of these states has ended
# tokens columns added after schema 1 shipped (ALTER TABLE ... ADD COLUMN on open, both dialects)
_TOKEN_COLUMNS = (("prefix", "TEXT NOT NULL DEFAULT ''"), ("expires", "REAL"), ("revoked", "REAL"))
_VERSION_KEY = "schema_version"
# meta key of the event log's low-water mark: the first seq still kept (1 until the live service's event
# retention first deletes some); seq numbers go on from above it, never reused (Store.prune_events)
_FIRST_SEQ_KEY = "events_first_seq"
# meta key of the global mark when the per-tenant marks began (schema 3): a tenant's mark is never below it,
# since what a store pruned before then is not known per tenant
_TENANT_MARKS_KEY = "events_tenant_marks_from"
# meta keys that belong to the store, not its caller
_STORE_KEYS = frozenset((_VERSION_KEY, _FIRST_SEQ_KEY, _TENANT_MARKS_KEY))
_MIGRATE_BATCH = 10_000  # events read at a time while an old events table gains its tenant column
# pg_advisory_xact_lock key: serialises writers so that "next seq = max + 1" cannot race
_PG_LOCK_KEY = 0x676F6F64707574  # "goodput"


class StoreError(Exception):
    """What a store refuses to do, as opposed to a bug in the caller (TypeError / ValueError)."""


class CorruptRecord(StoreError):
    """A stored row does not decode: storage was damaged or written by something else."""

    def __init__(self, table: str, key: Any, reason: str) -> None:
        self.table = table
        self.key = key
        super().__init__(f"corrupt row in {table!r} at key {key!r}: {reason}")


class SchemaError(StoreError):
    """The store was written by a goodput this code cannot read safely."""


class StoreUnavailable(StoreError):
    """The database refused or could not take the transaction now (locked past the busy timeout by
    another process, read-only, disk full, connection lost): nothing of it was written, and the same
    call may succeed later. The live service answers 503 with Retry-After."""


@dataclass
class Snapshot:
    """Everything a restarting scheduler needs; ``events`` in commit order, without their seq numbers:
    the retained ones, the first of which has seq ``first_seq`` (the low-water mark)."""

    jobs: dict[str, Job] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    first_seq: int = 1


@dataclass
class _Staged:
    """What :meth:`Store.along` hands the next commit."""

    commits: list[tuple[str, str]] = field(default_factory=list)
    keys: list[tuple[str, str, str, str]] = field(default_factory=list)
    envs: list[tuple[str, str]] = field(default_factory=list)
    written: bool = False


# ---------------------------------------------------------------------------------------------------------
# encoding

_ENCODER = msgspec.json.Encoder()


def _spell_nonfinite(v: Any) -> Any:
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return _spelled(v)
    if isinstance(v, dict):
        return {k: _spell_nonfinite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_spell_nonfinite(x) for x in v]
    return v


def _spelled(v: float) -> str:
    return "nan" if v != v else ("inf" if v > 0 else "-inf")


def _float_paths(t: mi.DataclassType, prefix: tuple[str, ...] = (), seen: frozenset = frozenset()):
    for f in t.fields:
        if isinstance(f.type, mi.FloatType):
            yield (*prefix, f.name)
        elif isinstance(f.type, mi.DataclassType) and f.type.cls not in seen:
            yield from _float_paths(f.type, (*prefix, f.name), seen | {t.cls})


class _FloatPlan:
    """Where a record type keeps its floats (nested records too), read in one C call: most records are
    finite or have one infinity, and a per-field Python walk over 100,000 jobs costs seconds."""

    def __init__(self, t: mi.DataclassType) -> None:
        self.paths = tuple(_float_paths(t))
        self._get = attrgetter(*(".".join(p) for p in self.paths)) if self.paths else None

    def spell(self, rec: Any) -> dict[str, Any] | None:
        """``rec`` as builtins with its non-finite floats spelled out, or None when it has none."""
        if self._get is None:
            return None
        try:
            values = self._get(rec)
            if len(self.paths) == 1:
                values = (values,)
            if math.isfinite(sum(values)):  # a sum that overflows only sends us down the exact path
                return None
        except (TypeError, AttributeError, OverflowError):
            return None  # not numbers where floats go: encoding or the null check deals with it
        out = msgspec.to_builtins(rec)
        for path, v in zip(self.paths, values):
            if isinstance(v, float) and not math.isfinite(v):
                node = out
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = _spelled(v)
        return out


class _RecordCodec:
    """One record type's body <-> object, with the table and key named in every complaint."""

    def __init__(self, typ: type, table: str, key_attr: str) -> None:
        self.type = typ
        self.table = table
        self.key_attr = key_attr
        # lax: a spelled-out "inf" is read back as a float, but only where the type puts a float (a str
        # field holding "inf" stays a str); its price is also taking "5" for an int, still a well-typed record
        self._decoder = msgspec.json.Decoder(typ, strict=False)
        self._plan = _FloatPlan(mi.type_info(typ))
        # fields a record written before them lacks, whose default is not the zero of its type: a
        # compiled (mypyc) class gives msgspec no default, so an absent field would read 0, not this
        self._late: list[tuple[str, bytes, Any]] = [
            (f.name, f'"{f.name}":'.encode(), f.default)
            for f in dataclasses.fields(typ)
            if f.default is not dataclasses.MISSING and isinstance(f.default, (int, float, str)) and f.default
        ]

    def encode(self, rec: Any) -> str:
        if not isinstance(rec, self.type):
            raise TypeError(f"{self.table}: expected a {self.type.__name__}, got {type(rec).__name__}")
        spelled = self._plan.spell(rec)
        body = _ENCODER.encode(rec if spelled is None else spelled)
        # msgspec writes a non-finite float as null: one the plan does not reach (inside a container) needs
        # the full walk; a string holding "null" only costs the walk for nothing
        if b"null" in body:
            body = _ENCODER.encode(_spell_nonfinite(msgspec.to_builtins(rec)))
        return body.decode()

    def decode(self, key: Any, body: Any) -> Any:
        if not isinstance(body, (str, bytes)):
            raise CorruptRecord(self.table, key, f"body is {type(body).__name__}, not JSON text")
        try:
            rec = self._decoder.decode(body)
        except msgspec.ValidationError as e:
            raise CorruptRecord(self.table, key, f"does not decode as {self.type.__name__}: {e}") from None
        except msgspec.DecodeError as e:
            raise CorruptRecord(self.table, key, f"not JSON: {e}") from None
        raw = body.encode() if isinstance(body, str) else body
        for name, spelled, default in self._late:
            if spelled not in raw:
                setattr(rec, name, default)
        if getattr(rec, self.key_attr) != key:
            raise CorruptRecord(
                self.table, key, f"body is for {self.key_attr} {getattr(rec, self.key_attr)!r}, not the row's key"
            )
        return rec


_JOBS = _RecordCodec(Job, "jobs", "id")
_NODES = _RecordCodec(Node, "nodes", "name")
_TENANTS = _RecordCodec(Tenant, "tenants", "name")


def encode_job(job: Job) -> str:
    """The job's stored body: what a caller checks before changing anything, so a record the store
    cannot write (a lone surrogate, an integer past 64 bits) is refused first, not found at the commit."""
    return _JOBS.encode(job)


def _json_default(o: Any) -> Any:
    if isinstance(o, Enum):
        return o.value
    return msgspec.to_builtins(o)  # dataclasses, structs...; TypeError for what JSON cannot hold


def _dumps(v: Any) -> str:
    # the event log's own spelling (events.py), so a stored event is its JSONL line; one encoder for
    # all calls (json.dumps with arguments builds a new one each time, several per commit)
    return _EVENT_ENCODER.encode(v)


_EVENT_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_json_default)


def _loads(table: str, key: Any, body: Any) -> Any:
    if not isinstance(body, (str, bytes)):
        raise CorruptRecord(table, key, f"body is {type(body).__name__}, not JSON text")
    try:
        return json.loads(body)
    except ValueError as e:
        raise CorruptRecord(table, key, f"not JSON: {e}") from None


def _enum_value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def _redact(url: str) -> str:
    """The URL minus its password, for messages that may end up in logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------------------------------------------------
# the store


class Store:
    """The SQL both backends share; a dialect subclass supplies connection, transactions and types.

    Safe to share between threads (one lock around the one connection): a service may stream
    :meth:`events_since` from one thread while the scheduler commits from another.
    """

    # dialect knobs
    dialect = "?"
    seq_type = "INTEGER"
    text_order = ""  # collation clause that makes key order byte order, as in SQLite and Python

    deferred_sync = False  # commit() durable on return; else once sync() returns (SQLite's open())

    def __init__(self, url: str, conn: Any) -> None:
        self.url = url
        self._conn = conn
        self._lock = threading.RLock()
        self._commits = 0  # write transactions committed (counted under _lock), for sync()
        self._synced = 0  # of those, how many sync() has made durable
        self._syncing = False
        self._sync_cv = threading.Condition(threading.Lock())
        self._staged = threading.local()  # Store.along's rows, per thread
        self._closed = False
        # called after each commit() with the (job id, tenant) of the job rows it wrote in an ended
        # state (the live service's retention notices ends so, without scanning its jobs); None: nobody
        self.on_ended: Any = None
        try:
            self._prepare()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    # -- dialect hooks -------------------------------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return sql

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        raise NotImplementedError
        yield

    def _table_exists(self, cur: Any, name: str) -> bool:
        raise NotImplementedError

    def _columns(self, cur: Any, table: str) -> set[str]:
        raise NotImplementedError

    # -- schema --------------------------------------------------------------------------------------------

    def _ddl(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, tenant TEXT NOT NULL,"
            " body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, body TEXT NOT NULL)",
            # tenant: the tenant of the job the event names ('' for node events and jobs the store does not
            # hold), so that a tenant's GET /events reads its own rows by the (tenant, seq) index
            f"CREATE TABLE IF NOT EXISTS events (seq {self.seq_type} PRIMARY KEY, body TEXT NOT NULL,"
            " tenant TEXT NOT NULL DEFAULT '')",
            # per job, how many of its event records the event retention deleted (its view's history_dropped)
            "CREATE TABLE IF NOT EXISTS events_pruned (job TEXT PRIMARY KEY, n BIGINT NOT NULL)",
            # per tenant, the last seq of its own events the retention deleted: a tenant's reader has lost
            # events only below its own mark, never because other tenants' events went
            "CREATE TABLE IF NOT EXISTS events_tenant_pruned (tenant TEXT PRIMARY KEY, last_seq BIGINT NOT NULL)",
            # the service's bearer tokens, by their sha256 only: a leaked store leaks no usable token
            "CREATE TABLE IF NOT EXISTS tokens (hash TEXT PRIMARY KEY, tenant TEXT NOT NULL, role TEXT NOT NULL,"
            " job TEXT NOT NULL, created REAL NOT NULL)",
            # the Unix user each tenant's jobs run as (goodput sched token add NAME --user USER)
            "CREATE TABLE IF NOT EXISTS tenant_users (tenant TEXT PRIMARY KEY, unix_user TEXT NOT NULL)",
            # the service's own settings that a restart must agree with (its state directory)
            "CREATE TABLE IF NOT EXISTS service_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            # a job's own environment variables (its spec's ``env``), stored with its submission
            "CREATE TABLE IF NOT EXISTS job_envs (job TEXT PRIMARY KEY, body TEXT NOT NULL)",
            # the service's own facts about a job, written in the transaction of the step they belong to
            # (Store.along): the last accepted commit report, and the client's idempotency key of a submission
            "CREATE TABLE IF NOT EXISTS commits (job TEXT PRIMARY KEY, body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS job_keys (tenant TEXT NOT NULL, key TEXT NOT NULL, job TEXT NOT NULL,"
            " spec TEXT NOT NULL, PRIMARY KEY (tenant, key))",
            # Store.retire deletes a pruned job's key by its job id
            "CREATE INDEX IF NOT EXISTS job_keys_job ON job_keys (job)",
        ]

    def _prepare(self) -> None:
        """Create what is missing; refuse, before touching anything, a schema from a newer goodput;
        migrate one from an older goodput (schema 1: its events gain their tenant; schema 2: its tenants
        gain marks of their own, from the log's mark as it stands, below)."""
        with self._transaction(write=True) as cur:
            version = None
            marks_new = not self._table_exists(cur, "events_tenant_pruned")
            if self._table_exists(cur, "meta"):
                cur.execute(self._sql("SELECT value FROM meta WHERE key = ?"), (_VERSION_KEY,))
                row = cur.fetchone()
                if row is not None:
                    version = self._check_version(row[0])
            for ddl in self._ddl():
                cur.execute(ddl)
            # columns added to the tokens table after schema 1 shipped: a store made before them gains them
            have = self._columns(cur, "tokens")
            for col, typ in _TOKEN_COLUMNS:
                if col not in have:
                    cur.execute(f"ALTER TABLE tokens ADD COLUMN {col} {typ}")
            # schema 2: each event carries its job's tenant, and the log's low-water mark may be raised
            # (Store.prune_events). A schema 1 store gains the column, and its events without a tenant
            # are given their job's: all of them, or (a store the retention wrote while still schema
            # 1) those a previous goodput appended. A previous goodput refuses a schema 2 store: it
            # would append events no tenant sees, and number them from 1 again once the log was
            # pruned empty.
            added = "tenant" not in self._columns(cur, "events")
            if added:
                cur.execute("ALTER TABLE events ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
            if added or (version is not None and version < SCHEMA_VERSION):
                self._fill_event_tenants(cur)
            cur.execute("CREATE INDEX IF NOT EXISTS events_tenant ON events (tenant, seq)")
            if marks_new:  # schema 3: tenants' marks start here; what went before is not known per tenant
                cur.execute(
                    self._sql("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                    (_TENANT_MARKS_KEY, json.dumps(self._first_seq(cur))),
                )
            cur.execute(
                self._sql(
                    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                (_VERSION_KEY, json.dumps(SCHEMA_VERSION)),
            )

    def _fill_event_tenants(self, cur: Any) -> None:
        """The tenant column of every stored event that has none (a migration from schema 1, once): the
        tenant of the job it names as the jobs table has it; '' where none (node events, jobs already
        removed)."""
        cur.execute("SELECT id, tenant FROM jobs")
        owner = {str(k): str(t) for k, t in cur.fetchall()}
        if not owner:
            return
        after = 0
        while True:
            cur.execute(self._sql("SELECT seq, body FROM events WHERE tenant = '' AND seq > ? ORDER BY seq LIMIT ?"),
                        (after, _MIGRATE_BATCH))  # fmt: skip
            rows = cur.fetchall()
            if not rows:
                return
            sets = []
            for seq, body in rows:
                ev = _loads("events", seq, body)
                t = owner.get(ev.get("job")) if isinstance(ev, dict) and isinstance(ev.get("job"), str) else None
                if t:
                    sets.append((t, seq))
            if sets:
                cur.executemany(self._sql("UPDATE events SET tenant = ? WHERE seq = ?"), sets)
            after = int(rows[-1][0])

    def _check_version(self, raw: Any) -> int:
        try:
            version = json.loads(raw)
        except (TypeError, ValueError):
            version = None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SchemaError(f"{_redact(self.url)}: schema_version {raw!r} is not a positive integer")
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"{_redact(self.url)}: schema_version {version} is newer than this goodput knows "
                f"({SCHEMA_VERSION}); upgrade goodput to open this store"
            )
        return version  # older: _prepare migrates it (1 -> 2: the events' tenant column; 2 -> 3: tenants' marks)

    # -- reading -------------------------------------------------------------------------------------------

    def load(self) -> Snapshot:
        """All state, read in one transaction so that a concurrent commit is either wholly in it or not."""
        snap = Snapshot()
        with self._use(), self._transaction(write=False) as cur:
            order = self.text_order
            cur.execute(f"SELECT id, body FROM jobs ORDER BY id{order}")
            snap.jobs = {k: _JOBS.decode(k, b) for k, b in cur.fetchall()}
            cur.execute(f"SELECT name, body FROM nodes ORDER BY name{order}")
            snap.nodes = {k: _NODES.decode(k, b) for k, b in cur.fetchall()}
            cur.execute(f"SELECT name, body FROM tenants ORDER BY name{order}")
            snap.tenants = {k: _TENANTS.decode(k, b) for k, b in cur.fetchall()}
            cur.execute(f"SELECT key, value FROM meta ORDER BY key{order}")
            snap.meta = {k: _loads("meta", k, v) for k, v in cur.fetchall() if k not in _STORE_KEYS}
            first = snap.first_seq = self._first_seq(cur)
            # only what the event retention kept: every row from the low-water mark on
            cur.execute("SELECT seq, body FROM events ORDER BY seq")
            rows = cur.fetchall()
        snap.events = [self._event(expect, seq, body) for expect, (seq, body) in enumerate(rows, first)]
        return snap

    def _first_seq(self, cur: Any) -> int:
        """The low-water mark (in the caller's transaction): the first seq the log still keeps."""
        return self._meta_seq(cur, _FIRST_SEQ_KEY)

    def _meta_seq(self, cur: Any, key: str) -> int:
        cur.execute(self._sql("SELECT value FROM meta WHERE key = ?"), (key,))
        row = cur.fetchone()
        if row is None:
            return 1
        v = _loads("meta", key, row[0])
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CorruptRecord("meta", key, f"the events' low-water mark is {v!r}, not a positive integer")
        return v

    def _tenant_first_seq(self, cur: Any, tenant: str) -> int:
        """A tenant's own low-water mark (in the caller's transaction): one past the last of its events
        the retention deleted. Below it the tenant has lost events; between it and the log's mark only
        other tenants' went, which it could never read."""
        cur.execute(self._sql("SELECT last_seq FROM events_tenant_pruned WHERE tenant = ?"), (tenant,))
        row = cur.fetchone()
        own = int(row[0]) + 1 if row is not None else 1
        return max(own, self._meta_seq(cur, _TENANT_MARKS_KEY))

    def _next_seq(self, cur: Any, first: int | None = None) -> int:
        """The seq the next event gets (in the caller's transaction): never one used before, even once
        every row below it was pruned. ``first``: the low-water mark, where the caller read it."""
        cur.execute("SELECT MAX(seq) FROM events")
        top = cur.fetchone()[0]
        if first is None:
            first = self._first_seq(cur)
        return max(first, int(top) + 1) if top is not None else first

    @staticmethod
    def _event(expect: int, seq: int, body: Any) -> dict[str, Any]:
        # commits append first, first + 1, ... with no gaps (first: the low-water mark, 1 until the event
        # retention prunes); a gap, or a row below the mark, means rows were removed behind our back
        if seq != expect:
            raise CorruptRecord("events", seq, f"sequence gap: expected seq {expect}")
        ev = _loads("events", seq, body)
        if not isinstance(ev, dict):
            raise CorruptRecord("events", seq, f"not a JSON object but {type(ev).__name__}")
        return ev

    def events_since(self, seq: int, limit: int, *, tenant: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``limit`` events with a sequence number above ``seq``: pass the last one seen to resume.
        ``tenant``: only the events of that tenant's jobs (the tenant column's index, not a scan)."""
        return self.read_events(seq, limit, tenant=tenant)[2]

    def read_events(
        self, seq: int, limit: int, *, tenant: str | None = None
    ) -> tuple[int, int, list[tuple[int, dict[str, Any]]]]:
        """:meth:`events_since`, with the low-water mark (the log's, or with ``tenant`` that tenant's:
        :meth:`first_event_seq`) and the log's last seq, read in the same transaction: a reader whose
        ``seq + 1`` is below the mark has lost events in between to the event retention, and one given
        fewer than ``limit`` rows has seen everything of its own up to the last seq (it may resume
        from there)."""
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        with self._use(), self._transaction(write=False) as cur:
            first = self._first_seq(cur)
            last = self._next_seq(cur, first) - 1
            if tenant is not None:
                first = self._tenant_first_seq(cur, tenant)
            if tenant is None:
                cur.execute(self._sql("SELECT seq, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?"), (seq, limit))
            else:
                cur.execute(
                    self._sql("SELECT seq, body FROM events WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?"),
                    (tenant, seq, limit),
                )
            rows = cur.fetchall()
        out = []
        for s, body in rows:
            ev = _loads("events", s, body)
            if not isinstance(ev, dict):
                raise CorruptRecord("events", s, f"not a JSON object but {type(ev).__name__}")
            out.append((s, ev))
        return first, last, out

    def event_count(self) -> int:
        """The last sequence number: the count of events ever appended (pruned ones included), since
        the log is append-only from 1 and a seq is never reused."""
        with self._use(), self._transaction(write=False) as cur:
            return self._next_seq(cur) - 1

    def first_event_seq(self, tenant: str | None = None) -> int:
        """The low-water mark: the first seq the log still keeps (1 until :meth:`prune_events`); with
        ``tenant``, that tenant's own: one past the last of its events deleted (never below the
        log's mark when this store first kept tenants' marks)."""
        with self._use(), self._transaction(write=False) as cur:
            return self._first_seq(cur) if tenant is None else self._tenant_first_seq(cur, tenant)

    def events_pruned(self) -> dict[str, int]:
        """job id -> how many of its event records :meth:`prune_events` deleted (jobs still stored)."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT job, n FROM events_pruned")
            return {str(k): int(n) for k, n in cur.fetchall()}

    def has_nodes(self) -> bool:
        """Whether a scheduler ever saved its nodes here (a restart restores; else a first start)."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT 1 FROM nodes LIMIT 1")
            return cur.fetchone() is not None

    def prune_events(self, first_keep: int, pruned: dict[str, int] | None = None) -> int:
        """The live service's event retention, in one transaction: every event below ``first_keep``
        deleted (never past the next seq: the log's numbering goes on from where it was), the
        low-water mark raised to it, and ``pruned`` (job id -> how many of that job's records
        went) added to the per-job counts :meth:`events_pruned` reads. The new mark. A caller bounds
        a batch by the ``first_keep`` it asks for (the rows below it are first_keep - mark)."""
        if isinstance(first_keep, bool) or not isinstance(first_keep, int):
            raise TypeError(f"first_keep is a seq (int), got {first_keep!r}")
        counts = [(str(k), int(n)) for k, n in (pruned or {}).items() if n > 0]
        with self._use(), self._transaction(write=True) as cur:
            first = self._first_seq(cur)
            upto = min(first_keep, self._next_seq(cur, first))
            if upto <= first:
                return first
            cur.execute(
                self._sql("SELECT tenant, MAX(seq) FROM events WHERE seq < ? AND tenant <> '' GROUP BY tenant"), (upto,)
            )
            marks = [(str(t), int(m)) for t, m in cur.fetchall()]
            if marks:  # seqs only grow: a later batch's last is above every earlier one
                cur.executemany(
                    self._sql(
                        "INSERT INTO events_tenant_pruned (tenant, last_seq) VALUES (?, ?)"
                        " ON CONFLICT (tenant) DO UPDATE SET last_seq = excluded.last_seq"
                    ),
                    marks,
                )
            cur.execute(self._sql("DELETE FROM events WHERE seq < ?"), (upto,))
            cur.execute(
                self._sql(
                    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                (_FIRST_SEQ_KEY, json.dumps(upto)),
            )
            if counts:
                cur.executemany(
                    self._sql(
                        "INSERT INTO events_pruned (job, n) VALUES (?, ?)"
                        " ON CONFLICT (job) DO UPDATE SET n = events_pruned.n + excluded.n"
                    ),
                    counts,
                )
            return upto

    # -- writing -------------------------------------------------------------------------------------------

    def commit(
        self,
        *,
        jobs: Iterable[Job] = (),
        nodes: Iterable[Node] = (),
        tenants: Iterable[Tenant] = (),
        meta: dict[str, Any] | None = None,
        events: Iterable[dict[str, Any]] = (),
        delete_jobs: Iterable[str] = (),
    ) -> None:
        """One scheduler step, all or nothing, durable on return.

        Records are upserted (a record given twice: the last wins), meta keys are upserted, events get the
        next sequence numbers in order. Deletions apply after the upserts, so a job both changed and deleted
        in the step ends up deleted. Everything is encoded before the transaction opens, so an unencodable
        record fails the call without holding the write lock.
        """
        if isinstance(delete_jobs, str):
            raise TypeError("delete_jobs takes job ids, not one string")
        job_rows = []
        for j in jobs:
            body = _JOBS.encode(j)
            job_rows.append((j.id, _enum_value(j.state), j.tenant, body))
        node_rows = [(n.name, _NODES.encode(n)) for n in self._records(nodes, Node)]
        tenant_rows = [(t.name, _TENANTS.encode(t)) for t in self._records(tenants, Tenant)]
        meta_rows = []
        for k, v in (meta or {}).items():
            if not isinstance(k, str):
                raise TypeError(f"meta keys are strings, got {k!r}")
            if k in _STORE_KEYS:
                raise ValueError(f"meta key {k!r} belongs to the store")
            meta_rows.append((k, _dumps(v)))
        event_bodies = []
        for ev in events:
            if not isinstance(ev, dict):
                raise TypeError(f"an event is a dict, got {type(ev).__name__}")
            jid = ev.get("job")
            event_bodies.append((_dumps(ev), jid if isinstance(jid, str) else "", None))
        if event_bodies and job_rows:  # the tenant of a job the step wrote: no lookup at the append
            owner = {r[0]: r[2] for r in job_rows}
            event_bodies = [(b, j, owner.get(j)) for b, j, _t in event_bodies]
        dels = []
        for k in delete_jobs:
            if not isinstance(k, str):
                raise TypeError(f"delete_jobs takes job ids (str), got {k!r}")
            dels.append((k,))
        staged: _Staged | None = getattr(self._staged, "rows", None)
        commit_rows = list(staged.commits) if staged is not None else []
        key_rows = list(staged.keys) if staged is not None else []
        env_rows = list(staged.envs) if staged is not None else []
        if (
            not (job_rows or node_rows or tenant_rows or meta_rows or event_bodies or dels or commit_rows or key_rows)
            and not env_rows
        ):
            return
        with self._use(), self._transaction(write=True) as cur:
            self._upsert(cur, "jobs", ("id", "state", "tenant", "body"), job_rows)
            self._upsert(cur, "nodes", ("name", "body"), node_rows)
            self._upsert(cur, "tenants", ("name", "body"), tenant_rows)
            self._upsert(cur, "meta", ("key", "value"), meta_rows)
            self._upsert(cur, "commits", ("job", "body"), commit_rows)
            self._upsert(cur, "job_envs", ("job", "body"), env_rows)
            if key_rows:  # never an upsert: a key names one submission for good (the service checks first)
                cur.executemany(
                    self._sql("INSERT INTO job_keys (tenant, key, job, spec) VALUES (?, ?, ?, ?)"), key_rows
                )
            if dels:
                cur.executemany(self._sql("DELETE FROM jobs WHERE id = ?"), dels)
                cur.executemany(self._sql("DELETE FROM commits WHERE job = ?"), dels)
                cur.executemany(self._sql("DELETE FROM job_keys WHERE job = ?"), dels)
                cur.executemany(self._sql("DELETE FROM job_envs WHERE job = ?"), dels)
            self._append_events(cur, event_bodies)
        if staged is not None:  # once: a second commit in the same block writes them no more
            staged.written = True
            staged.commits.clear()
            staged.keys.clear()
            staged.envs.clear()
        hook = self.on_ended
        if hook is not None:
            ended = [(r[0], r[2]) for r in job_rows if r[1] in _ENDED_STATES]
            if ended:
                hook(ended)

    def retire(self, *, trimmed: Iterable[Job] = (), pruned: Iterable[str] = ()) -> None:
        """The live service's retention of ended jobs, in one transaction: the ``trimmed`` jobs'
        records rewritten (their command already cut short) and their environment rows deleted, and
        every row of the ``pruned`` jobs deleted (record, commit report, idempotency key, environment).
        Their events stay (the event retention, :meth:`prune_events`, bounds the log); their counts of
        pruned events go. Nothing is reported to ``on_ended``."""
        rows = [(j.id, _enum_value(j.state), j.tenant, _JOBS.encode(j)) for j in self._records(trimmed, Job)]
        dels = [(str(k),) for k in pruned]
        if not rows and not dels:
            return
        with self._use(), self._transaction(write=True) as cur:
            self._upsert(cur, "jobs", ("id", "state", "tenant", "body"), rows)
            if rows:
                cur.executemany(self._sql("DELETE FROM job_envs WHERE job = ?"), [(r[0],) for r in rows])
            if dels:
                for table, key in (
                    ("jobs", "id"),
                    ("commits", "job"),
                    ("job_keys", "job"),
                    ("job_envs", "job"),
                    ("events_pruned", "job"),
                ):
                    cur.executemany(self._sql(f"DELETE FROM {table} WHERE {key} = ?"), dels)

    # -- the service's facts about jobs (goodput.sched.live.service) --------------------------------------------

    @contextmanager
    def along(
        self,
        *,
        commits: dict[str, dict[str, Any]] | None = None,
        keys: Iterable[tuple[str, str, str, str]] = (),
        envs: dict[str, dict[str, str]] | None = None,
    ) -> Iterator[_Staged]:
        """Rows that the next :meth:`commit` made by this thread inside the block writes in its own
        transaction: ``commits`` (job id -> its last accepted commit report) and ``keys`` ((tenant,
        idempotency key, job id, spec digest) of a submission) and ``envs`` (job id -> its spec's
        environment variables). So a service killed at any instant has
        the job's step and these facts both or neither. Rows not written by the end of the block are
        dropped (the step was refused before it reached the store); ``.written`` says which."""
        rows = _Staged(
            commits=[(k, _dumps(v)) for k, v in (commits or {}).items()],
            keys=[(str(t), str(k), str(j), str(s)) for t, k, j, s in keys],
            envs=[(k, _dumps(v)) for k, v in (envs or {}).items()],
        )
        if getattr(self._staged, "rows", None) is not None:
            raise RuntimeError("Store.along does not nest")
        self._staged.rows = rows
        try:
            yield rows
        finally:
            self._staged.rows = None

    def last_commits(self) -> dict[str, dict[str, Any]]:
        """job id -> the last accepted commit report the service stored with it."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute(f"SELECT job, body FROM commits ORDER BY job{self.text_order}")
            rows = cur.fetchall()
        return {str(k): _loads("commits", k, b) for k, b in rows}

    def job_envs(self) -> dict[str, dict[str, str]]:
        """job id -> the environment variables its spec gave (only jobs that gave some)."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT job, body FROM job_envs")
            rows = cur.fetchall()
        out: dict[str, dict[str, str]] = {}
        for k, b in rows:
            env = _loads("job_envs", k, b)
            if not isinstance(env, dict) or not all(isinstance(x, str) and isinstance(y, str) for x, y in env.items()):
                raise CorruptRecord("job_envs", k, "not an object of strings")
            out[str(k)] = env
        return out

    def job_keys(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(tenant, idempotency key) -> (job id, spec digest) of every keyed submission."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT tenant, key, job, spec FROM job_keys")
            rows = cur.fetchall()
        return {(str(t), str(k)): (str(j), str(s)) for t, k, j, s in rows}

    @staticmethod
    def _records(records: Iterable[Any], typ: type) -> Iterator[Any]:
        for r in records:
            if not isinstance(r, typ):  # before reading the key attribute, for a clear message
                raise TypeError(f"expected a {typ.__name__}, got {type(r).__name__}")
            yield r

    def _upsert(self, cur: Any, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        key, rest = cols[0], cols[1:]
        sql = (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            f" ON CONFLICT ({key}) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in rest)}"
        )
        cur.executemany(self._sql(sql), rows)

    def _append_events(self, cur: Any, bodies: list[tuple[str, str, str | None]]) -> None:
        """``bodies``: (body, job id or '', its tenant or None), each stored with the tenant of its job:
        the commit's own job rows say it, else the jobs table does ('' when neither holds the job)."""
        if not bodies:
            return
        owners: dict[str, str] = {}
        missing = sorted({j for _b, j, t in bodies if j and t is None})
        for i in range(0, len(missing), 500):
            part = missing[i : i + 500]
            cur.execute(self._sql(f"SELECT id, tenant FROM jobs WHERE id IN ({', '.join('?' * len(part))})"), part)
            owners.update((str(k), str(t)) for k, t in cur.fetchall())
        # inside the write transaction (which serialises writers), so the next seq is ours
        start = self._next_seq(cur)
        rows = [(seq, b, t if t is not None else owners.get(j, "")) for seq, (b, j, t) in enumerate(bodies, start)]
        self._insert(cur, "events", ("seq", "body", "tenant"), rows)

    def _insert(self, cur: Any, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        cur.executemany(self._sql(sql), rows)

    # -- tokens (goodput.sched.live.service) -------------------------------------------------------------------

    def add_token(
        self,
        digest: str,
        tenant: str,
        role: str,
        job: str = "",
        *,
        prefix: str = "",
        expires: float | None = None,
    ) -> None:
        """Remember a token by its hash; ``role`` is tenant, admin or job (then ``job`` names the one it
        reports for). ``prefix`` is the token's first characters, shown by ``token ls`` and accepted by
        ``token revoke`` (too short to guess the rest from); ``expires`` is a Unix time, or None."""
        if role not in ("tenant", "admin", "job"):
            raise ValueError(f"token role must be tenant, admin or job, got {role!r}")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ValueError("a token is stored as its sha256 hex digest (64 lowercase hex characters)")
        if expires is not None and not math.isfinite(expires):
            raise ValueError(f"expires must be a finite Unix time, got {expires!r}")
        with self._use(), self._transaction(write=True) as cur:
            cur.execute(
                self._sql(
                    "INSERT INTO tokens (hash, tenant, role, job, created, prefix, expires, revoked)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (hash) DO NOTHING"
                ),
                (digest, tenant, role, job, time.time(), prefix, expires),
            )

    def token(self, digest: str) -> tuple[str, str, str] | None:
        """(tenant, role, job) of the live token with this hash (not revoked, not expired), or None."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute(self._sql("SELECT tenant, role, job, expires, revoked FROM tokens WHERE hash = ?"), (digest,))
            row = cur.fetchone()
        if row is None or row[4] is not None or (row[3] is not None and float(row[3]) <= time.time()):
            return None
        return (str(row[0]), str(row[1]), str(row[2]))

    def tokens(self) -> list[dict[str, Any]]:
        """Every token row but its hash: tenant, role, job, prefix, created, expires, revoked (Unix times or None)."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute(
                f"SELECT tenant, role, job, prefix, created, expires, revoked, hash FROM tokens"
                f" ORDER BY tenant{self.text_order}, created"
            )
            rows = cur.fetchall()
        cols = ("tenant", "role", "job", "prefix", "created", "expires", "revoked")
        return [dict(zip(cols, r[:7])) for r in rows]

    def live_tokens(self) -> dict[str, tuple[str, str, str, float | None]]:
        """hash -> (tenant, role, job, expires) of every token not revoked: what a service caches."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT hash, tenant, role, job, expires FROM tokens WHERE revoked IS NULL")
            rows = cur.fetchall()
        return {str(h): (str(t), str(r), str(j), None if e is None else float(e)) for h, t, r, j, e in rows}

    def revoke_tokens(self, name: str) -> int:
        """Revoke the person tokens (tenant and admin) of tenant ``name``, or the one token ``name`` starts
        (``gp_`` and at least 4 more characters, as ``token ls`` shows it) or is; the number revoked. A
        prefix two tokens share revokes nothing (ValueError): give more of the token."""
        if not isinstance(name, str) or not name:
            raise ValueError("revoke takes a tenant name or a token prefix")
        now = time.time()
        with self._use(), self._transaction(write=True) as cur:
            if name.startswith("gp_"):
                if len(name) < 7:
                    raise ValueError(f"{name!r}: give at least gp_ and 4 more characters of the token")
                cur.execute(self._sql("SELECT hash, prefix FROM tokens WHERE revoked IS NULL"))
                whole = hashlib.sha256(name.encode()).hexdigest()
                rows = cur.fetchall()
                hits = [h for h, _p in rows if h == whole]
                if not hits:
                    hits = [h for h, p in rows if p and (str(p).startswith(name) or name.startswith(str(p)))]
                if len(hits) > 1:
                    raise ValueError(f"{name!r} matches {len(hits)} tokens: give more of the token")
                cur.executemany(self._sql("UPDATE tokens SET revoked = ? WHERE hash = ?"), [(now, h) for h in hits])
                return len(hits)
            cur.execute(
                self._sql("UPDATE tokens SET revoked = ? WHERE tenant = ? AND revoked IS NULL AND role <> 'job'"),
                (now, name),
            )
            return int(cur.rowcount or 0)

    def set_tenant_user(self, tenant: str, user: str) -> None:
        """The Unix user ``tenant``'s jobs run as (replacing an earlier one)."""
        with self._use(), self._transaction(write=True) as cur:
            cur.execute(
                self._sql(
                    "INSERT INTO tenant_users (tenant, unix_user) VALUES (?, ?)"
                    " ON CONFLICT (tenant) DO UPDATE SET unix_user = excluded.unix_user"
                ),
                (tenant, user),
            )

    def tenant_users(self) -> dict[str, str]:
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT tenant, unix_user FROM tenant_users")
            return {str(t): str(u) for t, u in cur.fetchall()}

    def service_meta(self) -> dict[str, str]:
        """The live service's own settings kept in the store (``state_dir``)."""
        with self._use(), self._transaction(write=False) as cur:
            cur.execute("SELECT key, value FROM service_meta")
            return {str(k): str(v) for k, v in cur.fetchall()}

    def set_service_meta(self, key: str, value: str) -> None:
        with self._use(), self._transaction(write=True) as cur:
            cur.execute(
                self._sql(
                    "INSERT INTO service_meta (key, value) VALUES (?, ?)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                (key, value),
            )

    # -- durability ----------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Every transaction committed before this call is durable when it returns (a no-op unless the
        store was opened with ``deferred_sync``). Group commit: a caller that finds an fsync under way
        waits for it and does one more only if that one began before its own commit; an fsync that
        fails raises :class:`StoreUnavailable` (the commits stay written, not known durable)."""
        if not self.deferred_sync:
            return
        with self._sync_cv:
            target = self._commits
            while self._synced < target:
                if self._syncing:
                    self._sync_cv.wait()
                    continue
                self._syncing = True
                upto = self._commits  # each counted commit's frames are in the WAL already
                self._sync_cv.release()
                err: OSError | None = None
                try:
                    self._fsync()
                except OSError as e:
                    err = e
                finally:
                    self._sync_cv.acquire()
                    self._syncing = False
                    self._sync_cv.notify_all()
                if err is not None:
                    raise StoreUnavailable(f"{_redact(self.url)}: cannot make its commits durable: {err}")
                self._synced = max(self._synced, upto)
        self._checkpoint_maybe()

    def _checkpoint_maybe(self) -> None:
        pass

    def _fsync(self) -> None:
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------------------------

    @contextmanager
    def _use(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise StoreError(f"store {_redact(self.url)} is closed")
            yield

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                self._close_extra()

    def _close_extra(self) -> None:
        pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_redact(self.url)!r}{', closed' if self._closed else ''})"


class SQLiteStore(Store):
    dialect = "sqlite"
    path = ":memory:"
    _wal_fd: int | None = None
    _busy_s = 30.0

    @classmethod
    def open(cls, url: str, path: str, busy_timeout_s: float = 30.0, deferred_sync: bool = False) -> SQLiteStore:
        if path != ":memory:":
            _private_file(path)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly commit()'s
            conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open SQLite store {path!r}: {e}") from None
        try:
            mode = _retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0], busy_timeout_s)
            if path != ":memory:" and str(mode).lower() != "wal":
                raise StoreError(f"SQLite store {path!r} refused WAL mode (got {mode!r})")
            # FULL: in WAL mode NORMAL may lose the last commits on power loss; FULL makes commit durable.
            # deferred_sync: NORMAL, and sync() fsyncs the WAL for every commit before it (module docstring)
            deferred = deferred_sync and path != ":memory:"
            conn.execute(f"PRAGMA synchronous={'NORMAL' if deferred else 'FULL'}")
            if deferred:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # sync() checkpoints, outside the caller's locks
            # a WAL that once grew large (a burst of big submissions between checkpoints) is cut back to
            # this when it is next reset, instead of keeping its high-water mark on disk for good
            conn.execute(f"PRAGMA journal_size_limit={WAL_KEEP_BYTES}")
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StoreError(f"cannot open SQLite store {path!r}: {e}") from None
        except BaseException:
            conn.close()
            raise
        if path != ":memory:":
            for side in (path + "-wal", path + "-shm"):  # SQLite copies the database's mode; say it anyway
                with contextlib.suppress(FileNotFoundError):
                    _private_file(side)
        store = cls(url, conn)
        store.path = path
        store.deferred_sync = deferred
        store._busy_s = busy_timeout_s
        return store

    def _fsync(self) -> None:
        """fsync the WAL (the descriptor kept open: SQLite holds no lock on that file, so ours cannot
        drop one; reopened if the WAL was recreated), and its directory when it is new to us."""
        wal = self.path + "-wal"
        fd = self._wal_fd
        if fd is not None and os.fstat(fd).st_ino != os.stat(wal).st_ino:
            os.close(fd)
            fd = self._wal_fd = None
        if fd is None:
            fd = os.open(wal, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self._wal_fd = fd
            dfd = os.open(os.path.dirname(wal) or ".", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        os.fsync(fd)

    # SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold, with two fsyncs:
    # under the caller's locks. A deferred-sync store turns it off and checkpoints here instead, from
    # sync() (outside them), on a connection of its own, PASSIVE (it never waits for nor blocks a writer)
    CHECKPOINT_EVERY = 200  # commits (a submission writes a handful of pages; SQLite's default is 1000 pages)
    _ckpt_conn: Any = None
    _ckpt_at = 0
    _ckpt_busy = False

    CHECKPOINT_BYTES = 16 << 20  # or once the WAL is this big (a few commits of large job specs)

    def _checkpoint_maybe(self) -> None:
        """On a thread of its own: no request waits for the copy and its two fsyncs."""
        if self._closed or self._commits == self._ckpt_at:
            return
        if self._commits - self._ckpt_at < self.CHECKPOINT_EVERY:
            try:
                if os.path.getsize(self.path + "-wal") < self.CHECKPOINT_BYTES:
                    return
            except OSError:
                return
        with self._sync_cv:
            if self._ckpt_busy:
                return
            self._ckpt_busy = True
        threading.Thread(target=self._checkpoint, name="goodput-store-checkpoint", daemon=True).start()

    def _checkpoint(self) -> None:
        try:
            at = self._commits
            if self._ckpt_conn is None:
                self._ckpt_conn = sqlite3.connect(self.path, timeout=self._busy_s, isolation_level=None,
                                                  check_same_thread=False)  # fmt: skip
            self._ckpt_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self._ckpt_at = at
        except sqlite3.Error as e:  # the WAL only grows meanwhile; the next sync tries again
            import logging

            logging.getLogger("goodput.sched.live.store").warning("WAL checkpoint failed (retried later): %s", e)
        finally:
            with self._sync_cv:
                self._ckpt_busy = False
                self._sync_cv.notify_all()

    def _close_extra(self) -> None:
        with self._sync_cv:  # a checkpoint under way finishes first (it uses its own connection)
            self._sync_cv.wait_for(lambda: not self._ckpt_busy, timeout=30)
        if self._wal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._wal_fd)
            self._wal_fd = None
        if self._ckpt_conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._ckpt_conn.close()
            self._ckpt_conn = None

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        cur = self._conn.cursor()
        try:
            # IMMEDIATE takes the write lock up front, so two writers queue instead of deadlocking
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield cur
            cur.execute("COMMIT")
            if write:
                self._commits += 1
        except sqlite3.OperationalError as e:  # locked past busy_timeout, read-only, disk full, I/O error
            self._rollback()
            raise StoreUnavailable(f"SQLite store {_redact(self.url)}: {e}") from e
        except BaseException:
            self._rollback()
            raise
        finally:
            cur.close()

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # a failed ROLLBACK leaves SQLite to roll back itself
                self._conn.execute("ROLLBACK")

    def _table_exists(self, cur: Any, name: str) -> bool:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return cur.fetchone() is not None

    def _columns(self, cur: Any, table: str) -> set[str]:
        cur.execute(f"PRAGMA table_info({table})")
        return {str(r[1]) for r in cur.fetchall()}


class PostgresStore(Store):
    dialect = "postgresql"
    seq_type = "BIGINT"
    text_order = ' COLLATE "C"'

    @classmethod
    def open(cls, url: str) -> PostgresStore:
        try:
            import psycopg
        except ImportError as e:
            raise ImportError(
                f'a PostgreSQL store needs psycopg 3, which is not installed: pip install "goodput[pg]" ({e})'
            ) from None
        # autocommit: transactions are exactly those _transaction opens
        conn = psycopg.connect(url, autocommit=True)
        return cls(url, conn)

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s")

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Any]:
        import psycopg

        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                if write:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK_KEY,))
                else:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield cur
        except psycopg.OperationalError as e:  # connection lost, server shutting down, ...
            raise StoreUnavailable(f"PostgreSQL store {_redact(self.url)}: {e}") from e

    # both in the schema where this store's unqualified DDL creates its tables (current_schema()): a
    # table of the same name in another schema of the database is not ours (its columns would make a
    # migration think a column exists that ours lacks)
    def _table_exists(self, cur: Any, name: str) -> bool:
        cur.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = %s", (name,)
        )
        return cur.fetchone() is not None

    def _columns(self, cur: Any, table: str) -> set[str]:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = %s",
            (table,),
        )
        return {str(r[0]) for r in cur.fetchall()}

    # Past a few hundred rows COPY beats even pipelined executemany several times over (a first commit of
    # 100,000 jobs); upserts COPY into a staging table dropped at commit, then merge in one statement.
    _COPY_FROM = 256

    def _copy(self, cur: Any, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def _insert(self, cur: Any, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        if len(rows) < self._COPY_FROM:
            return super()._insert(cur, table, cols, rows)
        self._copy(cur, table, cols, rows)

    def _upsert(self, cur: Any, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        if len(rows) < self._COPY_FROM:
            return super()._upsert(cur, table, cols, rows)
        # one INSERT .. SELECT may not touch a row twice: keep the last of each key, as executemany would
        rows = list({r[0]: r for r in rows}.values())
        stage = f"_stage_{table}"
        cur.execute(f"CREATE TEMP TABLE {stage} (LIKE {table}) ON COMMIT DROP")
        self._copy(cur, stage, cols, rows)
        key, rest = cols[0], cols[1:]
        cur.execute(
            f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM {stage}"
            f" ON CONFLICT ({key}) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in rest)}"
        )
        cur.execute(f"DROP TABLE {stage}")


def _private_file(path: str) -> None:
    """Create ``path`` as 0600 if absent; make one we own 0600: the store holds every tenant's jobs and the
    token hashes, and no job (another Unix user) may read or write it. An existing file is never opened
    here: closing any descriptor of a database file drops every POSIX lock this process holds on it,
    the locks SQLite's other connections in this process rely on."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600))
        except FileExistsError:
            return
        except OSError as e:
            raise StoreError(f"cannot create SQLite store {path!r}: {e.strerror}") from None
        return
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, 0o600)


def _sqlite_path(url: str) -> str:
    rest = url[len("sqlite:") :]
    if not rest.startswith("//"):
        raise ValueError(f"bad SQLite store URL {url!r}: expected sqlite:///relative.db or sqlite:////abs/path.db")
    rest = rest[2:]
    if rest in (":memory:", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/") or len(rest) < 2:
        raise ValueError(f"bad SQLite store URL {url!r}: expected sqlite:///relative.db or sqlite:////abs/path.db")
    return os.path.abspath(rest[1:])


def _retry_locked(fn, timeout_s: float):  # noqa: ANN001, ANN202
    """Switching a new database to WAL takes a lock that SQLite does not wait for (no busy
    handler there): two stores opening one fresh file at once would fail, so wait here."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def open_store(url: str, *, busy_timeout_s: float = 30.0, deferred_sync: bool = False) -> Store:
    """Open (creating if absent) the store a URL names; see the module docstring for the spellings and
    for ``deferred_sync`` (SQLite only; PostgreSQL's commit is durable on return either way)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"a store URL is a non-empty string, got {url!r}")
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore.open(url)
    if url.startswith("sqlite:"):
        return SQLiteStore.open(url, _sqlite_path(url), busy_timeout_s, deferred_sync)
    if "://" in url:
        raise ValueError(f"unknown store URL {_redact(url)!r}: expected sqlite:///PATH, postgresql://... or a path")
    path = url if url == ":memory:" else os.path.abspath(url)
    return SQLiteStore.open(url, path, busy_timeout_s, deferred_sync)
