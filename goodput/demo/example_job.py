"""A tiny training job for the live scheduler: ``python -m goodput.demo.example_job --steps N``.

It follows docs/PROTOCOL.md exactly as a real job would: a Checkpointer on ``GOODPUT_CKPT_ROOT``,
resume from the last committed checkpoint, commit reports through
:class:`goodput.sched.live.client.CommitReporter`, and on SIGUSR1/SIGTERM a checkpoint of the current
step and exit 75. The "model" is a small tensor with a deterministic update, so a test can check
that a preempted-and-resumed run ends with the same weights as an uninterrupted one. Every start
appends ``{"epoch", "restored_step"}`` to ``ROOT/starts.jsonl``; the finish writes ``ROOT/final.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-s", type=float, default=0.02, help="seconds each step sleeps (the 'work')")
    ap.add_argument("--interval", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this step (a job's own failure)")
    args = ap.parse_args()

    import torch

    from goodput.ckpt import Checkpointer
    from goodput.sched.live.client import CommitReporter

    root = Path(os.environ.get("GOODPUT_CKPT_ROOT") or "ckpt")
    ck = Checkpointer(root, interval=args.interval, keep=2, mode="thread", save_rng=False)
    state = {"w": torch.zeros(8, dtype=torch.float64)}
    start = ck.restore(state) or 0
    reporter = CommitReporter.from_env()
    if reporter is not None:
        ck.add_listener(reporter)
    with open(root / "starts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"epoch": int(os.environ.get("GOODPUT_JOB_EPOCH", "0")), "restored_step": start}) + "\n")
    for step in range(start, args.steps):
        if step == args.fail_at:
            return 3
        time.sleep(args.step_s)
        state["w"].mul_(0.5).add_(float(step + 1))  # deterministic: the final value depends only on the steps
        ck.maybe_save(step + 1, state)  # on a preemption signal: save this step, wait for the commit, exit 75
    ck.wait()
    ck.close()
    (root / "final.json").write_text(json.dumps({"steps": args.steps, "w": state["w"].tolist()}), encoding="utf-8")
    return 0


def expected_weights(steps: int) -> list[float]:
    w = 0.0
    for step in range(steps):
        w = w * 0.5 + float(step + 1)
    return [w] * 8


if __name__ == "__main__":
    raise SystemExit(main())
