"""Data for the charts: field titles with units, frames from results, inline data.

Kept apart from :mod:`snlab.charts` so that chart modules stay small; the public names
(``FIELDS``, ``OVERLAP_ORDER``, ``as_frame``, ``save``) are re-exported there.
"""

from __future__ import annotations

from typing import Sequence

import altair as alt
import numpy as np
import pandas as pd

from .compare import plain

GB = 1e9
US = 1e-6

OVERLAP_ORDER = ["none", "gradients", "standard", "all"]

#: column -> (axis title with unit, factor from SI, number format)
FIELDS = {
    "step_time_s": ("step time [s]", 1.0, ".3~g"),
    "mfu": ("MFU [%]", 100.0, ".1f"),
    "hfu": ("HFU [%]", 100.0, ".1f"),
    "tokens_per_s": ("throughput [tokens/s]", 1.0, ",.0f"),
    "model_tflops_per_device": ("model TFLOP/s per device [TFLOP/s]", 1.0, ".1f"),
    "memory_total_bytes": ("memory per device [GB]", 1 / GB, ".1f"),
    "bubble_fraction": ("pipeline bubble [% of ideal step]", 100.0, ".1f"),
    "exposed_comm_s": ("exposed communication [s]", 1.0, ".3~g"),
    "micro_batch": ("micro-batch [sequences]", 1.0, "d"),
    "global_batch": ("global batch [sequences]", 1.0, "d"),
    "params": ("parameters [billions]", 1e-9, ".3~g"),
    "devices": ("devices [count]", 1.0, "d"),
    "train_days": ("time to train [days]", 1.0, ".3~g"),
    "device_hours": ("device-hours [device h]", 1.0, ",.0f"),
    "tokens_per_device_s": ("throughput per device [tokens/s]", 1.0, ",.0f"),
    "tpot_s": ("time per output token [ms]", 1e3, ".3~g"),
    "ttft_s": ("time to first token [s]", 1.0, ".3~g"),
    "decode_tokens_per_s_per_device": ("decode throughput per device [tokens/s]", 1.0, ",.0f"),
    "continuous_over_static": ("continuous over static batching [x]", 1.0, ".2f"),
    "kv_cache_bytes_per_device": ("KV cache per device [GB]", 1 / GB, ".1f"),
    "prompt_len": ("prompt [tokens]", 1.0, ","),
    "batch": ("batch [sequences]", 1.0, ","),
    "energy_per_token_j": ("facility energy per token [J]", 1.0, ".3~g"),
    "device_energy_per_token_j": ("device energy per token [J]", 1.0, ".3~g"),
    "cost_per_million_tokens_usd": ("cost per million tokens [$]", 1.0, ".3~g"),
    "facility_power_w": ("facility power [kW]", 1e-3, ".3~g"),
    "device_power_w": ("power per device [W]", 1.0, ".0f"),
}
PLAN_TOOLTIP = ("tp", "pp", "dp", "ep", "cp", "micro_batch", "recompute", "zero", "overlap")


def title_of(column: str) -> str:
    return FIELDS.get(column, (column, 1.0, ""))[0]


def scaled(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column].astype(float) * FIELDS.get(column, ("", 1.0, ""))[1]


def column_values(frame: pd.DataFrame, name: str) -> np.ndarray:
    col = frame[name]
    return col.astype(str).to_numpy() if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy()


def inline_data(frame: pd.DataFrame) -> alt.Data:
    """Inline records with plain Python values. Cheaper than handing Altair the
    DataFrame (no per-column sanitising), which keeps a dashboard update fast; every
    encoding in this module states its type, so nothing is lost."""
    clean = frame.astype(object).where(pd.notna(frame), None) if frame.isna().any().any() else frame
    return alt.Data(values=clean.to_dict("records"))


def as_frame(data) -> pd.DataFrame:
    """A sweep/search DataFrame as is; a TrainResult or a list of them as rows with the
    same column names as :func:`snlab.sweep`."""
    if isinstance(data, pd.DataFrame):
        return data
    results = [data] if hasattr(data, "to_dict") and hasattr(data, "time_s") else list(data)
    rows = []
    for r in results:
        t, mem = r.time_s, r.memory_bytes_per_device
        row = {"model": r.model, "system": r.system, "devices": r.devices, "step_time_s": r.step_time_s,
               "mfu": r.mfu, "hfu": r.hfu, "tokens_per_s": r.tokens_per_s, "fits": r.fits,
               "limited_by": r.limited_by, "reason": r.reason, "bubble_fraction": r.bubble_fraction,
               "time_compute_s": t["compute"], "time_recompute_s": t["recompute"],
               "time_bubble_s": t["bubble"], "time_optimizer_s": t["optimizer"],
               "time_contention_s": t["contention"], "exposed_comm_s": t["exposed_communication"],
               "memory_capacity_bytes": mem["capacity"], "memory_usable_bytes": mem["usable"],
               "memory_total_bytes": mem["total"],
               **{k: (np.nan if getattr(r, k) is None else getattr(r, k))
                  for k in ("step_time_s_low", "step_time_s_high", "mfu_low", "mfu_high")},
               "band_runs": r.band_runs}
        row.update({f"exposed_{k}_s": v for k, v in t["exposed"].items()})
        row.update({f"memory_{k}_bytes": mem[k] for k in ("weights", "grads", "optimizer", "activations", "buffers")})
        plan = dict(r.plan)
        overlap = plan.pop("overlap")
        row.update(plan)
        row["overlap"] = next((n for n in OVERLAP_ORDER if _levels_equal(n, overlap)), str(overlap))
        rows.append(row)
    return pd.DataFrame(rows)


def _levels_equal(name: str, levels: dict) -> bool:
    from .training.plan import OVERLAP_PRESETS
    return all(abs(OVERLAP_PRESETS[name][k] - levels.get(k, 0.0)) < 1e-12 for k in OVERLAP_PRESETS[name])


def labels_of(frame: pd.DataFrame, by: Sequence[str]) -> pd.Series:
    if len(by) == 1:
        return frame[by[0]].astype(str)
    return frame[list(by)].astype(str).agg(" / ".join, axis=1)


def plan_tooltip(frame: pd.DataFrame, exclude=()) -> list:
    return [alt.Tooltip(f"{c}:N", title=c.replace("_", "-")) for c in PLAN_TOOLTIP
            if c in frame.columns and c not in exclude]


def save(chart: alt.TopLevelMixin, path, scale: float = 2.0) -> None:
    """Write ``chart`` as PNG, SVG, PDF or self-contained HTML (by suffix), offline
    through vl-convert: no browser, no CDN. The file is written whole (a temporary file,
    then a rename): an interrupted save leaves the old file or none, never part of one."""
    import io
    from pathlib import Path

    from .files import write_bytes
    path = Path(path)
    fmt = path.suffix.lstrip(".")
    if fmt not in ("png", "svg", "pdf", "html"):
        from .errors import SnlabError
        raise SnlabError("path", f"got a file ending {path.suffix!r}", ".png, .svg, .pdf or .html")
    buffer = io.BytesIO() if fmt in ("png", "pdf") else io.StringIO()
    options = {"png": dict(scale_factor=scale), "html": dict(inline=True)}.get(fmt, {})
    chart.save(buffer, format=fmt, **options)
    data = buffer.getvalue()
    write_bytes(path, data if isinstance(data, bytes) else data.encode("utf-8"))
