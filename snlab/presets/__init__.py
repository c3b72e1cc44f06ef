"""Presets: devices, systems and models as TOML data, loaded into frozen objects.

Shipped presets live in ``snlab/presets/data/{devices,systems,models}/NAME.toml``;
``sources.toml`` beside them is the bibliography their ``source`` keys refer to.
Anywhere a preset is taken, a preset object, a shipped name or a path to a TOML file
of the same format works (``snlab presets show NAME --toml`` prints one to start from).

A number is written ``"80 GB"`` (value and unit), as a bare number (counts and
fractions only), or as ``{ value = 80, unit = "GB", source = "...", where = "...",
convention = "...", note = "..." }``. A table's ``source``, ``where``, ``convention``
and ``note`` apply to the numbers in it that do not set their own. Every number must
have a source. Validation happens on load; errors name the field and the allowed range.
"""

from __future__ import annotations

import math
import tomllib
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Union

from ..errors import SnlabError, UnknownPresetError
from ..specs import (MLA, Device, HostLink, Level, MemoryPool, Model, MoE, Provenance,
                     Storage, System)
from ..units import parse_quantity, to_si

DATA = Path(__file__).parent / "data"
KINDS = ("device", "system", "model")
PRECISIONS = ("bf16", "fp16", "fp8", "int8", "fp4")
_META = ("source", "where", "convention", "note")

PresetLike = Union[str, Path, Device, System, Model]

# (field, dimension, required) per section; dimension "1" is a fraction in (0, 1],
# "count" a positive integer, "count0" an integer >= 0, others physical units.
_DEVICE = {
    "": [("dies", "count", False)],
    "compute": [(p, "FLOP/s", p == "bf16") for p in PRECISIONS],
    "memory": [("hbm_capacity", "bytes", True), ("hbm_bandwidth", "bytes/s", True)],
    "calibration": [("gemm_efficiency", "1", True), ("memory_efficiency", "1", True),
                    ("sustained_clock", "1", False), ("decode_attention_efficiency", "1", False)],
}
_LEVEL = [("bandwidth", "bytes/s", True), ("latency", "s", True), ("efficiency", "1", True),
          ("call_latency", "s", False), ("ep_dispatch_efficiency", "1", False),
          ("ep_combine_efficiency", "1", False), ("ep_bulk_efficiency", "1", False)]
_SYSTEM = {
    "": [("devices_per_node", "count", True), ("max_devices", "count", False)],
    "scale_up": [("domain_size", "count", True)] + _LEVEL,
    "scale_out": _LEVEL,
    "host": [("bandwidth", "bytes/s", True), ("latency", "s", True), ("capacity", "bytes", True)],
    "pool": [("capacity", "bytes", True), ("bandwidth", "bytes/s", True), ("latency", "s", True)],
    "storage": [("bandwidth", "bytes/s", True), ("latency", "s", True), ("capacity", "bytes", True)],
}
_OPTIONAL_SECTIONS = {"pool", "storage", "moe", "mla"}
_MODEL = {
    "": [("layers", "count", True), ("hidden_size", "count", True), ("heads", "count", True),
         ("kv_heads", "count", False), ("head_dim", "count", False),
         ("ffn_hidden_size", "count", True), ("vocab_size", "count", True),
         ("seq_len", "count", True)],
    "moe": [("experts", "count", True), ("experts_per_token", "count", True),
            ("expert_ffn_hidden_size", "count", True), ("shared_experts", "count0", False),
            ("dense_layers", "count0", False)],
    "mla": [("kv_lora_rank", "count", True), ("qk_nope_head_dim", "count", True),
            ("qk_rope_head_dim", "count", True), ("v_head_dim", "count", True),
            ("q_lora_rank", "count0", False)],
}
_MODEL_FLAGS = ("gated_mlp", "biases", "tied_embeddings", "learned_positions")
_STRINGS = {"device": {"": ("name", "kind", "description", "vendor", "compute", "memory", "calibration")},
            "system": {"": ("name", "kind", "description", "device", "scale_up", "scale_out", "host",
                            "pool", "storage"),
                       **{s: ("technology",) for s in ("scale_up", "scale_out", "host", "pool", "storage")}},
            "model": {"": ("name", "kind", "description", "norm", "moe", "mla") + _MODEL_FLAGS}}


