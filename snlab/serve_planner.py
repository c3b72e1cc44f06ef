"""Serving planners: ``serve`` (one deployment), ``serve_sweep`` (a grid) and
``serve_best`` (the batch with the best throughput under a latency target).

All three build a grid of deployments and evaluate it with one call of
:func:`snlab.serving.serve_columns`; ``serve`` is a grid of one row. Names people type
(``weight_dtype="fp8"``, ``kv_offload="hbm"``) become numbers here, in one place; the
rules a deployment must obey are checked row by row, so that ``serve`` raises the
first broken one and ``serve_sweep`` flags each row with its reason instead.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .errors import SnlabError
from .presets import PresetLike
from .presets import model as load_model
from .presets import system as load_system
from .serve_result import ServeResult
from .serving import DTYPE_BYTES, KV_LOCATIONS, OUTPUT_DISTS, SYSTEM_FIELDS, serve_columns, serving_hardware
from .specs import Model, System
from .units import parse_quantity

#: deployment fields and their defaults (None: required, or derived). hbm_utilization 0.9 is
#: vLLM's default gpu_memory_utilization: the rest of HBM is left to activations, CUDA
#: graphs and the allocator. ep_overlap 0: the all-to-all is counted in full (see
#: snlab/validation/serving_runs.toml for what that does against published runs).
DEFAULTS = dict(tp=1, pp=1, dp=1, ep=1, batch=1, prompt_len=None, output_len=None, context=None,
                weight_dtype="bf16", kv_dtype="bf16", draft_tokens=0, acceptance=0.7, microbatches=1, ep_overlap=0.0,
                prefill_batch=1, hbm_utilization=0.9, pool_share=1.0, kv_offload="auto",
                output_dist="exponential")
NUMERIC = ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context", "draft_tokens", "acceptance",
           "microbatches", "ep_overlap", "prefill_batch", "hbm_utilization", "pool_share")
KV_OFFLOAD = {"hbm": 0, "auto": 1}
ALLOWED = dict(
    tp="a whole number >= 1 dividing the attention heads", pp="a whole number from 1 to the number of layers",
    dp="a whole number >= 1 (model replicas; data-parallel attention)",
    ep="a whole number dividing tp x dp that divides tp or is a multiple of it (1 for dense models)",
    batch="a multiple of dp (sequences in flight across the deployment)",
    prompt_len="a whole number of tokens >= 1", output_len="a whole number of tokens >= 1",
    context="a whole number of tokens >= 1 (KV length per sequence while decoding)",
    weight_dtype=", ".join(DTYPE_BYTES), kv_dtype=", ".join(DTYPE_BYTES),
    draft_tokens="a whole number >= 0", acceptance="a probability in [0, 1]",
    microbatches="1, or 2 for two-batch overlap",
    ep_overlap="a fraction in [0, 1] of the expert all-to-all hidden behind compute (needs microbatches = 2)",
    prefill_batch="a whole number of prompts >= 1",
    hbm_utilization="a fraction in (0, 1] (vLLM's gpu_memory_utilization)",
    pool_share="a fraction in [0, 1] of the free pool this deployment may use",
    kv_offload="auto (spill to pool, host, SSD) or hbm", output_dist=", ".join(OUTPUT_DISTS),
)

# Rules, in the order they are reported; violations() returns the first broken one per row.
RULES = (
    ("tp", "tensor-parallel degree tp must be a whole number >= 1 that divides the attention heads"),
    ("tp", "tensor-parallel degree tp must divide the key/value heads, or be a multiple of them"),
    ("pp", "pipeline degree pp must be a whole number from 1 to the number of layers"),
    ("dp", "data-parallel degree dp must be a whole number >= 1"),
    ("batch", "batch (sequences in flight) must be a whole multiple of dp"),
    ("ep", "expert-parallel degree ep must divide tp x dp and divide tp or be a multiple of it (1 for dense models)"),
    ("draft_tokens", "draft_tokens must be a whole number >= 0 and acceptance a probability in [0, 1]"),
    ("prompt_len", "prompt_len, output_len and context must be whole numbers of tokens >= 1"),
    ("microbatches", "microbatches must be 1 or 2 and prefill_batch a whole number >= 1"),
    ("hbm_utilization", "hbm_utilization must be in (0, 1], pool_share and ep_overlap in [0, 1]"),
    ("devices", "tp x pp x dp exceeds the system's devices"),
)
REASONS = ("ok",) + tuple(m for _, m in RULES) + ("weights do not fit in HBM",
                                                   "KV cache does not fit in any memory tier")


def _whole(x):
    return (x == np.round(x)) & (x >= 1)


def violations(model: Model, system: System, g: dict) -> np.ndarray:
    """Index into :data:`RULES` of the first rule each row breaks, or -1."""
    t, p, d, e = g["tp"], g["pp"], g["dp"], g["ep"]
    experts = model.moe.experts if model.moe else 0
    safe_t = np.maximum(np.round(t), 1)
    safe_e = np.maximum(np.round(e), 1)
    broken = [
        ~_whole(t) | (model.heads % safe_t != 0),
        (model.kv_heads % safe_t != 0) & (safe_t % model.kv_heads != 0),
        ~_whole(p) | (p > model.layers),
        ~_whole(d),
        ((g["batch"] % np.maximum(d, 1)) != 0) | (g["batch"] < d),
        ~_whole(e) | (((safe_t * d) % safe_e) != 0) | ((safe_e % safe_t != 0) & (safe_t % safe_e != 0))
        | ((experts == 0) & (e != 1)),
        (g["draft_tokens"] != np.round(g["draft_tokens"])) | (g["draft_tokens"] < 0)
        | (g["acceptance"] < 0) | (g["acceptance"] > 1),
        ~_whole(g["prompt_len"]) | ~_whole(g["output_len"]) | ~_whole(g["context"]),
        ((g["microbatches"] != 1) & (g["microbatches"] != 2)) | ~_whole(g["prefill_batch"]),
        (g["hbm_utilization"] <= 0) | (g["hbm_utilization"] > 1) | (g["pool_share"] < 0) | (g["pool_share"] > 1)
        | (g["ep_overlap"] < 0) | (g["ep_overlap"] > 1),
        (t * p * d > system.max_devices) if system.max_devices else np.zeros(np.shape(t), dtype=bool),
    ]
    first = np.full(np.broadcast(*broken).shape, -1, dtype=np.int16)
    for i in range(len(broken) - 1, -1, -1):
        first = np.where(broken[i], i, first)
    return first


# --- building the grid ---------------------------------------------------------------------

def _values(name: str, value) -> list:
    if isinstance(value, (list, tuple, range, np.ndarray)):
        values = list(np.asarray(value).tolist()) if isinstance(value, np.ndarray) else list(value)
        if not values:
            raise SnlabError(name, "empty list", "at least one value")
        return values
    return [value]


def _number(name: str, v) -> float:
    if isinstance(v, str) and name in SYSTEM_FIELDS:
        dim = next((u for key, u in (("bandwidth", "bytes/s"), ("latency", "s"), ("capacity", "bytes"),
                                     ("peak_flops", "FLOP/s")) if key in name), "1")
        v = parse_quantity(v, dim, name)[0]
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise SnlabError(name, f"got {v!r}", ALLOWED.get(name, "a finite number"))
    return float(v)


def _code(name: str, v, table) -> float:
    if v not in table:
        raise SnlabError(name, f"got {v!r}", ALLOWED[name])
    return float(table[v] if isinstance(table, dict) else table.index(v))


def grid(model: Model, system: System, axes: dict) -> tuple[dict, dict]:
    """The Cartesian product of the axes as flat arrays: (deployment grid, hardware)."""
    unknown = [k for k in axes if k not in DEFAULTS and k not in SYSTEM_FIELDS]
    if unknown:
        raise SnlabError(unknown[0], "not a deployment or system field",
                         ", ".join(list(DEFAULTS) + list(SYSTEM_FIELDS)))
    merged = {**DEFAULTS, **axes}
    for name in ("prompt_len", "output_len"):
        if merged[name] is None:
            raise SnlabError(name, "missing", ALLOWED[name])
    columns: dict[str, np.ndarray] = {}
    for name in DEFAULTS:
        values = _values(name, merged[name])
        if name == "context":
            columns[name] = np.asarray([np.nan if v is None else _number(name, v) for v in values])
        elif name in NUMERIC:
            columns[name] = np.asarray([_number(name, v) for v in values])
        elif name in ("weight_dtype", "kv_dtype"):
            columns[name] = np.asarray([_code(name, v, list(DTYPE_BYTES)) for v in values])
        elif name == "kv_offload":
            columns[name] = np.asarray([_code(name, v, KV_OFFLOAD) for v in values])
        elif name == "output_dist":
            columns[name] = np.asarray([_code(name, v, list(OUTPUT_DISTS)) for v in values])
    hw_axes = {}
    for name in SYSTEM_FIELDS:
        if name in axes:
            vals = np.asarray([_number(name, v) for v in _values(name, axes[name])])
            if np.any(vals < 0) or (np.any(vals <= 0) and "latency" not in name and "capacity" not in name):
                raise SnlabError(name, f"got {vals.tolist()}", "positive values (latencies and capacities may be 0)")
            if name == "dies" and np.any(vals != np.round(vals)):
                raise SnlabError(name, f"got {vals.tolist()}", "a whole number of dies >= 1")
            if name.endswith("efficiency") and np.any(vals > 1):
                raise SnlabError(name, f"got {vals.tolist()}", "a fraction in (0, 1]")
            hw_axes["hw:" + name] = vals
    arrays = {**columns, **hw_axes}
    shape = [len(a) for a in arrays.values()]
    size = int(np.prod(shape))
    flat = {}
    for i, (name, arr) in enumerate(arrays.items()):
        reps, tiles = int(np.prod(shape[i + 1:])), int(np.prod(shape[:i]))
        flat[name] = np.tile(np.repeat(arr, reps), tiles) if size > 1 else arr.copy()
    g = {n: a for n, a in flat.items() if not n.startswith("hw:")}
    dtypes = list(DTYPE_BYTES)
    g["weight_bytes"] = np.asarray([DTYPE_BYTES[dtypes[int(i)]] for i in g["weight_dtype"]])
    g["kv_bytes"] = np.asarray([DTYPE_BYTES[dtypes[int(i)]] for i in g["kv_dtype"]])
    given = ~np.isnan(g["context"])
    g["capacity_context"] = np.where(given, g["context"], g["prompt_len"] + g["output_len"])
    g["context"] = np.where(given, g["context"], g["prompt_len"] + np.floor(g["output_len"] / 2))
    hw = serving_hardware(system)
    hw.update({n[3:]: a for n, a in flat.items() if n.startswith("hw:")})
    if "pool_capacity" in axes and "pool_domain_capacity" not in axes:   # per device -> per domain
        hw["pool_domain_capacity"] = hw["pool_capacity"] * hw["scale_up_domain_size"]
    g["gemm_ratio"] = np.asarray([hw[f"ratio_{dtypes[int(i)]}"] for i in g["weight_dtype"]])
    return g, hw


def evaluate(model: Model, system: System, axes: dict):
    """Deployment grid, hardware, rule violations and output columns for ``axes``."""
    g, hw = grid(model, system, axes)
    broken = violations(model, system, g)
    ok = broken < 0
    if ok.all():
        with np.errstate(all="ignore"):
            return g, hw, broken, serve_columns(model, g, hw)
    sub_hw = {k: (v[ok] if np.ndim(v) else v) for k, v in hw.items()}
    with np.errstate(all="ignore"):
        sub = serve_columns(model, {k: v[ok] for k, v in g.items()}, sub_hw)
    out = {}
    for key, col in sub.items():
        col = np.broadcast_to(col, (int(ok.sum()),))
        full = np.zeros(ok.shape, dtype=bool) if col.dtype == bool else np.full(ok.shape, np.nan)
        full[ok] = col
        out[key] = full
    return g, hw, broken, out


def reason_codes(broken: np.ndarray, out: dict) -> np.ndarray:
    """Index into :data:`REASONS` per row."""
    code = np.where(broken < 0, 0, broken + 1).astype(np.int64)
    valid = broken < 0
    code = np.where(valid & ~out["fits_weights"].astype(bool), len(RULES) + 1, code)
    code = np.where(valid & out["fits_weights"].astype(bool) & ~out["fits"].astype(bool), len(RULES) + 2, code)
    return code


def _resolve(model: PresetLike, system: PresetLike) -> tuple[Model, System]:
    return load_model(model), load_system(system)


# --- public API ---------------------------------------------------------------------------

def serve(model: PresetLike, system: PresetLike, **deployment) -> ServeResult:
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
        output_dist (fixed, uniform, exponential); and system fields such as
        ``hbm_bandwidth`` to change the system for this run.
    """
    m, s = _resolve(model, system)
    for name, value in deployment.items():
        if isinstance(value, (list, tuple, np.ndarray, range)):
            raise SnlabError(name, "got a list", "one value; use snlab.serve_sweep for grids")
    g, hw, broken, out = evaluate(m, s, deployment)
    if broken[0] >= 0:
        field, message = RULES[int(broken[0])]
        raise SnlabError(field, _detail(field, m, s, g), message)
    row = {k: float(np.asarray(v).ravel()[0]) for k, v in out.items()}
    dep = {k: float(v[0]) for k, v in g.items()}
    return ServeResult.from_row(m, s, dep, row)


