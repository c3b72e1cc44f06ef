"""Training planners: ``train`` (one plan), ``sweep`` (a grid), ``search`` (the best plan).

All three build a grid of plans and evaluate it with one call of
:func:`snlab.training.step_columns`; ``train`` is a grid of one row.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from . import plan as pl
from .errors import SnlabError
from .presets import PresetLike
from .presets import model as load_model
from .presets import system as load_system
from .results import TrainResult
from .specs import Model, System
from .training import SYSTEM_FIELDS, hardware, step_columns
from .units import parse_quantity

PLAN_FIELDS = ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "recompute",
               "sequence_parallel", "interleave", "overlap", "offload", "grad_dtype", "seq_len",
               "flash_attention", "optimizer_bytes")
NUMERIC = ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "interleave",
           "seq_len", "optimizer_bytes")
_SYSTEM_UNITS = {"bandwidth": "bytes/s", "latency": "s", "capacity": "bytes", "peak_flops": "FLOP/s"}


def _axis_values(name: str, value) -> list:
    """A plan or system axis as a list of values (a scalar is a one-value axis)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
        if value.size == 0:
            raise SnlabError(name, "empty array", "at least one value")
        return value.ravel()
    if isinstance(value, (list, tuple, np.ndarray, range)):
        values = list(np.asarray(value).tolist()) if isinstance(value, np.ndarray) else list(value)
        if not values:
            raise SnlabError(name, "empty list", "at least one value")
        return values
    return [value]


def _numeric(name: str, values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        if not np.all(np.isfinite(values)):
            raise SnlabError(name, "got a NaN or infinite value", pl.ALLOWED.get(name, "finite numbers"))
        return values.astype(float, copy=False)
    out = []
    for v in values:
        if isinstance(v, str) and name in SYSTEM_FIELDS:
            dim = next((u for key, u in _SYSTEM_UNITS.items() if key in name), "1")
            v = parse_quantity(v, dim, name)[0]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise SnlabError(name, f"got {v!r}", pl.ALLOWED.get(name, "a finite number"))
        out.append(float(v))
    return np.asarray(out)


def _coded(name: str, values: list) -> np.ndarray:
    table = {"recompute": pl.RECOMPUTE, "offload": pl.OFFLOAD}[name]
    return np.asarray([pl.code(name, v, table) for v in values], dtype=float)


def _flags(name: str, values: list) -> np.ndarray:
    for v in values:
        if not isinstance(v, (bool, np.bool_)) and v not in (0, 1):
            raise SnlabError(name, f"got {v!r}", "true or false")
    return np.asarray([float(bool(v)) for v in values])


def _check_ranges(merged: dict) -> None:
    """Values outside a field's range are errors in train and sweep alike (the plan
    rules, which depend on the model and the other fields, are flagged per row)."""
    for name, ok in (("zero", lambda v: v in (0, 1, 2, 3)),
                     ("seq_len", lambda v: v is None or (float(v).is_integer() and v >= 1)),
                     ("optimizer_bytes", lambda v: v >= 0)):
        for v in _axis_values(name, merged[name]):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))):
                raise SnlabError(name, f"got {v!r}", pl.ALLOWED[name])
            if not ok(v) or (v is not None and not math.isfinite(v)):
                raise SnlabError(name, f"got {v!r}", pl.ALLOWED[name])


