"""Tables (rich) and PNG plots (matplotlib) of a policy comparison."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
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


def _table(title: str, first: str, cols: Sequence[str]) -> Table:
    """A table that stays whole at 80 columns: no vertical rules, headers broken where we say
    (``\\n``), cells never cut (a cut number reads as another number)."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    t.add_column(first, no_wrap=True, overflow="fold")
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True, overflow="fold")
    return t


def _name(r: PolicyResult) -> str:
    return f"[bold]{r.name}[/bold]" if "goodput" in r.name else r.name


def _window_line(results: Sequence[PolicyResult]) -> str:
    w = next((r.metrics.get("window") for r in results if r.metrics.get("window")), None)
    if not w:
        return ""
    ends = ", ".join(f"{r.name} {_dur(r.metrics['window'].get('run_end_s', 0.0))}" for r in results)
    return (
        f"window of useful/capacity: 0 to {_dur(w['end_s'])} "
        f"({'a batch: its longest job' if w.get('what', '').startswith('a batch') else 'the last arrival'}, "
        "every policy alike); "
        f"the other columns run to each policy's last job end ({ends})"
    )


def render(results: Sequence[PolicyResult], console: Console, header: str = "") -> None:
    """Every table fits 80 columns, so a piped or narrow terminal shows every figure whole."""
    if header:
        console.print(header)
    line = _window_line(results)
    if line:
        console.print(line)
    t = _table(
        "policies: work (same jobs, same cluster events)",
        "policy",
        ("useful /\ncapacity", "goodput", "utiliz-\nation", "lost\nGPU-h", "checker\nviolations"),
    )
    for r in results:
        m = r.metrics
        v = m["violations"]
        t.add_row(
            _name(r),
            f"{m['useful_per_capacity']:.4f}" if "useful_per_capacity" in m else "-",
            f"{m['goodput']:.4f}",
            f"{m['utilization']:.3f}",
            _h(m.get("lost_gpu_hours_total", m["lost_gpu_hours"])),
            str(v) if not v else f"[red]{v}[/red]",
        )
    console.print(t)
    t = _table(
        "policies: waits and cost", "policy", ("wait\np50", "wait\np99", "cost $", "$ / useful\nGPU-h", "spot\nGPU-h")
    )
    for r in results:
        m = r.metrics
        t.add_row(
            _name(r),
            _dur(m["wait_p50_s"]),
            _dur(m["wait_p99_s"]),
            f"{m['cost_usd']:,.0f}",
            f"{m['cost_per_useful_gpu_hour']:.3f}",
            _h(m["spot_gpu_hours"]),
        )
    console.print(t)
    if all("preemption_decisions" in r.metrics for r in results):
        t = _table(
            "preemptions by the policy (priority, quota)",
            "policy",
            ("deci-\nsions", "victims", "victims\n/ deci-\nsion", "victim\nran\n(p50)", "most\nevic-\ntions\nof a job"),
        )
        for r in results:
            m = r.metrics
            t.add_row(
                _name(r),
                f"{m['preemption_decisions']:,}",
                f"{m['victims']:,}",
                f"{m['victims_per_decision']:.2f}",
                _dur(m["victim_run_p50_s"]),
                str(m["max_evictions_of_one_job"]),
            )
        console.print(t)
        reasons = sorted({k for r in results for k in r.metrics.get("preemptions_by_reason", {})})
        if reasons:
            t = _table("every preemption, by reason", "policy", ())
            t.add_column("reason: count", no_wrap=False)  # a list that wraps, whatever the reasons
            for r in results:
                by = r.metrics.get("preemptions_by_reason", {})
                t.add_row(_name(r), ", ".join(f"{k} {by[k]:,}" for k in reasons if by.get(k)) or "none")
            console.print(t)
    t = _table(
        "lost GPU-hours by cause",
        "policy",
        ("preemp-\ntion", "failure\n+ infra", "restart", "drain-\ning", "double\nbooked", "total"),
    )
    for r in results:
        hours = r.metrics["ledger_gpu_hours"]
        parts = [hours[c] for c in ("lost_preemption", "lost_failure", "restart", "draining", "double_booked")]
        t.add_row(_name(r), *(_h(x) for x in parts), _h(sum(parts)))
    console.print(t)
    t = _table(
        "the rest of the ledger (GPU-hours)", "policy", ("useful", "ckpt\nstall", "idle", "double-booked\nGPU-h seen")
    )
    for r in results:
        hours = r.metrics["ledger_gpu_hours"]
        t.add_row(
            _name(r),
            _h(hours["useful"]),
            _h(hours["checkpoint_stall"]),
            _h(hours["idle"]),
            _h(r.metrics["double_booked_gpu_hours"]),
        )
    console.print(t)
    ours = next((r for r in results if "goodput" in r.name), results[0])
    shares = ours.metrics.get("tenant_shares") or {}
    if ours.tenants:
        t = _table(
            f"per tenant, {ours.name} (GPU-hours; shares of the allocated)",
            "tenant",
            ("allocated", "useful", "lost", "share", "entitle-\nment", "demand"),
        )
        for name, acct in sorted(ours.tenants.items(), key=lambda kv: -kv[1]["allocated"])[:16]:
            sh = shares.get(name, {})
            t.add_row(
                name,
                _h(acct["allocated"]),
                _h(acct["useful"]),
                _h(acct["lost_preemption"] + acct["lost_failure"]),
                f"{sh['share']:.3f}" if sh else "-",
                f"{sh['entitlement']:.3f}" if sh else "-",
                f"{sh['demand']:.3f}" if sh else "-",
            )
        if len(ours.tenants) > 16:
            t.caption = f"the 16 largest of {len(ours.tenants)} tenants"
        console.print(t)
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

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=120)
    axes[0].bar(names, [r.metrics["goodput"] for r in results], color="tab:green")
    lo = min(r.metrics["goodput"] for r in results)
    axes[0].set_ylim(max(0.0, lo - 0.05), 1.0)
    axes[0].set_title("goodput (useful / allocated)", fontsize=9)
    axes[1].bar(names, [r.metrics.get("useful_per_capacity", 0.0) for r in results], color="tab:blue")
    axes[1].set_title("useful / capacity (window: to the last arrival)", fontsize=9)
    lost = [r.metrics.get("lost_gpu_hours_total", r.metrics["lost_gpu_hours"]) for r in results]
    axes[2].bar(names, lost, color="tab:red")
    axes[2].set_title("lost GPU-hours (preemption, failures, restart, draining, double-booked)", fontsize=9)
    for ax in axes:
        plt.setp(ax.get_xticklabels(), rotation=15, ha="right", fontsize=8)
    fig.tight_layout()
    p = out_dir / "sched_goodput.png"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)
    return paths


