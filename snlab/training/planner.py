"""Training planners: ``train`` (one plan), ``sweep`` (a grid), ``search`` (the best plan).

All three build a grid of plans (:mod:`snlab.grid`) and evaluate it with one call of
:func:`snlab.training.step.step_columns`; ``train`` is a grid of one row.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import energy, grid, kernel, schema, uncertainty
from ..errors import SnlabError
from ..hardware import field_dimension, hardware
from ..schema import PRECISIONS
from ..presets import PresetLike
from ..presets import model as load_model
from ..presets import system as load_system
from ..sizing import model_sizes
from ..specs import Model, System
from . import plan as pl
from .result import TrainResult
from .step import stage_memory as step_memory
from .step import step_columns

kernel.loaded(__name__)

PLAN_FIELDS = ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "recompute",
               "sequence_parallel", "interleave", "overlap", "offload", "grad_dtype", "seq_len",
               "flash_attention", "optimizer_bytes", "first_stage_layers", "last_stage_layers",
               "ep_dispatcher", "capacity_factor", "expert_imbalance", "chunk_overhead_s", "fp8_activations",
               "expert_tp", "logit_bytes", "slice", "offload_layers", "fp8_params")
NUMERIC = ("tp", "pp", "dp", "ep", "cp", "expert_tp", "micro_batch", "global_batch", "zero", "interleave",
           "seq_len", "optimizer_bytes", "first_stage_layers", "last_stage_layers", "capacity_factor",
           "expert_imbalance", "chunk_overhead_s", "logit_bytes", "offload_layers")
#: system fields a training sweep may vary, and where they live
SYSTEM_FIELDS = (
    "scale_up_domain_size", "scale_up_bandwidth", "scale_up_latency", "scale_up_efficiency",
    "scale_up_call_latency", "scale_out_bandwidth", "scale_out_latency", "scale_out_efficiency",
    "scale_out_call_latency", "host_bandwidth", "host_capacity", "pool_bandwidth", "pool_capacity",
    "peak_flops", "hbm_bandwidth", "hbm_capacity", "gemm_efficiency", "memory_efficiency",
    "sustained_clock", "memory_reserve", "allocator_efficiency", "overlap_contention",
    "tdp", "idle_power", "hbm_energy", "host_power", "switch_power", "network_power", "pue",
)
OVERLAP_FIELDS = tuple(f"overlap_{c}" for c in pl.OVERLAP_CLASSES)
#: rows of a sweep that are valid but do not fit, after the rules' reasons
REASONS = ("ok",) + tuple(r.message for r in pl.RULES) + ("does not fit in device memory",
                                                           "offloaded state exceeds host or pool memory")


#: the largest parallel degree, micro-batch or interleaving a plan may name (a thousand
#: times the largest clusters of 2026), and the largest global batch [sequences]
MAX_DEGREE, MAX_GLOBAL_BATCH = 1e8, 1e12
#: the longest sequence [tokens] and the most layers a pipeline stage may be given
MAX_SEQ_LEN, MAX_STAGE_LAYERS = 1e9, 1e6
DEGREES = ("tp", "pp", "dp", "ep", "cp", "expert_tp", "micro_batch", "interleave")


def _check_ranges(merged: dict) -> None:
    """Values outside a field's range are errors in train and sweep alike (the plan
    rules, which depend on the model and the other fields, are flagged per row:
    a degree of 0 or 1.5 breaks a rule; one of 10^20 is not a plan)."""
    for name, top in [(d, MAX_DEGREE) for d in DEGREES] + [("global_batch", MAX_GLOBAL_BATCH)]:
        values = grid.axis_values(name, merged[name])
        if isinstance(values, np.ndarray):
            if np.any(np.abs(values) > top):
                raise SnlabError(name, f"got {values[np.abs(values) > top][0]:g}",
                                 f"a whole number from 1 to {top:,.0f}")
            continue
        for v in values:
            if v is None:
                continue
            if not grid.finite(v):
                raise SnlabError(name, f"got {grid.show(v)}", pl.ALLOWED[name])
            if abs(v) > top:
                raise SnlabError(name, f"got {v:g}", f"a whole number from 1 to {top:,.0f}")
    for name, ok in (("zero", lambda v: v in (0, 1, 2, 3)),
                     ("seq_len", lambda v: v is None or (float(v).is_integer() and 1 <= v <= MAX_SEQ_LEN)),
                     ("optimizer_bytes", lambda v: 0 <= v <= 64),
                     ("first_stage_layers", lambda v: float(v).is_integer() and 0 <= v <= MAX_STAGE_LAYERS),
                     ("last_stage_layers", lambda v: float(v).is_integer() and 0 <= v <= MAX_STAGE_LAYERS),
                     ("capacity_factor", lambda v: v == 0 or 0.1 <= v <= 64),
                     ("expert_imbalance", lambda v: v is None or 1 <= v <= 64),
                     ("chunk_overhead_s", lambda v: 0 <= v <= 0.1),
                     ("logit_bytes", lambda v: 0 <= v <= 32),
                     ("offload_layers", lambda v: float(v).is_integer() and 0 <= v <= MAX_STAGE_LAYERS)):
        for v in grid.axis_values(name, merged[name]):
            if v is not None and (not grid.finite(v) or not ok(v)):
                raise SnlabError(name, f"got {grid.show(v)}", pl.ALLOWED[name])


def _plan_axes(model: Model, merged: dict, axes: dict) -> tuple[dict, dict]:
    """Each plan field as a numeric axis, and the labels of the named choices."""
    columns: dict[str, np.ndarray] = {}
    labels: dict[str, list] = {}
    for name in PLAN_FIELDS:
        values = grid.axis_values(name, merged[name])
        if name in NUMERIC:
            columns[name] = grid.numbers(name, values, pl.ALLOWED[name])
        elif name == "recompute":
            columns[name] = np.asarray([pl.recompute_code(v) for v in values], dtype=float)
            labels[name] = list(values)
        elif name in ("offload", "ep_dispatcher"):
            table = {"offload": pl.OFFLOAD, "ep_dispatcher": pl.EP_DISPATCHERS}[name]
            columns[name] = grid.coded(name, values, table, pl.ALLOWED[name])
            labels[name] = list(values)
        elif name == "grad_dtype":
            columns["grad_bytes"] = grid.coded(name, values, {k: float(v) for k, v in pl.GRAD_DTYPE_BYTES.items()},
                                               pl.ALLOWED[name])
        elif name in ("flash_attention", "fp8_params"):
            columns[name] = grid.flags(name, values)
        elif name == "fp8_activations":
            columns[name] = grid.coded(name, [int(v) if isinstance(v, (bool, np.bool_)) else v for v in values],
                                       pl.FP8_ACTIVATIONS, pl.ALLOWED[name])
            labels[name] = list(values)
        elif name == "sequence_parallel":
            columns[name] = np.asarray([-1.0 if v is None else grid.flags(name, [v])[0] for v in values])
        elif name == "slice":
            columns[name] = np.arange(len(values), dtype=float)
            labels[name] = [None if v is None else str(v) for v in values]
        elif name == "overlap":
            levels = [pl.overlap_levels(v) for v in values]
            columns["overlap"] = np.arange(len(levels), dtype=float)
            labels["overlap"] = [v if isinstance(v, str) else str(v) for v in values]
            labels["_overlap_levels"] = levels
    for name in OVERLAP_FIELDS:
        if name in axes:
            columns[name] = grid.numbers(name, grid.axis_values(name, axes[name]), "levels in [0, 1]", "fraction0")
    return columns, labels


#: plan fields whose missing value (None) the model or the precision fills in
FILLED = ("seq_len", "expert_tp", "fp8_activations", "expert_imbalance")
#: axes that make a call more than one plan of its own fields (hardware and overlap levels)
_SWEPT = frozenset(SYSTEM_FIELDS + OVERLAP_FIELDS)
#: each plan field's column and labels for one value, once a single plan has passed the
#: checks with it (:class:`snlab.grid.FieldMemo`)
_ONE_PLAN = grid.FieldMemo()
#: the columns each plan field makes (grad_dtype: the gradients' bytes)
_COLUMNS = {name: ("grad_bytes" if name == "grad_dtype" else name) for name in PLAN_FIELDS}
#: each plan field's default and its :data:`_ONE_PLAN` key
_DEFAULT_KEYS = {name: (pl.DEFAULTS[name], grid.memo_key(name, pl.DEFAULTS[name])) for name in PLAN_FIELDS}


def _fills(model: Model, merged: dict, precision: str) -> dict:
    """The values the model and the precision give the plan fields left None."""
    fills = {}
    if merged["seq_len"] is None:
        fills["seq_len"] = model.seq_len
    if merged["expert_tp"] is None:
        fills["expert_tp"] = 0          # as tp, row by row
    if merged["fp8_activations"] is None:
        fills["fp8_activations"] = "linear" if precision == "fp8" else "none"
    if merged["expert_imbalance"] is None:
        fills["expert_imbalance"] = model.moe.load_imbalance if model.moe else 1.0
    return fills


def _one_plan_keys(merged: dict, fills: dict) -> list | None:
    """The :data:`_ONE_PLAN` keys of a single plan's fields (a filled value apart from the
    same value given, which the range checks see), or None when one has no key."""
    keys = []
    for name, default in _DEFAULT_KEYS.items():
        if name in fills:
            key = grid.memo_key(name, fills[name], "filled")
        else:
            value = merged[name]
            key = default[1] if value is default[0] else grid.memo_key(name, value)
        if key is None:
            return None
        keys.append(key)
    return keys


def _remember(keys: list, g: dict, labels: dict) -> None:
    """Keep each field's column (as a numpy scalar) and labels of a checked single plan."""
    for key, name in zip(keys, PLAN_FIELDS):
        column = _COLUMNS[name]
        named = tuple((k, dict(labels[k][0]) if type(labels[k][0]) is dict else labels[k][0])
                      for k in (("overlap", "_overlap_levels") if name == "overlap" else (name,)) if k in labels)
        _ONE_PLAN.put(key, (column, g[column], named))


