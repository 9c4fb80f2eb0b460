"""Spot economics: when preemptions eat the discount, and which gangs must never be on spot.

A gang of N nodes with per-node preemption rate λ is interrupted at Λ = N·λ (an upper bound: real
reclaims come in correlated bursts; measure it with :func:`trace_rates`). Each interruption
wastes τ/2 + R on average (half an interval of lost work, plus the restart). The useful fraction
is Daly's exact u(τ) with M = 1/Λ (see :mod:`goodput.plan.interval`). Cost per useful GPU-hour is
price / u, so spot at discount d costs (1 − d)·u_od/u_spot of on-demand, and wins while
d > 1 − u_spot/u_od (the break-even discount). First order: u ≈ 1 − Λ(τ/2 + R) − δ/τ, so at 60 %
off spot breaks even near Λ·(τ/2 + R) = 0.6. The checkpoint cost pushes the other way: a shorter
τ cuts the loss per preemption but raises δ/τ.

Sources: Wu et al., "Can't Be Late", NSDI'24 (traces: github.com/skypilot-org/spot-traces);
Thorpe et al., "Bamboo", NSDI'23; Daly 2006 for u(τ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .interval import optimal_exact, useful_fraction


@dataclass(frozen=True)
class Cadence:
    interval_s: float
    useful_fraction_spot: float
    useful_fraction_on_demand: float
    break_even_discount: float
    cost_ratio: float


@dataclass(frozen=True)
class SpotReport:
    discount: float
    node_rate_per_s: float
    nodes: int
    interval_s: float
    restart_s: float
    stall_s: float
    job_rate_per_s: float
    job_mtbi_s: float
    waste_per_preemption_s: float
    loss_first_order: float  # Λ·(τ/2 + R): the share of time lost, first order
    useful_fraction: float  # exact, on spot
    useful_fraction_on_demand: float
    cost_ratio: float  # spot cost per useful GPU-hour ÷ on-demand's
    break_even_discount: float
    max_gang_nodes: int | None  # largest gang that keeps at least half the discount; None: no limit
    max_gang_nodes_first_order: int | None  # same, from u ≈ 1 − Λ(τ/2+R) − δ/τ
    optimal_interval_s: float  # the exact optimum for this gang on spot
    cadences: tuple[Cadence, ...]


def _u(nodes: int, rate: float, tau: float, stall: float, restart: float) -> float:
    lam = nodes * rate
    return useful_fraction(tau, stall, 1 / lam if lam > 0 else math.inf, restart)


def _u_first_order(nodes: int, rate: float, tau: float, stall: float, restart: float) -> float:
    return max(0.0, 1 - nodes * rate * (tau / 2 + restart) - (stall / tau if tau > 0 else 0))


def _max_gang(keep, limit: int = 1 << 1000) -> int | None:
    """Largest N ≥ 1 with keep(N) true (keep is monotone: true, then false); 0 if none, None if
    every gang keeps it (no preemptions), or one of 2^1000 nodes still does (no limit a float can tell)."""
    if not keep(1):
        return 0
    lo, hi = 1, 2
    while hi < limit and keep(hi):
        lo, hi = hi, hi * 2
    if hi >= limit:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if keep(mid) else (lo, mid)
    return lo


def spot(
    discount: float,
    node_rate_per_s: float,
    nodes: int,
    interval_s: float,
    restart_s: float,
    stall_s: float = 0.0,
    on_demand_node_rate_per_s: float = 0.0,
    min_interval_s: float = 0.0,
) -> SpotReport:
    """``min_interval_s``: the shortest possible cadence (an async checkpoint's write time): the
    optimum is floored at it and the comparison cadences τ/2, τ, 2τ never go below it."""
    if not 0 <= discount < 1:
        raise ValueError(f"discount must be in [0, 1), got {discount}")
    values = (node_rate_per_s, interval_s, restart_s, stall_s, on_demand_node_rate_per_s)
    if not all(math.isfinite(v) for v in values):
        raise ValueError("rates, interval, restart and stall must be finite numbers")
    if not math.isfinite(min_interval_s) or min_interval_s < 0:
        raise ValueError(f"the minimum interval must be a non-negative number of seconds, got {min_interval_s!r}")
    if interval_s < min_interval_s:
        raise ValueError(f"the interval {interval_s:g} s is shorter than the write {min_interval_s:g} s")
    if nodes <= 0 or interval_s <= 0 or node_rate_per_s < 0 or restart_s < 0 or stall_s < 0:
        raise ValueError("nodes and interval must be positive; rates, restart and stall non-negative")

    def at(tau: float) -> Cadence:
        us = _u(nodes, node_rate_per_s, tau, stall_s, restart_s)
        uo = _u(nodes, on_demand_node_rate_per_s, tau, stall_s, restart_s)
        return Cadence(tau, us, uo, 1 - us / uo if uo > 0 else 0.0, (1 - discount) * uo / us if us > 0 else math.inf)

    here = at(interval_s)
    target = 1 - discount / 2  # cost ratio that keeps half the discount

    def keeps(fn):
        def keep(n: int) -> bool:
            us = fn(n, node_rate_per_s, interval_s, stall_s, restart_s)
            uo = fn(n, on_demand_node_rate_per_s, interval_s, stall_s, restart_s)
            return us > 0 and (1 - discount) * uo / us <= target

        return keep

    lam = nodes * node_rate_per_s
    return SpotReport(
        discount=discount,
        node_rate_per_s=node_rate_per_s,
        nodes=nodes,
        interval_s=interval_s,
        restart_s=restart_s,
        stall_s=stall_s,
        job_rate_per_s=lam,
        job_mtbi_s=1 / lam if lam > 0 else math.inf,
        waste_per_preemption_s=interval_s / 2 + restart_s,
        loss_first_order=lam * (interval_s / 2 + restart_s),
        useful_fraction=here.useful_fraction_spot,
        useful_fraction_on_demand=here.useful_fraction_on_demand,
        cost_ratio=here.cost_ratio,
        break_even_discount=here.break_even_discount,
        max_gang_nodes=_max_gang(keeps(_u)),
        max_gang_nodes_first_order=_max_gang(keeps(_u_first_order)),
        # no preemptions: no optimum (∞); no stall: checkpointing is free, so as often as possible (0)
        optimal_interval_s=max(optimal_exact(stall_s, 1 / lam), min_interval_s) if lam > 0 else math.inf,
        cadences=tuple(at(t) for t in (interval_s / 2, interval_s, interval_s * 2) if t >= min_interval_s),
    )


@dataclass(frozen=True)
class TraceRates:
    gap_s: float
    ticks: int
    gang_size: int  # the most instances seen alive at once
    node_hours: float
    nodes_lost: int
    node_rate_per_s: float  # nodes lost per node-second alive
    full_gang_s: float  # time the whole gang was alive
    gang_interruptions: int  # drops from a full gang
    gang_rate_per_s: float
    gang_vs_independent: float  # gang rate ÷ (gang size × node rate); 1.0 if losses were independent
    gang_vs_node: float  # gang rate ÷ node rate: what the gang costs over a single node


def trace_rates(counts: list[int], gap_s: float) -> TraceRates:
    """Preemption rates from a SkyPilot trace: ``counts[i]`` instances alive at tick i.

    A node is lost whenever the count drops; the gang (the most instances ever alive together)
    is interrupted whenever the count drops from full. Exposure is time alive, not wall time.
    """
    if not math.isfinite(gap_s) or gap_s <= 0:
        raise ValueError(f"gap_s must be a positive finite number of seconds, got {gap_s!r}")
    if any((not isinstance(c, int)) or c < 0 for c in counts):
        raise ValueError("trace counts must be non-negative integers")
    n = max(counts, default=0)
    alive = sum(counts[:-1]) * gap_s if len(counts) > 1 else 0.0
    lost = sum(max(0, a - b) for a, b in zip(counts, counts[1:]))
    full = sum(gap_s for c in counts[:-1] if c == n and n > 0)
    gang_int = sum(1 for a, b in zip(counts, counts[1:]) if a == n and b < a and n > 0)
    node_rate = lost / alive if alive else 0.0
    gang_rate = gang_int / full if full else 0.0
    return TraceRates(
        gap_s=gap_s,
        ticks=len(counts),
        gang_size=n,
        node_hours=alive / 3600,
        nodes_lost=lost,
        node_rate_per_s=node_rate,
        full_gang_s=full,
        gang_interruptions=gang_int,
        gang_rate_per_s=gang_rate,
        gang_vs_independent=gang_rate / (n * node_rate) if node_rate and n else 0.0,
        gang_vs_node=gang_rate / node_rate if node_rate else 0.0,
    )
