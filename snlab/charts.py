"""Charts of the three walls: functions that return Altair specs.

Every builder takes plain data (a DataFrame from :func:`snlab.sweep` or
:func:`snlab.search`, a list of :class:`~snlab.results.TrainResult`, or preset names)
and returns an ``alt.Chart`` (or a layered/concatenated chart). Nothing is drawn here:
a chart is a spec, so tests assert on ``chart.to_dict()`` and the widgets in
:mod:`snlab.widgets` swap specs in place.

Conventions: every axis title and tooltip names its unit in square brackets; bytes
are shown in decimal GB (1 GB = 1e9 bytes), times in seconds or microseconds, MFU in
percent. The ``*_frame`` functions compute the numbers (from the library's formulas,
never re-derived here); the chart functions only draw them.

Importing this module applies the offline switch (``SNLAB_OFFLINE=1``, see
:mod:`snlab.offline`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import altair as alt
import numpy as np
import pandas as pd

from . import network, offline
from .chart_data import (FIELDS, GB, OVERLAP_ORDER, PLAN_TOOLTIP, US, as_frame, column_values,  # noqa: F401
                         inline_data, labels_of, plain, plan_tooltip, save, scaled, title_of)
from .errors import SnlabError
from .hardware import device_roofline, hardware
from .presets import device as load_device
from .presets import system as load_system
from .walls import compute as cw

offline.apply_env()

#: parts of a training step, in drawing order: (label, colour)
#: twenty distinguishable colours (Tableau 20 reordered so that neighbours differ)
PALETTE = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#bab0ac", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#bcbd22", "#8c564b",
           "#e377c2", "#7f7f7f")


def _preset_colors() -> dict:
    """One colour per shipped system, device and model, the same in every chart of the lab."""
    from .presets import names
    colors = {}
    for kind in ("system", "device", "model"):
        for i, name in enumerate(sorted(names(kind))):
            colors[name] = PALETTE[i % len(PALETTE)]
    return colors


_COLORS: dict = {}


def color_of(name: str) -> str:
    """The lab's colour for a system, device or model (a name that is not a preset gets
    one by a stable hash of its name)."""
    if not _COLORS:
        _COLORS.update(_preset_colors())
    if name not in _COLORS:
        _COLORS[name] = PALETTE[sum(map(ord, name)) % len(PALETTE)]
    return _COLORS[name]


def color_encoding(field: str, values, title: str | None = None, **kw) -> alt.Color:
    """A colour channel for ``field``: systems, devices and models in their lab colours,
    the legend listing only what the chart draws."""
    present = list(dict.fromkeys(str(v) for v in values))
    if field in ("system", "device", "model"):
        kw["scale"] = alt.Scale(domain=present, range=[color_of(v) for v in present])
    return alt.Color(f"{field}:N", title=title or field, **kw)


STEP_PARTS = (
    ("compute", "#1f4e79"),
    ("recompute", "#6fa8dc"),
    ("tensor-parallel comm (exposed)", "#e69138"),
    ("expert all-to-all (exposed)", "#b45f06"),
    ("context-parallel comm (exposed)", "#8e7cc3"),
    ("pipeline sends and handshakes (exposed)", "#c27ba0"),
    ("data-parallel comm (exposed)", "#cc0000"),
    ("ZeRO / FSDP comm (exposed)", "#ea9999"),
    ("overlap contention", "#f1c232"),
    ("pipeline bubble", "#999999"),
    ("optimizer and offload", "#7f6000"),
)
MEMORY_PARTS = (
    ("weights", "memory_weights_bytes", "#1f4e79"),
    ("gradients", "memory_grads_bytes", "#6fa8dc"),
    ("optimizer state", "memory_optimizer_bytes", "#e69138"),
    ("activations", "memory_activations_bytes", "#93c47d"),
    ("ZeRO / FSDP buffers", "memory_buffers_bytes", "#c27ba0"),
)

# --- the step ----------------------------------------------------------------------------

def step_parts_frame(data, by: Sequence[str] = ("system",)) -> pd.DataFrame:
    """Long table of step-time parts: one row per configuration and part.

    Parts add up to ``step_time_s`` exactly: the last part ("optimizer and offload")
    is what the step holds beyond compute, exposed communication and the bubble.
    Columns: ``label`` (from ``by``), ``part``, ``order``, ``time_s`` [s],
    ``share_pct`` [% of the step], ``step_s`` [s], ``mfu_pct`` [%] and the plan.
    (Field names avoid brackets and dots: Vega-Lite reads those as nested access.)
    """
    frame = as_frame(data)
    if "valid" in frame.columns:
        frame = frame[frame["valid"]]
    if frame.empty:
        raise SnlabError("plan", "no valid configuration to draw", "at least one valid plan")
    frame = frame.reset_index(drop=True)
    step = frame["step_time_s"].astype(float)
    compute = frame["time_compute_s"] - frame["time_recompute_s"]
    exposed = [frame.get(f"exposed_{k}_s", 0.0) for k in ("tp", "ep", "cp", "pp", "dp", "zero")]
    exposed.append(frame.get("time_contention_s", 0.0))
    # parts of zero can come out as -1e-16 from the overlap arithmetic: clip the noise
    columns = [np.clip(np.asarray(c, dtype=float), 0.0, None)
               for c in (compute, frame["time_recompute_s"], *exposed, frame["time_bubble_s"])]
    columns.append(np.clip(step.to_numpy() - sum(columns), 0.0, None))
    n, k = len(frame), len(STEP_PARTS)
    times = np.stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in columns]).ravel()
    keep = [c for c in ("system", "model", *PLAN_TOOLTIP, "limited_by") if c in frame.columns]
    out = {c: np.tile(column_values(frame, c), k) for c in keep}
    out["label"] = np.tile(labels_of(frame, by).to_numpy(), k)
    out["part"] = np.repeat([name for name, _ in STEP_PARTS], n)
    out["order"] = np.repeat(np.arange(k), n)
    out["time_s"] = times
    out["share_pct"] = 100.0 * times / np.tile(step.to_numpy(), k)
    out["step_s"] = np.tile(step.to_numpy(), k)
    out["mfu_pct"] = np.tile(100.0 * frame["mfu"].to_numpy(dtype=float), k)
    return pd.DataFrame(out)


def step_breakdown(data, by: Sequence[str] = ("system",), normalize: bool = False, sort=None,
                   title: str | None = None, width: int = 520) -> alt.Chart:
    """Stacked horizontal bars: where each configuration's step time goes.

    ``by`` names the columns that label a bar (``("system",)``, ``("model",
    "system")``); ``normalize=True`` draws shares of the step [%] instead of seconds,
    for comparing models whose steps differ by orders of magnitude.
    """
    long = step_parts_frame(data, by)
    long = long[long["time_s"] > 0]
    x_field, x_title = ("share_pct", "share of the step [%]") if normalize else ("time_s", "time per step [s]")
    labels = [name for name, _ in STEP_PARTS]
    colors = [c for _, c in STEP_PARTS]
    tooltip = [alt.Tooltip("label:N", title=" / ".join(by)), alt.Tooltip("part:N", title="part"),
               alt.Tooltip("time_s:Q", title="time [s]", format=".3~g"),
               alt.Tooltip("share_pct:Q", title="share of the step [%]", format=".1f"),
               alt.Tooltip("step_s:Q", title="step time [s]", format=".3~g"),
               alt.Tooltip("mfu_pct:Q", title="MFU [%]", format=".1f"),
               *plan_tooltip(long)]
    return alt.Chart(inline_data(long), title=title or "Where the step time goes").mark_bar().encode(
        x=alt.X(f"{x_field}:Q", title=x_title, stack="zero",
                scale=alt.Scale(domain=[0, 100]) if normalize else alt.Undefined),
        y=alt.Y("label:N", title=None, sort=sort if sort is not None else list(dict.fromkeys(long["label"]))),
        color=alt.Color("part:N", title="part of the step", sort=labels,
                        scale=alt.Scale(domain=labels, range=colors), legend=alt.Legend(orient="bottom", columns=3, labelLimit=320)),
        order=alt.Order("order:Q"),
        tooltip=tooltip,
    ).properties(width=width, height=alt.Step(28))


def metric_chart(data, x: str, y: str = "mfu", color: str = "system", sort=None, detail: str | None = None,
                 title: str | None = None, mark: str = "line", log_y: bool = False, width: int = 420,
                 height: int = 260) -> alt.Chart:
    """A metric of each configuration (``y``, a sweep column such as ``mfu`` or
    ``step_time_s``) against a plan or model column ``x``, one line per ``color``.

    Titles come from :data:`FIELDS` (units in brackets). ``x="overlap"`` is ordered
    none -> all; pass ``sort`` to order any other nominal axis (e.g. models by size).
    ``detail`` names a column that splits lines further (one line per value); ``log_y``
    draws the metric on a log scale. Numeric plan columns in :data:`FIELDS` (prompt
    length, batch) are drawn on a log axis.
    """
    frame = as_frame(data)
    if "valid" in frame.columns:
        frame = frame[frame["valid"]]
    keep = list(dict.fromkeys([x, color, "system", "model", *[c for c in PLAN_TOOLTIP if c in frame.columns],
                               "fits", *([detail] if detail else [])]))
    plot = plain(frame[[c for c in keep if c in frame.columns]])
    y_title = title_of(y)
    plot["metric"] = scaled(frame, y).values
    if "step_time_s" in frame.columns and y != "step_time_s":
        plot["step_s"] = frame["step_time_s"].astype(float).values
    if _has_band(frame, y):
        # the range published runs of the same regime came out in (snlab.uncertainty)
        factor = FIELDS.get(y, ("", 1.0, ""))[1]
        plot["band_low"] = frame[f"{y}_low"].astype(float).values * factor
        plot["band_high"] = frame[f"{y}_high"].astype(float).values * factor
        plot["band_runs"] = frame["band_runs"].values if "band_runs" in frame.columns else 0
    numeric_x = x in FIELDS and x not in ("micro_batch",) and pd.api.types.is_numeric_dtype(frame[x])
    if numeric_x:
        x_title = title_of(x)
        plot["x_value"] = scaled(frame, x).values
        x_enc = alt.X("x_value:Q", title=x_title, scale=alt.Scale(type="log"), axis=alt.Axis(format="~s"))
    else:
        order = sort if sort is not None else (OVERLAP_ORDER if x == "overlap" else None)
        x_enc = alt.X(f"{x}:O", title=title_of(x) if x in FIELDS else x.replace("_", " "), sort=order,
                      axis=_label_axis(plot[x].astype(str).unique()))
    tooltip = [alt.Tooltip(f"{color}:N"), alt.Tooltip(f"{x}:N", title=title_of(x)),
               alt.Tooltip("metric:Q", title=y_title, format=FIELDS.get(y, ("", 1, ".3~g"))[2])]
    if "step_s" in plot.columns:
        tooltip.append(alt.Tooltip("step_s:Q", title="step time [s]", format=".3~g"))
    tooltip += plan_tooltip(plot, exclude=(x, color))
    base = alt.Chart(inline_data(plot), title=title or f"{y_title.split(' [')[0]} by {x.replace('_', ' ')}")
    marked = base.mark_line(point=True) if mark == "line" else base.mark_bar()
    enc = dict(x=x_enc, y=alt.Y("metric:Q", title=y_title, scale=alt.Scale(type="log") if log_y else alt.Undefined),
               color=color_encoding(color, plot[color]) if color in plot.columns else alt.Color(f"{color}:N"),
               tooltip=tooltip)
    if mark == "bar":
        enc["xOffset"] = alt.XOffset(f"{color}:N")
    if detail:
        enc["detail"] = alt.Detail(f"{detail}:N")
    if "fits" in plot.columns and mark == "line" and not plot["fits"].all():
        enc["shape"] = alt.Shape("fits:N", title="fits in memory", scale=alt.Scale(domain=[True, False],
                                                                                   range=["circle", "cross"]))
    if not _has_band(frame, y):
        return marked.encode(**enc).properties(width=width, height=height)
    # the band of published runs: one vertical bar per point, from the same data
    encoding = dict(x=x_enc, y=alt.Y("band_low:Q", title=y_title), y2="band_high:Q", color=enc["color"],
                    tooltip=[alt.Tooltip("band_low:Q", title="published runs: from", format=".3~g"),
                             alt.Tooltip("band_high:Q", title="to", format=".3~g"),
                             alt.Tooltip("band_runs:Q", title="runs behind the band")])
    if mark == "bar":
        encoding["xOffset"] = enc["xOffset"]
    # a vertical range on its own point, no wider than the point
    bars = base.mark_rule(strokeWidth=2, opacity=0.6).encode(**encoding).transform_filter("isValid(datum.band_low)")
    return alt.layer(marked.encode(**enc), bars).properties(width=width, height=height)


def _has_band(frame: pd.DataFrame, y: str) -> bool:
    return f"{y}_low" in frame.columns and f"{y}_high" in frame.columns and bool(frame[f"{y}_low"].notna().any())


def mfu_chart(data, x: str = "model", color: str = "system", **kw) -> alt.Chart:
    """MFU [%] against ``x`` (model, micro_batch, overlap, ...), one line per system."""
    return metric_chart(data, x=x, y="mfu", color=color, **kw)


# --- memory ------------------------------------------------------------------------------

def _parts_long(frame: pd.DataFrame, parts, by: Sequence[str], total: np.ndarray, capacity: np.ndarray,
                keep: Sequence[str]) -> pd.DataFrame:
    """Long table, one row per configuration and part: ``memory_gb`` of the part,
    ``total_gb`` and ``capacity_gb`` of the configuration [GB], with the ``keep`` columns."""
    n, k = len(frame), len(parts)
    out = {c: np.tile(column_values(frame, c), k) for c in keep if c in frame.columns}
    out["label"] = np.tile(labels_of(frame, by).to_numpy(), k)
    out["part"] = np.repeat([name for name, _, _ in parts], n)
    out["order"] = np.repeat(np.arange(k), n)
    out["memory_gb"] = np.concatenate([frame[col].to_numpy(dtype=float) for _, col, _ in parts]) / GB
    out["total_gb"] = np.tile(np.asarray(total, dtype=float), k) / GB
    out["capacity_gb"] = np.tile(np.asarray(capacity, dtype=float), k) / GB
    return pd.DataFrame(out)


def _label_axis(labels) -> alt.Axis:
    """Horizontal labels when they fit under their bars, slanted otherwise."""
    crowded = sum(len(str(label)) for label in labels) > 60
    return alt.Axis(labelAngle=-30 if crowded else 0, labelLimit=220)


def _valid(frame: pd.DataFrame) -> pd.DataFrame:
    if "valid" in frame.columns:
        frame = frame[frame["valid"]]
    if frame.empty:
        raise SnlabError("plan", "no valid configuration to draw", "at least one valid plan")
    return frame.reset_index(drop=True)


def memory_parts_frame(data, by: Sequence[str] = ("system",)) -> pd.DataFrame:
    """Long table of memory per device [GB] by part, with the device's usable HBM."""
    frame = _valid(as_frame(data))
    return _parts_long(frame, MEMORY_PARTS, by, frame["memory_total_bytes"], frame["memory_usable_bytes"],
                       ("system", "model", *PLAN_TOOLTIP, "fits"))


