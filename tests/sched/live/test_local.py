"""The local executor on real process groups: exits, kills, preemption notices, re-adoption."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from goodput.sched.core.model import Job, JobState
from goodput.sched.live.local import LocalExecutor

PY = sys.executable


def _job(jid: str, cmd: list[str], root: Path, epoch: int = 1) -> Job:
    j = Job(id=jid, tenant="t", priority=0, nodes=1, gpus_per_node=2, submit_s=0.0, command=tuple(cmd))
    j.ckpt_root = str(root)
    j.epoch = epoch
    j.state = JobState.RUNNING
    return j


class Exits:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []
        self.cv = threading.Condition()

    def on_exit(self, jid: str, epoch: int, status: str) -> None:
        with self.cv:
            self.seen.append((jid, epoch, status))
            self.cv.notify_all()

    def wait(self, n: int, timeout: float = 15.0) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.seen) >= n, timeout), self.seen


def _executor(tmp_path: Path, exits: Exits) -> LocalExecutor:
    ex = LocalExecutor(tmp_path / "state", url="http://127.0.0.1:9", on_exit=exits.on_exit, poll_s=0.05)
    ex.start_watcher()
    return ex


def test_exit_statuses_and_environment(tmp_path):
    exits = Exits()
    ex = _executor(tmp_path, exits)
    env_out = tmp_path / "env.json"
    dump = (
        "import json,os,sys;"
        f"json.dump({{k: v for k, v in os.environ.items() if k.startswith(('GOODPUT_', 'CUDA_', 'MASTER_'))}}, open({str(env_out)!r}, 'w'))"
    )
    ex.start(_job("ok.00000001", [PY, "-c", dump], tmp_path), ("local-00001",), 12.5)
    ex.start(_job("bad.00000001", [PY, "-c", "raise SystemExit(3)"], tmp_path), ("local-00000",), 0.0)
    ex.start(_job("pre.00000001", [PY, "-c", "raise SystemExit(75)"], tmp_path), ("local-00000",), 0.0)
    exits.wait(3)
    ex.close()
    assert sorted(exits.seen) == [
        ("bad.00000001", 1, "failed"),
        ("ok.00000001", 1, "finished"),
        ("pre.00000001", 1, "preempted"),
    ]
    env = json.loads(env_out.read_text())
    assert env["GOODPUT_JOB_ID"] == "ok.00000001" and env["GOODPUT_JOB_EPOCH"] == "1"
    assert env["GOODPUT_RESUME_FROM_S"] == "12.5" and env["GOODPUT_CKPT_ROOT"] == str(tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # node 1 of 2-GPU nodes
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert (tmp_path / "state" / "logs" / "ok.00000001.1.log").exists()
    assert not list((tmp_path / "state" / "runs").glob("*.json"))  # reported runs are forgotten


def test_kill_is_killed_and_an_outside_kill_is_a_lost_slot(tmp_path):
    import os
    import signal

    exits = Exits()
    ex = _executor(tmp_path, exits)
    a = _job("a.00000001", [PY, "-c", "import time; time.sleep(60)"], tmp_path)
    b = _job("b.00000001", [PY, "-c", "import time; time.sleep(60)"], tmp_path)
    ex.start(a, ("local-00000",), 0.0)
    ex.start(b, ("local-00001",), 0.0)
    ex.kill(a)
    os.killpg(ex.runs["b.00000001"].pgid, signal.SIGKILL)  # from outside: the slot is lost
    exits.wait(2)
    ex.close()
    assert sorted(exits.seen) == [("a.00000001", 1, "killed"), ("b.00000001", 1, "lost")]


def test_notify_signals_the_group_and_writes_a_notice(tmp_path):
    exits = Exits()
    ex = _executor(tmp_path, exits)
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
        "open(os.environ['GOODPUT_CKPT_ROOT'] + '/ready', 'w').close()\n"
        "time.sleep(60)\n"
    )
    j = _job("n.00000001", [PY, "-c", script], tmp_path)
    ex.start(j, ("local-00000",), 0.0)
    deadline = time.monotonic() + 15
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    notice = Path(ex.runs[j.id].notice_file)
    ex.notify(j, checkpoint=True, deadline_s=123.0)
    assert json.loads(notice.read_text())["deadline_s"] == 123.0
    exits.wait(1)
    ex.close()
    assert exits.seen == [("n.00000001", 1, "preempted")]


def test_a_new_executor_readopts_a_live_group_and_kills_an_orphan(tmp_path):
    exits = Exits()
    ex = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)  # no watcher: the "service" dies
    live = _job("live.00000001", [PY, "-c", "import time; time.sleep(1.5)"], tmp_path)
    orphan = _job("orph.00000001", [PY, "-c", "import time; time.sleep(60)"], tmp_path)
    ex.start(live, ("local-00000",), 0.0)
    ex.start(orphan, ("local-00001",), 0.0)
    orphan_pid = ex.runs[orphan.id].pid
    # a restarted executor: the store counts `live` as running (epoch 1) and `orph` as never started
    ex2 = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)
    orphan.state, orphan.epoch = JobState.PENDING, 0
    got = ex2.adopt({live.id: live, orphan.id: orphan})
    assert got == {"live.00000001": "adopted", "orph.00000001": "orphan killed"}
    ex2.start_watcher()
    exits.wait(1)
    ex2.close()
    assert exits.seen == [("live.00000001", 1, "finished")]  # read from the supervisor's status file
    ex.runs[orphan.id].popen.wait(timeout=10)
    import psutil

    assert not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == psutil.STATUS_ZOMBIE


def test_a_notice_before_the_command_exists_is_passed_on(tmp_path):
    """The supervisor's own handlers are in place before its command is started: a notice to the
    group in between reaches only the supervisor, which must pass it on (or the run never sees it)."""
    import os
    import signal
    import subprocess

    status = tmp_path / "status"
    # the notice lands after the supervisor's handlers, just before the command is started
    sup = (
        "import os, signal, subprocess, sys\n"
        "from goodput.sched.live import local\n"
        "real = subprocess.Popen\n"
        "def popen(*a, **kw):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(*a, **kw)\n"
        "subprocess.Popen = popen\n"
        f"sys.exit(local._supervise(['--status', {str(status)!r}, '--', {PY!r}, '-c', 'import time; time.sleep(60)']))\n"
    )
    p = subprocess.Popen([PY, "-c", sup], start_new_session=True)
    try:
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert json.loads(status.read_text())["rc"] == -signal.SIGTERM  # the command got the notice


def test_a_supervisor_whose_run_was_never_recorded_does_not_run_the_command(tmp_path):
    """The service SIGKILLed between starting a run's supervisor and writing its record: a restarted
    service finds no record to adopt or kill and starts the job again, so the unrecorded supervisor
    must not run it (it waits for the record, then gives up). Recorded in time, the command runs."""
    import subprocess

    def supervise(name: str, record_after_s: float | None) -> tuple[bool, dict]:
        marker, record, status = tmp_path / f"{name}.ran", tmp_path / f"{name}.json", tmp_path / f"{name}.status"
        spec = tmp_path / f"{name}.spec"
        spec.write_text(json.dumps({"env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path), "umask": 0o077,
                                    "record": str(record), "record_wait_s": 1.0}))  # fmt: skip
        cmd = [PY, "-I", "-m", "goodput.sched.live.local", "--status", str(status), "--spec", str(spec), "--"]
        p = subprocess.Popen([*cmd, PY, "-c", f"open({str(marker)!r}, 'w').close()"])
        if record_after_s is not None:
            time.sleep(record_after_s)
            record.write_text("{}")
        assert p.wait(timeout=30) == 0
        return marker.exists(), json.loads(status.read_text())

    ran, st = supervise("lost", None)
    assert not ran and st["rc"] == 127 and st["unrecorded"] is True, st
    ran, st = supervise("late", 0.3)  # the record comes while the supervisor waits
    assert ran and st["rc"] == 0, st


def _wait_file(path: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, path
        time.sleep(0.05)


def test_a_command_dead_of_our_notice_obeyed_it_and_one_dead_of_a_signal_we_did_not_send_failed(tmp_path):
    """A plain command (no handler) dies of the stop notice we sent it: a stop obeyed, ``killed`` as a
    kill at the deadline would be, not ``failed``. A command that dies of a signal we did not send
    (SIGTERM it sent itself before any notice; SIGTERM after a SIGUSR1 notice) is still ``failed``."""
    import signal

    exits = Exits()
    ex = _executor(tmp_path, exits)
    ready = "open(os.environ['GOODPUT_CKPT_ROOT'] + '/ready-' + os.environ['GOODPUT_JOB_ID'], 'w').close()\n"
    plain = _job("plain.00000001", ["sleep", "1000"], tmp_path)
    usr1 = _job("usr1.00000001", [PY, "-c", f"import os, time\n{ready}time.sleep(60)\n"], tmp_path)
    self_term = _job(
        "self.00000001",
        [PY, "-c", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"],
        tmp_path,
    )
    # it handles our SIGUSR1 by dying of a SIGTERM of its own: not the signal we sent
    other = _job(
        "other.00000001",
        [PY, "-c", f"import os, signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: os.kill(os.getpid(), signal.SIGTERM))\n{ready}time.sleep(60)\n"],
        tmp_path,
    )  # fmt: skip
    ex.start(plain, ("local-00000",), 0.0)
    ex.start(usr1, ("local-00000",), 0.0)
    ex.start(self_term, ("local-00001",), 0.0)
    ex.start(other, ("local-00001",), 0.0)
    for j in (usr1, other):
        _wait_file(tmp_path / f"ready-{j.id}")
    time.sleep(0.3)  # sleep is exec'd by then
    for j in (plain, usr1, other):
        j.state = JobState.PREEMPTING
    ex.notify(plain, checkpoint=False, deadline_s=30.0)  # SIGTERM: sleep dies of it at once
    ex.notify(usr1, checkpoint=True, deadline_s=30.0)  # SIGUSR1, no handler: dies of it
    ex.notify(other, checkpoint=True, deadline_s=30.0)
    exits.wait(4)
    ex.close()
    assert sorted(exits.seen) == [
        ("other.00000001", 1, "failed"),
        ("plain.00000001", 1, "killed"),
        ("self.00000001", 1, "failed"),
        ("usr1.00000001", 1, "killed"),
    ]
    assert ex.last_exit["plain.00000001"]["signal"] == "SIGTERM"  # the cause stays visible
    assert ex.last_exit["self.00000001"] == {"epoch": 1, "status": "failed", "rc": -signal.SIGTERM, "signal": "SIGTERM"}
    assert ex.last_exit["other.00000001"]["status"] == "failed"


def test_a_death_before_our_notice_failed_and_a_restarted_executor_still_knows_what_it_sent(tmp_path):
    """The status file says when the command died: one dead of SIGTERM before our first notice went
    did not obey it (failed). What was sent is in the run's record: a restarted service reads a death
    by our notice as obeyed too."""
    import signal

    exits = Exits()
    ex = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)  # polled by hand
    early = _job("early.00000001", [PY, "-c", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"], tmp_path)
    plain = _job("plain.00000001", ["sleep", "1000"], tmp_path)
    ex.start(early, ("local-00000",), 0.0)
    ex.start(plain, ("local-00001",), 0.0)
    early_status = Path(ex.runs[early.id].status_file)
    _wait_file(early_status)  # dead of its own SIGTERM, status written...
    time.sleep(0.3)
    for j in (early, plain):
        j.state = JobState.PREEMPTING
    ex.notify(early, checkpoint=False, deadline_s=30.0)  # ...then asked to leave (its group is gone)
    ex.notify(plain, checkpoint=False, deadline_s=30.0)
    rec = json.loads((tmp_path / "state" / "runs" / f"{plain.id}.1.json").read_text())
    assert rec["signalled"] == [int(signal.SIGTERM)] and rec["notified_t"] > 0
    _wait_file(Path(ex.runs[plain.id].status_file))
    # the service died before it read either exit: a new one adopts both runs from their records
    ex2 = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)
    assert ex2.adopt({early.id: early, plain.id: plain}) == {early.id: "adopted", plain.id: "adopted"}
    deadline = time.monotonic() + 15
    while len(exits.seen) < 2:
        ex2.poll()
        assert time.monotonic() < deadline, exits.seen
        time.sleep(0.05)
    assert sorted(exits.seen) == [("early.00000001", 1, "failed"), ("plain.00000001", 1, "killed")]


def test_a_run_whose_start_failed_is_never_signalled_as_group_zero(tmp_path):
    """A start that failed leaves a run with no process (pgid 0): a notice or a kill for it before the
    watcher reports it must not become killpg(0), which would signal the service's own group."""
    import os
    import signal

    exits = Exits()
    ex = LocalExecutor(tmp_path / "state", on_exit=exits.on_exit, poll_s=0.05)
    j = _job("bad id!", ["true"], tmp_path)  # not a safe file name: the start fails
    ex.start(j, ("local-00000",), 0.0)
    assert ex.runs[j.id].pgid == 0
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    old_term = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        j.state = JobState.PREEMPTING
        ex.notify(j, checkpoint=True, deadline_s=1.0)
        ex.notify(j, checkpoint=False, deadline_s=1.0)
        ex.kill(j)  # SIGKILL to group 0 would end this test run
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGUSR1, old)
        signal.signal(signal.SIGTERM, old_term)
    assert got == [] and os.getpgid(0) > 0
    ex.poll()
    assert exits.seen == [("bad id!", 1, "failed")]  # its start failed (127), as before


def test_a_supervisor_dead_of_our_notice_before_it_could_start_the_command_was_killed(tmp_path):
    """A cancel right after a start, on a loaded machine, reached the supervisor while it was still
    starting (its handlers go in before the command starts): it died of our SIGTERM with no status
    written, and the run read ``failed`` (a backoff, the retry budget) though nothing of it ran.
    A death by a signal we did not send stays ``failed``."""
    import signal
    from types import SimpleNamespace

    from goodput.sched.live.local import Run

    def run(sig: int, sent: list[int]) -> Run:
        r = Run("j", 1, 0, 0, 0.0, ["local-00000"], {}, "", str(tmp_path / "no-status"), "")
        r.popen = SimpleNamespace(returncode=-sig)  # type: ignore[assignment]
        r.signalled, r.notified_t = sent, (time.time() if sent else 0.0)
        return r

    status = LocalExecutor._status_detail
    assert status(None, run(signal.SIGTERM, [signal.SIGTERM]))[0] == "killed"  # type: ignore[arg-type]
    assert status(None, run(signal.SIGTERM, []))[0] == "failed"  # type: ignore[arg-type]
    assert status(None, run(signal.SIGSEGV, [signal.SIGTERM]))[0] == "failed"  # type: ignore[arg-type]
