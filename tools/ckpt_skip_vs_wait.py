"""The stall-vs-age trade-off of a Checkpointer's ``if_busy`` (docs/ASYNC.md): a loop of
``--steps`` steps of ``--step-s`` seconds saving every step (interval=1) to a storage whose write
lasts ``--write-s`` (goodput.ckpt.saving.background.SLOW_WRITE_ENV), once with "skip" and once with
"wait". Prints, per policy: the loop's total stall (time inside maybe_save), the worst and mean
age of the newest commit at each step (in steps and seconds), commits and skips.

    python tools/ckpt_skip_vs_wait.py --steps 60 --step-s 0.05 --write-s 0.5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def run(policy: str, steps: int, step_s: float, mb: int) -> dict:
    import torch

    import goodput.ckpt as gc

    state = {"w": torch.zeros(mb << 18)}  # mb MiB of float32
    with tempfile.TemporaryDirectory() as d:
        ck = gc.Checkpointer(d, interval=1, keep=2, if_busy=policy, mode="process")
        newest: list = [0, time.monotonic()]  # step, when that step's state was asked for
        asked: dict = {}
        ck.add_listener(lambda ev: newest.__setitem__(slice(0, 2), [ev.step, asked[ev.step]]))
        stall = 0.0
        ages_steps, ages_s = [], []
        t_loop = time.monotonic()
        for step in range(1, steps + 1):
            time.sleep(step_s)
            state["w"].fill_(step)
            asked[step] = time.monotonic()
            t0 = time.perf_counter()
            ck.maybe_save(step, state)
            stall += time.perf_counter() - t0
            ages_steps.append(step - newest[0])
            ages_s.append(time.monotonic() - newest[1])
        loop_s = time.monotonic() - t_loop
        t0 = time.perf_counter()
        ck.close(steps, state)
        skipped = len(ck.skipped)
        commits = len(ck.timings)
    return {
        "policy": policy,
        "loop_s": loop_s,
        "stall_s": stall,
        "close_s": time.perf_counter() - t0,
        "age_steps_max": max(ages_steps),
        "age_steps_mean": sum(ages_steps) / len(ages_steps),
        "age_s_max": max(ages_s),
        "commits": commits,
        "skipped": skipped,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--write-s", type=float, default=0.5)
    ap.add_argument("--mb", type=int, default=16)
    a = ap.parse_args()
    from goodput.ckpt.saving.background import SLOW_WRITE_ENV

    os.environ[SLOW_WRITE_ENV] = str(a.write_s)
    for policy in ("skip", "wait"):
        r = run(policy, a.steps, a.step_s, a.mb)
        print(
            f"{r['policy']}: loop {r['loop_s']:.2f} s (compute {a.steps * a.step_s:.2f} s), stall {r['stall_s']:.2f} s, "
            f"newest commit at most {r['age_steps_max']} steps / {r['age_s_max']:.2f} s behind "
            f"(mean {r['age_steps_mean']:.1f} steps), {r['commits']} commits, {r['skipped']} skipped"
        )


if __name__ == "__main__":
    main()