def _stacked_memory(long: pd.DataFrame, parts, by: Sequence[str], legend: str, title: str, sort,
                    width: int, height: int, extra_tooltip=(), limit: str = "HBM capacity [GB]") -> alt.LayerChart:
    labels = [n for n, _, _ in parts]
    order = sort if sort is not None else list(dict.fromkeys(long["label"]))
    x = alt.X("label:N", title=" / ".join(by).replace("_", " "), sort=order, axis=_label_axis(order))
    tooltip = [alt.Tooltip("label:N", title=" / ".join(by)), alt.Tooltip("part:N", title=legend),
               alt.Tooltip("memory_gb:Q", title="memory [GB]", format=".1f"),
               alt.Tooltip("total_gb:Q", title="total per device [GB]", format=".1f"),
               alt.Tooltip("capacity_gb:Q", title=limit, format=".0f"), *extra_tooltip]
    bars = alt.Chart(inline_data(long[long["memory_gb"] > 0])).mark_bar().encode(
        x=x, y=alt.Y("memory_gb:Q", title="memory per device [GB]", stack="zero"),
        color=alt.Color("part:N", title=legend, sort=labels,
                        scale=alt.Scale(domain=labels, range=[c for _, _, c in parts])),
        order=alt.Order("order:Q"), tooltip=tooltip)
    ticks = alt.Chart(inline_data(long.drop_duplicates("label"))).mark_tick(color="black", thickness=3, size=40).encode(
        x=x, y=alt.Y("capacity_gb:Q", title="memory per device [GB]"),
        tooltip=[alt.Tooltip("label:N", title=" / ".join(by)),
                 alt.Tooltip("capacity_gb:Q", title=limit, format=".0f")])
    return alt.layer(bars, ticks, title=title).properties(width=width, height=height)


