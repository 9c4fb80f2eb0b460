"""Human units in, SI units out: "3.09h", "30min", "100GB/s", "400Gbps", "405e9", "16KiB", "0.02/h".

Everything inside goodput.plan is in seconds, bytes, bytes/s, FLOP/s and events per second; these
parsers are the only place a unit is read, and the formatters the only place one is written.
GB means 10^9 bytes and GiB 2^30, always.
"""

from __future__ import annotations

import math
import re

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"

DURATION = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "us": 1e-6,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
    "y": 365.25 * 86400.0, "yr": 365.25 * 86400.0, "year": 365.25 * 86400.0, "years": 365.25 * 86400.0,
}  # fmt: skip

_DEC = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_BIN = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50, "ei": 2.0**60}

COUNT = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


class UnitError(ValueError):
    """A value could not be read: the message says what was expected."""


def _split(text: str, what: str) -> tuple[float, str]:
    m = re.fullmatch(rf"\s*{_NUM}\s*([A-Za-z/%µ]*)\s*", str(text))
    if not m:
        raise UnitError(f"cannot read {text!r} as {what}")
    return float(m.group(1)), m.group(2)


def _positive(v: float, text: str, what: str, allow_zero: bool = False) -> float:
    if math.isinf(v) and v > 0:
        raise UnitError(f"{what} is too large (beyond a double-precision float), got {text!r}")
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise UnitError(f"{what} must be {'non-negative' if allow_zero else 'positive'}, got {text!r}")
    return v


def parse_duration(text: str | float, *, allow_zero: bool = False) -> float:
    """Seconds from "60s", "30min", "3.09h", "2d", "50677h"; a bare number is seconds."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), "a duration", allow_zero)
    v, unit = _split(text, "a duration (e.g. 60s, 30min, 3.09h, 2d)")
    u = unit.lower()
    if u not in DURATION:
        raise UnitError(f"unknown time unit {unit!r} in {text!r} (use s, min, h, d, w, y)")
    return _positive(v * DURATION[u], text, "a duration", allow_zero)


def _not_ambiguous(prefix: str, unit: str, text: str) -> None:
    """ "Gb" is gigabits, but an all-lowercase "gb" or "mb" is as often meant as bytes: a silent factor of 8.
    Only "kb" (SI writes the kilo prefix lowercase) is read as bits without a capital."""
    if prefix and prefix.islower() and prefix != "k":
        up = prefix.upper()
        raise UnitError(
            f"ambiguous unit {unit!r} in {text!r}: write {up}B for bytes or {up}b for bits "
            f"(e.g. 100{up}B/s, 400{up}bps)"
        )


def _scale_bytes(unit: str, text: str) -> float:
    u = unit
    if u in ("", "B"):
        return 1.0
    low = u.lower()
    if low.endswith("ib") and low[:-1] in _BIN:
        return _BIN[low[:-1]]
    if u.endswith("B") and low[:-1] in _DEC:
        return _DEC[low[:-1]]
    if u.endswith("b") and low[:-1] in _DEC:  # bits
        _not_ambiguous(u[:-1], unit, text)
        return _DEC[low[:-1]] / 8
    raise UnitError(
        f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, or Gb for bits)"
    )


def parse_bytes(text: str | float) -> float:
    """Bytes from "16KiB", "6.5TB", "346MB", "1e9"; GB = 1e9, GiB = 2^30."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), "a size")
    v, unit = _split(text, "a size (e.g. 16KiB, 100GB)")
    return _positive(v * _scale_bytes(unit, text), text, "a size")


def parse_size(text: str | int) -> int:
    """A whole number of bytes (buffer sizes, benchmark sizes) read as :func:`parse_bytes` reads
    one: "2GiB" is 2^31, "1GB" 10^9, "4096" bytes."""
    n = parse_bytes(text)
    if n != int(n):
        raise UnitError(f"a size in bytes must be whole, got {text!r}")
    return int(n)


