"""Unit conversion at the edges: presets, CLI flags, tables and chart axes.

Inside snlab every quantity is a float in SI base units (byte, second, FLOP,
byte/second, FLOP/second, watt, joule, dollar). Decimal and binary prefixes are kept apart
(``GB = 1e9`` bytes, ``GiB = 2**30`` bytes); network rates in bits are divided by 8
(400 Gb/s = 50e9 bytes/s).
"""

from __future__ import annotations

import re

from .errors import SnlabError

KB, MB, GB, TB, PB = 1e3, 1e6, 1e9, 1e12, 1e15
KIB, MIB, GIB, TIB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
US, MS, NS = 1e-6, 1e-3, 1e-9

#: dimension name -> {unit symbol: factor to the SI base unit}
UNITS: dict[str, dict[str, float]] = {
    "bytes": {
        "B": 1.0, "kB": KB, "MB": MB, "GB": GB, "TB": TB, "PB": PB,
        "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB,
    },
    "bytes/s": {
        "B/s": 1.0, "kB/s": KB, "MB/s": MB, "GB/s": GB, "TB/s": TB,
        "KiB/s": KIB, "MiB/s": MIB, "GiB/s": GIB,
        "Mb/s": MB / 8, "Gb/s": GB / 8, "Tb/s": TB / 8,
    },
    "FLOP/s": {
        "FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15,
        "TOP/s": 1e12, "POP/s": 1e15,
    },
    "s": {"s": 1.0, "ms": MS, "us": US, "µs": US, "ns": NS, "min": 60.0, "h": 3600.0},
    "W": {"W": 1.0, "kW": 1e3, "MW": 1e6},
    "J/byte": {"J/B": 1.0, "pJ/B": 1e-12, "pJ/bit": 8e-12},
    "1": {"": 1.0, "1": 1.0, "%": 0.01},
    "count": {"": 1.0},
}

_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)\s*$")


def to_si(value: float, unit: str, dimension: str, field: str) -> float:
    """Convert ``value`` given in ``unit`` to the SI base unit of ``dimension``."""
    table = UNITS[dimension]
    if unit not in table:
        allowed = ", ".join(u for u in table if u) or "a plain number"
        raise SnlabError(field, f"unit {unit!r} is not a unit of {dimension}", allowed)
    return float(value) * table[unit]


def parse_quantity(text: str, dimension: str, field: str) -> tuple[float, float, str]:
    """Parse ``"312 TFLOP/s"`` into (SI value, value as written, unit as written)."""
    match = _QUANTITY.match(text)
    if not match:
        raise SnlabError(field, f"cannot read {text!r} as a number with a unit",
                         f"e.g. '80 GB', '300 GB/s', '2 us'; units of {dimension}: "
                         + ", ".join(u for u in UNITS[dimension] if u))
    number, unit = float(match.group(1)), match.group(2)
    return to_si(number, unit, dimension, field), number, unit


def fmt_bytes(x: float) -> str:
    """Human-readable decimal bytes: ``fmt_bytes(8e10) == '80 GB'``."""
    for unit, f in (("PB", PB), ("TB", TB), ("GB", GB), ("MB", MB), ("kB", KB)):
        if abs(x) >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.3g} B"


def fmt_quantity(x: float, dimension: str) -> str:
    """A value of ``dimension`` ("bytes", "bytes/s", "FLOP/s", "W", "s") in the largest
    decimal unit that keeps it at least 1: ``fmt_quantity(1e16, "bytes") == '10 PB'``."""
    if dimension == "s":
        return fmt_seconds(x)
    if dimension == "J/byte":
        return f"{x * 1e12:.3g} pJ/B"
    suffix = {"bytes": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "W": "W"}[dimension]
    for prefix, f in (("E", 1e18), ("P", PB), ("T", TB), ("G", GB), ("M", MB), ("k", KB)):
        if abs(x) >= f:
            return f"{x / f:.3g} {prefix}{suffix}"
    return f"{x:.3g} {suffix}"


def fmt_seconds(x: float) -> str:
    """Human-readable time: ``fmt_seconds(2.5e-6) == '2.5 us'``."""
    if abs(x) >= 86400:
        return f"{x / 86400:.3g} days"
    if abs(x) >= 3600:
        return f"{x / 3600:.3g} h"
    for unit, f in (("s", 1.0), ("ms", MS), ("us", US), ("ns", NS)):
        if abs(x) >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.3g} s"


def fmt_rate(x: float) -> str:
    """A rate for reading: ``fmt_rate(43146.2) == '43,146'``, ``fmt_rate(0.226) == '0.226'``
    (whole numbers with separators from 100 up, three significant digits below)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def fmt_watts(x: float) -> str:
    """Human-readable power: ``fmt_watts(1.32e5) == '132 kW'``."""
    return fmt_quantity(x, "W")


def fmt_joules(x: float) -> str:
    """Human-readable energy: ``fmt_joules(0.07) == '70 mJ'``, ``fmt_joules(3.6e9) == '1 MWh'``."""
    if abs(x) >= 3.6e6:
        for unit, f in (("GWh", 3.6e12), ("MWh", 3.6e9), ("kWh", 3.6e6)):
            if abs(x) >= f:
                return f"{x / f:.3g} {unit}"
    for unit, f in (("kJ", 1e3), ("J", 1.0), ("mJ", 1e-3), ("uJ", 1e-6)):
        if abs(x) >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.3g} J"
