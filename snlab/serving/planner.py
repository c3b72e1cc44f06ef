"""Serving planners: ``serve`` (one deployment), ``serve_sweep`` (a grid) and
``serve_best`` (the batch with the best throughput under a latency target).

All three build a grid of deployments (:mod:`snlab.grid`) and evaluate it with one
call of :func:`snlab.serving.step.serve_columns`; ``serve`` is a grid of one row.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import energy, grid, kernel, network, schema, uncertainty
from ..errors import SnlabError
from ..hardware import DTYPE_BYTES, FIELDS, field_dimension, hardware
from ..presets import PresetLike
from ..presets import model as load_model
from ..presets import system as load_system
from ..specs import Model, System
from ..units import parse_quantity
from . import deployment as dp_
from . import engine as _engine
from .result import ServeResult
from .step import KV_LOCATIONS, serve_columns

kernel.loaded(__name__)

#: system fields a serving sweep may vary (SI units)
SYSTEM_FIELDS = FIELDS
#: deployment fields that count something, and the largest count they may hold (degrees,
#: sequences, tokens): far beyond any deployment, small enough that no product overflows
COUNTS = ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context", "draft_tokens", "microbatches",
          "prefill_batch", "requests", "max_sequences", "max_step_tokens", "kv_block_tokens")
MAX_COUNT = 1e15
#: the largest parallel degree (as in training: a thousand times the largest clusters of 2026)
MAX_DEGREE = 1e8
#: the most draft tokens a step may propose (speculative decoding and MTP use 1 to 8)
MAX_DRAFT_TOKENS = 64
_DTYPES = list(DTYPE_BYTES)


def _axes(axes: dict) -> tuple[dict, dict]:
    """Each deployment field and each swept system field as a numeric axis."""
    merged = {**dp_.DEFAULTS, **axes}
    for name in ("prompt_len", "output_len"):
        if merged[name] is None:
            raise SnlabError(name, "missing", dp_.ALLOWED[name])
    columns: dict[str, np.ndarray] = {}
    for name in dp_.DEFAULTS:
        values = grid.axis_values(name, merged[name])
        if name in ("context", "requests", "ep_overlap"):
            columns[name] = np.asarray([np.nan if v is None else grid.numbers(name, [v], dp_.ALLOWED[name])[0]
                                        for v in values])
        elif name == "graphs":
            columns[name] = grid.flags(name, values)
        elif name == "scenario":
            columns[name] = grid.coded(name, values, {d: i for i, d in enumerate(dp_.SCENARIOS)}, dp_.ALLOWED[name])
        elif name == "engine_memory_bytes" and not isinstance(values, np.ndarray):   # "4.5 GiB" reads too
            columns[name] = grid.numbers(name, [parse_quantity(v, "bytes", name)[0] if isinstance(v, str) else v
                                                for v in values], dp_.ALLOWED[name])
        elif name in dp_.NUMERIC:
            columns[name] = grid.numbers(name, values, dp_.ALLOWED[name])
        elif name in ("weight_dtype", "kv_dtype"):
            columns[name] = grid.coded(name, values, {d: i for i, d in enumerate(_DTYPES)}, dp_.ALLOWED[name])
        elif name == "kv_offload":
            columns[name] = grid.coded(name, values, dp_.KV_OFFLOAD, dp_.ALLOWED[name])
        elif name == "output_dist":
            columns[name] = grid.coded(name, values, {d: i for i, d in enumerate(dp_.OUTPUT_DISTS)},
                                       dp_.ALLOWED[name])
    for name in COUNTS:
        top = {"draft_tokens": MAX_DRAFT_TOKENS, "requests": dp_.MAX_REQUESTS, "max_step_tokens": dp_.MAX_STEP_TOKENS,
               "max_sequences": dp_.MAX_STEP_TOKENS, "kv_block_tokens": 1024,
               **dict.fromkeys(("tp", "pp", "dp", "ep"), MAX_DEGREE)}.get(name, MAX_COUNT)
        big = np.abs(columns[name]) > top          # NaN (no context given) compares False
        if big.any():
            low = 0 if name in ("draft_tokens", "max_sequences", "max_step_tokens") else 1
            raise SnlabError(name, f"got {columns[name][big][0]:g}", f"a whole number from {low} to {top:,.0f}")
    for name, low, high in (("expert_imbalance", 1.0, 64.0), ("host_step_s", 0.0, 1.0), ("kv_fraction", 0.0, 1.0),
                            ("engine_memory_bytes", 0.0, dp_.MAX_ENGINE_MEMORY)):
        bad = (columns[name] < low) | (columns[name] > high) | ((columns[name] == 0) & (name == "kv_fraction"))
        if bad.any():
            raise SnlabError(name, f"got {columns[name][bad][0]:g}", dp_.ALLOWED[name])
    hw_axes = {name: grid.numbers(name, grid.axis_values(name, axes[name]),
                                  schema.describe(field_dimension(name)), field_dimension(name))
               for name in SYSTEM_FIELDS if name in axes}
    return columns, hw_axes


#: each deployment field's column for one value, once a single deployment has passed the
#: checks with it (:class:`snlab.grid.FieldMemo`)
_ONE_DEPLOYMENT = grid.FieldMemo()
#: axes that make a call more than one deployment of its own fields
_SWEPT = frozenset(SYSTEM_FIELDS)


#: the :data:`_ONE_DEPLOYMENT` key of each field's default
_DEFAULT_KEYS = {name: grid.memo_key(name, default) for name, default in dp_.DEFAULTS.items()}


def _one_deployment_keys(axes: dict) -> list | None:
    """The :data:`_ONE_DEPLOYMENT` keys of a single deployment's fields, or None when one
    has no key."""
    keys = []
    for name, default_key in _DEFAULT_KEYS.items():
        key = grid.memo_key(name, axes[name]) if name in axes else default_key
        if key is None:
            return None
        keys.append(key)
    return keys


def _dtype_columns(hw, weight_dtype, kv_dtype) -> dict:
    """The deployment fields that follow from the weights' and the KV cache's dtype codes:
    bytes per element, and the weights' GEMM peak ratio, efficiency ratio and half-rate
    size on ``hw`` (numpy scalars for one deployment)."""
    if type(weight_dtype) is np.float64 and type(kv_dtype) is np.float64:
        w, k = _DTYPES[int(weight_dtype)], _DTYPES[int(kv_dtype)]
        return dict(efficiency_ratio=np.float64(hw.efficiency_ratio(w)), gemm_half=np.float64(hw.gemm_half(w)),
                    weight_bytes=np.float64(DTYPE_BYTES[w]), kv_bytes=np.float64(DTYPE_BYTES[k]),
                    gemm_ratio=np.float64(hw.peak_ratio(w)))
    wd, kd = weight_dtype.astype(int), kv_dtype.astype(int)
    weight_bytes = np.asarray([DTYPE_BYTES[d] for d in _DTYPES], dtype=float)
    return dict(efficiency_ratio=np.asarray([hw.efficiency_ratio(d) for d in _DTYPES])[wd],
                gemm_half=np.asarray([hw.gemm_half(d) for d in _DTYPES])[wd],
                weight_bytes=weight_bytes[wd], kv_bytes=weight_bytes[kd],
                gemm_ratio=np.asarray([hw.peak_ratio(d) for d in _DTYPES])[wd])


def _grid(model: Model, system: System, axes: dict):
    """The Cartesian product of the axes as an open grid: (deployment, hardware, columns)."""
    grid.unknown_fields(axes, tuple(dp_.DEFAULTS) + SYSTEM_FIELDS, "deployment or system")
    keys = None if _SWEPT.intersection(axes) else _one_deployment_keys(axes)
    found = _ONE_DEPLOYMENT.get(keys)
    if found is None:
        columns, hw_axes = _axes(axes)
    else:
        columns, hw_axes = None, {}
    hw = hardware(system)
    if found is not None:
        g = dict(zip(dp_.DEFAULTS, found))
        arrays = {}
    elif not hw_axes and all(len(v) == 1 for v in columns.values()):
        # one deployment: numpy scalars, several times faster than one-element arrays
        g = {k: np.float64(v[0]) for k, v in columns.items()}
        arrays = {}
        if keys is not None:
            for key, name in zip(keys, dp_.DEFAULTS):
                _ONE_DEPLOYMENT.put(key, g[name])
    else:
        grid.check_size({**columns, **hw_axes})
        arrays = grid.open_grid({**columns, **{f"hw:{k}": v for k, v in hw_axes.items()}})
        g = {n: a for n, a in arrays.items() if not n.startswith("hw:")}
    if hw_axes:
        changes = {n[3:]: a for n, a in arrays.items() if n.startswith("hw:")}
        hw = hw.replace(**changes)
    given = ~np.isnan(g["context"])
    by_dtype = _dtype_columns(hw, g["weight_dtype"], g["kv_dtype"])
    if np.any((g["scenario"] == 1) & np.isnan(g["requests"])):
        raise SnlabError("requests", "missing for the offline scenario", dp_.ALLOWED["requests"])
    # an offline run's batch is the engine's to choose (snlab.serving.offline); the fixed-batch
    # columns beside it are for one sequence per replica
    g["batch"] = grid.where(g["scenario"] == 1, g["dp"], g["batch"])
    dep = dp_.Deployment(
        **{k: g[k] for k in ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "weight_dtype", "kv_dtype",
                             "draft_tokens", "acceptance", "microbatches", "ep_overlap", "prefill_batch",
                             "hbm_utilization", "pool_share", "kv_offload", "output_dist", "expert_imbalance",
                             "graphs", "host_step_s", "scenario", "max_sequences", "max_step_tokens", "kv_fraction",
                             "kv_block_tokens", "engine_memory_bytes")},
        requests=grid.where(np.isnan(g["requests"]), 1.0, g["requests"]),
        context=grid.where(given, g["context"], g["prompt_len"] + np.floor(g["output_len"] / 2)),
        capacity_context=grid.where(given, g["context"], g["prompt_len"] + g["output_len"]), **by_dtype)
    # on a torus pod each deployment runs on the slice the scheduler gives its devices
    hw_cols = {k: getattr(hw, k) for k in hw_axes}
    return dep, network.placed(system, hw, dep.devices), hw_cols


def _power(model: Model, system: System, out: dict, dep, hw, prices=None, pue=None) -> dict:
    """The power, energy and cost columns of a grid of deployments (none without a power
    model)."""
    if not system.has_power:
        return {}
    cols = {f: getattr(dep, f) for f in ("batch", "dp", "pp", "prefill_batch", "prompt_len", "output_len",
                                          "scenario", "requests", "gemm_ratio", "efficiency_ratio")}
    cols["batch"] = out["batch_in_flight"]
    return energy.serving_columns(model, out, cols, hw, prices, pue)


def evaluate(model: Model, system: System, axes: dict, prices=None, pue=None):
    """Deployment columns, swept hardware, rule violations and output columns for
    ``axes``, each laid out flat, one row per deployment; with the power, energy and
    cost columns per output token (:func:`snlab.energy.serving_columns`) when the system
    has a power model."""
    dep, hw, hw_cols = _grid(model, system, axes)
    broken = dp_.violations(model, system, dep)
    with np.errstate(all="ignore"):
        out = serve_columns(model, dep, hw)
        out.update(_power(model, system, out, dep, hw, prices, pue))
    cols = {f: getattr(dep, f) for f in dp_.Deployment.__dataclass_fields__}
    shape = grid.grid_shape(broken, cols, hw_cols)
    broken = np.broadcast_to(broken, shape).ravel()
    ok = broken < 0
    cols, hw_cols = grid.flatten(cols, shape), grid.flatten(hw_cols, shape)
    # rows that break a rule keep their plan; their outputs are NaN (False for flags)
    flat = grid.outputs(out, shape, ok, {**cols, **hw_cols})
    return cols, hw_cols, broken, flat


def reason_codes(broken: np.ndarray, out: dict) -> np.ndarray:
    """Index into :data:`~snlab.serving.deployment.REASONS` per row."""
    code = np.where(broken < 0, 0, broken + 1).astype(np.int64)
    valid = broken < 0
    fits_weights, fits = out["fits_weights"].astype(bool), out["fits"].astype(bool)
    code = np.where(valid & ~fits_weights, len(dp_.RULES) + 1, code)
    return np.where(valid & fits_weights & ~fits, len(dp_.RULES) + 2, code)


def _resolve(model: PresetLike, system: PresetLike) -> tuple[Model, System]:
    return load_model(model), load_system(system)


def serve(model: PresetLike, system: PresetLike, *, cooling: str | None = None, pue: float | None = None,
          prices=None, **deployment) -> ServeResult:
    """Time to first token, time per output token, throughput, KV-cache placement and
    the limits of one deployment.

    Parameters
    ----------
    model, system : preset name, path to a TOML file, or a preset object.
    **deployment : tp, pp, dp, ep (parallel degrees; devices = tp x pp x dp), batch
        (sequences in flight across the deployment), prompt_len, output_len [tokens],
        context [tokens] (KV length while decoding; default prompt + output/2 for time
        and prompt + output for capacity), weight_dtype and kv_dtype (bf16, fp16, fp8,
        int8, fp4), draft_tokens and acceptance (speculative decoding / MTP),
        microbatches (2 for two-batch overlap), prefill_batch (prompts per prefill pass
        per replica), hbm_utilization, pool_share, kv_offload (auto or hbm),
        output_dist (fixed, uniform, exponential); scenario ("offline": requests queued
        at once) with the engine's limits requests, max_sequences, max_step_tokens,
        kv_fraction, kv_block_tokens and engine_memory_bytes (the bytes per device it
        keeps besides weights and KV cache; :mod:`snlab.serving.offline`); and system
        fields such as ``hbm_bandwidth`` to change the system for this run.
    cooling, pue, prices : as in :func:`snlab.train`; energy and cost are per output
        token at the continuous-batching rate (the offline run's, offline).
    """
    dp_.check_scenario(deployment)
    return serve_unchecked(model, system, cooling=cooling, pue=pue, prices=prices, **deployment)


def serve_unchecked(model: PresetLike, system: PresetLike, *, cooling: str | None = None, pue: float | None = None,
                    prices=None, **deployment) -> ServeResult:
    """:func:`serve` without its check that the scenario reads every field given: a
    request queue's instance (:mod:`snlab.serving.service`) probes its deployment's rules
    with a fixed batch beside the engine limits it reads itself."""
    from ..training.planner import power_options
    m, s = _resolve(model, system)
    s, pue, prices = power_options(s, cooling, pue, prices, "sustained_clock" in deployment)
    for name, value in deployment.items():
        if isinstance(value, (list, tuple, range)) or (isinstance(value, np.ndarray) and value.ndim > 0):
            raise SnlabError(name, "got a list", "one value; use snlab.serve_sweep for grids")
    dep, hw, _ = _grid(m, s, deployment)
    values = {f: getattr(dep, f) for f in dp_.Deployment.__dataclass_fields__}
    row = _kernel_row(m, s, hw, values, prices, pue)
    if row is None or row.pop("_broken") >= 0:         # the chain itself names the broken rule
        row = _chain_row(m, s, hw, dep, values, prices, pue)
    dp_.check_read(m, s, deployment)
    grid.check_finite(row, deployment)
    return ServeResult.from_row(m, s, {k: float(v) if type(v) is np.float64 else float(np.ravel(v)[0])
                                       for k, v in values.items()}, row, prices)


def _chain_row(m: Model, s: System, hw, dep, values: dict, prices, pue) -> dict:
    """One deployment's output row, through the chain of the step's parts; a broken rule
    is an error naming its field."""
    broken = int(np.ravel(dp_.violations(m, s, dep))[0])
    if broken >= 0:
        field, message = dp_.RULES[broken]
        raise SnlabError(field, _detail(field, m, s, {k: np.ravel(v)[:1] for k, v in values.items()}), message)
    with np.errstate(all="ignore"):
        out = serve_columns(m, dep, hw)
        out.update(_power(m, s, out, dep, hw, prices, pue))
    return {k: (v.item() if isinstance(v, np.ndarray) else float(v)) for k, v in out.items()}


#: the chain of one deployment as scalar kernels (:mod:`snlab.kernel`)
_KERNELS = kernel.Kernels()
#: deployment fields that take any value without changing the chain's shape; a kernel is
#: kept per value of the others (the parallel degrees, dtypes and choices)
_CONTINUOUS = frozenset(("batch", "prompt_len", "output_len", "context", "capacity_context", "acceptance",
                         "hbm_utilization", "pool_share", "expert_imbalance", "host_step_s", "requests",
                         "kv_fraction", "ep_overlap", "engine_memory_bytes"))


def _kernel_row(m: Model, s: System, hw, values: dict, prices, pue) -> dict | None:
    """One deployment's output row (with ``_broken``, the rule it breaks or -1) from the
    chain's kernel for its structure, or None where there is none for it yet (a torus,
    whose slice depends on the deployment, runs the chain)."""
    if s.scale_up.topology.kind == "torus" or not all(type(v) is np.float64 for v in values.values()):
        return None
    key = (id(m), id(s), id(hw), prices, pue, *[v for k, v in values.items() if k not in _CONTINUOUS])
    row = _KERNELS.run(key, lambda: deployment_chain(m, s, hw, prices, pue), values, (m, s, hw))
    return None if row is None else {k: (v if k == "_broken" else float(v)) for k, v in row.items()}


def deployment_chain(m: Model, s: System, hw, prices=None, pue=None):
    """The chain :func:`serve` evaluates for one deployment on a system that is no torus,
    as a function of the deployment's fields: the output row with ``_broken`` (the rule
    the deployment breaks, or -1). Its scalar kernel is what a repeated ``serve`` runs."""
    def chain(fields: dict) -> dict:
        dep = dp_.Deployment(**fields)
        out = {"_broken": dp_.violations(m, s, dep), **serve_columns(m, dep, hw)}
        out.update(_power(m, s, out, dep, hw, prices, pue))
        return out
    return chain


def _detail(field: str, m: Model, s: System, g: dict) -> str:
    x = grid.first_row(g)
    details = {
        "tp": f"tp={x['tp']} with {m.heads} heads and {m.kv_heads} key/value heads",
        "pp": f"pp={x['pp']} with {m.layers} layers",
        "batch": f"batch={x['batch']}, dp={x['dp']}",
        "ep": f"ep={x['ep']}, tp={x['tp']}, dp={x['dp']}, experts={m.moe.experts if m.moe else 0}",
        "devices": f"tp x pp x dp = {x['tp'] * x['pp'] * x['dp']} > {s.max_devices} on {s.name}",
        "context": f"context={x['context']}, prompt_len={x['prompt_len']}",
    }
    return "broken rule: " + (details[field] if field in details else f"{field}={x[field]}")


def _frame(model: Model, system: System, g: dict, hw: dict, broken: np.ndarray, out: dict):
    import pandas as pd
    n = broken.shape[0]
    zeros = np.zeros(n, dtype=np.int8)
    data = {"model": pd.Categorical.from_codes(zeros, [model.name]),
            "system": pd.Categorical.from_codes(zeros, [system.name])}
    for name in ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context", "draft_tokens",
                 "microbatches", "prefill_batch"):
        data[name] = np.where(np.isfinite(g[name]), g[name], 0).astype(np.int64)
    offline = g["scenario"] == 1
    # an offline row's batch is the one the engine keeps in flight
    in_flight = grid.full(out.pop("batch_in_flight"), n)
    data["batch"] = np.where(offline & np.isfinite(in_flight), in_flight, data["batch"]).astype(np.int64)
    data["scenario"] = pd.Categorical.from_codes(g["scenario"].astype(int), list(dp_.SCENARIOS))
    for name in ("requests", "max_sequences", "max_step_tokens", "kv_block_tokens"):
        data[name] = np.where(np.isfinite(g[name]) & offline, g[name], 0).astype(np.int64)
    for name in ("kv_fraction", "expert_imbalance", "host_step_s", "engine_memory_bytes", "hbm_utilization",
                 "pool_share"):
        data[name] = g[name]
    if np.isfinite(g["ep_overlap"]).any():      # given: its value (unset, each regime has its measured default)
        data["ep_overlap"] = g["ep_overlap"]
    data["graphs"] = g["graphs"] > 0
    data["acceptance"] = g["acceptance"]
    data["weight_dtype"] = pd.Categorical.from_codes(g["weight_dtype"].astype(int), _DTYPES)
    data["kv_dtype"] = pd.Categorical.from_codes(g["kv_dtype"].astype(int), _DTYPES)
    data["kv_offload"] = pd.Categorical.from_codes(g["kv_offload"].astype(int), list(dp_.KV_OFFLOAD))
    data["output_dist"] = pd.Categorical.from_codes(g["output_dist"].astype(int), list(dp_.OUTPUT_DISTS))
    for key, col in hw.items():       # swept system fields, as columns
        data[key] = col
    for key, col in out.items():
        if key == "kv_location":
            codes = np.where(np.isfinite(col), col, -1).astype(int)
            data[key] = pd.Categorical.from_codes(codes, list(KV_LOCATIONS))
        else:
            data[key] = grid.full(col, n)
    data["valid"] = broken < 0
    data["reason"] = pd.Categorical.from_codes(reason_codes(broken, out), list(dp_.REASONS))
    # the error bands of published decode and prefill runs on this chip family: missing
    # (pd.NA) where no run checks them; band_runs counts the decode runs
    for regime, column in (("serving decode", "decode_tokens_per_s_per_device"),
                           ("serving prefill", "prefill_tokens_per_s_per_device")):
        band = uncertainty.band(regime, system.device.family)
        data[f"{column}_low"], data[f"{column}_high"] = uncertainty.columns(band, data[column])
        if regime == "serving decode":
            data["tpot_s_low"], data["tpot_s_high"] = uncertainty.columns(band, data["tpot_s"], "time")
            data["band_runs"] = np.full(n, band.runs)
    # offline rows: the band of the regime their lengths put them in
    heavy = g["prompt_len"] >= uncertainty.PREFILL_HEAVY * g["output_len"]
    bounds = {r: uncertainty.columns(uncertainty.band(r, system.device.family), data["offline_tokens_per_s_per_device"])
              for r in ("serving decode", "serving prefill")}
    heavy = np.broadcast_to(heavy, (n,))
    for i, side in enumerate(("low", "high")):
        column = bounds["serving decode"][i].copy()
        column[heavy] = bounds["serving prefill"][i][heavy]
        column[~np.broadcast_to(offline, (n,))] = pd.NA
        data[f"offline_tokens_per_s_per_device_{side}"] = column
    wall = np.stack([np.broadcast_to(out[w], (n,)) for w in ("wall_compute_s", "wall_memory_s",
                                                              "wall_communication_s")])
    limited = np.argmax(np.nan_to_num(wall, nan=-1.0), axis=0)
    data["limited_by"] = pd.Categorical.from_codes(np.where(broken < 0, limited, -1),
                                                   ["compute", "memory", "communication"])
    # columns a user can assign into (copy=False: what is already writable stays shared)
    return pd.DataFrame({k: grid.writable(v) for k, v in data.items()}, copy=False)


#: the pieces of serve_sweep that snlab.explore runs chunk by chunk: the open grid of a
#: chunk's axes and the frame of evaluated rows
build_grid, build_frame, power_columns = _grid, _frame, _power


def serve_sweep(model, system, *, cooling=None, pue=None, prices=None, **axes):
    """Evaluate the Cartesian product of the axes in one vectorised call.

    Any deployment field (see :func:`serve`) or system field (``hbm_bandwidth``,
    ``scale_up_latency``, ``pool_bandwidth``, ...; numbers in SI units or strings such as
    ``"900 GB/s"``) may be a list or array; ``model`` and ``system`` may be lists too.
    Returns a pandas DataFrame, one row per deployment, units in column names; rows that
    break a rule or do not fit keep their inputs, carry ``valid``/``fits`` False and the
    ``reason``. Systems with a power model add power, energy (per output token) and,
    with ``prices``, cost columns; ``cooling``, ``pue`` and ``prices`` as in :func:`serve`.
    """
    import pandas as pd
    from ..training.planner import power_options
    specs = {"model": grid.axis_values("model", model), "system": grid.axis_values("system", system)}
    # the whole product counts: lists of models and systems multiply the grid
    grid.check_size({**specs, **{k: grid.axis_values(k, v) for k, v in axes.items()}})
    pairs = [_resolve(m_spec, s_spec) for m_spec, s_spec in itertools.product(*specs.values())]
    # a field no point of the sweep reads is refused, as by serve
    dp_.check_scenario(axes)
    grid.fails_everywhere(lambda m, s: dp_.check_read(m, s, axes), pairs)
    frames = []
    for m, s in pairs:
        s, ratio, price = power_options(s, cooling, pue, prices, "sustained_clock" in axes)
        g, hw, broken, out = evaluate(m, s, axes, price, ratio)
        frames.append(_frame(m, s, g, hw, broken, out))
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _whole(batches, unit, top) -> np.ndarray:
    """Distinct whole multiples of ``unit`` from ``unit`` to ``top`` (at least ``unit``),
    rounded from ``batches``."""
    return np.unique(np.clip(np.round(np.asarray(batches, dtype=float) / unit), 1, max(top // unit, 1)) * unit)


def serve_best(model, system, *, tpot_target: float, max_batch: int | None = None, cooling=None, pue=None,
               prices=None, **deployment) -> ServeResult:
    """The batch with the most decode tokens per second per device whose time per
    output token stays within ``tpot_target`` [s] and whose KV cache fits.

    Candidates are multiples of ``dp`` from ``dp`` up to ``max_batch`` (default: the
    largest batch that fits with every memory tier): 400 spaced geometrically, the largest
    that fits in HBM alone (beyond it the pool's lenders count against throughput) and the
    engine's captured graph sizes (where a step's padding ends), then every multiple between
    the best one's neighbours. In the offline scenario, whose engine picks its own batch,
    the candidates are its limit ``max_sequences`` instead (multiples of ``pp``), from 1 to
    the sequences its KV cache holds (or ``max_batch``), with the limits that split the
    requests into whole waves, and the best is the one with the most output tokens per
    second whose mean time per output token meets the target: the max_batch_size one tunes
    an engine with for a latency target. Raises :class:`SnlabError` naming ``tpot_target`` when no
    candidate meets it. ``cooling``, ``pue`` and ``prices`` as in :func:`serve`.
    """
    from ..training.planner import power_options
    m, s = _resolve(model, system)
    s, pue, prices = power_options(s, cooling, pue, prices, "sustained_clock" in deployment)
    if isinstance(tpot_target, str):
        tpot_target = parse_quantity(tpot_target, "s", "tpot_target")[0]
    if not grid.is_number(tpot_target) or not 0 < tpot_target <= 3600:
        raise SnlabError("tpot_target", f"got {tpot_target!r}", "a time > 0 and at most an hour, e.g. 0.05 or '50 ms'")
    if max_batch is not None:
        max_batch = grid.whole_number("max_batch", max_batch, 1, 1e9, "a whole number of sequences from 1 to 1,000,000,000")
    scenario = deployment.get("scenario")
    # "offline" or its code, as serve reads it; a grid or a bad value: serve names it
    offline = scenario == "offline" if isinstance(scenario, str) else \
        bool(grid.is_number(scenario) and scenario == dp_.SCENARIOS.index("offline"))
    if offline:
        if "max_sequences" in deployment:
            raise SnlabError("max_sequences", f"got {deployment['max_sequences']!r} with a tpot_target, which picks it",
                             "no max_sequences; max_batch bounds the candidates")
        first = serve(m, s, **deployment)
        unit, field = first.deployment["pp"], "max_sequences"     # a whole micro-batch per stage
        top = max(int(max_batch) if max_batch else int(first.offline["kv_sequences"]), 1)
        # and the limits that split the requests into whole waves, where a run's last wave is full
        per_replica = np.ceil(first.deployment["requests"] / first.deployment["dp"])
        coarse = np.concatenate([np.geomspace(1, top, 400), np.ceil(per_replica / np.arange(1, 2049))])
    else:
        deployment.pop("batch", None)
        first = serve(m, s, **deployment, batch=deployment.get("dp", 1))
        unit, field = first.deployment["dp"], "batch"
        top = int(max_batch) if max_batch else max(first.limits["max_batch"], unit)
        in_hbm = min(max(first.limits["max_batch_hbm"] // unit, 1), max(top // unit, 1))
        coarse = np.concatenate([np.geomspace(1, max(top // unit, 1), 400) * unit,
                                 np.geomspace(1, in_hbm, 100) * unit, [in_hbm * unit]])
    # the captured graphs' sizes, where a step's padding ends, then every whole candidate
    # between the best one's neighbours
    graphs = _engine.CAPTURED_BATCHES * unit * (1 if offline else first.deployment["microbatches"])
    candidates = _whole(np.concatenate([coarse, graphs]), unit, top)

    def score(batches):
        g, hw, broken, out = evaluate(m, s, {**deployment, field: batches})
        tpot = out["offline_tpot_s"] if offline else out["tpot_s"]
        rate = out["offline_tokens_per_s_per_device"] if offline else out["decode_tokens_per_s_per_device"]
        fits = (broken < 0) & out["fits"].astype(bool)
        return np.where(fits & (tpot <= tpot_target), rate, -np.inf), np.where(fits, tpot, np.inf)

    rate, tpot = score(candidates)
    if not np.isfinite(rate).any():
        if not np.isfinite(tpot).any():    # no candidate fits: no target would help
            raise SnlabError("deployment", f"no {field} fits: {first.reason}",
                             "more devices per replica (tp, pp), smaller weights (weight_dtype) or KV cache "
                             "(kv_dtype), or a system with more memory")
        fastest = tpot.min()
        raise SnlabError("tpot_target", f"no {field} meets {tpot_target * 1e3:.3g} ms; the fastest step that fits "
                         f"gives {fastest * 1e3:.3g} ms per output token", f"a target above {fastest * 1e3:.3g} ms")
    k = int(np.argmax(rate))
    low, high = candidates[max(k - 1, 0)], candidates[min(k + 1, len(candidates) - 1)]
    fine = _whole(np.arange(low, high + unit, max(unit, np.ceil((high - low) / unit / 2048) * unit)), unit, top)
    fine_rate, _ = score(fine)
    best = int(fine[int(np.argmax(fine_rate))] if fine_rate.max() > rate[k] else candidates[k])
    chosen = {field: best}
    return serve(m, s, pue=pue, prices=prices, **deployment, **chosen)
