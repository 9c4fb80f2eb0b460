"""``goodput plan run``: one report for a planned training run, joining every chain of arithmetic.

Pure: takes the parsed configuration (a dict, human units allowed), returns the figures and the
Markdown; the command line reads the YAML and writes the report and its plots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import units as U
from .activations import RECOMPUTE, ActivationReport, activations
from .interval import IntervalReport, interval
from .pcie import GT_PER_S, LANES, PcieReport, pcie
from .size import SizeReport, size
from .spot import SpotReport, spot
from .tokens import TokensReport, tokens


class ConfigError(ValueError):
    """The configuration is incomplete or wrong; the message names the key."""


@dataclass(frozen=True)
class RunPlan:
    name: str
    mtbi_s: float
    stall_s: float
    write_s: float
    restart_s: float
    interval_s: float
    size: SizeReport
    interval: IntervalReport
    tokens: TokensReport
    activations: ActivationReport | None
    pcie: PcieReport
    spot: SpotReport | None
    spot_interval: IntervalReport | None


def _get(cfg: dict[str, Any], path: str, default: Any = ...) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is ...:
                raise ConfigError(f"missing key {path!r}")
            return default
        node = node[part]
    return node


def _p(fn, cfg: dict[str, Any], path: str, default: Any = ...) -> Any:
    v = _get(cfg, path, default)
    if v is None:
        return None
    try:
        return fn(v)
    except (ValueError, TypeError, OverflowError) as e:
        raise ConfigError(f"{path}: {e}") from None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"must be a positive whole number, got {v!r}")
    f = float(v)
    if not math.isfinite(f) or f <= 0 or f != int(f):
        raise ValueError(f"must be a positive whole number, got {v!r}")
    if f > 2**53:
        raise ValueError(f"too large: must be at most 2^53, got {v!r}")
    return int(f)


def _pos(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"must be a positive number, got {v!r}")
    f = float(v)
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"must be a positive finite number, got {v!r}")
    return f


def _bool(v: Any) -> bool:
    # YAML reads true/false/yes/no as booleans; a quoted "false" is a string, and bool("false") is True
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false (unquoted), got {v!r}")
    return v


def _choice(options: tuple[Any, ...]):
    def fn(v: Any) -> Any:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(map(str, options))}, got {v!r}")
        return v

    return fn


def _call(path: str, fn, *args, **kwargs):
    """Run one chain of arithmetic; a ValueError from it names the configuration key(s) it came from."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, OverflowError) as e:
        raise ConfigError(f"{path}: {e}") from None


