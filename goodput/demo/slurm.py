"""``goodput demo --part slurm``: goodput's policy on a real Slurm cluster, one preemption end to end.

A local Slurm (``goodput.demo.slurm_cluster``: munged, slurmctld and four slurmd ``n1``..``n4``
with two fake GPUs each, on 127.0.0.1) runs under ``goodput sched serve --executor slurm
--partition goodput`` (a child process; SQLite store). Two tenants submit through the API:

1. four one-node jobs (the demo's TinyGPT, ``goodput.demo.example_dist_job``, two GPUs each:
   the whole cluster), two of them with a short declared restart (the cheapest to preempt);
2. once every one has committed a checkpoint, a 2-node gang at priority 10.

goodput picks the victims (the event log's ``candidates``), Slurm delivers the checkpoint signal
(``scancel -b --signal=USR1``), the victims commit and exit 75, their Slurm jobs end, and only then
does the gang start, on exactly the freed nodes. The victims resume from their commits once it has
finished. Checks: the victims are the cheapest candidates; exit 75, no failure; release before the
gang's start, on the victims' nodes; each Slurm job's processes under its tenant's uid (when run
with Unix users: the tests); every final model equal to an uninterrupted run's (bitwise for the
one-node jobs); no checker violation. :func:`preemption` is the scenario; the tests call it too,
with real Unix users and with a SIGKILL of the service and a slurmctld restart mid-preemption.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from .sched_live import ServiceProcess
from .slurm_cluster import SlurmCluster, missing

console = Console()
LOW_STEPS, HIGH_STEPS, STEP_S, INTERVAL = 120, 30, 0.1, 10
TIMEOUT_S = 400.0
# name: (tenant, nodes, steps, declared restart_s, priority)
LOW = {"a": ("alice", 1, LOW_STEPS, 2.0, 0), "b": ("alice", 1, LOW_STEPS, 40.0, 0),
       "c": ("bob", 1, LOW_STEPS, 40.0, 0), "d": ("bob", 1, LOW_STEPS, 2.0, 0)}  # fmt: skip
HIGH = ("h", ("bob", 2, HIGH_STEPS, 5.0, 10))


# ---------------------------------------------------------------------- what a job of another user can run


@dataclass(frozen=True)
class Runtime:
    """The Python (and PYTHONPATH) jobs and their batch steps run with."""

    python: str
    pythonpath: str


def runtime_for(users: list[str]) -> Runtime:
    """A Python with torch and goodput that each of ``users`` can run (this one if they can reach it,
    else the system's Python of the same version over this environment's packages), or a RuntimeError
    saying why none is."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    paths = sysconfig.get_paths()
    site = os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    options = [Runtime(sys.executable, pkg_root), Runtime(f"/usr/bin/python{minor}", f"{pkg_root}{os.pathsep}{site}")]
    why = []
    for rt in options:
        ok = True
        for u in users:
            pw = pwd.getpwnam(u)
            try:
                p = subprocess.run(
                    [rt.python, "-c", "import torch, goodput.sched.live.slurm_launch, goodput.demo.worker"],
                    env={"PATH": "/usr/bin:/bin", "PYTHONPATH": rt.pythonpath, "HOME": "/"},
                    user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], capture_output=True, text=True, timeout=120,
                    cwd="/",
                )  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as e:
                ok, msg = False, str(e)
            else:
                ok, msg = p.returncode == 0, p.stderr.strip()[-300:]
            if not ok:
                why.append(f"{rt.python} as {u}: {msg}")
                break
        if ok:
            return rt
    raise RuntimeError("no Python with torch and goodput that the job users can run: " + "; ".join(why))


# ---------------------------------------------------------------------- the service, as a child process