def _one_plan(found: list) -> tuple[dict, dict]:
    """The columns and labels of a single plan from its fields' :data:`_ONE_PLAN` entries,
    as :func:`_grid` makes them (labels in new lists, overlap levels in a new dict)."""
    g, labels = {}, {}
    for column, value, named in found:
        g[column] = value
        for k, v in named:
            labels[k] = [dict(v) if type(v) is dict else v]
    if g["sequence_parallel"] < 0:
        g["sequence_parallel"] = np.float64(g["tp"] > 1)
    levels = labels["_overlap_levels"][0]
    for name in OVERLAP_FIELDS:
        g[name] = np.float64(levels[name[len("overlap_"):]])
    return g, labels


def _grid(model: Model, system: System, axes: dict, precision: str = "bf16"):
    """The Cartesian product of the axes as an open grid: (plan columns, hardware,
    labels). The columns are the planner's input names, ``overlap`` the index of the
    overlap choice and ``overlap_<class>`` its levels."""
    grid.unknown_fields(axes, PLAN_FIELDS + SYSTEM_FIELDS + OVERLAP_FIELDS, "plan or system")
    _check_precision(precision)
    merged = {**pl.DEFAULTS, **axes}
    fills = _fills(model, merged, precision)
    keys = None if _SWEPT.intersection(axes) else _one_plan_keys(merged, fills)
    found = _ONE_PLAN.get(keys)
    if found is None:
        _check_ranges(merged)
    if merged["global_batch"] is None:
        raise SnlabError("global_batch", "missing", "a multiple of micro_batch x dp (sequences per step)")
    merged.update(fills)
    if precision not in ("fp8", "fp4") and any(bool(v) for v in grid.axis_values("fp8_params", merged["fp8_params"])):
        raise SnlabError("fp8_params", f"true with precision {precision}", "false unless precision is fp8 or fp4")
    if precision not in ("fp8", "fp4") and "fp8_activations" in axes and any(
            v != "none" for v in grid.axis_items(axes["fp8_activations"])):   # None: the precision's own
        # Transformer Engine keeps a linear layer's input in FP8 only inside FP8 autocast
        raise SnlabError("fp8_activations", f"{axes['fp8_activations']!r} with precision {precision}",
                         "none unless precision is fp8 or fp4")
    hw = hardware(system, precision)
    if found is not None:
        g, labels = _one_plan(found)
        return g, hw, labels
    columns, labels = _plan_axes(model, merged, axes)
    hw_axes = {name: grid.numbers(name, grid.axis_values(name, axes[name]),
                                  schema.describe(field_dimension(name)), field_dimension(name))
               for name in SYSTEM_FIELDS if name in axes}
    if not hw_axes and all(len(v) == 1 for v in columns.values()):
        # one configuration: scalars, which numpy evaluates several times faster than
        # arrays of one element with a dimension per axis
        g = {k: np.float64(v[0]) for k, v in columns.items()}
        if keys is not None:
            _remember(keys, g, labels)
        if g["sequence_parallel"] < 0:
            g["sequence_parallel"] = np.float64(g["tp"] > 1)
        for name in OVERLAP_FIELDS:
            g.setdefault(name, np.float64(labels["_overlap_levels"][0][name[len("overlap_"):]]))
        return g, hw, labels
    grid.check_size({**columns, **hw_axes})
    arrays = grid.open_grid({**columns, **{f"hw:{k}": v for k, v in hw_axes.items()}})
    g = {n: a for n, a in arrays.items() if not n.startswith("hw:")}
    sp = g["sequence_parallel"]
    g["sequence_parallel"] = np.where(sp < 0, (g["tp"] > 1).astype(float), sp)
    idx = g["overlap"].astype(int)
    for name in OVERLAP_FIELDS:
        if name not in g:
            g[name] = np.asarray([lv[name[len("overlap_"):]] for lv in labels["_overlap_levels"]])[idx]
    if hw_axes:
        hw = hw.replace(**{n[3:]: a for n, a in arrays.items() if n.startswith("hw:")})
    return g, hw, labels


