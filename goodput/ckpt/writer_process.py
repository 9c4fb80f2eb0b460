"""The persistent writer process of an asynchronous save, and the pipe that feeds it.

Started with ``python -m goodput.ckpt.writer_process`` (not multiprocessing's spawn, which would
re-run the user's training script), it maps the trainer's shared staging buffer and runs each
job of :mod:`goodput.ckpt.background` from it: checksumming and writing happen outside the
trainer's interpreter lock, at idle CPU and I/O priority. Jobs and answers are length-prefixed
msgpack on stdin and stdout. numpy only: the process never imports torch.

The writer dies with its trainer: a watchdog thread, kept at normal priority while the writing
thread runs at idle priority (a loaded machine must not starve it), sees the trainer gone within
:data:`WATCH_S` and ends the process at once: nothing more is written and nothing is committed
(a save whose trainer died is not the state of any step it finished), and the trainer's staging
segments are unlinked (their memory is freed when the last mapping, this process's, goes).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .background import run_job

TRAINER_ENV = "GOODPUT_TRAINER_PID"
WATCH_S = 0.2
SHM_DIR = "/dev/shm"


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
        import subprocess
        import sys

        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[TRAINER_ENV] = str(os.getpid())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "goodput.ckpt.writer_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
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
            raise RuntimeError(f"the writer process exited (status {self.proc.poll()})")
        return out

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


def serve() -> None:
    """The writer process's loop: one job at a time, from the trainer's shared staging buffer."""
    import sys

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    attached: dict[str, Any] = {}
    trainer = int(os.environ.get(TRAINER_ENV) or os.getppid())
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
    for shm in attached.values():
        with contextlib.suppress(BufferError):
            shm.close()


def _watch(trainer: int) -> None:
    """End this process within :data:`WATCH_S` of the trainer's death (it is then re-parented)."""
    import threading
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
    # not PR_SET_PDEATHSIG: the kernel sends it when the *thread* that started the writer ends,
    # and a trainer may start it from a thread that ends before the write does


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
    """Stay out of the trainer's way: CPU only when it is idle, disk in the idle class."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(19)
    with contextlib.suppress(OSError, FileNotFoundError):
        import subprocess

        subprocess.run(["ionice", "-c", "3", "-p", str(os.getpid())], check=False, capture_output=True, timeout=5)


def _attach(name: str) -> Any:
    """Attach to the trainer's segment without letting this process's resource tracker own it."""
    from multiprocessing import resource_tracker, shared_memory

    shm = shared_memory.SharedMemory(name=name)
    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


if __name__ == "__main__":
    serve()
