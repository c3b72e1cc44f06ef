"""The ``snlab`` command.

Every subcommand prints a readable table, or JSON with ``--json``. Bad input prints
one line naming the field and what it accepts, and exits with status 2; no traceback
(set ``SNLAB_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import import_module

from .errors import SnlabError


def _find_preset(name: str, kind: str | None):
    from . import presets
    kinds = [kind] if kind else list(presets.KINDS)
    if kind is None and presets._looks_like_path(name):
        doc = presets.read_toml(__import__("pathlib").Path(name), name)
        kinds = [doc.get("kind")] if doc.get("kind") in presets.KINDS else kinds
    for k in kinds:
        if name in presets.names(k) or presets._looks_like_path(name):
            return presets.load(k, name)
    valid = [n for k in kinds for n in presets.names(k)]
    raise SnlabError("name", f"unknown preset {name!r}", "one of " + ", ".join(valid))


def side_by_side(results, rows, min_width: int = 12) -> None:
    """Print ``(label, fn)`` rows with one column per result, headed by its system."""
    width = max(len(label) for label, _ in rows)
    cols = [max(len(r.system), min_width) for r in results]
    print(" " * (width + 2) + "  ".join(f"{r.system:>{w}}" for r, w in zip(results, cols)))
    for label, fn in rows:
        print(f"{label:<{width}}  " + "  ".join(f"{fn(r):>{w}}" for r, w in zip(results, cols)))


def _cmd_presets(args) -> int:
    from . import presets
    if args.action == "show":
        if not args.name:
            raise SnlabError("name", "missing", "snlab presets show NAME [--toml]")
        obj = _find_preset(args.name, args.kind)
        if args.toml:
            sys.stdout.write(presets.to_toml(obj))
        elif args.json:
            print(json.dumps(_preset_json(obj), indent=2))
        else:
            _print_preset(obj)
        return 0
    rows = [r for r in presets.catalog() if args.kind in (None, r["kind"])]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    current = None
    for r in rows:
        if r["kind"] != current:
            current = r["kind"]
            print(f"\n{current}s:" if current != rows[0]["kind"] else f"{current}s:")
        print(f"  {r['name']:<{width}}  {r['description']}")
    return 0


def _preset_json(obj) -> dict:
    out = {"kind": obj.kind, "name": obj.name, "description": obj.description, "fields": {}}
    for key, p in obj.provenance.items():
        out["fields"][key] = {"value": p.value, "unit": p.unit, "source": p.source,
                              "where": p.where, "convention": p.convention, "note": p.note}
    if obj.kind == "system":
        out["device"] = obj.device.name
    return out


def _print_preset(obj) -> None:
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


def _cmd_symbols(args) -> int:
    from .symbols import NOMENCLATURE, table_markdown
    if args.markdown:
        print(table_markdown())
        return 0
    for e in NOMENCLATURE.values():
        print(f"{e.latex:>18}  {e.name:<24} [{e.unit}]  {e.meaning}")
    return 0


def _cmd_formulas(args) -> int:
    from .formula import formulas
    for name, f in formulas().items():
        if args.latex:
            print(f"{name}: {f.latex()}")
        else:
            print(f"{name:<34} {f.lhs.name} [{f.unit}]  ({f.source})")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the problem."""

    def error(self, message: str):
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        prefix = f"{command}: " if command else ""
        print(f"snlab: error: {prefix}{message} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _cmd_evidence(args) -> int:
    from . import claims, validation
    if args.part in ("all", "accuracy"):
        print(validation.summary_markdown())
    if args.part == "all":
        print()
    if args.part in ("all", "claims"):
        print(claims.table_markdown())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("presets", help="list presets, or show one (as TOML to copy and edit)")
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    p.add_argument("name", nargs="?", help="preset name or path to a .toml file")
    p.add_argument("--kind", choices=["device", "system", "model"])
    p.add_argument("--toml", action="store_true", help="print as TOML (loads back unchanged)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("symbols", help="the nomenclature: every symbol, its unit and meaning")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=_cmd_symbols)

    p = sub.add_parser("formulas", help="every formula of the three walls")
    p.add_argument("--latex", action="store_true")
    p.set_defaults(func=_cmd_formulas)

    p = sub.add_parser("evidence", help="accuracy against published runs, and the article's claims (Markdown)")
    p.add_argument("part", nargs="?", choices=["all", "accuracy", "claims"], default="all")
    p.set_defaults(func=_cmd_evidence)

    for name in _COMMAND_MODULES:
        import_module(name).register(sub)
    return parser


#: modules with a ``register(subparsers)`` function that adds their subcommands
_COMMAND_MODULES = ("snlab.cli_train", "snlab.cli_serve")



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except SnlabError as exc:
        if os.environ.get("SNLAB_DEBUG"):
            raise
        print(f"snlab: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, with the way to see more
        if os.environ.get("SNLAB_DEBUG"):
            raise
        print(f"snlab: internal error: {type(exc).__name__}: {exc} "
              "(run with SNLAB_DEBUG=1 for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