class SlurmService(ServiceProcess):
    """``goodput sched serve --executor slurm`` over a local cluster, as a child process (killable)."""

    def __init__(
        self,
        base: Path,
        cluster: SlurmCluster,
        runtime: Runtime,
        *,
        allow_root_jobs: bool,
        users: dict[str, str] | None = None,
    ) -> None:
        super().__init__(base)
        self.cluster = cluster
        self.runtime = runtime
        self.allow_root_jobs = allow_root_jobs
        # the operator's file: tenants and their Unix users, and limits that let a preemption happen
        # within a demo (a run is no victim for its first 600 s by default; an infrastructure loss
        # waits 60 s before its retry). No pools: they are the partition's, from sinfo.
        self.cluster_json = base / "cluster.json"
        self.cluster_json.write_text(
            json.dumps(
                {
                    "limits": {"min_run_s": 0, "infra_backoff_s": 1},
                    "tenants": [{"name": t, "user": u} for t, u in sorted((users or {}).items())],
                }
            ),
            encoding="utf-8",
        )

    def token(self, tenant: str, *, admin: bool = False) -> str:  # type: ignore[override]
        return self.new_token(tenant, admin=admin)

    def start(self) -> None:
        args = ["--cluster", str(self.cluster_json), "--executor", "slurm", "--partition", self.cluster.partition]
        args += ["--slurm-conf", str(self.cluster.conf), "--job-python", self.runtime.python]
        args += ["--state-dir", str(self.base / "state"), "--tick-s", "0.2"]
        args += ["--allow-root-jobs"] if self.allow_root_jobs else []
        env = {**os.environ, "PYTHONPATH": self.runtime.pythonpath, "SLURM_CONF": str(self.cluster.conf)}
        self.spawn(args, env=env, timeout_s=90.0)


def get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=15) as r:
        raw = r.read()
        return raw.decode() if "ndjson" in r.headers.get("content-type", "") else json.loads(raw)


def events_of(url: str, token: str) -> list[dict]:
    return [json.loads(x) for x in get(f"{url}/events?limit=100000", token).splitlines()]


def job_command(python: str, steps: int) -> list[str]:
    return [python, "-m", "goodput.demo.example_dist_job", "--steps", str(steps), "--step-s", str(STEP_S),
            "--interval", str(INTERVAL)]  # fmt: skip


def uids_of_job(job_id: str) -> dict[int, int]:
    """pid -> real uid of every process on this machine whose environment says it runs ``job_id``
    (``GOODPUT_JOB_ID``): what ``ps -o uid`` shows for the job's batch step and tasks."""
    import psutil

    out: dict[int, int] = {}
    needle = f"GOODPUT_JOB_ID={job_id}".encode()
    for p in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            out[p.pid] = p.uids().real
        except (OSError, psutil.Error):
            continue
    return out


# ---------------------------------------------------------------------- the scenario


@dataclass
class Outcome:
    """What :func:`preemption` saw, for the checks (its own and a test's)."""

    ids: dict[str, str] = field(default_factory=dict)  # name -> job id
    jobs: dict[str, dict] = field(default_factory=dict)  # name -> final GET /jobs/{id}
    events: list[dict] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    victim_nodes: list[str] = field(default_factory=list)
    uids: dict[str, set[int]] = field(default_factory=dict)  # name -> uids its processes ran as
    finals: dict[str, tuple[bool, float]] = field(default_factory=dict)  # name -> (bitwise, worst rel. diff)
    latency_s: float = 0.0  # the gang's submit -> its training process running
    started_latency_s: float = 0.0  # the gang's submit -> goodput's `started`
    slurm_runs: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # (job, epoch) -> Slurm ids
    roots: dict[str, Path] = field(default_factory=dict)  # name -> its checkpoint root
    at_kill: dict[str, str] = field(default_factory=dict)  # restart_mid: name -> state when the service was killed
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    base: Path | None = None


