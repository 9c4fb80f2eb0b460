"""The Slurm task (``python -m goodput.sched.live.slurm_launch task -- CMD``) with real child processes,
no Slurm: the step's signal is sent to the task's process group, as slurmstepd signals every process
of the step. Each scenario's processes write their pids to files, and every one of them is killed in
the end whatever the result, so a failing test leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from goodput.sched.live.slurm_launch import gang_status, task_status

from .slurm_cluster import slurm  # noqa: F401 - fixture

REPO = str(Path(__file__).resolve().parents[3])
HANG_S = 60.0  # only a hang detector: the old task waited for ever


def _script(path: Path, body: str) -> str:
    path.write_text(textwrap.dedent(body))
    return str(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Task:
    """One task process in a session of its own; its scenario's pids are read from ``dir/*.pid``."""

    def __init__(self, tmp: Path, cmd: list[str], **env: str) -> None:
        self.dir = tmp
        self.status = tmp / "status.json"
        e = {**os.environ, "GOODPUT_STATUS_FILE": str(self.status), "SLURM_NODEID": "0", "T": str(tmp), **env}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "goodput.sched.live.slurm_launch", "task", "--", *cmd],
            cwd=REPO, env=e, start_new_session=True,
        )  # fmt: skip

    def pids(self) -> dict[str, int]:
        return {f.stem: int(f.read_text()) for f in self.dir.glob("*.pid") if f.read_text().strip()}

    def wait_ready(self, names: set[str]) -> None:
        end = time.monotonic() + HANG_S
        while not names <= set(self.pids()):
            assert self.p.poll() is None, "the task ended before its processes were ready"
            assert time.monotonic() < end, f"not ready: {names - set(self.pids())}"
            time.sleep(0.05)

    def signal_step(self, sig: int) -> None:
        os.killpg(self.p.pid, sig)

    def result(self) -> int:
        try:
            return self.p.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the task still runs {HANG_S:.0f} s later: it holds the node")

    def cleanup(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        for pid in self.pids().values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(timeout=10)


HELPER = """
import os, signal, sys, time
open(os.path.join(os.environ["T"], sys.argv[1] + ".pid"), "w").write(str(os.getpid()))
if len(sys.argv) > 2 and sys.argv[2] == "ignore":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
time.sleep(100000)
"""

WORKER = """
import os, signal, subprocess, sys, time
asked = []
signal.signal(signal.SIGUSR1, lambda *a: asked.append(1))
T = os.environ["T"]
# a helper this worker starts and never waits for (a prefetcher, a log shipper): it ignores USR1, so it
# outlives the worker, and is reparented to the task when the worker leaves
subprocess.Popen([sys.executable, os.path.join(T, "helper.py"), "worker_helper", "ignore"])
while not os.path.exists(os.path.join(T, "worker_helper.pid")):
    time.sleep(0.02)
open(os.path.join(T, "worker.pid"), "w").write(str(os.getpid()))
mode = sys.argv[1]
if mode == "hang":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    time.sleep(100000)
while not asked:
    time.sleep(0.02)
time.sleep(0.3)  # its checkpoint
os._exit(75 if mode == "leave" else 3)
"""

LAUNCHER = """
import os, subprocess, sys, time
# torchrun-like: no USR1 handler (it dies of the step's signal), one worker it waits for
T = os.environ["T"]
if len(sys.argv) > 2:  # and a helper of its own it never waits for
    subprocess.Popen([sys.executable, os.path.join(T, "helper.py"), "launcher_helper"])
w = subprocess.Popen([sys.executable, os.path.join(T, "worker.py"), sys.argv[1]])
open(os.path.join(T, "launcher.pid"), "w").write(str(os.getpid()))
sys.exit(w.wait())
"""


def _gang(tmp_path: Path, mode: str, *extra: str, **env: str) -> Task:
    _script(tmp_path / "helper.py", HELPER)
    _script(tmp_path / "worker.py", WORKER)
    launcher = _script(tmp_path / "launcher.py", LAUNCHER)
    return Task(tmp_path, [sys.executable, launcher, mode, *extra], **env)


def _node_word(t: Task) -> int:
    import json

    return json.loads(Path(f"{t.status}.node0").read_text())["rc"]


def test_a_failing_command_s_detached_helper_neither_holds_the_task_nor_outlives_it(tmp_path):
    """A command that exits 1 after starting a helper in a session of its own (out of the step's
    process group): the task ends with 1 at once and the helper is killed. The old task, a subreaper in
    an unbounded ``os.wait()``, held its node until the job's time limit."""
    _script(tmp_path / "helper.py", HELPER)
    cmd = _script(
        tmp_path / "fail.py",
        """
        import os, subprocess, sys, time
        T = os.environ["T"]
        subprocess.Popen([sys.executable, os.path.join(T, "helper.py"), "daemon"], start_new_session=True)
        while not os.path.exists(os.path.join(T, "daemon.pid")):
            time.sleep(0.02)
        sys.exit(1)
        """,
    )
    t = Task(tmp_path, [sys.executable, cmd])
    try:
        assert t.result() == 1
        assert _node_word(t) == 1
        assert not _alive(t.pids()["daemon"])
    finally:
        t.cleanup()


def test_usr1_a_launcher_dies_its_worker_leaves_with_75_its_helpers_are_not_workers(tmp_path):
    """USR1 to the step: the torchrun-like launcher dies of it (138), its worker checkpoints and exits
    75, the worker's own helper (which ignores USR1) is reparented to the task when the worker leaves,
    and the launcher's helper dies of USR1 (no handler: nothing to save). The node was preempted: 75,
    and nothing of the job is left running. The old task returned 138 (it read every orphan's status
    as a worker's) and waited for the lingering helper for ever."""
    t = _gang(tmp_path, "leave", "with-helper", GOODPUT_GRACE_S="30")
    try:
        t.wait_ready({"launcher", "worker", "worker_helper", "launcher_helper"})
        t.signal_step(signal.SIGUSR1)
        assert t.result() == 75
        assert _node_word(t) == 75
        assert not any(_alive(p) for p in t.pids().values()), t.pids()
    finally:
        t.cleanup()


def test_a_worker_that_fails_while_leaving_is_not_a_preemption(tmp_path):
    t = _gang(tmp_path, "crash", GOODPUT_GRACE_S="30")
    try:
        t.wait_ready({"launcher", "worker", "worker_helper"})
        t.signal_step(signal.SIGUSR1)
        # the crashed worker's own status (3), not the launcher's death by the notice, which the executor
        # would read as a stop obeyed: failed
        assert t.result() == 3
        assert not any(_alive(p) for p in t.pids().values()), t.pids()
    finally:
        t.cleanup()


def test_workers_are_waited_for_at_most_the_grace_then_killed(tmp_path):
    """A worker that does not leave (it ignores the notice) is killed once the grace is over: the task
    ends (not a preemption), its node free before the job's limit. The old task waited for ever."""
    t = _gang(tmp_path, "hang", GOODPUT_GRACE_S="1")
    try:
        t.wait_ready({"launcher", "worker", "worker_helper"})
        t.signal_step(signal.SIGUSR1)
        assert t.result() == 128 + signal.SIGKILL  # killed past the grace: failed, never a stop obeyed
        assert not any(_alive(p) for p in t.pids().values()), t.pids()
    finally:
        t.cleanup()


def test_node_and_gang_statuses():
    usr1 = signal.SIGUSR1
    assert task_status(-usr1, [75]) == 75
    assert task_status(-usr1, [75, -usr1], (usr1,)) == 75  # a helper killed by the notice itself
    assert task_status(-usr1, [75, -usr1]) == 128 + usr1  # ...but only by the signal the step received
    # a worker's own failure is the node's status, not the launcher's death by the notice (which the
    # executor reads as a stop obeyed)
    assert task_status(-usr1, [75, -signal.SIGKILL], (usr1,)) == 128 + signal.SIGKILL  # killed past the grace
    assert task_status(-usr1, [-usr1], (usr1,)) == 128 + usr1  # nobody checkpointed: dead of the notice
    assert task_status(-usr1, [75, 2], (usr1,)) == 2
    assert task_status(-usr1, [-usr1, 3], (usr1,)) == 3
    assert task_status(-usr1, [0, -usr1], (usr1,)) == 128 + usr1
    # the gang: 75 only when no node says otherwise; srun's highest status would have said 75 here
    assert gang_status([75, 1], 75) == 1
    assert gang_status([75, 138], 138) == 138
    assert gang_status([75, 75], 75) == 75
    assert gang_status([0, 75], 75) == 75  # resumed from the commit: never wrong
    assert gang_status([0, 0], 0) == 0
    assert gang_status([75, None], 75) == 1  # a node's word is missing: not reported preempted
    assert gang_status([None, None], 3) == 3
    # a node dead of the notice the step received does not hide another's crash
    term = int(signal.SIGTERM)
    assert gang_status([143, 1], 143, (term,)) == 1
    assert gang_status([143, 143], 143, (term,)) == 143
    assert gang_status([143, 1], 143) == 143  # no notice received: the highest, as before


def test_a_gang_with_one_node_at_75_and_another_at_3_failed_over_a_real_slurm(slurm, tmp_path):  # noqa: F811
    """srun's status is its tasks' highest, so node 0 leaving with 75 hid node 1's crash (3) and the old
    batch step reported the gang preempted (skipping the failure budget). Each node's own word is read
    now: the gang failed with 3; a gang whose every node left with 75 is still preempted."""
    from goodput.sched.core.model import Job, JobState
    from goodput.sched.live.slurm import Slurm, SlurmExecutor, discover
    from goodput.sched.live.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sl = Slurm(conf=str(slurm.conf))
    _pools, _nodes, seen = discover(sl, slurm.partition)
    ex = SlurmExecutor(Path(slurm.root) / "gp", store=store, partition=slurm.partition, slurm=sl)
    ex.nodes.update(seen)
    exits: list[tuple[str, str]] = []
    ex.on_exit = lambda j, e, st: exits.append((j, st))

    def run(name: str, nodes: tuple[str, ...], script: str) -> str:
        job = Job(id=name, tenant="t", priority=0, nodes=2, gpus_per_node=1, submit_s=0.0,
                  command=("/bin/sh", "-c", script))  # fmt: skip
        job.epoch, job.state = 1, JobState.RUNNING
        ex.start(job, nodes, 0.0)
        assert ex.runs[name].slurm_id > 0, ex.failures
        ex.after_pass()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(j == name for j, _ in exits):
            ex.poll()
            time.sleep(0.3)
        got = [st for j, st in exits if j == name]
        assert got, f"{name}: no exit within 90 s"
        return got[0]

    n = slurm.node_names
    crash = 'if [ "$SLURM_NODEID" = 0 ]; then exit 75; else sleep 0.5; exit 3; fi'
    assert run("mixed.00000001", (n[0], n[1]), crash) == "failed"
    assert run("leave.00000002", (n[2], n[3]), "exit 75") == "preempted"
    store.close()
