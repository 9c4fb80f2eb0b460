"""PNG plots for the plan commands (matplotlib, headless). Kept out of goodput.plan: plotting is I/O."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from goodput.plan import interval as iv  # noqa: E402


def interval_plot(
    path: str | Path, delta: float, mtbi: float, restart: float, write: float, given: float | None = None
) -> Path:
    taus, waste, useful = iv.curves(delta, mtbi, restart, write)
    rep = iv.interval(delta, mtbi, restart, write, given)
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    mins = [t / 60 for t in taus]
    ax.plot(mins, [100 * w for w in waste], label="waste, first order: δ/τ + (τ/2+R)/M")
    ax.plot(mins, [100 * (1 - u) for u in useful], label="waste, exact (Daly): 1 − u(τ)")
    for name, t, style, color in (
        ("Young", rep.young_s, ":", "tab:green"),
        ("Daly", rep.daly_s, "--", "tab:purple"),
        ("exact optimum", rep.optimal_s, "-", "black"),
    ):
        ax.axvline(t / 60, linestyle=style, color=color, linewidth=1, label=f"{name}: {t / 60:.1f} min")
    if given:
        ax.axvline(given / 60, color="red", linewidth=1, label=f"given: {given / 60:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval τ (minutes, log scale)")
    ax.set_ylabel("time lost (%)")
    top = min(100.0, max(5.0, 3 * 100 * (1 - rep.useful_fraction_at_optimal)))
    ax.set_ylim(0, top)
    ax.set_title(
        f"δ = {delta:g} s stall, M = {mtbi / 3600:.2f} h, R = {restart / 60:.1f} min"
        + (f", write {write:g} s" if write else "")
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def spot_plot(
    path: str | Path,
    discount: float,
    node_rate: float,
    interval_s: float,
    restart: float,
    stall: float,
    max_nodes: int = 256,
) -> Path:
    from goodput.plan.spot import spot

    ns = sorted({max(1, round(max_nodes ** (i / 60))) for i in range(61)})
    ratios = [spot(discount, node_rate, n, interval_s, restart, stall).cost_ratio for n in ns]
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    ax.plot(
        ns, [r if math.isfinite(r) else float("nan") for r in ratios], label="spot cost per useful GPU-hour ÷ on-demand"
    )
    ax.axhline(1.0, color="red", linewidth=1, label="break-even")
    ax.axhline(1 - discount / 2, color="orange", linewidth=1, linestyle="--", label="keeps half the discount")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.5)
    ax.set_xlabel("gang size (nodes)")
    ax.set_ylabel("relative cost")
    ax.set_title(
        f"{100 * discount:.0f} % off, λ = {node_rate * 3600:g}/node-h, τ = {interval_s / 60:.0f} min, R = {restart / 60:.0f} min"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