def _detail(field: str, m: Model, s: System, g: dict) -> str:
    x = {k: (int(v[0]) if float(v[0]).is_integer() else float(v[0])) for k, v in g.items()}
    return "broken rule: " + {
        "tp": f"tp={x['tp']} with {m.heads} heads and {m.kv_heads} key/value heads",
        "pp": f"pp={x['pp']} with {m.layers} layers",
        "dp": f"dp={x['dp']}",
        "batch": f"batch={x['batch']}, dp={x['dp']}",
        "ep": f"ep={x['ep']}, tp={x['tp']}, dp={x['dp']}, experts={m.moe.experts if m.moe else 0}",
        "draft_tokens": f"draft_tokens={x['draft_tokens']}, acceptance={x['acceptance']}",
        "prompt_len": f"prompt_len={x['prompt_len']}, output_len={x['output_len']}, context={x['context']}",
        "microbatches": f"microbatches={x['microbatches']}, prefill_batch={x['prefill_batch']}",
        "hbm_utilization": (f"hbm_utilization={x['hbm_utilization']}, pool_share={x['pool_share']}, "
                            f"ep_overlap={x['ep_overlap']}"),
        "devices": f"tp x pp x dp = {x['tp'] * x['pp'] * x['dp']} > {s.max_devices} on {s.name}",
    }[field]


