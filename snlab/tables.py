"""Tables for reading: a DataFrame shown with its units and sensible digits.

snlab's columns carry their unit in their name (``step_time_s``, ``memory_total_bytes``,
``tokens_per_s``, ``mfu``); :func:`styled` turns those into headers a person reads
("step time [s]") and numbers with the digits that matter (thousands separated, bytes in
GB, fractions as percentages), as a pandas Styler that Jupyter renders as HTML. The frame
itself is not changed.
"""

from __future__ import annotations

import math

from .units import fmt_bytes

#: columns that are fractions, shown as percentages
PERCENT = {"mfu", "hfu", "error", "tolerance", "bubble_fraction", "mfu_low", "mfu_high", "within_tolerance",
           "median_abs_error", "median_error", "worst_abs_error", "overlap_contention"}
#: signed percentages
SIGNED = {"error", "median_error"}


def _number(x) -> str:
    import numpy as np
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if not isinstance(x, (float, np.floating)):
        return str(x)
    x = float(x)
    if x != x:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return f"{x:.3g}"


#: system fields whose names carry no unit: bandwidths [B/s] and capacities [bytes]
BANDWIDTHS = {"scale_up_bandwidth", "scale_out_bandwidth", "host_bandwidth", "hbm_bandwidth"}
CAPACITIES = {"hbm_capacity", "host_capacity"}


def _bandwidth(x) -> str:
    return "-" if _missing(x) else f"{float(x) / 1e9:,.4g} GB/s"


def formatter(column: str):
    """The function that shows one value of ``column`` by its name's unit."""
    if column in BANDWIDTHS:
        return _bandwidth
    if column in CAPACITIES:
        return lambda x: "-" if _missing(x) else fmt_bytes(float(x))
    if column in SIGNED:
        return lambda x: "-" if _missing(x) else f"{float(x):+.1%}"
    if column in PERCENT:
        return lambda x: "-" if _missing(x) else f"{float(x):.1%}"
    if column.endswith("_bytes"):
        return lambda x: "-" if _missing(x) else fmt_bytes(float(x))
    if "_per_s" in column:                      # a rate, not a time
        return _number
    if column.endswith("_s"):
        from .units import fmt_seconds
        return lambda x: "-" if _missing(x) else fmt_seconds(float(x))
    return _number


def _missing(x) -> bool:
    try:
        return x is None or not math.isfinite(float(x))
    except (TypeError, ValueError):
        return True


def header(column: str) -> str:
    """A column's header for reading: words, the unit's suffix dropped (the values carry
    their units) or spelled out for rates."""
    name = column
    for suffix, words in (("_per_s_per_device", " per second per device"), ("_per_s", " per second"),
                          ("_bytes", ""), ("_s", "")):
        if name.endswith(suffix):
            name = name[: -len(suffix)] + words
            break
    return {"mfu": "MFU", "hfu": "HFU", "tp": "tp", "pp": "pp", "dp": "dp", "ep": "ep", "cp": "cp",
            "scale_up_domain_size": "devices on one bus", "gain": "over the base system"}.get(
        name, name.replace("_", " "))


def styled(frame, columns=None, caption: str | None = None):
    """``frame`` (or its ``columns``) as a pandas Styler: readable headers, each value by
    its unit, no index; Jupyter shows it as an HTML table."""
    shown = frame[list(columns)] if columns is not None else frame
    fmt = {c: formatter(c) for c in shown.columns}
    styler = shown.style.format(fmt).hide(axis="index").relabel_index([header(c) for c in shown.columns], axis=1)
    if caption:
        styler = styler.set_caption(caption)
    return styler


__all__ = ["styled", "formatter", "header"]
