"""``goodput bench async``: what an asynchronous save costs the training loop.

Measured in one process, on the same state and directory:
- stall per save: goodput's ``AsyncSaver.save`` returning (planning + staging copy), against a
  plain copy of the same bytes into a preallocated buffer (the floor), and against DCP's
  ``async_save`` returning;
- slowdown of a concurrent CPU training loop (one torch thread, an MLP) while saves run back to
  back in the background: goodput with a writer process, goodput with a writer thread, DCP;
- on a CUDA machine, device-to-host staging throughput against the PCIe link's bandwidth.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from goodput.plan.pcie import pcie_bandwidth


def make_state(nbytes: int, ntensors: int = 8, device: str = "cpu") -> dict[str, torch.Tensor]:
    per = nbytes // ntensors // 4
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=g).to(device) for i in range(ntensors)}


class Loop:
    """A CPU training loop: an MLP on one torch thread, timed per step."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(64, 512)

    def steps(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.opt.zero_grad()
            self.model(self.x).pow(2).mean().backward()
            self.opt.step()
        return time.perf_counter() - t0


def _memcpy_floor(state: dict[str, torch.Tensor], repeat: int) -> float:
    total = sum(t.numel() * t.element_size() for t in state.values())
    buf = np.empty(total, np.uint8)
    buf[:] = 0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        pos = 0
        for t in state.values():
            n = t.numel() * t.element_size()
            np.copyto(buf[pos : pos + n], t.numpy().view(np.uint8).reshape(-1))
            pos += n
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ours_stall(state: dict[str, Any], root: Path, mode: str, repeat: int) -> tuple[float, float, float]:
    import goodput.ckpt as gc

    saver = gc.AsyncSaver(mode=mode)
    saver.start()
    saver.save(state, root / "warm", step=0).result()  # the staging buffer is allocated once, here
    stalls, stages, writes = [], [], []
    for i in range(repeat):
        h = saver.save(state, root / f"s{i}", step=i + 1)
        tm = h.result()
        stalls.append(tm.stall_s)
        stages.append(tm.stage_s)
        writes.append(tm.write_s)
    saver.close()
    return statistics.median(stalls), statistics.median(stages), statistics.median(writes)


def _dcp_stall(state: dict[str, Any], root: Path, repeat: int) -> float:
    import torch.distributed.checkpoint as dcp

    dcp.async_save(state, checkpoint_id=str(root / "dwarm"), no_dist=True).result()
    stalls = []
    for i in range(repeat):
        t0 = time.perf_counter()
        f = dcp.async_save(state, checkpoint_id=str(root / f"d{i}"), no_dist=True)
        stalls.append(time.perf_counter() - t0)
        f.result()
    return statistics.median(stalls)


def _slowdown(state: dict[str, Any], root: Path, loop: Loop, steps: int, kind: str) -> tuple[float, int]:
    """Time of ``steps`` loop steps taken while saves run back to back in the background (the
    foreground stall of starting each save is not counted: it is the stall measured above)."""
    import goodput.ckpt as gc

    saves = 0
    busy = 0.0
    chunk = max(1, steps // 50)
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp

        fut = None
        done = 0
        while done < steps:
            if fut is None or fut.done():
                fut = dcp.async_save(state, checkpoint_id=str(root / f"dl{saves % 2}"), no_dist=True)
                saves += 1
            busy += loop.steps(chunk)
            done += chunk
        fut.result()
        return busy, saves
    saver = gc.AsyncSaver(mode=kind, if_busy="skip")
    saver.start()
    saver.save(state, root / "lw", step=0).result()
    done = 0
    while done < steps:
        h = saver.save(state, root / f"l{saves % 2}", step=saves + 1)
        saves += h is not None
        busy += loop.steps(chunk)
        done += chunk
    saver.close()
    return busy, saves


def _cuda_staging(nbytes: int, gen: int, lanes: int) -> dict[str, float] | None:
    if not torch.cuda.is_available():
        return None
    import goodput.ckpt as gc  # pragma: no cover - GPU machines

    state = make_state(nbytes, device="cuda")
    saver = gc.AsyncSaver(mode="process")
    d = Path(tempfile.mkdtemp(prefix="goodput-bench-cuda-"))
    try:
        saver.save(state, d / "w", step=0).result()
        stages = []
        for i in range(3):
            torch.cuda.synchronize()
            tm = saver.save(state, d / f"s{i}", step=i + 1).result()
            stages.append(tm.stage_s)
        st = statistics.median(stages)
        link = pcie_bandwidth(gen, lanes)
        return {
            "stage_s": st,
            "d2h_Bps": nbytes / st,
            "pcie_Bps": link,
            "fraction_of_link": nbytes / st / link,
            "pinned": float(saver.pool.pinned),
        }
    finally:
        saver.close()
        shutil.rmtree(d, ignore_errors=True)


def run(
    nbytes: int,
    directory: str | None,
    repeat: int = 3,
    loop_steps: int = 400,
    gen: int = 5,
    lanes: int = 16,
    progress: Any = None,
) -> dict[str, Any]:
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="goodput-bench-async-", dir=directory))
    say = progress or (lambda s: None)
    try:
        state = make_state(nbytes)
        total = sum(t.numel() * t.element_size() for t in state.values())
        say("memcpy floor")
        memcpy = _memcpy_floor(state, repeat)
        say("goodput stall (writer process)")
        ours, ours_stage, ours_write = _ours_stall(state, root / "p", "process", repeat)
        say("goodput stall (writer thread)")
        ours_t, _, _ = _ours_stall(state, root / "t", "thread", repeat)
        say("DCP async_save stall")
        dcp = _dcp_stall(state, root / "d", repeat)
        loop = Loop()
        loop.steps(20)
        say("training loop alone")
        base = statistics.median(loop.steps(loop_steps) for _ in range(3))
        out: dict[str, Any] = {"bytes": total, "memcpy_s": memcpy, "stall_s": ours, "stage_s": ours_stage, "write_s": ours_write,
                               "stall_thread_s": ours_t, "dcp_stall_s": dcp, "loop_alone_s": base}  # fmt: skip
        for kind in ("process", "thread", "dcp"):
            say(f"training loop with saves in the background ({kind})")
            t, n = _slowdown(state, root / f"loop-{kind}", loop, loop_steps, kind)
            out[f"loop_with_{kind}_s"] = t
            out[f"slowdown_{kind}"] = t / base - 1
            out[f"saves_during_{kind}"] = n
        out["stall_vs_memcpy"] = ours / memcpy
        out["dcp_vs_stall"] = dcp / ours
        say("CUDA staging")
        out["cuda"] = _cuda_staging(nbytes, gen, lanes)
        out["goals"] = {
            "stall <= 1.5 x memcpy": out["stall_vs_memcpy"] <= 1.5,
            "stall >= 10 x smaller than DCP": out["dcp_vs_stall"] >= 10,
            "concurrent slowdown <= 10 %": out["slowdown_process"] <= 0.10,
        }
        if out["cuda"] is not None:  # pragma: no cover - GPU machines
            out["goals"]["device-to-host staging >= 80 % of PCIe"] = out["cuda"]["fraction_of_link"] >= 0.8
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def render(out: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    gb = out["bytes"] / 1e9
    t = Table(title=f"asynchronous save of {out['bytes'] / 2**30:.2f} GiB ({gb:.3f} GB) in one process (GB = 1e9 B)")
    for c in ("what", "seconds", "GB/s", "note"):
        t.add_column(c)
    t.add_row("memcpy into a preallocated buffer", f"{out['memcpy_s']:.4f}", f"{gb / out['memcpy_s']:.2f}", "the floor")
    t.add_row(
        "goodput stall (plan + stage), writer process",
        f"{out['stall_s']:.4f}",
        f"{gb / out['stall_s']:.2f}",
        f"{out['stall_vs_memcpy']:.2f} × memcpy; stage alone {out['stage_s']:.4f} s",
    )
    t.add_row("goodput stall, writer thread", f"{out['stall_thread_s']:.4f}", f"{gb / out['stall_thread_s']:.2f}", "")
    t.add_row(
        "DCP async_save stall",
        f"{out['dcp_stall_s']:.4f}",
        f"{gb / out['dcp_stall_s']:.2f}",
        f"{out['dcp_vs_stall']:.1f} × goodput's",
    )
    t.add_row(
        "goodput background write (per save)",
        f"{out['write_s']:.4f}",
        f"{gb / max(out['write_s'], 1e-9):.2f}",
        "runs behind training",
    )
    console.print(t)
    s = Table(title="a CPU training loop (1 torch thread) while saves run back to back")
    for c in ("background", "loop seconds", "slowdown", "saves overlapped"):
        s.add_column(c)
    s.add_row("none", f"{out['loop_alone_s']:.3f}", "", "")
    for kind, label in (
        ("process", "goodput, writer process"),
        ("thread", "goodput, writer thread"),
        ("dcp", "DCP async_save (thread)"),
    ):
        s.add_row(
            label,
            f"{out[f'loop_with_{kind}_s']:.3f}",
            f"{100 * out[f'slowdown_{kind}']:+.1f} %",
            str(out[f"saves_during_{kind}"]),
        )
    console.print(s)
    if out["cuda"]:  # pragma: no cover - GPU machines
        c = out["cuda"]
        console.print(
            f"CUDA staging: {c['d2h_Bps'] / 1e9:.1f} GB/s device-to-host = {100 * c['fraction_of_link']:.0f} % of the PCIe link ({c['pcie_Bps'] / 1e9:.1f} GB/s); pinned: {bool(c['pinned'])}"
        )
    else:
        console.print(
            "CUDA staging: no GPU on this machine (the pinned-memory path runs where torch.cuda.is_available())"
        )
    g = Table(title="goals")
    g.add_column("goal")
    g.add_column("result")
    for k, v in out["goals"].items():
        g.add_row(k, "[green]PASS[/green]" if v else "[red]MISS[/red]")
    console.print(g)
