"""``goodput bench serve``: the live service under a burst of submissions, then killed and restarted.

What it measures. ``goodput sched serve`` runs as a real subprocess on 127.0.0.1 (a free port),
SQLite in a temporary directory (WAL; every accepted submission is fsynced before its answer, by a
WAL fsync outside the service lock that requests committed meanwhile share), a local cluster of ``--nodes`` x ``--gpus-per-node``. Before the load an admin drains
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

By default (``kill_mid``) the service is also SIGKILLed in the middle of the load, once half the
submissions are accepted, and restarted on the same store and port while the clients keep going: each
submission carries its own idempotency key (``"key": "bench-<n>"``), and a request cut by the kill
(refused or reset connection, a 5xx) is sent again with the same key until answered; a retry of one
the dead service had committed is answered 200 with the same id (a replay), so nothing is submitted
twice. Latencies are of the answered attempts (the outage is reported as ``outage_s``, the retried
requests as ``retried``); ``submissions_per_s`` is over the load's wall time less the outage
(``submissions_per_s_wall`` includes it); the tick figures are the larger of the two processes'.

Then the service is SIGKILLed at once (no shutdown), restarted on the same store, and every id the
clients got a 201 (or a replay's 200) for is looked up: ``lost`` counts accepted ids the restarted service does not
know, ``duplicated`` counts accepted ids listed more than once or with more than one ``submitted``
event, ids answered for two submissions, and keys stored as more than one job; ``unacknowledged`` counts jobs of the bench's tenant the clients never got an answer for
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
        self.admin = ""

    def start(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Start (again on the same port after a kill: the clients know the service by it)."""
        if not self.port:
            self.port = _free_port()
        args = ["sched", "serve", "--db", self.db, "--host", HOST, "--port", str(self.port)]
        args += ["--nodes", str(self.nodes), "--gpus-per-node", str(self.gpus_per_node)]
        args += ["--state-dir", str(self.work / "state"), "--tick-s", str(self.tick_s)]
        # the bench's 16 clients share one tenant token: the per-token rate limit is not what it measures.
        # Its jobs never start (every node is drained), so a root bench lets them be root's
        args += ["--rate-limit", "0"] + (["--allow-root-jobs"] if os.geteuid() == 0 else [])
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
                    if self.admin:  # how it started (restored, adopted): the operator's view, admin only
                        code, facts = self.call("GET", "/service", self.admin)
                        if code == 200:
                            body.update(facts)
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
    port: int,
    token: str,
    body: Callable[[int], bytes],
    take: Callable[[], int | None],
    start: threading.Barrier,
    out: dict[str, Any],
    retry_s: float,
) -> None:
    """One client: keep-alive POST /jobs until ``take`` says the budget is spent.

    Each submission carries its own idempotency key; a request cut by a dead service (a refused or
    reset connection, a 5xx) is sent again with the same key until it is answered or ``retry_s``
    passes: a replay of an accepted one answers 200 with the same id, so nothing is submitted twice.
    """
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    lat: list[float] = out["latency_s"]
    ids: list[str] = out["ids"]
    conn: http.client.HTTPConnection | None = None
    start.wait()
    try:
        while (n := take()) is not None:
            payload = body(n)
            first = time.perf_counter()
            tries = 0
            while True:
                if conn is None:
                    conn = http.client.HTTPConnection(HOST, port, timeout=60)
                t0 = time.perf_counter()
                status, raw, cut = 0, b"", ""
                try:
                    conn.request("POST", "/jobs", payload, headers)
                    r = conn.getresponse()
                    status, raw = r.status, r.read()
                except (OSError, http.client.HTTPException) as e:
                    cut = f"{type(e).__name__}: {e}"
                    conn.close()
                    conn = None
                if cut or status >= 500:
                    tries += 1
                    if time.perf_counter() - first > retry_s:
                        out["errors"].append(cut or f"HTTP {status}: {raw[:200]!r}")
                        break
                    time.sleep(0.02)
                    continue
                lat.append(time.perf_counter() - t0)
                if tries:
                    out["retried_s"].append(time.perf_counter() - first)
                if status in (200, 201):
                    ids.append(json.loads(raw)["id"])
                    out["replayed"] += status == 200
                else:
                    out["errors"].append(f"HTTP {status}: {raw[:200]!r}")
                break
    finally:
        if conn is not None:
            conn.close()