SEED_KEYS = (  # (metric, label, best is higher)
    ("useful_per_capacity", "useful / capacity", True),
    ("lost_gpu_hours_total", "lost GPU-h", False),
    ("victims_per_decision", "victims / decision", False),
)


def seeds_summary(per_seed: Mapping[int, Sequence[PolicyResult]]) -> dict[str, dict[str, Any]]:
    """Per policy and metric of :data:`SEED_KEYS`: mean, min, max over the seeds and in how many
    seeds it was the best of the comparison; plus the most evictions of one job and violations."""
    names = [r.name for r in next(iter(per_seed.values()), [])]
    out: dict[str, dict[str, Any]] = {n: {"seeds": len(per_seed)} for n in names}
    for key, _, higher in SEED_KEYS:
        best_count = dict.fromkeys(names, 0)
        values: dict[str, list[float]] = {n: [] for n in names}
        for rs in per_seed.values():
            vals = {r.name: float(r.metrics.get(key, math.nan)) for r in rs}
            for n, v in vals.items():
                values[n].append(v)
            finite = [v for v in vals.values() if math.isfinite(v)]
            if finite:
                best = max(finite) if higher else min(finite)
                for n, v in vals.items():
                    best_count[n] += v == best
        for n in names:
            xs = [v for v in values[n] if math.isfinite(v)]
            out[n][key] = {
                "mean": sum(xs) / len(xs) if xs else math.nan,
                "min": min(xs, default=math.nan),
                "max": max(xs, default=math.nan),
                "best_in": best_count[n],
                "n": len(xs),  # seeds that gave a number: a mean over fewer says so
            }
    for n in names:
        ms = [r.metrics for rs in per_seed.values() for r in rs if r.name == n]
        ev = [float(m.get("max_evictions_of_one_job", 0)) for m in ms]
        out[n]["max_evictions_of_one_job"] = int(max((x for x in ev if math.isfinite(x)), default=0))
        out[n]["violations"] = sum(int(m.get("violations", 0)) for m in ms)
    return out


def seeds_alike(per_seed: Mapping[int, Sequence[PolicyResult]]) -> bool:
    """Every seed gave every policy the same numbers: nothing in the comparison depended on the
    seed (a workload file and a cluster file, no generated failures or reclaims)."""
    runs = [{r.name: {k: r.metrics.get(k) for k, _, _ in SEED_KEYS} for r in rs} for rs in per_seed.values()]
    return len(runs) > 1 and all(r == runs[0] for r in runs[1:])


def render_seeds(summary: Mapping[str, Mapping[str, Any]], console: Console, header: str = "") -> None:
    """Means with their range: a difference inside the ranges is not a ranking."""
    if header:
        console.print(header)
    n = max((int(v["seeds"]) for v in summary.values()), default=0)
    for key, label, higher in SEED_KEYS:
        t = _table(
            f"{label} over {n} seeds ({'higher' if higher else 'lower'} is better; a tie is best for each tied)",
            "policy",
            ("mean", "min", "max", "best in"),
        )
        fmt = (
            (lambda x: f"{x:.4f}")
            if key == "useful_per_capacity"
            else (_h if key.startswith("lost") else "{:.2f}".format)
        )
        for name, v in summary.items():
            m = v[key]
            t.add_row(
                f"[bold]{name}[/bold]" if "goodput" in name else name,
                fmt(m["mean"]) + (f" (of {m['n']})" if m["n"] < n else ""),
                fmt(m["min"]),
                fmt(m["max"]),
                f"{m['best_in']}/{n}",
            )
        console.print(t)
    t = _table("over every seed", "policy", ("most evictions\nof one job", "checker\nviolations"))
    for name, v in summary.items():
        t.add_row(name, str(v["max_evictions_of_one_job"]), str(v["violations"]))
    console.print(t)