def preemption(
    base: Path,
    cluster: SlurmCluster,
    users: dict[str, str] | None = None,
    *,
    restart_mid: bool = False,
    say: Callable[[str], None] = lambda s: None,
) -> Outcome:
    """The scenario of the module docstring on ``cluster``; ``users`` maps tenants to Unix users
    (None: jobs run as this process's user, allowed explicitly). ``restart_mid``: SIGKILL the service
    while the victims are preempting, restart slurmctld while it is down, then start the service again."""
    from goodput.demo.example_dist_job import compare, reference
    from goodput.sched.live.client import post_json
    from goodput.sched.sim.checker import check

    out = Outcome(base=base)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    rt = runtime_for(sorted(set(users.values()))) if users else Runtime(sys.executable, _pkg_pythonpath())
    svc = SlurmService(base, cluster, rt, allow_root_jobs=users is None, users=users)
    tenants = sorted({t for t, *_ in list(LOW.values()) + [HIGH[1]]})
    admin = svc.token("admin", admin=True)
    tok = {t: svc.token(t) for t in tenants}
    spec = dict(LOW)
    spec[HIGH[0]] = HIGH[1]
    svc.start()
    try:
        say(f"service {svc.url} (pid {svc.proc.pid}) over Slurm partition {cluster.partition!r}: {cluster.node_names}")

        def submit(name: str) -> None:
            tenant, nodes, steps, restart_s, prio = spec[name]
            body = {  # the checkpoint root: the service's default, under the tenant's prefix
                "name": name, "command": job_command(rt.python, steps), "nodes": nodes, "gpus_per_node": 2,
                "priority": prio, "limit_s": 600, "grace_s": 20, "ckpt_interval_s": 1,
                "ckpt_write_s": 0.5, "restart_s": restart_s,
                "env": {"PYTHONPATH": rt.pythonpath, "OMP_NUM_THREADS": "1"},
            }  # fmt: skip
            code, ans = post_json(svc.url + "/jobs", body, tok[tenant])
            if code != 201:
                raise RuntimeError(f"submit {name}: HTTP {code} {ans}")
            out.ids[name] = ans["id"]
            out.roots[name] = Path(get(f"{svc.url}/jobs/{ans['id']}", admin)["ckpt_root"])

        def views() -> dict[str, dict]:
            js = get(svc.url + "/jobs?limit=1000", admin)["jobs"]
            by = {j["id"]: j for j in js}
            return {n: by[i] for n, i in out.ids.items() if i in by}

        def wait(cond: Callable[[dict[str, dict]], bool], what: str, timeout_s: float = TIMEOUT_S) -> dict:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                try:
                    v = views()
                except OSError:
                    v = {}
                if v and cond(v):
                    return v
                time.sleep(0.2)
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s\n{svc.log_tail()}")

        def sample_uids(names: list[str]) -> None:
            for n in names:
                out.uids.setdefault(n, set()).update(uids_of_job(out.ids[n]).values())

        for name in LOW:
            submit(name)
        say("submitted a, b (alice) and c, d (bob): one node each; a and d declare a short restart")

        def committed(n: str, v: dict) -> bool:
            return v[n]["state"] == "running" and bool(
                get(f"{svc.url}/jobs/{out.ids[n]}", admin)["checkpoint"]["last_report"]
            )

        wait(lambda v: all(committed(n, v) for n in LOW), "the four jobs running with a commit each")
        sample_uids(list(LOW))
        before = views()
        say("running, each committed once: " + ", ".join(f"{n}@{','.join(before[n]['placement'])}" for n in LOW))
        t_submit = time.time()
        submit(HIGH[0])
        say("h (bob, priority 10, 2 nodes) submitted")
        v = wait(lambda v: any(v[n]["state"] == "preempting" or v[n]["preemptions"] for n in LOW), "victims")
        say(f"victims asked to checkpoint: {sorted(n for n in LOW if v[n]['state'] == 'preempting')}")
        if restart_mid:
            svc.kill9()
            out.at_kill = {n: j["state"] for n, j in v.items()}
            say("service SIGKILLed mid-preemption; slurmctld restarted while it is down")
            cluster.restart_ctld()
            svc.start()
            say("service restarted: restored from SQLite, Slurm jobs re-adopted")
        v = wait(lambda v: v["h"]["state"] in ("running", "finished"), "the gang started")
        hv = get(f"{svc.url}/jobs/{out.ids['h']}", admin)
        started = [r for r in hv["history"] if r["event"] == "started"]
        out.started_latency_s = started[0]["t"] - t_submit if started else -1
        starts_h = out.roots["h"] / "starts.jsonl"
        wait(lambda v: starts_h.exists() or v["h"]["state"] == "finished", "h running")
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            first = json.loads(starts_h.read_text().splitlines()[0])
            out.latency_s = float(first["t"]) - t_submit
        sample_uids(["h"])
        say(f"h started on {','.join(v['h']['placement'])} {out.started_latency_s:.1f} s after its submission "
            f"(training {out.latency_s:.1f} s)")  # fmt: skip
        wait(lambda v: all(j["state"] in ("finished", "failed", "cancelled") for j in v.values()), "all finished")
        out.jobs = {n: get(f"{svc.url}/jobs/{i}", admin) for n, i in out.ids.items()}
        out.events = events_of(svc.url, admin)
        pre = [r for r in out.events if r["event"] == "preempt_requested" and r.get("victim_of") == out.ids["h"]]
        out.victims = sorted(n for n, i in out.ids.items() if i in {r["job"] for r in pre})
        out.victim_nodes = sorted(x for n in out.victims for x in before[n]["placement"])
    finally:
        svc.stop()
    # -- the Slurm side: one Slurm job per run, never two (squeue keeps ended jobs for MinJobAge)
    with contextlib.suppress(Exception):
        q = json.loads(cluster.run(["squeue", "--json"]))
        for j in q.get("jobs", []):
            parts = str(j.get("comment", "")).split(":")
            if len(parts) == 4 and parts[0] == "goodput":
                out.slurm_runs.setdefault((parts[2], int(parts[3])), []).append(int(j["job_id"]))
    # -- final models against uninterrupted runs
    refs = reference(sorted({s[2] for s in spec.values()}))
    import torch

    for name, (_t, _n, steps, _r, _p) in spec.items():
        f = out.roots[name] / "final.pt"
        if f.exists():
            out.finals[name] = compare(torch.load(f, weights_only=True), refs[steps])
    _checks(out, check, cluster, users)
    return out


