"""A data-parallel training job for the live scheduler, run under torchrun (gloo, CPU).

::

    torchrun --nproc-per-node=K -m goodput.demo.example_dist_job --steps N
    torchrun -m goodput.demo.example_dist_job --steps N     # K from PET_NPROC_PER_NODE (the executor sets it)
    python -m goodput.demo.example_dist_job --steps N       # one process: RANK 0 of WORLD_SIZE 1

The model is the project demo's TinyGPT (``goodput.demo.worker``): every step's global batch is
the same 8 samples whatever the world size (2 ranks take 4 each and all-reduce; 1 rank computes
both halves and sums them in the same order), so a run resumed on another number of workers
follows the same arithmetic. State = model + AdamW state, saved with the sharded
``goodput.ckpt.Checkpointer`` (every ``--interval`` steps, thread writer) under
``GOODPUT_CKPT_ROOT`` and restored from ``goodput.ckpt.latest(root)`` on any world size (the
checkpoint reshards: replicated tensors are written once and read by every rank). Rank 0 reports
commits (:class:`goodput.sched.live.client.CommitReporter`). On SIGUSR1/SIGTERM every rank agrees at
the next step, the current step is saved and committed, and each worker exits 75.

Files under the root: ``starts.jsonl`` (one line per start: epoch, world, restored step),
``final.pt`` (the final model state, rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def build(seed: int = 0) -> tuple[Any, Any]:
    """The model and optimizer as every start builds them (Adam state created by a zero-lr step)."""
    import torch

    from goodput.demo.worker import TinyGPT

    torch.manual_seed(seed)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    lr = opt.param_groups[0]["lr"]
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    opt.param_groups[0]["lr"] = lr
    for s in opt.state.values():
        s["step"].zero_()
    opt.zero_grad(set_to_none=True)
    return model, opt


def reference(steps: int | list[int], seed: int = 0) -> Any:
    """An uninterrupted run on one process, in this process: the final model state (a list of
    steps: ``{step: state}`` from one pass)."""
    import torch

    from goodput.demo.worker import train_step

    want = sorted({steps} if isinstance(steps, int) else set(steps))
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out: dict[int, dict[str, Any]] = {}
    try:
        model, opt = build(seed)
        for step in range(want[-1] if want else 0):
            train_step(model, opt, step, 0, 1)
            if step + 1 in want:
                out[step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    if 0 in want:
        out[0] = {k: v.detach().clone() for k, v in build(seed)[0].state_dict().items()}
    return out[steps] if isinstance(steps, int) else out


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, float]:
    """(bitwise equal, worst relative difference) of two model states."""
    import torch

    bitwise = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    worst = 0.0
    for k in a.keys() & b.keys():
        d = (a[k].double() - b[k].double()).abs().max().item()
        worst = max(worst, d / max(a[k].double().abs().max().item(), 1e-12))
    return bitwise, worst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-s", type=float, default=0.0, help="seconds each step sleeps besides its compute")
    ap.add_argument("--interval", type=int, default=5, help="checkpoint every this many steps")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    import torch.distributed as dist

    from goodput.ckpt import Checkpointer
    from goodput.demo.worker import train_step
    from goodput.sched.live.client import CommitReporter

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")  # env://: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (torchrun's)
    root = Path(os.environ.get("GOODPUT_CKPT_ROOT") or "ckpt")
    model, opt = build(args.seed)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    ck = Checkpointer(root, interval=args.interval, keep=2, mode="thread", save_rng=False)
    start = ck.restore(state)
    if start is not None:
        opt.load_state_dict(state["optim"])
    start = start or 0
    reporter = CommitReporter.from_env() if rank == 0 else None
    if reporter is not None:
        ck.add_listener(reporter)
    if rank == 0:
        with open(root / "starts.jsonl", "a", encoding="utf-8") as f:
            epoch = int(os.environ.get("GOODPUT_JOB_EPOCH", "0"))
            f.write(json.dumps({"epoch": epoch, "world": world, "restored_step": start, "t": time.time()}) + "\n")
    for step in range(start, args.steps):
        train_step(model, opt, step, rank, world)
        if args.step_s:
            time.sleep(args.step_s)
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        ck.maybe_save(step + 1, state)  # on a preemption signal: save this step, wait for the commit, exit 75
    ck.wait()
    ck.close()
    if rank == 0:
        tmp = root / "final.pt.tmp"
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, tmp)
        os.replace(tmp, root / "final.pt")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
