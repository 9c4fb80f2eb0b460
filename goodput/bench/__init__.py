"""Benchmarks behind ``goodput bench ...``: each goal is a ratio against a baseline run alongside.

``ckpt`` times durable save and load (same layout and resharded) against raw sequential I/O,
``torch.save`` and DCP on the same directory; ``metadata`` times global metadata and one rank's
load plan for a 16k-rank layout against DCP's metadata and planner. Both modules import torch
lazily enough that ``goodput bench --help`` stays fast.
"""

from __future__ import annotations

# sizes are read by goodput.plan.units.parse_size and written by goodput.plan.units.fmt_bytes