def _grid(model: Model, system: System, axes: dict) -> tuple[dict, dict, dict]:
    """The Cartesian product of the axes as flat arrays: (plan grid, hardware, labels)."""
    unknown = [k for k in axes if k not in PLAN_FIELDS and k not in SYSTEM_FIELDS
               and not k.startswith("overlap_")]
    if unknown:
        raise SnlabError(unknown[0], "not a plan or system field",
                         ", ".join(PLAN_FIELDS + SYSTEM_FIELDS + tuple(f"overlap_{c}" for c in pl.OVERLAP_CLASSES)))
    merged = {**pl.DEFAULTS, **axes}
    _check_ranges(merged)
    if merged["global_batch"] is None:
        raise SnlabError("global_batch", "missing", "a multiple of micro_batch x dp (sequences per step)")
    if merged["seq_len"] is None:
        merged["seq_len"] = model.seq_len
    columns: dict[str, np.ndarray] = {}
    labels: dict[str, list] = {}
    for name in PLAN_FIELDS:
        values = _axis_values(name, merged[name])
        if name in NUMERIC:
            columns[name] = _numeric(name, values)
        elif name in ("recompute", "offload"):
            columns[name] = _coded(name, values)
            labels[name] = values
        elif name == "grad_dtype":
            for v in values:
                if v not in pl.GRAD_DTYPE_BYTES:
                    raise SnlabError(name, f"got {v!r}", pl.ALLOWED[name])
            columns["grad_bytes"] = np.asarray([float(pl.GRAD_DTYPE_BYTES[v]) for v in values])
        elif name == "flash_attention":
            columns[name] = _flags(name, values)
        elif name == "sequence_parallel":
            columns[name] = np.asarray([-1.0 if v is None else float(_flags(name, [v])[0]) for v in values])
        elif name == "overlap":
            levels = [pl.overlap_levels(v) for v in values]
            columns["overlap"] = np.arange(len(levels), dtype=float)
            labels["overlap"] = [v if isinstance(v, str) else str(v) for v in values]
            labels["_overlap_levels"] = levels
    for name, value in axes.items():
        if name.startswith("overlap_"):
            cls = name[len("overlap_"):]
            if cls not in pl.OVERLAP_CLASSES:
                raise SnlabError(name, "unknown overlap class", ", ".join(pl.OVERLAP_CLASSES))
            vals = _numeric(name, _axis_values(name, value))
            if np.any((vals < 0) | (vals > 1)):
                raise SnlabError(name, f"got {vals.tolist()}", "levels in [0, 1]")
            columns[name] = vals
    hw_axes = {}
    for name in SYSTEM_FIELDS:
        if name in axes:
            vals = _numeric(name, _axis_values(name, axes[name]))
            if np.any(vals < 0) or (np.any(vals <= 0) and "latency" not in name):
                raise SnlabError(name, f"got {vals.tolist()}", "positive values (latencies may be 0)")
            hw_axes[name] = vals
    # The Cartesian product of every axis, kept as an open grid: each axis varies along a
    # dimension of its own, so a quantity that depends on a few axes is computed on those
    # alone and numpy broadcasts the rest (evaluate() flattens the outputs at the end)
    names = list(columns) + [f"hw:{n}" for n in hw_axes]
    arrays = list(columns.values()) + list(hw_axes.values())
    ndim = len(arrays)
    grid = {}
    for i, (name, arr) in enumerate(zip(names, arrays)):
        shape = [1] * ndim
        shape[i] = len(arr)
        grid[name] = np.asarray(arr, dtype=float).reshape(shape)
    g = {n: a for n, a in grid.items() if not n.startswith("hw:")}
    # derived plan columns
    sp_col = g["sequence_parallel"]
    g["sequence_parallel"] = np.where(sp_col < 0, (g["tp"] > 1).astype(float), sp_col)
    levels = labels["_overlap_levels"]
    idx = g["overlap"].astype(int)
    for cls in pl.OVERLAP_CLASSES:
        key = f"overlap_{cls}"
        if key not in g:
            g[key] = np.asarray([lv[cls] for lv in levels])[idx]
    hw = hardware(system)
    hw.update({n[3:]: a for n, a in grid.items() if n.startswith("hw:")})
    return g, hw, labels


def flatten(arrays: dict, shape: tuple) -> dict:
    """Arrays of an open grid broadcast to ``shape`` and laid out flat, one row per point."""
    return {k: (np.broadcast_to(v, shape).ravel() if np.ndim(v) else v) for k, v in arrays.items()}


