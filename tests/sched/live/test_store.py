"""The store against its one promise (a SIGKILL at any moment loses or doubles nothing) on both backends."""

from __future__ import annotations

import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from goodput.sched.core.model import Checkpointing, Health, Job, JobState, Node, PoolKind, RetryPolicy, Tenant
from goodput.sched.live import store as store_mod
from goodput.sched.live.store import (
    SCHEMA_VERSION,
    CorruptRecord,
    PostgresStore,
    SchemaError,
    SQLiteStore,
    Store,
    StoreError,
    open_store,
)

REPO = Path(__file__).resolve().parents[3]


def full_job(i: int = 0, **kw) -> Job:
    """A job with every field away from its default, so a field the codec drops cannot hide."""
    fields = dict(
        id=f"job-{i}",
        tenant="team-a",
        priority=7,
        nodes=2,
        gpus_per_node=8,
        submit_s=12.5,
        duration_s=3600.0,
        limit_s=7200.0,
        spot=True,
        ckpt=Checkpointing(interval_s=600.0, write_s=20.0, stall_s=2.5, restart_s=90.0, grace_s=45.0),
        retry=RetryPolicy(max_failures=5, backoff_s=30.0, backoff_max_s=900.0),
        seq=42 + i,
        state=JobState.PREEMPTING,
        substate="draining",
        eligible_s=100.0,
        epoch=3,
        committed_s=1200.0,
        committed_at=1500.25,
        preemptions=2,
        infra_losses=1,
        failures=1,
        first_start_s=20.0,
        started_s=1400.0,
        pool="spot-h100",
        placement=("node-1", "node-2"),
        deadline_s=math.inf,
        victim_of="job-9",
        ckpt_requested=True,
        end_s=-1.0,
        claim=("node-3",),
        claim_pool="on-demand",
        command=("python", "train.py", "--lr", "3e-4"),
        ckpt_root="/ckpt/job",
    )
    fields.update(kw)
    return Job(**fields)


def full_node(name: str = "node-1") -> Node:
    return Node(
        name=name,
        pool="spot-h100",
        kind=PoolKind.SPOT,
        gpus=8,
        health=Health.RECLAIMING,
        alloc={"job-0": 8},
        draining=8,
    )


def full_tenant(name: str = "team-a") -> Tenant:
    return Tenant(name=name, weight=2.5, quota_gpus=64, usage_gpus=16, used_gpu_s=123456.75)


