"""The Slurm executor end to end on a real Slurm (four slurmd on 127.0.0.1) with real CPU training
jobs (the demo's TinyGPT) submitted through goodput's API by two tenants mapped to two Unix users.

Skipped, with the reason, where Slurm's binaries are absent or the tests are not root.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from goodput.sched.live.slurm import exit_code, status_of

from .slurm_cluster import slurm, tenant_users  # noqa: F401 - fixtures

# ---------------------------------------------------------------------- units without Slurm


def test_exit_codes_read_both_json_shapes():
    assert exit_code(75 << 8) == (75, None)
    assert exit_code(9) == (0, 9)
    assert exit_code({"return_code": {"set": True, "number": 75}, "signal": {"id": 0}}) == (75, None)
    assert exit_code({"return_code": 3}) == (3, None)
    assert exit_code(None) == (None, None)


def test_a_runs_last_exit_reads_as_over_local_slots():
    """rc, or minus the signal that ended the run (Python's returncode), the signal's name (or SIG<n>
    for a number Python does not name), Slurm's state and id, whichever JSON shape Slurm wrote."""
    from goodput.sched.live.slurm import SlurmRun, _exit_detail

    run = SlurmRun("j.00000001", 1, 42, ["n1"], "u", "/nonexistent")
    assert _exit_detail(run, "FAILED", 3 << 8) == {"rc": 3, "slurm_state": "FAILED", "slurm_id": 42}
    assert _exit_detail(run, "CANCELLED", 9) == {
        "rc": -9,
        "signal": "SIGKILL",
        "slurm_state": "CANCELLED",
        "slurm_id": 42,
    }
    got = _exit_detail(run, "FAILED", {"return_code": {"set": True, "number": 0}, "signal": {"id": 40}})
    assert got == {"rc": -40, "signal": "SIG40", "slurm_state": "FAILED", "slurm_id": 42}
    assert _exit_detail(run, "NODE_FAIL", None) == {"rc": None, "slurm_state": "NODE_FAIL", "slurm_id": 42}


def test_slurm_states_map_to_report_exit_words():
    assert status_of("COMPLETED", 0, killed=False) == "finished"
    assert status_of("FAILED", 75 << 8, killed=False) == "preempted"
    assert status_of("FAILED", 1 << 8, killed=False) == "failed"
    assert status_of("CANCELLED", 15, killed=True) == "killed"
    assert status_of("CANCELLED", 15, killed=False) == "lost"  # not ours: an operator's or Slurm's
    assert status_of("NODE_FAIL", 0, killed=False) == "lost"
    assert status_of("NODE_FAIL", 0, killed=True) == "lost"
    assert status_of("PREEMPTED", 0, killed=False) == "lost"  # Slurm's own preemption: not the job's fault
    assert status_of("FAILED", 75 << 8, killed=True) == "preempted"  # it left with its checkpoint before our kill


def test_a_node_whose_launcher_died_of_the_signal_while_its_workers_left_with_75_was_preempted():
    from goodput.sched.live.slurm_launch import task_status

    assert task_status(-10, [75, 75]) == 75  # torchrun killed by SIGUSR1, both workers checkpointed
    assert task_status(138, [75]) == 75
    assert task_status(-10, [75, 1]) == 1  # a worker failed: not a preemption, and its status is the node's
    assert task_status(-10, []) == 138  # nothing orphaned: the launcher's own death
    assert task_status(1, [75]) == 75 and task_status(0, []) == 0 and task_status(75, []) == 75
    assert task_status(3, []) == 3


def test_a_job_dead_of_the_notice_we_sent_obeyed_it_and_one_dead_of_another_signal_failed():
    """scancel --signal=TERM is our stop: a gang dead of it (the batch step's 143, or Slurm's signal
    15) obeyed, as a kill at the deadline would have (``killed``, requeued at once, no leave crash). A
    signal we did not send, or any other exit, stays ``failed``."""
    from goodput.sched.live.slurm import obeyed

    term = {"return_code": 143, "signal": {"signal_id": 0, "name": ""}}
    assert status_of("FAILED", 143 << 8, killed=False, signalled=["TERM"]) == "killed"
    assert status_of("FAILED", term, killed=False, signalled=["TERM"]) == "killed"
    assert status_of("FAILED", 15, killed=False, signalled=["TERM"]) == "killed"  # the step died of it
    assert status_of("FAILED", 138 << 8, killed=False, signalled=["USR1"]) == "killed"
    assert status_of("FAILED", 143 << 8, killed=False) == "failed"  # nothing sent: its own SIGTERM
    assert status_of("FAILED", 143 << 8, killed=False, signalled=["USR1"]) == "failed"  # not what we sent
    assert status_of("FAILED", 1 << 8, killed=False, signalled=["TERM"]) == "failed"  # a crash while leaving
    assert status_of("FAILED", 137 << 8, killed=False, signalled=["TERM", "USR1"]) == "failed"
    assert status_of("FAILED", 75 << 8, killed=False, signalled=["USR1"]) == "preempted"
    assert status_of("NODE_FAIL", 143 << 8, killed=False, signalled=["TERM"]) == "lost"
    assert obeyed(143, None, ["SIGTERM"]) and not obeyed(143, None, ["BOGUS", 7]) and not obeyed(None, None, ["TERM"])


def test_a_run_slurm_forgot_and_that_died_of_our_notice_reads_killed_from_its_status_file(tmp_path):
    from goodput.sched.live.slurm import SlurmExecutor, SlurmRun
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = SlurmExecutor(tmp_path / "state", store=store, partition="p")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "status.json").write_text('{"rc": 143}')
    run = SlurmRun("j.00000001", 1, 5, ["n1"], "u", str(tmp_path / "r"))
    assert ex._status_file(run) == ("failed", 143)
    run.signalled = ["TERM"]
    assert ex._status_file(run) == ("killed", 143)