def _placed(system: System, hw, g: dict, labels: dict):
    """The hardware with each plan's slice of a torus (:func:`snlab.network.placed`): the
    plan's ``slice`` or the scheduler's shape for its devices. A slice on a system that is
    no torus, or one that cannot hold the job, is an error naming the field."""
    from .. import network
    from .. import topology as topo
    given = labels.get("slice", [None])
    top = system.scale_up.topology
    if top.kind != "torus":
        if any(v is not None for v in given):
            raise SnlabError("slice", f"{system.name} is a {top.describe()}", "no slice: only a torus takes one")
        return hw
    shapes = [None if v is None else topo.parse_slice(v, top) for v in given]
    devices = g["tp"] * g["pp"] * g["dp"] * g["cp"]
    for i, shape in enumerate(shapes):
        if shape is not None:
            rows = np.broadcast_to(g["slice"] == i, np.shape(devices)) if np.ndim(devices) else [g["slice"] == i]
            for n in np.unique(np.broadcast_to(devices, np.shape(rows))[np.asarray(rows)]):
                topo.check_slice(shape, int(n))
    return network.placed(system, hw, devices, (shapes, g["slice"]))


def _check_precision(precision) -> None:
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise SnlabError("precision", f"got {precision!r}",
                         ", ".join(PRECISIONS) + " (several only in snlab.sweep)")


def _check_devices(devices) -> int | None:
    """``devices`` as an int (a numpy scalar or 0-d array counts), or None."""
    return None if devices is None else grid.whole_number("devices", devices, 1, MAX_DEVICES)


#: each field of a :class:`~snlab.training.plan.Plan` and the plan column it takes
_PLAN_OF = {**{f: f for f in pl.Plan.__dataclass_fields__}, "zero_stage": "zero"}


