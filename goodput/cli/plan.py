"""``goodput plan ...``: the arithmetic of failures, cadence, storage, memory and spot.

Every command prints a table whose figures carry their units (GB = 1e9 B, GiB = 2^30 B), or with
``--json`` one object. Bad input (negative, zero, unknown unit) is a clear error with exit status 2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from goodput.plan import units as U

app = typer.Typer(no_args_is_help=True)
console = Console()
T = TypeVar("T")


def parse(fn: Callable[..., T], value: Any, option: str, *args: Any) -> T:
    try:
        return fn(value, *args)
    except (U.UnitError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint=option) from None


def check(cond: bool, msg: str, option: str) -> None:
    if not cond:
        raise typer.BadParameter(msg, param_hint=option)


def positive(value: float, option: str) -> None:
    """A number given on the command line: finite (no nan, inf) and above zero."""
    check(math.isfinite(value), f"must be a finite number, got {value!r}", option)
    check(value > 0, f"must be positive, got {value!r}", option)


MAX_WHOLE = 2**53  # whole numbers above this are not exact as floats (and 10**400 overflows one)


def whole(value: int, option: str) -> None:
    """A count given on the command line (GPUs, nodes, layers...): positive and not absurdly large."""
    check(value > 0, f"must be positive, got {value}", option)
    check(value <= MAX_WHOLE, f"too large: must be at most 2^53 = {MAX_WHOLE:,}, got {len(str(value))} digits", option)


def finite(value: float, what: str, option: str) -> None:
    """A computed figure that overflowed a float means an input was absurdly large: say which."""
    check(math.isfinite(value), f"too large: {what} overflows a double-precision float", option)


def jsonable(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        x = asdict(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def emit(obj: Any) -> None:
    print(json.dumps(jsonable(obj), indent=2))


def table(title: str, rows: list[tuple[str, str]], note: str | None = None) -> None:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("quantity", style="bold", overflow="fold")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if note:
        console.print(note)


def wrap(fn: Callable[[], T], option: str = "input") -> T:
    try:
        return fn()
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=option) from None


# ---------------------------------------------------------------------------------------- failures
@app.command()
def failures(
    gpus: int = typer.Option(None, help="Scale the job MTBI to this many GPUs."),
    gpu_mtbf: str = typer.Option(None, "--gpu-mtbf", help="Per-GPU MTBF (default: implied by Llama 3, ~50,677 h)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The Llama 3 interruption table, job MTBI, per-GPU MTBF, and MTBI at N GPUs."""
    from goodput.plan.failures import LLAMA3_DAYS, LLAMA3_GPUS
    from goodput.plan.failures import failures as run

    if gpus is not None:
        whole(gpus, "--gpus")
    m = parse(U.parse_duration, gpu_mtbf, "--gpu-mtbf") if gpu_mtbf is not None else None
    r = run(gpus, m)
    if as_json:
        emit(
            {
                **asdict(r),
                "mtbi_h": r.mtbi_s / 3600,
                "gpu_mtbf_h": r.gpu_mtbf_s / 3600,
                "job_mtbi_h": r.job_mtbi_s / 3600,
            }
        )
        return
    t = Table(title=f"Llama 3 405B: unexpected interruptions in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} GPUs (Table 5)")
    for c in ("cause", "component", "count", "printed %", "recomputed %"):
        t.add_column(c)
    for c, pct in zip(r.causes, r.recomputed_pct):
        t.add_row(c.name, c.component, str(c.count), f"{c.printed_pct:.1f}", f"{pct:.1f}")
    t.add_row("total", "", str(r.total), f"{r.printed_pct_sum:.1f}", "100.0")
    console.print(t)
    console.print(
        f"[yellow]note[/yellow]: the printed percentages sum to {r.printed_pct_sum:.1f} %, not 100 %: e.g. "
        f"148/{r.total} is {100 * 148 / r.total:.1f} %, printed 30.1 %. Both columns are shown."
    )
    table(
        "failure rates",
        [
            ("job MTBI (Llama 3: 54 d × 24 h ÷ 419)", f"{U.fmt_duration(r.job_mtbi_s)} ({r.job_mtbi_s / 3600:.2f} h)"),
            ("per-GPU MTBF" + (" (given)" if m else " (implied: 16,384 × job MTBI)"), f"{r.gpu_mtbf_s / 3600:,.0f} h ({r.gpu_mtbf_s / 3600 / 24 / 365.25:.1f} years)"),
            (f"job MTBI at {r.gpus:,} GPUs (MTBF ÷ N)", f"{U.fmt_duration(r.mtbi_s)} ({r.mtbi_s / 3600:.3g} h)"),
        ],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- interval
def _mtbi(mtbf: str | None, gpus: int | None, gpu_mtbf: str | None) -> float:
    if mtbf is not None:
        check(gpus is None, "give --mtbf, or --gpus with --gpu-mtbf, not both", "--mtbf")
        check(gpu_mtbf is None, "give --mtbf, or --gpus with --gpu-mtbf, not both", "--gpu-mtbf")
        return parse(U.parse_duration, mtbf, "--mtbf")
    check(gpus is not None and gpu_mtbf is not None, "give --mtbf, or --gpus and --gpu-mtbf", "--mtbf")
    whole(gpus, "--gpus")
    return parse(U.parse_duration, gpu_mtbf, "--gpu-mtbf") / gpus


@app.command()
def interval(
    mtbf: str = typer.Option(None, help="Job mean time between interruptions, e.g. 3.09h."),
    gpus: int = typer.Option(None, help="GPUs (with --gpu-mtbf instead of --mtbf)."),
    gpu_mtbf: str = typer.Option(None, "--gpu-mtbf", help="Per-GPU MTBF, e.g. 50677h."),
    stall: str = typer.Option(..., help="Time a checkpoint blocks training (δ), e.g. 60s."),
    restart: str = typer.Option("0s", help="Restart time R."),
    write: str = typer.Option("0s", help="Background write time of an async checkpoint (adds to the loss)."),
    at: str = typer.Option(None, "--interval", help="Also evaluate this interval."),
    plot: Path = typer.Option(None, help="Write a PNG of waste against the interval."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Young, Daly and the exact optimum; waste (first order) and useful fraction (exact)."""
    from goodput.plan.interval import interval as run

    m = _mtbi(mtbf, gpus, gpu_mtbf)
    d = parse(U.parse_duration, stall, "--stall")
    r_ = parse(lambda v: U.parse_duration(v, allow_zero=True), restart, "--restart")
    w = parse(lambda v: U.parse_duration(v, allow_zero=True), write, "--write")
    given = parse(U.parse_duration, at, "--interval") if at is not None else None
    if given is not None:
        check(
            given >= w,
            f"{U.fmt_duration(given)} is shorter than --write {U.fmt_duration(w)}: a checkpoint cannot start "
            "before the previous one is written",
            "--interval",
        )
    rep = wrap(lambda: run(d, m, r_, w, given))
    if plot is not None:
        from goodput.cli.plots import interval_plot

        try:
            interval_plot(plot, d, m, r_, w, given)
        except OSError as e:
            raise typer.BadParameter(f"cannot write {plot}: {e}", param_hint="--plot") from None
    if as_json:
        emit(rep)
        return
    rows = [
        ("stall δ / MTBI M / restart R / write W", f"{U.fmt_duration(d)} / {U.fmt_duration(m)} / {U.fmt_duration(r_)} / {U.fmt_duration(w)}"),
        ("Young √(2δM)", f"{U.fmt_duration(rep.young_s)}  waste {U.fmt_pct(rep.waste_first_order_at_young)} (first order), useful {U.fmt_pct(rep.useful_fraction_at_young, 2)} (exact)"),
        ("Daly (higher order)", f"{U.fmt_duration(rep.daly_s)}  waste {U.fmt_pct(rep.waste_first_order_at_daly)} (first order), useful {U.fmt_pct(rep.useful_fraction_at_daly, 2)} (exact)"),
        ("exact optimum M[1+W₀(−e^{−(1+δ/M)})]", f"{U.fmt_duration(rep.optimal_s)}  waste {U.fmt_pct(rep.waste_first_order_at_optimal)} (first order), useful {U.fmt_pct(rep.useful_fraction_at_optimal, 2)} (exact)"),
    ]  # fmt: skip
    if given is not None:
        rows.append(
            (
                f"given τ = {U.fmt_duration(given)}",
                f"waste {U.fmt_pct(rep.waste_first_order_at_interval)} (first order), useful {U.fmt_pct(rep.useful_fraction_at_interval, 2)} (exact)",
            )
        )
    if w:
        rows.append(("floor", f"τ ≥ write time {U.fmt_duration(w)}; the write adds to the loss per failure"))
    table("checkpoint interval", rows, f"plot written to {plot}" if plot else None)


# ---------------------------------------------------------------------------------------- size
@app.command()
def size(
    params: str = typer.Option(..., help="Parameters, e.g. 405e9."),
    bytes_per_param: float = typer.Option(16, help="16 (in memory, ZeRO §3.1), 14 (checkpoint), 12 (no bf16 copy)."),
    gpus: int = typer.Option(16_384),
    tp: int = typer.Option(8),
    pp: int = typer.Option(16),
    bandwidth: str = typer.Option("100GB/s", help="Storage write bandwidth."),
    at: str = typer.Option("30min", "--interval", help="Checkpoint cadence."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Checkpoint bytes, bytes per GPU and per model-parallel replica, write time, share of the cadence."""
    from goodput.plan.size import size as run

    p = parse(U.parse_count, params, "--params", "a parameter count")
    positive(bytes_per_param, "--bytes-per-param")
    for v, o in ((gpus, "--gpus"), (tp, "--tp"), (pp, "--pp")):
        whole(v, o)
    bw = parse(U.parse_bandwidth, bandwidth, "--bandwidth")
    tau = parse(U.parse_duration, at, "--interval")
    finite(p * bytes_per_param, "--params × --bytes-per-param", "--params")
    r = wrap(lambda: run(p, bytes_per_param, gpus, tp, pp, bw, tau), "--gpus")
    if as_json:
        emit(r)
        return
    table(
        f"checkpoint of {p:.4g} parameters at {bytes_per_param:g} B/param",
        [
            ("total", U.fmt_bytes(r.total_bytes)),
            (f"per GPU (÷ {gpus:,}, replicas written once, spread)", U.fmt_bytes(r.bytes_per_gpu)),
            (f"per model-parallel replica (÷ DP {r.dp})", U.fmt_bytes(r.bytes_per_replica)),
            (f"per GPU if every replica wrote its TP×PP shard (÷ {tp * pp})", U.fmt_bytes(r.bytes_per_gpu_naive)),
            (f"write time at {U.fmt_bandwidth(bw)}", U.fmt_duration(r.write_s)),
            (f"share of a {U.fmt_duration(tau)} cadence (blocking write)", U.fmt_pct(r.overhead_fraction)),
        ],
        "An asynchronous write hides this time behind training; the stall is then the staging copy (goodput plan pcie).",
    )


# ---------------------------------------------------------------------------------------- tokens
@app.command()
def tokens(
    gpus: int = typer.Option(16_384),
    tflops: str = typer.Option("400", help="Achieved TFLOP/s per GPU (or a unit: 400T, 0.4P)."),
    params: str = typer.Option("405e9"),
    bytes_per_token: float = typer.Option(4, help="Bytes per token id (int32: 4)."),
    checkpoint_bytes: str = typer.Option(None, help="Checkpoint size (default 16 B/param)."),
    write_time: str = typer.Option("60s", help="Target time to write the checkpoint burst."),
    tier_bandwidth: str = typer.Option("2TB/s", help="Aggregate read bandwidth of the restore tier."),
    dp: int = typer.Option(128, help="Data-parallel replicas (for the read-everything restore)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Tokens/s, token-stream bytes/s, checkpoint burst bytes/s, restore time with and without read-once."""
    from goodput.plan.tokens import tokens as run

    whole(gpus, "--gpus")
    whole(dp, "--dp")
    positive(bytes_per_token, "--bytes-per-token")
    f = parse(U.parse_flops, tflops if any(c.isalpha() for c in tflops) else f"{tflops}T", "--tflops")
    p = parse(U.parse_count, params, "--params", "a parameter count")
    ck = parse(U.parse_bytes, checkpoint_bytes, "--checkpoint-bytes") if checkpoint_bytes else None
    wt = parse(U.parse_duration, write_time, "--write-time")
    bw = parse(U.parse_bandwidth, tier_bandwidth, "--tier-bandwidth")
    r = wrap(lambda: run(gpus, f, p, bytes_per_token, ck, wt, bw, dp=dp))
    overflowed = [k for k, v in asdict(r).items() if isinstance(v, float) and not math.isfinite(v)]
    check(
        not overflowed,
        f"too large: {', '.join(overflowed)} overflow a double-precision float",
        "--gpus/--tflops/--params/--checkpoint-bytes/--dp",
    )
    if as_json:
        emit(r)
        return
    table(
        "token stream vs checkpoint burst vs restore",
        [
            ("tokens/s (GPUs × FLOP/s ÷ 6N)", f"{r.tokens_per_s / 1e6:.2f} M tokens/s"),
            (f"token stream ({bytes_per_token:g} B/token)", U.fmt_bandwidth(r.token_stream_Bps)),
            (
                f"checkpoint burst ({U.fmt_bytes(r.checkpoint_bytes)} in {U.fmt_duration(wt)})",
                U.fmt_bandwidth(r.burst_Bps),
            ),
            ("burst ÷ stream", f"{r.ratio_burst_to_stream:,.0f} ×"),
            (
                f"restore, read once ({U.fmt_bytes(r.restore_bytes)} at {U.fmt_bandwidth(bw)})",
                U.fmt_duration(r.restore_s),
            ),
            (
                f"restore, every replica reads its bf16 shard ({U.fmt_bytes(r.restore_bytes_naive)})",
                U.fmt_duration(r.restore_naive_s),
            ),
        ],
        "The two workloads differ by orders of magnitude and want different storage tiers; read-once-and-broadcast sets the restore spec.",
    )


# ---------------------------------------------------------------------------------------- activations
@app.command()
def activations(
    seq: int = typer.Option(..., help="Sequence length s."),
    hidden: int = typer.Option(..., help="Hidden size h."),
    heads: int = typer.Option(..., help="Attention heads a."),
    layers: int = typer.Option(..., help="Transformer layers."),
    micro_batch: int = typer.Option(1, help="Micro-batch b."),
    tp: int = typer.Option(1, help="Tensor-parallel degree t."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism."),
    recompute: str = typer.Option("none", help="none | selective | full"),
    flash: bool = typer.Option(False, "--flash", help="FlashAttention (no s×s scores kept)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Korthikanti et al.'s activation bytes per layer and in total, and what each option saves."""
    from goodput.plan.activations import RECOMPUTE
    from goodput.plan.activations import activations as run

    for v, o in (
        (seq, "--seq"),
        (hidden, "--hidden"),
        (heads, "--heads"),
        (layers, "--layers"),
        (micro_batch, "--micro-batch"),
        (tp, "--tp"),
    ):
        whole(v, o)
    check(recompute in RECOMPUTE, f"must be one of {', '.join(RECOMPUTE)}", "--recompute")
    check(heads % tp == 0, f"must divide --heads {heads} (each rank holds whole heads)", "--tp")
    check(not sp or seq % tp == 0, f"with --sp must divide --seq {seq}", "--tp")
    try:
        r = run(seq, hidden, heads, layers, micro_batch, tp, sp, recompute, flash)
        finite(r.bytes_total, "the activation bytes", "--seq/--hidden/--heads/--micro-batch/--layers")
    except OverflowError:
        finite(math.inf, "the activation bytes", "--seq/--hidden/--heads/--micro-batch/--layers")
    if as_json:
        emit(r)
        return
    rows = [
        ("per layer", U.fmt_bytes(r.bytes_per_layer)),
        (f"total ({layers} layers, one micro-batch)", U.fmt_bytes(r.bytes_total)),
        ("attention-score term 5·a·s/h (per layer)", U.fmt_bytes(r.score_term_bytes_per_layer)),
        ("saving against no recompute", U.fmt_pct(r.saving_fraction)),
    ]
    for k, v in r.options.items():
        rows.append(
            (f"  option: {k}", f"{U.fmt_bytes(v)} per layer ({U.fmt_pct(1 - v / r.baseline_bytes_per_layer)} saved)")
        )
    table(
        f"activations: s={seq}, h={hidden}, a={heads}, b={micro_batch}, t={tp}{', SP' if sp else ''}, recompute={recompute}{', flash' if flash else ''}",
        rows,
    )


# ---------------------------------------------------------------------------------------- spot
def _spot_plottable(discount: float, rate: float, tau: float, restart: float, stall: float) -> bool:
    """The cost curve has a point to draw: a 1-node gang (the cheapest) keeps some useful work."""
    from goodput.plan.spot import spot as run

    return math.isfinite(run(discount, rate, 1, tau, restart, stall).cost_ratio)


def _gang(exact: int | None, first: int | None) -> str:
    def one(n: int | None) -> str:
        return "no limit" if n is None else f"{n:,}"

    return f"{one(exact)} nodes (exact), {one(first)} (first order)"


@app.command()
def spot(
    discount: str = typer.Option(..., help="Spot discount, e.g. 0.6 or 60%."),
    node_rate: str = typer.Option(..., help="Preemptions per node, e.g. 0.02/h."),
    nodes: int = typer.Option(..., help="Gang size in nodes."),
    at: str = typer.Option("30min", "--interval", help="Checkpoint interval τ."),
    restart: str = typer.Option("10min", help="Restart time R."),
    stall: str = typer.Option("0s", help="Checkpoint stall δ."),
    trace: Path = typer.Option(None, help="SkyPilot spot trace (JSON) to measure the rates from."),
    plot: Path = typer.Option(None, help="PNG: cost ratio against gang size."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Spot interruption rate, waste, useful fraction, cost, break-even, and the largest safe gang."""
    from goodput.plan.spot import spot as run
    from goodput.plan.spot import trace_rates

    d = parse(U.parse_fraction, discount, "--discount", "a discount")
    check(d < 1, "must be below 1", "--discount")
    lam = parse(U.parse_rate, node_rate, "--node-rate")
    whole(nodes, "--nodes")
    tau = parse(U.parse_duration, at, "--interval")
    r_ = parse(lambda v: U.parse_duration(v, allow_zero=True), restart, "--restart")
    s = parse(lambda v: U.parse_duration(v, allow_zero=True), stall, "--stall")
    measured = None
    if trace is not None:
        try:
            raw = json.loads(trace.read_text())
            measured = trace_rates([int(x) for x in raw["data"]], float(raw["metadata"]["gap_seconds"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise typer.BadParameter(f"cannot read SkyPilot trace {trace}: {e}", param_hint="--trace") from None
    rep = run(d, lam, nodes, tau, r_, s)
    if plot is not None:
        from goodput.cli.plots import spot_plot

        check(
            _spot_plottable(d, lam, tau, r_, s),
            "nothing to plot: at this rate even a 1-node gang loses all its work (cost ratio infinite)",
            "--plot",
        )
        try:
            spot_plot(plot, d, lam, tau, r_, s)
        except OSError as e:
            raise typer.BadParameter(f"cannot write {plot}: {e}", param_hint="--plot") from None
    if as_json:
        out = jsonable(rep)
        out["job_rate_per_h"] = rep.job_rate_per_s * 3600
        if measured is not None:
            out["trace"] = {
                **jsonable(measured),
                "node_rate_per_h": measured.node_rate_per_s * 3600,
                "gang_rate_per_h": measured.gang_rate_per_s * 3600,
            }
        emit(out)
        return
    rows = [
        (f"job interruption rate Λ = N·λ ({nodes} nodes)", f"{rep.job_rate_per_s * 3600:.4g} per hour (MTBI {U.fmt_duration(rep.job_mtbi_s)})"),
        ("waste per preemption τ/2 + R", U.fmt_duration(rep.waste_per_preemption_s)),
        ("time lost, first order Λ·(τ/2+R)", U.fmt_pct(rep.loss_first_order)),
        ("useful fraction (exact), spot / on-demand", f"{U.fmt_pct(rep.useful_fraction, 2)} / {U.fmt_pct(rep.useful_fraction_on_demand, 2)}"),
        ("cost per useful GPU-hour ÷ on-demand", f"{rep.cost_ratio:.3f}" + ("  [green]spot wins[/green]" if rep.cost_ratio < 1 else "  [red]on-demand wins[/red]")),
        ("break-even discount 1 − u_spot/u_od", U.fmt_pct(rep.break_even_discount)),
        ("largest gang keeping ≥ half the discount", _gang(rep.max_gang_nodes, rep.max_gang_nodes_first_order)),
        ("optimal interval on spot (exact)", U.fmt_duration(rep.optimal_interval_s) + (" (no preemptions)" if not math.isfinite(rep.optimal_interval_s) else " (no stall: as often as the write allows; give --stall)" if rep.optimal_interval_s == 0 else "")),
    ]  # fmt: skip
    for c in rep.cadences:
        rows.append(
            (
                f"  at τ = {U.fmt_duration(c.interval_s)}",
                f"useful {U.fmt_pct(c.useful_fraction_spot, 2)}, break-even discount {U.fmt_pct(c.break_even_discount)}, cost ratio {c.cost_ratio:.3f}",
            )
        )
    if measured is not None:
        rows += [
            (f"trace {trace.name}: per-node rate", f"{measured.node_rate_per_s * 3600:.4g} per node-hour ({measured.nodes_lost} lost in {measured.node_hours:,.0f} node-h)"),
            (f"trace: gang of {measured.gang_size} rate", f"{measured.gang_rate_per_s * 3600:.4g} per hour ({measured.gang_interruptions} in {measured.full_gang_s / 3600:,.0f} h at full size)"),
            ("trace: gang rate ÷ node rate", f"{measured.gang_vs_node:.2f} × (N·λ would say {measured.gang_size}; ratio to it {measured.gang_vs_independent:.2f})"),
        ]  # fmt: skip
    table(f"spot at {U.fmt_pct(d, 0)} off", rows, f"plot written to {plot}" if plot else None)


# ---------------------------------------------------------------------------------------- pcie
@app.command()
def pcie(
    gen: int = typer.Option(5, help="PCIe generation 1-6."),
    lanes: int = typer.Option(16),
    nic: str = typer.Option("400Gbps", help="NIC line rate."),
    nics: int = typer.Option(8),
    dram_channels: int = typer.Option(8),
    sockets: int = typer.Option(2),
    mts: float = typer.Option(4800, help="DRAM transfer rate (MT/s)."),
    ckpt_bytes_per_gpu: str = typer.Option("346MB", help="Checkpoint bytes per GPU for the staging stall."),
    d2h: str = typer.Option("50GB/s", help="Device-to-host copy bandwidth."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """PCIe link bandwidth, whether a NIC can be fed, DRAM traffic with and without GPUDirect RDMA."""
    from goodput.plan.pcie import GT_PER_S, LANES
    from goodput.plan.pcie import pcie as run

    check(gen in GT_PER_S, f"must be one of {', '.join(map(str, sorted(GT_PER_S)))}, got {gen}", "--gen")
    check(lanes in LANES, f"must be one of {', '.join(map(str, LANES))}, got {lanes}", "--lanes")
    for v, o in ((nics, "--nics"), (dram_channels, "--dram-channels"), (sockets, "--sockets")):
        whole(v, o)
    positive(mts, "--mts")
    n = parse(U.parse_bandwidth, nic, "--nic") * 8
    cb = parse(U.parse_bytes, ckpt_bytes_per_gpu, "--ckpt-bytes-per-gpu")
    bw = parse(U.parse_bandwidth, d2h, "--d2h")
    r = wrap(lambda: run(gen, lanes, n, nics, dram_channels, sockets, mts, cb, bw), "--gen/--lanes")
    finite(
        r.dram_peak_Bps * r.dram_traffic_without_gdr_Bps, "the DRAM figures", "--mts/--dram-channels/--sockets/--nics"
    )
    if as_json:
        emit(r)
        return
    table(
        f"PCIe Gen{gen} x{lanes} and {nics} × {n / 1e9:g} Gb/s NICs",
        [
            ("PCIe per direction (raw, after encoding)", U.fmt_bandwidth(r.pcie_Bps_per_direction)),
            ("after 5-15 % packet overhead", f"{U.fmt_bandwidth(r.pcie_Bps_after_overhead[0])} - {U.fmt_bandwidth(r.pcie_Bps_after_overhead[1])}"),
            (f"NVMe x4 at Gen{gen}", U.fmt_bandwidth(r.nvme_x4_Bps)),
            ("NIC per direction", U.fmt_bandwidth(r.nic_Bps)),
            ("can the link feed the NIC?", ("yes" if r.nic_fits else "[red]no[/red]") + ("" if r.nic_fits_after_overhead else " (not after 15 % overhead)")),
            (f"host DRAM peak (DDR {mts:g} MT/s × 8 B × {dram_channels} ch × {sockets} sockets)", U.fmt_bandwidth(r.dram_peak_Bps)),
            ("DRAM traffic, all NICs full duplex, without GDR", f"{U.fmt_bandwidth(r.dram_traffic_without_gdr_Bps)} = {r.dram_ratio_without_gdr:.2f} × peak"),
            ("DRAM traffic with GPUDirect RDMA", "0 (the NIC reads and writes GPU memory)"),
            (f"checkpoint staging stall ({U.fmt_bytes(cb)} ÷ {U.fmt_bandwidth(bw)})", U.fmt_duration(r.ckpt_stall_s)),
        ],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- run
@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="YAML: model, cluster, storage, checkpoint, spot (see examples/)."),
    out: Path = typer.Option(None, help="Directory for report.md and its plots (default: next to the config)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """One Markdown report (with PNG plots) for a planned training run."""
    import yaml

    from goodput.cli.plots import interval_plot, spot_plot
    from goodput.plan.run import ConfigError, plan_run, render_markdown

    try:
        cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
        p = plan_run(cfg)
    except UnicodeDecodeError as e:
        raise typer.BadParameter(f"{config} is not UTF-8 text: {e}", param_hint="CONFIG") from None
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise typer.BadParameter(str(e), param_hint="CONFIG") from None
    # default: next to the config, named after it ("run.yaml" -> "run/"; a config without a suffix -> "run.plan/")
    out = out or (config.with_suffix("") if config.suffix else config.with_name(config.name + ".plan"))
    check(not out.exists() or out.is_dir(), f"{out} exists and is not a directory", "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise typer.BadParameter(f"cannot create {out}: {e}", param_hint="--out") from None
    plots = {"interval": "interval.png"}
    interval_plot(out / "interval.png", p.stall_s, p.mtbi_s, p.restart_s, p.write_s, p.interval_s)
    if p.spot is not None and _spot_plottable(p.spot.discount, p.spot.node_rate_per_s, p.interval_s,
                                              p.restart_s + p.write_s, p.stall_s):  # fmt: skip
        plots["spot"] = "spot.png"
        spot_plot(
            out / "spot.png",
            p.spot.discount,
            p.spot.node_rate_per_s,
            p.interval_s,
            p.restart_s + p.write_s,
            p.stall_s,
            max(256, 4 * p.spot.nodes),
        )
    md = render_markdown(p, plots)
    (out / "report.md").write_text(md)
    if as_json:
        emit({**jsonable(p), "report": str(out / "report.md")})
        return
    console.print(md, markup=False, highlight=False)
    console.print(f"report written to {out / 'report.md'}")


# ---------------------------------------------------------------------------------------- nccl
@app.command()
def nccl(
    logfile: Path = typer.Argument(..., help="An NCCL_DEBUG=INFO log (any NCCL version)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Each connection's transport and whether it uses GPUDirect RDMA, and a verdict."""
    from goodput.plan.nccl import parse_nccl_log

    try:
        text = logfile.read_text(errors="replace")
    except OSError as e:
        raise typer.BadParameter(f"cannot read {logfile}: {e}", param_hint="LOGFILE") from None
    r = parse_nccl_log(text)
    if as_json:
        emit(r.to_dict())
        return
    from rich.markup import escape  # everything below quotes the log: "[/]" in it is text, not markup

    version = f" (NCCL {escape(r.nccl_version)})" if r.nccl_version else ""
    t = Table(title=f"NCCL connections in {escape(logfile.name)}{version}")
    # folded, never "…"-truncated; the GDR column says "intra" for P2P/SHM, where GDR does not apply
    for c in ("line", "host", "ch", "from → to", "dir", "via", "GDR"):
        t.add_column(c, overflow="fold")
    for c in r.connections[:200]:
        t.add_row(
            str(c.line_no), escape(c.host or ""), "" if c.channel is None else str(c.channel),
            f"{c.src_rank} → {'' if c.dst_rank is None else c.dst_rank}", c.direction, escape(c.detail),
            ("[green]yes[/green]" if c.gdr else "[red]no[/red]") if c.inter_node else "intra",
        )  # fmt: skip
    console.print(t)
    if len(r.connections) > 200:
        console.print(f"{len(r.connections) - 200} more connections not shown (use --json)")
    for h in r.hca:
        where = " on " + escape(h.host) if h.host else ""
        console.print(
            f"HCA {h.hca_index} {escape(repr(h.name))}{where}: GPU Direct RDMA {'enabled' if h.enabled else '[red]disabled[/red]'}"
        )
    good = r.inter_node == r.inter_node_gdr and r.inter_node > 0
    console.print(
        f"[bold]verdict[/bold]: {'[green]' if good else '[yellow]'}{escape(r.verdict)}{'[/green]' if good else '[/yellow]'}"
    )
    for a in r.advice:
        console.print(f"  - {escape(a)}")