# --- reading numbers ------------------------------------------------------------------

def _number(raw: Any, dimension: str, field: str, defaults: dict) -> tuple[float, Provenance]:
    unit_dim = {"count": "count", "count0": "count"}.get(dimension, dimension)
    meta = {k: defaults.get(k, "") for k in _META}
    if isinstance(raw, dict):
        unknown = set(raw) - {"value", "unit", *_META}
        if unknown:
            raise SnlabError(field, f"unknown key {sorted(unknown)[0]!r}",
                             "value, unit, source, where, convention, note")
        if "value" not in raw:
            raise SnlabError(field, "inline table without 'value'", "{ value = ..., unit = ... }")
        meta.update({k: str(raw[k]) for k in _META if k in raw})
        value, unit = raw["value"], str(raw.get("unit", ""))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SnlabError(field, f"value {value!r} is not a number", "a finite number")
        si = to_si(value, unit, unit_dim, field)
    elif isinstance(raw, str):
        si, value, unit = parse_quantity(raw, unit_dim, field)
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if unit_dim not in ("1", "count"):
            raise SnlabError(field, f"{raw!r} has no unit", f"a quantity with a unit of {dimension}, e.g. '80 GB'")
        si, value, unit = float(raw), raw, ""
    else:
        raise SnlabError(field, f"cannot read {raw!r}", f"a number with a unit of {dimension}")
    _check_range(si, dimension, field)
    if not meta["source"].strip():
        raise SnlabError(field, "has no source", "source = '<bibliography key or citation>' "
                         "on the number or its table")
    return si, Provenance(value, unit, meta["source"], meta["where"], meta["convention"], meta["note"])


def _check_range(x: float, dimension: str, field: str) -> None:
    if not math.isfinite(x):
        raise SnlabError(field, f"got {x!r}", "a finite number")
    if dimension == "1" and not 0 < x <= 1:
        raise SnlabError(field, f"got {x:g}", "a fraction in (0, 1]")
    elif dimension in ("count", "count0"):
        low = 1 if dimension == "count" else 0
        if x != int(x) or x < low:
            raise SnlabError(field, f"got {x:g}", f"a whole number >= {low}")
    elif dimension == "s" and x < 0:
        raise SnlabError(field, f"got {x:g} s", "a time >= 0")
    elif dimension not in ("1", "count", "count0", "s") and x <= 0:
        raise SnlabError(field, f"got {x:g}", f"a quantity > 0 in a unit of {dimension}")


def _section(doc: dict, section: str, spec, where: str, defaults: dict, prov: dict,
             strings: tuple = ()) -> dict[str, float]:
    table = doc if section == "" else doc.get(section, {})
    if not isinstance(table, dict):
        raise SnlabError(f"{where}.{section}", "must be a table", f"[{section}]")
    label = where if section == "" else f"{where}.{section}"
    local = dict(defaults)
    local.update({k: table[k] for k in _META if k in table and isinstance(table[k], str)})
    known = {name for name, _, _ in spec} | set(_META) | set(strings)
    unknown = [k for k in table if k not in known]
    if unknown:
        raise SnlabError(f"{label}.{unknown[0]}", "unknown field",
                         ", ".join(sorted(n for n, _, _ in spec) + sorted(strings)))
    out = {}
    for name, dimension, required in spec:
        if name not in table:
            if required:
                raise SnlabError(f"{label}.{name}", "missing", _describe(dimension))
            continue
        value, p = _number(table[name], dimension, f"{label}.{name}", local)
        out[name] = int(value) if dimension in ("count", "count0") else value
        prov[name if section == "" else f"{section}.{name}"] = p
    return out


def _describe(dimension: str) -> str:
    return {"1": "a fraction in (0, 1]", "count": "a whole number >= 1",
            "count0": "a whole number >= 0", "s": "a time >= 0, e.g. '2 us'"}.get(
        dimension, f"a quantity > 0 in a unit of {dimension}")