def test_the_notice_sent_is_stored_before_it_is_sent(tmp_path):
    """A restarted service reads what was sent from the store: a run dead of it still obeyed."""
    from goodput.sched.live.slurm import RunTable, SlurmError, SlurmExecutor, SlurmRun
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = SlurmExecutor(tmp_path / "state", store=store, partition="p")
    stored: list[list[str]] = []

    class Refusing:
        def run(self, argv):  # noqa: ANN001, ANN202
            stored.append(list(RunTable(store).load()[0].signalled))
            raise SlurmError("slurmctld away")

    ex.slurm = Refusing()
    run = SlurmRun("j.00000001", 1, 5, ["n1"], "u", str(tmp_path), released=True)
    ex.table.save(run)
    assert ex._signal(run, "TERM") is False
    assert stored == [["TERM"]]  # in the store when scancel was asked
    assert ex._signal(run, "TERM") is False and run.signalled == ["TERM"]  # once
    assert RunTable(store).load()[0].signalled == ["TERM"]


def test_sacct_records_of_both_versions():
    from goodput.sched.live.slurm import parse_sacct

    d = {
        "jobs": [
            {"job_id": 7, "state": {"current": "FAILED", "reason": "None"}, "exit_code": {"status": "FAILED",
             "return_code": 75, "signal": {"signal_id": 0, "name": ""}}},  # 22.05
            {"job_id": 8, "state": {"current": ["COMPLETED"]}, "exit_code": {"status": ["SUCCESS"],
             "return_code": {"set": True, "infinite": False, "number": 0}}},  # 23.02+
            {"job_id": "9", "state": "RUNNING"},  # not an id: ignored
        ]
    }  # fmt: skip
    got = parse_sacct(d)
    assert sorted(got) == [7, 8]
    assert status_of(*got[7], killed=False) == "preempted"
    assert status_of(*got[8], killed=False) == "finished"


def test_a_run_slurm_forgot_is_read_from_its_status_file_never_trusting_it(tmp_path):
    """Past MinJobAge, without accounting, the batch step's status file decides; it sits in the job
    user's folder, so a link, a FIFO (which would block the watcher) or a non-integer rc reads lost."""
    from goodput.sched.live.slurm import SlurmExecutor, SlurmRun
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = SlurmExecutor(tmp_path / "state", store=store, partition="p")
    secret = tmp_path / "secret.json"
    secret.write_text('{"rc": 0}')

    def read(setup, rc: bool = False):  # noqa: ANN001, ANN202
        d = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        setup(d / "status.json")
        got = ex._status_file(SlurmRun("j.00000001", 1, 5, ["n1"], "u", str(d)))
        return got if rc else got[0]

    assert read(lambda p: p.write_text('{"rc": 0}')) == "finished"
    assert read(lambda p: p.write_text('{"rc": 75}')) == "preempted"
    assert read(lambda p: p.write_text('{"rc": 3}'), rc=True) == ("failed", 3)  # the rc its last_exit shows
    assert read(lambda p: p.write_text('{"rc": "75"}'), rc=True) == ("lost", None)
    assert read(lambda p: p.write_text('{"rc": 0' + " " * 5000 + "}")) == "lost"
    assert read(lambda p: p.symlink_to(secret)) == "lost"
    assert read(lambda p: os.mkfifo(p)) == "lost"  # returns at once: opened O_NONBLOCK, refused as no file
    assert read(lambda p: None) == "lost"
    store.close()


# ---------------------------------------------------------------------- on a real Slurm


def _assert_checks(out) -> None:  # noqa: ANN001
    failed = [f"{what}: {detail}" for what, ok, detail in out.checks if not ok]
    assert not failed, "\n".join(failed)


