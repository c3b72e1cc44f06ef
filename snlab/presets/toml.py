"""Write a preset object back as TOML, every number with its unit and source.

The output loads back into an equal object: ``load(kind, path)`` of
``to_toml(obj)`` gives the same numbers, so a user can copy a preset, edit it, and
pass the file's path wherever a preset name is taken.
"""

from __future__ import annotations

import json

from .. import schema
from ..specs import Device, Model, Provenance, System
from . import loader

_SI_UNIT = {"bytes": "B", "bytes0": "B", "bytes/s": "B/s", "FLOP/s": "FLOP/s", "s": "s", "W": "W", "W0": "W",
            "J/byte": "J/B"}


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _num(name: str, si_value, dimension: str, prov: Provenance | None) -> str:
    if prov is None:
        unit = _SI_UNIT.get(dimension, "")
        prov = Provenance(si_value, unit, "defined in Python")
    parts = [f"value = {_value(prov.value)}"]
    if prov.unit:
        parts.append(f"unit = {_q(prov.unit)}")
    parts.append(f"source = {_q(prov.source)}")
    for key in ("where", "convention", "note"):
        if getattr(prov, key):
            parts.append(f"{key} = {_q(getattr(prov, key))}")
    return f"{name} = {{ {', '.join(parts)} }}"


def _value(x) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _device_top(dev: Device) -> list[str]:
    """Top-level device numbers (``dies``), written only when set."""
    if "dies" not in dev.provenance and dev.dies == 1:
        return []
    return [_num("dies", dev.dies, "count", dev.provenance.get("dies"))]


def _device_lines(dev: Device, prefix: str = "") -> list[str]:
    lines = [f"[{prefix}compute]"]
    for p in schema.PRECISIONS:
        if p in dev.peak_flops:
            lines.append(_num(p, dev.peak_flops[p], "FLOP/s", dev.provenance.get(f"compute.{p}")))
    for section in ("memory", "calibration", "power"):
        if section == "power" and not dev.tdp:
            continue   # no power model
        lines += ["", f"[{prefix}{section}]"]
        for field, dimension, required in schema.DEVICE[section]:
            if not required and f"{section}.{field}" not in dev.provenance and not getattr(dev, field):
                continue   # optional and unset (0): leave it to the loader's default
            lines.append(_num(field, getattr(dev, field), dimension,
                              dev.provenance.get(f"{section}.{field}")))
    return lines


def _inline(si_value, dimension: str, prov: Provenance | None) -> str:
    """One number as an inline table (for lists of per-axis values)."""
    return _num("x", si_value, dimension, prov)[len("x = "):]


def _topology_lines(top, part: str, prov) -> list[str]:
    """A level's ``[part.topology]`` table (nothing for a one-tier switch, the default)."""
    from ..specs import SWITCH
    key = f"{part}.topology"
    if top == SWITCH and not any(k.startswith(key + ".") for k in prov):
        return []
    lines = ["", f"[{key}]", f"kind = {_q(top.kind)}"]

    def one(name, value, dimension):
        lines.append(_num(name, value, dimension, prov.get(f"{key}.{name}")))

    def each(name, values, dimension, default=None):
        given = any(k == f"{key}.{name}" or k.startswith(f"{key}.{name}[") for k in prov)
        if not given and default is not None and all(v == default for v in values):
            return                                     # left to the loader's default
        if f"{key}.{name}" in prov or len(set(values)) == 1 and f"{key}.{name}[0]" not in prov:
            one(name, values[0], dimension)
        else:
            items = [_inline(v, dimension, prov.get(f"{key}.{name}[{i}]")) for i, v in enumerate(values)]
            lines.append(f"{name} = [{', '.join(items)}]")

    if top.kind == "switch":
        one("tiers", top.tiers, "count")
        if top.oversubscription != 1 or f"{key}.oversubscription" in prov:
            one("oversubscription", top.oversubscription, "factor")
        if top.tier_devices or f"{key}.tier_devices" in prov:
            one("tier_devices", top.tier_devices, "count0")
        return lines
    axes = top.axes
    if top.kind == "full-mesh":
        one("devices", axes[0].size, "count")
        each("links_per_peer", [axes[0].links], "count", 1)
        one("link_bandwidth", axes[0].link_bandwidth, "bytes/s")
        return lines
    lines.append("dims = [" + ", ".join(_inline(a.size, "count", prov.get(f"{key}.dims[{i}]"))
                                       for i, a in enumerate(axes)) + "]")
    if top.kind == "torus":
        if top.wrap_multiple:
            one("wrap_multiple", top.wrap_multiple, "count")
        else:
            lines.append("wrap = [" + ", ".join("true" if a.kind == "ring" else "false" for a in axes) + "]")
        each("links", [a.links for a in axes], "count", 1)
    else:
        lines.append("switched = [" + ", ".join("true" if a.kind == "switch" else "false" for a in axes) + "]")
        each("links_per_peer", [a.links for a in axes], "count", 1)
    each("link_bandwidth", [a.link_bandwidth for a in axes], "bytes/s")
    return lines


