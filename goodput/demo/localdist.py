"""Run a function on N local processes joined by a real gloo process group.

Used by the demo, the benchmarks and the tests: fresh processes (forked from a server that imported
torch once, multiprocessing's forkserver; spawn where there is none), rendezvous through a
file (no ports), each rank's return value collected, any rank's exception re-raised with its
traceback; when one rank fails or dies, the others (stuck in a collective) are killed after a
short grace period instead of hanging. Loopback only, nothing mocked.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any


class RankFailure(RuntimeError):
    """One or more ranks raised or died; the message holds each one's traceback."""


def _entry(rank: int, world: int, init_file: str, fn: Callable, args: tuple, out: Any, env: dict, cwd: str) -> None:
    # a forkserver child starts with the server's environment and directory: take the caller's
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint"]


def _context() -> Any:
    """Fresh processes forked from a server that imported torch once (a spawned rank spends
    seconds importing it); spawn where there is no forkserver."""
    import multiprocessing

    import torch.multiprocessing as mp

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 3600) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh processes; results in rank order."""
    ctx = _context()
    out = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="goodput-pg-")
    os.close(fd)
    os.unlink(init_file)
    procs = [
        ctx.Process(target=_entry, args=(r, world, init_file, fn, args, out, dict(os.environ), os.getcwd()))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    grace: float | None = None
    try:
        while len(results) + len(errors) < world:
            now = time.monotonic()
            if now > deadline:
                errors.append(f"timed out after {timeout:.0f} s")
                break
            if grace is not None and now > grace:
                break
            try:
                rank, status, value = out.get(timeout=0.5)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if p.exitcode not in (None, 0) and r not in results:
                        errors.append(f"--- rank {r} ---\nprocess died with exit code {p.exitcode}")
                        grace = grace or time.monotonic() + 10
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
                grace = grace or time.monotonic() + 10
    finally:
        for p in procs:
            p.join(timeout=0 if errors else 30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        if os.path.exists(init_file):
            os.unlink(init_file)
    if errors:
        raise RankFailure("\n".join(dict.fromkeys(errors)))
    return [results[r] for r in range(world)]