def plan_of(g: dict) -> pl.Plan:
    """A :class:`~snlab.training.plan.Plan` from named plan columns."""
    return pl.Plan(**{field: g[column] for field, column in _PLAN_OF.items()})


def stage_memory(model: PresetLike, system: PresetLike, precision: str = "bf16", **plan):
    """Memory per device of each pipeline stage of one plan, before offload: a pandas
    DataFrame, one row per stage, with its transformer layers, the micro-batches it holds
    in flight and its bytes of weights, gradients, optimizer state, activations and
    buffers (:func:`snlab.training.step.stage_memory`). ``train`` reports the largest."""
    import pandas as pd
    m, s = _resolve(model, system)
    g, hw, _ = _grid(m, s, plan, precision)
    if any(np.ndim(v) for v in g.values()):
        raise SnlabError("plan", "a list", "one plan (lists are for snlab.sweep)")
    p = plan_of(g)
    broken = int(pl.violations(m, p))
    if broken >= 0:
        rule = pl.RULES[broken]
        raise SnlabError(rule.field, "broken rule", rule.message)
    rows = step_memory(model_sizes(m), p, hw)
    frame = pd.DataFrame(rows).rename(columns={k: f"{k}_bytes" for k in ("weights", "grads", "optimizer",
                                                                         "activations", "buffers", "total")})
    return frame


def evaluate(model: Model, system: System, axes: dict, precision: str = "bf16", devices=None,
             prices: energy.Prices | None = None, pue=None):
    """Plan columns, swept hardware, labels, rule violations and output columns for
    ``axes``, each laid out flat, one row per configuration; with the power, energy and
    cost columns (:func:`snlab.energy.training_columns`) when the system has a power model."""
    devices = _check_devices(devices)
    g, hw, labels = _grid(model, system, axes, precision)
    plan = plan_of(g)
    broken = pl.violations(model, plan, devices)
    hw = _placed(system, hw, g, labels)
    with np.errstate(all="ignore"):
        out = step_columns(model_sizes(model), plan, hw)
        if system.has_power:
            out.update(energy.training_columns(out, g, hw, prices, pue))
    out.update(_slice_columns(hw))
    hw_cols = {k: getattr(hw, k) for k in SYSTEM_FIELDS if k in axes}
    shape = grid.grid_shape(broken, g, hw_cols)
    broken = np.broadcast_to(broken, shape).ravel()
    ok = broken < 0
    g, hw_cols = grid.flatten(g, shape), grid.flatten(hw_cols, shape)
    # rows that break a rule keep their plan; their outputs are NaN (False for flags)
    flat = grid.outputs(out, shape, ok, {**g, **hw_cols})
    return g, hw_cols, labels, broken, flat


def _resolve(model: PresetLike, system: PresetLike) -> tuple[Model, System]:
    return load_model(model), load_system(system)


def power_options(system: System, cooling=None, pue=None, prices=None, clock_given: bool = False):
    """The system under the chosen cooling (:func:`snlab.energy.cooled`), the PUE
    override and the prices, checked: one-line errors name the field."""
    if pue is not None:
        if isinstance(pue, bool) or not isinstance(pue, (int, float)) or not 1 <= pue <= 3:
            raise SnlabError("pue", f"got {pue!r}", "a PUE from 1 to 3")
        pue = float(pue)
    if cooling is not None or pue is not None or prices is not None:
        if not system.has_power:
            raise SnlabError("cooling" if cooling is not None else "pue" if pue is not None else "prices",
                             f"{system.name} has no power model", "a system with [power] and [cooling] sections")
    system = energy.cooled(system, cooling, keep_clock=clock_given)
    price = energy.prices(prices, system=system) if isinstance(prices, str) else energy.prices(prices)
    return system, pue, price


