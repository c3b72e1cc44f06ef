"""The preset schema: which fields a device, system or model has, in which dimension,
and the range each may take.

Both the TOML loader (:mod:`snlab.presets`) and the frozen objects
(:mod:`snlab.specs`, when a field is changed with ``replace``) check values here, so a
value is held to the same range wherever it comes from. Ranges are physical: a
fraction lies in (0, 1], a count is a whole number that fits a computer's integers
(at most 10^9), a latency lies in [0, 1] s, and no capacity, bandwidth or peak is
larger than any hardware has (limits below).
"""

from __future__ import annotations

import math

from .errors import SnlabError

PRECISIONS = ("bf16", "fp16", "fp8", "int8", "fp4")
META = ("source", "where", "convention", "note")

#: largest value of each physical dimension a preset may hold: ten times beyond any
#: system of 2026 (a 384-device domain pools 49 TB; GB200 moves 8 TB/s of HBM and
#: 900 GB/s of NVLink per GPU; its FP4 peak is 10 PFLOP/s)
UPPER = {"bytes": 1e16, "bytes0": 1e16, "bytes/s": 1e15, "FLOP/s": 1e18, "s": 1.0, "count": 1e9, "count0": 1e9,
         "factor": 64.0, "W": 1e9, "W0": 1e9, "J/byte": 1e-9, "pue": 3.0}
#: smallest nonzero value of a physical dimension: a thousand times below anything an
#: accelerator system has (1 MB of memory, 1 MB/s of bandwidth, 1 GFLOP/s), so that no
#: product or quotient of them can overflow or vanish
LOWER = {"bytes": 1e6, "bytes0": 1e6, "bytes/s": 1e6, "FLOP/s": 1e9, "1": 1e-3, "fraction0": 1e-3, "W": 1.0,
         "W0": 1.0}

# (field, dimension, required) per section; dimension "1" is a fraction in [0.001, 1],
# "count" a whole number >= 1, "count0" a whole number >= 0, others physical units.
DEVICE = {
    "": [("dies", "count", False)],
    "compute": [(p, "FLOP/s", p == "bf16") for p in PRECISIONS],
    "memory": [("hbm_capacity", "bytes", True), ("hbm_bandwidth", "bytes/s", True)],
    "calibration": [("gemm_efficiency", "1", True), ("memory_efficiency", "1", True),
                    ("sustained_clock", "1", False), ("decode_attention_efficiency", "fraction0", False),
                    ("memory_reserve", "bytes0", True), ("allocator_efficiency", "1", True),
                    ("overlap_contention", "fraction0", True), ("gemm_efficiency_fp8", "fraction0", False),
                    ("gemm_efficiency_fp4", "fraction0", False), ("flash_attention_efficiency", "fraction0", False),
                    ("kernel_floor", "s", False), ("decode_attention_floor", "s", False), ("launch_overhead", "s", False),
                    ("gemm_half_elements", "count0", False), ("gemm_half_elements_fp8", "count0", False),
                    ("gemm_half_elements_fp4", "count0", False)],
    # a device's power: its limit, its idle draw with a model resident, and the energy of its
    # HBM traffic and of the bytes it sends over its scale-up links (all optional: a device
    # without them has no power model)
    "power": [("tdp", "W", True), ("idle_power", "W", True), ("hbm_energy", "J/byte", True),
              ("link_energy", "J/byte", False)],
}
LEVEL = [("bandwidth", "bytes/s", True), ("latency", "s", True), ("efficiency", "1", True),
         ("call_latency", "s", False), ("node_latency", "s", False), ("direct_call_latency", "s", False),
         ("ep_dispatch_efficiency", "fraction0", False),
         ("ep_combine_efficiency", "fraction0", False), ("ep_bulk_efficiency", "fraction0", False)]
SYSTEM = {
    "": [("devices_per_node", "count", True), ("max_devices", "count", False)],
    "scale_up": [("domain_size", "count", True)] + LEVEL,
    "scale_out": LEVEL,
    "host": [("bandwidth", "bytes/s", True), ("latency", "s", True), ("capacity", "bytes0", True),
             ("memory_bandwidth", "bytes/s", True)],
    "pool": [("capacity", "bytes0", True), ("bandwidth", "bytes/s", True), ("latency", "s", True)],
    "storage": [("bandwidth", "bytes/s", True), ("latency", "s", True), ("capacity", "bytes0", True)],
    # power beyond the devices: per node, per scale-up domain, per device; and the racks
    "power": [("host_power", "W0", True), ("switch_power", "W0", True), ("network_power", "W0", True),
              ("devices_per_rack", "count", True), ("network_racks", "count0", False)],
    # one kind of cooling ([cooling.air], [cooling.liquid]): the facility's PUE, the power a
    # rack may draw, and the sustained clock measured under it (optional: else derived)
    "cooling": [("pue", "pue", True), ("rack_power_limit", "W", True), ("sustained_clock", "1", False)],
}
OPTIONAL_SECTIONS = {"pool", "storage", "moe", "mla", "power", "cooling"}
#: the kinds of cooling a system preset may describe
COOLING_KINDS = ("air", "liquid")
MODEL = {
    "": [("layers", "count", True), ("hidden_size", "count", True), ("heads", "count", True),
         ("kv_heads", "count", False), ("head_dim", "count", False),
         ("ffn_hidden_size", "count", True), ("vocab_size", "count", True),
         ("seq_len", "count", True), ("mtp_modules", "count0", False)],
    "moe": [("experts", "count", True), ("experts_per_token", "count", True),
            ("expert_ffn_hidden_size", "count", True), ("shared_experts", "count0", False),
            ("dense_layers", "count0", False), ("load_imbalance", "factor", False),
            ("expert_groups", "count0", False), ("groups_per_token", "count0", False)],
    "mla": [("kv_lora_rank", "count", True), ("qk_nope_head_dim", "count", True),
            ("qk_rope_head_dim", "count", True), ("v_head_dim", "count", True),
            ("q_lora_rank", "count0", False)],
}
MODEL_FLAGS = ("gated_mlp", "biases", "tied_embeddings", "learned_positions", "dropout")
STRINGS = {"device": {"": ("name", "kind", "description", "vendor", "family", "compute", "memory", "calibration",
                           "power")},
           "system": {"": ("name", "kind", "description", "device", "scale_up", "scale_out", "host",
                           "pool", "storage", "power", "cooling"),
                      **{s: ("technology",) for s in ("scale_up", "scale_out", "host", "pool", "storage")},
                      "power": ("rack_split",), "cooling": ("kind",) + COOLING_KINDS},
           "model": {"": ("name", "kind", "description", "norm", "moe", "mla") + MODEL_FLAGS}}