@pytest.mark.slow  # 88-179 s here (2 cores shared, load average 10-18): above the default run's ~90 s
def test_a_gang_preempts_the_cheapest_victims_through_slurm(slurm, tenant_users, tmp_path_factory):  # noqa: F811
    """The issue's first scenario: 4 one-node jobs of two tenants fill 4 Slurm nodes; a 2-node gang
    at priority 10 arrives; the event log's two cheapest candidates are asked to checkpoint (Slurm
    delivers USR1 to their batch steps), leave with 75, their Slurm jobs end, and only then does the
    gang start, on exactly their nodes; the victims resume from their commits; every final model
    equals an uninterrupted run's; each job's processes ran under its tenant's uid."""
    from goodput.demo.slurm import preemption

    base = Path(slurm.root) / "goodput"
    out = preemption(base, slurm, tenant_users)
    _assert_checks(out)
    # the same facts, read here from the raw record rather than the scenario's own checks
    ev = out.events
    h = out.ids["h"]
    started_h = next(r for r in ev if r["event"] == "started" and r["job"] == h)
    assert sorted(started_h["nodes"]) == out.victim_nodes
    for v in out.victims:
        vid = out.ids[v]
        assert any(r["event"] == "exited" and r["job"] == vid and r["status"] == "preempted" for r in ev)
        assert out.jobs[v]["preemptions"] == 1 and out.jobs[v]["failures"] == 0
        assert out.finals[v][0], f"{v}: final weights differ from an uninterrupted run's"
    uid = {t: __import__("pwd").getpwnam(u).pw_uid for t, u in tenant_users.items()}
    assert out.uids["a"] == {uid["alice"]} and out.uids["c"] == {uid["bob"]} and out.uids["h"] == {uid["bob"]}
    # the operator's checker over the log, with the partition's nodes as Slurm names them
    log = base / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in ev))
    argv = [sys.executable, "-m", "goodput.cli.main", "sched", "check", str(log), "--partition", slurm.partition]
    argv += ["--slurm-conf", str(slurm.conf), "--cluster", str(base / "cluster.json"), "--json"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["total"] == 0, p.stdout + p.stderr


@pytest.mark.slow
def test_service_sigkill_and_slurmctld_restart_mid_preemption_lose_nothing(slurm, tenant_users):  # noqa: F811
    """goodput SIGKILLed while its victims are preempting, slurmctld restarted while goodput is down,
    goodput restarted: it re-adopts the Slurm jobs from its store, nothing is lost or started twice
    (one Slurm job per run), and the checker finds no violation in the whole event log."""
    from goodput.demo.slurm import preemption

    out = preemption(Path(slurm.root) / "goodput", slurm, tenant_users, restart_mid=True)
    _assert_checks(out)
    assert "preempting" in out.at_kill.values(), f"the kill came outside the preemption: {out.at_kill}"


def _node_of_slurm_job(cluster, slurm_id: int) -> str:  # noqa: ANN001
    q = json.loads(cluster.run(["squeue", "--json"]))
    return next(str(j["nodes"]) for j in q["jobs"] if j["job_id"] == slurm_id)


def _kill_node_processes(slurm_id: int) -> int:
    """A node's death for one job: its slurmstepd and every process of the job, SIGKILLed."""
    victims = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if cmd.startswith(f"slurmstepd: [{slurm_id}."):
                victims.append(p)
                continue
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if f"SLURM_JOB_ID={slurm_id}".encode() in f.read().split(b"\0"):
                    victims.append(p)
        except (OSError, psutil.Error):
            continue
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return len(victims)


@pytest.mark.slow
def test_a_slurmd_killed_under_a_job_is_an_infrastructure_loss(slurm, tenant_users):  # noqa: F811
    """slurmd SIGKILLed (and the job's processes with it: a node that died) under a running job:
    Slurm marks the node DOWN, goodput takes it as a node loss, the job resumes elsewhere from its
    last commit; infra_losses 1, failures 0, final weights equal to an uninterrupted run's."""
    import torch

    from goodput.demo.example_dist_job import compare, reference
    from goodput.demo.slurm import SlurmService, events_of, get, job_command, runtime_for
    from goodput.sched.live.client import post_json
    from goodput.sched.sim.checker import check

    base = Path(slurm.root) / "goodput"
    base.mkdir()
    os.chmod(base, 0o755)
    rt = runtime_for([tenant_users["alice"]])
    svc = SlurmService(base, slurm, rt, allow_root_jobs=False, users={"alice": tenant_users["alice"]})
    admin = svc.token("admin", admin=True)
    tok = svc.token("alice")
    svc.start()
    try:
        steps = 150
        body = {
            "name": "x", "command": job_command(rt.python, steps), "nodes": 1, "gpus_per_node": 2,
            "limit_s": 600, "grace_s": 20, "ckpt_interval_s": 1, "restart_s": 2,
            "env": {"PYTHONPATH": rt.pythonpath, "OMP_NUM_THREADS": "1"},
        }  # fmt: skip
        code, ans = post_json(svc.url + "/jobs", body, tok)
        assert code == 201, ans
        jid = ans["id"]
        root = Path(get(f"{svc.url}/jobs/{jid}", admin)["ckpt_root"])
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            j = get(f"{svc.url}/jobs/{jid}", admin)
            if j["state"] == "running" and (j["checkpoint"]["last_report"] or {}).get("step", 0) >= 20:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"job never committed step 20: {j}\n{svc.log_tail()}")
        node = j["placement"][0]
        q = json.loads(slurm.run(["squeue", "--json"]))
        sid = next(x["job_id"] for x in q["jobs"] if x["comment"].endswith(f":{jid}:1"))
        slurm.kill(f"slurmd-{node}")  # SIGKILL, its PID as recorded
        assert _kill_node_processes(sid) > 0
        while time.monotonic() < deadline:
            j = get(f"{svc.url}/jobs/{jid}", admin)
            if j["state"] in ("finished", "failed", "cancelled"):
                break
            time.sleep(0.5)
        assert j["state"] == "finished", (j, svc.log_tail())
        assert j["infra_losses"] == 1 and j["failures"] == 0 and j["preemptions"] == 0, j
        starts = [json.loads(x) for x in (root / "starts.jsonl").read_text().splitlines()]
        assert len(starts) == 2 and starts[1]["restored_step"] >= 20, starts
        ev = events_of(svc.url, admin)
        assert any(r["event"] == "node_lost" and r["node"] == node for r in ev)
        second = [r for r in ev if r["event"] == "started" and r["job"] == jid][1]
        assert node not in second["nodes"]
        assert check(ev, {n: slurm.gpus for n in slurm.node_names}).total == 0
        ok, worst = compare(torch.load(root / "final.pt", weights_only=True), reference(steps))
        assert ok, worst
    finally:
        svc.stop()