def train(model: PresetLike, system: PresetLike, *, precision: str = "bf16", devices: int | None = None,
          cooling: str | None = None, pue: float | None = None, prices=None, **plan) -> TrainResult:
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
        flash_attention, optimizer_bytes, chunk_overhead_s (seconds each extra pass
        through a virtual stage costs); and system fields such as
        ``scale_out_bandwidth`` to change the system for this run.
    cooling : ``"air"`` or ``"liquid"`` (default: the cooling the system is built for);
        it sets the PUE, the devices per rack and, unless ``sustained_clock`` is given,
        the clock the devices sustain (:func:`snlab.energy.cooling_state`).
    pue : the facility's PUE instead of the cooling's.
    prices : :class:`snlab.energy.Prices`, a mapping of its fields (``device_hour``,
        ``capex``, ``years``, ``kwh``, ``utilisation``) or ``"example"``: adds the cost
        per hour and per million tokens.
    """
    m, s = _resolve(model, system)
    s, pue, prices = power_options(s, cooling, pue, prices, "sustained_clock" in plan)
    for name, value in plan.items():
        if isinstance(value, (list, tuple, range)) or (isinstance(value, np.ndarray) and value.ndim > 0):
            raise SnlabError(name, "got a list", "one value; use snlab.sweep for grids")
    devices = _check_devices(devices)
    g, hw, labels = _grid(m, s, plan, precision)
    row = _kernel_row(m, s, hw, g, labels, precision, devices, prices, pue)
    if row is None:
        row = _chain_row(m, s, hw, g, labels, devices, prices, pue)
    elif row.pop("_broken") >= 0:       # the chain itself names the broken rule
        row = _chain_row(m, s, hw, g, labels, devices, prices, pue)
    pl.check_read(m, plan)
    grid.check_finite(row, plan)
    return TrainResult.from_row(m, s, precision, {k: (v.item() if isinstance(v, np.ndarray) else v)
                                                  for k, v in g.items()}, labels, row, prices)


def _chain_row(m: Model, s: System, hw, g: dict, labels: dict, devices, prices, pue) -> dict:
    """One plan's output row, through the chain of the step's parts; a broken rule is an
    error naming its field."""
    plan_grid = plan_of(g)
    broken = int(np.ravel(pl.violations(m, plan_grid, devices))[0])
    if broken >= 0:
        raise _rule_error(pl.RULES[broken], m, {k: np.ravel(v)[:1] for k, v in g.items()})
    hw = _placed(s, hw, g, labels)
    with np.errstate(all="ignore"):
        out = step_columns(model_sizes(m), plan_grid, hw)
        if s.has_power:
            out.update(energy.training_columns(out, g, hw, prices, pue))
    out.update(_slice_columns(hw))
    return {k: (v.item() if isinstance(v, np.ndarray) else v) for k, v in out.items()}


#: the slice labels of a plan given none
_NO_SLICE = [None]
#: the chain of one plan as scalar kernels (:mod:`snlab.kernel`)
_KERNELS = kernel.Kernels()
#: plan fields that take any value without changing the chain's shape; a kernel is kept
#: per value of the others (the parallel degrees and choices)
_CONTINUOUS = frozenset(("global_batch", "seq_len", "capacity_factor", "expert_imbalance", "chunk_overhead_s",
                         "logit_bytes", "optimizer_bytes", *OVERLAP_FIELDS))


def _kernel_row(m: Model, s: System, hw, g: dict, labels: dict, precision: str, devices, prices,
                pue) -> dict | None:
    """One plan's output row (with ``_broken``, the rule it breaks or -1) from the
    chain's kernel for its structure, or None where there is none for it yet (a torus,
    whose slice depends on the plan, and a slice given, run the chain)."""
    if s.scale_up.topology.kind == "torus" or labels.get("slice", _NO_SLICE) != _NO_SLICE \
            or not all(type(v) is np.float64 for v in g.values()):
        return None
    key = (id(m), id(s), id(hw), prices, precision, devices, pue,
           *[v for k, v in g.items() if k not in _CONTINUOUS])
    return _KERNELS.run(key, lambda: plan_chain(m, s, hw, devices, prices, pue), g, (m, s, hw))


def plan_chain(m: Model, s: System, hw, devices=None, prices=None, pue=None):
    """The chain :func:`train` evaluates for one plan on a system that is no torus, as a
    function of the plan's columns: the output row with ``_broken`` (the rule the plan
    breaks, or -1). Its scalar kernel is what a repeated ``train`` runs."""
    sizes = model_sizes(m)

    def chain(columns: dict) -> dict:
        plan_grid = plan_of(columns)
        out = {"_broken": pl.violations(m, plan_grid, devices), **step_columns(sizes, plan_grid, hw)}
        if s.has_power:
            out.update(energy.training_columns(out, columns, hw, prices, pue))
        return out
    return chain


def _slice_columns(hw) -> dict:
    """Each row's slice along x, y and z on a torus (nothing for another level)."""
    if getattr(hw.topology, "kind", "switch") != "torus":
        return {}
    return {f"slice_{a}": np.where(np.asarray(getattr(hw, f"slice_{a}")) > 0, getattr(hw, f"slice_{a}"),
                                   float(hw.topology.axes[i].size) if i < len(hw.topology.axes) else 1.0)
            for i, a in enumerate("xyz")}


def _rule_error(rule: pl.Rule, model: Model, g: dict) -> SnlabError:
    if rule.field == "degrees":
        for name in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "global_batch"):
            value = float(g[name][0])
            if value < 1 or not value.is_integer():
                return SnlabError(name, f"got {value:g}", pl.ALLOWED[name].replace("a multiple", "a whole-number multiple"))
    x = grid.first_row(g)
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
    return SnlabError(rule.field, "broken rule: " + details.get(rule.field, rule.field), rule.message)


def reason_codes(broken: np.ndarray, out: dict) -> np.ndarray:
    """Index into :data:`REASONS` per row: 0 for a plan that fits, then the first broken
    rule, then device memory, then host or pool memory (arrays broadcast together)."""
    valid = broken < 0
    code = np.where(valid, 0, broken + 1).astype(np.int64)
    fits_dev = out["memory_total_bytes"] <= out["memory_usable_bytes"]
    code = np.where(valid & ~fits_dev, len(pl.RULES) + 1, code)
    return np.where(valid & fits_dev & ~np.asarray(out["fits"], dtype=bool), len(pl.RULES) + 2, code)