def _frame(model: Model, system: System, g: dict, hw: dict, broken: np.ndarray, out: dict):
    import pandas as pd
    n = broken.shape[0]
    zeros = np.zeros(n, dtype=np.int8)
    data = {"model": pd.Categorical.from_codes(zeros, [model.name]),
            "system": pd.Categorical.from_codes(zeros, [system.name])}
    for name in ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context", "draft_tokens",
                 "microbatches", "prefill_batch"):
        data[name] = np.where(np.isfinite(g[name]), g[name], 0).astype(np.int64)
    data["acceptance"] = g["acceptance"]
    data["weight_dtype"] = pd.Categorical.from_codes(g["weight_dtype"].astype(int), list(DTYPE_BYTES))
    data["kv_dtype"] = pd.Categorical.from_codes(g["kv_dtype"].astype(int), list(DTYPE_BYTES))
    data["kv_offload"] = pd.Categorical.from_codes(g["kv_offload"].astype(int), list(KV_OFFLOAD))
    data["output_dist"] = pd.Categorical.from_codes(g["output_dist"].astype(int), list(OUTPUT_DISTS))
    for key, col in hw.items():       # swept system fields, as columns
        if np.ndim(col) and key in SYSTEM_FIELDS:
            data[key] = col
    for key, col in out.items():
        if key == "kv_location":
            codes = np.where(np.isfinite(col), col, -1).astype(int)
            data[key] = pd.Categorical.from_codes(codes, list(KV_LOCATIONS))
        else:
            data[key] = np.broadcast_to(col, (n,))
    data["valid"] = broken < 0
    data["reason"] = pd.Categorical.from_codes(reason_codes(broken, out), list(REASONS))
    walls = np.stack([np.broadcast_to(out[w], (n,)) for w in ("wall_compute_s", "wall_memory_s",
                                                               "wall_communication_s")])
    limited = np.argmax(np.nan_to_num(walls, nan=-1.0), axis=0)
    data["limited_by"] = pd.Categorical.from_codes(np.where(broken < 0, limited, -1),
                                                   ["compute", "memory", "communication"])
    return pd.DataFrame(data, copy=False)


