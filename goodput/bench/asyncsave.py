"""``goodput bench async``: what an asynchronous save costs the training loop.

Measured in one process, on the same state and directory:
- stall per save: goodput's ``AsyncSaver.save`` returning (planning + staging copy), against a
  plain copy of the same bytes into preallocated tensors by torch on every core (the floor: the
  least a copy of the state can cost a loop that waits for it; sampled right before each timed
  save), and against DCP's ``async_save`` returning; a one-thread memcpy is shown for information;
- lazy staging: what the loop loses when the copy runs behind the next step's forward and
  backward (``save`` returning plus the protected optimizer step's wait), in a step whose
  forward and backward last a few times the floor;
- slowdown of a concurrent CPU training loop (one torch thread, an MLP) while saves run back to
  back in the background: goodput with a writer process, goodput with a writer thread, DCP;
- on a CUDA machine, device-to-host staging throughput against the PCIe link's bandwidth.
"""

from __future__ import annotations

import math
import os
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

    def forward_backward(self, micro: int) -> float:
        """``micro`` micro-batches, gradients accumulated: one step's forward and backward."""
        t0 = time.perf_counter()
        for _ in range(micro):
            self.model(self.x).pow(2).mean().backward()
        return time.perf_counter() - t0


class Floor:
    """``dst.copy_(src)`` into preallocated tensors with torch on every core (the loop's own
    thread count is restored after). Sampled right before each timed save, not once up front:
    on a shared machine the speed of memory drifts by tens of percent within a minute."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.src = list(state.values())
        self.dst = [torch.empty_like(t) for t in self.src]
        for d in self.dst:
            d.zero_()  # fault the pages in now
        self.threads = os.cpu_count() or 1
        self.samples: list[float] = []
        self.sample(keep=False)

    def sample(self, keep: bool = True) -> float:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            t0 = time.perf_counter()
            for d, t in zip(self.dst, self.src):
                d.copy_(t)
            dt = time.perf_counter() - t0
        finally:
            torch.set_num_threads(before)
        if keep:
            self.samples.append(dt)
        return dt

    def median(self) -> float:
        return statistics.median(self.samples)


def _memcpy_one_thread(state: dict[str, torch.Tensor], repeat: int) -> float:
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


def _ours_stall(state: dict[str, Any], root: Path, mode: str, repeat: int, floor: Floor) -> dict[str, Any]:
    import goodput.ckpt as gc

    saver = gc.AsyncSaver(mode=mode)
    saver.start()
    saver.save(state, root / "warm", step=0).result()  # the staging buffer is allocated once, here
    stalls, stages, writes, floors = [], [], [], []
    for i in range(repeat):
        floors.append(floor.sample())
        t0 = time.perf_counter()
        h = saver.save(state, root / f"s{i}", step=i + 1)
        stalls.append(time.perf_counter() - t0)
        tm = h.result()
        stages.append(tm.stage_s)
        writes.append(tm.write_s)
    out = {
        "floor_s": statistics.median(floors),
        "stall_samples_s": stalls,
        "stall_s": statistics.median(stalls),
        "stage_s": statistics.median(stages),
        "write_s": statistics.median(writes),
        "hugepages": saver.pool.hugepages,
    }
    saver.close()
    return out


def _lazy_stall(
    state: dict[str, Any], root: Path, loop: Loop, repeat: int, fb_s: float, floor: Floor
) -> dict[str, Any]:
    """Save lazily, then one training step: forward and backward lasting about ``fb_s``, and the
    protected optimizer step (which waits for the copy if it is not done)."""
    import goodput.ckpt as gc

    loop.forward_backward(3)
    micro = max(1, math.ceil(fb_s / (loop.forward_backward(5) / 5)))
    alone = statistics.median(loop.forward_backward(micro) for _ in range(3))
    loop.opt.zero_grad()
    saver = gc.AsyncSaver(mode="process", staging="lazy")
    saver.protect(loop.opt)
    saver.start()
    saver.save(state, root / "warm", step=0).result()
    rows = []
    for i in range(repeat):
        floor.sample()
        t0 = time.perf_counter()
        h = saver.save(state, root / f"z{i}", step=i + 1)
        ret = time.perf_counter() - t0
        fb = loop.forward_backward(micro)
        loop.opt.step()
        loop.opt.zero_grad()
        tm = h.result()
        rows.append((ret + tm.wait_s, ret, tm.wait_s, tm.lazy_s, fb, tm.lazy_bytes))
    saver.close()
    med = [statistics.median(r[k] for r in rows) for k in range(6)]
    return {
        "lazy_stall_s": med[0],
        "lazy_return_s": med[1],
        "lazy_wait_s": med[2],
        "lazy_copy_s": med[3],
        "lazy_fb_with_copy_s": med[4],
        "lazy_bytes": int(med[5]),
        "lazy_fb_alone_s": alone,
        "lazy_micro_batches": micro,
    }


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
    lazy_fb: float = 3.0,
) -> dict[str, Any]:
    from goodput.ckpt.saving.staging import copier, shmem_hugepages

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="goodput-bench-async-", dir=directory))
    say = progress or (lambda s: None)
    try:
        state = make_state(nbytes)
        total = sum(t.numel() * t.element_size() for t in state.values())
        say("all-core copy (the floor)")
        fl = Floor(state)
        say("one-thread memcpy")
        memcpy = _memcpy_one_thread(state, repeat)
        say("goodput stall (writer process)")
        proc = _ours_stall(state, root / "p", "process", repeat, fl)
        say("goodput stall (writer thread)")
        thr = _ours_stall(state, root / "t", "thread", repeat, fl)
        say("goodput lazy stall")
        loop = Loop()
        loop.steps(20)
        lazy = _lazy_stall(state, root / "z", loop, repeat, lazy_fb * fl.median(), fl)
        floor = fl.median()
        say("DCP async_save stall")
        dcp = _dcp_stall(state, root / "d", repeat)
        say("training loop alone")
        base = statistics.median(loop.steps(loop_steps) for _ in range(3))
        out: dict[str, Any] = {
            "bytes": total,
            "floor_s": floor,
            "floor_samples_s": fl.samples,
            "floor_threads": fl.threads,
            "copy_threads": copier().threads,
            "memcpy_s": memcpy,
            "stall_s": proc["stall_s"],
            "stage_s": proc["stage_s"],
            "write_s": proc["write_s"],
            "stall_samples_s": proc["stall_samples_s"],
            "stall_thread_s": thr["stall_s"],
            "stage_thread_s": thr["stage_s"],
            "shmem_hugepages": shmem_hugepages(),
            "staging_hugepages": proc["hugepages"],
            **lazy,
            "lazy_fb_vs_floor": lazy_fb,
            "dcp_stall_s": dcp,
            "loop_alone_s": base,
        }
        for kind in ("process", "thread", "dcp"):
            say(f"training loop with saves in the background ({kind})")
            t, n = _slowdown(state, root / f"loop-{kind}", loop, loop_steps, kind)
            out[f"loop_with_{kind}_s"] = t
            out[f"slowdown_{kind}"] = t / base - 1
            out[f"saves_during_{kind}"] = n
        # each stall against the floor sampled alongside it
        out["stall_vs_floor"] = out["stall_s"] / proc["floor_s"]
        out["stall_thread_vs_floor"] = out["stall_thread_s"] / thr["floor_s"]
        out["stall_vs_memcpy"] = out["stall_s"] / memcpy
        out["lazy_vs_floor"] = out["lazy_stall_s"] / floor
        out["dcp_vs_stall"] = dcp / out["stall_s"]
        say("CUDA staging")
        out["cuda"] = _cuda_staging(nbytes, gen, lanes)
        out["goals"] = {
            "stall <= 1.2 x all-core floor": out["stall_vs_floor"] <= 1.2,
            "lazy stall <= 0.1 x all-core floor": out["lazy_vs_floor"] <= 0.1,
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
    fl = out["floor_s"]
    t = Table(title=f"asynchronous save of {out['bytes'] / 2**30:.2f} GiB ({gb:.3f} GB) in one process (GB = 1e9 B)")
    for c in ("what", "seconds", "GB/s", "note"):
        t.add_column(c)
    t.add_row(
        f"all-core copy into preallocated tensors (torch, {out['floor_threads']} threads)",
        f"{fl:.4f}",
        f"{gb / fl:.2f}",
        "the floor",
    )
    t.add_row(
        "one-thread memcpy into a preallocated buffer",
        f"{out['memcpy_s']:.4f}",
        f"{gb / out['memcpy_s']:.2f}",
        f"{out['memcpy_s'] / fl:.2f} × floor (for information)",
    )
    pages = "2 MiB pages" if out["staging_hugepages"] else f"4 KiB pages: shmem THP policy {out['shmem_hugepages']!r}"
    t.add_row(
        "goodput stall (plan + stage), writer process",
        f"{out['stall_s']:.4f}",
        f"{gb / out['stall_s']:.2f}",
        f"{out['stall_vs_floor']:.2f} × floor; stage alone {out['stage_s']:.4f} s on {out['copy_threads']} threads; "
        f"shared memory, {pages}",
    )
    t.add_row(
        "goodput stall, writer thread",
        f"{out['stall_thread_s']:.4f}",
        f"{gb / out['stall_thread_s']:.2f}",
        f"{out['stall_thread_vs_floor']:.2f} × floor; stage alone {out['stage_thread_s']:.4f} s (private memory)",
    )
    fb_slow = out["lazy_fb_with_copy_s"] / out["lazy_fb_alone_s"] - 1
    t.add_row(
        "goodput lazy stall (save returns + protected step waits)",
        f"{out['lazy_stall_s']:.4f}",
        "",
        f"{out['lazy_vs_floor']:.3f} × floor; save returned in {out['lazy_return_s']:.4f} s, the step waited "
        f"{out['lazy_wait_s']:.4f} s; the copy ({out['lazy_copy_s']:.3f} s) ran behind a forward+backward of "
        f"{out['lazy_fb_with_copy_s']:.3f} s ({out['lazy_fb_alone_s']:.3f} s alone, {100 * fb_slow:+.0f} %)",
    )
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
