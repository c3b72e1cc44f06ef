"""``snlab presets``: list presets, or show one with its sources (as TOML to copy)."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import presets
from ..errors import SnlabError
from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("presets", help="list presets, or show one (as TOML to copy and edit)")
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    p.add_argument("name", nargs="?", help="preset name or path to a .toml file")
    p.add_argument("--kind", choices=list(presets.KINDS))
    form = p.add_mutually_exclusive_group()
    form.add_argument("--toml", action="store_true", help="print as TOML (loads back unchanged)")
    form.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def find(name: str, kind: str | None):
    """A preset by name or path, of ``kind`` or of whichever kind has that name."""
    kinds = [kind] if kind else list(presets.KINDS)
    if kind is None and presets.looks_like_path(name):
        doc = presets.read_toml(Path(name), name)
        kinds = [doc.get("kind")] if doc.get("kind") in presets.KINDS else kinds
    for k in kinds:
        if name in presets.names(k) or presets.looks_like_path(name):
            return presets.load(k, name)
    valid = [n for k in kinds for n in presets.names(k)]
    raise SnlabError("name", f"unknown preset {name!r}", "one of " + ", ".join(valid))


def run(args) -> int:
    if args.action == "list" and args.name:
        raise SnlabError("name", f"got {args.name!r} with list, which lists every preset",
                         f"snlab presets show {args.name}, or snlab presets list [--kind KIND]")
    if args.action == "show":
        if not args.name:
            raise SnlabError("name", "missing", "snlab presets show NAME [--toml]")
        obj = find(args.name, args.kind)
        if args.toml:
            sys.stdout.write(presets.to_toml(obj))
        elif args.json:
            print_json(as_json(obj))
        else:
            show(obj)
        return 0
    rows = [r for r in presets.catalog() if args.kind in (None, r["kind"])]
    if args.json:
        print_json(rows)
        return 0
    width = max(len(r["name"]) for r in rows)
    current = None
    for r in rows:
        if r["kind"] != current:
            current = r["kind"]
            print(f"\n{current}s:" if current != rows[0]["kind"] else f"{current}s:")
        print(f"  {r['name']:<{width}}  {r['description']}")
    return 0


def as_json(obj) -> dict:
    """A preset as JSON: every field with its value as written, unit and source."""
    out = {"kind": obj.kind, "name": obj.name, "description": obj.description, "fields": {}}
    for key, p in obj.provenance.items():
        out["fields"][key] = {"value": p.value, "unit": p.unit, "source": p.source,
                              "where": p.where, "convention": p.convention, "note": p.note}
    if obj.kind == "system":
        out["device"] = obj.device.name
    return out


def show(obj) -> None:
    print(f"{obj.kind} {obj.name}: {obj.description}")
    if obj.kind == "system":
        print(f"  device: {obj.device.name}")
    if obj.kind == "model":
        print(f"  parameters: {obj.params / 1e9:.4g} B" +
              (f" ({obj.active_params / 1e9:.4g} B active)" if obj.moe else ""))
    rows = [(k, f"{p.value:g} {p.unit}".strip(), p.source + (f", {p.where}" if p.where else ""),
             p.convention) for k, p in obj.provenance.items()]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        line = f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}"
        print((line + (f"  [{r[3]}]" if r[3] else "")).rstrip())
