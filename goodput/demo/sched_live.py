"""``goodput demo --sched``: three torchrun jobs share 4 slots; one is preempted, resized and resumed.

1. The service (``goodput sched serve``, a separate process, SQLite in a temporary directory) runs
   with 4 local slots. Three real CPU training jobs start under torchrun (gloo):
   ``goodput.demo.example_dist_job``, the project demo's TinyGPT with AdamW, saved by the sharded
   Checkpointer. ``a`` has 2 workers, ``b`` and ``c`` one each.
2. Once all three have committed, a high-priority job ``h`` of 2 workers arrives: the scheduler
   prices every way to free 2 slots and picks the victim set with the least work to lose
   (``a``'s restart is declared short), asks it to checkpoint (SIGUSR1 to every process of the
   run), and gives its slots to ``h`` only once it has exited with 75.
3. While the victim is preempting, the service is SIGKILLed and restarted: it restores from
   SQLite and re-adopts the runs (the victim's exit, written by its supervisor while the service
   was down, is read back).
4. The requeued victim is resized to the other number of workers (2 -> 1) while it is pending
   (``POST /jobs/{id}/resize``): the same job, its next run on one slot; it resumes from its
   committed step (the checkpoint reshards).
Checks: the victim choice is the cheapest; the preemptor started only after the victim's release;
nothing was lost across the restart; the resumed run restored the committed step on another world
size; every final model equals an uninterrupted one-process run's, bitwise for the one-worker jobs
(the same layout) and within ``TOLERANCE`` (relative) across world sizes (in practice bitwise too:
one rank sums both halves' gradients in the all-reduce's order); the independent checker finds no
violation. Prints the event log's summary (preemptions, work lost, goodput); exits 1 on a failure.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table

from goodput.demo.live import console, events_of, get, job_pythonpath, report_checks

SLOTS = 4
STEP_S = 0.1
TOLERANCE = 1e-6
TIMEOUT_S = 150.0
# name: (workers, steps, declared restart_s, priority)
JOBS = {"a": (2, 70, 1.0, 0), "b": (1, 60, 5.0, 0), "c": (1, 60, 5.0, 0)}
HIGH = ("h", 2, 25, 1.0, 10)
TERMINAL = ("finished", "failed", "cancelled")


class ServiceProcess:
    """``goodput sched serve`` as a child process, so that it can be SIGKILLed and restarted.

    The demos' and tests' one way to run the service apart: :meth:`spawn` starts it with the given
    arguments and waits for ``/healthz``; :meth:`kill9` is the crash, :meth:`stop` the clean end.
    This demo's own service (4 local slots, one admin tenant) is :meth:`start`;
    ``goodput.demo.slurm.SlurmService`` starts the Slurm executor's."""

    def __init__(self, base: Path) -> None:
        from goodput.sched.live.local import free_port

        self.base = base
        self.db = f"sqlite:///{base / 'sched.db'}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.health: dict[str, Any] = {}

    def new_token(self, tenant: str, *, admin: bool = False) -> str:
        """A fresh token of ``tenant`` in the service's store (the store may be written while it runs)."""
        from goodput.sched.live.service import new_token
        from goodput.sched.live.store import open_store

        store = open_store(self.db)
        try:
            return new_token(store, tenant, "admin" if admin else "tenant")
        finally:
            store.close()

    def token(self) -> str:
        return self.new_token("demo", admin=True)

    def spawn(self, args: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        """``goodput sched serve --db DB --port PORT ARGS...``, its output appended to ``serve.log``;
        returns once ``/healthz`` answers (kept in ``health``), raises with the log's tail if it exits."""
        cmd = [sys.executable, "-m", "goodput.cli.main", "sched", "serve", "--db", self.db, "--port", str(self.port)]
        with open(self.base / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd + args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    self.health = json.loads(r.read())
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("the service exited: " + self.log_tail()) from None
                time.sleep(0.1)
        raise RuntimeError("the service did not come up: " + self.log_tail())

    def log_tail(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.base / "serve.log").read_text(errors="replace")[-n:]
        return ""

    def start(self) -> None:
        if not getattr(self, "admin", ""):
            self.admin = self.token()
        # one user's machine: the demo tenant's jobs run as this user (root included, --allow-root-jobs),
        # their checkpoints under the demo's directory, and a young run may be preempted (min_run_s 0)
        cluster = self.base / "cluster.json"
        cluster.write_text(
            json.dumps(
                {
                    "pools": [
                        {
                            "name": "local",
                            "kind": "on-demand",
                            "nodes": SLOTS,
                            "gpus_per_node": 1,
                            "price_per_gpu_hour": 1,
                        }
                    ],
                    "tenants": [{"name": "demo", "ckpt_prefix": str(self.base)}],
                    "limits": {"min_run_s": 0},
                }
            )
        )
        self.spawn(
            ["--cluster", str(cluster), "--allow-root-jobs", "--state-dir", str(self.base / "state"), "--tick-s", "0.2"]
        )
        # how it started (restored, adopted runs) is the operator's: GET /service, admin only
        req = urllib.request.Request(self.url + "/service", headers={"Authorization": f"Bearer {self.admin}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            self.health.update(json.loads(r.read()))

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()


def _command(steps: int) -> list[str]:
    # torchrun takes its worker count from PET_NPROC_PER_NODE, which the executor sets to the slots
    return [sys.executable, "-m", "torch.distributed.run", "--monitor-interval", "0.1"] + [
        "-m", "goodput.demo.example_dist_job", "--steps", str(steps), "--step-s", str(STEP_S), "--interval", "5",
    ]  # fmt: skip


def _view(jobs: list[dict], cluster: dict | None, events: list[dict], note: str) -> Group:
    t = Table("job", "id", "prio", "workers", "state", "substate", "epoch", "preempted", "commit step", "slots")
    for j in jobs:
        rep = (j.get("checkpoint") or {}).get("last_report") or {}
        t.add_row(
            j["name"], j["id"], str(j["priority"]), str(j["nodes"]), j["state"], j["substate"], str(j["epoch"]),
            str(j["preemptions"]), str(rep.get("step", "")), ",".join(n[-1] for n in j["placement"]),
        )  # fmt: skip
    s = Table(*[f"slot {i}" for i in range(SLOTS)], title="slots", title_justify="left")
    if cluster:
        names = {j["id"]: j["name"] for j in jobs}
        s.add_row(*[" ".join(names.get(x, x) for x in n["jobs"]) or "·" for n in cluster["nodes"]])
    else:
        s.add_row(*["?"] * SLOTS)
    e = Table("t", "event", "job", "details", title="latest events", title_justify="left")
    t0 = events[0]["t"] if events else 0.0
    for r in events[-7:]:
        rest = {k: v for k, v in r.items() if k not in ("t", "event", "job", "candidates", "seq")}
        e.add_row(f"{r['t'] - t0:6.2f}", r["event"], str(r.get("job", r.get("node", ""))), json.dumps(rest)[:60])
    return Group(t, s, e, note)


def _summary(events: list[dict], names: dict[str, str]) -> tuple[Table, float]:
    """Per job from the event log: runs, preemptions, work lost (as priced), GPU-seconds held; goodput."""
    held: dict[str, float] = {}
    lost: dict[str, float] = {}
    runs: dict[str, int] = {}
    pre: dict[str, int] = {}
    open_: dict[str, tuple[float, int]] = {}
    for r in events:
        j = r.get("job")
        if r["event"] == "started":
            runs[j] = runs.get(j, 0) + 1
            open_[j] = (r["t"], len(r.get("nodes", ())) * int(r.get("gpus_per_node", 1)))
        elif r["event"] == "released" and j in open_:
            t0, g = open_.pop(j)
            held[j] = held.get(j, 0.0) + (r["t"] - t0) * g
        elif r["event"] == "preempt_requested":
            pre[j] = pre.get(j, 0) + 1
            gpus = next((c for c in r.get("candidates", []) if c["job"] == j), None)
            lost[j] = lost.get(j, 0.0) + (gpus["lost_gpu_s"] if gpus else float(r.get("lost_s", 0.0)))
    t = Table("job", "id", "runs", "preempted", "work lost (GPU-s, as priced)", "GPU-s held", title="event log summary")
    for j in sorted(runs, key=lambda x: names.get(x, x)):
        t.add_row(
            names.get(j, j), j, str(runs[j]), str(pre.get(j, 0)), f"{lost.get(j, 0.0):.2f}", f"{held.get(j, 0):.1f}"
        )
    total = sum(held.values())
    gp = (total - sum(lost.values())) / total if total > 0 else 0.0
    return t, gp


def run_sched_live_demo(workdir: str | None = None) -> int:
    import torch

    from goodput.demo.example_dist_job import compare, reference
    from goodput.sched.live.client import post_json
    from goodput.sched.sim.checker import check

    t_start = time.monotonic()
    own = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-sched-"))
    base.mkdir(parents=True, exist_ok=True)
    checks: list[tuple[str, bool, str]] = []
    svc = ServiceProcess(base)
    ids: dict[str, str] = {}  # name -> id
    steps_of: dict[str, int] = {}
    workers_of: dict[str, int] = {}
    summary: Table | None = None
    goodput = 0.0
    with contextlib.ExitStack() as stack:
        stack.enter_context(job_pythonpath())
        try:
            console.rule("[bold]goodput demo --sched: 3 torchrun jobs on 4 slots, a preemption, a service SIGKILL")
            token = svc.token()
            svc.start()
            url = svc.url
            console.print(f"service on {url} (pid {svc.proc.pid}), store {svc.db}, {SLOTS} slots")

            def submit(name: str, workers: int, steps: int, restart_s: float, prio: int, root: str = "") -> str:
                body = {
                    "name": name.replace("'", "-r"), "command": _command(steps), "nodes": workers,
                    "gpus_per_node": 1, "priority": prio, "limit_s": 600, "ckpt_root": root or str(base / name),
                    "grace_s": 30, "ckpt_interval_s": 1, "ckpt_write_s": 0.5, "restart_s": restart_s,
                }  # fmt: skip
                code, ans = post_json(url + "/jobs", body, token)
                if code != 201:
                    raise RuntimeError(f"submit {name}: HTTP {code} {ans}")
                ids[name], steps_of[name], workers_of[name] = ans["id"], steps, workers
                return ans["id"]

            for name, (w, steps, rs, prio) in JOBS.items():
                submit(name, w, steps, rs, prio)
            phase, victims, before_kill = 0, [], []
            health_after: dict[str, Any] = {}
            deadline = time.monotonic() + TIMEOUT_S
            note = ""
            with Live(console=console, refresh_per_second=6, transient=False) as live:
                while True:
                    jobs = [get(f"{url}/jobs/{i}", token) for i in ids.values()]
                    by = {j["id"]: j for j in jobs}
                    events = events_of(url, token)
                    live.update(_view(jobs, get(f"{url}/cluster", token), events, note))
                    if phase == 0 and all(
                        by[ids[n]]["state"] == "running" and by[ids[n]]["checkpoint"]["committed_s"] > 0 for n in JOBS
                    ):
                        submit(*HIGH)
                        note, phase = "h (priority 10, 2 workers) submitted", 1
                    elif phase == 1:
                        victims = [n for n in JOBS if by[ids[n]]["state"] == "preempting"]
                        if victims:
                            before_kill = events
                            svc.kill9()
                            live.update(
                                _view(
                                    jobs,
                                    None,
                                    events,
                                    f"[red]service SIGKILLed[/red] ({', '.join(victims)} preempting); restarting",
                                )
                            )
                            svc.start()
                            health_after = dict(svc.health)
                            note, phase = (
                                f"service restarted: restored={svc.health.get('restored')}, adopted={svc.health.get('adopted')}",
                                2,
                            )
                    elif phase == 2 and all(by[ids[v]]["state"] == "pending" for v in victims):
                        for v in victims:  # the same job, its next run on the other number of workers
                            w = JOBS[v][0]
                            code, ans = post_json(f"{url}/jobs/{ids[v]}/resize", {"nodes": 1 if w > 1 else 2}, token)
                            if code != 200:
                                raise RuntimeError(f"resize {v}: HTTP {code} {ans}")
                            workers_of[v] = ans["nodes"]
                        note, phase = f"{', '.join(victims)} resized to the other number of workers", 3
                    elif phase == 3 and all(j["state"] in TERMINAL for j in jobs):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the demo did not finish within {TIMEOUT_S:.0f} s (phase {phase})")
                    time.sleep(0.25)
            jobs = {n: get(f"{url}/jobs/{i}", token) for n, i in ids.items()}
            events = events_of(url, token)
            names = {i: n for n, i in ids.items()}

            # -- the victim choice: the cheapest of the ways to free 2 slots, as the core priced them
            pre = [r for r in events if r["event"] == "preempt_requested" and r.get("victim_of") == ids["h"]]
            cands = {c["job"]: c["lost_gpu_s"] for c in (pre[0].get("candidates", []) if pre else [])}
            chosen = sum(cands.get(ids[v], float("inf")) for v in victims)
            ones = sorted(cands.get(ids[n], float("inf")) for n in JOBS if JOBS[n][0] == 1)
            options = [cands.get(ids[n], float("inf")) for n in JOBS if JOBS[n][0] >= 2] + [sum(ones[:2])]
            checks.append(
                (
                    "the victim set is the cheapest way to free 2 slots (least work to lose)",
                    bool(pre) and chosen <= min(options) + 1e-9 and all(r.get("checkpoint") for r in pre),
                    f"victims {victims} cost {chosen:.2f} GPU-s; options {[round(o, 2) for o in options]}; checkpoint asked",
                )
            )
            ok_exit, gave = True, True
            for v in victims:
                hist = [r for r in events if r.get("job") == ids[v]]
                exits = [r["status"] for r in hist if r["event"] == "exited"]
                t_exit = next((r["t"] for r in hist if r["event"] == "exited"), float("inf"))
                t_rel = next((r["t"] for r in hist if r["event"] == "released"), float("inf"))
                t_h = next((r["t"] for r in events if r.get("job") == ids["h"] and r["event"] == "started"), -1.0)
                ok_exit &= exits[:1] == ["preempted"] and jobs[v]["failures"] == 0  # its first run's exit
                gave &= t_exit <= t_rel <= t_h
            checks.append(("the victim checkpointed and left with 75 (exited preempted), no failure", ok_exit, ""))
            checks.append(("its slots went to h only after its exit was observed and released", gave, ""))

            # -- the restart
            after = [{k: v for k, v in r.items() if k != "seq"} for r in events]
            prefix = [{k: v for k, v in r.items() if k != "seq"} for r in before_kill]
            submitted = [r["job"] for r in events if r["event"] == "submitted"]
            checks.append(
                (
                    "service SIGKILLed mid-preemption and restarted: nothing lost",
                    health_after.get("restored") is True
                    and after[: len(prefix)] == prefix
                    and sorted(submitted) == sorted(ids.values())
                    and len(set(submitted)) == len(submitted),
                    f"{len(prefix)} events before the kill kept; {len(submitted)} jobs submitted once each; "
                    f"adopted {health_after.get('adopted')}",
                )
            )

            # -- the resize and resume
            for v in victims:
                starts = [json.loads(x) for x in (base / v / "starts.jsonl").read_text().splitlines()]
                committed = [s["restored_step"] for s in starts[1:]]
                worlds = [s["world"] for s in starts]
                checks.append(
                    (
                        f"{v} resumed from its committed step on a different number of workers",
                        len(starts) == 2 and worlds[0] != worlds[1] and 0 < committed[0] < steps_of[v],
                        f"workers {worlds[0]} -> {worlds[1]}, resumed at step {committed[0] if committed else '-'} "
                        f"of {steps_of[v]}",
                    )
                )
            # -- final weights against uninterrupted one-process runs
            with console.status("uninterrupted reference runs (one process)…"):
                refs = reference(sorted({steps_of[n] for n in steps_of}))
            for n, j in jobs.items():
                if j["state"] == "cancelled":
                    continue
                root = base / n
                fin = root / "final.pt"
                if j["state"] != "finished" or not fin.exists():
                    checks.append((f"{n}: finished with its final weights", False, j["state"]))
                    continue
                bitwise, worst = compare(torch.load(fin), refs[steps_of[n]])
                ws = sorted({s["world"] for s in map(json.loads, (root / "starts.jsonl").read_text().splitlines())})
                same_layout = ws == [1]
                ok = bitwise if same_layout else (bitwise or worst <= TOLERANCE)
                how = "bitwise (same layout)" if same_layout else f"within {TOLERANCE:g} relative (workers {ws})"
                checks.append(
                    (
                        f"{n}: final weights == an uninterrupted run's, {how}",
                        ok,
                        "bitwise" if bitwise else f"worst {worst:.2e}",
                    )
                )
            rep = check(events, {f"local-{i:05d}": 1 for i in range(SLOTS)})
            checks.append(("the independent checker: no violation in the event log", rep.total == 0, rep.summary()))
            summary, goodput = _summary(events, names)
        except Exception as e:  # noqa: BLE001 - a demo reports its failure and exits non-zero
            checks.append(("the demo ran", False, f"{type(e).__name__}: {e}"))
        finally:
            svc.stop()
            _kill_leftovers(base)
            if own:
                shutil.rmtree(base, ignore_errors=True)
    if summary is not None:
        console.print(summary)
        console.print(f"goodput (GPU-s held minus work lost to preemption, over GPU-s held): {100 * goodput:.1f} %")
    console.print(f"wall time {time.monotonic() - t_start:.1f} s")
    return report_checks(checks)


def _kill_leftovers(base: Path) -> None:
    """No job outlives the demo: every run record the stopped service left is an orphan, killed."""
    from goodput.sched.live.local import LocalExecutor

    if (base / "state" / "runs").is_dir():
        with contextlib.suppress(Exception):
            LocalExecutor(base / "state").adopt({})


if __name__ == "__main__":
    raise SystemExit(run_sched_live_demo(sys.argv[1] if len(sys.argv) > 1 else None))
