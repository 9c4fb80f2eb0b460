"""``goodput bench ckpt --dir DURABLE --fast DIR``: a tiered Checkpointer against a local-only one
writing to the same fast directory, in the same run.

Goals (the issue's): the tiered save's stall and its fast-tier commit within 1.1 x the local-only
save's; a restore from the fast tier >= 0.9 x the throughput of the local-only restore. The drain
to the durable tier (an object store or a shared file system) is timed too, and between repeats
the bench waits for it, and before every phase for quiet cores (:func:`settle`), so that each save is measured alone. Each Checkpointer saves once before
the timed repeats (its first save allocates the staging buffer and starts the writer); the goals
use the median of each repeat's paired ratio (the two saves of one repeat run back to back).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STALL_GOAL = 1.1
COMMIT_GOAL = 1.1
RESTORE_GOAL = 0.9


def settle(idle: float = 0.75, window: float = 0.25, limit: float = 15.0) -> float:
    """Wait until the cores are at least ``idle`` idle over a ``window`` (at most ``limit``
    seconds); the seconds waited. An object store on the same host goes on writing back what a
    drain sent it after acknowledging it, and a save timed in that time measures the store."""
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        if psutil.cpu_percent(interval=window) <= 100 * (1 - idle):
            break
    return time.perf_counter() - t0


def _state(total: int, ntensors: int) -> dict[str, torch.Tensor]:
    n = max(1, total // 4 // ntensors)
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.rand(n, generator=g) for i in range(ntensors)}


def run(
    durable: str,
    fast: str,
    total: int,
    *,
    ntensors: int = 8,
    repeat: int = 3,
    drain_rate: str | None = None,
    settle_s: float = 15.0,
    on_phase: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    from goodput import ckpt as gc

    tag = f"goodput-bench-{uuid.uuid4().hex[:8]}"
    fast_base = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=fast))
    durable_root = f"{durable.rstrip('/')}/{tag}"
    local_root, tier_root = fast_base / "local", fast_base / "tiered"
    state = _state(total, ntensors)
    nbytes = sum(t.numel() * 4 for t in state.values())
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    phases = ["local save", "tiered save", "local restore", "tiered restore"]
    stall: dict[str, list[float]] = {"local save": [], "tiered save": []}
    commit: dict[str, list[float]] = {"local save": [], "tiered save": []}
    restore: dict[str, list[float]] = {"local restore": [], "tiered restore": []}
    drain: list[float] = []
    settled: list[float] = []  # seconds waited for quiet cores before each phase
    tiers_seen: list[str | None] = []
    local = gc.Checkpointer(local_root, interval=1, keep=2)
    tiered = gc.Checkpointer(durable_root, fast=tier_root, interval=1, keep=2, fast_keep=2, drain_rate=drain_rate)
    i = 0
    try:
        for ck in (local, tiered):  # warm-up: not timed
            h = ck.save(1, state)
            assert h is not None
            h.result()
        tiered.wait_drained(3600)
        for r in range(repeat):
            step = r + 2
            # who goes first alternates: the second of a pair runs on a machine the first warmed
            order = phases if r % 2 == 0 else [phases[1], phases[0], phases[3], phases[2]]
            for ph in order:
                if on_phase:
                    on_phase(i, repeat * len(phases), f"{ph} (repeat {r + 1}/{repeat})")
                i += 1
                settled.append(settle(limit=settle_s) if settle_s > 0 else 0.0)
                if ph.endswith("save"):
                    ck = local if ph == "local save" else tiered
                    h = ck.save(step, state)
                    assert h is not None
                    tm = h.result()
                    stall[ph].append(tm.stall_s)
                    commit[ph].append(tm.total_s)
                    if ck is tiered:
                        t0 = time.perf_counter()
                        if not tiered.wait_drained(3600):
                            raise RuntimeError("the drain did not finish within an hour")
                        drain.append(time.perf_counter() - t0)
                        last = tiered.drainer.history[-1] if tiered.drainer else None
                        if last is None or not last.ok:
                            raise RuntimeError(f"the drain failed: {last.error if last else 'no drain ran'}")
                        drain[-1] = last.drain_s
                else:
                    for t in out.values():
                        t.zero_()
                    if ph == "local restore":
                        ck = gc.Checkpointer(local_root, interval=1, mode="thread")
                    else:
                        ck = gc.Checkpointer(durable_root, fast=tier_root, interval=1, mode="thread")
                    t0 = time.perf_counter()
                    got = ck.restore(out)
                    restore[ph].append(time.perf_counter() - t0)
                    if ph == "tiered restore":
                        tiers_seen.append(ck.restored_tier)
                    ck.close()
                    if got != step or not all(torch.equal(out[k], state[k]) for k in state):
                        raise RuntimeError(f"{ph} returned other values (step {got}, wanted {step})")
    finally:
        local.close()
        tiered.close()
        shutil.rmtree(fast_base, ignore_errors=True)
        from goodput.ckpt.storage.location import storage_for

        storage_for(durable_root).remove_tree(Path(durable_root))

    def paired(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b))

    stall_ratio = paired(stall["tiered save"], stall["local save"])
    commit_ratio = paired(commit["tiered save"], commit["local save"])
    restore_ratio = paired(restore["local restore"], restore["tiered restore"])
    return {
        "durable": durable,
        "fast": fast,
        "bytes": nbytes,
        "tensors": ntensors,
        "repeat": repeat,
        "drain_rate": drain_rate,
        "stall_s": stall,
        "commit_s": commit,
        "restore_s": restore,
        "drain_s": drain,
        "settle_s": settled,
        "drain_mb_per_s": nbytes / statistics.median(drain) / 1e6 if drain else None,
        "restored_tiers": tiers_seen,
        "stall_ratio": stall_ratio,
        "commit_ratio": commit_ratio,
        "restore_ratio": restore_ratio,
        "goals": {"stall": STALL_GOAL, "commit": COMMIT_GOAL, "restore": RESTORE_GOAL},
        "pass": stall_ratio <= STALL_GOAL
        and commit_ratio <= COMMIT_GOAL
        and restore_ratio >= RESTORE_GOAL
        and all(t == "fast" for t in tiers_seen),
        "cpus": os.cpu_count(),
    }


def render(res: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from goodput.plan.units import fmt_bytes

    t = Table(
        title=f"tiered checkpoint bench: {fmt_bytes(res['bytes'])}, fast {res['fast']}, durable {res['durable']} "
        f"(medians of {res['repeat']} repeats; ratios paired per repeat)"
    )
    for c in ("phase", "local-only s", "tiered s", "tiered / local", "goal"):
        t.add_column(c)
    m = statistics.median
    t.add_row("stall", f"{m(res['stall_s']['local save']):.3f}", f"{m(res['stall_s']['tiered save']):.3f}",
              f"{res['stall_ratio']:.2f}", f"<= {res['goals']['stall']}")  # fmt: skip
    t.add_row("commit (fast tier)", f"{m(res['commit_s']['local save']):.3f}",
              f"{m(res['commit_s']['tiered save']):.3f}", f"{res['commit_ratio']:.2f}",
              f"<= {res['goals']['commit']}")  # fmt: skip
    t.add_row("restore", f"{m(res['restore_s']['local restore']):.3f}",
              f"{m(res['restore_s']['tiered restore']):.3f}", f"{1 / res['restore_ratio']:.2f}",
              f"<= {1 / res['goals']['restore']:.2f}")  # fmt: skip
    console.print(t)
    if res["drain_mb_per_s"]:
        console.print(f"drain to the durable tier: {m(res['drain_s']):.3f} s, {res['drain_mb_per_s']:,.0f} MB/s")
    mark = "[green]meets[/green]" if res["pass"] else "[red]misses[/red]"
    console.print(
        f"tiered stall {res['stall_ratio']:.2f} x, fast commit {res['commit_ratio']:.2f} x, fast restore "
        f"{res['restore_ratio']:.2f} x the local-only throughput (restored from: {', '.join(map(str, res['restored_tiers']))}): "
        f"{mark} the goals"
    )