def memory_breakdown(data, by: Sequence[str] = ("system",), title: str | None = None, sort=None,
                     width: int = 420, height: int = 260) -> alt.LayerChart:
    """Stacked bars of memory per device [GB] (weights, gradients, optimizer state,
    activations, ZeRO/FSDP buffers) with a black tick at the memory a job can use on
    each device (capacity less the runtime's reserve and the allocator's fragmentation)."""
    long = memory_parts_frame(data, by)
    return _stacked_memory(long, MEMORY_PARTS, by, "memory",
                           title or "Memory per device against usable HBM (black tick)", sort, width, height,
                           plan_tooltip(long), limit="usable HBM [GB]")


# --- serving: where the KV cache lives ---------------------------------------------------------

#: parts of a serving device's memory, in drawing order: (label, serve_sweep column, colour)
KV_PARTS = (
    ("weights", "weights_bytes_per_device", "#1f4e79"),
    ("KV cache in HBM", "kv_hbm_bytes_per_device", "#6fa8dc"),
    ("KV cache in the pool", "kv_pool_bytes_per_device", "#93c47d"),
    ("KV cache in host DRAM", "kv_host_bytes_per_device", "#e69138"),
    ("KV cache on SSD", "kv_ssd_bytes_per_device", "#cc0000"),
    ("KV cache with no room", "kv_unplaced_bytes_per_device", "#999999"),
)


