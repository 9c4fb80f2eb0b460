"""The dashboard attacked: as a hostile tenant, a hostile event log, and a careless operator would.

A real service in this process (so the test can hold the dashboard's own lock to make a request slow),
served by uvicorn on 127.0.0.1 with real job processes; Debian's Chromium driven by Playwright
(tests/sched/ui/test_ui.py's fixtures: skipped with the reason where either is absent).
"""

# ruff: noqa: F811 - the browser fixtures are imported from test_ui.py, then named as arguments
from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.sched.live.tokens import add_token

from .test_ui import SLEEPER, WAIT_MS, _cli, _free_port, browser, expect, page_of  # noqa: F401 - fixtures

ATTACK = '<img src=x onerror="window.__xss=1"></script><script>window.__xss=2</script>'


class InProcess:
    """`create_app` on a real `Service` in this process, served by uvicorn on a free loopback port."""

    def __init__(self, tmp: Path, nodes: int = 1, port: int = 0) -> None:
        import uvicorn

        from goodput.sched.live.service import Service, create_app, local_pools

        self.tmp = tmp
        self.db = f"sqlite:///{tmp / 'sched.db'}"
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        kw: dict[str, object] = {}
        params = inspect.signature(Service).parameters
        if "allow_root_jobs" in params:  # the test's jobs run as the test's own user
            kw["allow_root_jobs"] = True
        self.svc = Service(self.db, local_pools(nodes, 1), state_dir=tmp / "state", url=self.url, tick_s=0.2, **kw)
        self.svc.start()
        config = uvicorn.Config(create_app(self.svc), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    def token(self, tenant: str, *extra: str) -> str:
        return add_token(self.db, tenant, *extra)

    def get(self, path: str, token: str | None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def submit(self, token: str, name: str, command: list[str] | None = None) -> str:
        body = {"name": name, "command": command or SLEEPER, "limit_s": 600, "ckpt_interval_s": 0, "grace_s": 5}
        req = urllib.request.Request(
            self.url + "/jobs",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["id"]

    def wait_running(self, jid: str, token: str) -> None:
        deadline = time.monotonic() + 60
        while json.loads(self.get(f"/jobs/{jid}", token)[2])["state"] != "running":
            assert time.monotonic() < deadline, f"{jid} never ran"
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        with contextlib.suppress(Exception):
            self.svc.close()
        runs = self.tmp / "state" / "runs"
        for rec in runs.glob("*.json") if runs.exists() else ():
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(rec.read_text())["pgid"], signal.SIGKILL)


@pytest.fixture
def live(tmp_path):
    made: list[InProcess] = []

    def make(nodes: int = 1, port: int = 0) -> InProcess:
        s = InProcess(tmp_path, nodes, port)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def test_every_ui_answer_carries_the_security_headers(live):
    s = live()
    alice = s.token("alice")
    for path, tok, code in [
        ("/ui", None, 200),
        ("/ui/static/app.js", None, 200),
        ("/ui/static/nothing.js", None, 404),
        ("/ui/api/overview", alice, 200),
        ("/ui/api/overview", None, 401),
        ("/ui/api/overview", "gp_revoked-or-made-up", 401),
        ("/ui/api/jobs/someone.0000abcd", alice, 404),
    ]:
        got, h, _body = s.get(path, tok)
        assert got == code, (path, got)
        assert h.get("x-content-type-options") == "nosniff", (path, h)
        assert "frame-ancestors 'none'" in h.get("content-security-policy", ""), (path, h)
        assert h.get("x-frame-options") == "DENY", (path, h)
        assert h.get("referrer-policy") == "no-referrer", (path, h)
        if path != "/ui/static/app.js":
            assert h.get("cache-control") == "no-store", (path, h)
    csp = s.get("/ui", None)[1]["content-security-policy"]
    assert "'unsafe-inline'" not in csp and "script-src 'self'" in csp


def test_a_slow_dashboard_never_takes_the_services_worker_threads(live):
    """60 dashboard requests stuck behind the dashboard's lock (as behind the replay of a long log
    after a restart) leave the API answering; when the lock is free they are answered too."""
    s = live()
    alice = s.token("alice")
    assert s.get("/ui/api/overview", alice)[0] == 200
    feed = s.svc.ui_feed
    feed.lock.acquire()
    pool = concurrent.futures.ThreadPoolExecutor(60)
    try:
        stuck = [pool.submit(s.get, "/ui/api/overview", alice, 60.0) for _ in range(60)]
        time.sleep(1.0)  # they are all in by now, waiting
        t0 = time.monotonic()
        code, _h, body = s.get("/jobs", alice, timeout=20.0)
        took = time.monotonic() - t0
        assert code == 200 and took < 5.0, (code, took, body[:200])
        assert not any(f.done() and f.result()[0] == 200 for f in stuck)
    finally:
        feed.lock.release()
    codes = [f.result()[0] for f in stuck]
    pool.shutdown()
    # answered once the lock is free (or told to retry when too many waited: never a hang, never a 500)
    assert set(codes) <= {200, 503} and codes.count(200) >= 1, codes


def _login(page, s: InProcess, token: str) -> None:  # noqa: ANN001
    page.goto(s.url + "/ui")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#cluster")).to_be_visible(timeout=WAIT_MS)


CSP_WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


def test_the_page_breaks_none_of_its_own_policy_and_drops_an_answer_that_comes_after_sign_out(live, page_of):
    s = live()
    alice = s.token("alice")
    jid = s.submit(alice, "visible-run")
    s.wait_running(jid, alice)
    page = page_of()
    page.add_init_script(CSP_WATCH)
    _login(page, s, alice)
    expect(page.locator("#running")).to_contain_text("visible-run", timeout=WAIT_MS)
    assert page.evaluate("Chart.getChart('chart-series').data.datasets.length") == 3
    page.goto(f"{s.url}/ui#job/{jid}")
    expect(page.locator("pre.log")).to_contain_text("hello from the job", timeout=WAIT_MS)
    page.goto(f"{s.url}/ui#")
    expect(page.locator("#running")).to_contain_text("visible-run", timeout=WAIT_MS)
    assert page.evaluate("window.__csp") == []  # no inline style or script the policy refuses
    # a poll held on its way (the dashboard's lock taken), the viewer signs out, then the answer arrives
    feed = s.svc.ui_feed
    feed.lock.acquire()
    try:
        with page.expect_request("**/ui/api/overview", timeout=WAIT_MS):
            pass  # the next poll is in flight, held
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Bearer token")).to_be_visible()
        page.evaluate(
            "window.__shown = false; new MutationObserver(() => { if (!document.getElementById('app').hidden)"
            " window.__shown = true; }).observe(document.getElementById('app'), {attributes: true, childList: true})"
        )
        with page.expect_response("**/ui/api/overview", timeout=WAIT_MS):
            feed.lock.release()
    except BaseException:
        with contextlib.suppress(RuntimeError):
            feed.lock.release()
        raise
    page.wait_for_timeout(1000)
    assert page.evaluate("window.__shown") is False, "the answer to the dropped token was drawn after sign-out"
    expect(page.locator("#app")).to_be_hidden()
    assert "visible-run" not in page.locator("#app").inner_html()


def test_a_crafted_link_neither_stops_the_page_nor_lets_a_token_into_a_url(live, page_of):
    s = live()
    alice = s.token("alice")
    jid = s.submit(alice, "still-polled")
    page = page_of()  # page_of fails the test on any page error
    _login(page, s, alice)
    for bad in ("%E0%A4%A", "%", "constructor", "__proto__"):
        page.goto(f"{s.url}/ui#job/{bad}")
        expect(page.locator("#app h2")).to_contain_text("No job", timeout=WAIT_MS)
    # the page still polls: back on the overview, the job shows and the clock of the last update moves
    page.goto(f"{s.url}/ui#")
    expect(page.locator("#queue, #running").first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#app")).to_contain_text("still-polled", timeout=WAIT_MS)
    before = page.locator("#status").inner_text()
    expect(page.locator("#status")).not_to_have_text(before, timeout=WAIT_MS)
    # the form submitted natively (the script not running yet, or broken): the token never enters a URL
    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("Bearer token").fill(alice)
    with page.expect_navigation():
        page.evaluate("document.getElementById('login-form').submit()")
    assert alice not in page.url and jid  # the URL a server would log and a Referer would carry


def test_the_static_report_of_a_hostile_log_runs_nothing_and_stays_usable(tmp_path, page_of):
    from goodput.sched.ui.page import write_report

    big = 10**9  # a node claiming a billion GPUs: the page draws a bounded number of cells
    recs = [
        {"t": 0, "event": "submitted", "job": ATTACK, "tenant": ATTACK, "priority": 0, "nodes": 1,
         "gpus_per_node": 1, "submit_s": 0},
        {"t": 0, "event": "started", "job": ATTACK, "epoch": 1, "pool": ATTACK, "nodes": [ATTACK + "-0"],
         "gpus_per_node": big, "resume_from_s": 0},
        {"t": 5, "event": "submitted", "job": "hi", "tenant": "b", "priority": 5, "nodes": 1, "gpus_per_node": 1,
         "submit_s": 5},
        {"t": 6, "event": "preempt_requested", "job": ATTACK, "epoch": 1, "victim_of": ATTACK, "reason": ATTACK,
         "preemptor": ATTACK, "lost_s": 5, "deadline_s": 30, "checkpoint": False,
         "candidates": [{"job": ATTACK, "lost_gpu_s": 5, "lost_s": 5, "checkpoint": False}]},
        {"t": 7, "event": "node_reclaim_notice", "node": ATTACK, "deadline_s": 50},
        {"t": 8, "event": "failed", "job": ATTACK, "reason": ATTACK},
        {"t": 9, "event": "submitted", "job": "inf", "tenant": "c", "priority": float("inf"), "nodes": 1,
         "gpus_per_node": 1, "submit_s": 9},  # Python's JSON reads Infinity: a record it cannot use is skipped
        {"t": 10, "event": "submitted", "job": "constructor", "tenant": "c", "priority": 0, "nodes": 1,
         "gpus_per_node": 1, "submit_s": 10},
    ]  # fmt: skip
    log = tmp_path / "e.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))  # writes Infinity, as a careless tool would
    out = write_report(log, tmp_path / "r.html", title=ATTACK, notes=[ATTACK])
    page = page_of()
    page.add_init_script(CSP_WATCH)
    page.goto(out.as_uri())
    expect(page.locator("#cluster")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#preemptions")).to_contain_text("<img src=x")  # as text
    page.goto(out.as_uri() + "#job/" + urllib.request.quote(ATTACK, safe=""))
    expect(page.locator("#job-history")).to_contain_text("preempt_requested", timeout=WAIT_MS)
    for bad in ("%E0%A4%A", "__proto__", "toString"):
        page.goto(f"{out.as_uri()}#job/{bad}")
        expect(page.locator("#app h2")).to_contain_text("No job", timeout=WAIT_MS)
    assert page.evaluate("window.__xss") is None
    assert page.evaluate("window.__csp") == []  # its own scripts and style run under its own policy
    # ... which refuses any other script, should one ever reach the page
    page.evaluate("(() => { const s = document.createElement('script'); s.textContent = 'window.__xss = 3';"
                  " document.body.appendChild(s); })()")  # fmt: skip
    assert page.evaluate("window.__xss") is None
    assert page.locator("#app img, #app script").count() == 0
    assert page.locator("#cluster .cell").count() <= 64 + 8  # the legend's cells and at most 64 per node


def test_a_revoked_token_or_a_job_token_gets_nothing_and_the_page_returns_to_its_form(live, page_of):
    s = live()
    alice = s.token("alice")
    jid = s.submit(alice, "seen-then-not")
    s.wait_running(jid, alice)
    with s.svc.lock:  # the run's own token, as the job reads it from its token file
        job_token = s.svc._job_token(s.svc.sched.jobs[jid])
    for path in ("/ui/api/overview", f"/ui/api/jobs/{jid}"):
        code, _h, body = s.get(path, job_token)
        assert code == 403 and b"seen-then-not" not in body, (path, code)
    page = page_of()
    _login(page, s, alice)
    expect(page.locator("#running")).to_contain_text("seen-then-not", timeout=WAIT_MS)
    prefix = alice[:11]
    r = _cli("sched", "token", "revoke", prefix, "--db", s.db)
    assert r.returncode == 0, r.stderr
    expect(page.get_by_label("Bearer token")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#login-error")).to_contain_text("not accepted")
    expect(page.locator("#app")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('goodput.token')") is None
    assert s.get("/ui/api/overview", alice)[0] == 401
    # a token that expires: data while it lives, the form after
    brief = s.token("alice", "--expires", "3s")
    assert s.get("/ui/api/overview", brief)[0] == 200
    page.get_by_label("Bearer token").fill(brief)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#running")).to_contain_text("seen-then-not", timeout=WAIT_MS)
    expect(page.get_by_label("Bearer token")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#app")).to_be_hidden()
    assert s.get("/ui/api/overview", brief)[0] == 401
    # a pasted value a header cannot carry is refused at once, not kept and retried
    page.get_by_label("Bearer token").fill("gp_\u00e9t\u00e9 token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#login-error")).to_contain_text("not a token")
    assert page.evaluate("sessionStorage.getItem('goodput.token')") is None


def test_what_a_job_writes_reaches_an_admins_page_as_text(live, page_of):
    """A tenant's job prints markup to its log and reports a commit whose path is markup: the admin who
    opens its page runs none of it."""
    s = live()
    admin, alice = s.token("ops", "--admin"), s.token("alice")
    loud = [sys.executable, "-c", f"import time; print({ATTACK!r}, flush=True); time.sleep(120)"]
    jid = s.submit(alice, "loud", loud)
    s.wait_running(jid, alice)
    with s.svc.lock:
        job = s.svc.sched.jobs[jid]
        tok, epoch = s.svc._job_token(job), job.epoch
    req = urllib.request.Request(
        f"{s.url}/jobs/{jid}/commits",
        data=json.dumps({"epoch": epoch, "progress_s": 1.0, "path": ATTACK}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {tok}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            accepted = r.status == 200
    except urllib.error.HTTPError as e:  # a path the service refuses is fine too: then only the log carries it
        accepted = e.code // 100 == 2
    page = page_of()
    _login(page, s, admin)
    page.goto(f"{s.url}/ui#job/{jid}")
    expect(page.locator("pre.log")).to_contain_text("<img src=x", timeout=WAIT_MS)
    if accepted:
        expect(page.locator("#job-checkpoints")).to_contain_text("<img src=x", timeout=WAIT_MS)
    assert page.evaluate("window.__xss") is None
    assert page.locator("#app img, #app script").count() == 0


def test_a_service_that_restarts_leaves_the_page_marked_stale_then_live_again(live, page_of):
    s = live()
    alice = s.token("alice")
    page = page_of()
    _login(page, s, alice)
    expect(page.locator("#stale")).to_have_count(0)
    s.stop()  # the service goes away: the page keeps what it showed, says since when, and retries
    expect(page.locator("#stale")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#stale")).to_contain_text("Not updated since")
    expect(page.locator("#cluster")).to_be_visible()
    s2 = live(port=s.port)  # the same store, state and port: the same token, no new sign-in
    jid = s2.submit(alice, "after-restart")
    expect(page.locator("#app")).to_contain_text("after-restart", timeout=WAIT_MS)
    expect(page.locator("#stale")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('goodput.token')") == alice and jid
