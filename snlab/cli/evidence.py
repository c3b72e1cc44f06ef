"""``snlab evidence``: the model against published runs, and the article's claims."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("evidence", help="accuracy against published runs, and the article's claims (Markdown)")
    p.add_argument("part", nargs="?", choices=["all", "accuracy", "claims"], default="all")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import claims, validation
    if args.part in ("all", "accuracy"):
        print(validation.summary_markdown())
        print()
        print(validation.fits_markdown())
    if args.part == "all":
        print()
    if args.part in ("all", "claims"):
        print(claims.table_markdown())
    return 0
