"""A verified cold load against a raw read of the same bytes, in one process, same run.

    python tools/cold_load.py [--size 512MiB] [--rounds 6] [--dir /tmp/cold-load]
    (on a shared machine: chrt -f 20 python tools/cold_load.py ...)

Saves 8 fp32 tensors with goodput (two data files), writes the same bytes as one raw file, then
alternates, each after the bench's cold start (flush, ballast, drop caches): ``raw_readinto``
(plain ``readinto`` into one buffer), ``load_parallel`` (goodput.ckpt.load with the object-store
read path forced: pieces read in parallel at interleaved offsets, the file-system path before
2026-12-02) and ``load`` (goodput.ckpt.load as shipped). Prints GB/s and the paired ratios to
the raw read per round, with medians. docs/BENCHMARKS.md quotes it."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import goodput.ckpt.loading.read_exec as rx
from goodput.bench.ckpt import cold_start, make_ballast, raw_read_into
from goodput.ckpt.loading.loader import load
from goodput.ckpt.saving.saver import save
from goodput.plan.units import parse_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="512MiB")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", default="/tmp/cold-load")
    a = ap.parse_args()
    size = parse_size(a.size)
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        per = size // 8
        state = {f"t{k}": torch.rand((per // 4 // 4096, 4096)) for k in range(8)}
        ck = root / "goodput"
        save(state, ck, step=1, files_per_rank=2)
        with open(root / "raw.bin", "wb") as f:
            for t in state.values():
                f.write(t.numpy().tobytes())
            os.fsync(f.fileno())
        total = sum(t.numel() * 4 for t in state.values())
        ballast = make_ballast(root, total)
        buf = np.empty(total, np.uint8)
        buf.fill(0)
        dests = {k: torch.zeros_like(v) for k, v in state.items()}
        shipped = rx.ChunkReader._file_streams

        def parallel() -> None:
            rx.ChunkReader._file_streams = lambda self, ops: None  # type: ignore[method-assign]
            try:
                load(dests, ck, no_dist=True)
            finally:
                rx.ChunkReader._file_streams = shipped  # type: ignore[method-assign]

        runs = {
            "raw_readinto": lambda: raw_read_into(root / "raw.bin", memoryview(buf)),
            "load_parallel": parallel,
            "load": lambda: load(dests, ck, no_dist=True),
        }
        res: dict[str, list[float]] = {k: [] for k in runs}
        names = list(runs)
        for r in range(a.rounds):
            for k in names if r % 2 == 0 else names[::-1]:
                for t in dests.values():
                    t.zero_()
                cold_start(root, ballast)
                t0 = time.perf_counter()
                runs[k]()
                res[k].append(total / (time.perf_counter() - t0) / 1e9)
                if k != "raw_readinto" and not all(torch.equal(dests[n], state[n]) for n in state):
                    raise SystemExit(f"{k}: the loaded tensors differ from the saved ones")
        for k in names:
            rat = [x / y for x, y in zip(res[k], res["raw_readinto"])]
            print(
                f"{k:14s} GB/s {' '.join(f'{x:.2f}' for x in res[k])} (median {statistics.median(res[k]):.2f})"
                f" | / raw {' '.join(f'{x:.2f}' for x in rat)} (median {statistics.median(rat):.2f})"
            )
        print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
