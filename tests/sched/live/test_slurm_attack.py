"""goodput over a real Slurm, attacked as an operator and a hostile tenant would: stops a job handles
or ignores, processes that try to outlive their job, Slurm's daemons restarted under running jobs.

Skipped, with the reason, where Slurm's binaries are absent or the tests are not root.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from .slurm_cluster import slurm  # noqa: F401 - fixtures


def _executor(cluster, tmp_path: Path):  # noqa: ANN001, ANN202
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(cluster.conf))
    _pools, _nodes, seen = discover(sl, cluster.partition)
    ex = SlurmExecutor(Path(cluster.root) / "gp", store=store, partition=cluster.partition, slurm=sl)
    ex.nodes.update(seen)
    return ex, store


def _job(name: str, script: str, grace_s: float = 20.0):  # noqa: ANN202
    from goodput.sched.core.model import Job, JobState

    j = Job(id=name, tenant="t", priority=0, nodes=1, gpus_per_node=2, submit_s=0.0, command=("sh", "-c", script))
    j.ckpt.grace_s = grace_s
    j.epoch, j.state = 1, JobState.RUNNING
    return j


def _processes(job_id: str) -> list[str]:
    """Every process on this machine whose environment names ``job_id`` (``GOODPUT_JOB_ID``)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if f"GOODPUT_JOB_ID={job_id}".encode() in f.read().split(b"\0"):
                    out.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:100]}")
        except OSError:
            continue
    return out


def _slurm_state(ex, run) -> str:  # noqa: ANN001
    q = json.loads(ex.slurm.run(["squeue", "--json"]))
    return next((str(j["job_state"]) for j in q["jobs"] if j["job_id"] == run.slurm_id), "")


def test_a_stop_without_checkpoint_reaches_the_job_which_may_handle_or_ignore_it(slurm, tmp_path):  # noqa: F811
    """goodput's stop (``notify(checkpoint=False)``: TERM) over Slurm. srun takes a SIGTERM as its own
    end and SIGKILLs the whole step at once ("srun: forcing job termination"), so passing TERM to srun
    killed every job within milliseconds, its handler never run, and the run read ``failed`` (137, a
    signal goodput never sent): a crash while leaving, counted against the job's budget, on every
    stop. The TERM must reach the job's processes: one that handles it leaves as it chooses (143 on
    our TERM: a stop obeyed, ``killed``); one that ignores it keeps running until the core's deadline
    kills it (``scancel``: ``killed``), a child it detached (``setsid``) with it."""
    out = Path(slurm.root) / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    ex, store = _executor(slurm, tmp_path)
    exits: dict[str, str] = {}
    ex.on_exit = lambda j, e, st: exits.__setitem__(j, st)
    handles = _job(
        "handles.00000001",
        f"trap 'echo handled > {out}/handles; exit 143' TERM; echo up > {out}/handles.up; while :; do sleep 0.2; done",
    )
    ignores = _job(
        "ignores.00000002",
        "trap '' TERM; (setsid sh -c \"trap '' TERM HUP; exec sleep 300\" &); "
        f"echo up > {out}/ignores.up; while :; do sleep 0.2; done",
    )
    ex.start(handles, ("n1",), 0.0)
    ex.start(ignores, ("n2",), 0.0)
    ex.after_pass()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ex.poll()
        views = {j.id: _slurm_state(ex, ex.runs[j.id]) for j in (handles, ignores)}
        if set(views.values()) == {"RUNNING"} and all((out / f"{n}.up").exists() for n in ("handles", "ignores")):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"the jobs never ran: {ex.failures}")
    ex.poll()  # a view that has them running: the notice is a signal, not a cancel
    ex.notify(handles, checkpoint=False, deadline_s=20)
    ex.notify(ignores, checkpoint=False, deadline_s=20)
    while time.monotonic() < deadline and handles.id not in exits:
        ex.poll()
        time.sleep(0.3)
    log_of = {j.id: (Path(ex.runs[j.id].dir) / "log") if j.id in ex.runs else None for j in (ignores,)}
    assert exits.get(handles.id) == "killed", (exits, ex.last_exit)
    assert (out / "handles").read_text().strip() == "handled", "the job's TERM handler never ran"
    assert ex.last_exit[handles.id]["rc"] == 143, ex.last_exit
    # the one that ignores the stop is still running some seconds later: its stop was a TERM, no kill
    time.sleep(3)
    ex.poll()
    assert ignores.id not in exits, (
        exits, ex.last_exit, log_of[ignores.id].read_text()[-2000:] if log_of[ignores.id] else "",
    )  # fmt: skip
    assert _slurm_state(ex, ex.runs[ignores.id]) == "RUNNING"
    ex.kill(ignores)  # the core's deadline
    while time.monotonic() < deadline and ignores.id not in exits:
        ex.poll()
        time.sleep(0.3)
    assert exits.get(ignores.id) == "killed", (exits, ex.last_exit)
    end = time.monotonic() + 15
    while time.monotonic() < end and _processes(ignores.id):
        time.sleep(0.5)
    assert _processes(ignores.id) == [], "processes outlived their job"
    store.close()