def kv_placement_frame(frame: pd.DataFrame, by: Sequence[str] = ("system",)) -> pd.DataFrame:
    """Long table of a :func:`snlab.serve_sweep` frame: weights and KV cache per device
    [GB] by memory tier, the device's HBM capacity [GB] and the time per output token."""
    frame = _valid(frame)
    capacity = np.asarray([load_system(str(s)).device.hbm_capacity for s in frame["system"]])
    total = sum(frame[col].to_numpy(dtype=float) for _, col, _ in KV_PARTS)
    long = _parts_long(frame, KV_PARTS, by, total, capacity,
                       ("system", "model", "tp", "pp", "dp", "ep", "batch", "prompt_len", "kv_location", "fits",
                        "lender_devices"))
    long["tpot_ms"] = np.tile(frame["tpot_s"].to_numpy(dtype=float) * 1e3, len(KV_PARTS))
    return long


def kv_placement(frame: pd.DataFrame, by: Sequence[str] = ("system",), title: str | None = None, sort=None,
                 width: int = 420, height: int = 260) -> alt.LayerChart:
    """Stacked bars of where a serving device's memory goes [GB] (weights, then the KV
    cache in HBM, the supernode's pool, host DRAM, SSD, or nowhere), with a black tick
    at the device's HBM capacity; the tooltip counts the devices lending HBM to the pool."""
    long = kv_placement_frame(frame, by)
    extra = [alt.Tooltip("kv_location:N", title="KV cache lives in"),
             alt.Tooltip("lender_devices:Q", title="devices lending HBM to the pool"),
             alt.Tooltip("tpot_ms:Q", title="time per output token [ms]", format=".3~g"),
             alt.Tooltip("batch:Q", title="batch [sequences]"), alt.Tooltip("prompt_len:Q", title="prompt [tokens]")]
    return _stacked_memory(long, KV_PARTS, by, "memory", title or "Where the KV cache lives (black tick: HBM)",
                           sort, width, height, extra)


