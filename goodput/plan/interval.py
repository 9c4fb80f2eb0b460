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
    if mtbi <= 0:
        return 0.0
    x = (tau + delta) / mtbi
    try:
        return tau / (mtbi * math.exp(restart / mtbi) * math.expm1(x))
    except (OverflowError, ZeroDivisionError):
        pass
    # R ≫ M or τ ≫ M: e^{R/M} or e^x overflows a float, so take logs; u underflows to 0
    log_den = math.log(mtbi) + restart / mtbi + x + math.log(-math.expm1(-x))
    log_u = math.log(tau) - log_den
    return math.exp(log_u) if log_u > -745 else 0.0


def optimal_exact(delta: float, mtbi: float) -> float:
    """τ* = M·[1 + W₀(−e^{−(1+δ/M)})]; independent of R (R only scales the denominator)."""
    if delta <= 0:
        return 0.0
    if math.isinf(mtbi):
        return math.inf
    return mtbi * _one_plus_w0(delta / mtbi)


def _v_plus_log1p_minus_v(v: float) -> float:
    """v + ln(1 − v) = −(v²/2 + v³/3 + …): by its series for small v, where the sum cancels."""
    if v >= 0.1:
        return v + math.log1p(-v)
    total, term, k = 0.0, v * v, 2
    while True:
        add = term / k
        total += add
        if add <= 1e-17 * total:
            return -total
        term *= v
        k += 1


def _one_plus_w0(eps: float) -> float:
    """v = 1 + W₀(−e^{−(1+ε)}), computed without forming the argument next to −1/e.

    W e^W = −e^{−1−ε} with W = v − 1 is v + ln(1 − v) = −ε: solved by safeguarded Newton in v ∈ (0, 1).
    Going through lambert_w0 loses every digit once ε < 1e-16 (1 + ε rounds to 1, and τ* came out 0)
    and about log10(1e-16/ε) of them before that; here the relative error stays near machine precision.
    """
    if eps > 40:  # 1 − v = e^{−(ε+v)} below 1e-17: v is 1 to double precision
        return -math.expm1(-(eps + 1))
    lo, hi = 0.0, 1.0
    # start: v ≈ √(2ε) for small ε (v²/2 + v³/3 + … = ε), v ≈ 1 − e^{−(ε+1)} for large
    v = min(math.sqrt(2 * eps) * (1 - math.sqrt(2 * eps) / 3), -math.expm1(-(eps + 1)))
    for _ in range(200):
        if not lo < v < hi:
            v = (lo + hi) / 2
            if not lo < v < hi:  # lo and hi are adjacent doubles (v next to 1 for ε near 40): v is known
                return lo
        g = _v_plus_log1p_minus_v(v) + eps  # decreasing in v: g(0) = ε > 0, g(1⁻) = −∞
        if g > 0:
            lo = v
        else:
            hi = v
        if g == 0:
            return v
        step = g * (1 - v) / v  # g / g', g' = −v / (1 − v)
        nv = v + step
        if abs(nv - v) <= 4e-16 * v:
            return nv if lo <= nv <= hi else v
        v = nv
    return v


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
    if not (math.isfinite(delta) and math.isfinite(mtbi)) or delta <= 0 or mtbi <= 0:
        raise ValueError("the stall and the MTBI must be positive")
    for name, v in (("the restart time", restart), ("the write time", write)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a non-negative number of seconds, got {v!r}")
    if given is not None:
        if not math.isfinite(given) or given <= 0:
            raise ValueError(f"the interval must be a positive number of seconds, got {given!r}")
        if given < write:
            from .units import fmt_duration

            raise ValueError(
                f"the interval {fmt_duration(given)} is shorter than the checkpoint write "
                f"{fmt_duration(write)}: a checkpoint cannot start before the previous one is written (τ ≥ W)"
            )
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
