"""Retention of events under attack (a hostile review): a follower racing the pruning never loses or
doubles an event in silence, the mark's edges (since = first_seq - 2, - 1, first_seq), the
dashboard's feed when the retention deletes records it had not read yet, a previous goodput's code
on a store the retention wrote (it must refuse it, not misread it), a store of schema 1 written by
either, and SIGKILLs in the middle of a backlog's pruning. Real SQLite files (and PostgreSQL where
the store tests start one), real Service objects, a real ``goodput sched serve`` for the crashes."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from fastapi.responses import JSONResponse

from goodput.sched.live.service import PRUNED_EVENT, Caller
from goodput.sched.live.store import SCHEMA_VERSION, SchemaError, open_store
from goodput.sched.ui.routes import LiveFeed

from .test_event_retention import ADMIN, ALICE, BOB, _churn, _ev, _job, _raw, make  # noqa: F401 - fixture
from .test_service import server  # noqa: F401 - fixture
from .test_store import raw_execute

REPO = Path(__file__).resolve().parents[3]
# the last commit before the event retention: its store.py is "the previous goodput"
BEFORE_RETENTION = "2f2a5d8"
BEFORE_TENANT_MARKS = "40a1fa3"  # schema 2: the log's mark only


def _stream(svc, api, c: Caller, since: int | None, follow: bool, stop: threading.Event) -> list[dict]:  # noqa: ANN001
    """A real /events generator driven until it ends or ``stop`` is set and it is caught up."""

    class Req:
        async def is_disconnected(self) -> bool:
            return stop.is_set()

    async def run() -> list[dict]:
        r = await api.routes[("/events", "GET")](Req(), since, 100000, follow, c)
        if isinstance(r, JSONResponse):  # 410: as a notice of the same shape, nothing read
            body = json.loads(r.body)
            assert r.status_code == 410, body
            return [{"event": PRUNED_EVENT, "first_seq": body["first_seq"], "since": body["since"]}]
        out = []
        async for chunk in r.body_iterator:
            out.extend(json.loads(x) for x in chunk.decode().splitlines())
        return out

    return anyio.run(run)


def _full_log(svc, have: dict[int, dict]) -> None:  # noqa: ANN001
    """Every event the store holds, accumulated (the test reads it before each prune)."""
    after = max(have, default=0)
    for s, e in svc.store.events_since(after, 100000):
        have[s] = e


@pytest.mark.parametrize("c", [ADMIN, ALICE], ids=["admin", "tenant"])
def test_a_follower_racing_the_pruning_never_loses_or_doubles_an_event_in_silence(make, c):  # noqa: F811
    svc, api = make(event_retention=7)
    full: dict[int, dict] = {}
    stop, done = threading.Event(), threading.Event()
    owner: dict[str, str] = {}

    def churn() -> None:
        try:
            for i in range(60):
                who = ALICE if i % 3 else BOB
                owner.update(dict.fromkeys(_churn(svc, api, 1, who), who.tenant))
                _full_log(svc, full)  # before the prune: nothing is ever deleted unread by the test
                svc.pass_once()
                time.sleep(0.01 * (i % 4))
        finally:
            done.set()
            stop.set()

    runs = []
    t = threading.Thread(target=churn)
    t.start()
    since = 0
    try:
        while not done.is_set() or not runs:
            got = _stream(svc, api, c, since, True, stop)
            runs.append((since, got))
            if got and got[-1].get("event") == PRUNED_EVENT:
                since = got[-1]["first_seq"] - 1  # told: start again from the mark
            elif got:
                break
    finally:
        stop.set()
        t.join()
    _full_log(svc, full)
    for since, got in runs:
        end = None
        if got and got[-1].get("event") == PRUNED_EVENT:
            notice = got.pop()
            assert notice["since"] >= since and notice["first_seq"] > notice["since"] + 1, notice
            end = notice["since"]
        mine = [
            {**full[s], "seq": s}  # each streamed record says its place in the log
            for s in sorted(full)
            if s > since and (end is None or s <= end) and (c is ADMIN or owner.get(full[s].get("job")) == "alice")
        ]
        # what it read is exactly the log's events after since, in order, up to where it was told it stopped
        assert got == mine[: len(got)], (since, got[:3], mine[:3])
        if end is not None:
            assert got == mine, (since, end, len(got), len(mine))


def test_the_marks_edges(make):  # noqa: F811
    svc, api = make(event_retention=6)
    _churn(svc, api, 6)
    svc.pass_once()
    first = svc.events_first
    assert first == 7 and svc.store.first_event_seq() == first
    code, body = api.events(ADMIN, since=first - 2)
    assert code == 410 and body["first_seq"] == first and body["since"] == first - 2
    code, body = api.events(ADMIN, since=first - 1)
    assert code == 200 and len(body) == 6
    code, at = api.events(ADMIN, since=first)
    assert code == 200 and at == body[1:]
    code, above = api.events(ADMIN, since=svc.store.event_count())
    assert code == 200 and above == []
    code, beyond = api.events(ADMIN, since=svc.store.event_count() + 100)
    assert code == 200 and beyond == []


def _timeline_of(feed: LiveFeed):  # noqa: ANN202
    with feed.lock:
        feed._base = None  # not the copy shared for a second: the log as it is now
        feed._state()
        return feed.timeline


def test_the_dashboard_feed_never_skips_records_the_retention_deleted_before_it_read_them(make):  # noqa: F811
    svc, api = make(event_retention=4)
    feed = LiveFeed(svc)
    old = api.submit()  # pending: the feed sees its submission
    tl = _timeline_of(feed)
    assert tl.jobs[old].state == "pending"
    api.cancel(old)
    _churn(svc, api, 5)  # old's cancellation and 9 more records: more than the retention keeps
    svc.pass_once()  # the feed never read old's cancellation, now deleted
    assert svc.log_base > feed.cursor
    tl = _timeline_of(feed)
    fresh = _timeline_of(LiveFeed(svc))  # a feed made now: the log as kept
    # the job it last saw pending is not pending for ever: the feed replays the log as kept instead
    assert old not in tl.jobs or tl.jobs[old].state != "pending"
    assert tl.states == fresh.states and set(tl.jobs) == set(fresh.jobs)


def test_the_feed_keeps_its_place_across_pruning_it_had_read_past(make):  # noqa: F811
    svc, api = make(event_retention=4)
    feed = LiveFeed(svc)
    _churn(svc, api, 4)
    _timeline_of(feed)  # read everything
    svc.pass_once()  # 4 of 8 deleted, all of them read
    _churn(svc, api, 1)
    tl = _timeline_of(feed)
    assert feed.cursor == svc.log_base + len(svc.sched.log.records)
    assert sum(tl.states.values()) == 5  # every job once: nothing replayed, nothing skipped


# ------------------------------------------------------------------ a previous goodput on this store


def _old_store_module(commit: str = BEFORE_RETENTION):  # noqa: ANN202
    """store.py as the goodput of ``commit`` had it (from git; by default the last before the event
    retention), or a skip."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:goodput/sched/live/store.py"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    if r.returncode != 0:
        pytest.skip(f"the previous goodput's store.py is not in this checkout's history: {r.stderr.strip()}")
    name = f"goodput.sched.live._store_{commit}"
    path = Path(sys.modules["goodput.sched.live.store"].__file__).with_name(f"_store_{commit}.py")
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "goodput.sched.live"
    sys.modules[name] = mod  # its dataclasses look their module up
    exec(compile(r.stdout, str(path), "exec"), mod.__dict__)  # noqa: S102 - our own code, from git
    return mod