TABLES = {"device": DEVICE, "system": SYSTEM, "model": MODEL}

_SI = {"bytes": "B", "bytes0": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "s": "s", "W": "W", "W0": "W",
       "J/byte": "J/B"}


def _quantity(x: float, dimension: str) -> str:
    """A bound in words: '1 MB', '10 PB/s', '1 GFLOP/s'."""
    from .units import fmt_quantity
    return fmt_quantity(x, dimension)


#: the unit table (:data:`snlab.units.UNITS`) a dimension's values are written in
UNIT_DIMENSION = {"count": "count", "count0": "count", "bytes0": "bytes", "fraction0": "1", "factor": "1",
                  "W0": "W", "pue": "1"}


def unit_dimension(dimension: str) -> str:
    """The dimension whose units a field of ``dimension`` is written in (``"W0"`` -> ``"W"``)."""
    return UNIT_DIMENSION.get(dimension, dimension)


def describe(dimension: str) -> str:
    """What a field of ``dimension`` accepts, in words."""
    top = UPPER.get(dimension, float("inf"))
    fixed = {"1": "a fraction from 0.001 to 1", "fraction0": "0 (not measured) or a fraction from 0.001 to 1",
             "factor": "a factor from 1 to 64", "pue": "a PUE from 1 to 3",
             "J/byte": "an energy per byte from 0 to 1 nJ/B, e.g. '60 pJ/B'",
             "W0": "0 (none) or a power from 1 W to 1 GW, e.g. '2.5 kW'",
             "s": "a time from 0 to 1 s, e.g. '2 us'"}
    if dimension in fixed:
        return fixed[dimension]
    if dimension in ("count", "count0"):
        return f"a whole number from {1 if dimension == 'count' else 0} to {top:,.0f}"
    if dimension == "bytes0":
        return f"0 (none) or a capacity from {_quantity(LOWER['bytes0'], 'bytes')} to {_quantity(top, 'bytes')}"
    if dimension in LOWER:
        return f"a quantity from {_quantity(LOWER[dimension], dimension)} to {_quantity(top, dimension)}"
    return f"a quantity > 0 and at most {_quantity(top, dimension)}"


def check_range(x, dimension: str, field: str) -> None:
    """Raise :class:`SnlabError` naming ``field`` unless ``x`` lies in the range of ``dimension``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise SnlabError(field, f"got {x!r}", describe(dimension))
    if not math.isfinite(x):
        raise SnlabError(field, f"got {x!r}", "a finite number: " + describe(dimension))
    top = UPPER.get(dimension, math.inf)
    if dimension == "1":
        ok = LOWER[dimension] <= x <= 1
    elif dimension in ("factor", "pue"):
        ok = 1 <= x <= top
    elif dimension == "J/byte":
        ok = 0 <= x <= top
    elif dimension == "W0":
        ok = x == 0 or LOWER[dimension] <= x <= top
    elif dimension == "fraction0":
        ok = x == 0 or LOWER[dimension] <= x <= 1
    elif dimension in ("count", "count0"):
        ok = x == int(x) and (1 if dimension == "count" else 0) <= x <= top
    elif dimension == "s":
        ok = 0 <= x <= top
    elif dimension == "bytes0":
        ok = x == 0 or LOWER[dimension] <= x <= top
    else:
        ok = LOWER.get(dimension, 0) <= x <= top and x > 0
    if not ok:
        raise SnlabError(field, f"got {x:g}", describe(dimension))


def check_values(values, dimension: str, field: str) -> None:
    """:func:`check_range` for every value of a numpy array, vectorised: the first value
    out of range raises."""
    import numpy as np
    x = np.asarray(values, dtype=float)
    top = UPPER.get(dimension, math.inf)
    low_ok = {"1": x >= LOWER["1"], "fraction0": (x == 0) | (x >= LOWER["fraction0"]), "s": x >= 0, "bytes0": (x == 0) | (x >= LOWER["bytes0"]),
              "count": x >= 1, "count0": x >= 0, "factor": x >= 1, "pue": x >= 1, "J/byte": x >= 0,
              "W0": (x == 0) | (x >= LOWER["W0"])}.get(dimension, (x > 0) & (x >= LOWER.get(dimension, 0)))
    high = 1.0 if dimension in ("1", "fraction0") else top
    ok = np.isfinite(x) & low_ok & (x <= high)
    if dimension in ("count", "count0"):
        ok &= x == np.round(x)
    if not ok.all():
        check_range(float(x[~ok].ravel()[0]), dimension, field)


def si_unit(key: str) -> str:
    """The SI unit symbol of a provenance key such as ``"scale_up.bandwidth"``."""
    section, _, field = key.rpartition(".")
    for table in TABLES.values():
        for name, dimension, _ in table.get(section, []):
            if name == field:
                return _SI.get(dimension, "")
    return ""