def serve_sweep(model, system, **axes):
    """Evaluate the Cartesian product of the axes in one vectorised call.

    Any deployment field (see :func:`serve`) or system field (``hbm_bandwidth``,
    ``scale_up_latency``, ``pool_bandwidth``, ...; numbers in SI units or strings such as
    ``"900 GB/s"``) may be a list or array; ``model`` and ``system`` may be lists too.
    Returns a pandas DataFrame, one row per deployment, units in column names; rows that
    break a rule or do not fit keep their inputs, carry ``valid``/``fits`` False and the
    ``reason``.
    """
    import pandas as pd
    frames = []
    for m_spec, s_spec in itertools.product(_values("model", model), _values("system", system)):
        m, s = _resolve(m_spec, s_spec)
        g, hw, broken, out = evaluate(m, s, axes)
        frames.append(_frame(m, s, g, hw, broken, out))
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def serve_best(model, system, *, tpot_target: float, max_batch: int | None = None, **deployment) -> ServeResult:
    """The batch with the most decode tokens per second per device whose time per
    output token stays within ``tpot_target`` [s] and whose KV cache fits.

    Candidates are multiples of ``dp`` from ``dp`` up to ``max_batch`` (default: the
    largest batch that fits with every memory tier). Raises :class:`SnlabError` naming
    ``tpot_target`` when no batch meets it.
    """
    m, s = _resolve(model, system)
    if isinstance(tpot_target, str):
        tpot_target = parse_quantity(tpot_target, "s", "tpot_target")[0]
    if isinstance(tpot_target, bool) or not isinstance(tpot_target, (int, float)) or not tpot_target > 0:
        raise SnlabError("tpot_target", f"got {tpot_target!r}", "a time > 0, e.g. 0.05 or '50 ms'")
    deployment.pop("batch", None)
    first = serve(m, s, **deployment, batch=deployment.get("dp", 1))
    dp = first.deployment["dp"]
    top = max_batch if max_batch else max(first.limits["max_batch"], dp)
    per = np.unique(np.round(np.geomspace(1, max(top // dp, 1), 400)))
    batches = per * dp
    g, hw, broken, out = evaluate(m, s, {**deployment, "batch": batches})
    ok = (broken < 0) & out["fits"].astype(bool) & (out["tpot_s"] <= tpot_target)
    if not ok.any():
        fastest = np.nanmin(np.where(broken < 0, out["tpot_s"], np.nan))
        raise SnlabError("tpot_target", f"no batch meets {tpot_target * 1e3:.3g} ms; the fastest step gives "
                         f"{fastest * 1e3:.3g} ms per output token", f"a target above {fastest * 1e3:.3g} ms")
    best = int(np.nanargmax(np.where(ok, out["decode_tokens_per_s_per_device"], -np.inf)))
    return serve(m, s, **deployment, batch=int(batches[best]))
