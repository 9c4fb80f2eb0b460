"""Token stream vs checkpoint burst vs restore: three workloads four orders of magnitude apart.

Training throughput ≈ GPUs × achieved FLOP/s ÷ (6 × params) tokens/s (Kaplan et al. 2020: 6N FLOP
per token forward and backward). Llama 3 405B: 16,384 × 400 TFLOP/s ÷ (6 × 405e9) ≈ 2.7 M tokens/s,
about 10.8 MB/s of int32 token ids for the whole cluster. A 6.48 TB checkpoint written in a minute
is ≈ 108 GB/s. Restore: every rank reads at once; deduplicated 14 B/param (5.67 TB) at 2 TB/s is
2.8 s, but if every rank reads its whole replicated bf16 shard the read is the bf16 weights × DP
plus the (sharded) optimizer state: 108.5 TB, 54 s — hence read-once-and-broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TokensReport:
    tokens_per_s: float
    token_stream_Bps: float
    checkpoint_bytes: float
    burst_write_s: float
    burst_Bps: float
    restore_bytes: float  # read once: the deduplicated checkpoint
    restore_bytes_naive: float  # every DP replica reads its full bf16 weight shard
    tier_bandwidth_Bps: float
    restore_s: float
    restore_naive_s: float
    ratio_burst_to_stream: float


def tokens(
    gpus: int = 16_384,
    flops_per_gpu: float = 400e12,
    params: float = 405e9,
    bytes_per_token: float = 4,
    checkpoint_bytes: float | None = None,
    burst_write_s: float = 60.0,
    tier_bandwidth_Bps: float = 2e12,
    restore_bytes_per_param: float = 14,
    weight_bytes_per_param: float = 2,
    dp: int = 128,
) -> TokensReport:
    values = (gpus, flops_per_gpu, params, bytes_per_token, burst_write_s, tier_bandwidth_Bps, dp)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError("every input must be a positive finite number")
    tps = gpus * flops_per_gpu / (6 * params)
    ckpt = checkpoint_bytes if checkpoint_bytes is not None else 16 * params
    restore = restore_bytes_per_param * params
    weights = weight_bytes_per_param * params
    naive = weights * dp + (restore - weights)
    stream = tps * bytes_per_token
    burst = ckpt / burst_write_s
    return TokensReport(
        tokens_per_s=tps,
        token_stream_Bps=stream,
        checkpoint_bytes=ckpt,
        burst_write_s=burst_write_s,
        burst_Bps=burst,
        restore_bytes=restore,
        restore_bytes_naive=naive,
        tier_bandwidth_Bps=tier_bandwidth_Bps,
        restore_s=restore / tier_bandwidth_Bps,
        restore_naive_s=naive / tier_bandwidth_Bps,
        ratio_burst_to_stream=burst / stream,
    )