# --- compute: the roofline -------------------------------------------------------------------

def roofline_frame(devices: Iterable, intensities=None, sustained_clock: float | None = None) -> pd.DataFrame:
    """Attainable TFLOP/s against arithmetic intensity [FLOP/byte] for each device,
    from :data:`snlab.walls.compute.roofline_time` (achievable efficiencies included).
    By default 31 intensities from 0.1 to 10^4 FLOP/byte plus each device's ridge."""
    rows = []
    for dev in devices:
        d = load_device(dev)
        roof = device_roofline(d, sustained_clock=sustained_clock)
        x = intensities
        if x is None:
            # the ridge, where a FLOP's compute time equals the memory time of 1/I bytes
            ridge = float(cw.roofline_time(flops=0.0, bytes_moved=1.0, **roof)
                          / cw.roofline_time(flops=1.0, bytes_moved=0.0, **roof))
            x = np.unique(np.append(np.logspace(-1, 4, 31), ridge))
        x = np.asarray(x, dtype=float)
        work = 1e12                                  # any amount: the ratio is what counts
        time = cw.roofline_time(flops=work, bytes_moved=work / x, **roof)
        rows.append(pd.DataFrame({"device": d.name, "intensity": x, "tflops": work / time / 1e12}))
    return pd.concat(rows, ignore_index=True)


def gemm_frame(devices, tokens, k: float, n: float, sustained_clock: float | None = None,
               element_bytes: float = 2.0) -> pd.DataFrame:
    """Where a (tokens x k) by (k x n) matrix multiply sits on the roofline of each device
    (one name, a Device, or a list of them): intensity [FLOP/byte], attainable TFLOP/s,
    time [us] and whether its memory time or its compute time is the longer."""
    if isinstance(devices, str) or hasattr(devices, "peak_flops"):
        devices = [devices]
    m = np.atleast_1d(np.asarray(tokens, dtype=float))
    shape = dict(gemm_m=m, gemm_k=k, gemm_n=n, element_bytes=element_bytes)
    flops = cw.gemm_flops(gemm_m=m, gemm_k=k, gemm_n=n)
    moved = cw.gemm_bytes(**shape)
    frames = []
    for dev in devices:
        d = load_device(dev)
        roof = device_roofline(d, sustained_clock=sustained_clock)
        time = cw.gemm_time(**roof, **shape)
        memory_time = cw.roofline_time(flops=0.0, bytes_moved=moved, **roof)
        compute_time = cw.roofline_time(flops=flops, bytes_moved=0.0, **roof)
        frames.append(pd.DataFrame({"device": d.name, "tokens": m, "intensity": flops / moved,
                                    "tflops": flops / time / 1e12, "time_us": time / US,
                                    "bound": np.where(memory_time > compute_time, "memory-bound", "compute-bound")}))
    return pd.concat(frames, ignore_index=True)


def roofline(devices: Iterable = ("a100-pcie-80gb", "ascend-910c"), gemms: pd.DataFrame | None = None,
             sustained_clock: float | None = None, highlight: float | None = None, title: str | None = None,
             width: int = 460, height: int = 300) -> alt.LayerChart:
    """Roofline of each device (log-log) with optional GEMM points from :func:`gemm_frame`;
    the point with ``tokens == highlight`` is drawn large and labelled."""
    roof = roofline_frame(devices, sustained_clock=sustained_clock)
    present = list(dict.fromkeys(roof["device"].astype(str)))
    device_scale = alt.Scale(domain=present, range=[color_of(d) for d in present])
    device_color = alt.Color("device:N", title="device", scale=device_scale)
    lines = alt.Chart(inline_data(roof)).mark_line().encode(
        x=alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity [FLOP/byte]"),
        y=alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="attainable compute [TFLOP/s]"),
        color=device_color,
        tooltip=[alt.Tooltip("device:N", title="device"),
                 alt.Tooltip("intensity:Q", title="intensity [FLOP/byte]", format=".3~g"),
                 alt.Tooltip("tflops:Q", title="attainable [TFLOP/s]", format=".4~g")])
    layers = [lines]
    if gemms is not None:
        tooltip = [alt.Tooltip("device:N", title="device"),
                   alt.Tooltip("tokens:Q", title="tokens (GEMM rows M) [count]", format=","),
                   alt.Tooltip("intensity:Q", title="intensity [FLOP/byte]", format=".3~g"),
                   alt.Tooltip("tflops:Q", title="attainable [TFLOP/s]", format=".4~g"),
                   alt.Tooltip("time_us:Q", title="time [µs]", format=".3~g"), alt.Tooltip("bound:N", title="bound")]
        x, y = alt.X("intensity:Q"), alt.Y("tflops:Q")
        labelled = gemms.assign(label=[f"M={int(m):,}" for m in gemms["tokens"]])
        points = alt.Chart(inline_data(labelled))
        layers.append(points.mark_point(size=70, filled=True, opacity=0.6).encode(
            x=x, y=y, color=device_color, shape=alt.Shape("bound:N", title="GEMM"),
            tooltip=tooltip))
        # each point says which GEMM it is (its tokens M), in its device's colour
        layers.append(points.mark_text(dx=8, align="left", fontSize=10).encode(
            x=x, y=y, text=alt.Text("label:N"), color=alt.Color("device:N", scale=device_scale, legend=None)))
        if highlight is not None:
            chosen = gemms[gemms["tokens"] == highlight].assign(label=lambda d: [f"M = {int(m):,}" for m in d.tokens])
            base = alt.Chart(inline_data(chosen)).encode(x=x, y=y, tooltip=tooltip)
            layers.append(base.mark_point(size=260, filled=False, strokeWidth=3, color="black"))
            layers.append(base.mark_text(dy=-16, fontWeight="bold").encode(text=alt.Text("label:N")))
    return alt.layer(*layers, title=title or "Roofline: compute-bound right of the ridge, memory-bound left"
                     ).properties(width=width, height=height)


