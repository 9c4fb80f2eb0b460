"""``goodput demo --part live``: the live service preempts a real job, which resumes from its commit.

1. The service (``goodput.sched.live.service``) starts on 127.0.0.1 with a temporary SQLite store and one
   local slot; the jobs are ``goodput.demo.example_job`` (a Checkpointer, commit reports by HTTP).
2. A low-priority job starts and commits checkpoints; a high-priority job arrives and takes its slot:
   the victim is asked to checkpoint (SIGUSR1), leaves with exit 75, is requeued, and resumes from its
   committed checkpoint once the preemptor has finished.
Checks: the victim was preempted once and never failed; its second run restored a committed step
(not step 0); the preemptor started only after the victim's slot was released; both final weights
equal an uninterrupted run's, bitwise; the independent checker finds no violation in the event log.
Exits non-zero if a check fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

console = Console()
LOW_STEPS, HIGH_STEPS, STEP_S = 250, 60, 0.02
TIMEOUT_S = 120.0


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
        return raw.decode() if "ndjson" in r.headers.get("content-type", "") else json.loads(raw)


def _view(jobs: list[dict], events: list[dict]) -> Group:
    t = Table("job", "prio", "state", "substate", "epoch", "preemptions", "last commit (step)", "slot")
    for j in jobs:
        rep = (j.get("checkpoint") or {}).get("last_report") or {}
        t.add_row(
            j["id"], str(j["priority"]), j["state"], j["substate"], str(j["epoch"]), str(j["preemptions"]),
            str(rep.get("step", "")), ",".join(j["placement"]),
        )  # fmt: skip
    e = Table("t", "event", "job", "details", title="latest events", title_justify="left")
    t0 = events[0]["t"] if events else 0.0
    for r in events[-8:]:
        rest = {k: v for k, v in r.items() if k not in ("t", "event", "job", "candidates", "seq")}
        e.add_row(f"{r['t'] - t0:6.2f}", r["event"], str(r.get("job", r.get("node", ""))), json.dumps(rest)[:70])
    return Group(t, e)


def run_live_demo(workdir: str | None = None) -> int:
    import uvicorn

    from goodput.demo.example_job import expected_weights
    from goodput.sched.live.client import post_json
    from goodput.sched.live.local import free_port
    from goodput.sched.live.service import MAX_HEADER_BYTES, Service, create_app, local_pools, new_token
    from goodput.sched.sim.checker import check

    own = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-live-"))
    base.mkdir(parents=True, exist_ok=True)
    checks: list[tuple[str, bool, str]] = []
    old_pp = os.environ.get("PYTHONPATH")
    pkg_root = str(Path(__file__).resolve().parents[2])  # the jobs import goodput as this process does
    os.environ["PYTHONPATH"] = pkg_root + (os.pathsep + old_pp if old_pp else "")
    svc = server = thread = None
    try:
        console.rule("[bold]goodput demo: the live scheduler preempts a job, which resumes from its checkpoint")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        db = f"sqlite:///{base / 'sched.db'}"
        from goodput.sched.core.governance import Governance, Limits, TenantSpec

        # one user's machine: the demo tenant's jobs run as this process's user (root included), their
        # checkpoints under the demo's directory, and a young run may be preempted (min_run_s 0)
        gov = Governance(tenants={"demo": TenantSpec("demo", ckpt_prefix=str(base))}, limits=Limits(min_run_s=0))
        svc = Service(
            db, local_pools(1, 1), state_dir=base / "state", url=url, tick_s=0.2, poll_s=0.1,
            governance=gov, allow_root_jobs=True,
        )  # fmt: skip
        token = new_token(svc.store, "demo")
        config = uvicorn.Config(
            create_app(svc),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            http="h11",  # as `goodput sched serve` runs it (a bound on a request's header block)
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        server = uvicorn.Server(config)
        svc.start()
        thread = threading.Thread(target=server.run, name="goodput-demo-uvicorn", daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        console.print(f"service on {url}, store {db}, 1 slot; jobs: python -m goodput.demo.example_job")

        def submit(name: str, steps: int, priority: int) -> str:
            body = {
                "name": name,
                "command": [sys.executable, "-m", "goodput.demo.example_job", "--steps", str(steps)]
                + ["--step-s", str(STEP_S), "--interval", "10"],
                "priority": priority,
                "limit_s": 600,
                "ckpt_root": str(base / name),
                "grace_s": 20,
                "ckpt_interval_s": 1,
                "ckpt_write_s": 0.5,
            }
            code, ans = post_json(url + "/jobs", body, token)
            if code != 201:
                raise RuntimeError(f"submit {name}: HTTP {code} {ans}")
            return ans["id"]

        ids: list[str] = []
        high_sent = False
        deadline = time.monotonic() + TIMEOUT_S
        jobs: list[dict] = []
        with Live(_view([], []), console=console, refresh_per_second=8) as live:
            ids.append(submit("low", LOW_STEPS, 0))
            while True:
                jobs = [_get(f"{url}/jobs/{i}", token) for i in ids]
                events = [json.loads(x) for x in _get(f"{url}/events", token).splitlines()]
                live.update(_view(jobs, events))
                low = jobs[0]
                if not high_sent and low["state"] == "running" and low["checkpoint"]["committed_s"] > 0:
                    ids.append(submit("high", HIGH_STEPS, 10))  # arrives while the low job holds the only slot
                    high_sent = True
                if (
                    high_sent
                    and len(jobs) == 2
                    and all(j["state"] in ("finished", "failed", "cancelled") for j in jobs)
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the jobs did not finish within {TIMEOUT_S:.0f} s")
                time.sleep(0.2)
        low, high = jobs
        events = [json.loads(x) for x in _get(f"{url}/events", token).splitlines()]

        # -- checks
        exited = [h["status"] for h in low["history"] if h["event"] == "exited"]
        checks.append(
            (
                "the low job was preempted once, checkpointed and left (exit 75), never failed",
                low["preemptions"] == 1 and low["failures"] == 0 and exited == ["preempted", "finished"],
                f"exits {exited}, preemptions {low['preemptions']}, failures {low['failures']}",
            )
        )
        pre = next((h for h in low["history"] if h["event"] == "preempt_requested"), {})
        checks.append(
            (
                "its victim choice names the preemptor, with a checkpoint asked",
                pre.get("victim_of") == high["id"] and pre.get("checkpoint") is True,
                f"victim_of {pre.get('victim_of')}, checkpoint {pre.get('checkpoint')}",
            )
        )
        starts = [json.loads(x) for x in (base / "low" / "starts.jsonl").read_text().splitlines()]
        restored = starts[-1]["restored_step"] if len(starts) == 2 else 0
        checks.append(
            (
                "its second run resumed from its committed checkpoint",
                [s["epoch"] for s in starts] == [1, 2] and 0 < restored < LOW_STEPS,
                f"run 2 restored step {restored} of {LOW_STEPS}",
            )
        )
        t_rel = next((h["t"] for h in low["history"] if h["event"] == "released"), float("inf"))
        t_high = next((h["t"] for h in high["history"] if h["event"] == "started"), float("-inf"))
        checks.append(
            (
                "the preemptor started only after the victim's slot was released",
                t_rel <= t_high,
                f"released at +{t_rel - low['submit_s']:.2f} s, preemptor started at +{t_high - low['submit_s']:.2f} s",
            )
        )
        for name, steps in (("low", LOW_STEPS), ("high", HIGH_STEPS)):
            fin = base / name / "final.json"
            w = json.loads(fin.read_text())["w"] if fin.exists() else None
            checks.append(
                (f"{name}: final weights equal an uninterrupted run's (bitwise)", w == expected_weights(steps), "")
            )
        rep = check(events, {"local-00000": 1})
        checks.append(("the independent checker: no violation in the event log", rep.total == 0, rep.summary()))
    except Exception as e:  # noqa: BLE001 - a demo reports its failure and exits non-zero
        checks.append(("the demo ran", False, f"{type(e).__name__}: {e}"))
    finally:
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=10)
        if svc is not None:
            for run in list(svc.executor.runs.values()):  # nothing left running behind the demo
                svc.executor._killpg(run)
            svc.close()
        if old_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_pp
        if own:
            shutil.rmtree(base, ignore_errors=True)
    return report_checks(checks)


def report_checks(checks: list[tuple[str, bool, str]]) -> int:
    """Print the checks table; 0 if every check passed, else 1 (also used by goodput.demo.sched_live)."""
    t = Table("check", "", "details", title="checks", title_justify="left")
    for what, ok, detail in checks:
        t.add_row(what, "[green]ok[/green]" if ok else "[red]FAILED[/red]", detail)
    console.print(t)
    ok = bool(checks) and all(c[1] for c in checks)
    console.rule("[green]all checks passed" if ok else "[red]a check failed")
    return 0 if ok else 1


@contextlib.contextmanager
def job_pythonpath() -> Iterator[None]:
    """Jobs started from here import goodput as this process does (PYTHONPATH), restored after."""
    old_pp = os.environ.get("PYTHONPATH")
    pkg_root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = pkg_root + (os.pathsep + old_pp if old_pp else "")
    try:
        yield
    finally:
        if old_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_pp


def get(url: str, token: str) -> Any:
    """GET with a bearer token: JSON decoded, JSONL as text."""
    return _get(url, token)


def events_of(url: str, token: str) -> list[dict]:
    return [json.loads(x) for x in _get(f"{url}/events", token).splitlines()]


if __name__ == "__main__":
    raise SystemExit(run_live_demo(sys.argv[1] if len(sys.argv) > 1 else None))