def plan_run(cfg: dict[str, Any]) -> RunPlan:
    if not isinstance(cfg, dict):
        raise ConfigError("the configuration must be a mapping")
    params = _p(lambda v: U.parse_count(v, "a parameter count"), cfg, "model.params")
    bpp = _p(_pos, cfg, "model.bytes_per_param", 14)
    gpus = _p(_int, cfg, "cluster.gpus")
    tp = _p(_int, cfg, "cluster.tp", 1)
    pp = _p(_int, cfg, "cluster.pp", 1)
    if gpus % (tp * pp):
        raise ConfigError(f"cluster.gpus ({gpus}) must be a multiple of tp × pp ({tp * pp})")
    flops = _p(
        lambda v: U.parse_flops(v if isinstance(v, str) and any(c.isalpha() for c in v) else f"{v}T"),
        cfg,
        "cluster.tflops",
        400,
    )
    mtbf = _p(U.parse_duration, cfg, "cluster.gpu_mtbf", "50677h")
    write_bw = _p(U.parse_bandwidth, cfg, "storage.write_bandwidth")
    read_bw = _p(U.parse_bandwidth, cfg, "storage.read_bandwidth", _get(cfg, "storage.write_bandwidth"))
    d2h = _p(U.parse_bandwidth, cfg, "storage.d2h", "50GB/s")
    restart = _p(lambda v: U.parse_duration(v, allow_zero=True), cfg, "checkpoint.restart", "10min")
    asynchronous = _p(_bool, cfg, "checkpoint.async", True)
    sz0 = _call("model.params × model.bytes_per_param", size, params, bpp, gpus, tp, pp, write_bw, 1800.0)
    mtbi = mtbf / gpus
    gen = _p(lambda v: _choice(tuple(GT_PER_S))(_int(v)), cfg, "cluster.pcie_gen", 5)
    lanes = _p(lambda v: _choice(LANES)(_int(v)), cfg, "cluster.pcie_lanes", 16)
    link = _call(
        "cluster.nic", pcie, gen, lanes,
        _p(lambda v: U.parse_bandwidth(v) * 8, cfg, "cluster.nic", "400Gbps"), _p(_int, cfg, "cluster.nics", 8),
        ckpt_bytes_per_gpu=sz0.bytes_per_gpu, d2h_Bps=d2h,
    )  # fmt: skip
    if asynchronous:
        stall, write = link.ckpt_stall_s, sz0.write_s
    else:
        stall, write = sz0.write_s, 0.0
    given = _get(cfg, "checkpoint.interval", "auto")
    iv = _call("cluster.gpu_mtbf/checkpoint.restart", interval, stall, mtbi, restart, write)
    tau = iv.optimal_s if given in ("auto", None) else _p(U.parse_duration, cfg, "checkpoint.interval")
    iv = _call("checkpoint.interval", interval, stall, mtbi, restart, write, tau)
    sz = _call("checkpoint.interval", size, params, bpp, gpus, tp, pp, write_bw, tau)
    tk = _call("cluster.tflops", tokens, gpus, flops, params, 4, sz.total_bytes,
               max(write, 1e-9) if asynchronous else sz.write_s, read_bw, restore_bytes_per_param=bpp, dp=sz.dp)  # fmt: skip
    act = None
    if _get(cfg, "model.seq", None) is not None:
        act = _call(
            "model.seq/hidden/heads/layers", activations,
            _p(_int, cfg, "model.seq"), _p(_int, cfg, "model.hidden"), _p(_int, cfg, "model.heads"), _p(_int, cfg, "model.layers"),
            _p(_int, cfg, "model.micro_batch", 1), tp, _p(_bool, cfg, "model.sp", tp > 1),
            _p(_choice(RECOMPUTE), cfg, "model.recompute", "none"), _p(_bool, cfg, "model.flash", False),
        )  # fmt: skip
    sp = sp_iv = None
    if isinstance(cfg.get("spot"), dict):
        nodes = _p(_int, cfg, "spot.gang_nodes")
        rate = _p(U.parse_rate, cfg, "spot.node_rate")
        disc = _p(lambda v: U.parse_fraction(v, "spot.discount"), cfg, "spot.discount")
        if disc >= 1:
            raise ConfigError(f"spot.discount: must be below 1 (100 % off is free), got {disc!r}")
        sp = _call("spot.node_rate", spot, disc, rate, nodes, tau, restart + write, stall, min_interval_s=write)
        if rate > 0:
            sp_iv = _call("spot.node_rate", interval, stall, 1 / (nodes * rate), restart, write)
    return RunPlan(str(cfg.get("name", "run")), mtbi, stall, write, restart, tau, sz, iv, tk, act, link, sp, sp_iv)


def _nodes(n: int | None) -> str:
    return "no limit" if n is None else f"{n:,} nodes"