# --- communication ---------------------------------------------------------------------------

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-to-all", "point-to-point")


def collective_frame(systems: Iterable, collective: str = "all-reduce", group_size: int = 16,
                     sizes=None, levels: bool = True) -> pd.DataFrame:
    """Time [us] of one collective against message size [bytes], as the training model
    places it (:mod:`snlab.network`: a group larger than a scale-up domain pays the
    two-level collective). With ``levels``, also the same group on each level alone
    ("scale-up only", "scale-out only"), to see which level sets the cost."""
    if collective not in COLLECTIVES:
        raise SnlabError("collective", f"got {collective!r}", ", ".join(COLLECTIVES))
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 2:
        raise SnlabError("group_size", f"got {group_size!r}", "a whole number >= 2")
    sizes = np.logspace(2, 10, 81) if sizes is None else np.asarray(sizes, dtype=float)
    n = np.full_like(sizes, float(group_size))
    ops = {"all-reduce": network.all_reduce, "reduce-scatter": network.reduce_scatter,
           "all-to-all": network.all_to_all}
    rows = []
    for name in systems:
        system = load_system(name)
        hw = network.with_slice(hardware(system), group_size)     # on a torus pod: the group's slice
        variants = {"as placed": hw}
        if levels:
            variants["scale-up only"] = hw.replace(scale_up_domain_size=float(group_size))
            variants["scale-out only"] = hw.replace(scale_up_domain_size=1.0)
        for level, h in variants.items():
            if collective in ops:
                t = ops[collective](sizes, n, 1.0, h)
            else:
                inside = {"as placed": group_size <= hw.scale_up_domain_size,
                          "scale-up only": True, "scale-out only": False}[level]
                t = network.point_to_point(sizes, inside, hw)
            domains = 1 if level == "scale-up only" else int(np.ceil(group_size / h.scale_up_domain_size))
            rows.append(pd.DataFrame({"system": system.name, "level": level, "message_bytes": sizes,
                                      "time_us": np.broadcast_to(t, sizes.shape) / US,
                                      "bandwidth_gbs": sizes / np.broadcast_to(t, sizes.shape) / GB,
                                      "domains": domains}))
    return pd.concat(rows, ignore_index=True)


def collective_time(systems: Iterable = ("pcie-ethernet-a100", "cloudmatrix384"), collective: str = "all-reduce",
                    group_size: int = 16, levels: bool = True, sizes=None, title: str | None = None,
                    width: int = 460, height: int = 300) -> alt.Chart:
    """Collective time [us] against message size [bytes] (log-log): flat at small
    messages (latency-bound), rising with slope 1 at large ones (bandwidth-bound)."""
    frame = collective_frame(systems, collective, group_size, sizes, levels)
    enc = dict(
        x=alt.X("message_bytes:Q", scale=alt.Scale(type="log"), title="message size [bytes]",
                axis=alt.Axis(format="~s")),
        y=alt.Y("time_us:Q", scale=alt.Scale(type="log"), title="time [µs]"),
        color=color_encoding("system", frame["system"]),
        tooltip=[alt.Tooltip("system:N", title="system"), alt.Tooltip("level:N", title="level"),
                 alt.Tooltip("message_bytes:Q", title="message [bytes]", format=".3~s"),
                 alt.Tooltip("time_us:Q", title="time [µs]", format=".3~g"),
                 alt.Tooltip("bandwidth_gbs:Q", title="algorithm bandwidth [GB/s]", format=".3~g"),
                 alt.Tooltip("domains:Q", title="scale-up domains spanned [count]")])
    if levels:
        names = ["as placed", "scale-up only", "scale-out only"]
        enc["strokeDash"] = alt.StrokeDash("level:N", title="network level", sort=names,
                                           scale=alt.Scale(domain=names, range=[[1, 0], [4, 3], [1, 3]]))
    return alt.Chart(inline_data(frame), title=title or f"{collective} over {group_size} devices").mark_line().encode(
        **enc).properties(width=width, height=height)


