"""The live service under hostile input and unlucky operation (issue 24, items 3-6): a real
``goodput sched serve`` subprocess, real HTTP, SQLite locked by another real process."""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .test_service import PY, _cli, _spec
from .test_service import server as server  # noqa: F401 - the fixture


def _raw(s, method: str, path: str, body: bytes, token: str, timeout: float = 30.0) -> tuple[int, dict, dict]:  # noqa: ANN001
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=timeout)
    try:
        conn.request(
            method, path, body=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        )
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw or b"null"), dict(r.getheaders())
        except ValueError:
            return r.status, {"raw": raw.decode(errors="replace")}, dict(r.getheaders())
    finally:
        conn.close()


def _names(err: dict) -> str:
    return json.dumps(err.get("detail"))


def test_hostile_inputs_are_4xx_naming_the_field_and_the_service_goes_on(server, tmp_path):  # noqa: F811
    s = server()
    alice = s.token("alice")
    s.start()
    ok = json.dumps(_spec(tmp_path / "h", 5))[1:-1]  # the body's fields, to put one bad one beside
    cases = [
        (b'{"command": ["\\ud800"]}', "command"),  # a lone surrogate
        (b'{"command": ["a\\u0000b"]}', "command"),  # NUL
        (("{" + ok + ', "limit_s": NaN}').encode(), "limit_s"),
        (("{" + ok + ', "grace_s": 1e999}').encode(), "grace_s"),
        (("{" + ok + ', "ckpt_root": "/tmp/\\ud800"}').encode(), "ckpt_root"),
        (("{" + ok + ', "env": {"X": "\\u0000"}}').encode(), "env"),
        (("{" + ok + ', "env": {"GOODPUT_JOB_ID": "x"}}').encode(), "env"),
        (("{" + ok + ', "grace_s": 100000000}').encode(), "grace_s"),  # a preemption never honoured
        (("{" + ok + ', "grace_s": 601}').encode(), "grace_s"),  # above the cluster's max_grace_s
        (("{" + ok + ', "restart_s": 1801}').encode(), "restart_s"),  # above max_restart_s
        (("{" + ok + ', "ckpt_root": "/etc/cron.d"}').encode(), "ckpt_root"),  # outside the tenant's prefix
        (("{" + ok + f', "ckpt_root": "{tmp_path}/../../etc"}}').encode(), "ckpt_root"),
        (("{" + ok + ', "priority": 10000000000000000000000}').encode(), "priority"),
        (json.dumps({**_spec(tmp_path, 5), "command": ["x"] * 100_000}).encode(), "command"),
    ]
    for body, field in cases:
        code, err, _ = _raw(s, "POST", "/jobs", body, alice)
        assert code == 422 and field in _names(err), (body[:120], code, err)
    big = b'{"command": ["' + b"x" * (30 << 20) + b'"]}'  # 30 MB: refused before it is read
    code, err, _ = _raw(s, "POST", "/jobs", big, alice)
    assert code == 413 and "body" in err["detail"], err
    code, err, _ = _raw(s, "POST", "/jobs", b"[" * 100_000 + b"]" * 100_000, alice)
    assert 400 <= code < 500, (code, err)
    # a commit report's numbers are bounded too, and queries
    code, err, _ = _raw(s, "GET", "/events?since=100000000000000000000000000000", b"", alice)
    assert code == 422 and "since" in _names(err), err
    # the service goes on: a job submitted after every one of these still finishes
    code, ans = s.post("/jobs", _spec(tmp_path / "after", 20), alice)
    assert code == 201, ans
    j = s.wait_job(ans["id"], alice, lambda j: j["state"] == "finished")
    assert j["failures"] == 0 and j["checkpoint"]["committed_s"] > 0
    assert s.get("/jobs", alice)[0] == 200


