"""``goodput demo --part reshard``: a real multi-rank checkpoint saved, resharded, loaded and
checked bytewise.

Four processes (gloo) hold a small transformer's weights as DTensors sharded by rows, with
norms replicated, and Adam-style optimizer state as ZeRO flat shards. They save; three processes
load it with a different layout (column shards, three flat ranges); one process loads it whole;
the torch-free reader reads a sub-box. Every load is compared bitwise with the saved tensors.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console()

HIDDEN, FFN, VOCAB, LAYERS = 256, 1024, 1000, 2


def shapes() -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {"embed": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        s[f"layers.{i}.attn.qkv"] = (3 * HIDDEN, HIDDEN)
        s[f"layers.{i}.attn.out"] = (HIDDEN, HIDDEN)
        s[f"layers.{i}.mlp.up"] = (FFN, HIDDEN)
        s[f"layers.{i}.mlp.down"] = (HIDDEN, FFN)
        s[f"layers.{i}.norm"] = (HIDDEN,)
    return s


def tensor(name: str, shape: tuple[int, ...]):
    import torch

    g = torch.Generator().manual_seed(sum(map(ord, name)) * 7919)
    return torch.randn(shape, generator=g).to(torch.bfloat16 if name.startswith("model") else torch.float32)


def flat_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]


def build_state(rank: int, world: int, layout: str) -> dict:
    """The state as a rank holds it: ``rows`` (the saving layout) or ``cols`` (the new one)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    import goodput.ckpt as gc

    mesh = init_device_mesh("cpu", (world,))
    model, optim = {}, {}
    for name, shape in shapes().items():
        full = tensor("model." + name, shape)
        if len(shape) == 1:
            place = [Replicate()]
        else:
            place = [Shard(0)] if layout == "rows" else [Shard(1)]
        model[name] = distribute_tensor(full if layout == "rows" else torch.zeros_like(full), mesh, place)
        n = full.numel()
        a, b = flat_ranges(n, world)[rank]
        m = tensor("optim." + name, shape).reshape(-1)[a:b].clone()
        optim[name] = gc.FlatShard(m if layout == "rows" else torch.zeros_like(m), shape, a)
    return {"model": model, "optim": {"exp_avg": optim}, "step": 100 if layout == "rows" else 0}


def _save(rank: int, world: int, path: str) -> dict:
    import goodput.ckpt as gc

    r = gc.save(build_state(rank, world, "rows"), path, step=100)
    return {"written": r.bytes_written, "per_rank": r.bytes_per_rank, "timings": r.timings}


def _load(rank: int, world: int, path: str) -> dict:
    import torch

    import goodput.ckpt as gc

    state = build_state(rank, world, "cols")
    res = gc.load(state, path)
    mismatches = []
    want = build_state_expected(rank, world)
    for name in shapes():
        if not torch.equal(state["model"][name].to_local(), want["model"][name].to_local()):
            mismatches.append("model." + name)
        if not torch.equal(state["optim"]["exp_avg"][name].tensor, want["optim"]["exp_avg"][name].tensor):
            mismatches.append("optim.exp_avg." + name)
    if state["step"] != 100:
        mismatches.append("step")
    return {
        "mismatches": mismatches,
        "read": res.stats.bytes_read,
        "needed": res.stats.bytes_needed,
        "seconds": res.stats.seconds,
    }


def build_state_expected(rank: int, world: int) -> dict:
    """What the new layout must hold: the saved tensors, distributed the new way."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    import goodput.ckpt as gc

    mesh = init_device_mesh("cpu", (world,))
    model, optim = {}, {}
    for name, shape in shapes().items():
        full = tensor("model." + name, shape)
        model[name] = distribute_tensor(full, mesh, [Replicate()] if len(shape) == 1 else [Shard(1)])
        a, b = flat_ranges(full.numel(), world)[rank]
        optim[name] = gc.FlatShard(tensor("optim." + name, shape).reshape(-1)[a:b].clone(), shape, a)
    return {"model": model, "optim": {"exp_avg": optim}}


def run_reshard_demo(workdir: str | None = None) -> int:
    import numpy as np
    import torch

    import goodput.ckpt as gc
    from goodput.demo.localdist import run_ranks

    own = workdir is None
    root = Path(workdir or tempfile.mkdtemp(prefix="goodput-demo-"))
    path = root / "step_000100"
    ok = True
    try:
        console.rule("[bold]goodput demo: save on 4 ranks, load on 3 with another layout, and on 1")
        t = time.perf_counter()
        with console.status("4 ranks (gloo) save DTensor row shards + ZeRO flat optimizer shards…"):
            saved = run_ranks(_save, 4, str(path))
        console.print(f"saved {path} in {time.perf_counter() - t:.1f} s (incl. process start)")
        per_rank = saved[0]["per_rank"]
        console.print(f"bytes written per rank (replicated norms written once, spread): {per_rank}")

        ck = gc.open(path)
        tab = Table(title="what the checkpoint holds (goodput ckpt inspect)")
        for c in ("tensor", "dtype", "shape", "chunks", "saved layout"):
            tab.add_column(c)
        for info in list(ck.tensors.values())[:8]:
            lay = ", ".join(f"r{c.rank}{c.region.describe()}" for c in info.chunks[:2])
            tab.add_row(
                info.name,
                info.dtype,
                str(info.shape),
                str(len(info.chunks)),
                lay + (" …" if len(info.chunks) > 2 else ""),
            )
        console.print(tab)

        with console.status("3 ranks load it as column shards (Shard(1)) and 3 flat ranges…"):
            loaded = run_ranks(_load, 3, str(path))
        for r, res in enumerate(loaded):
            good = not res["mismatches"]
            ok &= good
            console.print(
                f"rank {r}/3: {'[green]bitwise equal[/green]' if good else '[red]MISMATCH ' + str(res['mismatches']) + '[/red]'}"
                f"; read {res['read']:,} bytes for {res['needed']:,} needed"
            )

        state = {"model": {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in shapes().items()}}
        gc.load(state, path, strict=False)
        whole = all(torch.equal(state["model"][n], tensor("model." + n, s)) for n, s in shapes().items())
        ok &= whole
        console.print(
            f"1 process loads whole tensors: {'[green]bitwise equal[/green]' if whole else '[red]MISMATCH[/red]'}"
        )

        box = ck.read("model.layers.0.mlp.up", np.s_[100:104, 8:12])
        want = tensor("model.layers.0.mlp.up", shapes()["layers.0.mlp.up"])[100:104, 8:12].float().numpy()
        sub = bool(np.array_equal(box, want))
        ok &= sub
        console.print(
            f"numpy-only reader, sub-box [100:104, 8:12] of model.layers.0.mlp.up: {'[green]equal[/green]' if sub else '[red]MISMATCH[/red]'}"
        )

        checked = gc.verify(path)
        console.print(f"verify: every chunk and 4 KiB block checksum good ({checked:,} bytes)")
    except Exception as e:
        console.print(f"[red]demo failed:[/red] {e}")
        ok = False
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    console.rule("[green]all checks passed" if ok else "[red]a check failed")
    return 0 if ok else 1
