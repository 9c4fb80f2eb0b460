"""Tables (rich) and PNG plots (matplotlib) of a policy comparison."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .compare import PolicyResult
from .ledger import CATEGORIES

LABELS = {
    "useful": "useful",
    "lost_preemption": "lost: preemption",
    "lost_failure": "lost: failures + infra",
    "restart": "restart",
    "checkpoint_stall": "ckpt stall",
    "draining": "draining",
    "double_booked": "double-booked",
    "idle": "idle",
}


def _h(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}"


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "∞"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def render(results: Sequence[PolicyResult], console: Console, header: str = "") -> None:
    if header:
        console.print(header)
    t = Table(title="policies (same jobs, same cluster events)", title_justify="left")
    for col in (
        "policy",
        "goodput",
        "lost GPU-h",
        "wait p50",
        "wait p99",
        "utilization",
        "cost $",
        "$ / useful GPU-h",
        "spot GPU-h",
        "violations",
        "double-booked GPU-h",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        m = r.metrics
        t.add_row(
            f"[bold]{r.name}[/bold]" if "goodput" in r.name else r.name,
            f"{m['goodput']:.4f}",
            _h(m["lost_gpu_hours"]),
            _dur(m["wait_p50_s"]),
            _dur(m["wait_p99_s"]),
            f"{m['utilization']:.3f}",
            f"{m['cost_usd']:,.0f}",
            f"{m['cost_per_useful_gpu_hour']:.3f}",
            _h(m["spot_gpu_hours"]),
            str(m["violations"]) if not m["violations"] else f"[red]{m['violations']}[/red]",
            _h(m["double_booked_gpu_hours"]),
        )
    console.print(t)
    led = Table(title="where the GPU-hours went (the badput ledger)", title_justify="left")
    led.add_column("policy")
    for c in (*CATEGORIES, "idle"):
        led.add_column(LABELS[c], justify="right")
    for r in results:
        hours = r.metrics["ledger_gpu_hours"]
        led.add_row(r.name, *(_h(hours[c]) for c in (*CATEGORIES, "idle")))
    console.print(led)
    ours = next((r for r in results if "goodput" in r.name), results[0])
    if ours.tenants:
        tt = Table(title=f"per tenant, {ours.name} (GPU-hours)", title_justify="left")
        tt.add_column("tenant")
        for c in ("allocated", *CATEGORIES):
            tt.add_column(LABELS.get(c, c), justify="right")
        for name, acct in sorted(ours.tenants.items(), key=lambda kv: -kv[1]["allocated"])[:16]:
            tt.add_row(name, *(_h(acct[c]) for c in ("allocated", *CATEGORIES)))
        console.print(tt)
    for r in results:
        if r.metrics["violations"]:
            kinds = ", ".join(f"{k} {v}" for k, v in r.metrics["violations_by_kind"].items())
            console.print(
                f"[yellow]{r.name}[/yellow]: checker found {kinds}; e.g. {r.examples[0] if r.examples else ''}"
            )


def plots(results: Sequence[PolicyResult], directory: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [r.name for r in results]
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=120)
    bottom = [0.0] * len(results)
    for c in CATEGORIES[1:]:
        vals = [r.metrics["ledger_gpu_hours"][c] for r in results]
        ax.bar(names, vals, bottom=bottom, label=LABELS[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("GPU-hours")
    ax.set_title("badput by policy (everything allocated but useful)")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=15, ha="right")
    fig.tight_layout()
    p = out_dir / "sched_badput.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    for r in results:
        w = sorted(max(x, 1.0) for x in r.waits)
        if not w:
            continue
        ys = [(i + 1) / len(w) for i in range(len(w))]
        ax.plot(w, ys, label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("queue wait before first start (s, log; waits under 1 s drawn at 1 s)")
    ax.set_ylabel("share of jobs")
    ax.set_title("queue wait, cumulative")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "sched_wait_cdf.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    axes[0].bar(names, [r.metrics["goodput"] for r in results], color="tab:green")
    lo = min(r.metrics["goodput"] for r in results)
    axes[0].set_ylim(max(0.0, lo - 0.05), 1.0)
    axes[0].set_title("goodput (useful / allocated GPU-hours)")
    axes[1].bar(names, [r.metrics["lost_gpu_hours"] for r in results], color="tab:red")
    axes[1].set_title("work lost (GPU-hours)")
    for ax in axes:
        plt.setp(ax.get_xticklabels(), rotation=15, ha="right", fontsize=8)
    fig.tight_layout()
    p = out_dir / "sched_goodput.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)
    return paths