def _pkg_pythonpath() -> str:
    return str(Path(__file__).resolve().parents[2])


def _checks(out: Outcome, check: Any, cluster: SlurmCluster, users: dict[str, str] | None) -> None:
    c = out.checks
    ev, ids = out.events, out.ids
    name_of = {i: n for n, i in ids.items()}
    pre = [r for r in ev if r["event"] == "preempt_requested" and r.get("victim_of") == ids.get("h")]
    cands = {name_of.get(x["job"], x["job"]): x["lost_gpu_s"] for x in (pre[0].get("candidates", []) if pre else [])}
    chosen = sorted(name_of.get(r["job"], "?") for r in pre)
    cheapest = sorted(sorted(cands, key=lambda n: (cands[n], n))[:2])
    c.append(("victims are the two cheapest candidates of the event log", chosen == cheapest == out.victims,
              f"chosen {chosen}, candidates {cands}"))  # fmt: skip
    exits = {(name_of.get(r["job"]), r["status"]) for r in ev if r["event"] == "exited"}
    c.append(("victims checkpointed and exited 75 (exited preempted)", all((v, "preempted") in exits for v in chosen),
              str(sorted(e for e in exits if e[0] in chosen))))  # fmt: skip
    fails = {n: j["failures"] for n, j in out.jobs.items()}
    c.append(("every job finished, no failure", all(j["state"] == "finished" for j in out.jobs.values())
              and not any(fails.values()), f"states {[(n, j['state']) for n, j in out.jobs.items()]}, failures {fails}"))  # fmt: skip
    seq = {r.get("seq", i): r for i, r in enumerate(ev)}
    order = list(seq.values())
    h_start = next((i for i, r in enumerate(order) if r["event"] == "started" and r["job"] == ids.get("h")), None)
    rel = [i for i, r in enumerate(order) if r["event"] == "released" and name_of.get(r["job"]) in chosen]
    h_nodes = sorted(order[h_start]["nodes"]) if h_start is not None else []
    c.append(("the gang started after both victims' release, on exactly their nodes",
              h_start is not None and len(rel) >= 2 and max(rel[:2]) < h_start and h_nodes == out.victim_nodes,
              f"gang on {h_nodes}, victims had {out.victim_nodes}"))  # fmt: skip
    resumed = {}
    for v in chosen:
        st = [r for r in ev if r["event"] == "started" and r["job"] == ids[v]]
        resumed[v] = [r["resume_from_s"] for r in st]
    c.append(("victims resumed from their commits (resume_from_s > 0)",
              all(len(r) >= 2 and r[-1] > 0 for r in resumed.values()), str(resumed)))  # fmt: skip
    one = {n: ok for n, (ok, _w) in out.finals.items() if n != "h"}
    c.append(("final weights of the one-node jobs equal an uninterrupted run's, bitwise",
              len(one) == len(LOW) and all(one.values()), str(out.finals)))  # fmt: skip
    hw = out.finals.get("h", (False, 1.0))
    c.append(("the 2-node gang's final weights match an uninterrupted one-process run (<= 1e-6 relative)",
              hw[0] or hw[1] <= 1e-6, f"bitwise {hw[0]}, worst {hw[1]:.2e}"))  # fmt: skip
    twice = {k: v for k, v in out.slurm_runs.items() if len(v) > 1}
    runs = {(ids[n], e) for n, j in out.jobs.items() for e in range(1, j["epoch"] + 1)}
    c.append(("one Slurm job per run, none twice", not twice and runs <= set(out.slurm_runs),
              f"{len(out.slurm_runs)} Slurm jobs for {len(runs)} runs; twice: {twice}"))  # fmt: skip
    rep = check(ev, {n: cluster.gpus for n in cluster.node_names})
    c.append(("the independent checker finds no violation in the whole event log", rep.total == 0, rep.summary()))
    subs = [r["job"] for r in ev if r["event"] == "submitted"]
    c.append(("every job submitted once", len(subs) == len(set(subs)) == len(ids), f"{len(subs)} submissions"))
    if users:
        want = {n: {pwd.getpwnam(users[LOW.get(n, HIGH[1])[0]]).pw_uid} for n in ids}
        got = {n: out.uids.get(n, set()) for n in ids}
        c.append(
            ("each job's processes ran under its tenant's uid (ps)", all(got[n] == want[n] for n in ids), str(got))
        )