def raw_execute(url: str, sql: str, params: tuple = ()) -> None:
    """Write behind the store's back, as damage or an older/newer goodput would."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url[len("sqlite:///") :])
        try:
            conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), params)


# -- round trips -----------------------------------------------------------------------------------------


def test_round_trip_every_field(store_url):
    job = full_job()
    neg = full_job(1, deadline_s=-math.inf, state=JobState.RUNNING, placement=(), claim=())
    events = [
        {"t": 1.0, "event": "submitted", "job": "job-0"},
        {"t": 2.5, "event": "preempt_requested", "job": "job-0", "deadline_s": math.inf, "candidates": ["a", "b"]},
        {"t": 3.0, "event": "started", "job": "job-1", "nodes": ("n1", "n2"), "state": JobState.RUNNING},
    ]
    meta = {"seq": 123, "clock": 456.7, "policy": "goodput", "horizon": math.inf, "flags": {"x": [1, 2]}}
    with open_store(store_url) as st:
        st.commit(jobs=[job, neg], nodes=[full_node()], tenants=[full_tenant()], meta=meta, events=events)
    with open_store(store_url) as st:
        snap = st.load()
        assert st.event_count() == 3
    assert snap.jobs == {"job-0": job, "job-1": neg}
    got = snap.jobs["job-0"]
    assert got.deadline_s == math.inf and snap.jobs["job-1"].deadline_s == -math.inf
    assert isinstance(got.placement, tuple) and isinstance(got.command, tuple) and isinstance(got.claim, tuple)
    assert got.state is JobState.PREEMPTING
    assert isinstance(got.ckpt, Checkpointing) and isinstance(got.retry, RetryPolicy)
    assert snap.nodes == {"node-1": full_node()} and snap.nodes["node-1"].kind is PoolKind.SPOT
    assert snap.nodes["node-1"].health is Health.RECLAIMING
    assert snap.tenants == {"team-a": full_tenant()}
    assert snap.meta == meta
    # events are JSON: tuples come back as lists, enums as their values, infinity as infinity
    assert snap.events[0] == events[0]
    assert snap.events[1]["deadline_s"] == math.inf
    assert snap.events[2] == {"t": 3.0, "event": "started", "job": "job-1", "nodes": ["n1", "n2"], "state": "running"}
    assert list(snap.events[1]) == list(events[1])  # key order kept (TEXT, not JSONB)
    assert "schema_version" not in snap.meta


def test_string_inf_stays_a_string(store_url):
    """Only float slots read "inf" as infinity: a string field holding it is left alone."""
    job = full_job(substate="inf", victim_of="-inf", command=("nan", "null"))
    with open_store(store_url) as st:
        st.commit(jobs=[job])
        assert st.load().jobs["job-0"] == job


def test_stored_body_is_plain_json(store_url):
    """Outside tools (psql, sqlite3) can read a body: infinity is spelled, columns are filled."""
    with open_store(store_url) as st:
        st.commit(jobs=[full_job()])
    if store_url.startswith("sqlite:"):
        conn = sqlite3.connect(store_url[len("sqlite:///") :])
        row = conn.execute("SELECT state, tenant, body FROM jobs WHERE id = 'job-0'").fetchone()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(store_url) as conn:
            row = conn.execute("SELECT state, tenant, body FROM jobs WHERE id = 'job-0'").fetchone()
    import json

    assert row[0] == "preempting" and row[1] == "team-a"
    body = json.loads(row[2])
    assert body["deadline_s"] == "inf" and body["placement"] == ["node-1", "node-2"]


def test_upsert_replaces(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job()], nodes=[full_node()], tenants=[full_tenant()], meta={"seq": 1, "policy": "x"})
        st.commit(
            jobs=[full_job(state=JobState.FINISHED, deadline_s=5.0, tenant="team-b")],
            nodes=[Node("node-1", "od", PoolKind.ON_DEMAND, 4)],
            tenants=[Tenant("team-a", weight=1.0)],
            meta={"seq": 2},
        )
        snap = st.load()
    assert len(snap.jobs) == 1 and snap.jobs["job-0"].state is JobState.FINISHED
    assert snap.jobs["job-0"].deadline_s == 5.0 and snap.jobs["job-0"].tenant == "team-b"
    assert snap.nodes == {"node-1": Node("node-1", "od", PoolKind.ON_DEMAND, 4)}
    assert snap.tenants == {"team-a": Tenant("team-a", weight=1.0)}
    assert snap.meta == {"seq": 2, "policy": "x"}  # meta keys upsert one by one


def test_last_of_duplicates_wins(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(priority=1), full_job(priority=2)])
        assert st.load().jobs["job-0"].priority == 2


def test_delete_jobs(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(i) for i in range(4)])
        st.commit(delete_jobs=["job-1", "job-3", "never-existed"])
        assert sorted(st.load().jobs) == ["job-0", "job-2"]
        # changed and deleted in one step: deleted
        st.commit(jobs=[full_job(0, priority=99)], delete_jobs=["job-0"])
        assert sorted(st.load().jobs) == ["job-2"]
        with pytest.raises(TypeError, match="job ids"):
            st.commit(delete_jobs="job-2")


def test_events_sequence_and_paging(store_url):
    with open_store(store_url) as st:
        assert st.event_count() == 0 and st.events_since(0, 10) == []
        for step in range(5):
            st.commit(events=[{"t": float(step), "event": "tick", "k": k} for k in range(3)])
        assert st.event_count() == 15
        page = st.events_since(0, 4)
        assert [s for s, _ in page] == [1, 2, 3, 4]
        assert page[0][1] == {"t": 0.0, "event": "tick", "k": 0}
        rest, last = [], page[-1][0]
        while batch := st.events_since(last, 4):
            rest += batch
            last = batch[-1][0]
        assert [s for s, _ in rest] == list(range(5, 16))
        assert [e for _, e in page + rest] == st.load().events
        with pytest.raises(ValueError):
            st.events_since(0, 0)


def test_empty_commit_is_a_no_op(store_url):
    with open_store(store_url) as st:
        st.commit()
        assert st.load().jobs == {} and st.event_count() == 0


def test_large_commit(store_url):
    """Big batches take PostgreSQL's COPY path: the same last-wins, escaping and infinity as small ones."""
    odd = ("tab\there", "new\nline", "back\\slash", 'quote"d', "ünï", "\\N")
    first = [full_job(i, priority=1) for i in range(400)]
    again = [full_job(i, priority=2, command=odd, deadline_s=-math.inf) for i in range(0, 400, 2)]
    dupes = [full_job(7, priority=3), full_job(7, priority=4)]
    events = [{"t": float(i), "event": "submitted", "job": f"job-{i}", "odd": list(odd)} for i in range(300)]
    with open_store(store_url) as st:
        st.commit(jobs=first, events=events)
        st.commit(jobs=again + dupes, events=events, nodes=[full_node(f"n{i}") for i in range(300)])
        snap = st.load()
    assert len(snap.jobs) == 400 and len(snap.nodes) == 300 and len(snap.events) == 600
    assert snap.jobs["job-0"] == again[0] and snap.jobs["job-0"].command == odd
    assert snap.jobs["job-1"] == first[1] and snap.jobs["job-7"].priority == 4
    assert snap.events == events + events
    assert list(snap.jobs) == sorted(snap.jobs)  # byte order of keys on both backends