def test_a_restart_cancels_unrecorded_and_uncounted_runs_and_releases_a_counted_held_one(slurm, tmp_path):  # noqa: F811
    """The executor's own crash safety, without the service: what a service killed between sbatch,
    the store's record, the core's commit and the release leaves behind is settled by the next one."""
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    state = Path(slurm.root) / "goodput-state"
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(slurm.conf))
    pools, nodes, seen = discover(sl, slurm.partition)
    assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"] and all(n.gpus == 2 for n in nodes)
    assert pools[0].name == "goodput" and pools[0].nodes == 4

    def executor() -> SlurmExecutor:
        ex = SlurmExecutor(state, store=store, partition=slurm.partition, slurm=sl, poll_s=0.2)
        ex.nodes.update(seen)
        return ex

    def job(name: str, epoch: int, st: JobState) -> Job:
        j = Job(id=name, tenant="t", priority=0, nodes=1, gpus_per_node=1, submit_s=0.0, command=("sleep", "60"))
        j.epoch, j.state = epoch, st
        return j

    first = executor()
    counted, uncounted = job("counted.00000001", 1, JobState.RUNNING), job("gone.00000002", 1, JobState.RUNNING)
    first.start(counted, ("n1",), 0.0)  # held, recorded, never released: the service died before after_pass
    first.start(uncounted, ("n2",), 0.0)  # held, recorded, but its start never reached the store
    # submitted with this service's comment, then killed before the record: no row names it
    stray = int(
        sl.run(
            ["sbatch", "--parsable", "--hold", f"--partition={slurm.partition}", "--nodelist=n3", "-N1",
             f"--comment=goodput:{first.instance}:stray.00000003:1", "--wrap", "sleep 60", "-o", "/dev/null"]
        ).split(";")[0]
    )  # fmt: skip
    ids = {r.job: r.slurm_id for r in first.runs.values()}

    def states() -> dict[int, str]:
        q = json.loads(sl.run(["squeue", "--json"]))
        return {j["job_id"]: j["job_state"] for j in q["jobs"]}

    assert {states()[i] for i in [*ids.values(), stray]} == {"PENDING"}

    second = executor()  # the restarted service: the store counts only `counted` as running, epoch 1
    counted.state = JobState.RUNNING
    adopted = second.adopt({"counted.00000001": counted, "gone.00000002": job("gone.00000002", 1, JobState.PENDING)})
    assert adopted == {"counted.00000001": "released", "gone.00000002": "cancelled"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        second.poll()
        s = states()
        if (
            s[ids["counted.00000001"]] == "RUNNING"
            and s[ids["gone.00000002"]] == "CANCELLED"
            and s[stray] == "CANCELLED"
        ):
            break
        time.sleep(0.5)
    assert s[ids["counted.00000001"]] == "RUNNING", s
    assert s[ids["gone.00000002"]] == "CANCELLED" and s[stray] == "CANCELLED", s
    # the counted run is stopped by its kill, and its exit reads "killed" (ours), reported once
    exits: list[tuple[str, int, str]] = []
    second.on_exit = lambda j, e, st: exits.append((j, e, st))
    second.kill(counted)
    while time.monotonic() < deadline and not exits:
        second.poll()
        time.sleep(0.3)
    assert exits == [("counted.00000001", 1, "killed")]
    assert second.table.load() == []  # every row settled
    # a store write failed after a pass started a run: the service rebuilds from the store, which does
    # not count it, and reconciles: the run is cancelled and forgotten, never released, its exit never
    # reported (the same epoch may start again and its exit is the one that counts)
    late = job("late.00000004", 1, JobState.RUNNING)
    second.start(late, ("n4",), 0.0)
    sid = second.runs[late.id].slurm_id
    assert second.reconcile({late.id: job("late.00000004", 0, JobState.PENDING)}) == {late.id: "cancelled"}
    second.after_pass()  # nothing left to release
    while time.monotonic() < deadline and states().get(sid) != "CANCELLED":
        time.sleep(0.3)
    for _ in range(3):
        second.poll()
    assert states()[sid] == "CANCELLED" and late.id not in second.runs
    assert exits == [("counted.00000001", 1, "killed")] and second.table.load() == []
    store.close()


def test_a_tenant_env_reaches_the_job_never_root_sbatch(slurm, tmp_path):  # noqa: F811
    """A spec's env naming sbatch's own inputs (SBATCH_PARTITION, SBATCH_TIMELIMIT, LD_PRELOAD) is the
    job's environment only: root's sbatch neither reads it (the job lands in goodput's partition with
    no time limit) nor loads a library it names; the job sees every variable."""
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(slurm.conf))
    _pools, _nodes, seen = discover(sl, slurm.partition)
    # (not SLURM_CONF: the job's own srun reads it too, and a job that breaks its own srun only fails)
    bad = {"SBATCH_PARTITION": "low", "SBATCH_TIMELIMIT": "1", "LD_PRELOAD": "/nonexistent.so",
           "ODD": "it's \"quoted\" $HOME `x`"}  # fmt: skip
    out = Path(slurm.root) / "envout"
    out.mkdir()
    os.chmod(out, 0o777)
    ex = SlurmExecutor(Path(slurm.root) / "gp", store=store, partition=slurm.partition, slurm=sl,
                       env_for=lambda j: dict(bad))  # fmt: skip
    ex.nodes.update(seen)
    exits: list[str] = []
    ex.on_exit = lambda j, e, st: exits.append(st)
    cmd = ("/usr/bin/env", "-0")
    job = Job(id="envjob.00000001", tenant="t", priority=0, nodes=1, gpus_per_node=1, submit_s=0.0, command=cmd)
    job.epoch, job.state = 1, JobState.RUNNING
    ex.start(job, ("n2",), 0.0)
    run = ex.runs[job.id]
    assert run.slurm_id > 0, ex.failures
    q = json.loads(sl.run(["squeue", "--json"]))
    mine = next(j for j in q["jobs"] if j["job_id"] == run.slurm_id)
    assert mine["partition"] == slurm.partition and mine["time_limit"] != 1, mine
    ex.after_pass()
    deadline = time.monotonic() + 60
    while not exits and time.monotonic() < deadline:
        ex.poll()
        time.sleep(0.3)
    assert exits == ["finished"]
    last = ex.last_exit[job.id]  # what GET /jobs/{id} shows of the run: Slurm's word, or its status file's
    assert {k: last[k] for k in ("epoch", "status", "rc", "slurm_id")} == {
        "epoch": 1, "status": "finished", "rc": 0, "slurm_id": run.slurm_id,
    }, last  # fmt: skip
    assert last.get("slurm_state", "COMPLETED") == "COMPLETED" and "signal" not in last, last
    # NUL-separated (env -0); the loader's complaint about LD_PRELOAD may precede a variable on its line
    pieces = [x.rsplit("\n", 1)[-1] for x in (Path(run.dir) / "log").read_text().split("\0")]
    seen_env = dict(x.split("=", 1) for x in pieces if "=" in x)
    for k, v in bad.items():
        assert seen_env.get(k) == v, (k, seen_env.get(k))
    assert seen_env["GOODPUT_JOB_ID"] == job.id and seen_env["SLURM_JOB_ID"] == str(run.slurm_id)
    # no accounting on this cluster: sacct refuses, which reads as "nothing known" (the status file decides)
    assert ex._sacct([run.slurm_id]) == {}
    store.close()


