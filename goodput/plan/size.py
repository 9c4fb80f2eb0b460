"""Checkpoint size, bytes per GPU, write time and its share of the cadence.

Mixed-precision Adam holds 16 B/param in memory (Rajbhandari et al., ZeRO, SC'20, §3.1: 2 bf16
weights + 2 bf16 grads + 4 fp32 master + 4 + 4 Adam moments). A checkpoint usually stores no
gradients: 14 B/param (bf16 weights + fp32 master, m, v), or 12 B without the bf16 copy.
405B × 16 B = 6.48 TB; at 100 GB/s that is 64.8 s, 3.6 % of a 30-minute cadence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BYTES_PER_PARAM = {16: "bf16 weights + bf16 grads + fp32 master + Adam m, v (ZeRO §3.1, in memory)",
                   14: "bf16 weights + fp32 master + Adam m, v (a checkpoint without gradients)",
                   12: "fp32 master + Adam m, v (no bf16 copy)"}  # fmt: skip


@dataclass(frozen=True)
class SizeReport:
    params: float
    bytes_per_param: float
    total_bytes: float
    gpus: int
    tp: int
    pp: int
    dp: int
    bytes_per_gpu: float  # deduplicated and balanced: total / gpus
    bytes_per_replica: float  # one model-parallel replica's share: total / dp
    bytes_per_gpu_naive: float  # if every DP replica wrote its full model-parallel shard
    bandwidth_Bps: float
    write_s: float
    interval_s: float
    overhead_fraction: float  # write time / interval (a blocking write's share of the run)


def size(
    params: float,
    bytes_per_param: float = 16,
    gpus: int = 16_384,
    tp: int = 8,
    pp: int = 16,
    bandwidth_Bps: float = 100e9,
    interval_s: float = 1800.0,
) -> SizeReport:
    if not all(math.isfinite(v) and v > 0 for v in (params, bytes_per_param, gpus, tp, pp, bandwidth_Bps, interval_s)):
        raise ValueError("every input must be a positive finite number")
    if not math.isfinite(params * bytes_per_param):
        raise ValueError("params × bytes per param overflows a double-precision float")
    if gpus % (tp * pp):
        raise ValueError(f"{gpus} GPUs are not a multiple of TP × PP = {tp * pp}")
    dp = gpus // (tp * pp)
    total = params * bytes_per_param
    write = total / bandwidth_Bps
    return SizeReport(
        params=params,
        bytes_per_param=bytes_per_param,
        total_bytes=total,
        gpus=gpus,
        tp=tp,
        pp=pp,
        dp=dp,
        bytes_per_gpu=total / gpus,
        bytes_per_replica=total / dp,
        bytes_per_gpu_naive=total / (tp * pp),
        bandwidth_Bps=bandwidth_Bps,
        write_s=write,
        interval_s=interval_s,
        overhead_fraction=write / interval_s,
    )
