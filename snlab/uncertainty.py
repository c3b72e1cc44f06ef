"""How far to trust a prediction: the error band of its regime.

The bands come from published runs (``snlab.validation.bands``, stored in
``snlab/presets/data/error_bands.toml``): for a regime (training, serving decode, serving
prefill) on a chip family, the smallest and largest ratio of predicted to measured speed.
A regime without published runs has no band, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .presets import read_toml
from .presets.loader import DATA

REGIMES = ("training", "serving decode", "serving prefill")
#: an offline serving run whose prompts are this many times its outputs or more spends most
#: of its time in prefill, and is held to the prefill regime's band
PREFILL_HEAVY = 8


def offline_regime(prompt_len, output_len) -> str:
    """The regime of an offline run (every request queued at once): ``serving prefill``
    when its prompts are at least :data:`PREFILL_HEAVY` times its outputs, else
    ``serving decode``."""
    return "serving prefill" if prompt_len >= PREFILL_HEAVY * output_len else "serving decode"


@dataclass(frozen=True)
class Band:
    """Predicted over measured speed of a regime's published runs: ``low`` to ``high``
    [1], over ``runs`` runs (0: none, then low = high = 1 and nothing is claimed)."""

    regime: str
    family: str
    runs: int
    low: float
    high: float

    def speed(self, x: float) -> tuple[float | None, float | None]:
        """The band of a predicted speed (throughput, MFU) [same unit as x]; None, None
        without published runs."""
        return (x / self.high, x / self.low) if self.runs else (None, None)

    def time(self, t: float) -> tuple[float | None, float | None]:
        """The band of a predicted time [s]; None, None without published runs."""
        return (t * self.low, t * self.high) if self.runs else (None, None)

    def describe(self) -> str:
        if not self.runs:
            return f"no published {self.regime} runs on {self.family} to check against"
        return (f"{self.regime} on {self.family}: {self.runs} published runs came in at "
                f"{1 / self.high:.0%} to {1 / self.low:.0%} of the predicted speed")


def columns(band: Band, values, kind: str = "speed") -> tuple:
    """The band's bounds of a column of predicted speeds (``kind="speed"``) or times
    (``"time"``) as two nullable float columns: missing (``pd.NA``, never NaN) without
    published runs and where the prediction itself is missing, so that averaging a
    column skips them."""
    import numpy as np
    import pandas as pd
    values = np.asarray(values, dtype=float)
    if not band.runs:
        return tuple(pd.arrays.FloatingArray(np.zeros(len(values)), np.ones(len(values), dtype=bool))
                     for _ in range(2))
    bounds = band.speed(values) if kind == "speed" else band.time(values)
    return tuple(pd.array(b, dtype="Float64") for b in bounds)


@lru_cache(maxsize=1)
def _table() -> dict:
    doc = read_toml(DATA / "error_bands.toml", "error_bands.toml")
    return {(b["regime"], b["family"]): b for b in doc.get("band", [])}


def families(regime: str) -> list[str]:
    """The chip families with a band for ``regime``."""
    return sorted(f for r, f in _table() if r == regime)


@lru_cache(maxsize=256)
def band(regime: str, family: str) -> Band:
    """The band of ``regime`` (one of :data:`REGIMES`) on chip ``family`` (kept: a Band
    is frozen; :func:`reload` forgets it)."""
    b = _table().get((regime, family))
    if b is None:
        return Band(regime=regime, family=family, runs=0, low=1.0, high=1.0)
    return Band(regime=regime, family=family, runs=int(b["runs"]), low=float(b["low"]), high=float(b["high"]))


@lru_cache(maxsize=1)
def _ranges() -> dict:
    doc = read_toml(DATA / "error_bands.toml", "error_bands.toml")
    return {r["family"]: r for r in doc.get("range", [])}


def validated(family: str, plans: dict, precision: str = "bf16"):
    """True for each training plan that lies inside what the family's published runs
    cover (each degree between the smallest and largest they used, a ZeRO stage,
    recomputation choice and precision they were made with): the plans the family's band
    speaks for. ``plans`` holds plan columns (``tp``, ``pp``, ``cp``, ``ep``,
    ``interleave``, ``dp``, ``zero``, and ``recompute`` as names); a family without
    runs covers none."""
    import numpy as np
    r = _ranges().get(family)
    if all(type(v) is list and len(v) == 1 for v in plans.values()):
        return np.asarray([r is not None and _covers(r, {k: v[0] for k, v in plans.items()}, precision)])
    n = len(np.atleast_1d(plans["tp"]))
    if r is None or precision not in r["precision"]:
        return np.zeros(n, dtype=bool)
    devices = (np.asarray(plans["tp"]) * np.asarray(plans["pp"]) * np.asarray(plans["dp"])
               * np.asarray(plans["cp"]))
    ok = np.ones(n, dtype=bool)
    for key, values in (("tp", plans["tp"]), ("pp", plans["pp"]), ("cp", plans["cp"]), ("ep", plans["ep"]),
                        ("interleave", plans["interleave"]), ("devices", devices)):
        lo, hi = r[key]
        values = np.asarray(values, dtype=float)
        ok &= (values >= lo) & (values <= hi)
    zero, recompute = np.asarray(plans["zero"]), np.asarray(plans["recompute"])
    if zero.size == 1 and recompute.size == 1:          # one plan: a set lookup, not np.isin
        return ok & (int(zero.ravel()[0]) in r["zero"]) & (str(recompute.ravel()[0]) in r["recompute"])
    ok &= np.isin(zero.astype(int), r["zero"])
    ok &= np.isin(recompute.astype(str), r["recompute"])
    return ok


def _covers(r: dict, plan: dict, precision: str) -> bool:
    """:func:`validated` for one plan of Python numbers (a single train call's), against
    the family's ranges ``r``: the same comparisons, without arrays."""
    if precision not in r["precision"]:
        return False
    devices = plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"]
    if type(devices) is not int or devices >= 2 ** 63:         # as numpy's int64 product would be
        import numpy as np
        devices = np.prod(np.asarray([plan[k] for k in ("tp", "pp", "dp", "cp")]))
    for key in ("tp", "pp", "cp", "ep", "interleave"):
        lo, hi = r[key]
        if not lo <= float(plan[key]) <= hi:
            return False
    lo, hi = r["devices"]
    return bool(lo <= float(devices) <= hi and int(plan["zero"]) in r["zero"] and str(plan["recompute"]) in r["recompute"])


def reload() -> None:
    """Read the error bands again (after ``python -m snlab.docs`` rewrote them)."""
    _table.cache_clear()
    _ranges.cache_clear()
    band.cache_clear()