def parse_bandwidth(text: str | float) -> float:
    """Bytes/s from "100GB/s", "2TB/s", "400Gbps", "400Gb/s", "50 GiB/s"."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), "a bandwidth")
    v, unit = _split(text, "a bandwidth (e.g. 100GB/s, 400Gbps)")
    u = unit
    if u.lower().endswith("bps"):
        # "B" is bytes and "b" bits, as in "GB/s" and "Gb/s": 100GBps = 100e9 B/s, 400Gbps = 50e9 B/s
        base, bits = u[:-3], u[-3] == "b"
        scale = _DEC.get(base.lower())
        if scale is None:
            raise UnitError(f"unknown bandwidth unit {unit!r} in {text!r}")
        if bits:
            _not_ambiguous(base, unit, text)
        return _positive(v * scale / (8 if bits else 1), text, "a bandwidth")
    if not u.endswith("/s"):
        raise UnitError(f"{text!r} is not a bandwidth: give a unit per second (GB/s, Gbps)")
    return _positive(v * _scale_bytes(u[:-2], text), text, "a bandwidth")


def parse_count(text: str | float, what: str = "a count") -> float:
    """Plain counts: "405e9", "405B" (billion), "16k", "16384"."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), what)
    v, unit = _split(text, what)
    u = unit.lower()
    if u not in COUNT:
        raise UnitError(f"unknown multiplier {unit!r} in {text!r} (use k, M, B/G, T or scientific notation)")
    return _positive(v * COUNT[u], text, what)


def parse_flops(text: str | float) -> float:
    """FLOP/s from "400T", "400TFLOPS", "400e12", "0.4PFLOP/s"."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), "a FLOP rate")
    v, unit = _split(text, "a FLOP rate (e.g. 400T, 400TFLOPS)")
    u = unit.lower().replace("flop/s", "").replace("flops", "")
    if u not in _DEC:
        raise UnitError(f"unknown FLOP/s unit {unit!r} in {text!r}")
    return _positive(v * _DEC[u], text, "a FLOP rate")


def parse_rate(text: str | float) -> float:
    """Events per second from "0.02/h", "1/day", "3/week"; a bare number is per second."""
    if isinstance(text, (int, float)):
        return _positive(float(text), str(text), "a rate", allow_zero=True)
    m = re.fullmatch(rf"\s*{_NUM}\s*(?:/\s*([A-Za-z]+))?\s*", str(text))
    if not m:
        raise UnitError(f"cannot read {text!r} as a rate (e.g. 0.02/h)")
    v = float(m.group(1))
    per = (m.group(2) or "s").lower()
    if per not in DURATION:
        raise UnitError(f"unknown time unit {per!r} in rate {text!r}")
    return _positive(v / DURATION[per], text, "a rate", allow_zero=True)


def parse_fraction(text: str | float, what: str = "a fraction") -> float:
    """0.6 or "60%"; must lie in [0, 1]."""
    if isinstance(text, (int, float)):
        v = float(text)
    else:
        s = str(text).strip()
        try:
            v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise UnitError(f"cannot read {text!r} as {what} (e.g. 0.6 or 60%)") from None
    if not (0 <= v <= 1):
        raise UnitError(f"{what} must lie between 0 and 1, got {text!r}")
    return v


# ------------------------------------------------------------------------------------ formatting


def fmt_bytes(n: float, binary: bool = True) -> str:
    """'6.48 TB (5.89 TiB)': decimal first, binary alongside, so nobody confuses them."""
    dec = _fmt_scaled(n, 1000.0, ["B", "KB", "MB", "GB", "TB", "PB", "EB"])
    if not binary or n < 1000:
        return dec
    return f"{dec} ({_fmt_scaled(n, 1024.0, ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'])})"


def fmt_bandwidth(bps: float) -> str:
    return _fmt_scaled(bps, 1000.0, ["B/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s"])


def _fmt_scaled(n: float, base: float, units: list[str]) -> str:
    i = 0
    x = float(n)
    if not math.isfinite(x):
        return f"{'∞' if x > 0 else '-∞' if x < 0 else 'NaN'} {units[0]}"
    while abs(x) >= base and i < len(units) - 1:
        x /= base
        i += 1
    digits = 0 if i == 0 and x == int(x) else (3 if abs(x) < 10 else 2 if abs(x) < 100 else 1)
    return f"{x:.{digits}f} {units[i]}"


def fmt_duration(s: float) -> str:
    if not math.isfinite(s):
        return "∞"
    if s == 0:
        return "0 s"
    a = abs(s)
    if a < 1e-6:  # below a microsecond "0.0 µs" would hide the figure: say it in seconds
        return f"{s:.3g} s"
    if a < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if a < 1:
        return f"{s * 1e3:.1f} ms"
    if a < 120:
        return f"{s:.1f} s"
    if a < 2 * 3600:
        return f"{s / 60:.1f} min"
    if a < 3 * 86400:
        return f"{s / 3600:.2f} h"
    if a < 2 * 365.25 * 86400:
        return f"{s / 86400:.1f} d"
    return f"{s / (365.25 * 86400):.1f} y"


def fmt_pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %"
