"""Refresh docs/dashboard.png: the dashboard's overview of a small live cluster, as an admin sees it.

    .venv/bin/python tools/dashboard_screenshot.py [--out docs/dashboard.png] [--chromium /usr/bin/chromium]

It starts the service's app (as `goodput sched serve` runs it) on 127.0.0.1 (4 nodes x 2 slots, SQLite
in a temporary directory, the operator's min_run_s at 0),
submits jobs of three tenants (two checkpointing example jobs, plain sleepers), lets a high-priority
job preempt the cheapest victim, drains a node whose job ignores its notice (so its GPUs show
draining), queues a gang that fits nowhere, then opens /ui in the system Chromium (Playwright;
never a downloaded browser) and writes the screenshot. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
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
TRAIN = [PY, "-m", "goodput.demo.example_job", "--steps", "100000", "--step-s", "0.05", "--interval", "20"]
SLEEP = [PY, "-c", "import time; time.sleep(900)"]
STUBBORN = [PY, "-c", "import signal, time; [signal.signal(s, signal.SIG_IGN) for s in (1, 10, 15)]; time.sleep(900)"]


# the app `goodput sched serve` runs, on 4 nodes x 2 slots, with the operator's limit on preempting young
# runs (min_run_s, 600 s by default) at 0 so that the preemption happens within the minute, and the
# jobs run as this user (a single-user machine)
LAUNCH = """
import inspect, sys, uvicorn
from goodput.sched.live.service import Service, create_app, local_pools
db, port, state = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kw = {}
params = inspect.signature(Service).parameters
if "allow_root_jobs" in params:
    kw["allow_root_jobs"] = True
if "governance" in params:
    from goodput.sched.core.governance import Governance
    kw["governance"] = Governance.from_obj(None, {"min_run_s": 0})
svc = Service(db, local_pools(4, 2), state_dir=state, url=f"http://127.0.0.1:{port}", tick_s=0.2, **kw)
svc.start()
try:
    uvicorn.run(create_app(svc), host="127.0.0.1", port=port, log_level="warning")
finally:
    svc.close()
"""


def cli(*args: str) -> str:
    r = subprocess.run(
        [PY, "-c", "from goodput.cli.main import app; app()", *args], capture_output=True, text=True, check=True
    )
    return r.stdout.strip().splitlines()[-1]


def call(url: str, method: str, path: str, token: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: HTTP {e.code}: {e.read()[:1000]!r}") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="goodput-ui-shot-"))
    db = f"sqlite:///{tmp / 'sched.db'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    admin = cli("sched", "token", "add", "ops", "--db", db, "--admin")
    tok = {t: cli("sched", "token", "add", t, "--db", db) for t in ("alice", "bob", "carol")}
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - held for the service's life
    proc = subprocess.Popen([PY, "-c", LAUNCH, db, str(port), str(tmp / "state")], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)

        def submit(tenant: str, name: str, command: list[str], **kw: object) -> str:
            body = {"name": name, "command": command, "limit_s": 3600, "ckpt_interval_s": 0, "grace_s": 20, **kw}
            return call(url, "POST", "/jobs", tok[tenant], body)["id"]

        def wait(tenant: str, jid: str, pred, timeout: float = 120) -> None:  # noqa: ANN001
            end = time.monotonic() + timeout
            while not pred(call(url, "GET", f"/jobs/{jid}", tok[tenant])):
                if time.monotonic() > end:
                    raise SystemExit(f"{jid}: timed out; see {tmp / 'serve.log'}")
                time.sleep(0.2)

        ck = {"ckpt_interval_s": 1.0, "ckpt_write_s": 0.5, "restart_s": 5}
        pre = submit("alice", "pretrain-7b", TRAIN, nodes=2, gpus_per_node=2, priority=1, **ck)
        fine = submit("bob", "finetune", TRAIN, priority=0, **ck)
        submit("bob", "eval-sweep", SLEEP, priority=0, ckpt_interval_s=10)  # never commits: overdue after 10 s
        stub = submit("carol", "render", STUBBORN, gpus_per_node=2, priority=0)
        for t, j in (("alice", pre), ("bob", fine)):
            wait(t, j, lambda x: x["state"] == "running" and x["checkpoint"]["committed_s"] > 0)
        wait("carol", stub, lambda x: x["state"] == "running")
        time.sleep(3)
        urgent = submit("alice", "urgent-fix", TRAIN, priority=10, **ck)
        wait("alice", urgent, lambda x: x["state"] == "running")
        node = call(url, "GET", f"/jobs/{stub}", tok["carol"])["placement"][0]
        call(url, "POST", f"/nodes/{node}/drain?grace_s=900", admin)
        submit("carol", "big-gang", SLEEP, nodes=4, gpus_per_node=2, priority=0)
        submit("bob", "ablation", SLEEP, priority=0)
        time.sleep(6)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=args.chromium, args=ARGS)
            page = b.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + "/ui")
            page.get_by_label("Bearer token").fill(admin)
            page.get_by_role("button", name="Sign in").click()
            page.locator("#preemptions tbody tr").first.wait_for(timeout=20_000)
            page.wait_for_timeout(2500)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.out, full_page=True)
            b.close()
        print(args.out)
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for rec in (tmp / "state" / "runs").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(json.loads(rec.read_text())["pgid"], signal.SIGKILL)
        log.close()


if __name__ == "__main__":
    raise SystemExit(main())