def _header(obj, extra: list[str]) -> list[str]:
    return [f"kind = {_q(obj.kind)}", f"name = {_q(obj.name)}",
            f"description = {_q(obj.description)}"] + extra


def to_toml(obj: Device | System | Model) -> str:
    """TOML text for a device, system or model preset."""
    if isinstance(obj, Device):
        lines = _header(obj, [f"vendor = {_q(obj.vendor)}", f"family = {_q(obj.family)}"] + _device_top(obj)
                        + [""]) + _device_lines(obj)
    elif isinstance(obj, System):
        shipped = obj.device.name in loader.names("device") and loader.shipped("device", obj.device.name) == obj.device
        lines = _header(obj, [f"device = {_q(obj.device.name)}"] if shipped else [])
        for field, dimension, _ in schema.SYSTEM[""]:
            value = getattr(obj, field)
            if value is not None:
                lines.append(_num(field, value, dimension, obj.provenance.get(field)))
        for part in ("scale_up", "scale_out", "host", "pool", "storage"):
            level = getattr(obj, part)
            if level is None:
                continue
            lines += ["", f"[{part}]", f"technology = {_q(level.technology)}"]
            for field, dimension, required in schema.SYSTEM[part]:
                if not required and f"{part}.{field}" not in obj.provenance and not getattr(level, field):
                    continue
                lines.append(_num(field, getattr(level, field), dimension,
                                  obj.provenance.get(f"{part}.{field}")))
            if part in ("scale_up", "scale_out"):
                lines += _topology_lines(level.topology, part, obj.provenance)
        if obj.power is not None:
            lines += ["", "[power]"]
            for field, dimension, required in schema.SYSTEM["power"]:
                if not required and f"power.{field}" not in obj.provenance and not getattr(obj.power, field):
                    continue
                lines.append(_num(field, getattr(obj.power, field), dimension, obj.provenance.get(f"power.{field}")))
            lines.append(f"rack_split = {str(obj.power.rack_split).lower()}")
        if obj.cooling:
            lines += ["", "[cooling]", f"kind = {_q(obj.cooling_kind)}"]
            for kind, cool in obj.cooling.items():
                lines += ["", f"[cooling.{kind}]"]
                for field, dimension, required in schema.SYSTEM["cooling"]:
                    if not required and not getattr(cool, field):
                        continue
                    lines.append(_num(field, getattr(cool, field), dimension,
                                      obj.provenance.get(f"cooling.{kind}.{field}")))
        if not shipped:
            lines += (["", "[device]", f"name = {_q(obj.device.name)}",
                       f"description = {_q(obj.device.description)}",
                       f"vendor = {_q(obj.device.vendor)}", f"family = {_q(obj.device.family)}"]
                      + _device_top(obj.device) + [""]
                      + _device_lines(obj.device, "device."))
    elif isinstance(obj, Model):
        lines = _header(obj, [f"norm = {_q(obj.norm)}"]
                        + [f"{f} = {str(getattr(obj, f)).lower()}" for f in schema.MODEL_FLAGS])
        defaults = {"kv_heads": obj.heads, "head_dim": obj.hidden_size // obj.heads, "mtp_modules": 0}
        for field, dimension, _ in schema.MODEL[""]:
            if field not in obj.provenance and defaults.get(field, None) == getattr(obj, field):
                continue  # derived default: leave it to the loader
            lines.append(_num(field, getattr(obj, field), dimension, obj.provenance.get(field)))
        for part in ("moe", "mla"):
            sub = getattr(obj, part)
            if sub is None:
                continue
            lines += ["", f"[{part}]"]
            for field, dimension, required in schema.MODEL[part]:
                if not required and f"{part}.{field}" not in obj.provenance:
                    continue  # an optional field left at its default
                lines.append(_num(field, getattr(sub, field), dimension,
                                  obj.provenance.get(f"{part}.{field}")))
    else:
        raise TypeError(f"not a preset: {obj!r}")
    return "\n".join(lines) + "\n"