def test_a_store_the_retention_wrote_is_refused_by_the_previous_goodput(store_url):
    old = _old_store_module()
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(1, job="alice-1")])
    # before: it opened, appended alice's events with no tenant (invisible to her /events for ever)
    # and, once the log was pruned empty, numbered them from 1 again
    with pytest.raises(old.SchemaError, match="newer than this goodput knows"):
        old.open_store(store_url)
    with open_store(store_url) as st:
        assert [e["i"] for _s, e in st.events_since(0, 10, tenant="alice")] == [1]


def test_a_store_with_tenants_marks_is_refused_by_the_goodput_before_them(store_url):
    """The schema 2 goodput would delete events without raising their tenants' marks: a tenant's
    reader would then be moved past its own deleted events in silence."""
    old = _old_store_module(BEFORE_TENANT_MARKS)
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(1, job="alice-1")])
    with pytest.raises(old.SchemaError, match="newer than this goodput knows"):
        old.open_store(store_url)


def test_the_previous_goodputs_store_is_migrated_and_its_events_tagged(store_url):
    old = _old_store_module()
    with old.open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice"), _job(1, "bob")],
                  events=[_ev(1, job="alice-1"), _ev(2, job="bob-1"), _ev(3, node="n0")])  # fmt: skip
    with open_store(store_url) as st:
        assert [e["i"] for _s, e in st.events_since(0, 10, tenant="alice")] == [1]
        assert [e["i"] for _s, e in st.events_since(0, 10, tenant="bob")] == [2]
        assert st.first_event_seq() == 1 and st.event_count() == 3