def _job_processes(job_id: str) -> list[dict]:
    """Every process on this machine whose environment names ``job_id`` (``GOODPUT_JOB_ID``): its
    command line and the variables a gang's rendezvous is made of."""
    keys = ("SLURMD_NODENAME", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR",
            "PET_MASTER_PORT", "PET_NODE_RANK", "PET_NNODES", "GOODPUT_NODE_ADDRS", "SLURM_JOB_ID")  # fmt: skip
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if env.get(b"GOODPUT_JOB_ID") != job_id.encode():
            continue
        row = {k: env.get(k.encode(), b"").decode() for k in keys}
        row["cmd"] = " ".join(p.info["cmdline"] or [])
        out.append(row)
    return out


@pytest.mark.slow  # two runs of a 2-node torchrun gang: 4 training processes start twice (~60-120 s here)
def test_a_gang_is_one_slurm_job_with_one_torchrun_per_node_and_leaves_with_75(slurm, tmp_path):  # noqa: F811
    """A 2-node gang is ONE Slurm job over its nodes; srun starts one torchrun per node, which
    rendezvous at the allocation's first node (MASTER_ADDR/MASTER_PORT picked by the batch step
    there) into one gloo world of 2 ranks on 2 Slurm nodes. Asked to checkpoint, Slurm signals every
    process of the step: torchrun dies of SIGUSR1 (it has no handler) while its workers commit and
    leave with 75, so the run reads ``preempted`` (not the launcher's 138). The next run, on two other
    nodes, resumes from that commit and ends with an uninterrupted run's weights."""
    import torch

    from goodput.ckpt import latest
    from goodput.demo.example_dist_job import compare, reference
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(slurm.conf))
    _pools, _nodes, seen = discover(sl, slurm.partition)
    root = Path(slurm.root) / "gang-ckpt"
    steps = 60
    cmd = (sys.executable, "-m", "torch.distributed.run", "--monitor-interval", "0.1", "-m",
           "goodput.demo.example_dist_job", "--steps", str(steps), "--step-s", "0.1", "--interval", "5")  # fmt: skip
    pkg = str(Path(__file__).resolve().parents[3])
    env = {"PYTHONPATH": pkg, "OMP_NUM_THREADS": "1"}
    ex = SlurmExecutor(Path(slurm.root) / "gp", store=store, partition=slurm.partition, slurm=sl,
                       env_for=lambda j: dict(env))  # fmt: skip
    ex.nodes.update(seen)
    exits: list[tuple[int, str]] = []
    ex.on_exit = lambda j, e, st: exits.append((e, st))
    job = Job(id="gang.00000001", tenant="t", priority=0, nodes=2, gpus_per_node=1, submit_s=0.0, command=cmd)
    job.ckpt_root = str(root)
    job.epoch, job.state = 1, JobState.RUNNING
    ex.start(job, ("n2", "n3"), 0.0)
    first = ex.runs[job.id]
    assert first.slurm_id > 0, ex.failures
    ex.after_pass()
    deadline = time.monotonic() + 240
    procs: list[dict] = []
    while time.monotonic() < deadline:
        ex.poll()
        assert not exits, (exits, (Path(first.dir) / "log").read_text())
        c = latest(root) if root.exists() else None
        if c is not None and int(c.name.split("_")[-1]) >= 5:
            procs = _job_processes(job.id)
            break
        time.sleep(0.3)
    else:
        pytest.fail("the gang never committed step 5:\n" + (Path(first.dir) / "log").read_text()[-3000:])
    # one Slurm job over both nodes
    q = json.loads(sl.run(["squeue", "--json"]))
    mine = [j for j in q["jobs"] if str(j.get("comment", "")).endswith(f":{job.id}:1")]
    assert len(mine) == 1 and mine[0]["job_id"] == first.slurm_id and mine[0]["node_count"] == 2, mine
    torchruns = [p for p in procs if "torch.distributed.run" in p["cmd"] and "slurm_launch" not in p["cmd"]]
    workers = [p for p in procs if "example_dist_job" in p["cmd"] and "torch.distributed.run" not in p["cmd"]]
    batch = [p for p in procs if "slurm_launch batch" in p["cmd"]]
    assert sorted(p["SLURMD_NODENAME"] for p in torchruns) == ["n2", "n3"], procs  # one torchrun per node
    assert sorted(p["PET_NODE_RANK"] for p in torchruns) == ["0", "1"]
    assert {p["SLURM_JOB_ID"] for p in procs} == {str(first.slurm_id)}
    # the rendezvous: the first node's address and a port the batch step picked there
    assert [p["SLURMD_NODENAME"] for p in batch] == ["n2"], batch
    addr = dict(x.split("=") for x in batch[0]["GOODPUT_NODE_ADDRS"].split(","))["n2"]
    port = {p["PET_MASTER_PORT"] for p in torchruns}
    assert {p["PET_MASTER_ADDR"] for p in torchruns} == {addr} and len(port) == 1 and port != {"29500"}
    assert sorted((p["SLURMD_NODENAME"], p["RANK"], p["WORLD_SIZE"]) for p in workers) == [
        ("n2", "0", "2"), ("n3", "1", "2")], workers  # fmt: skip
    assert {p["MASTER_ADDR"] for p in workers} == {addr}
    # the preemption: USR1 to the batch step; the workers commit and leave with 75
    committed = int(latest(root).name.split("_")[-1])
    ex.notify(job, checkpoint=True, deadline_s=time.time() + 60)
    while time.monotonic() < deadline and not exits:
        ex.poll()
        time.sleep(0.3)
    assert exits == [(1, "preempted")], (exits, (Path(first.dir) / "log").read_text()[-3000:])
    at_exit = int(latest(root).name.split("_")[-1])
    assert committed <= at_exit < steps
    # the next run elsewhere resumes from the commit and finishes
    job.epoch = 2
    ex.start(job, ("n4", "n1"), 1.0)
    ex.after_pass()
    while time.monotonic() < deadline and len(exits) < 2:
        ex.poll()
        time.sleep(0.3)
    assert exits[1:] == [(2, "finished")], (exits, (Path(ex.runs[job.id].dir) / "log").read_text()[-3000:]
                                            if job.id in ex.runs else "")  # fmt: skip
    starts = [json.loads(x) for x in (root / "starts.jsonl").read_text().splitlines()]
    assert [(s["epoch"], s["world"]) for s in starts] == [(1, 2), (2, 2)]
    assert starts[1]["restored_step"] == at_exit
    ok, worst = compare(torch.load(root / "final.pt", weights_only=True), reference(steps))
    assert ok or worst <= 1e-6, worst
    store.close()


