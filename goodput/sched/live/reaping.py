"""Child-subreaper helpers shared by the local supervisor (``local.py``) and the Slurm task
(``slurm_launch.py``): a launcher's workers orphaned by its death are reparented to us, so that the
run is over only when we say so, never when a stray process of it says so.

Standard library only, and nothing imported at module load beyond ``os``/``signal``/``time``: the Slurm
task imports it on a compute node before the job's own imports.
"""

from __future__ import annotations

import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def subreaper() -> bool:
    """Become the child subreaper (Linux): orphaned descendants are reparented to us, not to init."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans() -> list[int]:
    """Wait for every remaining descendant reparented to us, however long; their exit statuses (as
    Popen's). The local supervisor's rule: a local run holds its slots until its last process ends."""
    out: list[int] = []
    while True:
        try:
            _, st = os.wait()
        except ChildProcessError:
            return out
        except InterruptedError:
            continue
        out.append(os.waitstatus_to_exitcode(st))


def _ppids() -> dict[int, list[int]]:
    """parent pid -> its children (zombies included), from a scan of every ``/proc/<pid>/stat``."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it
        rest = raw[raw.rfind(b")") + 2 :].split()
        if len(rest) >= 2 and rest[1].isdigit():
            out.setdefault(int(rest[1]), []).append(int(name))
    return out


def children() -> list[int]:
    """The pids whose parent is this process now (zombies included), from ``/proc/<pid>/stat``: after a
    command is reaped, its children that were still alive are exactly the ones reparented here then."""
    return sorted(_ppids().get(os.getpid(), []))


def _reap_ready(into: dict[int, int]) -> None:
    """Every child that has ended, without blocking: pid -> status (as Popen's)."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return
        into[pid] = os.waitstatus_to_exitcode(st)


def wait_for(pids: list[int], timeout_s: float) -> dict[int, int]:
    """Wait up to ``timeout_s`` for ``pids`` (children of ours) to end; pid -> status of those that
    did. Any other child that ends meanwhile is reaped too (and not reported): a worker's own helper
    reparented here when the worker exits is no worker."""
    want = set(pids)
    got: dict[int, int] = {}
    end = time.monotonic() + max(0.0, timeout_s)
    while True:
        _reap_ready(got)
        if want <= got.keys() or time.monotonic() >= end:
            return {p: got[p] for p in pids if p in got}
        time.sleep(0.05)


def kill_orphans(timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process reparented to us (and, as each dies, its own children, reparented here
    in turn) and reap them all. Bounded by ``timeout_s``: a process that cannot be killed (another
    user's) is left, its pid returned for the caller to say so, rather than held for."""
    end = time.monotonic() + timeout_s
    reaped: dict[int, int] = {}
    while True:
        _reap_ready(reaped)
        kids = children()
        if not kids or time.monotonic() >= end:
            return kids
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        time.sleep(0.02)


def _state(pid: int) -> bytes:
    """The one-letter state of ``pid`` from ``/proc/<pid>/stat`` (b"" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return b""
    rest = raw[raw.rfind(b")") + 2 :]
    return rest[:1]


def _kids_of(pid: int) -> list[int] | None:
    """The children of ``pid`` (every thread's), from ``/proc/<pid>/task/*/children``; None where the
    kernel has no such file (CONFIG_PROC_CHILDREN off)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread is gone
            return None
        except (OSError, ValueError):
            continue
    return out


def kill_descendants(timeout_s: float = 60.0) -> list[int]:
    """SIGKILL every live descendant of this process, again and again, until a walk of the tree finds
    none but zombies (never reaped here: the caller's ``wait`` does that, so a pid we signal is never
    a recycled one of our children). A process that keeps forking and exiting, or ``setsid()``s, or
    ignores every catchable signal is caught all the same: while we live, as the child subreaper,
    each of its generations is re-parented to us when its parent exits, and the walk (a read of our
    ``children`` files, microseconds) runs again at once. Bounded by ``timeout_s`` (a process stuck
    in the kernel cannot die): the pids still alive then are returned."""
    me = os.getpid()
    start = time.monotonic()
    end = start + max(0.0, timeout_s)
    while True:
        live: list[int] = []
        fallback = None
        stack, seen = [me], {me}
        while stack:
            pid = stack.pop()
            kids = _kids_of(pid)
            if kids is None:  # no children files: one scan of /proc for the whole walk
                if fallback is None:
                    fallback = _ppids()
                kids = fallback.get(pid, [])
            for kid in kids:
                if kid in seen:
                    continue
                seen.add(kid)
                stack.append(kid)  # a zombie's children are live until re-parented: walk it too
                if _state(kid) in (b"Z", b"X", b""):
                    continue
                live.append(kid)
                try:
                    os.kill(kid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
        now = time.monotonic()
        if not live or now >= end:
            return live
        if now - start > 1.0:  # past the first second, what is left is dying slowly: do not spin
            time.sleep(0.005)
