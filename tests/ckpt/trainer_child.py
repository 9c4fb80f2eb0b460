"""A small training loop run as its own process by the preemption and crash tests.

python -m tests.ckpt.trainer_child ROOT RANK WORLD INIT_FILE [--steps N] [--interval K] ...
Each rank holds a shard whose every element equals ``step * 10 + rank`` after step ``step``, so
any checkpoint's content can be checked against its own step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("rank", type=int)
    ap.add_argument("world", type=int)
    ap.add_argument("init")
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--interval", type=int, default=1)
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--elems", type=int, default=1 << 20)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--fast", default=None, help="a tiered Checkpointer's fast tier (ROOT is then the durable one)")
    ap.add_argument("--drain-rate", default=None)
    ap.add_argument("--sync", action="store_true", help="use goodput.ckpt.save (blocking) instead of the Checkpointer")
    a = ap.parse_args()
    import torch
    import torch.distributed as dist

    import goodput.ckpt as gc

    torch.set_num_threads(1)
    if a.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank, world_size=a.world)
    n = a.elems
    shard = torch.zeros(n)
    state = {"w": gc.LocalShard(shard, (n * a.world,), (n * a.rank,)), "meta": {"step": 0}}
    if a.sync:
        start = 0
    else:
        ck = gc.Checkpointer(
            a.root, interval=a.interval, keep=2, mode=a.mode, if_busy="wait", timeout=60, fast=a.fast,
            drain_rate=a.drain_rate,
        )  # fmt: skip
        start = ck.restore(state) or 0
    print(f"READY {start}", flush=True)
    for step in range(start + 1, a.steps + 1):
        shard.fill_(float(step * 10 + a.rank))
        state["meta"]["step"] = step
        if a.sleep:
            time.sleep(a.sleep)
        if a.sync:
            gc.save(state, os.path.join(a.root, f"step_{step:09d}"), step=step)
        else:
            ck.maybe_save(step, state)
    if not a.sync:
        ck.close()
    if a.world > 1:
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