# ---------------------------------------------------------------------- goodput demo --part slurm


def run_slurm_demo(workdir: str | None = None) -> int:
    reason = missing()
    if reason:
        console.print(f"[yellow]goodput demo --part slurm needs a local Slurm:[/yellow] {reason}")
        return 2
    own = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-slurm-"))
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    console.rule("[bold]goodput demo --part slurm: goodput decides, a real Slurm launches")
    t0 = time.monotonic()
    cluster = SlurmCluster(base / "slurm")
    try:
        cluster.start()
        console.print(f"Slurm 22.05 on 127.0.0.1: slurmctld + {cluster.nodes} slurmd ({cluster.gpus} fake GPUs each)")
        out = preemption(
            base / "run", cluster, None, say=lambda s: console.print(f"  {time.monotonic() - t0:6.1f}s  {s}")
        )
    except Exception as e:  # noqa: BLE001 - the demo says what failed and exits non-zero
        console.print(f"[red]demo failed:[/red] {e}")
        return 1
    finally:
        cluster.stop()
    ok = True
    for what, passed, detail in out.checks:
        ok &= passed
        console.print(f"{'[green]ok[/green]  ' if passed else '[red]FAIL[/red]'} {what}  [dim]{detail[:160]}[/dim]")
    console.print(
        f"gang: submitted -> started by goodput {out.started_latency_s:.1f} s, -> training {out.latency_s:.1f} s; "
        f"{time.monotonic() - t0:.0f} s in all"
    )
    if own and ok:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    elif not ok:
        console.print(f"kept for inspection: {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_slurm_demo(sys.argv[1] if len(sys.argv) > 1 else None))