def parity(frame=None, color: str = "kind") -> alt.LayerChart:
    """Predicted against measured, each run relative to its published value (1 = exact),
    with the run's tolerance band; coloured by ``color`` (``"kind"`` of run, or
    ``"source"``). ``frame`` is :func:`snlab.validation.table` (the default) or a part of it."""
    from . import validation
    if color not in ("kind", "source"):
        raise SnlabError("color", f"got {color!r}", "kind or source")
    frame = validation.table() if frame is None else frame
    data = frame.assign(ratio=frame["predicted"] / frame["measured"],
                        low=1 - frame["tolerance"], high=1 + frame["tolerance"])[
        ["kind", "id", "source", "metric", "measured", "predicted", "ratio", "low", "high", "error"]]
    y = alt.Y("id:N", sort=None, title="published run")
    band = alt.Chart(data).mark_rule(strokeWidth=6, opacity=0.25).encode(
        y=y, x=alt.X("low:Q", title="predicted / published [1]"), x2="high:Q")
    dots = alt.Chart(data).mark_point(filled=True, size=70).encode(
        y=y, x="ratio:Q", color=alt.Color(f"{color}:N", title="kind of run" if color == "kind" else "source"),
        tooltip=["id", "source", "metric", alt.Tooltip("measured:Q", format=".4g"),
                 alt.Tooltip("predicted:Q", format=".4g"), alt.Tooltip("error:Q", format="+.1%", title="error")])
    exact = alt.Chart(data).mark_rule(color="black").encode(x=alt.datum(1.0))
    return (band + dots + exact).properties(width=420, title="snlab against published runs (bars: tolerance)")


# --- serving under load ------------------------------------------------------------------

#: the latency panels of :func:`latency_load`: (column stem, title)
LOAD_PANELS = (("ttft", "time to first token"), ("tpot", "time per output token"))


def latency_load(frame: pd.DataFrame, percentile: str = "p90", per_device: bool = False,
                 title: str | None = None) -> alt.VConcatChart:
    """Latency against load for each system and mode of :func:`snlab.serving.load_sweep`:
    the time to first token and the time per output token [ms] (``percentile``: p50,
    p90 or p99; log scale) against the request rate [requests/s] (or per device), the
    line of each system in its colour, colocated solid and disaggregated dashed; below,
    each system's mean KV transfer per request [ms] with the link it crosses."""
    if percentile not in ("p50", "p90", "p99"):
        raise SnlabError("percentile", f"got {percentile!r}", "p50, p90 or p99")
    needed = {"system", "mode", "rate_rps", "rate_per_device_rps", f"ttft_{percentile}_s", f"tpot_{percentile}_s"}
    if not isinstance(frame, pd.DataFrame) or not needed <= set(frame.columns):
        raise SnlabError("frame", "not a load sweep", "a DataFrame from snlab.serving.load_sweep")
    x_col = "rate_per_device_rps" if per_device else "rate_rps"
    data = frame.assign(**{f"{stem}_ms": frame[f"{stem}_{percentile}_s"] * 1e3 for stem, _ in LOAD_PANELS},
                        kv_transfer_ms=frame["kv_transfer_s"] * 1e3,
                        link_gbs=frame["kv_link_bandwidth_bytes_per_s"] / GB)
    keep = ["system", "mode", x_col, "ttft_ms", "tpot_ms", "attainment", "goodput_rps", "kv_transfer_ms",
            "kv_link_level", "link_gbs"]
    data = data[keep]
    x_title = "requests per second per device [1/s]" if per_device else "requests per second [1/s]"
    panels = []
    for stem, name in LOAD_PANELS:
        panels.append(alt.Chart(inline_data(data), title=f"{percentile} {name}").mark_line(point=True).encode(
            x=alt.X(f"{x_col}:Q", title=x_title),
            y=alt.Y(f"{stem}_ms:Q", scale=alt.Scale(type="log"), title=f"{percentile} {name} [ms]"),
            color=alt.Color("system:N", title="system"),
            strokeDash=alt.StrokeDash("mode:N", title="deployment", sort=["colocated", "disaggregated"]),
            tooltip=[alt.Tooltip("system:N"), alt.Tooltip("mode:N"),
                     alt.Tooltip(f"{x_col}:Q", title=x_title, format=".3~g"),
                     alt.Tooltip(f"{stem}_ms:Q", title=f"{percentile} {name} [ms]", format=".3~g"),
                     alt.Tooltip("attainment:Q", title="within targets [1]", format=".1%"),
                     alt.Tooltip("goodput_rps:Q", title="goodput [1/s]", format=".3~g")],
        ).properties(width=300, height=230))
    split = data[data["mode"] == "disaggregated"].drop_duplicates("system")
    bars = alt.Chart(inline_data(split), title="KV cache moved per request, prefill to decode").mark_bar().encode(
        y=alt.Y("system:N", title="system"), x=alt.X("kv_transfer_ms:Q", title="mean KV transfer per request [ms]"),
        color=alt.Color("kv_link_level:N", title="link"),
        tooltip=[alt.Tooltip("system:N"), alt.Tooltip("kv_link_level:N", title="link"),
                 alt.Tooltip("link_gbs:Q", title="link bandwidth, all device pairs [GB/s]", format=".4~g"),
                 alt.Tooltip("kv_transfer_ms:Q", title="mean transfer [ms]", format=".3~g")],
    ).properties(width=630, height=24 * max(len(split), 1))
    return alt.vconcat(alt.hconcat(*panels), bars, title=title or "Latency against load")