def test_a_tenant_s_carriage_returns_reach_the_job_exactly_and_inject_nothing(slurm, tmp_path):  # noqa: F811
    """sbatch refuses a batch script with a carriage return before a newline ("DOS line breaks"): a
    spec whose env value or argument held ``\\r\\n`` (which the API accepts) could not be submitted,
    and the refusal read as Slurm's (``lost``: an infrastructure loss, requeued, again and again on
    the infrastructure's budget). The job runs, and sees exactly what its spec gave; a ``#SBATCH``
    line inside a value is the value's text, never an sbatch option."""
    import sys

    out = Path(slurm.root) / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    ex, store = _executor(slurm, tmp_path)
    env = {"X": "a\r\nb", "Y": "\r", "Z": "\n#SBATCH --partition=low\r\n#SBATCH --uid=0\r\n", "W": "it's\r"}
    ex.env_for = lambda j: dict(env)
    exits: dict[str, str] = {}
    ex.on_exit = lambda j, e, st: exits.__setitem__(j, st)
    probe = "import json,os,sys; json.dump({'argv': sys.argv[2:], 'env': {k: os.environ.get(k) for k in 'XYZW'}}, open(sys.argv[1], 'w'))"  # noqa: E501
    args = ("x\r\ny", "\r", "-\r", "\r\n#SBATCH --nodelist=n4")
    job = _job("crlf.00000001", "")
    job.command = (sys.executable, "-c", probe, str(out / "seen.json"), *args)
    ex.start(job, ("n3",), 0.0)
    run = ex.runs[job.id]
    assert run.slurm_id > 0, ex.failures
    ex.after_pass()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and job.id not in exits:
        ex.poll()
        time.sleep(0.3)
    assert exits == {job.id: "finished"}, (exits, ex.last_exit, ex.failures)
    seen = json.loads((out / "seen.json").read_text())
    assert seen == {"argv": list(args), "env": env}, seen
    q = json.loads(ex.slurm.run(["squeue", "--json"]))
    mine = next(j for j in q["jobs"] if j["job_id"] == run.slurm_id)
    assert (mine["partition"], mine["nodes"], mine["user_id"]) == (slurm.partition, "n3", os.geteuid()), mine
    store.close()


@pytest.mark.slow  # 50 s here: each scancel waits out Slurm's own retries while slurmctld is away
def test_a_notice_and_a_kill_asked_while_slurmctld_is_down_reach_the_job_once_it_is_back(slurm, tmp_path):  # noqa: F811
    """slurmctld SIGKILLed under two running jobs, then goodput asks one to checkpoint (USR1) and kills
    the other (the core's deadline for a job that ignores every notice): both scancels fail. Once
    slurmctld is back (its jobs survive it), the notice is delivered (the job leaves with 75:
    ``preempted``) and the kill is carried out (``killed``): neither is dropped, so no run holds its
    nodes forever, and each exit is reported once."""
    import signal

    ex, store = _executor(slurm, tmp_path)
    exits: list[tuple[str, str]] = []
    ex.on_exit = lambda j, e, st: exits.append((j, st))
    leaves = _job("leaves.00000001", "trap 'exit 75' USR1; while :; do sleep 0.2; done")
    stays = _job("stays.00000002", "trap '' TERM USR1; while :; do sleep 0.2; done")
    ex.start(leaves, ("n1",), 0.0)
    ex.start(stays, ("n2",), 0.0)
    ex.after_pass()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ex.poll()
        if {_slurm_state(ex, ex.runs[j.id]) for j in (leaves, stays)} == {"RUNNING"}:
            break
        time.sleep(0.3)
    time.sleep(1.0)  # the batch steps' handlers are in place
    ex.poll()
    slurm.kill("slurmctld", signal.SIGTERM)  # (SIGKILL: see the report; its state save may predate the release)
    ex.notify(leaves, checkpoint=True, deadline_s=20)
    ex.kill(stays)
    got = ex.poll()
    assert got == 0 and exits == [], (exits, ex.last_exit, ex.failures[-5:])  # nothing concluded from silence
    slurm.start_ctld()
    while time.monotonic() < deadline and len(exits) < 2:
        ex.poll()
        time.sleep(0.3)
    assert sorted(exits) == [(leaves.id, "preempted"), (stays.id, "killed")], (exits, ex.failures[-5:])
    for _ in range(3):
        ex.poll()
    assert len(exits) == 2 and ex.table.load() == []
    store.close()


def test_squeue_that_cannot_reach_slurmctld_is_a_failed_read_not_an_empty_cluster(tmp_path):
    """What 22.05's squeue/sinfo --json print, exit 0, while slurmctld is away (seen on the real
    cluster above): an ``errors`` list and no job. A pass must conclude nothing from it; it had read
    "every job is gone" and reported each run ``lost``, to be started again while Slurm still ran it."""
    import pytest as _pytest

    from goodput.sched.live.slurm import Slurm, SlurmError, SlurmExecutor, SlurmRun
    from goodput.sched.live.store import open_store

    away = {"errors": [{"error": "Unable to contact slurm controller (connect failure)", "errno": 1007,
                        "source": "slurm_load_jobs"}], "jobs": [], "nodes": []}  # fmt: skip

    class Away(Slurm):
        def json(self, argv):  # noqa: ANN001, ANN202
            return dict(away)

    with _pytest.raises(SlurmError, match="squeue --json: .*Unable to contact"):
        Away().state("jobs")
    with _pytest.raises(SlurmError, match="sinfo --json"):
        Away().state("nodes")
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ex = SlurmExecutor(tmp_path / "state", store=store, partition="p", slurm=Away())
    exits: list[str] = []
    ex.on_exit = lambda j, e, st: exits.append(st)
    run = SlurmRun("j.00000001", 1, 5, ["n1"], "u", str(tmp_path), released=True)
    ex.runs[run.job] = run
    ex.table.save(run)
    assert ex.poll() == 0 and exits == [] and ex.runs == {run.job: run}
    assert "Unable to contact" in ex.failures[-1]
    store.close()