def test_a_schema_1_store_with_the_tenant_column_has_its_untagged_events_tagged(store_url):
    """A store the first version of the retention wrote (schema 1, with the column) and that a
    previous goodput then appended to (rows with tenant ''): opened again, they are its tenant's."""
    with open_store(store_url) as st:
        st.commit(jobs=[_job(1, "alice")], events=[_ev(1, job="alice-1"), _ev(2, node="n0")])
    raw_execute(store_url, "UPDATE events SET tenant = ''")
    raw_execute(store_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", ("1",))
    with open_store(store_url) as st:
        assert [e["i"] for _s, e in st.events_since(0, 10, tenant="alice")] == [1]
    with contextlib.closing(_raw(store_url)) as db:
        cur = db.cursor()
        cur.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert json.loads(cur.fetchone()[0]) == SCHEMA_VERSION >= 2


def test_a_store_of_a_newer_schema_is_still_refused(store_url):
    with open_store(store_url):
        pass
    raw_execute(store_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaError, match="newer"):
        open_store(store_url)


# ------------------------------------------------------------------ SIGKILLs in a backlog's pruning


def _mark(db: str) -> int:
    with contextlib.closing(sqlite3.connect(db[len("sqlite:///") :], timeout=30)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'events_first_seq'").fetchone()
        return 1 if row is None else int(json.loads(row[0]))


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def test_sigkills_in_a_backlogs_pruning_leave_the_log_the_mark_and_the_counts_consistent(server, tmp_path):  # noqa: F811
    backlog = int(os.environ.get("GOODPUT_ATTACK_BACKLOG", "60000"))
    s = server(limits={"event_retention": 1_000_000})
    alice, ops = s.token("alice"), s.token("ops", "--admin")
    s.start()
    s.post("/nodes/local-00000/drain?grace_s=0", {}, ops)  # nothing runs: the records are ours alone
    code, ans = s.post("/jobs", {"name": "kept", "command": ["/bin/true"], "nodes": 1, "gpus_per_node": 1}, alice)
    assert code == 201, ans
    jid = ans["id"]
    s.stop()
    with open_store(s.db) as st:  # a long log naming alice's job (as a busy reporter's rejections would)
        for lo in range(0, backlog, 20_000):
            st.commit(events=[{"t": time.time(), "event": "commit_rejected", "job": jid, "epoch": 1,
                               "progress_s": float(i), "reason": "job is pending"} for i in range(lo, lo + 20_000)])  # fmt: skip
        total = st.event_count()
    # the bound lowered across the restart: the backlog goes 10,000 a batch, and is SIGKILLed on the way
    s.cluster.write_text(json.dumps({**json.loads(s.cluster.read_text()), "limits": {"min_run_s": 0,
                                                                                  "event_retention": 50}}))  # fmt: skip
    marks, lat = [], []
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):  # SIGKILLed a little later each time: before, in, after batches
        if marks and marks[-1] == total + 1 - 50:
            break
        s.start()
        time.sleep(delay)
        s.kill9()
        marks.append(_mark(s.db))
    s.start()
    deadline = time.monotonic() + 60
    while _mark(s.db) < total + 1 - 50 and time.monotonic() < deadline:
        a = time.perf_counter()
        assert s.get("/cluster", alice)[0] == 200
        lat.append(time.perf_counter() - a)
        time.sleep(0.015)  # under the 100 requests a second a token may make
    lat = lat or [float("nan")]
    print(f"marks at the SIGKILLs {marks}; GET /cluster p50 {_p(lat, 0.5) * 1e3:.1f} ms, "
          f"p99 {_p(lat, 0.99) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms over {len(lat)}")  # fmt: skip
    first = _mark(s.db)
    assert first == total + 1 - 50
    with open_store(s.db) as st:
        snap = st.load()  # no gap reported as corrupt: seq first .. total, contiguous
        assert snap.first_seq == first and len(snap.events) == 50 and st.event_count() == total
        pruned = st.events_pruned()
    # every record of the job that went is counted once, across all the SIGKILLs (the node's drain is
    # the one record that is not the job's)
    assert pruned == {jid: total - 50 - 1}, pruned
    view = s.get(f"/jobs/{jid}", alice)[1]
    assert view["history_dropped"] == pruned[jid] and len(view["history"]) + view["history_dropped"] == total - 1
    code, body = s.get("/events", alice)  # no since: from the mark
    assert code == 200 and len(body.splitlines()) == 50
    assert s.get(f"/events?since={first - 2}", alice)[0] == 410
    code, ans = s.post("/jobs", {"name": "next", "command": ["/bin/true"], "nodes": 1, "gpus_per_node": 1}, alice)
    assert code == 201
    with open_store(s.db) as st:
        assert [q for q, _ in st.events_since(total, 10)] == [total + 1]  # seqs go on, never reused


def test_a_previous_goodputs_big_log_is_migrated_whole(store_url):
    """The previous goodput's store with a long log (GOODPUT_ATTACK_EVENTS, 20,000 by default; the
    review ran 100,000): every event tagged with its job's tenant, node events and removed jobs' ''."""
    n = int(os.environ.get("GOODPUT_ATTACK_EVENTS", "20000"))
    old = _old_store_module()
    with old.open_store(store_url) as st:
        st.commit(jobs=[_job(i, "alice" if i % 2 else "bob") for i in range(n // 2)])
        evs = []
        for i in range(n):
            j = i % (n // 2)
            evs.append(_ev(i, node="n0") if i % 10 == 9 else _ev(i, job=f"{'alice' if j % 2 else 'bob'}-{j}"))
        evs[0] = _ev(0, job="gone-1")
        st.commit(events=evs)
    t0 = time.perf_counter()
    with open_store(store_url) as st:
        took = time.perf_counter() - t0
        alice = st.events_since(0, n + 1, tenant="alice")
        bob = st.events_since(0, n + 1, tenant="bob")
        none = st.events_since(0, n + 1, tenant="")
    print(f"\nmigrated {n} events ({store_url.split(':')[0]}): {took:.2f} s")
    assert all(e["job"].startswith("alice-") for _s, e in alice)
    assert all(e["job"].startswith("bob-") for _s, e in bob)
    assert all("node" in e or e["job"] == "gone-1" for _s, e in none)
    assert len(alice) + len(bob) + len(none) == n and len(none) == n // 10 + 1