def evaluate(model: Model, system: System, axes: dict, precision: str = "bf16", devices=None):
    """Plan grid, hardware, labels, rule violations and output columns for ``axes``."""
    g, hw, labels = _grid(model, system, axes)
    if "peak_flops" not in axes:
        hw["peak_flops"] = system.device.peak(precision)
    broken = pl.violations(model, g, devices)
    with np.errstate(all="ignore"):
        out = step_columns(model, g, hw)
    shape = np.broadcast_shapes(np.shape(broken), *(np.shape(v) for v in g.values()),
                                *(np.shape(v) for v in hw.values()))
    broken = np.broadcast_to(broken, shape).ravel()
    ok = broken < 0
    # rows that break a rule keep their plan; their outputs are NaN (False for flags)
    out = {k: (v & ok if v.dtype == bool else np.where(ok, v, np.nan))
           for k, v in flatten({k: np.asarray(v) for k, v in out.items()}, shape).items()}
    return flatten(g, shape), flatten(hw, shape), labels, broken, out


def _resolve(model: PresetLike, system: PresetLike) -> tuple[Model, System]:
    return load_model(model), load_system(system)


def train(model: PresetLike, system: PresetLike, *, precision: str = "bf16", devices: int | None = None,
          **plan) -> TrainResult:
    """Step time, MFU, memory and its verdict for one training plan.

    Parameters
    ----------
    model, system : preset name, path to a TOML file, or a preset object.
    precision : compute precision of the matrix multiplies (``"bf16"``, ``"fp8"``).
    devices : optional check that tp x pp x dp x cp equals it.
    **plan : tp, pp, dp, ep, cp, micro_batch, global_batch (sequences), zero (0-3),
        recompute (none/selective/full), sequence_parallel, interleave, overlap
        (none/gradients/standard/all or ``"dp=1,tp=0.5"``), offload
        (none/optimizer/activations/both), grad_dtype (bf16/fp32), seq_len,
        flash_attention, optimizer_bytes; and system fields such as
        ``scale_out_bandwidth`` to change the system for this run.
    """
    m, s = _resolve(model, system)
    for name, value in plan.items():
        if isinstance(value, (list, tuple, np.ndarray, range)):
            raise SnlabError(name, "got a list", "one value; use snlab.sweep for grids")
    g, hw, labels, broken, out = evaluate(m, s, plan, precision, devices)
    if broken[0] >= 0:
        rule = pl.RULES[int(broken[0])]
        if rule.field == "degrees":
            for name in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "global_batch"):
                value = float(g[name][0])
                if value < 1 or not value.is_integer():
                    raise SnlabError(name, f"got {value:g}", pl.ALLOWED[name].replace("a multiple", "a whole-number multiple"))
        raise SnlabError(rule.field, _rule_detail(rule, m, g), rule.message)
    row = {k: (v[0] if np.ndim(v) else v) for k, v in out.items()}
    plan_row = {k: (v[0] if np.ndim(v) else v) for k, v in g.items()}
    return TrainResult.from_row(m, s, precision, plan_row, labels, row)


def _rule_detail(rule: pl.Rule, model: Model, g: dict) -> str:
    x = {k: (int(v[0]) if float(v[0]).is_integer() else float(v[0])) for k, v in g.items()}
    details = {
        "tp": f"tp={x['tp']} with {model.heads} heads and {model.kv_heads} key/value heads",
        "pp": f"pp={x['pp']} with {model.layers} layers",
        "interleave": f"layers={model.layers}, pp={x['pp']}, interleave={x['interleave']}",
        "cp": f"cp={x['cp']} with seq_len={x['seq_len']}",
        "ep": f"ep={x['ep']}, dp x cp={x['dp'] * x['cp']}, experts={model.moe.experts if model.moe else 1}",
        "global_batch": f"global_batch={x['global_batch']}, micro_batch x dp={x['micro_batch'] * x['dp']}",
        "zero": f"zero=3 with pp={x['pp']}",
        "devices": f"tp x pp x dp x cp = {x['tp'] * x['pp'] * x['dp'] * x['cp']}",
        "degrees": "a degree below 1 or not whole",
    }
    return "broken rule: " + details.get(rule.field, rule.field)


