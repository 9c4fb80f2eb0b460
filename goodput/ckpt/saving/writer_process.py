"""The persistent writer process of an asynchronous save, and the pipe that feeds it.

Started with ``python -m goodput.ckpt.saving.writer_process`` (not multiprocessing's spawn, which would
re-run the user's training script), it maps the trainer's shared staging buffer and runs each
job of :mod:`goodput.ckpt.saving.background` from it: checksumming and writing happen outside the
trainer's interpreter lock, at a low CPU and I/O priority. Jobs and answers are length-prefixed
msgpack on stdin and stdout. numpy only: the process never imports torch.

The writer dies with its trainer, by the kernel's hand: the writer asks for ``SIGKILL`` at its
parent's death (``PR_SET_PDEATHSIG``), and the trainer starts every writer from one thread that
lives as long as the trainer (the kernel sends the signal when the *thread* that forked the
writer ends, not the process). No code of the writer has to run for it to die: a watchdog
thread of its own waits behind whichever thread holds the interpreter lock, here the writing
thread, starved at idle priority on a loaded machine (a trainer killed under load once left its
writer alive 10-15 s); and the priority stays high enough for the kernel's kill to take effect
within a second under load (see :func:`_lower_priority`). Nothing more is written
and nothing is committed (a save whose trainer died is not the state of any step it finished);
the staging segment's name is removed once the writer has mapped it, so its memory goes with the
last mapping, the writer's (a segment whose trainer died before the writer mapped it is removed
by the trainer's resource tracker, or by :func:`goodput.ckpt.saving.staging.sweep_dead_segments`). A
watchdog thread remains for systems without ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .background import run_job

TRAINER_ENV = "GOODPUT_TRAINER_PID"
WATCH_S = 0.2
SHM_DIR = "/dev/shm"
PR_SET_PDEATHSIG = 1
NICE = 10  # see _lower_priority
SEGMENT = re.compile(r"^goodput-\d+-[0-9a-f]{8}\Z")  # goodput.staging's names; nothing else is mapped


def _recv(f: Any) -> Any:
    head = f.read(8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    return msgspec.msgpack.decode(f.read(n))


def _send(f: Any, obj: Any) -> None:
    raw = msgspec.msgpack.encode(obj)
    f.write(len(raw).to_bytes(8, "little") + raw)
    f.flush()


class WriterProcess:
    """The trainer's handle on its writer process."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[TRAINER_ENV] = str(os.getpid())
        self.proc: subprocess.Popen = _spawn(
            lambda: subprocess.Popen(
                [sys.executable, "-m", "goodput.ckpt.saving.writer_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        )
        self.attached: str | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def attach(self, shm_name: str) -> None:
        """Map the staging segment now, so that its name can be unlinked at once: a killed job
        then leaks no shared memory (the mappings keep it alive, nothing else does)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        _send(self.proc.stdin, ["attach", shm_name])
        out = _recv(self.proc.stdout)
        if not out or not out.get("ok"):
            raise RuntimeError(f"the writer process could not map the staging buffer: {out and out.get('error')}")
        self.attached = shm_name

    def run(self, job: dict[str, Any], shm_name: str, size: int) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        _send(self.proc.stdin, [job, shm_name, size])
        out = _recv(self.proc.stdout)
        if out is None:
            raise RuntimeError(f"the writer process (pid {self.proc.pid}) {self._how_it_ended()}")
        return out

    def _how_it_ended(self) -> str:
        """Its pipe closed: how it ended (a signal names the killer: the OOM killer's SIGKILL, a
        person's), waiting a moment for the exit status that follows the pipe's end."""
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its pipe and is still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"was killed by {name}" + (" (the OOM killer's, or a person's)" if -rc == signal.SIGKILL else "")
        return f"exited with status {rc}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
        with contextlib.suppress(Exception):
            if self.proc.stdout is not None:
                self.proc.stdout.close()


_spawner_lock = threading.Lock()
_spawner: tuple[int, queue.SimpleQueue] | None = None


def _spawn(start: Any) -> Any:
    """Run ``start()`` (which forks the writer) on the process's spawner thread, started once and
    never ended: the writer's parent-death signal is tied to the thread that forked it, and a
    saver's own threads come and go (a closed saver's, a lazily started one's)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or a fork's copy of none
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_spawn_loop, args=(jobs,), name="goodput-writer-spawner", daemon=True).start()
            _spawner = (os.getpid(), jobs)
        jobs = _spawner[1]
    done: Future = Future()
    jobs.put((start, done))
    return done.result()


def _forget_spawner() -> None:
    """A forked child has none of its parent's threads, and a lock held by one of them at the
    fork would never be released in the child."""
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


def _spawn_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        start, done = jobs.get()
        try:
            done.set_result(start())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)


def _die_with_parent(trainer: int) -> None:
    """Have the kernel SIGKILL this process when the trainer's spawner thread ends (with the
    trainer, however it dies); then check the trainer did not die before the request."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != trainer:
        _die(trainer)


def serve() -> None:
    """The writer process's loop: one job at a time, from the trainer's shared staging buffer."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    attached: dict[str, Any] = {}
    trainer, named = os.getppid(), os.environ.get(TRAINER_ENV) or ""
    if named != str(trainer):  # the trainer is gone already (or this was not started by one)
        if named.isdigit():
            _die(int(named))
        os._exit(70)
    _die_with_parent(trainer)
    _watch(trainer)  # before the priority drops: the watchdog thread keeps the normal one
    _lower_priority()

    def attach(name: str) -> Any:
        shm = attached.get(name)
        if shm is None:
            for old in attached.values():  # a grown buffer replaces the old one: one mapping at a time
                with contextlib.suppress(BufferError):
                    old.close()
            attached.clear()
            shm = attached[name] = _attach(name)
        return shm

    while True:
        msg = _recv(inp)
        if msg is None:
            break
        if msg[0] == "attach":
            try:
                attach(msg[1])
                _send(out, {"ok": True})
            except BaseException as e:  # noqa: BLE001
                _send(out, {"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        job, shm_name, size = msg
        try:
            shm = attach(shm_name)
            buf = np.ndarray((size,), np.uint8, buffer=shm.buf)
            res = run_job(job, buf)
            del buf
        except BaseException as e:  # noqa: BLE001
            res = {"ok": False, "error": f"writer process: {type(e).__name__}: {e}", "bytes": 0, "timings": {}}
        _send(out, res)
    if os.getppid() != trainer:
        _die(trainer)  # the pipe ended with the trainer
    for shm in attached.values():
        with contextlib.suppress(BufferError):
            shm.close()
    # the trainer closed the pipe: end now, without the interpreter's teardown (at a low priority
    # on a loaded machine that alone took seconds)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(0)


def _watch(trainer: int) -> None:
    """End this process within :data:`WATCH_S` of the trainer's death (it is then re-parented)
    where the kernel cannot be asked to, if this process is given the CPU and the lock."""
    import time

    def gone() -> bool:
        return os.getppid() != trainer

    def run() -> None:
        while not gone():
            time.sleep(WATCH_S)
        _die(trainer)

    if gone():
        _die(trainer)
    threading.Thread(target=run, name="goodput-writer-watchdog", daemon=True).start()


def _die(trainer: int) -> None:
    """The trainer is gone: unlink its staging segments (normally unlinked already, once mapped;
    one created just before it died is not) and exit without another write."""
    with contextlib.suppress(OSError):
        for n in os.listdir(SHM_DIR):
            if n.startswith(f"goodput-{trainer}-"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, n))
    os._exit(70)


def _lower_priority() -> None:
    """Stay out of the trainer's way, but not so far that the writer cannot die: a process dies
    only when its threads are given the CPU to exit, and under a full load a SIGKILLed writer at
    idle CPU priority took up to 6 s to go (nice 19: 2.7 s; batch at nice 10: 0.37 s, 4 busy
    processes on 2 busy cores). Disk: the lowest best-effort level, not the idle class, where a
    write blocked behind the trainer's I/O would hold the dying writer just as long."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), NICE))
    with contextlib.suppress(OSError, FileNotFoundError):
        import subprocess

        subprocess.run(
            ["ionice", "-c", "2", "-n", "7", "-p", str(os.getpid())], check=False, capture_output=True, timeout=5
        )


class _Mapping:
    """The trainer's segment, mapped. Not ``SharedMemory(name=...)``: on Python < 3.13 that
    registers the name with a resource tracker, a process of this one's that outlives it."""

    def __init__(self, name: str) -> None:
        import mmap

        if not SEGMENT.match(name):
            raise ValueError(f"not a staging segment name: {name!r}")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._mmap = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        self.buf.release()  # BufferError while an array still uses it: the mapping stays
        self._mmap.close()


def _attach(name: str) -> Any:
    return _Mapping(name)


if __name__ == "__main__":
    serve()