def test_slurm_drain_is_goodputs_drain_and_resume_returns_the_node(slurm):  # noqa: F811
    """An operator's ``scontrol update nodename=X state=DRAIN`` (Slurm's own way) is goodput's drain of
    X, read from the per-pass ``sinfo --json``: a notice for X, its running job asked to leave
    (``reason: drain``, an infrastructure loss, not a failure) and started again elsewhere, and no new
    placement on X while the other nodes are full. ``state=RESUME`` offers X again: the job that
    waited starts there."""
    from goodput.demo.slurm import Runtime, SlurmService, events_of, get
    from goodput.sched.live.client import post_json
    from goodput.sched.sim.checker import check

    base = Path(slurm.root) / "goodput"
    base.mkdir()
    os.chmod(base, 0o755)
    rt = Runtime(sys.executable, str(Path(__file__).resolve().parents[3]))
    svc = SlurmService(base, slurm, rt, allow_root_jobs=True)
    admin = svc.token("admin", admin=True)
    tok = svc.token("t")
    svc.start()
    try:

        def submit(name: str) -> str:
            body = {"name": name, "command": ["sleep", "600"], "nodes": 1, "gpus_per_node": 2, "grace_s": 10,
                    }  # fmt: skip
            code, ans = post_json(svc.url + "/jobs", body, tok)
            assert code == 201, ans
            return ans["id"]

        def wait(cond, what: str, timeout_s: float = 90.0):  # noqa: ANN001, ANN202
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                got = cond()
                if got:
                    return got
                time.sleep(0.3)
            pytest.fail(f"{what}: not within {timeout_s:.0f} s\n{svc.log_tail()}")

        def job(jid: str) -> dict:
            return get(f"{svc.url}/jobs/{jid}", admin)

        first = submit("first")
        j = wait(lambda: (x := job(first))["state"] == "running" and x, "the first job running")
        x = j["placement"][0]
        slurm.run(["scontrol", "update", f"nodename={x}", "state=DRAIN", "reason=goodput-test"])
        # goodput's drain: the notice, the job asked to leave for the drain, requeued and started elsewhere
        j = wait(lambda: (y := job(first))["state"] == "running" and y["epoch"] == 2 and y, "the job moved")
        assert x not in j["placement"] and j["failures"] == 0 and j["infra_losses"] == 1, j
        ev = events_of(svc.url, admin)
        assert any(r["event"] == "node_reclaim_notice" and r["node"] == x for r in ev), ev
        pre = [r for r in ev if r["event"] == "preempt_requested" and r["job"] == first]
        assert [r["reason"] for r in pre] == ["drain"], pre
        assert abs(pre[0]["deadline_s"] - pre[0]["t"] - 30.0) < 2.0, pre  # goodput's drain notice: drain_grace_s
        # three more jobs for the three other nodes, one of them taken: one waits, none lands on x
        more = [submit(f"m{i}") for i in range(3)]
        wait(lambda: sum(job(m)["state"] == "running" for m in more) == 2, "two more running")
        time.sleep(2.0)  # a few passes: the drained node stays out
        states = {m: job(m) for m in more}
        waiting = [m for m, v in states.items() if v["state"] == "pending"]
        assert len(waiting) == 1, states
        assert all(x not in v["placement"] for v in states.values())
        cluster = get(f"{svc.url}/cluster", admin)
        assert next(n for n in cluster["nodes"] if n["name"] == x)["health"] == "reclaiming", cluster
        # Slurm's RESUME: goodput offers x again and the waiting job starts there
        slurm.run(["scontrol", "update", f"nodename={x}", "state=RESUME"])
        j = wait(lambda: (y := job(waiting[0]))["state"] == "running" and y, "the waiting job started")
        assert j["placement"] == [x], j
        ev = events_of(svc.url, admin)
        assert any(r["event"] == "node_up" and r["node"] == x for r in ev)
        assert check(ev, {n: slurm.gpus for n in slurm.node_names}).total == 0
    finally:
        svc.stop()


