"""Benchmarks behind ``goodput bench ...``: each goal is a ratio against a baseline run alongside.

``ckpt`` times durable save and load (same layout and resharded) against raw sequential I/O,
``torch.save`` and DCP on the same directory; ``metadata`` times global metadata and one rank's
load plan for a 16k-rank layout against DCP's metadata and planner. Both modules import torch
lazily enough that ``goodput bench --help`` stays fast.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"2GiB"`` -> 2147483648, ``"1GB"`` -> 1e9, ``"512MiB"``, ``"4096"`` (bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r} (try 2GiB, 512MiB, 1GB or a number of bytes)")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if n <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(n)


def human_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"  # pragma: no cover
