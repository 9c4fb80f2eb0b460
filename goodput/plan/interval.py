"""The checkpoint interval: Young, Daly, and the exact optimum of Daly's model.

δ: time a checkpoint blocks training (with an async checkpoint: the staging stall, not the write);
M: mean time between interruptions; R: restart time (detect, reschedule, load).

- First-order waste: w(τ) = δ/τ + (τ/2 + R)/M.
- Young (1974): τ* = √(2δM).
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22: τ* = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ for δ < 2M, else M.
- Daly's exact model: expected wall time T = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ, so the useful
  fraction is u(τ) = τ / [M·e^{R/M}·(e^{(τ+δ)/M} − 1)], maximised at τ* = M·[1 + W₀(−e^{−(1+δ/M)})].

The first-order form is off by up to ten points when waste nears 50 % (the spot regime): goodput
figures use the exact form, and every figure says which one it comes from.

An asynchronous write of duration W: training goes on while it runs, but a failure during it
loses the work back to the previous checkpoint, so W adds to the loss per failure (we fold it into
R) and τ cannot be shorter than W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def lambert_w0(x: float) -> float:
    """Principal branch W₀ on [−1/e, ∞), by Halley's iteration (to machine precision)."""
    if x < -1 / math.e - 1e-15:
        raise ValueError(f"W0 is undefined below -1/e (got {x})")
    if x <= -1 / math.e:
        return -1.0
    if x == 0:
        return 0.0
    # start: branch-point series near -1/e, log elsewhere
    if x < -0.25:
        p = math.sqrt(2 * (math.e * x + 1))
        w = -1 + p - p * p / 3 + 11 / 72 * p**3
    elif x < 3:
        w = 0.5 * math.log1p(x)
    else:
        lx = math.log(x)
        w = lx - math.log(lx)
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - x
        wp1 = w + 1
        if wp1 == 0:
            break
        step = f / (ew * wp1 - (w + 2) * f / (2 * wp1))
        w -= step
        if abs(step) <= 1e-15 * (1 + abs(w)):
            break
    return w


def waste_first_order(tau: float, delta: float, mtbi: float, restart: float = 0.0) -> float:
    return delta / tau + (tau / 2 + restart) / mtbi


def young(delta: float, mtbi: float) -> float:
    return math.sqrt(2 * delta * mtbi)


def daly(delta: float, mtbi: float) -> float:
    if delta >= 2 * mtbi:
        return mtbi
    r = delta / (2 * mtbi)
    return math.sqrt(2 * delta * mtbi) * (1 + math.sqrt(r) / 3 + r / 9) - delta


def useful_fraction(tau: float, delta: float, mtbi: float, restart: float = 0.0) -> float:
    """Daly's exact model: the share of wall time that is useful work."""
    if tau <= 0:
        return 0.0
    if math.isinf(mtbi):
        return tau / (tau + delta)
    x = (tau + delta) / mtbi
    if x > 700:
        return 0.0
    return tau / (mtbi * math.exp(restart / mtbi) * math.expm1(x))


def optimal_exact(delta: float, mtbi: float) -> float:
    """τ* = M·[1 + W₀(−e^{−(1+δ/M)})]; independent of R (R only scales the denominator)."""
    if delta <= 0:
        return 0.0
    return mtbi * (1 + lambert_w0(-math.exp(-(1 + delta / mtbi))))


@dataclass(frozen=True)
class IntervalReport:
    delta_s: float
    mtbi_s: float
    restart_s: float
    write_s: float
    young_s: float
    daly_s: float
    optimal_s: float
    floor_s: float  # τ can't be shorter than the write
    waste_first_order_at_young: float
    waste_first_order_at_daly: float
    waste_first_order_at_optimal: float
    useful_fraction_at_young: float
    useful_fraction_at_daly: float
    useful_fraction_at_optimal: float
    interval_s: float | None = None
    waste_first_order_at_interval: float | None = None
    useful_fraction_at_interval: float | None = None


def interval(
    delta: float, mtbi: float, restart: float = 0.0, write: float = 0.0, given: float | None = None
) -> IntervalReport:
    if delta <= 0 or mtbi <= 0:
        raise ValueError("the stall and the MTBI must be positive")
    r_eff = restart + write
    y, d, o = (max(t, write) for t in (young(delta, mtbi), daly(delta, mtbi), optimal_exact(delta, mtbi)))
    rep = IntervalReport(
        delta_s=delta,
        mtbi_s=mtbi,
        restart_s=restart,
        write_s=write,
        young_s=y,
        daly_s=d,
        optimal_s=o,
        floor_s=write,
        waste_first_order_at_young=waste_first_order(y, delta, mtbi, r_eff),
        waste_first_order_at_daly=waste_first_order(d, delta, mtbi, r_eff),
        waste_first_order_at_optimal=waste_first_order(o, delta, mtbi, r_eff),
        useful_fraction_at_young=useful_fraction(y, delta, mtbi, r_eff),
        useful_fraction_at_daly=useful_fraction(d, delta, mtbi, r_eff),
        useful_fraction_at_optimal=useful_fraction(o, delta, mtbi, r_eff),
    )
    if given is not None:
        rep = IntervalReport(
            **{
                **rep.__dict__,
                "interval_s": given,
                "waste_first_order_at_interval": waste_first_order(given, delta, mtbi, r_eff),
                "useful_fraction_at_interval": useful_fraction(given, delta, mtbi, r_eff),
            }
        )
    return rep


def curves(delta: float, mtbi: float, restart: float = 0.0, write: float = 0.0, points: int = 200):
    """(τ, first-order waste, exact useful fraction) sampled log-spaced around the optimum."""
    o = optimal_exact(delta, mtbi)
    lo, hi = max(o / 30, delta / 10, 1e-3), min(o * 30, 5 * mtbi)
    taus = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    r = restart + write
    return (
        taus,
        [waste_first_order(t, delta, mtbi, r) for t in taus],
        [useful_fraction(t, delta, mtbi, r) for t in taus],
    )
