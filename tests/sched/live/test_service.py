"""The live service end to end: a real uvicorn server, real job processes, SQLite in a temp dir."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from goodput.demo.example_job import expected_weights
from goodput.sched.live.client import post_json
from tests.sched.live.tokens import add_token

PY = sys.executable
JOB = [PY, "-m", "goodput.demo.example_job"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-c", "from goodput.cli.main import app; app()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def cluster_json(path: Path, nodes: int, tenants: list[dict] | None = None, **limits: float) -> Path:
    """A one-pool cluster of ``nodes`` 1-GPU slots (named as ``serve --nodes`` names them), the
    tenants' users and checkpoint prefixes, and limits that let a young run be preempted."""
    obj = {
        "pools": [{"name": "local", "kind": "on-demand", "nodes": nodes, "gpus_per_node": 1, "price_per_gpu_hour": 1}],
        "tenants": tenants or [],
        "limits": {"min_run_s": 0, **limits},
    }
    path.write_text(json.dumps(obj))
    return path


class Server:
    """``goodput sched serve`` as a subprocess. By default as the single-user machine these tests run
    on (``--allow-root-jobs`` when root), the tenants alice, bob and ops with the test's directory as
    their checkpoint prefix; ``tenants`` replaces them (the isolation tests map them to users)."""

    def __init__(
        self,
        tmp: Path,
        nodes: int = 1,
        db: str = "",
        tenants: list[dict] | None = None,
        extra: tuple = (),
        limits: dict | None = None,
    ) -> None:
        self.tmp = tmp
        self.db = db or f"sqlite:///{tmp / 'sched.db'}"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.nodes = nodes
        self.proc: subprocess.Popen | None = None
        if tenants is None:
            tenants = [{"name": t, "ckpt_prefix": str(tmp)} for t in ("alice", "bob", "ops")]
        self.tenants = tenants
        self.extra = tuple(extra) or (("--allow-root-jobs",) if os.geteuid() == 0 else ())
        self.cluster = cluster_json(tmp / f"cluster-{self.port}.json", nodes, tenants, **(limits or {}))
        self._admin = ""
        self.env: dict[str, str] | None = None  # the service's environment (default: the test's)
        self.state = tmp / "state"

    def token(self, tenant: str, *extra: str) -> str:
        return add_token(self.db, tenant, *extra)

    def start(self) -> Server:
        with open(self.tmp / "serve.log", "ab") as log:
            self.proc = self._spawn(log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    assert json.loads(r.read()) == {"ok": True}  # up or down, nothing more without a token
                    break
            except OSError:
                assert self.proc.poll() is None, (self.tmp / "serve.log").read_text()
                time.sleep(0.1)
        else:
            raise AssertionError("service did not come up")
        if not self._admin:
            self._admin = self.token("ops-admin", "--admin")
        code, self.health = self.get("/service", self._admin)  # restored, adopted: for the operator only
        assert code == 200, self.health
        return self

    def _spawn(self, log) -> subprocess.Popen:  # noqa: ANN001
        return subprocess.Popen(
            [PY, "-c", "from goodput.cli.main import app; app()", "sched", "serve", "--db", self.db]
            + ["--port", str(self.port), "--cluster", str(self.cluster)]
            + ["--state-dir", str(self.state), "--tick-s", "0.2", *self.extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def get(self, path: str, token: str) -> tuple[int, object]:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
                ctype = r.headers.get("content-type", "")
                return r.status, raw.decode() if "ndjson" in ctype else json.loads(raw)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def post(self, path: str, body: dict, token: str) -> tuple[int, object]:
        return post_json(self.url + path, body, token)

    def wait_job(self, jid: str, token: str, pred, timeout: float = 90.0) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while True:
            code, j = self.get(f"/jobs/{jid}", token)
            assert code == 200, j
            if pred(j):
                return j
            assert time.monotonic() < deadline, json.dumps(j)[:3000]
            time.sleep(0.1)


@pytest.fixture
def server(tmp_path):
    servers: list[Server] = []

    def make(nodes: int = 1, db: str = "", **kw) -> Server:  # noqa: ANN003
        s = Server(tmp_path, nodes, db, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
    # leave no job processes behind
    for rec in (tmp_path / "state" / "runs").glob("*.json") if (tmp_path / "state").exists() else ():
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(json.loads(rec.read_text())["pgid"], signal.SIGKILL)


def _spec(root: Path, steps: int, **kw) -> dict:  # noqa: ANN003
    body = {
        "name": kw.pop("name", "train"),
        "command": [*JOB, "--steps", str(steps), "--step-s", "0.02", "--interval", "10"],
        "nodes": 1,
        "gpus_per_node": 1,
        "priority": 0,
        "limit_s": 600,
        "ckpt_root": str(root),
        "grace_s": 20,
    }
    body.update(kw)
    return body


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    """The service's store: SQLite in the test's dir, or a fresh database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sched.db'}"
    return request.getfixturevalue("fresh_pg_url")  # skips with its reason where the server is absent


def _restart(server, old: Server) -> Server:  # noqa: ANN001
    """A new service process on the old one's store, state dir and port (the jobs know it by its URL)."""
    s2 = server(nodes=old.nodes, db=old.db, tenants=old.tenants, extra=old.extra)
    s2.port, s2.url, s2.cluster, s2._admin = old.port, old.url, old.cluster, old._admin
    return s2.start()


def _run_record(tmp: Path, jid: str, epoch: int) -> dict:
    return json.loads((tmp / "state" / "runs" / f"{jid}.{epoch}.json").read_text())


def _group_gone(pgid: int) -> bool:
    """No live process left in the group. A zombie still counts for killpg until its parent reaps
    it, and a run's supervisor orphaned by a SIGKILLed service is reaped by init, when init gets to
    it; it holds nothing (no slot, no memory), so it counts as gone."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, PermissionError):
            continue
    return True


def _starts(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "starts.jsonl").read_text().splitlines()]


def test_submit_runs_and_finishes(server, tmp_path):
    s = server()
    tok = s.token("alice")
    s.start()
    code, ans = s.post("/jobs", _spec(tmp_path / "a", 30), tok)
    assert code == 201, ans
    j = s.wait_job(ans["id"], tok, lambda j: j["state"] == "finished")
    assert j["epoch"] == 1 and j["restarts"] == 0 and j["substate"] == "finished"
    assert [h["event"] for h in j["history"]][:2] == ["submitted", "started"]
    assert j["checkpoint"]["committed_s"] > 0  # the job's commit reports reached the core
    assert j["checkpoint"]["last_report"]["step"] in (20, 30)
    assert j["checkpoint"]["latest_on_disk"].endswith("step_000000030")
    assert json.loads((tmp_path / "a" / "final.json").read_text())["w"] == expected_weights(30)
    code, events = s.get("/events", tok)
    recs = [json.loads(x) for x in events.splitlines()]
    assert {"submitted", "started", "checkpoint_committed", "exited", "released", "finished"} <= {
        r["event"] for r in recs
    }
    env = {"GOODPUT_TOKEN": tok}
    r = _cli("sched", "ls", "--url", s.url, "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["id"] == ans["id"], r.stderr
    r = _cli("sched", "show", ans["id"], "--url", s.url, env=env)
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr
    r = _cli("sched", "show", ans["id"], "--url", s.url, env={"GOODPUT_TOKEN": "gp_wrong"})
    assert r.returncode != 0 and "401" in r.stderr
    code, doc = s.get("/openapi.json", tok)
    assert code == 200 and "/jobs/{job_id}" in doc["paths"]


def test_higher_priority_preempts_and_the_victim_resumes_from_its_commit(server, tmp_path):
    s = server(nodes=1)
    tok = s.token("alice")
    s.start()
    low_root, high_root = tmp_path / "low", tmp_path / "high"
    _, low = s.post("/jobs", _spec(low_root, 200, name="low", ckpt_interval_s=1, ckpt_write_s=0.5), tok)
    s.wait_job(low["id"], tok, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0)
    _, high = s.post("/jobs", _spec(high_root, 10, name="high", priority=10), tok)
    s.wait_job(high["id"], tok, lambda j: j["state"] == "finished")
    j = s.wait_job(low["id"], tok, lambda j: j["state"] == "finished", timeout=90)
    assert j["preemptions"] == 1 and j["failures"] == 0 and j["epoch"] == 2
    ev = [h["event"] for h in j["history"]]
    assert ev.count("preempt_requested") == 1 and ev.count("requeued") == 1
    pre = next(h for h in j["history"] if h["event"] == "preempt_requested")
    assert pre["victim_of"] == high["id"] and pre["checkpoint"] is True
    exited = [h["status"] for h in j["history"] if h["event"] == "exited"]
    assert exited == ["preempted", "finished"]
    starts = _starts(low_root)
    assert [x["epoch"] for x in starts] == [1, 2]
    assert starts[1]["restored_step"] > 0  # resumed from the committed checkpoint, not from scratch
    assert json.loads((low_root / "final.json").read_text())["w"] == expected_weights(200)
    # the high job started only after the victim was gone
    hj = s.wait_job(high["id"], tok, lambda j: True)
    t_start = next(h["t"] for h in hj["history"] if h["event"] == "started")
    t_gone = next(h["t"] for h in j["history"] if h["event"] == "released")
    assert t_gone <= t_start


def test_auth_and_validation(server, tmp_path):
    s = server()
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    assert s.get("/jobs", "")[0] == 401
    assert s.get("/jobs", "gp_wrong")[0] == 401
    assert s.post("/jobs", _spec(tmp_path / "x", 5), "gp_wrong")[0] == 401
    code, ans = s.post("/jobs", _spec(tmp_path / "a", 400), alice)
    assert code == 201
    jid = ans["id"]
    assert s.get(f"/jobs/{jid}", bob)[0] == 404
    assert s.post(f"/jobs/{jid}/cancel", {}, bob)[0] == 404
    assert s.get("/jobs", bob)[1]["jobs"] == []
    assert s.get(f"/jobs/{jid}", alice)[1]["state"] != "cancelled"  # bob changed nothing
    # bad specs: 422 naming the field
    for bad, field in (
        ({"nodes": 0}, "nodes"),
        ({"command": []}, "command"),
        ({"gpus_per_node": 2}, "gpus_per_node"),  # no pool offers 2 GPUs per node
        ({"ckpt_root": "relative/dir"}, "ckpt_root"),
        ({"limit_s": -1}, "limit_s"),
        ({"colour": "red"}, "colour"),
    ):
        code, err = s.post("/jobs", _spec(tmp_path / "y", 5, **bad), alice)
        assert code == 422, (bad, err)
        assert any(field in d["loc"] for d in err["detail"]), (bad, err)
    # only job tokens report commits: a tenant's own token (or an admin's) may not
    s.wait_job(jid, alice, lambda j: j["state"] == "running")
    code, ans = s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": 1.0}, alice)
    assert code == 403 and "job token" in ans["detail"], ans
    assert s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": 1.0}, s._admin)[0] == 403
    from goodput.sched.live.service import new_token
    from goodput.sched.live.store import open_store

    with open_store(s.db) as store:  # a stored job token (any run of the job): its reports are judged
        own = new_token(store, "alice", "job", jid)
        other_job = new_token(store, "alice", "job", "other.00000000")
    time.sleep(1.0)  # the service's token cache refreshes within a second
    code, ans = s.post(f"/jobs/{jid}/commits", {"epoch": 7, "progress_s": 1.0}, own)
    assert code == 409 and "stale epoch" in ans["reason"]
    # a fast-tier commit is shown, never counted: it does not survive the loss of a node (its progress just
    # past the committed, within the time the run has had, which bounds every report; the job's own
    # durable reports may pass it meanwhile: then again)
    for _ in range(50):
        fast = s.get(f"/jobs/{jid}", alice)[1]["checkpoint"]["committed_s"] + 0.5
        code, ans = s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": fast, "tier": "fast"}, own)
        if code == 200 or "behind" not in ans["reason"]:
            break
    assert code == 200 and ans["accepted"], ans
    ck = s.get(f"/jobs/{jid}", alice)[1]["checkpoint"]
    assert ck["last_fast_report"]["progress_s"] == fast and ck["committed_s"] != fast
    code, err = s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": 1.0, "tier": "nvme"}, own)
    assert code == 422 and any("tier" in d["loc"] for d in err["detail"])
    code, ans = s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": 1.0}, other_job)
    assert code == 403
    assert s.get("/jobs", other_job)[0] == 403  # a job token reports commits, nothing else
    # a run's own token (an HMAC of job and epoch): the right run only; a forged one is unknown
    run_tok = (Path(_run_record(tmp_path, jid, 1)["workdir"]) / "token").read_text()
    assert run_tok.startswith("gpj_") and run_tok.endswith(f".1.{jid}")
    assert s.post(f"/jobs/{jid}/commits", {"epoch": 2, "progress_s": 1.0}, run_tok)[0] == 403
    forged = "gpj_" + "A" * 43 + f".1.{jid}"
    assert s.post(f"/jobs/{jid}/commits", {"epoch": 1, "progress_s": 1.0}, forged)[0] == 401
    code, ans = s.post(f"/jobs/{jid}/cancel", {}, alice)
    assert code == 200
    s.wait_job(jid, alice, lambda j: j["state"] == "cancelled")


def test_service_killed_and_restarted_readopts_the_running_job(server, tmp_path, db):
    s = server(db=db)
    tok = s.token("alice")
    s.start()
    root = tmp_path / "a"
    _, ans = s.post("/jobs", _spec(root, 200), tok)
    jid = ans["id"]
    s.wait_job(jid, tok, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0)
    s.kill9()
    s2 = _restart(server, s)
    assert s2.health["restored"] is True and s2.health["adopted"] == {jid: "adopted"}
    j = s2.wait_job(jid, tok, lambda j: j["state"] == "finished", timeout=90)
    assert j["epoch"] == 1 and j["restarts"] == 0  # the same run, never started twice
    assert len(_starts(root)) == 1
    assert json.loads((root / "final.json").read_text())["w"] == expected_weights(200)
    code, events = s2.get("/events", tok)
    recs = [json.loads(x) for x in events.splitlines()]
    assert sum(1 for r in recs if r["event"] == "started") == 1
    assert sum(1 for r in recs if r["event"] == "submitted") == 1


def test_tokens_are_stored_as_hashes_on_both_backends(store_url):
    from goodput.sched.live.service import digest, new_token
    from goodput.sched.live.store import open_store

    with open_store(store_url) as store:
        tok = new_token(store, "alice")
        adm = new_token(store, "ops", "admin")
        assert store.token(digest(tok)) == ("alice", "tenant", "")
        assert store.token(digest(adm)) == ("ops", "admin", "")
        assert store.token(tok) is None  # the token itself is not a key: only its hash is stored
        with pytest.raises(ValueError, match="tenant"):
            new_token(store, "../evil")
    with open_store(store_url) as store:  # durable, and the other tables still open as before
        assert store.token(digest(tok)) == ("alice", "tenant", "")
        assert store.load().jobs == {}


def test_token_add_prints_the_token_alone_on_its_last_line(tmp_path):
    r = _cli("sched", "token", "add", "alice", "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("gp_") and len(r.stdout.strip().splitlines()) == 1


def test_token_add_flags_and_refusals_through_the_cli(tmp_path):
    """What tests/sched/live/tokens.py makes in-process, through the command an operator runs: an
    admin token that expires, a tenant's user kept, and each refusal naming what it refused."""
    from goodput.sched.live.store import open_store
    from goodput.sched.live.tokens import digest

    db = f"sqlite:///{tmp_path / 's.db'}"
    me = pwd.getpwuid(os.geteuid()).pw_name
    r = _cli("sched", "token", "add", "ops", "--db", db, "--admin", "--expires", "90m", "--user", me)
    assert r.returncode == 0, r.stderr
    assert "(admin)" in r.stderr and "expires" in r.stderr and f"jobs run as {me!r}" in r.stderr, r.stderr
    tok = r.stdout.strip().splitlines()[-1]
    with open_store(db) as store:
        row = next(t for t in store.tokens() if t["prefix"] == tok[:11])
        assert row["tenant"] == "ops" and row["role"] == "admin"
        assert time.time() + 89 * 60 < row["expires"] <= time.time() + 90 * 60
        assert store.token(digest(tok)) == ("ops", "admin", "") and store.tenant_users()["ops"] == me
    for args, says in (
        (("bad name",), "letters, digits"),
        (("t", "--user", "no-such-user-zz"), "no-such-user-zz"),
        (("t", "--expires", "0"), "--expires"),
        (("t", "--expires", "soon"), "--expires"),
    ):
        r = _cli("sched", "token", "add", *args, "--db", db)
        assert r.returncode == 2 and says in r.stderr and "gp_" not in r.stdout, (args, r.stdout, r.stderr)


def test_cli_submit_ls_cancel_and_events(server, tmp_path):
    from goodput.sched.sim.checker import check

    s = server()
    tok = s.token("alice")
    s.start()
    env = {"GOODPUT_TOKEN": tok}
    root = tmp_path / "cli"
    submit = (
        "sched", "submit", "--name", "cli", "--ckpt-root", str(root), "--grace-s", "20", "--key", "run-1",
        "--url", s.url, "--", *JOB, "--steps", "2000", "--step-s", "0.02", "--interval", "10",
    )  # fmt: skip
    r = _cli(*submit, env=env)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip().splitlines()[-1]
    assert jid.startswith("cli.")
    r = _cli(*submit, env=env)  # a retry with the same key: the same job, not a second one
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == jid, r.stderr
    j = s.wait_job(jid, tok, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0)
    assert j["name"] == "cli" and j["ckpt_root"] == str(root) and j["command"][:3] == JOB
    r = _cli("sched", "ls", "--name", "cli", "--json", "--url", s.url, env=env)
    assert r.returncode == 0 and [x["id"] for x in json.loads(r.stdout)] == [jid], r.stderr
    r = _cli("sched", "ls", "--name", "other", "--json", "--url", s.url, env=env)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr
    pgid = _run_record(tmp_path, jid, 1)["pgid"]
    r = _cli("sched", "cancel", jid, "--url", s.url, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == [jid, "preempting"]  # asked to leave; not cancelled before it is gone
    j = s.wait_job(jid, tok, lambda j: j["state"] == "cancelled")
    assert _group_gone(pgid)
    ev = [h["event"] for h in j["history"]]
    assert ev.index("preempt_requested") < ev.index("exited") < ev.index("released") < ev.index("cancelled")
    assert next(h for h in j["history"] if h["event"] == "preempt_requested")["victim_of"] == "cancel"
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["preempted"]  # it checkpointed
    r = _cli("sched", "cancel", jid, "--url", s.url, env=env)  # already over: nothing changes
    assert r.returncode == 0 and r.stdout.split()[:2] == [jid, "cancelled"], r.stderr
    r = _cli("sched", "events", "--url", s.url, env=env)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    mine = [x["event"] for x in recs if x.get("job") == jid]
    assert mine[0] == "submitted" and mine[-1] == "cancelled" and mine.count("cancelled") == 1
    assert check(recs, {"local-00000": 1}).total == 0
    r = _cli("sched", "cancel", "nosuch.00000000", "--url", s.url, env=env)
    assert r.returncode != 0 and "404" in r.stderr


def test_cli_events_says_when_the_retention_deleted_the_head_of_the_log(server, tmp_path):
    """`goodput sched events` reads the log as kept and says on stderr that its head is gone; a
    `--since` below the kept log exits 2 with the service's 410."""
    s = server(limits={"event_retention": 3})
    tok = s.token("alice")
    s.start()
    for i in range(3):  # submitted, then cancelled: at least 6 records, more than the 3 kept
        code, j = s.post("/jobs", _spec(tmp_path / "r", 2000, name=f"w{i}"), tok)
        assert code == 201, j
        assert s.post(f"/jobs/{j['id']}/cancel", {}, tok)[0] == 200
    env = {"GOODPUT_TOKEN": s._admin}
    deadline = time.monotonic() + 30
    while True:
        r = _cli("sched", "events", "--url", s.url, env=env)
        if "deleted events" in r.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0 and "the service's event retention deleted events 1 to" in r.stderr, r.stderr
    assert 1 <= len(r.stdout.splitlines()) <= 3
    r = _cli("sched", "events", "--since", "0", "--url", s.url, env=env)
    assert r.returncode == 2 and "HTTP 410" in r.stderr and not r.stdout, (r.stdout, r.stderr)


def test_cli_events_reads_the_whole_log_by_pages_and_a_follower_goes_on_through_a_restart(server, tmp_path):
    """Each streamed record carries its ``seq``; `goodput sched events` asks page after page until
    a short one (it printed at most one page, the service's 10,000, before: the rest of a longer log
    was left out in silence), and `--follow` resumes after the last record it printed when the
    service restarts (it ended with a traceback before, and nothing told where to go on from)."""
    s = server()
    tok = s.token("alice")
    s.start()
    admin = {"GOODPUT_TOKEN": s._admin}

    def churn(n: int, tag: str) -> None:
        for i in range(n):
            code, j = s.post("/jobs", _spec(tmp_path / "r", 2000, name=f"{tag}{i}"), tok)
            assert code == 201, j
            assert s.post(f"/jobs/{j['id']}/cancel", {}, tok)[0] == 200
            s.wait_job(j["id"], tok, lambda j: j["state"] == "cancelled")

    def whole() -> list[dict]:
        r = _cli("sched", "events", "--url", s.url, env=admin)
        assert r.returncode == 0, r.stderr
        return [json.loads(x) for x in r.stdout.splitlines()]

    churn(3, "a")
    follower = subprocess.Popen(
        [PY, "-c", "from goodput.cli.main import app; app()", "sched", "events", "--follow", "--page", "3"]
        + ["--url", s.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **admin},
    )
    followed: list[str] = []
    reader = threading.Thread(target=lambda: followed.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        recs = whole()
        assert len(recs) >= 6 and [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
        paged = _cli("sched", "events", "--page", "2", "--url", s.url, env=admin)
        assert paged.returncode == 0 and [json.loads(x) for x in paged.stdout.splitlines()] == recs
        own = _cli("sched", "events", "--page", "1", "--url", s.url, env={"GOODPUT_TOKEN": tok})
        assert own.returncode == 0 and [json.loads(x) for x in own.stdout.splitlines()] == [
            r for r in recs if "job" in r
        ]  # every job is alice's
        s.stop()
        s.start()  # the follower's connection broke; it goes on from where it was
        churn(2, "b")
        recs = whole()
        deadline = time.monotonic() + 60
        while len(followed) < len(recs) and time.monotonic() < deadline and follower.poll() is None:
            time.sleep(0.2)
        assert [json.loads(x) for x in followed] == recs, follower.poll()
    finally:
        follower.terminate()
        _, err = follower.communicate(timeout=10)
    assert "resuming after seq" in err, err
    down = _cli("sched", "events", "--url", "http://127.0.0.1:9", env=admin)
    assert down.returncode == 2 and "before any record" in down.stderr, down.stderr


def test_a_group_killed_from_outside_is_an_infrastructure_loss_and_resumes(server, tmp_path):
    s = server(limits={"infra_backoff_s": 1})  # the backoff is honoured (below), not waited out for a minute
    tok = s.token("alice")
    s.start()
    root = tmp_path / "a"
    _, ans = s.post("/jobs", _spec(root, 200, ckpt_interval_s=1, ckpt_write_s=0.5), tok)
    jid = ans["id"]
    s.wait_job(jid, tok, lambda j: j["state"] == "running" and j["checkpoint"]["committed_s"] > 0)
    os.killpg(_run_record(tmp_path, jid, 1)["pgid"], signal.SIGKILL)  # its "slot" went, no kill of ours
    j = s.wait_job(jid, tok, lambda j: j["state"] == "finished", timeout=90)
    assert j["infra_losses"] == 1 and j["failures"] == 0 and j["preemptions"] == 0 and j["epoch"] == 2
    assert [h["status"] for h in j["history"] if h["event"] == "exited"] == ["lost", "finished"]
    assert [h["reason"] for h in j["history"] if h["event"] == "requeued"] == ["infrastructure"]
    (req,) = [h for h in j["history"] if h["event"] == "requeued"]
    second = [h for h in j["history"] if h["event"] == "started"][1]
    assert req["eligible_s"] >= req["t"] + 1 - 1e-3 and second["t"] >= req["eligible_s"]  # after its backoff
    starts = _starts(root)
    assert [x["epoch"] for x in starts] == [1, 2] and starts[1]["restored_step"] > 0
    assert json.loads((root / "final.json").read_text())["w"] == expected_weights(200)


# the victim ignores the preemption signals, so its preemption stays in flight until the deadline's SIGKILL;
# its second run (epoch 2) just finishes
STUBBORN = (
    "import os, signal, sys, time\n"
    "if os.environ['GOODPUT_JOB_EPOCH'] != '1': sys.exit(0)\n"
    "for s in (signal.SIGUSR1, signal.SIGTERM): signal.signal(s, lambda *a: None)\n"
    "open(os.path.join(os.environ['GOODPUT_CKPT_ROOT'], 'ready'), 'w').close()\n"
    "time.sleep(300)\n"
)


def test_a_preemption_in_flight_survives_a_service_sigkill(server, tmp_path, db):
    from goodput.sched.sim.checker import check

    s = server(db=db)
    tok, ops = s.token("alice"), s.token("ops", "--admin")
    s.start()
    low_root, high_root = tmp_path / "low", tmp_path / "high"
    low_spec = _spec(low_root, 0, name="low", command=[PY, "-c", STUBBORN], grace_s=6)
    _, low = s.post("/jobs", low_spec, tok)
    s.wait_job(low["id"], tok, lambda j: j["state"] == "running" and (low_root / "ready").exists())
    pgid = _run_record(tmp_path, low["id"], 1)["pgid"]
    _, high = s.post("/jobs", _spec(high_root, 5, name="high", priority=10), tok)
    before = s.wait_job(low["id"], tok, lambda j: j["state"] == "preempting")
    assert before["deadline_s"] is not None and before["victim_of"] == high["id"]
    s.kill9()  # mid-preemption: the victim was signalled, its deadline not yet reached
    s2 = _restart(server, s)
    assert s2.health["restored"] is True and s2.health["adopted"] == {low["id"]: "adopted"}
    assert not _group_gone(pgid) or time.time() >= before["deadline_s"]  # the restart killed nothing early
    after = s2.get(f"/jobs/{low['id']}", tok)[1]
    if time.time() < before["deadline_s"] - 0.5:  # normally the case: the restart takes less than the grace
        assert after["state"] == "preempting" and after["substate"] == before["substate"]
        assert after["deadline_s"] == before["deadline_s"] and after["victim_of"] == high["id"]
        assert s2.get(f"/jobs/{high['id']}", tok)[1]["state"] == "pending"  # its slot is not free yet
    lj = s2.wait_job(low["id"], tok, lambda j: j["state"] == "finished", timeout=30)
    hj = s2.wait_job(high["id"], tok, lambda j: j["state"] == "finished", timeout=30)
    assert _group_gone(pgid)
    assert lj["epoch"] == 2 and lj["preemptions"] == 1 and lj["failures"] == 0
    assert [h["status"] for h in lj["history"] if h["event"] == "exited"] == ["killed", "finished"]
    assert [h["event"] for h in lj["history"]].count("preempt_requested") == 1  # not asked twice
    gone = next(h for h in lj["history"] if h["event"] == "exited")
    assert gone["t"] >= before["deadline_s"]  # killed by the restored deadline, not before it
    t_released = next(h["t"] for h in lj["history"] if h["event"] == "released")
    t_high = next(h["t"] for h in hj["history"] if h["event"] == "started")
    assert t_released <= t_high  # the preemptor started only after the victim was gone
    assert [x["epoch"] for x in _starts(high_root)] == [1]
    code, events = s2.get("/events", ops)
    recs = [json.loads(x) for x in events.splitlines()]
    assert check(recs, {"local-00000": 1}).total == 0  # no double booking, nothing lost, across the kill
    assert sum(1 for r in recs if r["event"] == "submitted") == 2


def test_demo_live_passes_its_checks(tmp_path):
    r = _cli("demo", "--part", "live", "--workdir", str(tmp_path / "demo"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed" in r.stdout


def test_resize_a_pending_job_and_refuse_the_rest(server, tmp_path):
    """POST /jobs/{id}/resize: a pending job gets its new shape (it then runs on it); a running job
    is 409, a shape no pool offers 422, another tenant's job 404; nothing changes on a refusal."""
    s = server(nodes=2)
    alice, bob = s.token("alice"), s.token("bob")
    s.start()
    code, big = s.post("/jobs", _spec(tmp_path / "big", 400, nodes=2), alice)  # takes both slots
    assert code == 201
    s.wait_job(big["id"], alice, lambda j: j["state"] == "running")
    code, small = s.post("/jobs", _spec(tmp_path / "small", 5, nodes=2), alice)  # waits behind it
    assert code == 201 and s.get(f"/jobs/{small['id']}", alice)[1]["state"] == "pending"
    assert s.post(f"/jobs/{big['id']}/resize", {"nodes": 1}, alice)[0] == 409
    assert s.post(f"/jobs/{small['id']}/resize", {"nodes": 1}, bob)[0] == 404
    code, err = s.post(f"/jobs/{small['id']}/resize", {"nodes": 3}, alice)
    assert code == 422 and any("nodes" in d["loc"] for d in err["detail"]), err
    assert s.get(f"/jobs/{small['id']}", alice)[1]["nodes"] == 2  # refusals changed nothing
    r = _cli("sched", "resize", small["id"], "--nodes", "1", "--url", s.url, env={"GOODPUT_TOKEN": alice})
    assert r.returncode == 0 and r.stdout.split() == [small["id"], "pending", "1x1"], (r.stdout, r.stderr)
    assert s.post(f"/jobs/{big['id']}/cancel", {}, alice)[0] == 200
    j = s.wait_job(small["id"], alice, lambda j: j["state"] == "finished")
    assert j["nodes"] == 1 and j["epoch"] == 1
    assert any(r["event"] == "resized" for r in j["history"])


def test_a_job_that_yields_unasked_fails_once_its_budget_is_spent_and_says_why(server, tmp_path) -> None:
    """Exit 75 with nobody asking is a yield: requeued, counted in ``unasked_yields``; past
    ``limits.max_unasked_yields`` the job ends failed with ``fail_reason`` unasked_yields."""
    s = server(limits={"max_unasked_yields": 1})
    tok = s.token("alice")
    s.start()
    body = _spec(tmp_path / "y", 1, command=[sys.executable, "-c", "raise SystemExit(75)"])
    code, ans = s.post("/jobs", body, tok)
    assert code == 201, ans
    j = s.wait_job(ans["id"], tok, lambda j: j["state"] == "failed")
    assert j["fail_reason"] == "unasked_yields" and j["unasked_yields"] == 2 and j["failures"] == 0, j


def test_a_run_past_its_time_limit_is_stopped_and_fails_with_reason_time_limit(server, tmp_path) -> None:
    """Issue 23's time limit on a real job: at ``limit_s`` + ``over_time_limit_s`` the run is asked
    to checkpoint and stop (its grace fits its write), it does, and the job ends ``failed`` with
    ``fail_reason`` time_limit, as Slurm's TIMEOUT; its committed checkpoint stays and is newer than
    any the cadence made before the limit."""
    s = server(limits={"over_time_limit_s": 1})
    tok = s.token("alice")
    s.start()
    root = tmp_path / "t"
    # 50,000 steps of 0.02 s: far longer than its 20 s limit
    cmd = [*JOB, "--steps", "50000", "--step-s", "0.02", "--interval", "1000000"]  # no cadence save
    # a limit long enough for the job to have installed its notice handler on a loaded machine (its
    # imports took over 5 s there: SIGUSR1 came first and it died without a checkpoint)
    code, ans = s.post("/jobs", _spec(root, 50_000, limit_s=20, grace_s=30, command=cmd), tok)
    assert code == 201, ans
    t0 = time.monotonic()
    j = s.wait_job(ans["id"], tok, lambda j: j["state"] in ("failed", "finished", "cancelled"), timeout=120)
    assert j["state"] == "failed" and j["fail_reason"] == "time_limit", j
    assert time.monotonic() - t0 < 120  # stopped at its limit, not run to its end (1,000 s of steps)
    code, events = s.get("/events", tok)
    recs = [json.loads(x) for x in events.splitlines() if json.loads(x).get("job") == ans["id"]]
    (ask,) = [r for r in recs if r["event"] == "preempt_requested"]
    assert ask["reason"] == "time_limit" and ask["preemptor"] is None and ask["checkpoint"] is True, ask
    (failed,) = [r for r in recs if r["event"] == "failed"]
    assert failed["reason"] == "time_limit", failed
    # the stop's checkpoint committed (its cadence, a million steps, made none) and is kept
    assert j["checkpoint"]["committed_s"] > 0, j["checkpoint"]
    assert [p.name for p in root.iterdir() if p.name.startswith("step_")], sorted(os.listdir(root))


def test_serve_says_its_start_up_note_once(server, tmp_path):
    """`goodput sched serve` printed each start-up note twice: once itself, once as a log line."""
    s = server()
    s.start()
    s.stop()
    text = " ".join((tmp_path / "serve.log").read_text().split())
    said = [k for k in ("single-user machine", "not root", "tenants without one are refused") if k in text]
    assert len(said) == 1 and text.count(said[0]) == 1, text[:2000]
