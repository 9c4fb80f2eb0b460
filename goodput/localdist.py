"""Run a function on N local processes joined by a real gloo process group.

Used by the demo, the benchmarks and the tests: fresh processes (spawn), rendezvous through a
file (no ports), each rank's return value collected, any rank's exception re-raised with its
traceback. Loopback only, nothing mocked.
"""

from __future__ import annotations

import contextlib
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any


def _entry(rank: int, world: int, init_file: str, fn: Callable, args: tuple, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class RankFailure(RuntimeError):
    """One or more ranks raised; the message holds each one's traceback."""


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 600) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` processes; returns the results in rank order."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="goodput-pg-")
    os.close(fd)
    os.unlink(init_file)
    procs = [ctx.Process(target=_entry, args=(r, world, init_file, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            try:
                rank, status, value = out.get(timeout=timeout)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                raise RankFailure(
                    f"no answer from all ranks within {timeout:.0f} s (ranks that died: {dead})"
                ) from None
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        if os.path.exists(init_file):
            os.unlink(init_file)
    if errors:
        raise RankFailure("\n".join(errors))
    return [results[r] for r in range(world)]