def _frame(model: Model, system: System, precision: str, g: dict, labels: dict, broken: np.ndarray,
           out: dict, hw_axes: dict | None = None):
    import pandas as pd
    hw_axes = hw_axes or {}
    n = broken.shape[0]
    zeros = np.zeros(n, dtype=np.int8)
    data = {"model": pd.Categorical.from_codes(zeros, [model.name]),
            "system": pd.Categorical.from_codes(zeros, [system.name]),
            "precision": pd.Categorical.from_codes(zeros, [precision])}
    for name in ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "interleave", "seq_len"):
        data[name] = g[name].astype(np.int64)
    data["recompute"] = pd.Categorical.from_codes(g["recompute"].astype(int), pl.RECOMPUTE_NAMES)
    data["sequence_parallel"] = g["sequence_parallel"] > 0
    data["offload"] = pd.Categorical.from_codes(g["offload"].astype(int), list(pl.OFFLOAD))
    data["fp8_activations"] = pd.Categorical.from_codes(g["fp8_activations"].astype(int), list(pl.FP8_ACTIVATIONS))
    data["overlap"] = pd.Categorical.from_codes(g["overlap"].astype(int), labels["overlap"]) \
        if len(set(labels["overlap"])) == len(labels["overlap"]) else g["overlap"].astype(int)
    for name in OVERLAP_FIELDS:
        data[name] = g[name]
    data["flash_attention"] = g["flash_attention"] > 0
    data["grad_bytes"] = g["grad_bytes"]
    data["optimizer_bytes"] = g["optimizer_bytes"]
    for name in ("first_stage_layers", "last_stage_layers"):
        data[name] = g[name].astype(np.int64)
    data["ep_dispatcher"] = pd.Categorical.from_codes(g["ep_dispatcher"].astype(int), list(pl.EP_DISPATCHERS))
    data["capacity_factor"] = g["capacity_factor"]
    data["expert_imbalance"] = g["expert_imbalance"]
    data["chunk_overhead_s"] = g["chunk_overhead_s"]
    if "slice_x" in out:            # a torus: each row's slice, as "4x4x8"
        x, y, z = (np.broadcast_to(out[f"slice_{a}"], (n,)) for a in "xyz")
        keys, codes = np.unique((x * 1e6 + y) * 1e6 + z, return_inverse=True)
        names = [f"{k // 1e12:g}x{k // 1e6 % 1e6:g}x{k % 1e6:g}" for k in keys]
        data["slice"] = pd.Categorical.from_codes(np.ravel(codes), names)
    else:
        data["slice"] = pd.Categorical.from_codes(zeros, [""])
    for name in hw_axes:
        data[name] = grid.full(hw_axes[name], n)
    valid = broken < 0
    for key, col in out.items():
        data[key] = grid.full(col, n)
    data["valid"] = valid
    data["reason"] = pd.Categorical.from_codes(np.broadcast_to(reason_codes(broken, out), (n,)), list(REASONS))
    # the error band of published training runs on this chip family: missing (pd.NA) where
    # no run checks it, as in rows that break a rule; band_runs says how many runs
    band = uncertainty.band("training", system.device.family)
    data["step_time_s_low"], data["step_time_s_high"] = uncertainty.columns(band, data["step_time_s"], "time")
    data["mfu_low"], data["mfu_high"] = uncertainty.columns(band, data["mfu"])
    data["band_runs"] = np.full(n, band.runs)
    # inside what the family's published runs cover (uncertainty.validated)
    data["validated"] = valid & uncertainty.validated(system.device.family, {
        **{k: np.broadcast_to(g[k], (n,)) for k in ("tp", "pp", "cp", "ep", "interleave", "dp", "zero")},
        "recompute": np.asarray(pl.RECOMPUTE_NAMES)[np.broadcast_to(g["recompute"], (n,)).astype(int)]}, precision)
    wall = np.stack([out["wall_compute_s"], out["wall_communication_s"], out["wall_memory_s"]])
    limited = np.argmax(np.broadcast_to(wall, (3, n)), axis=0)
    limited = np.where(data["fits"], limited, 2)
    data["limited_by"] = pd.Categorical.from_codes(np.where(valid, limited, -1), ["compute", "communication", "memory"])
    # columns a user can assign into (copy=False: what is already writable stays shared)
    return pd.DataFrame({k: grid.writable(v) for k, v in data.items()}, copy=False)


#: the pieces of sweep that snlab.explore runs chunk by chunk: the open grid of a chunk's
#: axes, the checks of precision and device count, the frame of evaluated rows
build_grid, build_frame, check_precision, check_devices = _grid, _frame, _check_precision, _check_devices
place_slices, slice_columns = _placed, _slice_columns