def test_over_slurm_the_cluster_json_needs_no_pools_and_given_ones_must_be_slurms(slurm, tmp_path):  # noqa: F811
    """``serve --executor slurm`` and ``check --partition`` take a cluster JSON of tenants and limits
    alone (the pools are sinfo's); pools the file does give must be Slurm's, or both commands stop
    saying which field differs, before anything runs."""
    from goodput.sched.core.model import Pool, PoolKind
    from goodput.sched.live.slurm import Slurm, check_pools, discover, read_cluster_json

    found, _nodes, _seen = discover(Slurm(conf=str(slurm.conf)), slurm.partition)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"tenants": [{"name": "t", "max_priority": 3}], "limits": {"min_run_s": 7}}))
    cl = read_cluster_json(bare)
    assert cl.pools == [] and cl.governance.limits.min_run_s == 7 and cl.governance.tenant("t").max_priority == 3
    assert check_pools(cl.pools, found, slurm.partition) == found
    same = {"name": slurm.partition, "kind": "on-demand", "nodes": 4, "gpus_per_node": 2, "price_per_gpu_hour": 2.5}
    (tmp_path / "same.json").write_text(json.dumps({"pools": [same]}))
    kept = check_pools(read_cluster_json(tmp_path / "same.json").pools, found, slurm.partition)
    assert [(p.name, p.nodes, p.gpus_per_node, p.price_per_gpu_hour) for p in kept] == [("goodput", 4, 2, 2.5)]
    with pytest.raises(ValueError, match=r"nodes 3 \(Slurm: 4\)"):
        check_pools([Pool("goodput", PoolKind.ON_DEMAND, 3, 2)], found, slurm.partition)
    with pytest.raises(ValueError, match="not Slurm's"):
        check_pools([Pool("local", PoolKind.ON_DEMAND, 4, 2)], found, slurm.partition)
    (tmp_path / "ev.json").write_text(json.dumps({"events": [{"t": 1, "kind": "reclaim", "pool": "x", "nodes": 1}]}))
    with pytest.raises(ValueError, match="events"):
        read_cluster_json(tmp_path / "ev.json")
    # the commands: a pool-less file checks a log; a disagreeing one stops serve and check alike
    log = tmp_path / "ev.jsonl"
    log.write_text("")
    env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
    base = [sys.executable, "-m", "goodput.cli.main", "sched"]
    chk = [*base, "check", str(log), "--partition", slurm.partition, "--json", "--cluster"]
    p = subprocess.run([*chk, str(bare)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["total"] == 0, p.stdout + p.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"pools": [dict(same, gpus_per_node=8)]}))
    p = subprocess.run([*chk, str(wrong)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "gpus_per_node 8 (Slurm: 2)" in p.stderr + p.stdout, p.stdout + p.stderr
    serve = [*base, "serve", "--db", f"sqlite:///{tmp_path / 's.db'}", "--port", "0", "--executor", "slurm",
             "--partition", slurm.partition, "--state-dir", str(tmp_path / "st"), "--allow-root-jobs"]  # fmt: skip
    p = subprocess.run([*serve, "--cluster", str(wrong)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "gpus_per_node 8 (Slurm: 2)" in p.stderr + p.stdout, p.stdout + p.stderr


def test_slurmrestd_where_present_reads_each_pass_and_the_cli_takes_over_when_it_goes(slurm, tmp_path):  # noqa: F811
    """With slurmrestd's socket configured, the executor's per-pass reads (jobs and nodes) go to it
    and none to squeue/sinfo; slurmrestd gone, the same executor reads through the commands, saying
    why, and jobs still start and end. Skipped where slurmrestd is absent."""
    import shutil as sh

    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    if sh.which("slurmrestd") is None and not os.access("/usr/sbin/slurmrestd", os.X_OK):
        pytest.skip("slurmrestd absent (Debian: apt-get install -y slurmrestd)")
    sock = slurm.start_restd()
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(slurm.conf), rest_socket=sock)
    _pools, nodes, seen = discover(sl, slurm.partition)
    assert [n.name for n in nodes] == slurm.node_names and sl.reads == {"slurmrestd": 1, "cli": 0}
    ex = SlurmExecutor(Path(slurm.root) / "gp", store=store, partition=slurm.partition, slurm=sl)
    ex.nodes.update(seen)
    exits: list[tuple[str, str]] = []
    ex.on_exit = lambda j, e, st: exits.append((j, st))

    def run(name: str, node: str, argv: tuple[str, ...]) -> None:
        job = Job(id=name, tenant="t", priority=0, nodes=1, gpus_per_node=1, submit_s=0.0, command=argv)
        job.epoch, job.state = 1, JobState.RUNNING
        ex.start(job, (node,), 0.0)
        assert ex.runs[name].slurm_id > 0, ex.failures
        ex.after_pass()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(j == name for j, _ in exits):
            ex.poll()
            time.sleep(0.3)

    run("rest.00000001", "n1", ("/bin/sh", "-c", "exit 75"))
    assert exits == [("rest.00000001", "preempted")]
    assert sl.reads["cli"] == 0 and sl.reads["slurmrestd"] >= 3 and sl.rest_error == ""
    slurm.kill("slurmrestd")
    run("cli.00000002", "n2", ("/bin/true",))
    assert exits[1:] == [("cli.00000002", "finished")]
    assert sl.reads["cli"] >= 2 and "slurmrestd" in sl.rest_error
    store.close()
