"""``goodput bench serve``: the live service under a burst of submissions, then killed and restarted.

What it measures. ``goodput sched serve`` runs as a real subprocess on 127.0.0.1 (a free port),
SQLite in a temporary directory (WAL, synchronous=FULL: every accepted submission is fsynced before
its answer), a local cluster of ``--nodes`` x ``--gpus-per-node``. Before the load an admin drains
every node (``POST /nodes/{name}/drain?grace_s=0``), so the cluster is valid but offers nothing: each
submission (1 node x all its GPUs, a shape every node could hold) is validated, committed and queued,
and no job process is ever started. The scheduler's loop thread keeps running passes over the growing
queue while the load runs (each submission wakes it); those passes find nothing free, so they are
cheap: the tick p99 reported is the cost of a pass on a drained cluster plus its store commit and
the lock it shares with the requests, not of placement work (``goodput bench sched`` measures that).

The load: ``--jobs`` POST /jobs from ``--clients`` threads, each with its own keep-alive
``http.client`` connection and one tenant token (created with ``goodput sched token add``). A
request's latency is client-side, from sending to having read the answer. Submissions/s is accepted
submissions over the wall time from the first send to the last answer. The clients run in this
process, on the same machine as the service: they share its cores.

Then the service is SIGKILLed at once (no shutdown), restarted on the same store, and every id the
clients got a 201 for is looked up: ``lost`` counts accepted ids the restarted service does not
know, ``duplicated`` counts accepted ids listed more than once or with more than one ``submitted``
event; ``unacknowledged`` counts jobs of the bench's tenant the clients never got an answer for
(a request cut by an error; 0 when ``errors`` is 0).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

GOAL_SUBMISSIONS_PER_S = 500.0
GOAL_P99_MS = 100.0
TENANT = "bench"
HOST = "127.0.0.1"


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted list."""
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _cli(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", "from goodput.cli.main import app; app()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        raise RuntimeError(f"goodput {' '.join(args[:3])} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


class _Service:
    """``goodput sched serve`` as a subprocess; its output goes to ``serve.log`` in the work directory."""

    def __init__(self, work: Path, db: str, nodes: int, gpus_per_node: int, tick_s: float) -> None:
        self.work, self.db, self.nodes, self.gpus_per_node, self.tick_s = work, db, nodes, gpus_per_node, tick_s
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout_s: float = 60.0) -> dict[str, Any]:
        self.port = _free_port()
        args = ["sched", "serve", "--db", self.db, "--host", HOST, "--port", str(self.port)]
        args += ["--nodes", str(self.nodes), "--gpus-per-node", str(self.gpus_per_node)]
        args += ["--state-dir", str(self.work / "state"), "--tick-s", str(self.tick_s)]
        with open(self.work / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from goodput.cli.main import app; app()", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C of the bench reaches us, not the service: we stop it
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                code, body = self.call("GET", "/healthz")
                if code == 200:
                    return body
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not come up in {timeout_s:.0f} s: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.work / "serve.log").read_text(errors="replace")[-2000:]
        return ""

    def call(self, method: str, path: str, token: str = "", timeout: float = 60.0) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
            r = conn.getresponse()
            raw = r.read()
            if "ndjson" in r.getheader("content-type", ""):
                return r.status, [json.loads(line) for line in raw.splitlines() if line.strip()]
            return r.status, json.loads(raw or b"null")
        finally:
            conn.close()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def _client(
    port: int, token: str, body: bytes, take: Callable[[], bool], start: threading.Barrier, out: dict[str, Any]
) -> None:
    """One client: keep-alive POST /jobs until ``take`` says the budget is spent."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    lat: list[float] = out["latency_s"]
    ids: list[str] = out["ids"]
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    start.wait()
    try:
        while take():
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/jobs", body, headers)
                r = conn.getresponse()
                raw = r.read()
            except (OSError, http.client.HTTPException) as e:
                out["errors"].append(f"{type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=60)
                continue
            lat.append(time.perf_counter() - t0)
            if r.status == 201:
                ids.append(json.loads(raw)["id"])
            else:
                out["errors"].append(f"HTTP {r.status}: {raw[:200]!r}")
    finally:
        conn.close()


def _load(port: int, token: str, jobs: int, clients: int, gpus_per_node: int) -> dict[str, Any]:
    body = json.dumps(
        {"name": "bench", "command": ["true"], "nodes": 1, "gpus_per_node": gpus_per_node, "limit_s": 3600}
    ).encode()
    left = [jobs]
    lock = threading.Lock()

    def take() -> bool:
        with lock:
            if left[0] <= 0:
                return False
            left[0] -= 1
            return True

    outs = [{"latency_s": [], "ids": [], "errors": []} for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    threads = [
        threading.Thread(
            target=_client, args=(port, token, body, take, start, o), daemon=True, name=f"bench-client-{i}"
        )
        for i, o in enumerate(outs)
    ]
    for t in threads:
        t.start()
    start.wait()
    wall0, t0 = time.time(), time.perf_counter()
    for t in threads:
        t.join()
    wall_s = time.perf_counter() - t0
    return {
        "wall_start": wall0,
        "wall_s": wall_s,
        "latency_s": sorted(x for o in outs for x in o["latency_s"]),
        "ids": [i for o in outs for i in o["ids"]],
        "errors": [e for o in outs for e in o["errors"]],
    }


def run(
    jobs: int = 10_000,
    clients: int = 16,
    *,
    nodes: int = 4,
    gpus_per_node: int = 8,
    tick_s: float = 1.0,
    directory: str | None = None,
    keep: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    if jobs < 1 or clients < 1 or nodes < 1 or gpus_per_node < 1:
        raise ValueError("--jobs, --clients, --nodes and --gpus-per-node must be >= 1")
    say = on_step or (lambda _msg: None)
    work = Path(tempfile.mkdtemp(prefix="goodput-bench-serve-", dir=directory))
    db = f"sqlite:///{work / 'sched.db'}"
    svc = _Service(work, db, nodes, gpus_per_node, tick_s)
    try:
        say("creating tokens (goodput sched token add)")
        token = _cli("sched", "token", "add", TENANT, "--db", db).strip().splitlines()[-1]
        admin = _cli("sched", "token", "add", "bench-admin", "--db", db, "--admin").strip().splitlines()[-1]
        say("starting the service")
        svc.start()
        for i in range(nodes):
            code, body = svc.call("POST", f"/nodes/local-{i:05d}/drain?grace_s=0", admin)
            if code != 200:
                raise RuntimeError(f"drain local-{i:05d}: HTTP {code} {body}")
        load_before = os.getloadavg()
        say(f"{jobs:,} submissions from {clients} clients")
        cpu0 = _cpu_s(svc.proc.pid), time.process_time()
        res = _load(svc.port, token, jobs, clients, gpus_per_node)
        cpu1 = _cpu_s(svc.proc.pid), time.process_time()
        code, stats = svc.call("GET", f"/stats?since={res['wall_start']:.6f}", admin)
        if code != 200:
            raise RuntimeError(f"GET /stats: HTTP {code} {stats}")
        code, cluster = svc.call("GET", "/cluster", admin)
        say("SIGKILL, restart on the same store")
        svc.kill9()
        t_restart = time.perf_counter()
        health = svc.start()
        restart_s = time.perf_counter() - t_restart
        say("counting the accepted jobs")
        code, listed = svc.call("GET", f"/jobs?tenant={TENANT}&limit=100000", admin)
        if code != 200:
            raise RuntimeError(f"GET /jobs: HTTP {code} {listed}")
        code, events = svc.call("GET", "/events?limit=100000", admin)
        if code != 200:
            raise RuntimeError(f"GET /events: HTTP {code} {events}")
        svc.stop()
    except BaseException:
        svc.kill9()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        raise

    seen = Counter(j["id"] for j in listed["jobs"])
    submitted = Counter(e.get("job") for e in events if e.get("event") == "submitted")
    accepted = res["ids"]
    acc = set(accepted)
    lost = sum(1 for i in acc if seen[i] == 0)
    duplicated = sum(1 for i in acc if seen[i] > 1 or submitted[i] > 1) + (len(accepted) - len(acc))
    lat = res["latency_s"]
    n_ok = len(accepted)
    running = (cluster.get("jobs") or {}).get("running", 0) if isinstance(cluster, dict) else None
    out: dict[str, Any] = {
        "submissions_per_s": n_ok / res["wall_s"] if res["wall_s"] > 0 else 0.0,
        "latency_p50_ms": 1000 * _pct(lat, 0.50) if lat else None,
        "latency_p99_ms": 1000 * _pct(lat, 0.99) if lat else None,
        "latency_max_ms": 1000 * lat[-1] if lat else None,
        "tick_p50_ms": stats["pass_ms"]["p50"],
        "tick_p99_ms": stats["pass_ms"]["p99"],
        "tick_max_ms": stats["pass_ms"]["max"],
        "tick_lock_wait_p99_ms": stats["lock_wait_ms"]["p99"],
        "passes": stats["passes"],
        "lost": lost,
        "duplicated": duplicated,
        "accepted": n_ok,
        "errors": len(res["errors"]),
        "error_sample": res["errors"][:5],
        "unacknowledged": sum(1 for i in seen if i not in acc),
        "wall_s": res["wall_s"],
        "running_during_load": running,
        "service_cpu_ms_per_submission": 1000 * (cpu1[0] - cpu0[0]) / max(1, len(res["latency_s"])),
        "client_cpu_ms_per_submission": 1000 * (cpu1[1] - cpu0[1]) / max(1, len(res["latency_s"])),
        "restart_s": restart_s,
        "restored": bool(health.get("restored")),
        "loadavg_before": list(load_before),
        "config": {
            "jobs": jobs,
            "clients": clients,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "tick_s": tick_s,
            "cpus": os.cpu_count(),
            "store": "sqlite (WAL, synchronous=FULL)",
        },
    }
    if keep:
        out["kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    goals = {
        f"submissions/s >= {GOAL_SUBMISSIONS_PER_S:g}": out["submissions_per_s"] >= GOAL_SUBMISSIONS_PER_S,
        f"latency p99 <= {GOAL_P99_MS:g} ms": out["latency_p99_ms"] is not None
        and out["latency_p99_ms"] <= GOAL_P99_MS,
        "0 lost, 0 duplicated after SIGKILL + restart": lost == 0 and duplicated == 0 and n_ok > 0,
    }
    out["goals"] = goals
    out["pass"] = all(goals.values())
    return out


def render(res: dict, console: Any) -> None:
    from rich.table import Table

    cfg = res["config"]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    console.print(
        f"[bold]goodput bench serve[/bold]: {cfg['jobs']:,} POST /jobs from {cfg['clients']} keep-alive clients "
        f"against `goodput sched serve` ({cfg['store']}; {cfg['nodes']} x {cfg['gpus_per_node']} GPUs, all "
        f"drained, so every job queues and none starts); clients and service share {cfg['cpus']} CPUs "
        f"(load average before: {res['loadavg_before'][0]:.2f})"
    )
    t = Table(title="submissions")
    for c in ("accepted", "errors", "wall s", "submissions/s", "p50 ms", "p99 ms", "max ms"):
        t.add_column(c, justify="right")
    t.add_row(
        f"{res['accepted']:,}",
        f"{res['errors']:,}",
        f"{res['wall_s']:.2f}",
        f"{res['submissions_per_s']:,.0f}",
        ms(res["latency_p50_ms"]),
        ms(res["latency_p99_ms"]),
        ms(res["latency_max_ms"]),
    )
    console.print(t)
    console.print(
        f"CPU per submission: service {res['service_cpu_ms_per_submission']:.2f} ms, "
        f"clients {res['client_cpu_ms_per_submission']:.2f} ms"
    )
    p = Table(title="scheduling passes during the load (loop thread: advance + tick, lock held)")
    for c in ("passes", "p50 ms", "p99 ms", "max ms", "lock wait p99 ms"):
        p.add_column(c, justify="right")
    p.add_row(
        f"{res['passes']:,}",
        ms(res["tick_p50_ms"]),
        ms(res["tick_p99_ms"]),
        ms(res["tick_max_ms"]),
        ms(res["tick_lock_wait_p99_ms"]),
    )
    console.print(p)
    console.print(
        f"SIGKILL, restart on the same store in {res['restart_s']:.2f} s (restored: {res['restored']}): "
        f"{res['lost']} lost, {res['duplicated']} duplicated, {res['unacknowledged']} unacknowledged"
        + (f"; first errors: {res['error_sample']}" if res["error_sample"] else "")
    )
    g = Table(title="goals")
    g.add_column("goal")
    g.add_column("result")
    for k, v in res["goals"].items():
        g.add_row(k, "[green]PASS[/green]" if v else "[red]MISS[/red]")
    console.print(g)