DESIGN_COLUMNS = {"scale_up_domain_size", "scale_up_bandwidth", "hbm_capacity", "tokens_per_s_per_device", "gain",
                  "fits", "base"}


def design_chart(table: pd.DataFrame, title: str | None = None) -> alt.Chart:
    """The designs of :func:`snlab.codesign.designs`: tokens per second per device at each
    design's best plan against the scale-up bandwidth per direction [GB/s] (log scale), one
    line per domain size, a panel per HBM capacity; the base system ringed."""
    if not isinstance(table, pd.DataFrame) or not DESIGN_COLUMNS <= set(table.columns):
        raise SnlabError("table", "not a design table", "a DataFrame from snlab.codesign.designs")
    data = table[table["fits"]].assign(bandwidth_gbs=lambda f: f["scale_up_bandwidth"] / GB,
                                       hbm_gb=lambda f: (f["hbm_capacity"] / GB).round(0),
                                       domain=lambda f: f["scale_up_domain_size"].astype(int))
    data["plan"] = [f"tp {r.tp} pp {r.pp} dp {r.dp} cp {r.cp}, {r.recompute} recompute" for r in data.itertuples()]
    data = data[["domain", "bandwidth_gbs", "hbm_gb", "tokens_per_s_per_device", "gain", "base", "plan"]]
    x = alt.X("bandwidth_gbs:Q", scale=alt.Scale(type="log", nice=False), title="scale-up bandwidth per direction [GB/s]")
    y = alt.Y("tokens_per_s_per_device:Q", title="tokens per second per device [1/s]")
    tooltip = [alt.Tooltip("domain:O", title="devices on one bus"),
               alt.Tooltip("bandwidth_gbs:Q", title="bandwidth [GB/s]", format=".4~g"),
               alt.Tooltip("hbm_gb:Q", title="HBM [GB]", format=".4~g"),
               alt.Tooltip("tokens_per_s_per_device:Q", title="tokens/s per device [1/s]", format=".4~g"),
               alt.Tooltip("gain:Q", title="over the base system [1]", format=".3f"),
               alt.Tooltip("plan:N", title="best plan")]
    lines = alt.Chart().mark_line(point=True).encode(
        x=x, y=y, color=alt.Color("domain:O", title="devices on one bus", scale=alt.Scale(scheme="viridis"),
                                  legend=alt.Legend(titleLimit=0, labelLimit=0)),
        tooltip=tooltip)
    ring = alt.Chart().transform_filter("datum.base").mark_point(size=220, shape="circle", filled=False,
                                                                   color="black").encode(x=x, y=y, tooltip=tooltip)
    return alt.layer(lines, ring, data=inline_data(data)).properties(width=300, height=240).facet(
        column=alt.Column("hbm_gb:O", title="HBM per device [GB]", header=alt.Header(labelExpr="datum.value + ' GB'"))
    ).properties(
        title=title or "Each design at its best plan (the base system ringed)")


def design_gain_chart(scale: pd.DataFrame, title: str | None = None) -> alt.Chart:
    """Per model, the gain of the best design over the base system and what each design axis
    buys alone (:func:`snlab.codesign.scale_table`), models by size."""
    needed = {"model", "params", "gain", "domain_alone", "bandwidth_alone", "hbm_alone"}
    if not isinstance(scale, pd.DataFrame) or not needed <= set(scale.columns):
        raise SnlabError("scale", "not a scale table", "a DataFrame from snlab.codesign.scale_table")
    parts = {"domain_alone": "domain alone", "bandwidth_alone": "bandwidth alone", "hbm_alone": "HBM alone",
             "gain": "all three (the best design)"}
    long = scale.melt(id_vars=["model", "params"], value_vars=list(parts), var_name="change", value_name="ratio")
    long["change"] = long["change"].map(parts)
    long["added"] = long["ratio"] - 1
    order = list(scale.sort_values("params")["model"])
    return alt.Chart(inline_data(long[["model", "change", "ratio", "added"]])).mark_bar().encode(
        x=alt.X("model:N", sort=order, title="model", axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("change:N", sort=list(parts.values())),
        y=alt.Y("added:Q", axis=alt.Axis(format="%"), title="tokens per second per device added [%]"),
        color=alt.Color("change:N", sort=list(parts.values()), title="what changes",
                        legend=alt.Legend(titleLimit=0, labelLimit=0)),
        tooltip=[alt.Tooltip("model:N"), alt.Tooltip("change:N"),
                 alt.Tooltip("ratio:Q", title="over the base system [1]", format=".3f")],
    ).properties(width=520, height=240, title=title or "What the fabric and the memory buy, by model scale")


def enable_offline(offline_mode: bool = True) -> None:
    """Render every chart without a CDN (see :func:`snlab.offline.enable_offline`)."""
    offline.enable_offline(offline_mode)