# -- atomicity -------------------------------------------------------------------------------------------


def _committed_state(url: str):
    with open_store(url) as st:
        return st.load()


def test_unencodable_record_leaves_previous_state(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(0)], meta={"n": 1}, events=[{"t": 0.0, "event": "a"}])
        before = st.load()
        with pytest.raises(TypeError):
            st.commit(
                jobs=[full_job(0, priority=100), full_job(1, command=("ok", object()))],  # type: ignore[arg-type]
                meta={"n": 2},
                events=[{"t": 1.0, "event": "b"}],
            )
        with pytest.raises(TypeError):
            st.commit(jobs=[full_job(0, priority=100)], events=[{"t": 1.0, "event": "b", "x": object()}])
        with pytest.raises(TypeError, match="expected a Node"):
            st.commit(jobs=[full_job(0, priority=100)], nodes=[full_tenant()])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="schema_version"):
            st.commit(jobs=[full_job(0, priority=100)], meta={"schema_version": 99})
    assert _committed_state(store_url) == before


def test_failure_inside_the_transaction_rolls_back(store_url, monkeypatch):
    """Jobs, nodes and meta are written, then the event append fails: none of it may remain."""
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(0)], nodes=[full_node()], meta={"n": 1}, events=[{"t": 0.0, "event": "a"}])
        before = st.load()
        calls = []

        def boom(self, cur, bodies):
            calls.append(len(bodies))
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(Store, "_append_events", boom)
        with pytest.raises(RuntimeError, match="disk on fire"):
            st.commit(
                jobs=[full_job(0, priority=100), full_job(1)],
                nodes=[full_node("node-2")],
                tenants=[full_tenant()],
                meta={"n": 2},
                events=[{"t": 1.0, "event": "b"}],
                delete_jobs=["job-0"],
            )
        assert calls == [1]  # it did fail in the middle, after the upserts
        assert st.load() == before  # the same connection sees the rollback
        monkeypatch.undo()
        # and the store is still usable
        st.commit(meta={"n": 3}, events=[{"t": 2.0, "event": "c"}])
        assert st.event_count() == 2
    after = _committed_state(store_url)
    assert after.jobs == before.jobs and after.nodes == before.nodes and after.tenants == before.tenants
    assert after.meta == {"n": 3} and [e["event"] for e in after.events] == ["a", "c"]


def test_two_writers_share_one_sequence(store_url):
    """Two stores on one database (a stray second scheduler, a CLI): commits queue, seqs never collide."""
    import threading

    errors = []

    def write(tag: str) -> None:
        try:
            with open_store(store_url) as st:
                for i in range(40):
                    st.commit(meta={tag: i}, events=[{"t": float(i), "event": tag, "k": k} for k in range(3)])
        except Exception as e:  # surfaced below: a thread's exception would vanish otherwise
            errors.append(e)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with open_store(store_url) as st:
        snap = st.load()
    assert snap.meta == {"a": 39, "b": 39} and len(snap.events) == 240
    for tag in ("a", "b"):  # each commit's events stay together and in order
        mine = [(e["t"], e["k"]) for e in snap.events if e["event"] == tag]
        assert mine == [(float(i), k) for i in range(40) for k in range(3)]


# -- untrusted storage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table,key_col,key,body,reason",
    [
        ("jobs", "id", "job-0", "{not json", "not JSON"),
        ("jobs", "id", "job-0", '{"id": "job-0"}', "does not decode as Job"),
        ("jobs", "id", "job-0", "[1, 2]", "does not decode as Job"),
        ("nodes", "name", "node-1", '{"name": "node-1", "pool": "p", "kind": "moon", "gpus": 8}', "Node"),
        ("tenants", "name", "team-a", '{"name": "team-b"}', "not the row's key"),
        ("meta", "key", "n", "{{{", "not JSON"),
    ],
)
def test_corrupt_row_names_table_and_key(store_url, table, key_col, key, body, reason):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(0)], nodes=[full_node()], tenants=[full_tenant()], meta={"n": 1})
    col = "value" if table == "meta" else "body"
    raw_execute(store_url, f"UPDATE {table} SET {col} = ? WHERE {key_col} = ?", (body, key))
    with open_store(store_url) as st, pytest.raises(CorruptRecord, match=reason) as err:
        st.load()
    assert err.value.table == table and err.value.key == key
    assert repr(table) in str(err.value) and repr(key) in str(err.value)


