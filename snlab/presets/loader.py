"""Reading presets: TOML files into frozen, validated devices, systems and models.

A number is written ``"80 GB"`` (value and unit), as a bare number (counts and
fractions only), or as ``{ value = 80, unit = "GB", source = "...", where = "...",
convention = "...", note = "..." }``. A table's ``source``, ``where``, ``convention``
and ``note`` apply to the numbers in it that do not set their own. Every number must
have a source. Validation happens on load; errors name the field and the allowed range.
Only regular files of at most :data:`MAX_BYTES` are read, as UTF-8.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Union

from .. import schema
from ..errors import SnlabError, UnknownPresetError
from ..specs import (MLA, SWITCH, TOPOLOGY_KINDS, Axis, Cooling, Device, FrozenMap, HostLink, Level, MemoryPool,
                     Model, MoE, Provenance, Storage, System, SystemPower, Topology, validate)
from ..units import parse_quantity, to_si

DATA = Path(__file__).parent / "data"
KINDS = ("device", "system", "model")
#: the largest preset file read (the shipped ones are under 10 kB)
MAX_BYTES = 1_000_000
#: how deep systems may refer to device files that refer to ... (a loop is an error)
MAX_DEPTH = 4

PresetLike = Union[str, Path, Device, System, Model]


# --- reading numbers ------------------------------------------------------------------

def _number(raw: Any, dimension: str, field: str, defaults: dict) -> tuple[float, Provenance]:
    unit_dim = schema.unit_dimension(dimension)
    meta = {k: defaults.get(k, "") for k in schema.META}
    if isinstance(raw, dict):
        unknown = set(raw) - {"value", "unit", *schema.META}
        if unknown:
            raise SnlabError(field, f"unknown key {sorted(unknown)[0]!r}",
                             "value, unit, source, where, convention, note")
        if "value" not in raw:
            raise SnlabError(field, "inline table without 'value'", "{ value = ..., unit = ... }")
        meta.update({k: str(raw[k]) for k in schema.META if k in raw})
        value, unit = raw["value"], str(raw.get("unit", ""))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SnlabError(field, f"value {value!r} is not a number", "a finite number")
        si = to_si(value, unit, unit_dim, field)
    elif isinstance(raw, str):
        si, value, unit = parse_quantity(raw, unit_dim, field)
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if unit_dim not in ("1", "count") and not (raw == 0 and dimension in ("bytes0", "fraction0")):
            raise SnlabError(field, f"{raw!r} has no unit", f"a quantity with a unit of {dimension}, e.g. '80 GB'")
        si, value, unit = float(raw), raw, ""
    else:
        raise SnlabError(field, f"cannot read {raw!r}", f"a number with a unit of {dimension}")
    schema.check_range(si, dimension, field)
    if not meta["source"].strip():
        raise SnlabError(field, "has no source", "source = '<bibliography key or citation>' "
                         "on the number or its table")
    return si, Provenance(value, unit, meta["source"], meta["where"], meta["convention"], meta["note"])


def _section(doc: dict, section: str, spec, where: str, defaults: dict, prov: dict,
             strings: tuple = ()) -> dict[str, float]:
    table = doc if section == "" else doc.get(section, {})
    if not isinstance(table, dict):
        raise SnlabError(f"{where}.{section}", "must be a table", f"[{section}]")
    label = where if section == "" else f"{where}.{section}"
    local = dict(defaults)
    local.update({k: table[k] for k in schema.META if k in table and isinstance(table[k], str)})
    known = {name for name, _, _ in spec} | set(schema.META) | set(strings)
    unknown = [k for k in table if k not in known]
    if unknown:
        raise SnlabError(f"{label}.{unknown[0]}", "unknown field",
                         ", ".join(sorted(n for n, _, _ in spec) + sorted(strings)))
    out = {}
    for name, dimension, required in spec:
        if name not in table:
            if required:
                raise SnlabError(f"{label}.{name}", "missing", schema.describe(dimension))
            continue
        value, p = _number(table[name], dimension, f"{label}.{name}", local)
        out[name] = int(value) if dimension in ("count", "count0") else value
        prov[name if section == "" else f"{section}.{name}"] = p
    return out


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
    return {k: doc[k] for k in schema.META if isinstance(doc.get(k), str)}


def _build(doc: dict, where: str, base: Path | None = None, depth: int = 0):
    kind = doc.get("kind")
    if kind not in KINDS:
        raise SnlabError(f"{where}.kind", f"got {kind!r}", ", ".join(KINDS))
    return {"device": _device, "system": _system, "model": _model}[kind](doc, where, base, depth)


def _device(doc: dict, where: str, base=None, depth: int = 0) -> Device:
    prov: dict = {}
    top = _top_defaults(doc)
    head = _section(doc, "", schema.DEVICE[""], where, top, prov, schema.STRINGS["device"][""])
    compute = _section(doc, "compute", schema.DEVICE["compute"], where, top, prov)
    memory = _section(doc, "memory", schema.DEVICE["memory"], where, top, prov)
    cal = _section(doc, "calibration", schema.DEVICE["calibration"], where, top, prov)
    power = _section(doc, "power", schema.DEVICE["power"], where, top, prov) if "power" in doc else {}
    device = Device(
        name=_string(doc, "name", where), description=_string(doc, "description", where, False),
        vendor=_string(doc, "vendor", where, False), family=_string(doc, "family", where, False),
        peak_flops=FrozenMap({p: compute[p] for p in schema.PRECISIONS if p in compute}),
        hbm_capacity=memory["hbm_capacity"], hbm_bandwidth=memory["hbm_bandwidth"],
        gemm_efficiency=cal["gemm_efficiency"], memory_efficiency=cal["memory_efficiency"],
        sustained_clock=cal.get("sustained_clock", 1.0), dies=head.get("dies", 1),
        decode_attention_efficiency=cal.get("decode_attention_efficiency", 0.0),
        memory_reserve=cal["memory_reserve"], allocator_efficiency=cal["allocator_efficiency"],
        overlap_contention=cal["overlap_contention"], gemm_efficiency_fp8=cal.get("gemm_efficiency_fp8", 0.0),
        flash_attention_efficiency=cal.get("flash_attention_efficiency", 0.0),
        gemm_efficiency_fp4=cal.get("gemm_efficiency_fp4", 0.0), kernel_floor=cal.get("kernel_floor", 0.0),
        decode_attention_floor=cal.get("decode_attention_floor", 0.0), launch_overhead=cal.get("launch_overhead", 0.0),
        **{f: cal.get(f, 0.0) for f in ("gemm_half_elements", "gemm_half_elements_fp8", "gemm_half_elements_fp4")},
        **{f: power.get(f, 0.0) for f, _, _ in schema.DEVICE["power"]},
        provenance=MappingProxyType(prov))
    if power:
        validate(device)
    return device


def _system(doc: dict, where: str, base: Path | None = None, depth: int = 0) -> System:
    prov: dict = {}
    top = _top_defaults(doc)
    raw_device = doc.get("device")
    if isinstance(raw_device, dict):
        device = _device({"kind": "device", **raw_device}, f"{where}.device")
        doc = {k: v for k, v in doc.items() if k != "device"}
        doc["device"] = device.name
    elif isinstance(raw_device, str):
        ref = raw_device
        if base is not None and looks_like_path(ref) and not Path(ref).is_absolute():
            ref = str(base / ref)
        if depth >= MAX_DEPTH:
            raise SnlabError(f"{where}.device", f"{raw_device!r} leads back to a system file",
                             "a device preset name, a path to a device file, or a [device] table")
        device = _load("device", ref, depth + 1)
    elif raw_device is None:
        raise SnlabError(f"{where}.device", "missing", "a device preset name, a path, or a [device] table")
    else:
        raise SnlabError(f"{where}.device", f"got {raw_device!r}", "a device preset name, a path, or a [device] table")
    top_vals = _section(doc, "", schema.SYSTEM[""], where, top, prov, schema.STRINGS["system"][""])
    levels = {}
    for part in ("scale_up", "scale_out", "host", "pool", "storage"):
        if part not in doc:
            if part in schema.OPTIONAL_SECTIONS:
                continue
            raise SnlabError(f"{where}.{part}", "missing section", f"[{part}] with "
                             + ", ".join(n for n, _, _ in schema.SYSTEM[part]))
        table = doc[part]
        wired = part in ("scale_up", "scale_out") and isinstance(table, dict) and "topology" in table
        if wired:
            table = {k: v for k, v in table.items() if k != "topology"}
        vals = _section({**doc, part: table}, part, schema.SYSTEM[part], where, top, prov, ("technology",))
        vals["technology"] = _string(table, "technology", f"{where}.{part}", False)
        if wired:
            local = {**top, **{k: table[k] for k in schema.META if isinstance(table.get(k), str)}}
            vals["topology"] = _topology(doc[part]["topology"], f"{where}.{part}.topology", local, prov,
                                         f"{part}.topology")
        levels[part] = vals
    up = levels["scale_up"]
    power = None
    if "power" in doc:
        vals = _section(doc, "power", schema.SYSTEM["power"], where, top, prov, schema.STRINGS["system"]["power"])
        power = SystemPower(**vals, rack_split=_flag(doc["power"], "rack_split", f"{where}.power")
                            if "rack_split" in doc["power"] else True)
    kinds, kind = _cooling(doc, where, top, prov)
    system = System(
        name=_string(doc, "name", where), description=_string(doc, "description", where, False),
        device=device, devices_per_node=top_vals["devices_per_node"],
        max_devices=top_vals.get("max_devices"),
        scale_up=Level(**up),
        scale_out=Level(**levels["scale_out"]),
        host=HostLink(**levels["host"]),
        pool=MemoryPool(**levels["pool"]) if "pool" in levels else None,
        storage=Storage(**levels["storage"]) if "storage" in levels else None,
        power=power, cooling=FrozenMap(kinds), cooling_kind=kind,
        provenance=MappingProxyType(prov))
    validate(system)
    return system


def _cooling(doc: dict, where: str, top: dict, prov: dict) -> tuple[dict, str]:
    """The ``[cooling]`` table: ``kind`` (the cooling the system is built for) and one
    sub-table per kind of cooling it can run under (``[cooling.air]``, ``[cooling.liquid]``)."""
    table = doc.get("cooling")
    if table is None:
        return {}, ""
    label = f"{where}.cooling"
    if not isinstance(table, dict):
        raise SnlabError(label, "must be a table", "[cooling] with kind and [cooling.air] / [cooling.liquid]")
    local = dict(top)
    local.update({k: table[k] for k in schema.META if isinstance(table.get(k), str)})
    unknown = [k for k in table if k not in ("kind", *schema.COOLING_KINDS, *schema.META)]
    if unknown:
        raise SnlabError(f"{label}.{unknown[0]}", "unknown field", "kind, " + ", ".join(schema.COOLING_KINDS))
    kinds = {}
    for name in schema.COOLING_KINDS:
        if name in table:
            sub_prov: dict = {}
            vals = _section(table, name, schema.SYSTEM["cooling"], label, local, sub_prov)
            kinds[name] = Cooling(kind=name, **vals)
            prov.update({f"cooling.{k}": v for k, v in sub_prov.items()})
    kind = _string(table, "kind", label)
    if kind not in kinds:
        raise SnlabError(f"{label}.kind", f"got {kind!r}", ", ".join(kinds) or "a [cooling.<kind>] table first")
    return kinds, kind


_TOPOLOGY_KEYS = {
    "switch": {"kind", "tiers", "oversubscription", "tier_devices"},
    "full-mesh": {"kind", "devices", "links_per_peer", "link_bandwidth"},
    "torus": {"kind", "dims", "wrap", "wrap_multiple", "links", "link_bandwidth"},
    "nd-full-mesh": {"kind", "dims", "switched", "links_per_peer", "link_bandwidth"},
}


def _per_axis(raw, count: int, field: str):
    """A per-axis setting: one value for every axis, or a list of one per axis."""
    if isinstance(raw, list):
        if len(raw) != count:
            raise SnlabError(field, f"{len(raw)} values for {count} axes", f"one value, or a list of {count}")
        return raw
    return [raw] * count


def _topology(raw, where: str, defaults: dict, prov: dict, key: str) -> Topology:
    """A ``[scale_up.topology]`` table: kind and, by kind, switch tiers, mesh links or
    torus axes, each number with a source like every other preset number."""
    if not isinstance(raw, dict):
        raise SnlabError(where, "must be a table", "[scale_up.topology] with kind = " + ", ".join(TOPOLOGY_KINDS))
    local = {**defaults, **{k: raw[k] for k in schema.META if isinstance(raw.get(k), str)}}
    kind = raw.get("kind")
    if kind not in TOPOLOGY_KINDS:
        raise SnlabError(f"{where}.kind", f"got {kind!r}", ", ".join(TOPOLOGY_KINDS))
    known = _TOPOLOGY_KEYS[kind] | set(schema.META)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SnlabError(f"{where}.{unknown[0]}", f"unknown field for a {kind}",
                         ", ".join(sorted(_TOPOLOGY_KEYS[kind])))

    def number(name, dimension, value, label=None):
        label = label or name
        si, p = _number(value, dimension, f"{where}.{label}", local)
        prov[f"{key}.{label}"] = p
        return int(si) if dimension in ("count", "count0") else si

    def required(name):
        if name not in raw:
            raise SnlabError(f"{where}.{name}", "missing", f"see the {kind} fields: "
                             + ", ".join(sorted(_TOPOLOGY_KEYS[kind] - {"kind"})))
        return raw[name]

    if kind == "switch":
        return Topology(kind, tiers=number("tiers", "count", raw.get("tiers", 1)) if "tiers" in raw else 1,
                        oversubscription=number("oversubscription", "factor", raw["oversubscription"])
                        if "oversubscription" in raw else 1.0,
                        tier_devices=number("tier_devices", "count0", raw["tier_devices"]) if "tier_devices" in raw else 0)
    if kind == "full-mesh":
        size = number("devices", "count", required("devices"))
        links = number("links_per_peer", "count", raw["links_per_peer"]) if "links_per_peer" in raw else 1
        bw = number("link_bandwidth", "bytes/s", required("link_bandwidth"))
        return Topology(kind, axes=(Axis("mesh", size, bw, links),))
    dims = required("dims")
    if not isinstance(dims, list) or not dims:
        raise SnlabError(f"{where}.dims", f"got {dims!r}", "a list of 1 to 3 axis sizes, innermost first")
    sizes = [number("dims", "count", d, f"dims[{i}]") for i, d in enumerate(dims)]
    count = len(sizes)
    bws = [number("link_bandwidth", "bytes/s", v, f"link_bandwidth[{i}]" if isinstance(raw["link_bandwidth"], list)
                  else "link_bandwidth") for i, v in enumerate(_per_axis(required("link_bandwidth"), count,
                                                                         f"{where}.link_bandwidth"))]
    if kind == "torus":
        links = [number("links", "count", v, f"links[{i}]") for i, v in
                 enumerate(_per_axis(raw["links"], count, f"{where}.links"))] if "links" in raw else [1] * count
        if "wrap" in raw and "wrap_multiple" in raw:
            raise SnlabError(f"{where}.wrap", "given with wrap_multiple", "wrap (a fixed torus) or wrap_multiple "
                             "(slices cut by optical switches), not both")
        multiple = number("wrap_multiple", "count", raw["wrap_multiple"]) if "wrap_multiple" in raw else 0
        wraps = _per_axis(raw.get("wrap", True), count, f"{where}.wrap")
        for i, flag in enumerate(wraps):
            if not isinstance(flag, bool):
                raise SnlabError(f"{where}.wrap[{i}]", f"got {flag!r}", "true or false")
        axes = tuple(Axis("ring" if wrap else "line", size, bw, link)
                     for size, bw, link, wrap in zip(sizes, bws, links, wraps))
        return Topology(kind, axes=axes, wrap_multiple=multiple)
    links = [number("links_per_peer", "count", v, f"links_per_peer[{i}]") for i, v in
             enumerate(_per_axis(raw["links_per_peer"], count, f"{where}.links_per_peer"))] \
        if "links_per_peer" in raw else [1] * count
    switched = _per_axis(raw.get("switched", False), count, f"{where}.switched")
    for i, flag in enumerate(switched):
        if not isinstance(flag, bool):
            raise SnlabError(f"{where}.switched[{i}]", f"got {flag!r}", "true or false")
    return Topology(kind, axes=tuple(Axis("switch" if sw else "mesh", size, bw, 1 if sw else link)
                                     for size, bw, link, sw in zip(sizes, bws, links, switched)))


def _model(doc: dict, where: str, base=None, depth: int = 0) -> Model:
    prov: dict = {}
    top = _top_defaults(doc)
    vals = _section(doc, "", schema.MODEL[""], where, top, prov, schema.STRINGS["model"][""])
    norm = _string(doc, "norm", where, False, "rmsnorm")
    if norm not in ("layernorm", "rmsnorm"):
        raise SnlabError(f"{where}.norm", f"got {norm!r}", "layernorm, rmsnorm")
    parts = {}
    for part, cls in (("moe", MoE), ("mla", MLA)):
        if part in doc:
            parts[part] = cls(**_section(doc, part, schema.MODEL[part], where, top, prov))
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
        seq_len=vals["seq_len"], norm=norm, mtp_modules=vals.get("mtp_modules", 0),
        **{k: _flag(doc, k, where) for k in schema.MODEL_FLAGS},
        moe=parts.get("moe"), mla=parts.get("mla"), provenance=MappingProxyType(prov))
    validate(model)
    return model


# --- public API ---------------------------------------------------------------------------

def looks_like_path(text: str) -> bool:
    """Whether a preset argument is a file path rather than a shipped name."""
    return text.endswith(".toml") or "/" in text or "\\" in text


@lru_cache(maxsize=None)
def _names(kind: str) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (DATA / f"{kind}s").glob("*.toml")))


def names(kind: str) -> list[str]:
    """Shipped preset names of one kind, sorted."""
    _check_kind(kind)
    return list(_names(kind))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise SnlabError("kind", f"got {kind!r}", ", ".join(KINDS))


def read_toml(path: Path, label: str) -> dict:
    """Parse a TOML file: a regular file of at most :data:`MAX_BYTES`, in UTF-8. Every
    problem (a syntax error with its line and column, another encoding, a device file
    or a pipe, a file too large) is a :class:`SnlabError` naming the file."""
    allowed = "a readable UTF-8 .toml file, see 'snlab presets show NAME --toml'"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SnlabError(label, "is not a regular file", allowed)
            if info.st_size > MAX_BYTES:
                raise SnlabError(label, f"is {info.st_size:,} bytes, larger than a preset can be",
                                 f"a TOML file of at most {MAX_BYTES:,} bytes")
            raw = fh.read(MAX_BYTES + 1)
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SnlabError(label, f"malformed TOML: {_toml_problem(exc, raw)}", allowed) from None
    except RecursionError:
        raise SnlabError(label, "malformed TOML: tables or arrays nested too deeply to read", allowed) from None
    except UnicodeDecodeError as exc:
        raise SnlabError(label, f"not UTF-8 text (byte {exc.start})", allowed) from None
    except OSError as exc:
        raise SnlabError(label, f"cannot read file: {exc.strerror}", allowed) from None


def _toml_problem(exc: Exception, raw: bytes) -> str:
    """tomllib's message, with the key named where it only gives a position (a key
    defined twice: 'Cannot overwrite a value (at line 3, column 13)')."""
    text = str(exc)
    match = re.search(r"at line (\d+), column \d+", text)
    if match and "overwrite" in text.lower():
        lines = raw.decode("utf-8", "replace").splitlines()
        number = int(match.group(1))
        line = lines[number - 1] if 0 < number <= len(lines) else ""
        key = line.split("=", 1)[0].strip().strip("[]").strip()
        if key:
            return f"{key!r} is defined twice (line {number})"
    return text


@lru_cache(maxsize=None)
def shipped(kind: str, name: str):
    """The shipped preset ``name`` of ``kind``, read once and kept."""
    path = DATA / f"{kind}s" / f"{name}.toml"
    obj = _build(read_toml(path, name), name, path.parent)
    if obj.kind != kind or obj.name != name:
        raise SnlabError(f"{name}.name", f"file declares {obj.kind} {obj.name!r}", f"{kind} {name!r}")
    return obj


def load(kind: str, spec: PresetLike):
    """A preset object from an object, a shipped name, or a TOML path.

    Raises :class:`UnknownPresetError` listing the valid names for anything else.
    """
    return _load(kind, spec, 0)


def _load(kind: str, spec: PresetLike, depth: int):
    _check_kind(kind)
    cls = {"device": Device, "system": System, "model": Model}[kind]
    if isinstance(spec, cls):
        return spec
    if isinstance(spec, (Device, System, Model)):
        raise SnlabError(kind, f"got a {spec.kind} ({spec.name})", f"a {kind}")
    if not isinstance(spec, (str, Path)):
        raise SnlabError(kind, f"got {type(spec).__name__}", f"a {kind} name, a path to a .toml file, or a {cls.__name__}")
    text = str(spec)
    if not text.strip():
        raise SnlabError(kind, "empty name", f"a {kind} preset name ({', '.join(names(kind))}) or a path to a "
                         ".toml file")
    if isinstance(spec, str) and not looks_like_path(text):
        if text in _names(kind):
            return shipped(kind, text)
        if not Path(text).exists():
            raise UnknownPresetError(kind, text, names(kind))
    path = Path(text)
    if not path.exists():
        if looks_like_path(text):
            raise SnlabError(kind, f"no file {text!r}", f"a path to a readable .toml file, or a {kind} preset name "
                             f"({', '.join(names(kind))})")
        raise UnknownPresetError(kind, text, names(kind))
    obj = _build(read_toml(path, text), path.name, path.parent, depth)
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