def sweep(model, system, *, precision="bf16", devices=None, cooling=None, pue=None, prices=None, **axes):
    """Evaluate the Cartesian product of the axes in one vectorised call.

    Any plan field (see :func:`train`) or system field (``scale_out_bandwidth``,
    ``scale_up_latency``, ``hbm_capacity``, ...; numbers in SI units or strings such
    as ``"400 Gb/s"``) may be a list or array. ``model``, ``system`` and
    ``precision`` may be lists too. Returns a pandas DataFrame, one row per
    configuration, units in column names; rows that break a rule or do not fit keep
    their plan, carry ``valid``/``fits`` False and the ``reason``. Systems with a power
    model add power, energy and (with ``prices``) cost columns: ``device_power_w``,
    ``it_power_w``, ``facility_power_w``, ``energy_per_token_j`` (facility),
    ``cost_per_million_tokens_usd``, ...; ``cooling``, ``pue`` and ``prices`` as in
    :func:`train`.
    """
    import pandas as pd
    specs = {"model": grid.axis_values("model", model), "system": grid.axis_values("system", system),
             "precision": grid.axis_values("precision", precision)}
    # the whole product counts: lists of models, systems and precisions multiply the grid
    grid.check_size({**specs, **{k: grid.axis_values(k, v) for k, v in axes.items()}})
    combinations = [(*_resolve(m_spec, s_spec), prec) for m_spec, s_spec, prec in itertools.product(*specs.values())]
    # a field no point of the sweep reads is refused, as by train
    grid.fails_everywhere(lambda m, s, prec: pl.check_read(m, axes), combinations)
    frames = []
    for m, s, prec in combinations:
        s, ratio, price = power_options(s, cooling, pue, prices, "sustained_clock" in axes)
        g, hw, labels, broken, out = evaluate(m, s, axes, prec, devices, price, ratio)
        frames.append(_frame(m, s, prec, g, labels, broken, out, hw))
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames, ignore_index=True)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, from the pairs (i, n / i) with i <= sqrt(n)."""
    small = np.arange(1, math.isqrt(n) + 1, dtype=np.int64)
    low = small[n % small == 0]
    return sorted(set(low.tolist()) | {n // int(i) for i in low})


def search_space(model: Model, devices: int, global_batch: int, **fixed):
    """Every plan for ``devices`` devices and ``global_batch`` sequences: parallel
    degrees, micro-batch, recomputation, ZeRO, sequence parallelism and interleaving.
    A keyword fixes an axis to the given value(s)."""
    divs = divisors(devices)
    tps = fixed.pop("tp", [x for x in divs if x <= 64 and model.heads % x == 0
                           and (model.kv_heads % x == 0 or x % model.kv_heads == 0)])
    # uneven stages are planned (the first and last stage may hold fewer layers), so any
    # degree up to the number of layers is a candidate, as Llama 3 405B ran 126 layers on 16
    pps = fixed.pop("pp", [x for x in divs if x <= model.layers])
    cps = fixed.pop("cp", [x for x in (1, 2, 4, 8) if model.seq_len % x == 0])
    experts = model.moe.experts if model.moe else 1
    def degree(name, x) -> int:
        return grid.whole_number(name, x, 1, MAX_DEGREE, pl.ALLOWED[name])

    fixed_ep = [degree("ep", e) for e in grid.axis_values("ep", fixed["ep"])] if "ep" in fixed else None
    rows = []
    for t, p, c in itertools.product(grid.axis_values("tp", tps), grid.axis_values("pp", pps),
                                     grid.axis_values("cp", cps)):
        t, p, c = degree("tp", t), degree("pp", p), degree("cp", c)
        if devices % (t * p * c):
            continue
        d = devices // (t * p * c)
        if global_batch % d:
            continue
        eps = [x for x in divisors(d * c) if experts % x == 0] if model.moe else [1]
        for e in fixed_ep if fixed_ep is not None else eps:
            rows.append((t, p, d, c, e))
    if not rows:
        raise SnlabError("devices", f"no tp x pp x dp x cp = {devices} fits the model", "another device count")
    base = np.asarray(rows, dtype=float)
    # a given axis that no plan can take is the caller's error: a micro-batch above the global
    # batch, or more virtual stages than two pipeline stages can hold (pp x interleave at most
    # the layers + 2, interleaving needing pp >= 2)
    most = {"micro_batch": (global_batch, f"at most the global batch, {global_batch:,}"),
            "interleave": ((model.layers + 2) // 2, f"at most {(model.layers + 2) // 2} for {model.layers} layers "
                                                    "(pp x interleave at most the layers + 2, with pp >= 2)")}
    for name, (top, words) in most.items():
        if name in fixed:
            for x in grid.axis_values(name, fixed[name]):
                grid.whole_number(name, x, 1, top, f"{pl.ALLOWED[name]}, {words}")
    options = {
        "micro_batch": fixed.pop("micro_batch", [1, 2, 4, 8, 16, 32, 64]),
        "interleave": fixed.pop("interleave", [1, 2, 3, 4, 6, 8]),
        "zero": fixed.pop("zero", [0, 1, 2, 3]),
        "recompute": fixed.pop("recompute", ["none", "selective", "full"]),
        "sequence_parallel": fixed.pop("sequence_parallel", [False, True]),
    }
    fixed.pop("ep", None)
    # a field no plan of the space reads is refused, as by train and sweep
    pl.check_read(model, {**fixed, **options, "ep": np.unique(base[:, 4]).tolist()})
    return base, options, fixed


#: the largest device count search takes (a thousand times the largest clusters of 2026),
#: and the most plans it lists
MAX_DEVICES, MAX_TOP = 100_000_000, 1_000_000


#: what search ranks plans by: the column and whether larger is better
OBJECTIVES = {"tokens_per_s": ("step_time_s", False), "tokens_per_joule": ("energy_per_token_j", False),
              "tokens_per_dollar": ("cost_per_million_tokens_usd", False)}


def power_budget_w(value) -> float | None:
    """A power budget [W] from a number of watts or a string such as ``"2 MW"``."""
    if value is None:
        return None
    from ..units import parse_quantity
    if isinstance(value, str):
        value = parse_quantity(value, "W", "power_budget")[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= 1e10:
        raise SnlabError("power_budget", f"got {value!r}", "a facility power from 1 W to 10 GW, e.g. 2e6 or '2 MW'")
    return float(value)


def search(model, system, *, devices: int, global_batch: int, precision: str = "bf16", top: int = 10,
           validated_only: bool = False, objective: str = "tokens_per_s", power_budget=None, cooling=None,
           pue=None, prices=None, **fixed):
    """The best plans that fit, over every parallelism, micro-batch, recomputation,
    ZeRO stage, sequence parallelism and interleaving choice.

    Returns a DataFrame of the ``top`` distinct plans, best first (empty if none fits):
    of plans whose step and memory are the same, only the one asking for less. Best by
    ``objective``: ``"tokens_per_s"`` (fastest), ``"tokens_per_joule"`` (least facility
    energy per token) or ``"tokens_per_dollar"`` (cheapest per token; needs ``prices``).
    ``power_budget`` [W, or a string such as ``"2 MW"``] keeps only plans whose facility
    power stays within it. Each row carries its error band (``step_time_s_low`` /
    ``_high``, ``mfu_low`` / ``_high``) and ``validated``: whether it lies inside what the
    family's published runs cover; ``validated_only=True`` keeps those alone. Keywords fix
    axes (``tp=8``, ``recompute="full"``, ``overlap="all"``); ``cooling``, ``pue`` and
    ``prices`` as in :func:`train`.
    """
    import pandas as pd
    if not isinstance(validated_only, (bool, np.bool_)):
        raise SnlabError("validated_only", f"got {validated_only!r}", "true or false")
    if objective not in OBJECTIVES:
        raise SnlabError("objective", f"got {objective!r}", ", ".join(OBJECTIVES))
    budget = power_budget_w(power_budget)
    m, s = _resolve(model, system)
    s, pue, prices = power_options(s, cooling, pue, prices, "sustained_clock" in fixed)
    if (objective != "tokens_per_s" or budget is not None) and not s.has_power:
        raise SnlabError("objective" if objective != "tokens_per_s" else "power_budget",
                         f"{s.name} has no power model", "tokens_per_s without a power budget")
    if objective == "tokens_per_dollar" and prices is None:
        raise SnlabError("prices", "missing for objective tokens_per_dollar",
                         "prices={'device_hour': ...} or {'capex': ..., 'kwh': ...}, or 'example'")
    devices, global_batch, top = (grid.whole_number(name, value, 1, top_value) for name, value, top_value in (
        ("devices", devices, MAX_DEVICES), ("global_batch", global_batch, MAX_GLOBAL_BATCH), ("top", top, MAX_TOP)))
    base, options, fixed = search_space(m, devices, global_batch, **fixed)
    wiring = s.scale_up.topology
    if wiring.kind == "torus" and wiring.reconfigurable and "slice" not in fixed:
        from .. import topology as topo
        options["slice"] = [topo.slice_text(d) for d in topo.slices_for(devices, wiring)]
    g_opts, hw, labels = _grid(m, s, {**fixed, **options, "global_batch": global_batch,
                                      "tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1}, precision)
    cols = grid.flatten(g_opts, grid.grid_shape(g_opts))
    n_opts = cols["tp"].shape[0]
    grid.check_size({"structural": base, "options": cols["tp"]})
    g = {k: np.tile(v, base.shape[0]) for k, v in cols.items()}
    for i, k in enumerate(("tp", "pp", "dp", "cp", "ep")):
        g[k] = np.repeat(base[:, i], n_opts)
    g["sequence_parallel"] = np.where(g["tp"] > 1, g["sequence_parallel"], 0.0)
    broken = pl.violations(m, plan_of(g), devices)
    keep = broken < 0
    g = {k: v[keep] for k, v in g.items()}
    hw = _placed(s, hw, g, labels)
    with np.errstate(all="ignore"):
        out = step_columns(model_sizes(m), plan_of(g), hw)
        if s.has_power:
            out.update(energy.training_columns(out, g, hw, prices, pue))
    out.update(_slice_columns(hw))
    grid.check_finite_rows(out, np.ones(g["tp"].shape, dtype=bool), g)
    frame = _frame(m, s, precision, g, labels, broken[keep], out)
    frame = frame[frame["fits"]]
    fitting, frame = len(frame), frame[frame["validated"]] if validated_only else frame
    validated, frame = len(frame), frame[frame["facility_power_w"] <= budget] if budget is not None else frame
    # best first; among plans equally good, the one asking for less (recomputation,
    # ZeRO stage, micro-batch, interleaving, tensor and pipeline degrees) comes first
    key = OBJECTIVES[objective][0]
    order = np.lexsort([frame[c].to_numpy() for c in ("pp", "tp", "interleave", "micro_batch", "zero")]
                       + [frame["recompute"].cat.codes.to_numpy(), frame[key].to_numpy()])
    frame = frame.iloc[order]
    # distinct plans only: a setting that changes neither the step nor the memory (selective
    # recomputation under FlashAttention, which keeps no scores to drop; a ZeRO stage with
    # one data-parallel rank, which has nothing to shard) leaves the plan that asks for less
    outcome = frame[["step_time_s", "memory_total_bytes"]].round({"step_time_s": 12, "memory_total_bytes": 0})
    same = pd.concat([frame[["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "sequence_parallel",
                             *(["slice"] if "slice" in frame else [])]], outcome], axis=1).duplicated()
    result = frame[~same.to_numpy()].head(int(top)).reset_index(drop=True)
    # plans evaluated, and those each filter left: fitting ones, then validated ones (of those)
    result.attrs.update(evaluated=int(keep.sum()), fitting=fitting, validated=validated)
    result.attrs["distinct"] = int((~same).sum())
    return result
