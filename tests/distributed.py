"""Run a function on N real processes joined by a gloo process group (no mocks).

Each rank is a fresh process (spawn), rendezvous through a file, so tests need no ports. The
function's return value comes back per rank; an exception on any rank fails the test with that
rank's traceback.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp


def _entry(rank: int, world: int, init_file: str, fn: Callable, args: tuple, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        out.put((rank, "ok", result))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 300) -> list[Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="gp-pg-")
    os.close(fd)
    os.unlink(init_file)
    procs = [ctx.Process(target=_entry, args=(r, world, init_file, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world):
            rank, status, value = out.get(timeout=timeout)
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
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]
