"""Writers die with their trainer (issue 25, item 3): a trainer SIGKILLed while its save is being
written, or while its writer waits for the next job, leaves no writer process, no shared-memory
segment and no commit behind — on a machine whose cores are all busy, and even when the writer
gets no CPU at all (stopped): the kernel kills it, no code of its own has to run (real processes,
a real SIGKILL, the real /dev/shm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodput.ckpt.format.format import MANIFEST
from tests.forkserver import REPO, shared

SLOW_S = 10
pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm") or sys.platform != "linux", reason="needs Linux /dev/shm")

# argv: checkpoint, "writing" (killed inside its slow write) or "idle" (killed after the commit),
# "thread" to create the saver and make its first save on a thread that then ends
TRAINER = r"""
import sys, threading, time, torch
import goodput.ckpt as gc
path, when, where = sys.argv[1], sys.argv[2], sys.argv[3]
box = {}
def first():
    saver = box["saver"] = gc.AsyncSaver(mode="process")
    box["h"] = saver.save({"w": torch.ones(4 << 20)}, path + "-first")  # 16 MiB staged in shared memory
    box["h"].committed.result()
if where == "thread":  # the thread that started the writer ends: the writer must not die with it
    t = threading.Thread(target=first); t.start(); t.join()
    time.sleep(0.5)
else:
    first()
saver = box["saver"]
h = saver.save({"w": torch.full((4 << 20,), 2.0)}, path)
h.staged.result()
if when == "idle":
    h.committed.result()
print(saver._proc.proc.pid, saver.pool.name, flush=True)
time.sleep(600)
"""

BURN = "while True: pass"
PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit


def _doomed(pid: int) -> bool:
    """The kernel has the process on its way out: gone, a zombie, exiting (``PF_EXITING`` in
    /proc/PID/stat's flags), or a SIGKILL pending (the parent-death signal, delivered). What
    "noticed its parent's death" can mean for a process that may not run meanwhile: on a loaded
    machine an idle-priority writer can take more than a second to be scheduled and finish its
    exit, though nothing of its own runs after the signal."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except (FileNotFoundError, ProcessLookupError):
        return True
    state, flags = fields[0], int(fields[6])  # fields from the third on: state, ..., flags (9th)
    pending = int(status.get("SigPnd", "0").strip(), 16) | int(status.get("ShdPnd", "0").strip(), 16)
    return state in ("Z", "X") or bool(flags & PF_EXITING) or bool(pending & (1 << (signal.SIGKILL - 1)))


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:  # a zombie (not yet reaped by init) is gone too
            return any(line.split() == ["State:", "Z", "(zombie)"] for line in f)
    except FileNotFoundError:
        return True


@contextlib.contextmanager
def _cpu_load() -> Iterator[None]:
    """Two busy processes per core, at the trainer's priority, for as long as the block runs."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for b in burners:
            b.kill()
        for b in burners:
            b.wait(30)


def _kill_trainer(tmp_path: Path, when: str, where: str = "main", stop_writer: bool = False) -> float:
    """Start a trainer, SIGKILL it under CPU load; the seconds its writer outlived it."""
    ckpt = tmp_path / "ckpt"
    # every write lasts SLOW_S, the first save's too: longer than the 0.5 s from the second save's
    # staging to the kill plus the 5 s its writer has to die in, so no commit can be on time
    slow = str(SLOW_S) if when == "writing" else "0"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GOODPUT_CKPT_SLOW_WRITE_S": slow}
    # forked from a server that imported torch once, in this process's group as a plain child
    trainer = shared().popen(
        None, [str(ckpt), when, where], code=TRAINER, env=env, stdout=subprocess.PIPE, cwd=REPO, new_session=False
    )
    writer = 0
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline().split()
        assert len(line) == 2, f"the trainer did not start its save (exit {trainer.poll()})"
        writer, segment = int(line[0]), line[1]
        assert not _gone(writer), "the writer died before its trainer"
        assert (tmp_path / ("ckpt-first") / MANIFEST).exists()  # the first save committed
        with _cpu_load():
            time.sleep(0.5)  # the writer is inside its (slow) write, or waiting for a job
            if stop_writer:  # no CPU at all for it: nothing of its own can run
                os.kill(writer, signal.SIGSTOP)
            trainer.send_signal(signal.SIGKILL)
            trainer.wait(30)
            t0 = time.monotonic()  # the trainer is dead and reaped
            while not _doomed(writer) and time.monotonic() < t0 + 1.0:
                time.sleep(0.005)
            # the "notices its parent's death within a second": the kernel's signal, not a poll
            noticed = _doomed(writer)
            while not _gone(writer) and time.monotonic() < t0 + 5.0:
                time.sleep(0.01)
            outlived = time.monotonic() - t0
        assert noticed, f"no exit or SIGKILL for the writer within 1 s of its trainer's death ({when})"
        assert _gone(writer), f"the writer outlived its trainer by more than 5 s ({when}, stopped={stop_writer})"
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"goodput-{trainer.pid}-")]
        assert left == [] and not os.path.exists(f"/dev/shm/{segment}")
        if when == "writing":
            assert not (ckpt / MANIFEST).exists()  # aborted: nothing committed
        return outlived
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(30)
        if writer and not _gone(writer):
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGKILL)
        if trainer.stdout is not None:
            trainer.stdout.close()


def test_sigkilled_trainer_leaves_no_writer_no_segment_no_commit(tmp_path: Path) -> None:
    _kill_trainer(tmp_path, "writing")


def test_idle_writer_dies_with_its_trainer_under_load(tmp_path: Path) -> None:
    # an idle writer wakes at the pipe's end at idle priority: it must not need the CPU to die
    _kill_trainer(tmp_path, "idle")


@pytest.mark.slow  # ~15 s each under the load they make; the two above run by default
def test_writer_that_gets_no_cpu_still_dies_with_its_trainer(tmp_path: Path) -> None:
    # stopped: the extreme of an idle-priority process starved on a loaded machine; a watchdog
    # thread of its own never runs, the kernel's parent-death signal does
    _kill_trainer(tmp_path, "writing", stop_writer=True)


@pytest.mark.slow  # ~15 s each under the load they make; the two above run by default
def test_writer_started_from_an_ended_thread_lives_until_the_trainer_dies(tmp_path: Path) -> None:
    # the parent-death signal follows the thread that forked the writer: a saver first used on a
    # thread that has ended keeps its writer (the second save runs on it), and it still dies
    # with the trainer
    _kill_trainer(tmp_path, "writing", where="thread")
