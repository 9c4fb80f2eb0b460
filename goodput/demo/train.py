"""``goodput demo``: train, checkpoint asynchronously, lose a rank, resume elsewhere, check it all.

1. A reference run: 2 ranks (gloo) train a small GPT for N steps with asynchronous checkpoints.
2. The same job again, and a rank is killed with SIGKILL mid-run (the job dies with it).
3. It resumes on 1 rank (a different layout and world size) from the last committed checkpoint.
Checks: the committed checkpoint equals the reference run's state at that step, bitwise; the
state the resumed rank restored equals the committed one, bitwise; the losses before the kill and
after the resume equal the reference trajectory bitwise (one rank computes both halves of the
global batch and sums their gradients in the all-reduce's order, so the arithmetic is the same;
where it were not, we would compare within a stated tolerance of 1e-6 relative). Then a goodput
report: time lost, stall per save, write time, and the interval goodput.plan recommends.
Exits non-zero if any check fails. ``--part reshard`` runs the N-to-M resharding demo as well.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
STEPS, INTERVAL, KILL_AT, SLEEP = 40, 5, 23, 0.03
TOLERANCE = 1e-6


def _spawn(root: Path, rank: int, world: int, init: str, *extra: str, quiet: bool = False) -> subprocess.Popen:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.Popen(
        [sys.executable, "-m", "goodput.demo.worker", str(root), str(rank), str(world), init, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
        env=env,
        start_new_session=True,
    )


def _events(p: subprocess.Popen) -> list[dict[str, Any]]:
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _run(root: Path, world: int, *extra: str) -> tuple[list[list[dict]], float]:
    init = tempfile.mktemp(prefix="goodput-demo-pg-")
    t0 = time.perf_counter()
    procs = [_spawn(root, r, world, init, *extra) for r in range(world)]
    evs = [_events(p) for p in procs]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"training ranks exited with {codes}")
    return evs, time.perf_counter() - t0


def _losses(evs: list[dict]) -> dict[int, str]:
    return {e["step"]: e["loss"] for e in evs if "step" in e}


def _same_checkpoint(a: Path, b: Path) -> list[str]:
    """Names whose tensors or values differ between two checkpoints (numpy reader, raw bits)."""
    import numpy as np

    import goodput.ckpt as gc

    ca, cb = gc.open(a), gc.open(b)
    diff = [n for n in sorted(set(ca.keys()) ^ set(cb.keys()))]
    for n in sorted(set(ca.keys()) & set(cb.keys())):
        if not np.array_equal(ca.read(n, raw=True), cb.read(n, raw=True)):
            diff.append(n)
    va, vb = ca.values, cb.values
    diff += [k for k in sorted(set(va) | set(vb)) if not k.startswith("_goodput") and va.get(k) != vb.get(k)]
    return diff


def run_demo(workdir: str | None = None, part: str = "all", mtbf: str = "3.09h") -> int:
    from goodput.plan import interval as iv
    from goodput.plan.units import fmt_duration, parse_duration

    own = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-"))
    ok = True
    checks: list[tuple[str, bool, str]] = []
    try:
        console.rule("[bold]goodput demo: train, checkpoint asynchronously, kill a rank, resume on one")
        common = ["--steps", str(STEPS), "--interval", str(INTERVAL), "--step-sleep", str(SLEEP)]
        with console.status(f"reference run: 2 ranks (gloo), {STEPS} steps, async checkpoint every {INTERVAL} steps…"):
            ref, ref_s = _run(base / "reference", 2, *common, "--keep", "0")
        ref_loss = _losses(ref[0])
        console.print(
            f"reference run: {len(ref_loss)} steps in {ref_s:.1f} s (incl. start-up), final loss {float.fromhex(ref_loss[STEPS]):.4f}"
        )

        # the same job, killed mid-run
        root = base / "job"
        init = tempfile.mktemp(prefix="goodput-demo-pg-")
        with console.status(f"the same job; rank 1 is killed (SIGKILL) once it passes step {KILL_AT}…"):
            procs = [_spawn(root, r, 2, init, *common, quiet=True) for r in range(2)]
            seen: list[dict] = []
            assert procs[0].stdout is not None
            t_start = time.perf_counter()
            for line in procs[0].stdout:
                if line.startswith("{"):
                    ev = json.loads(line)
                    seen.append(ev)
                    if ev.get("step", 0) >= KILL_AT:
                        break
            t_kill = time.perf_counter()
            os.killpg(procs[1].pid, signal.SIGKILL)
            time.sleep(0.5)  # rank 0 blocks in its next all-reduce; the job is torn down
            os.killpg(procs[0].pid, signal.SIGKILL)
            for p in procs:
                p.wait()
        killed_step = max(e["step"] for e in seen if "step" in e)
        step_times = [e["s"] for e in seen if "step" in e]
        saves = [e for e in seen if "commit" in e]
        console.print(
            f"killed rank 1 after step {killed_step} ({t_kill - t_start:.1f} s into the run); commits seen on rank 0: {[e['commit'] for e in saves]}"
        )

        import goodput.ckpt as gc

        latest = gc.latest(root)
        if latest is None:
            raise RuntimeError("no committed checkpoint survived the kill")
        committed = gc.open(latest).step
        assert committed is not None
        console.print(
            f"latest committed checkpoint: {latest.name} (step {committed}); it verifies: {gc.verify(latest):,} bytes"
        )

        ref_ck = base / "reference" / f"step_{committed:09d}"
        if ref_ck.exists():
            d = _same_checkpoint(latest, ref_ck)
            checks.append(
                (
                    "committed state == reference run's state at that step (bitwise)",
                    not d,
                    f"differs: {d[:5]}" if d else f"{len(gc.open(latest).keys())} tensors",
                )
            )
        else:
            checks.append(("reference run kept that step", False, str(ref_ck)))
        restored = _restored_equals(latest)
        checks.append(
            (
                "restored state == committed state (bitwise)",
                not restored,
                f"differs: {restored[:5]}" if restored else "model + Adam state + values",
            )
        )
        # resume on one rank
        t_resume = time.time()
        with console.status("resuming on 1 rank from the last committed checkpoint…"):
            res, _ = _run(root, 1, *common)
        resumed = res[0]
        ready = next(e for e in resumed if "ready" in e)
        restart_s = ready["t"] - t_resume  # process start, imports, process group, restore
        res_loss = _losses(resumed)

        checks.append(("resumed from the last committed step", ready["ready"] == committed, f"step {ready['ready']}"))
        before = all(_losses(seen).get(s) == ref_loss[s] for s in range(1, killed_step + 1) if s in _losses(seen))
        checks.append(("losses before the kill == reference (bitwise)", before, f"steps 1..{killed_step}"))
        after = [s for s in range(committed + 1, STEPS + 1) if res_loss.get(s) != ref_loss[s]]
        if after:
            worst = max(
                abs(float.fromhex(res_loss[s]) - float.fromhex(ref_loss[s])) / abs(float.fromhex(ref_loss[s]))
                for s in after
                if s in res_loss
            )
            checks.append(
                (
                    f"losses after the resume == reference (within {TOLERANCE:g} relative)",
                    worst <= TOLERANCE,
                    f"not bitwise at {len(after)} steps; worst {worst:.2e}",
                )
            )
        else:
            checks.append(
                ("losses after the resume == reference (bitwise, 1 rank vs 2)", True, f"steps {committed + 1}..{STEPS}")
            )

        t = Table(title="checks")
        t.add_column("check")
        t.add_column("result")
        t.add_column("detail")
        for name, good, detail in checks:
            ok &= good
            t.add_row(name, "[green]pass[/green]" if good else "[red]FAIL[/red]", detail)
        console.print(t)

        # the goodput report
        step_s = sum(step_times) / len(step_times)
        lost_steps = killed_step - committed
        stalls = [e["stall_s"] for e in saves] or [0.0]
        writes = [e["write_s"] for e in saves] or [0.0]
        stall, write = sum(stalls) / len(stalls), sum(writes) / len(writes)
        m = parse_duration(mtbf)
        rep = iv.interval(max(stall, 1e-6), m, restart_s, write)
        g = Table(title="goodput report")
        g.add_column("quantity")
        g.add_column("value")
        g.add_row(
            "work lost to the kill",
            f"{lost_steps} steps × {step_s * 1e3:.1f} ms = {fmt_duration(lost_steps * step_s)} (back to step {committed})",
        )
        g.add_row(
            "restart (process start → state restored)",
            f"{fmt_duration(restart_s)} (of which the restore {fmt_duration(ready['restore_s'])})",
        )
        g.add_row(
            "stall per save (staging copy + planning)",
            f"{fmt_duration(stall)} mean over {len(saves)} saves ({100 * stall / step_s:.0f} % of a step)",
        )
        g.add_row("background write + commit per save", fmt_duration(write))
        g.add_row(
            f"interval goodput.plan recommends (MTBI {mtbf})",
            f"{fmt_duration(rep.optimal_s)} (exact optimum; Young {fmt_duration(rep.young_s)}), useful fraction {100 * rep.useful_fraction_at_optimal:.3f} %",
        )
        console.print(g)
    except Exception as e:  # noqa: BLE001
        console.print(f"[red]demo failed:[/red] {type(e).__name__}: {e}")
        ok = False
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)
    if part in ("all", "reshard"):
        from goodput.demo.reshard import run_reshard_demo

        ok &= run_reshard_demo(None) == 0
    console.rule("[green]all checks passed" if ok else "[red]a check failed")
    return 0 if ok else 1


def _restored_equals(path: Path) -> list[str]:
    """Load the checkpoint as the resumed rank does (in place, into a fresh model and optimizer)
    and compare every tensor with the numpy reader's bytes of the committed checkpoint."""
    import numpy as np
    import torch

    import goodput.ckpt as gc
    from goodput.demo.worker import TinyGPT

    torch.manual_seed(1)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    gc.load(state, path, strict=True)
    opt.load_state_dict(state["optim"])
    ck = gc.open(path)
    bad = []
    flat = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            flat[f"optim.state.{i}.{k}"] = v
    for name, t in flat.items():
        if not np.array_equal(t.detach().numpy(), ck.read(name)):
            bad.append(name)
    return bad
