"""``snlab symbols``: the nomenclature, every symbol with its unit and meaning."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("symbols", help="the nomenclature: every symbol, its unit and meaning")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..symbols import NOMENCLATURE, table_markdown
    if args.markdown:
        print(table_markdown())
        return 0
    for e in NOMENCLATURE.values():
        print(f"{e.latex:>18}  {e.name:<24} [{e.unit}]  {e.meaning}")
    return 0
