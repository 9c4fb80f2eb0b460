"""``goodput bench crc``: what the checksum block size costs a save, per core.

The writer checksums every ``block_bytes`` block with one C call (:func:`writer.block_crcs`):
finer blocks let a verified resharded load read fewer bytes around runs that do not start on a
block boundary, at the price measured here, against one call over the whole buffer (the floor).
"""

from __future__ import annotations

import time
from typing import Any

import crc32c
import numpy as np

from goodput.ckpt.saving.writer import block_crcs

BLOCKS = (512, 1024, 4096, 16384, 65536)


def run(nbytes: int, repeat: int = 3) -> dict[str, Any]:
    data = memoryview(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))

    def best(fn) -> float:
        secs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            secs.append(time.perf_counter() - t0)
        return min(secs)

    whole = best(lambda: crc32c.crc32c(data))
    rows = [{"block_bytes": 0, "seconds": whole, "gbps": nbytes / whole / 1e9}]
    for b in BLOCKS:
        s = best(lambda b=b: block_crcs(data, b, []))
        rows.append({"block_bytes": b, "seconds": s, "gbps": nbytes / s / 1e9})
    return {"bytes": nbytes, "repeat": repeat, "rows": rows}


def render(res: dict, console: Any) -> None:
    from rich.table import Table

    t = Table(
        title=f"block checksums over {res['bytes'] / 2**20:.0f} MiB, one core (best of {res['repeat']}; GB = 1e9 B)"
    )
    t.add_column("block")
    t.add_column("GB/s", justify="right")
    t.add_column("× one whole-buffer call", justify="right")
    floor = res["rows"][0]["gbps"]
    for r in res["rows"]:
        label = "whole buffer, one call" if r["block_bytes"] == 0 else f"{r['block_bytes']} B"
        t.add_row(label, f"{r['gbps']:.2f}", f"{r['gbps'] / floor:.2f}")
    console.print(t)