def test_dropped_follow_streams_leave_the_service_answering(server, tmp_path):  # noqa: F811
    s = server()
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    req = f"GET /events?follow=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {bob}\r\n\r\n".encode()
    for _ in range(40):  # a tenant with no jobs opens follow streams and drops them, one after another
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(req)
        assert c.recv(64).split(b" ")[1] in (b"200", b"429")
        c.close()
    held, statuses = [], []
    for _ in range(40):  # and then 40 at once, held open: capped per tenant, the rest refused at once
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(req)
        statuses.append(c.recv(64).split(b" ")[1])
        held.append(c)
    assert statuses.count(b"200") <= 4 and statuses.count(b"429") >= 36, statuses
    for c in held:
        c.close()
    for path, tok in (("/healthz", ""), ("/jobs", alice)):  # a bound on one request, not a benchmark
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=1.0)
        conn.request("GET", path, headers={"Authorization": f"Bearer {tok}"} if tok else {})
        assert conn.getresponse().status == 200
        conn.close()
    # the dropped streams were noticed: their slots are free again within a second or so
    deadline = time.monotonic() + 5
    while True:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        c.sendall(req)
        got = c.recv(64).split(b" ")[1]
        c.close()
        if got == b"200":
            break
        assert time.monotonic() < deadline, "dropped follow streams still count after 5 s"
        time.sleep(0.2)
    assert s.get("/service", s._admin)[1]["streams"].get("bob", 0) <= 1


HOLD = (
    "import sqlite3, sys, time\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "c.execute('ROLLBACK')\n"
)


def test_a_store_locked_by_another_process_is_503_then_exactly_one_job_per_key(server, tmp_path):  # noqa: F811
    """The issue's 40 s lock, made 5 s here (the 40 s one is the slow test below): the behaviour is the
    same for any lock longer than the service's busy timeout (2 s), each write waits that long and fails."""
    _locked_store_keyed(server, tmp_path, 5.0)


@pytest.mark.slow
def test_a_store_locked_for_40_s_is_503_then_exactly_one_job_per_key(server, tmp_path):  # noqa: F811
    """The issue's own case: SQLite write-locked by another process for 40 s during keyed submissions.
    Twenty busy-timeouts in a row, the loop's passes and the watcher's exit reports all refused
    meanwhile: still 503s, then exactly one job per key, and nothing `running` that has finished."""
    _locked_store_keyed(server, tmp_path, 40.0)


def _locked_store_keyed(server, tmp_path, hold_s: float) -> None:  # noqa: ANN001, F811
    from goodput.sched.sim.checker import check

    s = server(nodes=1)
    alice = s.token("alice")
    s.start()
    # a short job that finishes while the store is locked: its exit is reported once the lock goes
    code, short = s.post(
        "/jobs", _spec(tmp_path / "short", 0, name="short", command=[PY, "-c", "import time; time.sleep(3)"]), alice
    )
    assert code == 201
    s.wait_job(short["id"], alice, lambda j: j["state"] == "running")
    db = s.db[len("sqlite:///") :]
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db, str(hold_s)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    t_locked = time.monotonic()
    keys = [f"k{i}" for i in range(4)]
    seen: dict[str, list[int]] = {k: [] for k in keys}
    ids: dict[str, str] = {}

    def client(key: str) -> None:
        body = _spec(tmp_path / key, 0, name="keyed", key=key, priority=-1, command=[PY, "-c", "pass"])
        while True:
            code, ans = s.post("/jobs", body, alice)
            seen[key].append(code)
            if code in (200, 201):
                ids[key] = ans["id"]
                return
            assert code == 503, (code, ans)
            time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=hold_s + 120)
    holder.wait(timeout=30)
    assert all(not t.is_alive() for t in threads)
    assert any(503 in v for v in seen.values()), seen  # refused while locked (Retry-After), not hung
    assert time.monotonic() - t_locked >= hold_s - 1
    # exactly one job per key, as many submitted events as keys
    jobs = s.get("/jobs?name=keyed", alice)[1]["jobs"]
    assert sorted(j["key"] for j in jobs) == keys and sorted(j["id"] for j in jobs) == sorted(ids.values())
    events = [json.loads(x) for x in s.get("/events", alice)[1].splitlines()]
    assert sum(1 for e in events if e["event"] == "submitted" and e["job"] in ids.values()) == len(keys)
    # the job that ended during the lock is not left running
    j = s.wait_job(short["id"], alice, lambda j: j["state"] == "finished", timeout=30)
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["finished"]
    for jid in ids.values():
        s.wait_job(jid, alice, lambda j: j["state"] == "finished", timeout=60)
    # nothing shows `running` that has finished: every job's process is gone and every job says so
    assert [j["state"] for j in s.get("/jobs", alice)[1]["jobs"]] == ["finished"] * (len(keys) + 1)
    events = [json.loads(x) for x in s.get("/events", s._admin)[1].splitlines()]
    assert check(events, {"local-00000": 1}).total == 0
    assert s.get("/healthz", "")[1] == {"ok": True}