def render_markdown(p: RunPlan, plots: dict[str, str] | None = None) -> str:
    plots = plots or {}
    s, iv, tk, link = p.size, p.interval, p.tokens, p.pcie
    out = [
        f"# Run plan: {p.name}",
        "",
        "Figures from `goodput plan`; GB = 10⁹ B, GiB = 2³⁰ B. \"Exact\" figures use Daly's model, \"first order\" the δ/τ + (τ/2+R)/M approximation.",
        "",
        "## Failures",
        f"- {s.gpus:,} GPUs at a per-GPU MTBF of {p.mtbi_s * s.gpus / 3600:,.0f} h: job MTBI **{U.fmt_duration(p.mtbi_s)}**.",
        "",
        "## Checkpoint size and write",
        f"- {s.params:.4g} parameters × {s.bytes_per_param:g} B = **{U.fmt_bytes(s.total_bytes)}**; per GPU (replicas written once, spread) {U.fmt_bytes(s.bytes_per_gpu)}; per model-parallel replica (÷ DP {s.dp}) {U.fmt_bytes(s.bytes_per_replica)}.",
        f"- Write at {U.fmt_bandwidth(s.bandwidth_Bps)}: **{U.fmt_duration(s.write_s)}**, {U.fmt_pct(s.overhead_fraction)} of the {U.fmt_duration(p.interval_s)} cadence if it blocked.",
        f"- Stall per checkpoint δ = **{U.fmt_duration(p.stall_s)}**" + (f" (async: staging {U.fmt_bytes(link.ckpt_bytes_per_gpu)} per GPU at {U.fmt_bandwidth(link.d2h_Bps)}; the {U.fmt_duration(p.write_s)} write runs behind training and adds to the loss per failure)." if p.write_s else " (synchronous write)."),
        "",
        "## Interval",
        f"- Young {U.fmt_duration(iv.young_s)}, Daly {U.fmt_duration(iv.daly_s)}, exact optimum **{U.fmt_duration(iv.optimal_s)}**" + (f" (floored at the write time {U.fmt_duration(iv.floor_s)})" if iv.floor_s else "") + ".",
        f"- Chosen τ = {U.fmt_duration(p.interval_s)}: useful fraction **{U.fmt_pct(iv.useful_fraction_at_interval or 0, 2)}** (exact), waste {U.fmt_pct(iv.waste_first_order_at_interval or 0)} (first order).",
    ]  # fmt: skip
    if "interval" in plots:
        out += ["", f"![waste against interval]({plots['interval']})"]
    out += [
        "",
        "## Token stream, checkpoint burst, restore",
        f"- {tk.tokens_per_s / 1e6:.2f} M tokens/s → token stream {U.fmt_bandwidth(tk.token_stream_Bps)}; checkpoint burst {U.fmt_bandwidth(tk.burst_Bps)} ({tk.ratio_burst_to_stream:,.0f} × the stream).",
        f"- Restore at {U.fmt_bandwidth(tk.tier_bandwidth_Bps)}: read once {U.fmt_duration(tk.restore_s)} ({U.fmt_bytes(tk.restore_bytes)}); if every replica reads its weights {U.fmt_duration(tk.restore_naive_s)} ({U.fmt_bytes(tk.restore_bytes_naive)}).",
        "",
        "## Interconnect",
        f"- PCIe Gen{link.gen} x{link.lanes}: {U.fmt_bandwidth(link.pcie_Bps_per_direction)} per direction; a {link.nic_bps / 1e9:g} Gb/s NIC needs {U.fmt_bandwidth(link.nic_Bps)}: {'fits' if link.nic_fits else '**does not fit**'}.",
        f"- Without GPUDirect RDMA, {link.nics} NICs at full duplex need {U.fmt_bandwidth(link.dram_traffic_without_gdr_Bps)} of host DRAM traffic, {link.dram_ratio_without_gdr:.2f} × the {U.fmt_bandwidth(link.dram_peak_Bps)} peak. Check the path with `goodput plan nccl LOG`.",
    ]  # fmt: skip
    if p.activations is not None:
        a = p.activations
        out += [
            "",
            "## Activation memory",
            f"- s={a.seq}, h={a.hidden}, a={a.heads}, t={a.tp}{' + SP' if a.sp else ''}, recompute={a.recompute}: **{U.fmt_bytes(a.bytes_per_layer)}** per layer, {U.fmt_bytes(a.bytes_total)} over {a.layers} layers per micro-batch ({U.fmt_pct(a.saving_fraction)} saved against no recompute).",
        ]  # fmt: skip
    if p.spot is not None:
        sp = p.spot
        out += [
            "",
            "## Spot",
            f"- {sp.nodes}-node gang at {sp.node_rate_per_s * 3600:g} preemptions per node-hour: Λ = {sp.job_rate_per_s * 3600:.3g}/h; waste per preemption {U.fmt_duration(sp.waste_per_preemption_s)}.",
            f"- Useful fraction {U.fmt_pct(sp.useful_fraction, 2)} on spot vs {U.fmt_pct(sp.useful_fraction_on_demand, 2)} on demand; cost per useful GPU-hour **{sp.cost_ratio:.3f} ×** on-demand at {U.fmt_pct(sp.discount, 0)} off; break-even discount {U.fmt_pct(sp.break_even_discount)}.",
            f"- Largest gang keeping at least half the discount: **{_nodes(sp.max_gang_nodes)}** (exact; {_nodes(sp.max_gang_nodes_first_order)} first order)." + (" This gang should not run on spot." if sp.max_gang_nodes is not None and sp.nodes > sp.max_gang_nodes else ""),
        ]  # fmt: skip
        if p.spot_interval is not None:
            o = p.spot_interval.optimal_s
            how = "shortens to" if o < p.interval_s else "lengthens to" if o > p.interval_s else "stays at"
            out.append(
                f"- On spot, counting preemptions only (M = 1/Λ = {U.fmt_duration(p.spot_interval.mtbi_s)}), "
                f"the optimal interval {how} {U.fmt_duration(o)}"
                + (
                    f" (floored at the write time {U.fmt_duration(p.spot_interval.floor_s)})."
                    if o <= p.spot_interval.floor_s
                    else "."
                )
            )
        for c in sp.cadences:
            out.append(
                f"  - τ = {U.fmt_duration(c.interval_s)}: useful {U.fmt_pct(c.useful_fraction_spot, 2)}, break-even discount {U.fmt_pct(c.break_even_discount)}, cost ratio {c.cost_ratio:.3f}"
            )
        if "spot" in plots:
            out += ["", f"![spot cost against gang size]({plots['spot']})"]
    return "\n".join(out) + "\n"
