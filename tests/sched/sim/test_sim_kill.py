"""A killed ``goodput sched sim`` leaves no process behind: its workers die with it.

Run as a user runs it (the console entry point in a subprocess), killed the way a timeout or a
closed terminal kills it: SIGKILL or SIGHUP to the parent alone, never to its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            pp = _ppid(int(d.name))
            if pp is not None:
                kids.setdefault(pp, []).append(int(d.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _workers(root: int) -> set[int]:
    """The pool's workers: leaf processes of multiprocessing that are not its resource tracker."""
    family = _descendants(root)
    parents = {_ppid(p) for p in family}
    out = set()
    for p in family - parents:
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
            out.add(p)
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_killed_sim_leaves_no_worker(sig: signal.Signals) -> None:
    exe = Path(sys.executable).with_name("goodput")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "goodput.cli.main"]
    # big enough that the two workers are busy when the parent is killed
    proc = subprocess.Popen(
        [*cmd, "sched", "sim", "--jobs", "20000", "--nodes", "512", "--workers", "2", "--policy", "goodput",
         "--policy", "fifo-no-backfill", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the signal below reaches the parent alone
    )  # fmt: skip
    everyone: set[int] = set()
    try:
        workers: set[int] = set()
        for _ in range(600):  # the workers are spawned once the workload is drawn
            workers = _workers(proc.pid)
            if len(workers) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(2)  # into their simulations, past any start-up
        assert proc.poll() is None, "the simulation ended before it could be killed"
        assert len(workers) >= 2, f"no workers were started: {workers}"
        assert len(_workers(proc.pid)) >= 2
        everyone = _descendants(proc.pid)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in everyone):
            time.sleep(0.1)
        left = sorted(p for p in everyone if _alive(p))
        assert not left, f"processes outlived the killed parent: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in everyone:  # a failed run must not leave them burning the cores either
            if _alive(p):
                os.kill(p, signal.SIGKILL)
