"""Preemption on one local Slurm cluster: goodput's against Slurm's own partition-priority preemption.

``python -m goodput.demo.slurm_bench [--reps N] [--grace S]`` (root; Slurm's packages installed).
Both sides run the same four one-node training jobs (the demo's TinyGPT, a step every ~0.1 s, a
periodic checkpoint every ``--interval`` steps) on the four nodes, then a 2-node job of higher
priority arrives. Measured per repetition: the high job's **latency** (submitted → its training
process running) and the **work the victims lose** (steps they had done past the checkpoint they
resume from).

- ``goodput``: ``goodput sched serve --executor slurm``; the victims get the checkpoint signal
  (``scancel -b --signal=USR1``) and leave with a checkpoint of their current step, grace ``--grace``.
- ``slurm``: the jobs go straight to Slurm (partition ``low``, ``GraceTime`` = ``--grace``, requeue);
  the high job to partition ``high`` (``PriorityTier`` 10). Slurm sends SIGTERM at preemption and
  SIGKILL after the grace. Twice: jobs that checkpoint on SIGTERM (the same Checkpointer), and jobs
  with no handler (Slurm's usual case: the work since the last periodic checkpoint is lost).

The figures depend on a shared, noisy machine; they are printed as JSON, one line per repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEP_S = 0.1


def job_main(argv: list[str]) -> int:
    """The training job: TinyGPT, a Checkpointer, a line per finished step in ROOT/steps.log."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="")
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--no-notice", action="store_true", help="no signal handler: a notice does nothing")
    a = ap.parse_args(argv)
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) > 0:
        return 0  # a gang's other nodes idle: the measured job is rank 0's
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import signal

    import torch

    from goodput.ckpt import Checkpointer
    from goodput.demo.example_dist_job import build
    from goodput.demo.worker import train_step
    from goodput.sched.live.client import CommitReporter

    torch.set_num_threads(1)
    root = Path(a.root or os.environ.get("GOODPUT_CKPT_ROOT") or "ckpt")
    root.mkdir(parents=True, exist_ok=True)
    if a.no_notice:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a job that never heard of the notice
    model, opt = build(0)
    ck = Checkpointer(
        root, interval=a.interval, keep=2, mode="thread", save_rng=False,
        preempt_signals=() if a.no_notice else (signal.SIGTERM, signal.SIGUSR1),
    )  # fmt: skip
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    start = ck.restore(state)
    if start is not None:
        opt.load_state_dict(state["optim"])
    start = start or 0
    rep = CommitReporter.from_env()
    if rep is not None:
        ck.add_listener(rep)
    with open(root / "starts.log", "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "restored": start}) + "\n")
    log = open(root / "steps.log", "a", encoding="utf-8")  # noqa: SIM115 - for the job's life
    for step in range(start, a.steps):
        train_step(model, opt, step, 0, 1)
        time.sleep(STEP_S)
        log.write(f"{step + 1} {time.time():.3f}\n")
        log.flush()
        ck.maybe_save(step + 1, {"model": model.state_dict(), "optim": opt.state_dict()})
    ck.wait()
    ck.close()
    return 0


def _victims(roots: dict[str, Path], t_high: float) -> dict[str, dict[str, int]]:
    """The low jobs that stopped before the high job ran (the others kept stepping), each with the
    last step it finished and the newest committed checkpoint it will resume from: the steps lost."""
    from goodput.ckpt import latest

    out = {}
    for name, root in roots.items():
        if name == "h":
            continue
        steps = [x.split() for x in (root / "steps.log").read_text().splitlines() if x.strip()]
        done = [int(s) for s, t in steps if float(t) <= t_high]
        if any(float(t) > t_high for _s, t in steps) or not done:
            continue  # still running after the high job started: not a victim
        ck = latest(root)
        resume = int(ck.name.rsplit("_", 1)[-1]) if ck is not None else 0
        out[name] = {"last_step": max(done), "resume_step": resume, "lost_steps": max(done) - resume}
    return out


def _wait(cond, timeout_s: float, what: str) -> Any:  # noqa: ANN001
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise TimeoutError(what)


def _committed(root: Path, interval: int) -> bool:
    try:
        lines = (root / "steps.log").read_text().split("\n")
        return len(lines) > interval + 5
    except OSError:
        return False


def run_slurm_native(cluster, base: Path, py: str, pp: str, interval: int, no_notice: bool) -> dict:  # noqa: ANN001
    """Slurm's own preemption: low jobs in ``low``, the high one in ``high``."""
    roots = {n: base / n for n in ("a", "b", "c", "d", "h")}
    for r in roots.values():
        r.mkdir(parents=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": pp, "SLURM_CONF": str(cluster.conf)}
    extra = ["--no-notice"] if no_notice else []

    def sbatch(name: str, part: str, nodes: int) -> int:
        cmd = [py, "-m", "goodput.demo.slurm_bench", "job", "--root", str(roots[name]), "--interval", str(interval)]
        steps = ["--steps", "60"] if name == "h" else []
        script = f"#!/bin/sh\nexec srun --ntasks-per-node=1 {shlex.join(cmd + steps + extra)}\n"
        argv = ["sbatch", "--parsable", f"--partition={part}", f"--nodes={nodes}", "--ntasks-per-node=1",
                "--gres=gpu:2", "--requeue", f"--output={roots[name]}/log", "--export=ALL"]  # fmt: skip
        import subprocess

        p = subprocess.run(argv, input=script, env=env, capture_output=True, text=True, check=True)
        return int(p.stdout.strip().split(";")[0])

    for n in "abcd":
        sbatch(n, "low", 1)
    _wait(lambda: all(_committed(roots[n], interval) for n in "abcd"), 300, "low jobs committed")
    t0 = time.time()
    hid = sbatch("h", "high", 2)
    _wait(lambda: (roots["h"] / "starts.log").exists(), 300, "high running")
    t_high = json.loads((roots["h"] / "starts.log").read_text().splitlines()[0])["t"]
    q = json.loads(cluster.run(["squeue", "--json"]))
    slurm_start = next((j.get("start_time") for j in q["jobs"] if j["job_id"] == hid), None)
    time.sleep(2.0)
    lost = _victims(roots, t_high)
    latency = t_high - t0
    cluster.run(["scancel", "--partition=low"], check=False)
    cluster.run(["scancel", "--partition=high"], check=False)
    steps = {"slurm_started": round(slurm_start - t0, 2) if slurm_start else None, "training": round(latency, 2)}
    return {"latency_s": round(latency, 2), "victims": lost, "steps_s": steps}


def run_goodput(cluster, base: Path, py: str, pp: str, interval: int, grace: float) -> dict:  # noqa: ANN001
    from goodput.demo.slurm import Runtime, SlurmService, get
    from goodput.sched.live.client import post_json

    base.mkdir(parents=True)
    os.chmod(base, 0o755)
    svc = SlurmService(base, cluster, Runtime(py, pp), allow_root_jobs=True)
    tok = svc.token("bench")
    admin = svc.token("admin", admin=True)
    svc.start()
    roots: dict[str, Path] = {}
    try:

        def submit(name: str, nodes: int, prio: int, steps: int) -> str:
            cmd = [py, "-m", "goodput.demo.slurm_bench", "job", "--interval", str(interval), "--steps", str(steps)]
            body = {"name": name, "command": cmd, "nodes": nodes, "gpus_per_node": 2, "priority": prio,
                    "grace_s": grace, "ckpt_interval_s": interval * STEP_S, "ckpt_write_s": 0.5, "restart_s": 5,
                    "env": {"PYTHONPATH": pp, "OMP_NUM_THREADS": "1"}}  # fmt: skip
            code, ans = post_json(svc.url + "/jobs", body, tok)
            if code != 201:
                raise RuntimeError(f"{code} {ans}")
            roots[name] = Path(get(f"{svc.url}/jobs/{ans['id']}", admin)["ckpt_root"])
            return ans["id"]

        for n in "abcd":
            submit(n, 1, 0, 100000)
        _wait(lambda: all(_committed(roots[n], interval) for n in "abcd"), 300, "low jobs committed")
        t0 = time.time()
        submit("h", 2, 10, 60)
        _wait(lambda: (roots["h"] / "starts.log").exists(), 300, "high running")
        t_high = json.loads((roots["h"] / "starts.log").read_text().splitlines()[0])["t"]
        time.sleep(2.0)
        lost = _victims(roots, t_high)
        latency = t_high - t0
        from goodput.demo.slurm import events_of

        ev = events_of(svc.url, admin)
        h = next(j["id"] for j in get(svc.url + "/jobs", admin)["jobs"] if j["name"] == "h")

        def at(kind: str, pick=lambda r: True) -> float | None:  # noqa: ANN001
            ts = [r["t"] for r in ev if r["event"] == kind and pick(r)]
            return round(max(ts) - t0, 2) if ts else None

        steps = {  # where the time went: seconds after the high job's submission
            "preempt_requested": at("preempt_requested"),
            "victims_exited": at("exited"),
            "started": at("started", lambda r: r["job"] == h),
            "training": round(latency, 2),
        }
        for j in get(svc.url + "/jobs", admin)["jobs"]:
            post_json(f"{svc.url}/jobs/{j['id']}/cancel", {}, admin)
        return {"latency_s": round(latency, 2), "victims": lost, "steps_s": steps}
    finally:
        svc.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["job"]:
        return job_main(argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--grace", type=int, default=10)
    ap.add_argument("--interval", type=int, default=50, help="periodic checkpoint every this many steps")
    ap.add_argument("--only", default="", help="goodput | slurm | slurm-no-notice")
    a = ap.parse_args(argv)
    import signal

    from goodput.demo.slurm import runtime_for
    from goodput.demo.slurm_cluster import SlurmCluster, missing

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its cluster
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    rt = runtime_for([])
    kinds = [a.only] if a.only else ["goodput", "slurm", "slurm-no-notice"]
    for rep in range(a.reps):
        for kind in kinds:
            base = Path(tempfile.mkdtemp(prefix="goodput-slurm-bench-"))
            os.chmod(base, 0o755)
            cluster = SlurmCluster(base / "slurm", grace_s=a.grace)
            try:
                cluster.start()
                if kind == "goodput":
                    r = run_goodput(cluster, base / "run", rt.python, rt.pythonpath, a.interval, a.grace)
                else:
                    r = run_slurm_native(cluster, base / "run", rt.python, rt.pythonpath, a.interval,
                                         kind == "slurm-no-notice")  # fmt: skip
            finally:
                cluster.stop()
                shutil.rmtree(base, ignore_errors=True)
            print(json.dumps({"kind": kind, "rep": rep, "grace_s": a.grace, **r}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