def _frame(model: Model, system: System, precision: str, g: dict, labels: dict, broken: np.ndarray,
           out: dict, hw_axes: dict | None = None):
    hw_axes = hw_axes or {}
    import pandas as pd
    n = broken.shape[0]
    zeros = np.zeros(n, dtype=np.int8)
    data = {"model": pd.Categorical.from_codes(zeros, [model.name]),
            "system": pd.Categorical.from_codes(zeros, [system.name]),
            "precision": pd.Categorical.from_codes(zeros, [precision])}
    for name in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "interleave", "seq_len"):
        data[name] = g[name].astype(np.int64)
    data["recompute"] = pd.Categorical.from_codes(g["recompute"].astype(int), list(pl.RECOMPUTE))
    data["sequence_parallel"] = g["sequence_parallel"] > 0
    data["offload"] = pd.Categorical.from_codes(g["offload"].astype(int), list(pl.OFFLOAD))
    data["overlap"] = pd.Categorical.from_codes(g["overlap"].astype(int), labels["overlap"]) \
        if len(set(labels["overlap"])) == len(labels["overlap"]) else g["overlap"].astype(int)
    for cls in pl.OVERLAP_CLASSES:
        data[f"overlap_{cls}"] = g[f"overlap_{cls}"]
    data["flash_attention"] = g["flash_attention"] > 0
    data["grad_bytes"] = g["grad_bytes"]
    data["optimizer_bytes"] = g["optimizer_bytes"]
    for name in hw_axes:
        data[name] = np.broadcast_to(hw_axes[name], (n,))
    valid = broken < 0
    for key, col in out.items():
        data[key] = np.broadcast_to(col, (n,))
    reasons = ["ok"] + [r.message for r in pl.RULES] + ["does not fit in device memory",
                                                        "offloaded state exceeds host or pool memory"]
    code = np.where(valid, 0, broken + 1).astype(np.int64)
    fits_dev = out["memory_total_bytes"] <= np.broadcast_to(out["memory_capacity_bytes"], (n,))
    code = np.where(valid & ~fits_dev, len(pl.RULES) + 1, code)
    code = np.where(valid & fits_dev & ~np.broadcast_to(out["fits"], (n,)), len(pl.RULES) + 2, code)
    data["valid"] = valid
    data["reason"] = pd.Categorical.from_codes(code, reasons)
    walls = np.stack([out["wall_compute_s"], out["wall_communication_s"], out["wall_memory_s"]])
    limited = np.argmax(np.broadcast_to(walls, (3, n)), axis=0)
    limited = np.where(data["fits"], limited, 2)
    data["limited_by"] = pd.Categorical.from_codes(np.where(valid, limited, -1), ["compute", "communication", "memory"])
    return pd.DataFrame(data, copy=False)


def sweep(model, system, *, precision="bf16", devices=None, **axes):
    """Evaluate the Cartesian product of the axes in one vectorised call.

    Any plan field (see :func:`train`) or system field (``scale_out_bandwidth``,
    ``scale_up_latency``, ``hbm_capacity``, ...; numbers in SI units or strings such
    as ``"400 Gb/s"``) may be a list or array. ``model``, ``system`` and
    ``precision`` may be lists too. Returns a pandas DataFrame, one row per
    configuration, units in column names; rows that break a rule or do not fit keep
    their plan, carry ``valid``/``fits`` False and the ``reason``.
    """
    import pandas as pd
    frames = []
    for m_spec, s_spec, prec in itertools.product(_axis_values("model", model), _axis_values("system", system),
                                                 _axis_values("precision", precision)):
        m, s = _resolve(m_spec, s_spec)
        g, hw, labels, broken, out = evaluate(m, s, axes, prec, devices)
        swept = {k: hw[k] for k in SYSTEM_FIELDS if k in axes}
        frames.append(_frame(m, s, prec, g, labels, broken, out, swept))
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames, ignore_index=True)