def test_job_body_under_another_key(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job(0), full_job(1)])
    raw_execute(store_url, "UPDATE jobs SET body = (SELECT body FROM jobs WHERE id = 'job-1') WHERE id = 'job-0'")
    with open_store(store_url) as st, pytest.raises(CorruptRecord, match=r"'jobs' at key 'job-0'.*'job-1'"):
        st.load()


def test_corrupt_event(store_url):
    with open_store(store_url) as st:
        st.commit(events=[{"t": 0.0, "event": "a"}, {"t": 1.0, "event": "b"}])
    raw_execute(store_url, "UPDATE events SET body = ? WHERE seq = 2", ("[1]",))
    with open_store(store_url) as st:
        with pytest.raises(CorruptRecord, match="not a JSON object") as err:
            st.load()
        assert (err.value.table, err.value.key) == ("events", 2)
        with pytest.raises(CorruptRecord):
            st.events_since(0, 10)
    raw_execute(store_url, "DELETE FROM events WHERE seq = 1")
    with open_store(store_url) as st, pytest.raises(CorruptRecord, match="sequence gap"):
        st.load()


def test_schema_version_guard(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[full_job()])
    raw_execute(store_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaError, match=rf"schema_version {SCHEMA_VERSION + 1} is newer.*upgrade goodput"):
        open_store(store_url)
    raw_execute(store_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", ('"one"',))
    with pytest.raises(SchemaError, match="not a positive integer"):
        open_store(store_url)
    raw_execute(store_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
    with open_store(store_url) as st:
        assert list(st.load().jobs) == ["job-0"]


def test_reopen_keeps_schema_and_data(store_url):
    for n in range(3):
        with open_store(store_url) as st:
            st.commit(meta={"n": n}, events=[{"t": 0.0, "event": "open"}])
    with open_store(store_url) as st:
        assert st.load().meta == {"n": 2} and st.event_count() == 3


def test_closed_store_refuses(store_url):
    st = open_store(store_url)
    st.close()
    st.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        st.load()


# -- URLs ------------------------------------------------------------------------------------------------


def test_sqlite_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db") as st:
        assert isinstance(st, SQLiteStore)
        st.commit(meta={"a": 1})
    assert (tmp_path / "rel.db").exists()
    with open_store(f"sqlite:///{tmp_path / 'abs.db'}") as st:  # sqlite:////tmp/... : absolute
        st.commit(meta={"a": 2})
    with open_store(str(tmp_path / "abs.db")) as st:  # a bare path is the same file
        assert st.load().meta == {"a": 2}
    with open_store("bare.db") as st:
        st.commit(meta={"a": 3})
    assert (tmp_path / "bare.db").exists()
    conn = sqlite3.connect(tmp_path / "abs.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    for mem in ("sqlite://:memory:", "sqlite:///:memory:", ":memory:"):
        with open_store(mem) as st:
            st.commit(jobs=[full_job()])
            assert list(st.load().jobs) == ["job-0"]


@pytest.mark.parametrize("url", ["mysql://u@h/db", "sqlite:rel.db", "sqlite://host/x.db", "redis://x", ""])
def test_bad_urls(url):
    with pytest.raises(ValueError, match=repr(url) if url else "non-empty"):
        open_store(url)


def test_not_a_database(tmp_path):
    p = tmp_path / "junk.db"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        open_store(str(p))


def test_missing_psycopg_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r'pip install "goodput\[pg\]"'):
        open_store("postgresql://goodput@127.0.0.1:1/db")


def test_postgres_url_opens_postgres_store(fresh_pg_url):
    with open_store(fresh_pg_url) as st:
        assert isinstance(st, PostgresStore)


def test_password_is_redacted():
    assert store_mod._redact("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"


# -- SIGKILL ---------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from goodput.sched.core.model import Job
    from goodput.sched.live.store import open_store

    B, E = 20, 7  # jobs and events per step: big enough that kills land inside transactions
    st = open_store(sys.argv[1])
    n = st.load().meta.get("n", 0)
    print("ready", flush=True)
    while True:
        n += 1
        st.commit(
            jobs=[Job(f"j{n}-{k}", "t", n, 1, 8, float(n)) for k in range(B)] + [Job("counter", "t", n, 1, 1, 0.0)],
            meta={"n": n},
            events=[{"t": float(n), "event": "tick", "n": n, "k": k} for k in range(E)],
            delete_jobs=[f"j{n - 1}-0"],
        )
    """
)


def _check_prefix(url: str) -> int:
    """The state after exactly n whole steps, for the n the metadata records."""
    with open_store(url) as st:
        snap = st.load()
        count = st.event_count()
        paged = st.events_since(0, 10**9)
    n = snap.meta.get("n", 0)
    assert count == len(snap.events) == 7 * n
    assert [s for s, _ in paged] == list(range(1, count + 1))
    assert snap.events == [{"t": float(i), "event": "tick", "n": i, "k": k} for i in range(1, n + 1) for k in range(7)]
    assert len(snap.jobs) == (20 * n - max(0, n - 1) + 1 if n else 0)
    if n:
        assert snap.jobs["counter"].priority == n
        assert f"j{n}-0" in snap.jobs and f"j{n - 1}-0" not in snap.jobs
    return n


def test_sigkill_leaves_a_consistent_prefix(store_url):
    rng = random.Random(20240601)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    seen = [0]
    for _ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, store_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        try:
            line = child.stdout.readline()
            assert line == b"ready\n", child.stderr.read().decode()
            time.sleep(rng.uniform(0.1, 0.6))
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        seen.append(_check_prefix(store_url))
    assert seen == sorted(seen) and seen[-1] > 0, seen


# -- bulk ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bulk_first_commit(store_url):
    """100,000 jobs and their submit events in one step (timed by hand; no assertion on the time)."""
    jobs = [full_job(i, state=JobState.PENDING, deadline_s=math.inf) for i in range(100_000)]
    events = [{"t": 0.0, "event": "submitted", "job": j.id} for j in jobs]
    with open_store(store_url) as st:
        t0 = time.perf_counter()
        st.commit(jobs=jobs, events=events, meta={"seq": len(jobs)})
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = st.load()
        load = time.perf_counter() - t0
    print(f"\n{store_url.split(':')[0]}: commit 100k jobs+events {took:.2f}s, load {load:.2f}s")
    assert len(snap.jobs) == 100_000 and len(snap.events) == 100_000
    assert snap.jobs["job-99999"] == jobs[-1]


def test_deferred_sync_fsyncs_the_wal_once_for_every_commit_before_it(tmp_path, monkeypatch):
    """A store opened with deferred_sync commits with synchronous=NORMAL and makes its commits durable
    in sync(): one fsync of the WAL for all the commits made before it (16 threads that each commit
    then sync share fsyncs), none when nothing was committed since; the default store stays FULL."""
    import threading

    path = tmp_path / "d.db"
    with open_store(str(tmp_path / "full.db")) as full:
        assert full._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        full.sync()  # a no-op: its commits are durable on return
    st = open_store(f"sqlite:///{path}", deferred_sync=True)
    try:
        assert st.deferred_sync and st._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        synced: list[str] = []
        real = os.fsync

        def counting(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            time.sleep(0.01)  # a slow disk, so that the threads below overlap
            real(fd)

        monkeypatch.setattr(store_mod.os, "fsync", counting)
        st.commit(tenants=[Tenant(name="t0")])
        st.sync()
        assert str(path) + "-wal" in synced, synced  # the WAL itself (and its directory, the first time)
        before = len(synced)
        st.sync()
        assert len(synced) == before  # nothing new: no fsync

        def one(i: int) -> None:
            st.commit(tenants=[Tenant(name=f"t{i + 1}")])
            st.sync()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 <= len(synced) - before < 16, len(synced) - before  # group commit: shared fsyncs
        assert st._synced == st._commits
        # SQLite's own checkpoint (two fsyncs inside a COMMIT) is off: sync() checkpoints every so many
        assert st._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        monkeypatch.setattr(store_mod.os, "fsync", real)
        for i in range(st.CHECKPOINT_EVERY):
            st.commit(meta={"n": i})
            st.sync()
        deadline = time.monotonic() + 30  # on a thread of its own
        while st._ckpt_at < st.CHECKPOINT_EVERY or st._ckpt_busy:
            assert time.monotonic() < deadline, st._ckpt_at
            time.sleep(0.01)
        busy, frames, done = st._ckpt_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert busy == 0 and frames - done < 50, (frames, done)  # nearly all copied back to the database
    finally:
        st.close()
    with open_store(f"sqlite:///{path}") as again:
        assert len(again.load().tenants) == 17
