"""``snlab formulas``: every formula of the walls, with its unit and source."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("formulas", help="every formula of the three walls")
    p.add_argument("--latex", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..walls import formulas
    for name, f in formulas().items():
        if args.latex:
            print(f"{name}: {f.latex()}")
        else:
            print(f"{name:<34} {f.lhs.name} [{f.unit}]  ({f.source})")
    return 0