def _divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def search_space(model: Model, devices: int, global_batch: int, **fixed) -> dict[str, np.ndarray]:
    """Every plan for ``devices`` devices and ``global_batch`` sequences: parallel
    degrees, micro-batch, recomputation, ZeRO, sequence parallelism and interleaving.
    A keyword fixes an axis to the given value(s)."""
    tps = fixed.pop("tp", [x for x in _divisors(devices) if model.heads % x == 0 and x <= 64
                           and (model.kv_heads % x == 0 or x % model.kv_heads == 0)])
    pps = fixed.pop("pp", [x for x in _divisors(model.layers) if devices % x == 0])
    cps = fixed.pop("cp", [x for x in (1, 2, 4, 8) if model.seq_len % x == 0])
    experts = model.moe.experts if model.moe else 1
    rows = []
    for t, p, c in itertools.product(_axis_values("tp", tps), _axis_values("pp", pps), _axis_values("cp", cps)):
        if devices % (t * p * c):
            continue
        d = devices // (t * p * c)
        if global_batch % d:
            continue
        eps = [x for x in _divisors(d * c) if experts % x == 0] if model.moe else [1]
        for e in _axis_values("ep", fixed.get("ep", eps)):
            rows.append((t, p, d, c, e))
    if not rows:
        raise SnlabError("devices", f"no tp x pp x dp x cp = {devices} fits the model", "another device count")
    base = np.asarray(rows, dtype=float)
    options = {
        "micro_batch": fixed.pop("micro_batch", [1, 2, 4, 8, 16, 32, 64]),
        "interleave": fixed.pop("interleave", [1, 2, 3, 4, 6, 8]),
        "zero": fixed.pop("zero", [0, 1, 2, 3]),
        "recompute": fixed.pop("recompute", ["none", "selective", "full"]),
        "sequence_parallel": fixed.pop("sequence_parallel", [False, True]),
    }
    fixed.pop("ep", None)
    return base, options, fixed


def search(model, system, *, devices: int, global_batch: int, precision: str = "bf16", top: int = 10,
           **fixed):
    """The fastest plans that fit, over every parallelism, micro-batch, recomputation,
    ZeRO stage, sequence parallelism and interleaving choice.

    Returns a DataFrame of the ``top`` plans, fastest first (empty if none fits).
    Keywords fix axes (``tp=8``, ``recompute="full"``, ``overlap="all"``).
    """
    import pandas as pd
    m, s = _resolve(model, system)
    for name, value in (("devices", devices), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise SnlabError(name, f"got {value!r}", "a whole number >= 1")
    base, options, fixed = search_space(m, int(devices), int(global_batch), **fixed)
    frames = []
    # the structural degrees vary together (rows of ``base``); the rest is a product
    structural = {"tp": base[:, 0], "pp": base[:, 1], "dp": base[:, 2], "cp": base[:, 3], "ep": base[:, 4]}
    g_opts, hw, labels = _grid(m, s, {**fixed, **options, "global_batch": global_batch, "tp": 1, "pp": 1,
                                      "dp": 1, "cp": 1, "ep": 1})
    opts_shape = np.broadcast_shapes(*(np.shape(v) for v in g_opts.values()))
    g_opts = flatten(g_opts, opts_shape)
    n_opts = g_opts["tp"].shape[0]
    g = {k: np.tile(v, base.shape[0]) for k, v in g_opts.items()}
    for k, v in structural.items():
        g[k] = np.repeat(v, n_opts)
    g["sequence_parallel"] = np.where(g["tp"] > 1, g["sequence_parallel"], 0.0)
    hw["peak_flops"] = s.device.peak(precision)
    broken = pl.violations(m, g, devices)
    keep = broken < 0
    g = {k: v[keep] for k, v in g.items()}
    with np.errstate(all="ignore"):
        out = step_columns(m, g, hw)
    frame = _frame(m, s, precision, g, labels, broken[keep], out)
    frame = frame[frame["fits"]].drop_duplicates(
        subset=["tp", "pp", "dp", "ep", "cp", "micro_batch", "zero", "recompute", "sequence_parallel",
                "interleave"])
    frames.append(frame.sort_values("step_time_s").head(top))
    result = pd.concat(frames, ignore_index=True)
    result.attrs["evaluated"] = int(keep.sum())
    return result
