"""Start ``python -m MODULE ARGS`` programs as processes forked from a server that imported torch once.

A fresh interpreter spends 1.5-5 s importing torch, and the crash tests start dozens of trainers.
The server imports the heavy modules once and forks one child per request, the way
:mod:`goodput.demo.localdist` starts ranks from multiprocessing's forkserver. Unlike a
multiprocessing child, each child here is the program a test would have started with
``subprocess.Popen([sys.executable, "-m", MODULE, *ARGS], start_new_session=True)``: its own
session and process group (``os.killpg`` on its pid takes everything it started), the module as
``__main__`` with the caller's arguments, environment, directory and standard streams, and an
interpreter exit that joins its threads and runs its ``atexit`` functions.

The server stays single-threaded (forking a process whose other threads may hold a lock leaves
that lock held forever in the child): it reaps its children from a ``select`` loop woken by
``SIGCHLD`` and reports each exit status to the test that started the child.

Protocol: one SOCK_SEQPACKET pair carries requests (JSON, with the child's stdin, stdout, stderr
and a status socket as passed descriptors); the child sends ``pid N`` on its status socket once it
leads its own session (unless asked not to start one), and the server sends ``exit CODE`` there once it has reaped it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
TORCH = ("torch", "torch.distributed", "goodput.ckpt")
_MAX_REQUEST = 1 << 20


class ForkServer:
    """A server process that has imported ``preload``; :meth:`popen` forks a child from it."""

    def __init__(self, preload: tuple[str, ...] = TORCH) -> None:
        self._ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", str(theirs.fileno()), *preload],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                cwd=REPO,
            )
        finally:
            theirs.close()
        self._lock = threading.Lock()

    def popen(
        self,
        module: str | None,
        args: list[str],
        *,
        code: str | None = None,
        stdout: int | IO | None = None,
        stderr: int | IO | None = None,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        new_session: bool = True,
    ) -> Child:
        """Like ``subprocess.Popen([sys.executable, "-m", module, *args], start_new_session=True,
        stdin=DEVNULL, text=True)``, or ``-c code`` when ``module`` is None; ``stdout`` and
        ``stderr`` are a file, a descriptor, ``subprocess.PIPE`` (stdout only: then read
        ``child.stdout``) or None (this process's). Without ``new_session`` the child stays in the
        server's process group, which is this process's."""
        assert (module is None) != (code is None), "a module or code"
        opened: list[int] = []  # ours to close once the server holds its copies
        out_r = None
        if stdout == subprocess.PIPE:
            out_r, out_w = os.pipe()
            opened.append(out_w)
            stdout = out_w
        null = os.open(os.devnull, os.O_RDONLY)
        opened.append(null)
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [null, _fd(stdout, 1), _fd(stderr, 2), theirs.fileno()]
            req = {
                "module": module,
                "code": code,
                "args": list(args),
                "cwd": str(cwd or os.getcwd()),
                "env": dict(env or os.environ),
                "new_session": new_session,
            }
            with self._lock:
                socket.send_fds(self._ctrl, [json.dumps(req).encode()], fds)
        except BaseException:
            status.close()
            if out_r is not None:
                os.close(out_r)
            raise
        finally:
            theirs.close()
            for fd in opened:
                os.close(fd)
        child = Child(status, self._proc, os.fdopen(out_r, "r") if out_r is not None else None)
        child._start()
        return child

    def close(self) -> None:
        """The server exits at the end of its request stream (and kills any child still running)."""
        self._ctrl.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def shared() -> ForkServer:
    """One server for every test module of this process; it exits with the process (its request
    stream ends), killing any child still running."""
    server = ForkServer()
    atexit.register(server.close)
    return server


def _fd(f: int | IO | None, default: int) -> int:
    if f is None:
        return default
    return f if isinstance(f, int) else f.fileno()


class Child:
    """The part of ``subprocess.Popen`` the tests use: pid, stdout, poll, wait, returncode."""

    def __init__(self, status: socket.socket, server: subprocess.Popen, stdout: IO | None) -> None:
        self._status, self._server, self.stdout = status, server, stdout
        self.pid = 0
        self.returncode: int | None = None

    def _start(self) -> None:
        msg = self._recv(timeout=120)
        if msg is None or not msg.startswith("pid "):
            self._status.close()
            if self.stdout is not None:
                self.stdout.close()
            raise RuntimeError(f"the fork server did not start the child ({msg!r}, server exit {self._server.poll()})")
        self.pid = int(msg.split()[1])

    def _recv(self, timeout: float | None) -> str | None:
        if not select.select([self._status], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0)
        raw = self._status.recv(64)
        return raw.decode() if raw else None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        msg = self._recv(timeout)
        if msg is None or not msg.startswith("exit "):
            raise RuntimeError(f"the fork server lost child {self.pid} ({msg!r}, server exit {self._server.poll()})")
        self.returncode = int(msg.split()[1])
        self._status.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(timeout=0)
        return self.returncode


# --- the server -------------------------------------------------------------------------------


def _serve(ctrl: socket.socket) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # its C handler writes to wake_w
    live: dict[int, socket.socket] = {}
    try:
        while True:
            ready, _, _ = select.select([ctrl, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 4096)
                _reap(live)
            if ctrl in ready:
                msg, fds, _flags, _addr = socket.recv_fds(ctrl, _MAX_REQUEST, 4)
                if not msg:
                    return
                status = socket.socket(fileno=fds[3])
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(msg), fds[:3], status, [ctrl, *live.values()], (wake_r, wake_w))
                for fd in fds[:3]:
                    os.close(fd)
                live[pid] = status
                _reap(live)
    finally:
        for pid in live:  # the tests have gone: nothing they started outlives them
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _reap(live: dict[int, socket.socket]) -> None:
    while live:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = live.pop(pid, None)
        if status is not None:
            with contextlib.suppress(OSError):  # the test may have stopped listening
                status.send(f"exit {os.waitstatus_to_exitcode(st)}".encode())
            status.close()


def _child(req: dict[str, Any], fds: list[int], status: socket.socket, close: list, wake: tuple[int, int]) -> None:
    """Become ``python -m MODULE ARGS`` in a session of its own; never returns."""
    code = 1
    try:
        if req["new_session"]:
            os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in close:
            s.close()
        for fd in wake:
            os.close(fd)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            if fd > 2:
                os.close(fd)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - the interpreter's own streams
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", 1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"] if req["module"] else ""  # as python -m and python -c put it
        sys.argv = [req["module"] or "-c", *req["args"]]
        if "numpy.random" in sys.modules:  # a fresh interpreter draws its own seed
            sys.modules["numpy.random"].seed()
        status.send(f"pid {os.getpid()}".encode())  # a session leader now: os.killpg reaches all it starts
        status.close()
        code = _run(req["module"], req["code"])
    except BaseException:  # noqa: BLE001 - on the child's stderr, and its exit status says so
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                f.flush()
        os._exit(code)


def _run(module: str | None, source: str | None) -> int:
    """Run the module (or the source) as ``__main__`` and end as the interpreter would: the exit
    status of its ``SystemExit``, its non-daemon threads joined, its ``atexit`` functions run."""
    import runpy
    import types

    code = 0
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(source or "", "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports it
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    return code


def main() -> None:
    fd, *preload = sys.argv[1:]
    ctrl = socket.socket(fileno=int(fd))
    import importlib

    for name in preload:
        importlib.import_module(name)
    _serve(ctrl)


if __name__ == "__main__":
    main()
