"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright, against a
`goodput sched serve` this test starts on 127.0.0.1 (real job processes, SQLite in a temp dir).

Screenshots of the main views are written to ``out/ui-screenshots/`` (gitignored; override with
``GOODPUT_UI_ARTIFACTS``) and their paths printed. Skipped with the reason when Chromium or Playwright
is absent; no browser is ever downloaded.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

PY = sys.executable
CHROMIUM = os.environ.get("GOODPUT_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("GOODPUT_UI_ARTIFACTS") or Path(__file__).resolve().parents[3] / "out" / "ui-screenshots"
)
SLEEPER = [PY, "-c", "import sys, time; print('hello from the job', flush=True); time.sleep(120)"]
WAIT_MS = 20_000
ZONE = "Asia/Kolkata"  # the viewer's zone, not the machine's (UTC here): times must follow the viewer

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (pip install playwright)"
)
if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)", allow_module_level=True)
expect = sync_api.expect

from goodput.sched.live.service import Service as ServiceImpl  # noqa: E402 - after the skips
from tests.sched.live.tokens import add_token  # noqa: E402

# the app `goodput sched serve` runs (create_app), with the operator's limit on preempting young runs
# (min_run_s, 600 s by default) set to 0 so that a test's priority preemption happens at once
LAUNCH = """
import inspect, sys, uvicorn
from goodput.sched.live.service import Service, create_app, local_pools
db, port, nodes, state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kw = {}
params = inspect.signature(Service).parameters
if "allow_root_jobs" in params:  # the test's jobs run as the test's own user
    kw["allow_root_jobs"] = True
if "governance" in params:
    from goodput.sched.core.governance import Governance
    kw["governance"] = Governance.from_obj(None, {"min_run_s": 0})
svc = Service(db, local_pools(nodes, 1), state_dir=state, url=f"http://127.0.0.1:{port}", tick_s=0.2, **kw)
svc.start()
try:
    uvicorn.run(create_app(svc), host="127.0.0.1", port=port, log_level="warning")
finally:
    svc.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-c", "from goodput.cli.main import app; app()", *args], capture_output=True, text=True, timeout=300
    )


class Service:
    """`goodput sched serve` as a child process on a free loopback port."""

    def __init__(self, tmp: Path, nodes: int = 1, cli: bool = False) -> None:
        self.tmp = tmp
        self.cli = cli
        self.db = f"sqlite:///{tmp / 'sched.db'}"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.nodes = nodes
        self.proc: subprocess.Popen | None = None

    def token(self, tenant: str, *extra: str) -> str:
        return add_token(self.db, tenant, *extra)

    def start(self) -> Service:
        with open(self.tmp / "serve.log", "ab") as log:
            if self.cli:
                cmd = [PY, "-c", "from goodput.cli.main import app; app()", "sched", "serve", "--db", self.db]
                cmd += ["--port", str(self.port), "--nodes", str(self.nodes), "--gpus-per-node", "1"]
                cmd += ["--state-dir", str(self.tmp / "state"), "--tick-s", "0.2"]
                if "allow_root_jobs" in inspect.signature(ServiceImpl).parameters:
                    cmd += ["--allow-root-jobs"]  # the test's jobs run as the test's own user
            else:
                cmd = [PY, "-c", LAUNCH, self.db, str(self.port), str(self.nodes), str(self.tmp / "state")]
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return self
            except OSError:
                assert self.proc.poll() is None, (self.tmp / "serve.log").read_text()
                time.sleep(0.1)
        raise AssertionError("service did not come up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for rec in (self.tmp / "state" / "runs").glob("*.json") if (self.tmp / "state").exists() else ():
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(rec.read_text())["pgid"], signal.SIGKILL)

    def call(self, method: str, path: str, token: str | None, body: dict | None = None) -> tuple[int, object]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
                return r.status, json.loads(raw) if "json" in r.headers.get("content-type", "") else raw.decode()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw or b"null")
            except ValueError:
                return e.code, f"{raw[:500]!r}; service log: {self.log_tail()}"

    def log_tail(self) -> str:
        try:
            return (self.tmp / "serve.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def submit(self, token: str, name: str, command: list[str], **kw: object) -> str:
        body = {"name": name, "command": command, "limit_s": 600, "ckpt_interval_s": 0, "grace_s": 5, **kw}
        code, out = self.call("POST", "/jobs", token, body)
        assert code == 201, out
        return out["id"]  # type: ignore[index]

    def wait(self, jid: str, token: str, pred, timeout: float = 60.0) -> dict:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while True:
            code, j = self.call("GET", f"/jobs/{jid}", token)
            assert code == 200, j
            if pred(j):
                return j  # type: ignore[return-value]
            assert time.monotonic() < deadline, json.dumps(j)[:2000]
            time.sleep(0.1)


@pytest.fixture
def service(tmp_path):
    made: list[Service] = []

    def make(nodes: int = 1, cli: bool = False) -> Service:
        s = Service(tmp_path, nodes, cli)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page_of(browser):
    """A fresh browser context (its own sessionStorage) per viewer; page errors fail the test."""
    contexts = []
    errors: list[str] = []

    def make():  # noqa: ANN202
        ctx = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=ZONE, locale="en-US")
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        # the page must fetch nothing outside the service (or the file it was opened from)
        page.on("request", lambda r: _local(r.url) or errors.append(f"non-local request {r.url}"))
        return page

    yield make
    for c in contexts:
        c.close()
    assert not errors, errors


def _local(url: str) -> bool:
    return url.startswith(("http://127.0.0.1:", "file://", "data:", "blob:", "about:"))


def _shot(page, name: str) -> None:  # noqa: ANN001
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


# every visible text of the page against its effective background: WCAG's 4.5:1 for normal text
CONTRAST = """() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => { const a = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
                     return 0.2126 * a[0] + 0.7152 * a[1] + 0.0722 * a[2]; };
  const bg = el => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
                     if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c; } return [255, 255, 255]; };
  const bad = [];
  for (const el of document.querySelectorAll("body *")) {
    if (!el.getClientRects().length || ![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg(el));
    const r = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (r < 4.5) bad.push(el.tagName + " '" + el.textContent.trim().slice(0, 30) + "' " + r.toFixed(2));
  }
  return bad;
}"""


def _accessible(page) -> None:  # noqa: ANN001
    """Accessible basics: text contrast, a label for every control, a name for every chart."""
    assert page.evaluate(CONTRAST) == []
    unlabeled = page.evaluate(
        "[...document.querySelectorAll('input, select, textarea')].filter(e => e.getClientRects().length"
        " && !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id || e.name)"
    )
    assert unlabeled == []
    assert page.evaluate("[...document.querySelectorAll('canvas')].every(c => c.getAttribute('aria-label'))")


def _login(page, svc: Service, token: str) -> None:  # noqa: ANN001
    page.goto(svc.url + "/ui")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#cluster")).to_be_visible(timeout=WAIT_MS)


def test_no_token_gets_only_the_login_form(service, page_of):
    svc = service(nodes=2, cli=True).start()  # `goodput sched serve` itself serves the page
    alice = svc.token("alice")
    svc.submit(alice, "private-run", SLEEPER)
    page = page_of()
    page.goto(svc.url + "/ui")
    expect(page.get_by_label("Bearer token")).to_be_visible()
    expect(page.locator("#app")).to_be_hidden()
    assert page.locator("#cluster, #queue, table").count() == 0
    assert "private-run" not in page.content()
    # the JSON behind the page refuses without a token, and a wrong token sends the page back to the form
    assert svc.call("GET", "/ui/api/overview", None)[0] == 401
    assert svc.call("GET", "/ui/api/overview", "gp_wrong")[0] == 401
    page.get_by_label("Bearer token").fill("gp_not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#login-error")).to_contain_text("not accepted")
    expect(page.locator("#app")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('goodput.token')") is None
    # the keyboard reaches the form: the token field, then the button
    _accessible(page)
    page.get_by_label("Bearer token").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Sign in"
    _shot(page, "login")


def test_page_with_a_token_shows_the_cluster_and_a_job_moves_from_queue_to_running(service, page_of):
    svc = service(nodes=1).start()
    alice = svc.token("alice")
    # it declares a checkpoint every second and never commits one: overdue within seconds
    first = svc.submit(alice, "holder", SLEEPER, ckpt_interval_s=1, ckpt_write_s=0.5)
    svc.wait(first, alice, lambda j: j["state"] == "running")
    page = page_of()
    _login(page, svc, alice)
    # the token is kept in the tab's session storage only
    assert page.evaluate("sessionStorage.getItem('goodput.token')") == alice
    assert page.evaluate("localStorage.length") == 0
    assert page.context.cookies() == []
    expect(page.locator('[data-node="local-00000"]')).to_be_visible()
    expect(page.locator("#running")).to_contain_text("holder")
    expect(page.locator("#running tr.overdue", has_text="holder")).to_contain_text("overdue", timeout=WAIT_MS)
    page.evaluate("window.__same_document = true")  # gone if the page reloads
    second = svc.submit(alice, "waiter", SLEEPER)
    row = page.locator("#queue tr", has_text="waiter")
    expect(row).to_be_visible(timeout=WAIT_MS)
    # the head of a full cluster: the scheduler plans its reservation (since 8ac25d8; before, "no fit")
    expect(row).to_contain_text(re.compile("reservation|no fit"))
    _shot(page, "queue")
    svc.call("POST", f"/jobs/{first}/cancel", alice)
    svc.wait(second, alice, lambda j: j["state"] == "running", timeout=60)
    expect(page.locator("#running tr", has_text="waiter")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#queue tr", has_text="waiter")).to_have_count(0, timeout=WAIT_MS)
    assert page.evaluate("window.__same_document") is True, "the page reloaded"
    _accessible(page)
    _shot(page, "overview")
    # the job's page: its state history and its own log tail
    page.locator("#running a", has_text="waiter").first.click()
    expect(page.locator("#job-history")).to_contain_text("pending → running", timeout=WAIT_MS)
    expect(page.locator("pre.log")).to_contain_text("hello from the job", timeout=WAIT_MS)
    # the submit time is shown in the viewer's zone
    submit_s = svc.call("GET", f"/jobs/{second}", alice)[1]["submit_s"]  # type: ignore[index]
    d = datetime.fromtimestamp(submit_s, ZoneInfo(ZONE))
    local = (
        f"{d.month}/{d.day}/{d.year}, {d.hour % 12 or 12}:{d.minute:02d}:{d.second:02d} {'AM' if d.hour < 12 else 'PM'}"
    )
    shown = page.locator("dt", has_text="submitted").locator("xpath=following-sibling::dd[1]").inner_text()
    assert shown.replace("\u202f", " ").replace("\xa0", " ") == local, (shown, local)
    page.get_by_role("link", name="← overview").click()
    expect(page.locator("#running tr", has_text="waiter")).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("window.__same_document") is True
    _shot(page, "job")


def test_a_preemption_shows_its_reason_and_the_victims_loss(service, page_of):
    svc = service(nodes=1).start()
    admin = svc.token("ops", "--admin")
    alice = svc.token("alice")
    low = svc.submit(alice, "low", SLEEPER, priority=0)
    svc.wait(low, alice, lambda j: j["state"] == "running")
    time.sleep(1.5)  # it holds its GPU a while without a checkpoint: that is what it loses
    high = svc.submit(alice, "high", SLEEPER, priority=10)
    svc.wait(low, alice, lambda j: j["preemptions"] == 1 and j["state"] == "pending", timeout=60)
    svc.wait(high, alice, lambda j: j["state"] == "running", timeout=60)
    page = page_of()
    _login(page, svc, admin)
    row = page.locator("#preemptions tbody tr").first
    expect(row).to_contain_text(low, timeout=WAIT_MS)
    expect(row).to_contain_text("priority")
    expect(row).to_contain_text(high)
    # the victim's loss: expected at the decision and as it happened, both in GPU-hours, above zero
    cells = row.locator("td")
    expected, actual = float(cells.nth(6).inner_text()), float(cells.nth(7).inner_text())
    assert expected > 0 and actual > 0, (expected, actual)
    code, ov = svc.call("GET", "/ui/api/overview", admin)
    item = ov["preemptions"]["items"][0]  # type: ignore[index]
    assert item["job"] == low and item["reason"] == "priority" and item["preemptor"] == high
    assert item["expected_loss_gpu_s"] >= 1.0 and item["realized_loss_gpu_s"] >= 1.0
    assert any(c["chosen"] for c in item["candidates"])
    row.locator("summary").click()
    expect(row.locator("li").first).to_contain_text("chosen")
    _shot(page, "preemptions")


TRAIN = [PY, "-m", "goodput.demo.example_job", "--steps", "100000", "--step-s", "0.05", "--interval", "5"]


def test_the_ledger_shows_restart_and_checkpoint_stall_of_a_resumed_job(service, page_of):
    """The demo job (docs/PROTOCOL.md's reporter) preempted, resumed from its checkpoint: its second run's
    start up to its resume being done is restart in the dashboard's ledger, its saves' stalls checkpoint
    stall, both from its own commit reports; the run page says the same."""
    svc = service(nodes=1).start()
    admin = svc.token("ops", "--admin")
    alice = svc.token("alice")
    low = svc.submit(alice, "train", TRAIN, priority=0, grace_s=30)
    svc.wait(low, alice, lambda j: (j.get("checkpoint") or {}).get("last_report") is not None, timeout=120)
    high = svc.submit(alice, "short", [PY, "-c", "import time; time.sleep(1)"], priority=10)
    svc.wait(high, alice, lambda j: j["state"] == "finished", timeout=120)
    # resumed: its second run has committed (its first report says when its resume was done)
    j = svc.wait(
        low,
        alice,
        lambda j: j["preemptions"] == 1 and (j["checkpoint"]["last_report"] or {}).get("epoch") == j["epoch"] > 1,
        timeout=120,
    )
    epoch = j["epoch"]
    code, ov = svc.call("GET", "/ui/api/overview", admin)
    assert code == 200, ov
    total = ov["ledger"]["total"]  # type: ignore[index]
    assert total["restart"] > 0 and total["checkpoint_stall"] > 0 and total["useful"] > 0, total
    code, page_json = svc.call("GET", f"/ui/api/jobs/{low}", alice)
    runs = {r["epoch"]: r for r in page_json["runs"]}  # type: ignore[index]
    assert runs[epoch]["ready_t"] is not None and runs[epoch]["account_gpu_s"]["restart"] > 0
    assert runs[epoch]["ready_t"] > runs[epoch]["start"]  # the resume took time: python, torch, the restore
    page = page_of()
    _login(page, svc, admin)
    page.locator("#ledger-tables summary").first.click()
    row = page.locator("#ledger-tables tr", has_text="restart").first
    expect(row).to_be_visible(timeout=WAIT_MS)
    assert float(row.locator("td").nth(1).inner_text()) > 0
    _shot(page, "ledger")
    page.goto(f"{svc.url}/ui#job/{low}")
    runs_table = page.locator("#job-runs table")
    expect(runs_table.locator("tbody tr")).to_have_count(epoch, timeout=WAIT_MS)
    # the resumed run's reports said when it was ready (a run that ended before reporting would not)
    expect(runs_table.locator("tbody tr").last).not_to_contain_text("unreported")
    _shot(page, "job-restarts")


# ignores its notice (SIGUSR1, SIGTERM, SIGHUP); touches the file it is given once it does, since a
# notice that comes while the interpreter still starts ends it at once (SIGUSR1's default action)
STUBBORN = [PY, "-c", "import pathlib, signal, sys, time; [signal.signal(s, signal.SIG_IGN) for s in (1, 10, 15)]; "
            "pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"]  # fmt: skip


def test_draining_busy_and_idle_gpus_and_a_node_under_notice_are_told_apart(service, page_of):
    svc = service(nodes=3).start()
    admin, alice = svc.token("ops", "--admin"), svc.token("alice")
    # ignores its notice, and its grace outlasts the test: its GPU stays draining; drained only once
    # it ignores signals (on a loaded machine a notice could come before, and end it: seen in CI)
    ready = svc.tmp / "stubborn-ignores-signals"
    stub = svc.submit(alice, "stubborn", [*STUBBORN, str(ready)], grace_s=150)
    busy = svc.submit(alice, "busy", SLEEPER)
    for j in (stub, busy):
        svc.wait(j, alice, lambda x: x["state"] == "running")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "the stubborn job never started ignoring signals"
        time.sleep(0.05)
    node = svc.call("GET", f"/jobs/{stub}", alice)[1]["placement"][0]  # type: ignore[index]
    code, out = svc.call("POST", f"/nodes/{node}/drain?grace_s=300", admin)
    assert code == 200, out
    svc.wait(stub, alice, lambda x: x["state"] == "preempting")
    page = page_of()
    _login(page, svc, admin)
    drained = page.locator(f'[data-node="{node}"]')
    expect(drained).to_have_class(re.compile(r"\bhealth-reclaiming\b"), timeout=WAIT_MS)
    expect(drained).to_contain_text("notice until")
    expect(drained.locator(".cell.draining")).to_have_count(1)
    cells = page.locator("#cluster .nodes .cell")
    expect(cells).to_have_count(3)
    assert page.locator("#cluster .nodes .cell.draining").count() == 1
    busy_cells = page.locator("#cluster .nodes .cell:not(.draining):not(.other)")
    # one busy (coloured by its job) and one idle (no colour), on the nodes not drained
    colours = sorted(busy_cells.evaluate_all("cs => cs.map(c => c.style.backgroundColor)"))
    assert colours[0] == "" and colours[1].startswith("rgb"), colours
    expect(page.locator("#running tr", has_text="stubborn")).to_contain_text("preempting")
    _shot(page, "draining")


def test_a_second_tenant_sees_neither_names_nor_logs_of_the_first(service, page_of):
    svc = service(nodes=3).start()
    alice, bob = svc.token("alice"), svc.token("bob")
    secret = svc.submit(alice, "alice-secret-model", SLEEPER)
    svc.wait(secret, alice, lambda j: j["state"] == "running")
    mine = svc.submit(bob, "bob-run", SLEEPER)
    svc.wait(mine, bob, lambda j: j["state"] == "running")
    queued = svc.submit(alice, "alice-queued-thing", SLEEPER, nodes=3)  # waits, with a reservation
    # the server cuts the JSON: neither alice's job ids (they carry the names) nor her tenant name
    code, ov = svc.call("GET", "/ui/api/overview", bob)
    raw = json.dumps(ov)
    assert code == 200
    for word in ("alice-secret-model", "alice-queued-thing", secret, queued, "alice"):
        assert word not in raw, word
    assert ov["queue"]["others"] == 1 and ov["running"]["others"] == 1  # type: ignore[index]
    # ... while the cluster's shape is there: two GPUs busy, one of them anonymous, one idle
    segs = [s for n in ov["cluster"]["nodes"] for s in n["segments"]]  # type: ignore[index]
    assert sorted((s["job"] is None, s["gpus"]) for s in segs) == [(False, 1), (True, 1)]
    assert svc.call("GET", f"/ui/api/jobs/{secret}", bob)[0] == 404
    # alice's gang is the head and holds a reservation: bob sees when, not whose
    deadline = time.monotonic() + 20
    while (res := svc.call("GET", "/ui/api/overview", bob)[1]["queue"]["reservation"]) is None:  # type: ignore[index]
        assert time.monotonic() < deadline, "no reservation for the blocked gang"
        time.sleep(0.2)
    assert res["job"] is None and res["t"] > time.time() and res["in_s"] > 0
    page = page_of()
    _login(page, svc, bob)
    expect(page.locator("#running")).to_contain_text("bob-run")
    expect(page.locator("#queue")).to_contain_text("1 more pending job(s) of other tenants")
    assert page.locator("#cluster .nodes .cell.other").count() == 1
    html = page.content()
    for word in ("alice-secret-model", "alice-queued-thing", secret):
        assert word not in html, word
    page.goto(f"{svc.url}/ui#job/{secret}")
    expect(page.locator("#app")).to_contain_text("No job", timeout=WAIT_MS)
    assert "hello from the job" not in page.content()
    _shot(page, "second-tenant")
    # alice herself sees her job's page with its log
    page2 = page_of()
    _login(page2, svc, alice)
    expect(page2.locator("#reservation")).to_contain_text(queued, timeout=WAIT_MS)
    page2.goto(f"{svc.url}/ui#job/{secret}")
    expect(page2.locator("pre.log")).to_contain_text("hello from the job", timeout=WAIT_MS)
    assert "bob-run" not in page2.content()


def _check_static(page, path: Path, policies: bool) -> None:  # noqa: ANN001
    page.goto(path.as_uri())
    expect(page.locator("#cluster")).to_be_visible()
    expect(page.locator("#login")).to_be_hidden()
    for key in ("series", "ledger", "tenants"):
        n = page.evaluate(
            f"(() => {{ const c = Chart.getChart('chart-{key}'); return c ? c.data.datasets.length : 0; }})()"
        )
        assert n >= 1, key
    # the goodput series has points, and the preemption log the simulator's victims
    pts = page.evaluate("Chart.getChart('chart-series').data.datasets[2].data.filter(x => x > 0).length")
    assert pts > 0
    expect(page.locator("#preemptions tbody tr").first).to_be_visible()
    assert float(page.locator("#goodput-value").inner_text()) > 0
    if policies:
        assert page.evaluate("Chart.getChart('chart-policy-goodput').data.labels") == ["goodput", "kueue-victims"]
    # the cluster mid-run: opened at its busiest snapshot, moved by the keyboard to the log's end
    busiest = page.locator("#cluster .nodes .cell[style]").count()
    assert busiest > 0
    page.get_by_label("Cluster at").focus()
    page.keyboard.press("End")
    expect(page.locator("#cluster-at-value")).to_contain_text("the log's end")
    assert page.locator("#cluster .nodes .cell[style]").count() < busiest  # every job finished by then
    # a job's page opens from the log
    page.locator("#preemptions tbody a").first.click()
    expect(page.locator("#job-history")).to_contain_text("preempt_requested")


def _small_world(tmp: Path) -> tuple[Path, Path]:
    """A workload where long low-priority gangs fill the on-demand nodes and later high-priority ones
    preempt them (after the default 600 s a run is protected), and a spot node is reclaimed."""
    rows = [
        "id,tenant,submit_s,nodes,gpus_per_node,priority,duration_s,limit_s,ckpt_interval_s,ckpt_write_s,restart_s,grace_s,spot"
    ]
    for i in range(8):
        interval = 300 if i < 6 else 0  # two never checkpoint: they lose everything since their start
        rows.append(f"lo{i},{'ab'[i % 2]},{i * 5},1,8,0,6000,7000,{interval},10,60,30,0")
    rows.append("hi0,c,1200,2,8,5,1000,1200,300,10,60,30,0")
    rows.append("hi1,a,2000,1,8,5,500,600,0,0,30,30,0")
    for i in range(10):
        rows.append(f"sm{i},c,{100 * i},1,1,0,900,1000,120,5,10,30,1")
    (tmp / "w.csv").write_text("\n".join(rows) + "\n")
    cluster = {
        "pools": [
            {"name": "od", "kind": "on-demand", "nodes": 6, "gpus_per_node": 8, "price_per_gpu_hour": 4.0},
            {"name": "spot", "kind": "spot", "nodes": 2, "gpus_per_node": 8, "price_per_gpu_hour": 1.6,
             "reclaim_per_node_hour": 0.3},
        ],
        "events": [{"t": 700, "kind": "reclaim", "pool": "spot", "nodes": 1, "notice_s": 120, "return_s": 3600}],
    }  # fmt: skip
    (tmp / "c.json").write_text(json.dumps(cluster))
    return tmp / "w.csv", tmp / "c.json"


def test_the_static_simulator_report_opens_with_the_same_charts(tmp_path, page_of):
    ui = tmp_path / "ui"
    w, c = _small_world(tmp_path)
    r = _cli("sched", "sim", "--workload", str(w), "--cluster", str(c), "--policy", "goodput",
             "--policy", "kueue-victims", "--workers", "1", "--ui", str(ui))  # fmt: skip
    assert r.returncode == 0, r.stderr
    index = ui / "index.html"
    text = index.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing to fetch (and page_of watches)
    page = page_of()
    _check_static(page, index, policies=True)
    page.goto(index.as_uri())
    expect(page.locator("#policies")).to_be_visible()
    _accessible(page)
    _shot(page, "sim-report")
    # the same views from a bare event log: goodput sched report E.jsonl --html OUT
    out = tmp_path / "report.html"
    r = _cli("sched", "report", str(ui / "events.jsonl"), "--html", str(out), "--cluster", str(c))
    assert r.returncode == 0, r.stderr
    _check_static(page_of(), out, policies=False)


def test_files_are_shipped_and_served_without_a_token(service):
    svc = service(nodes=1, cli=True).start()
    code, body = svc.call("GET", "/ui/static/chart.umd.min.js", None)
    assert code == 200 and "Chart.js" in str(body)[:200]
    assert svc.call("GET", "/ui/static/chart.js.LICENSE.md", None)[0] == 200
    for bad in ("..%2Fpage.py", "page.py", "%2Fetc%2Fpasswd", "index.html"):
        assert svc.call("GET", f"/ui/static/{bad}", None)[0] == 404, bad