def test_a_tenants_queued_jobs_are_bounded_by_the_clusters_limit(server, tmp_path):  # noqa: F811
    """limits.max_queued_per_tenant = 3 on one slot: alice's fourth job not yet ended is a 429 naming
    the limit (admins' submissions count against their own tenant's the same way); a keyed retry of an
    accepted one still answers; bob is not held up; once one of hers ends she may submit again."""
    s = server(nodes=1, limits={"max_queued_per_tenant": 3})
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    sleep = [PY, "-c", "import time; time.sleep(600)"]
    ids = []
    for i in range(3):
        code, ans = s.post("/jobs", _spec(tmp_path / f"a{i}", 0, name=f"a{i}", command=sleep, key=f"a{i}"), alice)
        assert code == 201, ans
        ids.append(ans["id"])
    s.wait_job(ids[0], alice, lambda j: j["state"] == "running")  # one runs, two wait: all three count
    code, err, headers = _raw(s, "POST", "/jobs", json.dumps(_spec(tmp_path / "a3", 0, command=sleep)).encode(), alice)
    assert code == 429 and "max_queued_per_tenant" in err["detail"] and "3" in err["detail"], err
    assert headers.get("retry-after") or headers.get("Retry-After"), headers
    code, ans = s.post("/jobs", _spec(tmp_path / "a1", 0, name="a1", command=sleep, key="a1"), alice)
    assert code == 200 and ans["id"] == ids[1], ans  # a replay is no new job
    assert len(s.get("/jobs", alice)[1]["jobs"]) == 3
    code, ans = s.post("/jobs", _spec(tmp_path / "b0", 0, name="b0", command=sleep), bob)
    assert code == 201, ans  # per tenant
    assert s.post(f"/jobs/{ids[2]}/cancel", {}, alice)[0] == 200  # a pending one ends
    deadline = time.monotonic() + 5
    while True:
        code, ans = s.post("/jobs", _spec(tmp_path / "a4", 0, name="a4", command=sleep), alice)
        if code == 201 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert code == 201, ans
    ids.append(ans["id"])
    assert s.post("/jobs", _spec(tmp_path / "a5", 0, name="a5", command=sleep), alice)[0] == 429
    for jid in ids:
        s.post(f"/jobs/{jid}/cancel", {}, alice)


def test_a_runs_log_is_capped_keeping_its_tail_and_saying_so(server, tmp_path):  # noqa: F811
    """limits.max_log_bytes = 100,000: a real job prints 1,000,000 bytes. Its log stays under the cap,
    keeps the newest output (the last line included), says on its first line how much was dropped, and
    the job's last_exit says it too; the count is exact: dropped + kept = printed."""
    s = server(nodes=1, limits={"max_log_bytes": 100_000})
    alice = s.token("alice")
    s.start()
    lines = 20_000  # 50 bytes each
    prog = (
        "import sys\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.write(f'line {i:08d} ' + 'x' * 35 + '\\n')\n"
        "sys.stdout.write('LAST LINE\\n')\n"
    )
    printed = lines * 50 + len("LAST LINE\n")
    code, ans = s.post("/jobs", _spec(tmp_path / "loud", 0, name="loud", command=[PY, "-c", prog]), alice)
    assert code == 201, ans
    j = s.wait_job(ans["id"], alice, lambda j: j["state"] == "finished")
    log = (s.state / "logs" / f"{ans['id']}.1.log").read_bytes()
    assert len(log) <= 100_000, len(log)
    first, _, kept = log.partition(b"\n")
    assert b"bytes of this run's output were dropped" in first and b"max_log_bytes = 100000" in first, first
    assert kept.endswith(b"LAST LINE\n") and kept.count(b"line ") >= 900, kept[-200:]
    dropped = j["last_exit"]["log_dropped_bytes"]
    assert str(dropped).encode() in first  # the count the log states is the one the service reports
    assert dropped + len(kept) == printed, (dropped, len(kept), printed)
    assert j["log"] == {"max_bytes": 100_000, "dropped_bytes": dropped}
    # and while a run is still going: its view says how much its log has dropped so far
    loud = prog.replace("sys.stdout.write('LAST LINE\\n')", "sys.stdout.flush(); import time; time.sleep(600)")
    code, ans = s.post("/jobs", _spec(tmp_path / "loud2", 0, name="loud2", command=[PY, "-c", loud]), alice)
    assert code == 201, ans
    j = s.wait_job(ans["id"], alice, lambda j: j["state"] == "running" and j["log"]["dropped_bytes"])
    assert 0 < j["log"]["dropped_bytes"] < lines * 50
    assert s.post(f"/jobs/{ans['id']}/cancel", {}, alice)[0] == 200


