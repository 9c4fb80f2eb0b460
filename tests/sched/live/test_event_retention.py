"""Retention of events (limits.event_retention, limits.event_retention_s): the store's low-water mark
keeps seq numbers monotonic through pruning and restarts, a gap above it is still corrupt, a reader
below it is told (410 / an ``events_pruned`` record) instead of skipped ahead, a job's history counts
what was pruned, and a tenant's ``/events`` reads its own rows by the (tenant, seq) index. Real
SQLite (and PostgreSQL where the store tests start one); the service's endpoints called in-process."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import anyio
import pytest
from fastapi.responses import JSONResponse

from goodput.sched.core.governance import Governance, GovernanceError, Limits, TenantSpec
from goodput.sched.core.model import Job, JobState
from goodput.sched.live.service import PRUNED_EVENT, Caller, JobSpec, Service, create_app, local_pools
from goodput.sched.live.store import CorruptRecord, open_store

ALICE = Caller("alice", "tenant", key="alice")
BOB = Caller("bob", "tenant", key="bob")
ADMIN = Caller("ops", "admin", key="ops")
IMPOSSIBLE = {"name": "wait", "command": ["/bin/true"]}  # cancelled before any pass: never runs


def _job(i: int, tenant: str) -> Job:
    return Job(id=f"{tenant}-{i}", tenant=tenant, priority=0, nodes=1, gpus_per_node=1, submit_s=0.0,
               duration_s=1.0, seq=i)  # fmt: skip


def _ev(i: int, **kw) -> dict:
    return {"t": float(i), "event": "x", "i": i, **kw}


# ------------------------------------------------------------------------------------------ the store


def test_pruning_keeps_seq_monotonic_through_restarts(store_url):
    with open_store(store_url) as st:
        st.commit(events=[_ev(i) for i in range(1, 11)])
        assert st.prune_events(6) == 6  # seq 1..5 deleted
        snap = st.load()
        assert snap.first_seq == 6 and [e["i"] for e in snap.events] == [6, 7, 8, 9, 10]
        assert st.event_count() == 10 and st.first_event_seq() == 6
        assert [s for s, _ in st.events_since(0, 100)] == [6, 7, 8, 9, 10]
    with open_store(store_url) as st:  # a restart: the mark is durable
        assert st.load().first_seq == 6
        st.commit(events=[_ev(11), _ev(12)])
        assert [s for s, _ in st.events_since(10, 100)] == [11, 12]
        # every event pruned: the next seq still goes on from 13, never 1 again
        assert st.prune_events(10**6) == 13
        assert st.load().events == [] and st.event_count() == 12
    with open_store(store_url) as st:
        st.commit(events=[_ev(13)])
        assert [s for s, _ in st.events_since(0, 10)] == [13]
        snap = st.load()
        assert snap.first_seq == 13 and snap.events == [_ev(13)]
        assert st.prune_events(5) == 13  # never lowered


def test_a_gap_above_the_mark_is_still_corrupt(store_url, tmp_path):
    with open_store(store_url) as st:
        st.commit(events=[_ev(i) for i in range(1, 11)])
        st.prune_events(4)
    with contextlib.closing(_raw(store_url)) as db:
        db.execute("DELETE FROM events WHERE seq = 7")
        db.commit()
    with open_store(store_url) as st, pytest.raises(CorruptRecord, match="sequence gap: expected seq 7"):
        st.load()


def test_the_meta_key_of_the_mark_belongs_to_the_store(store_url):
    with open_store(store_url) as st, pytest.raises(ValueError, match="events_first_seq"):
        st.commit(meta={"events_first_seq": 1})


def test_each_event_carries_its_jobs_tenant_and_a_tenant_reads_by_the_index(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice"), _job(1, "bob")],
                  events=[_ev(1, job="alice-1"), _ev(2, job="bob-1"), _ev(3, node="n0")])  # fmt: skip
        # a later step that does not rewrite the job: its tenant comes from the jobs table
        st.commit(events=[_ev(4, job="alice-1"), _ev(5, job="nobody-1")])
        assert [e["i"] for _s, e in st.events_since(0, 100, tenant="alice")] == [1, 4]
        assert [e["i"] for _s, e in st.events_since(0, 100, tenant="bob")] == [2]
        assert st.events_since(0, 100, tenant="") != []  # node events and unknown jobs: no tenant's
        first, last, rows = st.read_events(1, 100, tenant="alice")
        assert (first, last, [s for s, _ in rows]) == (1, 5, [4])
    with contextlib.closing(_raw(store_url)) as db:
        if store_url.startswith("sqlite"):
            plan = " ".join(str(r) for r in db.execute(
                "EXPLAIN QUERY PLAN SELECT seq, body FROM events WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?",
                ("alice", 0, 10)).fetchall())  # fmt: skip
            assert "events_tenant" in plan, plan
        else:
            cur = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'events_tenant'")
            assert "(tenant, seq)" in cur.fetchone()[0]


def test_an_old_events_table_without_the_tenant_column_opens_and_is_filled(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice"), _job(1, "bob")],
                  events=[_ev(1, job="alice-1"), _ev(2, job="bob-1"), _ev(3, node="n0"), _ev(4, job="gone-1")])  # fmt: skip
    with contextlib.closing(_raw(store_url)) as db:  # the table as goodput made it before the column
        db.execute("DROP INDEX events_tenant")
        db.execute("ALTER TABLE events DROP COLUMN tenant")
        db.commit()
    with open_store(store_url) as st:
        assert [e["i"] for _s, e in st.events_since(0, 100, tenant="alice")] == [1]
        assert [e["i"] for _s, e in st.events_since(0, 100, tenant="bob")] == [2]
        assert len(st.load().events) == 4


def test_a_table_of_the_same_name_in_another_schema_is_not_taken_for_ours(store_url):
    """PostgreSQL: another schema's ``events`` with a ``tenant`` column made the migration think
    ours had it (no ALTER; the index on it then failed, and the store did not open)."""
    if not store_url.startswith("postgresql"):
        pytest.skip("schemas are PostgreSQL's")
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(1, job="alice-1")])
    with contextlib.closing(_raw(store_url)) as db:
        db.execute("CREATE SCHEMA other")
        db.execute("CREATE TABLE other.events (seq BIGINT, body TEXT, tenant TEXT)")
        db.execute("CREATE TABLE other.events_tenant_pruned (tenant TEXT, last_seq BIGINT)")
        db.execute("DROP INDEX events_tenant")
        db.execute("ALTER TABLE events DROP COLUMN tenant")
        db.execute("DROP TABLE events_tenant_pruned")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        db.commit()
    with open_store(store_url) as st:
        assert [e["i"] for _s, e in st.events_since(0, 10, tenant="alice")] == [1]
        st.prune_events(2)
        assert st.first_event_seq("alice") == 2


def test_pruned_counts_are_kept_per_job_and_go_with_the_job(store_url):
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(i, job="alice-1") for i in range(1, 6)])
        st.prune_events(3, {"alice-1": 2})
        st.prune_events(4, {"alice-1": 1})
        assert st.events_pruned() == {"alice-1": 3}
        st.retire(pruned=["alice-1"])
        assert st.events_pruned() == {}


def _raw(url: str):  # noqa: ANN202 - a DB-API connection to the store's database, behind its back
    if url.startswith("sqlite"):
        return sqlite3.connect(url[len("sqlite:///") :])
    import psycopg

    return psycopg.connect(url)


# ---------------------------------------------------------------------------------------- the service


class Api:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.routes = {(r.path, m): r.endpoint for r in create_app(svc).routes for m in getattr(r, "methods", ())}

    def submit(self, c: Caller = ALICE) -> str:
        return json.loads(self.routes[("/jobs", "POST")](JobSpec(**IMPOSSIBLE), c).body)["id"]

    def cancel(self, job_id: str, c: Caller = ALICE) -> None:
        self.routes[("/jobs/{job_id}/cancel", "POST")](job_id, c)

    def show(self, job_id: str, c: Caller = ALICE) -> dict:
        return anyio.run(self.routes[("/jobs/{job_id}", "GET")], job_id, c)

    def events_response(self, c: Caller, since: int | None = 0, limit: int = 10000):  # noqa: ANN201
        return anyio.run(lambda: self.routes[("/events", "GET")](None, since, limit, False, c))

    def events(self, c: Caller, since: int = 0, limit: int = 10000) -> tuple[int, list[dict] | dict]:
        r = self.events_response(c, since, limit)
        if isinstance(r, JSONResponse):
            return r.status_code, json.loads(r.body)
        return 200, _body(r)


def _body(r) -> list[dict]:  # noqa: ANN001
    async def read() -> bytes:
        return b"".join([x async for x in r.body_iterator])

    return [json.loads(x) for x in anyio.run(read).decode().splitlines()]


@pytest.fixture
def make(tmp_path):
    made: list[Service] = []

    def _make(**kw) -> tuple[Service, Api]:
        tenants = {t: TenantSpec(t, ckpt_prefix=str(tmp_path)) for t in ("alice", "bob")}
        gov = Governance(tenants=tenants, limits=Limits(min_run_s=0))
        svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path / "state",
                      url="http://127.0.0.1:9", governance=gov, allow_root_jobs=True, **kw)  # fmt: skip
        made.append(svc)
        return svc, Api(svc)

    yield _make
    for svc in made:
        with contextlib.suppress(Exception):
            svc.close()


def _rows(tmp_path) -> int:
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        return db.execute("SELECT COUNT(*) FROM events").fetchone()[0]


def _churn(svc: Service, api: Api, n: int, c: Caller = ALICE) -> list[str]:
    """``n`` jobs submitted and cancelled before any pass (2 records each: submitted, cancelled)."""
    ids = []
    for _ in range(n):
        jid = api.submit(c)
        api.cancel(jid, c)
        ids.append(jid)
    return ids


def test_the_service_prunes_memory_and_store_to_the_bound_and_restarts_from_it(make, tmp_path):
    svc, api = make(event_retention=20)
    _churn(svc, api, 30)  # 60 records
    total = svc.store.event_count()
    svc.pass_once()
    assert len(svc.sched.log.records) == 20 and _rows(tmp_path) == 20
    assert svc.events_first == total - 19 == svc.store.first_event_seq()
    kept = list(svc.sched.log.records)
    svc.close()
    svc2, api2 = make(event_retention=20)
    assert svc2.sched.log.records == kept and svc2.events_first == total - 19
    jid = api2.submit()
    assert svc2.store.event_count() == total + 1  # seq goes on, never reused
    assert api2.show(jid)["history"][0]["event"] == "submitted"


def test_an_age_bound_prunes_old_events(make, tmp_path):
    svc, api = make(event_retention_s=3600)
    _churn(svc, api, 3)
    with svc.lock:
        for rec in svc.sched.log.records[:4]:
            rec["t"] -= 7200  # as if written two hours ago (memory decides what is old)
    svc.pass_once()
    assert len(svc.sched.log.records) == 2 and _rows(tmp_path) == 2 and svc.events_first == 5


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"event_retention": 0}, "limits.event_retention"),
        ({"event_retention": 1.5}, "limits.event_retention"),
        ({"event_retention": True}, "limits.event_retention"),
        ({"event_retention_s": 0}, "limits.event_retention_s"),
        ({"event_retention_s": float("inf")}, "limits.event_retention_s"),
    ],
)
def test_bad_bounds_are_refused_naming_the_limit(make, kw, field):
    with pytest.raises(GovernanceError) as e:
        make(**kw)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"event_retention": 0}, "limits.event_retention"),
        ({"event_retention": "10"}, "limits.event_retention"),
        ({"event_retention_s": -1}, "limits.event_retention_s"),
    ],
)
def test_the_cluster_files_limits_carry_the_bounds(tmp_path, limits, field):
    gov = Governance.from_obj(None, {"event_retention": 7, "event_retention_s": 86400})
    assert (gov.limits.event_retention, gov.limits.event_retention_s) == (7, 86400.0)
    assert gov.to_obj()[1]["event_retention"] == 7
    assert Limits().event_retention == 1_000_000 and Limits().event_retention_s is None
    with pytest.raises(GovernanceError) as e:
        Governance.from_obj(None, limits)
    assert e.value.field == field
    svc = Service(f"sqlite:///{tmp_path / 's.db'}", local_pools(1, 1), state_dir=tmp_path / "state",
                  url="http://127.0.0.1:9", governance=gov, allow_root_jobs=True)  # fmt: skip
    try:
        assert (svc.event_retention, svc.event_retention_s) == (7, 86400.0)
    finally:
        svc.close()


def test_a_reader_below_the_mark_gets_410_naming_the_first_seq(make):
    svc, api = make(event_retention=10)
    mine = _churn(svc, api, 10)
    theirs = _churn(svc, api, 5, BOB)
    svc.pass_once()
    first = svc.events_first
    assert first == 21
    for c in (ALICE, ADMIN):
        code, body = api.events(c)  # since=0: events 1..20 (all alice's) are gone
        assert code == 410 and body["first_seq"] == first and body["since"] == 0, body
        assert f"since={first - 1}" in body["detail"]
    # bob lost none of his: alice's deleted events, which he could never read, do not cut him off
    code, body = api.events(BOB)
    assert code == 200 and [r["job"] for r in body] == [j for j in theirs for _ in range(2)]
    code, body = api.events(ADMIN, since=first - 1)
    assert code == 200 and len(body) == 10
    # no since asked for: the log as kept, from the mark, which a header names
    r = api.events_response(ADMIN, since=None)
    assert r.headers["X-Goodput-First-Seq"] == str(first) and _body(r) == body
    code, body = api.events(BOB, since=first - 1)
    assert code == 200 and {r["job"] for r in body} == set(theirs)
    code, body = api.events(ALICE, since=first - 1)
    assert code == 200 and body == []  # alice's events were all pruned: none of bob's instead
    assert not set(mine) & {r["job"] for r in api.events(ADMIN, since=first - 1)[1]}


def test_each_tenant_has_a_mark_of_its_own(store_url):
    """The retention deletes the log's oldest events, whoever's: a tenant has lost events only below
    one past the last of its own that went."""
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice"), _job(1, "bob")],
                  events=[_ev(1, job="alice-1"), _ev(2, job="bob-1"), _ev(3, job="bob-1"), _ev(4, node="n0"),
                          _ev(5, job="alice-1"), _ev(6, job="bob-1")])  # fmt: skip
        assert (st.first_event_seq("alice"), st.first_event_seq("bob"), st.first_event_seq("carol")) == (1, 1, 1)
        st.prune_events(3)  # 1 (alice's) and 2 (bob's) go
        assert (st.first_event_seq(), st.first_event_seq("alice"), st.first_event_seq("bob")) == (3, 2, 3)
        st.prune_events(5)  # 3 (bob's) and 4 (a node's) go
        assert (st.first_event_seq(), st.first_event_seq("alice"), st.first_event_seq("bob")) == (5, 2, 4)
        assert st.first_event_seq("carol") == 1  # none of carol's ever went
        first, last, rows = st.read_events(1, 10, tenant="alice")
        assert (first, last, [s for s, _ in rows]) == (2, 6, [5])
    with open_store(store_url) as st:  # durable
        assert (st.first_event_seq("alice"), st.first_event_seq("bob")) == (2, 4)


def test_a_store_pruned_before_tenants_had_marks_gives_them_the_logs_mark(store_url):
    """A schema 2 store does not know whose events it deleted: every tenant's mark is the log's mark
    when the store is opened by this goodput, never below (a reader is told rather than skipped)."""
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(i, job="alice-1") for i in range(1, 6)])
        st.prune_events(3)
    with contextlib.closing(_raw(store_url)) as db:  # as the previous goodput left it
        db.execute("DROP TABLE events_tenant_pruned")
        db.execute("DELETE FROM meta WHERE key = 'events_tenant_marks_from'")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        db.commit()
    with open_store(store_url) as st:
        assert (st.first_event_seq("alice"), st.first_event_seq("bob")) == (3, 3)
        st.prune_events(4)
        assert (st.first_event_seq("alice"), st.first_event_seq("bob")) == (4, 3)


def test_a_stream_that_falls_below_the_mark_ends_with_an_events_pruned_record(make):
    svc, api = make(event_retention=1000)
    _churn(svc, api, 5)  # seq 1..10
    r = api.events_response(ALICE, since=0)  # admitted: nothing pruned yet
    svc.event_retention = 4
    svc.pass_once()  # 1..6 pruned before the stream's first read
    body = _body(r)
    assert body == [{"t": body[0]["t"], "event": PRUNED_EVENT, "first_seq": 7, "since": 0}]


def test_a_tenants_stream_is_not_cut_by_another_tenants_deleted_events(make):
    svc, api = make(event_retention=1000)
    b = _churn(svc, api, 2, BOB)  # seq 1..4, bob's
    a = _churn(svc, api, 3)  # seq 5..10, alice's
    r = api.events_response(ALICE, since=0)
    svc.event_retention = 6
    svc.pass_once()  # 1..4 pruned before the stream's first read: none of them alice's
    assert svc.events_first == 5
    assert [x["job"] for x in _body(r)] == [j for j in a for _ in range(2)]
    code, body = api.events(BOB)
    assert code == 410 and body["first_seq"] == 5, body
    assert api.events(BOB, since=4) == (200, [])
    assert not set(b) & set(a)


def test_history_dropped_counts_pruned_records_and_survives_a_restart(make):
    svc, api = make(event_retention=3)
    (old,) = _churn(svc, api, 1)  # seq 1 submitted, 2 cancelled
    _churn(svc, api, 1)  # seq 3, 4
    assert api.show(old)["history_dropped"] == 0
    svc.pass_once()  # keeps the newest 3: old's submitted record goes
    view = api.show(old)
    assert [r["event"] for r in view["history"]] == ["cancelled"] and view["history_dropped"] == 1
    svc.close()
    svc2, api2 = make(event_retention=3)
    view = api2.show(old)
    assert [r["event"] for r in view["history"]] == ["cancelled"] and view["history_dropped"] == 1
    # pruned again after the restart: both counts add up
    _churn(svc2, api2, 2)
    svc2.pass_once()
    view = api2.show(old)
    assert view["history"] == [] and view["history_dropped"] == 2


def test_a_tenant_never_sees_another_tenants_events(make):
    svc, api = make()
    a = _churn(svc, api, 3)
    b = _churn(svc, api, 2, BOB)
    code, alice = api.events(ALICE)
    assert code == 200 and {r["job"] for r in alice} == set(a) and len(alice) == 6
    code, bob = api.events(BOB)
    assert code == 200 and {r["job"] for r in bob} == set(b) and len(bob) == 4
    assert len(api.events(ADMIN)[1]) == 10
    assert len(api.events(ALICE, limit=2)[1]) == 2
    assert all(svc.sched.jobs[j].state is JobState.CANCELLED for j in a + b)
