"""Activation memory per transformer layer (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", MLSys 2023, Table 2).

Bytes per layer per micro-batch, with s sequence, b micro-batch, h hidden, a heads, t tensor
parallel degree (16-bit activations):
- no parallelism:                       s·b·h·(34 + 5·a·s/h)
- tensor parallel:                      s·b·h·(10 + 24/t + 5·a·s/(h·t))
- tensor + sequence parallel:           s·b·h·(34 + 5·a·s/h) / t
- selective recompute drops the 5·a·s/h attention-score term (FlashAttention removes it the same
  way, never materialising the s×s scores);
- full recompute keeps only the layer input, 2·s·b·h (÷ t with sequence parallelism).
Check: s = h = 8192, b = 1: 34·s·h = 2.28 GB per layer, 182 GB over 80 layers (the row without
the score term and without TP). GPT-3 175B (s 2048, h 12288, a 96, t 8, SP): selective recompute
saves 70 % of activation memory.
"""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class ActivationReport:
    seq: int
    hidden: int
    heads: int
    layers: int
    micro_batch: int
    tp: int
    sp: bool
    recompute: str
    flash: bool
    bytes_per_layer: float
    bytes_total: float
    score_term_bytes_per_layer: float  # what selective recompute / FlashAttention removes
    baseline_bytes_per_layer: float  # same parallelism, no recompute, no flash
    saving_fraction: float  # 1 - bytes / baseline
    options: dict[str, float]  # bytes per layer under each option, same s, b, h, a, t


def per_layer(
    s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, recompute: str = "none", flash: bool = False
) -> float:
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if min(s, b, h, a, t) <= 0:
        raise ValueError("seq, micro-batch, hidden, heads and TP must be positive")
    # the formulas split whole heads, and with SP whole sequence positions, over the t ranks (as
    # Megatron asserts): any other t is a layout no framework runs, whose figure would mislead
    if a % t:
        raise ValueError(f"TP {t} must divide the heads {a}: each rank holds a/t whole heads")
    if sp and s % t:
        raise ValueError(f"with sequence parallelism TP {t} must divide the sequence length {s}")
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    score = 0.0 if (recompute == "selective" or flash) else 5 * a * s / h
    if sp:
        return sbh * (34 + score) / t
    if t > 1:
        return sbh * (10 + 24 / t + score / t)
    return sbh * (34 + score)


def activations(
    seq: int, hidden: int, heads: int, layers: int, micro_batch: int = 1, tp: int = 1, sp: bool = False,
    recompute: str = "none", flash: bool = False,
) -> ActivationReport:  # fmt: skip
    args = (seq, micro_batch, hidden, heads, tp, sp)
    b = per_layer(*args, recompute=recompute, flash=flash)
    base = per_layer(*args)
    options = {
        "none": base,
        "flash": per_layer(*args, flash=True),
        "selective": per_layer(*args, recompute="selective"),
        "full": per_layer(*args, recompute="full"),
        "tp_without_sp": per_layer(seq, micro_batch, hidden, heads, tp, False),
    }
    if seq % tp == 0:  # sequence parallelism splits whole positions: an option only where t divides s
        options["tp_with_sp"] = per_layer(seq, micro_batch, hidden, heads, tp, True)
    return ActivationReport(
        seq=seq, hidden=hidden, heads=heads, layers=layers, micro_batch=micro_batch, tp=tp, sp=sp,
        recompute=recompute, flash=flash, bytes_per_layer=b, bytes_total=b * layers,
        score_term_bytes_per_layer=base - options["selective"], baseline_bytes_per_layer=base,
        saving_fraction=1 - b / base, options=options,
    )  # fmt: skip