def test_tokens_listed_revoked_and_expired(server, tmp_path):  # noqa: F811
    s = server()
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    brief = s.token("carol", "--expires", "6s")
    assert s.get("/jobs", alice)[0] == 200 and s.get("/jobs", bob)[0] == 200  # both cached now
    assert s.get("/jobs", brief)[0] == 200
    r = _cli("sched", "token", "ls", "--db", s.db, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {x["tenant"] for x in rows} >= {"alice", "bob", "carol"}
    assert all(alice not in json.dumps(x) for x in rows)  # never the secret, only a prefix
    assert any(x["prefix"] == alice[:11] for x in rows)
    r = _cli("sched", "token", "revoke", "alice", "--db", s.db)  # by tenant
    assert r.returncode == 0 and "revoked 1" in r.stdout, r.stderr
    r = _cli("sched", "token", "revoke", bob[:11], "--db", s.db)  # by the prefix `ls` shows
    assert r.returncode == 0 and "revoked 1" in r.stdout, r.stderr
    time.sleep(1.0)  # within a second, cached or not
    assert s.get("/jobs", alice)[0] == 401 and s.get("/jobs", bob)[0] == 401
    # the expiry the store holds (set when `token add` ran, which may start seconds after t0 on a busy machine)
    expires = next(x["expires"] for x in rows if x["tenant"] == "carol")
    assert expires is not None and expires <= time.time() + 6.5
    time.sleep(max(0.0, expires + 0.2 - time.time()))
    code, err = s.get("/jobs", brief)
    assert code == 401, err
    assert _cli("sched", "token", "revoke", "nobody", "--db", s.db).returncode == 1


def test_rate_limited_per_token(server, tmp_path):  # noqa: F811
    s = server()
    s.extra = (*s.extra, "--rate-limit", "5")
    alice = s.token("alice")
    s.start()
    codes = [s.get("/jobs", alice)[0] for _ in range(30)]
    assert 429 in codes and codes[0] == 200, codes


def test_a_command_killed_by_a_signal_is_failed_with_backoff_and_its_budget(server, tmp_path):  # noqa: F811
    s = server()
    alice = s.token("alice")
    s.start()
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"  # as the OOM killer would
    code, ans = s.post("/jobs", _spec(tmp_path / "oom", 0, name="oom", command=[PY, "-c", kill], max_failures=1), alice)
    assert code == 201
    j = s.wait_job(ans["id"], alice, lambda j: j["failures"] == 1 and j["state"] == "pending", timeout=60)
    assert j["substate"] == "backoff" and j["infra_losses"] == 0 and j["epoch"] == 1  # not `lost`
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["failed"]
    assert [h["reason"] for h in j["history"] if h["event"] == "requeued"] == ["failure"]
    assert j["last_exit"]["signal"] == "SIGKILL" and j["last_exit"]["rc"] == -9
    assert s.post(f"/jobs/{ans['id']}/cancel", {}, alice)[0] == 200


def test_a_restart_with_another_state_dir_is_refused_naming_the_recorded_one(server, tmp_path):  # noqa: F811
    s = server()
    s.token("alice")
    s.start()
    s.stop()
    r = subprocess.run(
        [PY, "-c", "from goodput.cli.main import app; app()", "sched", "serve", "--db", s.db, "--port", "1",
         "--cluster", str(s.cluster), "--state-dir", str(tmp_path / "elsewhere"), *s.extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and str((tmp_path / "state").resolve()) in r.stderr, r.stderr
    assert not Path(tmp_path / "elsewhere" / "runs").exists()
    _ = sqlite3  # the store is untouched by the refusal: the next start with the right dir works
    s2 = server(db=s.db)
    s2.start()


def test_another_tenants_job_is_never_named_and_its_checkpoints_never_listed(server, tmp_path):  # noqa: F811
    """One slot: bob's higher-priority job preempts alice's. alice's views and events say that
    "another tenant's job" did it, never which; bob's priority cap holds; and a link bob made from his
    prefix to alice's checkpoint root shows him nothing of hers."""
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    tenants = [
        {"name": "alice", "ckpt_prefix": str(tmp_path / "alice")},
        {"name": "bob", "ckpt_prefix": str(tmp_path / "bob"), "max_priority": 5},
    ]
    s = server(nodes=1, tenants=tenants)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    code, err = s.post("/jobs", _spec(tmp_path / "bob" / "x", 5, priority=6), bob)
    assert code == 422 and any("priority" in d["loc"] for d in err["detail"]), err  # above max_priority
    a_root = tmp_path / "alice" / "low"
    _, low = s.post("/jobs", _spec(a_root, 250, name="low", ckpt_interval_s=1, ckpt_write_s=0.5), alice)
    s.wait_job(low["id"], alice, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0)
    code, high = s.post("/jobs", _spec(tmp_path / "bob" / "high", 5, name="high", priority=5), bob)
    assert code == 201, high
    s.wait_job(high["id"], bob, lambda j: j["state"] == "finished")
    j = s.wait_job(low["id"], alice, lambda j: j["preemptions"] == 1)
    text = json.dumps(j) + s.get("/events", alice)[1]
    assert high["id"] not in text
    pre = next(h for h in j["history"] if h["event"] == "preempt_requested")
    assert pre["victim_of"] == "another tenant's job" and pre["preemptor"] == "another tenant's job"
    admin_view = s.get(f"/jobs/{low['id']}", s._admin)[1]
    assert next(h for h in admin_view["history"] if h["event"] == "preempt_requested")["victim_of"] == high["id"]
    s.wait_job(low["id"], alice, lambda j: j["state"] == "finished", timeout=120)
    assert s.get(f"/jobs/{low['id']}", alice)[1]["checkpoint"]["latest_on_disk"] is not None
    (tmp_path / "bob" / "link").symlink_to(a_root)  # as bob's job could, inside his own prefix
    spec = _spec(tmp_path / "bob" / "link", 0, name="peek", command=[PY, "-c", "pass"])
    code, peek = s.post("/jobs", spec, bob)
    assert code == 201, peek
    jb = s.wait_job(peek["id"], bob, lambda j: j["state"] == "finished")
    assert jb["checkpoint"]["latest_on_disk"] is None  # its real path is alice's, outside bob's prefix


def test_a_start_whose_commit_fails_is_killed_and_runs_once_after(tmp_path):
    """In-process, passes run by hand: the pass that starts a job cannot commit (another process holds
    SQLite's write lock), so memory is rebuilt from the store and the run it launched is killed; once
    the lock is gone the job starts again, as the same epoch, and finishes: one `started` event."""
    from goodput.sched.core.governance import Governance, TenantSpec
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.service import Service, local_pools
    from goodput.sched.live.store import open_store

    db = f"sqlite:///{tmp_path / 's.db'}"
    gov = Governance(tenants={"t": TenantSpec("t", ckpt_prefix=str(tmp_path))})
    svc = Service(db, local_pools(1, 1), state_dir=tmp_path / "state", url="http://127.0.0.1:9", governance=gov,
                  allow_root_jobs=True, poll_s=0.05)  # fmt: skip
    svc.executor.start_watcher()  # no loop thread: the test runs the passes
    try:
        job = Job(id="j.00000001", tenant="t", priority=0, nodes=1, gpus_per_node=1, submit_s=time.time())
        job.command = (PY, "-c", "import time; time.sleep(1)")
        job.ckpt_root = str(tmp_path / "j")
        with svc.lock:
            svc.sched.submit(job)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(tmp_path / "s.db"), "5"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout.readline().strip() == "locked"
        svc.pass_once()  # launches the run, cannot commit the start: rebuilt, the run killed
        j = svc.sched.jobs[job.id]
        assert j.state is JobState.PENDING and j.epoch == 0 and not svc.degraded
        first = svc.executor.runs.get(job.id)
        assert first is None or first.killed
        with open_store(db) as st:  # the store never saw the start
            assert st.load().jobs[job.id].state is JobState.PENDING
        holder.wait(timeout=30)
        svc.pass_once()
        deadline = time.monotonic() + 30
        while svc.sched.jobs[job.id].state is not JobState.FINISHED:
            assert time.monotonic() < deadline, svc.sched.jobs[job.id]
            time.sleep(0.05)
        assert svc.sched.jobs[job.id].epoch == 1
        recs = [e for e in svc.sched.log.records if e.get("job") == job.id]
        assert [e["event"] for e in recs].count("started") == 1
        assert [e["status"] for e in recs if e["event"] == "exited"] == ["finished"]
    finally:
        svc.close()


def test_a_tokens_first_use_never_holds_up_the_event_loop(server, tmp_path, fresh_pg_url):  # noqa: F811
    """PostgreSQL, whose reads wait for a table lock: another session locks ``tokens`` for 3 s; a token
    the cache does not hold is looked up meanwhile (it waits, on a thread of its own); /healthz and a
    cached token's GET /jobs answer within a second all the same."""
    import psycopg

    s = server(db=fresh_pg_url)
    alice = s.token("alice")
    s.start()
    assert s.get("/jobs", alice)[0] == 200  # cached
    results: list[int] = []
    with psycopg.connect(fresh_pg_url) as conn:
        conn.execute("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        t = threading.Thread(target=lambda: results.append(s.get("/jobs", "gp_not_a_token_in_the_cache")[0]))
        t.start()
        time.sleep(0.5)  # the lookup is waiting for the lock now
        for path, tok in (("/healthz", ""), ("/jobs", alice)):  # a bound on one request, not a benchmark
            conn2 = http.client.HTTPConnection("127.0.0.1", s.port, timeout=1.0)
            conn2.request("GET", path, headers={"Authorization": f"Bearer {tok}"} if tok else {})
            assert conn2.getresponse().status == 200
            conn2.close()
        assert not results  # still waiting
        time.sleep(2.5)
        conn.rollback()  # the lock goes
    t.join(timeout=30)
    assert results == [401]


def test_the_heads_reservation_is_named_only_to_its_tenant_and_no_cdn_docs(server, tmp_path):  # noqa: F811
    """alice's 3-node gang waits for her two running 1-node jobs and holds the reservation: bob's
    /queue and /cluster say one is in force but never whose (a job id carries its name); alice and
    the admin see it. /docs and /redoc (scripts from a CDN on the dashboard's origin) are off."""
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    tenants = [{"name": "alice", "ckpt_prefix": str(tmp_path / "alice")}, {"name": "bob"}]
    s = server(nodes=3, tenants=tenants)  # one node stays free: a full cluster plans no reservation
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    runs = [s.post("/jobs", _spec(tmp_path / "alice" / f"r{i}", 2000, name=f"r{i}"), alice)[1] for i in range(2)]
    for r in runs:
        s.wait_job(r["id"], alice, lambda j: j["state"] == "running")
    code, gang = s.post("/jobs", _spec(tmp_path / "alice" / "gang", 5, name="secret-gang", nodes=3), alice)
    assert code == 201, gang
    deadline = time.monotonic() + 60
    while True:
        res = s.get("/queue", alice)[1]["summary"]["reservation"]
        if res is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert res is not None and res["job"] == gang["id"], res
    for path in ("/queue", "/cluster"):
        seen = s.get(path, bob)[1]
        assert seen["summary" if path == "/queue" else "reservation"] is not None
        assert gang["id"] not in json.dumps(seen) and "secret-gang" not in json.dumps(seen), seen
    assert s.get("/cluster", s._admin)[1]["reservation"]["job"] == gang["id"]
    for path in ("/docs", "/redoc"):
        assert _raw(s, "GET", path, b"", bob)[0] == 404
    assert _raw(s, "GET", "/openapi.json", b"", bob)[0] == 200
    for r in runs:
        s.post(f"/jobs/{r['id']}/cancel", {}, alice)