def _string(doc: dict, key: str, where: str, required: bool = True, default: str = "") -> str:
    value = doc.get(key, default)
    if required and key not in doc:
        raise SnlabError(f"{where}.{key}", "missing", "a string")
    if not isinstance(value, str):
        raise SnlabError(f"{where}.{key}", f"got {value!r}", "a string")
    return value


def _flag(doc: dict, key: str, where: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise SnlabError(f"{where}.{key}", f"got {value!r}", "true or false")
    return value


# --- building objects -------------------------------------------------------------------

def _top_defaults(doc: dict) -> dict:
    return {k: doc[k] for k in _META if isinstance(doc.get(k), str)}


def _build(doc: dict, where: str, base: Path | None = None):
    kind = doc.get("kind")
    if kind not in KINDS:
        raise SnlabError(f"{where}.kind", f"got {kind!r}", ", ".join(KINDS))
    return {"device": _device, "system": _system, "model": _model}[kind](doc, where, base)


def _device(doc: dict, where: str, base=None) -> Device:
    prov: dict = {}
    top = _top_defaults(doc)
    head = _section(doc, "", _DEVICE[""], where, top, prov, _STRINGS["device"][""])
    compute = _section(doc, "compute", _DEVICE["compute"], where, top, prov)
    memory = _section(doc, "memory", _DEVICE["memory"], where, top, prov)
    cal = _section(doc, "calibration", _DEVICE["calibration"], where, top, prov)
    return Device(
        name=_string(doc, "name", where), description=_string(doc, "description", where, False),
        vendor=_string(doc, "vendor", where, False),
        peak_flops=MappingProxyType({p: compute[p] for p in PRECISIONS if p in compute}),
        hbm_capacity=memory["hbm_capacity"], hbm_bandwidth=memory["hbm_bandwidth"],
        gemm_efficiency=cal["gemm_efficiency"], memory_efficiency=cal["memory_efficiency"],
        sustained_clock=cal.get("sustained_clock", 1.0), dies=head.get("dies", 1),
        decode_attention_efficiency=cal.get("decode_attention_efficiency", 0.0),
        provenance=MappingProxyType(prov))


def _system(doc: dict, where: str, base: Path | None = None) -> System:
    prov: dict = {}
    top = _top_defaults(doc)
    raw_device = doc.get("device")
    if isinstance(raw_device, dict):
        device = _device({"kind": "device", **raw_device}, f"{where}.device")
        doc = {k: v for k, v in doc.items() if k != "device"}
        doc["device"] = device.name
    elif isinstance(raw_device, str):
        ref = raw_device
        if base is not None and _looks_like_path(ref) and not Path(ref).is_absolute():
            ref = str(base / ref)
        device = load("device", ref)
    else:
        raise SnlabError(f"{where}.device", "missing", "a device preset name, a path, or a [device] table")
    top_vals = _section(doc, "", _SYSTEM[""], where, top, prov, _STRINGS["system"][""])
    levels = {}
    for part in ("scale_up", "scale_out", "host", "pool", "storage"):
        if part not in doc:
            if part in _OPTIONAL_SECTIONS:
                continue
            raise SnlabError(f"{where}.{part}", "missing section", f"[{part}] with "
                             + ", ".join(n for n, _, _ in _SYSTEM[part]))
        vals = _section(doc, part, _SYSTEM[part], where, top, prov, ("technology",))
        vals["technology"] = _string(doc[part], "technology", f"{where}.{part}", False)
        levels[part] = vals
    up = levels["scale_up"]
    system = System(
        name=_string(doc, "name", where), description=_string(doc, "description", where, False),
        device=device, devices_per_node=top_vals["devices_per_node"],
        max_devices=top_vals.get("max_devices"),
        scale_up=Level(**up),
        scale_out=Level(**levels["scale_out"]),
        host=HostLink(**levels["host"]),
        pool=MemoryPool(**levels["pool"]) if "pool" in levels else None,
        storage=Storage(**levels["storage"]) if "storage" in levels else None,
        provenance=MappingProxyType(prov))
    validate(system)
    return system


def _model(doc: dict, where: str, base=None) -> Model:
    prov: dict = {}
    top = _top_defaults(doc)
    vals = _section(doc, "", _MODEL[""], where, top, prov, _STRINGS["model"][""])
    norm = _string(doc, "norm", where, False, "rmsnorm")
    if norm not in ("layernorm", "rmsnorm"):
        raise SnlabError(f"{where}.norm", f"got {norm!r}", "layernorm, rmsnorm")
    parts = {}
    for part, cls in (("moe", MoE), ("mla", MLA)):
        if part in doc:
            parts[part] = cls(**_section(doc, part, _MODEL[part], where, top, prov))
    heads = vals["heads"]
    if "head_dim" not in vals and vals["hidden_size"] % heads:
        raise SnlabError(f"{where}.head_dim", "missing, and hidden_size is not a multiple of heads",
                         "a whole number; default hidden_size / heads")
    model = Model(
        name=_string(doc, "name", where), description=_string(doc, "description", where, False),
        layers=vals["layers"], hidden_size=vals["hidden_size"], heads=heads,
        kv_heads=vals.get("kv_heads", heads),
        head_dim=vals.get("head_dim", vals["hidden_size"] // heads),
        ffn_hidden_size=vals["ffn_hidden_size"], vocab_size=vals["vocab_size"],
        seq_len=vals["seq_len"], norm=norm,
        **{k: _flag(doc, k, where) for k in _MODEL_FLAGS},
        moe=parts.get("moe"), mla=parts.get("mla"), provenance=MappingProxyType(prov))
    validate(model)
    return model


_SI = {"bytes": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "s": "s"}


def si_unit(key: str) -> str:
    """The SI unit symbol of a provenance key such as ``"scale_up.bandwidth"``."""
    section, _, field = key.rpartition(".")
    for table in (_DEVICE, _SYSTEM, _MODEL):
        for name, dimension, _ in table.get(section, []):
            if name == field:
                return _SI.get(dimension, "")
    return ""


def validate(obj) -> None:
    """Check the relations between fields that single-field checks cannot see."""
    name = getattr(obj, "name", "?")
    if isinstance(obj, Model):
        for f in ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "ffn_hidden_size",
                  "vocab_size", "seq_len"):
            _check_range(getattr(obj, f), "count", f"{name}.{f}")
        if obj.heads % obj.kv_heads:
            raise SnlabError(f"{name}.kv_heads", f"{obj.kv_heads} does not divide heads = {obj.heads}",
                             f"a divisor of {obj.heads}")
        if obj.moe:
            if obj.moe.experts_per_token > obj.moe.experts:
                raise SnlabError(f"{name}.moe.experts_per_token", f"{obj.moe.experts_per_token} > experts",
                                 f"1 to {obj.moe.experts}")
            if obj.moe.dense_layers > obj.layers:
                raise SnlabError(f"{name}.moe.dense_layers", f"{obj.moe.dense_layers} > layers",
                                 f"0 to {obj.layers}")
    elif isinstance(obj, System):
        if obj.max_devices is not None and obj.max_devices < obj.scale_up.domain_size:
            raise SnlabError(f"{name}.max_devices", f"{obj.max_devices} < scale_up.domain_size",
                             f">= {obj.scale_up.domain_size}")
        for part in ("scale_up", "scale_out"):
            lvl = getattr(obj, part)
            _check_range(lvl.bandwidth, "bytes/s", f"{name}.{part}.bandwidth")
            _check_range(lvl.latency, "s", f"{name}.{part}.latency")
            _check_range(lvl.efficiency, "1", f"{name}.{part}.efficiency")
            _check_range(lvl.call_latency, "s", f"{name}.{part}.call_latency")
            for f in ("ep_dispatch_efficiency", "ep_combine_efficiency", "ep_bulk_efficiency"):
                if getattr(lvl, f):   # 0: not set, the level's efficiency applies
                    _check_range(getattr(lvl, f), "1", f"{name}.{part}.{f}")
    elif isinstance(obj, Device):
        _check_range(obj.hbm_capacity, "bytes", f"{name}.hbm_capacity")
        _check_range(obj.hbm_bandwidth, "bytes/s", f"{name}.hbm_bandwidth")
        for f in ("gemm_efficiency", "memory_efficiency", "sustained_clock"):
            _check_range(getattr(obj, f), "1", f"{name}.{f}")
        _check_range(obj.dies, "count", f"{name}.dies")
        if obj.decode_attention_efficiency:   # 0: not set, gemm_efficiency applies
            _check_range(obj.decode_attention_efficiency, "1", f"{name}.decode_attention_efficiency")


# --- public API ---------------------------------------------------------------------------

def _looks_like_path(text: str) -> bool:
    return text.endswith(".toml") or "/" in text or "\\" in text


def names(kind: str) -> list[str]:
    """Shipped preset names of one kind, sorted."""
    _check_kind(kind)
    return sorted(p.stem for p in (DATA / f"{kind}s").glob("*.toml"))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise SnlabError("kind", f"got {kind!r}", ", ".join(KINDS))


def read_toml(path: Path, label: str) -> dict:
    """Parse a TOML file; a syntax error names the file, line and column."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise SnlabError(label, f"malformed TOML: {exc}", "a TOML file, see 'snlab presets show NAME --toml'") from None
    except OSError as exc:
        raise SnlabError(label, f"cannot read file: {exc.strerror}", "a readable .toml file") from None


@lru_cache(maxsize=None)
def _shipped(kind: str, name: str):
    path = DATA / f"{kind}s" / f"{name}.toml"
    obj = _build(read_toml(path, name), name, path.parent)
    if obj.kind != kind or obj.name != name:
        raise SnlabError(f"{name}.name", f"file declares {obj.kind} {obj.name!r}", f"{kind} {name!r}")
    return obj


def load(kind: str, spec: PresetLike):
    """A preset object from an object, a shipped name, or a TOML path.

    Raises :class:`UnknownPresetError` listing the valid names for anything else.
    """
    _check_kind(kind)
    cls = {"device": Device, "system": System, "model": Model}[kind]
    if isinstance(spec, cls):
        return spec
    if isinstance(spec, (Device, System, Model)):
        raise SnlabError(kind, f"got a {spec.kind} ({spec.name})", f"a {kind}")
    if not isinstance(spec, (str, Path)):
        raise SnlabError(kind, f"got {type(spec).__name__}", f"a {kind} name, a path to a .toml file, or a {cls.__name__}")
    text = str(spec)
    if isinstance(spec, str) and not _looks_like_path(text):
        if text in names(kind):
            return _shipped(kind, text)
        if not Path(text).is_file():
            raise UnknownPresetError(kind, text, names(kind))
    path = Path(text)
    if not path.is_file():
        raise UnknownPresetError(kind, text, names(kind))
    obj = _build(read_toml(path, text), path.name, path.parent)
    if obj.kind != kind:
        raise SnlabError(f"{text}.kind", f"is a {obj.kind}", f"a {kind} file")
    return obj


def device(spec: PresetLike) -> Device:
    """A :class:`Device` from a name (``"h100-sxm-80gb"``), a TOML path, or an object."""
    return load("device", spec)


def system(spec: PresetLike) -> System:
    """A :class:`System` from a name (``"cloudmatrix384"``), a TOML path, or an object."""
    return load("system", spec)


def model(spec: PresetLike) -> Model:
    """A :class:`Model` from a name (``"llama3-70b"``), a TOML path, or an object."""
    return load("model", spec)


@lru_cache(maxsize=None)
def bibliography() -> dict[str, dict]:
    """The shipped sources, by key: title, url, authors, year."""
    return read_toml(DATA / "sources.toml", "sources.toml")


def catalog() -> list[dict]:
    """Every shipped preset: kind, name, description."""
    rows = []
    for kind in KINDS:
        for name in names(kind):
            obj = load(kind, name)
            rows.append({"kind": kind, "name": name, "description": obj.description})
    return rows


from .toml import to_toml  # noqa: E402  (the writer needs the tables above)

__all__ = ["device", "system", "model", "load", "names", "catalog", "bibliography",
           "to_toml", "validate"]