def _load(
    svc: _Service,
    token: str,
    jobs: int,
    clients: int,
    gpus_per_node: int,
    *,
    kill_after: int | None,
    admin: str,
    retry_s: float = 120.0,
) -> dict[str, Any]:
    """The load; with ``kill_after``, the service is SIGKILLed once that many submissions are accepted and
    restarted on the same store and port while the clients keep sending (and retrying)."""
    spec = {"name": "bench", "command": ["true"], "nodes": 1, "gpus_per_node": gpus_per_node, "limit_s": 3600}
    head = json.dumps(spec)[:-1]

    def body(n: int) -> bytes:
        return f'{head}, "key": "bench-{n:08d}"}}'.encode()

    nxt = [0]
    lock = threading.Lock()

    def take() -> int | None:
        with lock:
            if nxt[0] >= jobs:
                return None
            nxt[0] += 1
            return nxt[0]

    outs = [{"latency_s": [], "ids": [], "errors": [], "retried_s": [], "replayed": 0} for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    threads = [
        threading.Thread(
            target=_client,
            args=(svc.port, token, body, take, start, o, retry_s),
            daemon=True,
            name=f"bench-client-{i}",
        )
        for i, o in enumerate(outs)
    ]
    kill: dict[str, Any] = {}
    done = threading.Event()

    def killer() -> None:
        try:
            while sum(len(o["ids"]) for o in outs) < (kill_after or 0):
                if done.wait(0.002):
                    return
            code, stats = svc.call("GET", f"/stats?since={kill['wall_start']:.6f}", admin)
            kill["stats_before"] = stats if code == 200 else None
            kill["accepted_at_kill"] = sum(len(o["ids"]) for o in outs)
            kill["t_kill"] = time.perf_counter()
            svc.kill9()
            kill["health"] = svc.start()
            kill["t_up"] = time.perf_counter()
        except BaseException as e:  # noqa: BLE001 - reported in the result, the clients give up on their own
            kill["error"] = f"{type(e).__name__}: {e}"

    for t in threads:
        t.start()
    k = threading.Thread(target=killer, daemon=True, name="bench-killer") if kill_after else None
    start.wait()
    kill["wall_start"], t0 = time.time(), time.perf_counter()
    if k is not None:
        k.start()
    for t in threads:
        t.join()
    wall_s = time.perf_counter() - t0
    done.set()
    if k is not None:
        k.join()
    return {
        "wall_start": kill["wall_start"],
        "wall_s": wall_s,
        "latency_s": sorted(x for o in outs for x in o["latency_s"]),
        "ids": [i for o in outs for i in o["ids"]],
        "errors": [e for o in outs for e in o["errors"]],
        "retried_s": sorted(x for o in outs for x in o["retried_s"]),
        "replayed": sum(o["replayed"] for o in outs),
        "kill": kill,
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
    kill_mid: bool = True,
    kill_at: float = 0.5,
) -> dict[str, Any]:
    """The bench; ``kill_mid`` SIGKILLs the service once ``kill_at`` of the submissions are accepted and
    restarts it on the same store while the clients retry (besides the SIGKILL after the load)."""
    if jobs < 1 or clients < 1 or nodes < 1 or gpus_per_node < 1:
        raise ValueError("--jobs, --clients, --nodes and --gpus-per-node must be >= 1")
    if not 0.0 < kill_at < 1.0:
        raise ValueError("kill_at is a fraction of the submissions, strictly between 0 and 1")
    say = on_step or (lambda _msg: None)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)  # as the other benches' --dir
    work = Path(tempfile.mkdtemp(prefix="goodput-bench-serve-", dir=directory))
    db = f"sqlite:///{work / 'sched.db'}"
    svc = _Service(work, db, nodes, gpus_per_node, tick_s)
    kill_after = max(1, min(jobs - 1, round(jobs * kill_at))) if kill_mid and jobs > 1 else None
    try:
        say("creating tokens (goodput sched token add)")
        token = _cli("sched", "token", "add", TENANT, "--db", db).strip().splitlines()[-1]
        admin = _cli("sched", "token", "add", "bench-admin", "--db", db, "--admin").strip().splitlines()[-1]
        svc.admin = admin
        say("starting the service")
        svc.start()
        for i in range(nodes):
            code, body = svc.call("POST", f"/nodes/local-{i:05d}/drain?grace_s=0", admin)
            if code != 200:
                raise RuntimeError(f"drain local-{i:05d}: HTTP {code} {body}")
        load_before = os.getloadavg()
        say(
            f"{jobs:,} submissions from {clients} clients"
            + (f" (SIGKILL + restart after {kill_after:,})" if kill_after else "")
        )
        pid0 = svc.proc.pid
        cpu0 = _cpu_s(pid0), time.process_time()
        res = _load(svc, token, jobs, clients, gpus_per_node, kill_after=kill_after, admin=admin)
        kill = res["kill"]
        if kill.get("error"):
            raise RuntimeError(f"the SIGKILL + restart in the middle of the load failed: {kill['error']}")
        # the CPU of the process that served the whole load (without a kill in the middle), else -1: a
        # SIGKILLed process's times are gone
        cpu1 = (_cpu_s(pid0) if svc.proc.pid == pid0 else -1.0), time.process_time()
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
    keys = Counter(j.get("key") for j in listed["jobs"] if j.get("key"))
    submitted = Counter(e.get("job") for e in events if e.get("event") == "submitted")
    accepted = res["ids"]
    acc = set(accepted)
    lost = sum(1 for i in acc if seen[i] == 0)
    duplicated = (
        sum(1 for i in acc if seen[i] > 1 or submitted[i] > 1)
        + (len(accepted) - len(acc))  # one id answered for two submissions
        + sum(n - 1 for n in keys.values() if n > 1)  # one submission (key) stored as two jobs
    )
    lat = res["latency_s"]
    n_ok = len(accepted)
    outage_s = kill["t_up"] - kill["t_kill"] if "t_up" in kill else 0.0
    busy_s = max(1e-9, res["wall_s"] - outage_s)
    running = (cluster.get("jobs") or {}).get("running", 0) if isinstance(cluster, dict) else None
    halves = [st for st in (kill.get("stats_before"), stats) if st]
    tick = {
        q: max((st["pass_ms"][q] for st in halves if st["pass_ms"][q] is not None), default=None)
        for q in ("p50", "p99", "max")
    }
    wait_p99 = max((st["lock_wait_ms"]["p99"] for st in halves if st["lock_wait_ms"]["p99"] is not None), default=None)
    retried = res["retried_s"]
    out: dict[str, Any] = {
        # the rate while a service is up: accepted over the load's wall time less the outage of a kill
        "submissions_per_s": n_ok / busy_s,
        "submissions_per_s_wall": n_ok / res["wall_s"] if res["wall_s"] > 0 else 0.0,
        "latency_p50_ms": 1000 * _pct(lat, 0.50) if lat else None,
        "latency_p99_ms": 1000 * _pct(lat, 0.99) if lat else None,
        "latency_max_ms": 1000 * lat[-1] if lat else None,
        "tick_p50_ms": tick["p50"],
        "tick_p99_ms": tick["p99"],
        "tick_max_ms": tick["max"],
        "tick_lock_wait_p99_ms": wait_p99,
        "passes": sum(st["passes"] for st in halves),
        "lost": lost,
        "duplicated": duplicated,
        "accepted": n_ok,
        "errors": len(res["errors"]),
        "error_sample": res["errors"][:5],
        "unacknowledged": sum(1 for i in seen if i not in acc),
        "killed_mid_load": "t_up" in kill,
        "accepted_at_kill": kill.get("accepted_at_kill"),
        "outage_s": outage_s,
        "retried": len(retried),
        "retried_latency_max_ms": 1000 * retried[-1] if retried else None,
        "replayed": res["replayed"],
        "wall_s": res["wall_s"],
        "running_during_load": running,
        "service_cpu_ms_per_submission": (
            1000 * (cpu1[0] - cpu0[0]) / max(1, len(res["latency_s"])) if cpu1[0] >= 0 else None
        ),
        "client_cpu_ms_per_submission": 1000 * (cpu1[1] - cpu0[1]) / max(1, len(res["latency_s"])),
        "restart_s": restart_s,
        "restored": bool(health.get("restored")) and bool((kill.get("health") or {"restored": True}).get("restored")),
        "loadavg_before": list(load_before),
        "config": {
            "jobs": jobs,
            "clients": clients,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "tick_s": tick_s,
            "kill_mid": kill_after is not None,
            "kill_after": kill_after,
            "cpus": os.cpu_count(),
            "store": "sqlite (WAL, synchronous=NORMAL + a shared WAL fsync before each answer)",
            "http": _http_impl(),
        },
    }
    if keep:
        out["kept"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    kills = "SIGKILL mid-load + restart, then SIGKILL + restart" if kill_after else "SIGKILL + restart"
    goals = {
        f"submissions/s >= {GOAL_SUBMISSIONS_PER_S:g}": out["submissions_per_s"] >= GOAL_SUBMISSIONS_PER_S,
        f"latency p99 <= {GOAL_P99_MS:g} ms": out["latency_p99_ms"] is not None
        and out["latency_p99_ms"] <= GOAL_P99_MS,
        f"0 lost, 0 duplicated after {kills}": lost == 0 and duplicated == 0 and n_ok > 0,
    }
    out["goals"] = goals
    out["pass"] = all(goals.values())
    return out


def _http_impl() -> str:
    """What the service runs: uvicorn's h11 parser (``serve()`` bounds a request's header block
    there), and uvloop when installed, else asyncio."""
    import importlib.util

    parser = "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"uvicorn ({parser}, {loop})"


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
    svc_cpu = res["service_cpu_ms_per_submission"]
    console.print(
        f"CPU per submission: service {'-' if svc_cpu is None else f'{svc_cpu:.2f}'} ms, "
        f"clients {res['client_cpu_ms_per_submission']:.2f} ms; HTTP: {cfg.get('http', '?')}"
    )
    if res.get("killed_mid_load"):
        console.print(
            f"SIGKILL in the middle of the load after {res['accepted_at_kill']:,} accepted, restarted on the same "
            f"store in {res['outage_s']:.2f} s: {res['retried']:,} requests retried with their keys "
            f"(slowest {ms(res['retried_latency_max_ms'])} ms from first send), {res['replayed']:,} answered as "
            f"replays; submissions/s leaves the outage out ({res['submissions_per_s_wall']:,.0f}/s over the wall "
            f"time); latencies are of answered attempts"
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
