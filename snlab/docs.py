"""The README's generated parts and the error bands, and the command that writes them.

    python -m snlab.docs            # rewrite the error bands and the README's generated blocks
    python -m snlab.docs --check    # exit 1 if either is out of date

A generated block sits between ``<!-- NAME -->`` and ``<!-- /NAME -->`` in the README;
:func:`blocks` computes each from the library (the nomenclature, the architecture, the
accuracy against published runs, the claims), so the README says what the code does.
The error bands (``snlab/presets/data/error_bands.toml``) come from the published runs
(:mod:`snlab.validation.bands`) and are written first: the claims read them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .files import interruptible, write_text


def blocks() -> dict[str, str]:
    """Each generated block's Markdown, by marker name."""
    from . import architecture, claims, validation
    from .symbols import table_markdown
    return {
        "nomenclature": table_markdown(),
        "architecture": architecture.layers_markdown() + "\n\n" + architecture.mermaid(),
        "evidence:accuracy": validation.summary_markdown() + "\n\n" + validation.fits_markdown(),
        "evidence:claims": claims.table_markdown(),
    }


def render(text: str, generated: dict[str, str]) -> str:
    """``text`` with every generated block replaced; a marker missing from the text is an error."""
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- {re.escape(name)} -->\n).*?(<!-- /{re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no block <!-- {name} --> ... <!-- /{name} -->")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def bands_path() -> Path:
    """Where the error bands live."""
    from .presets.loader import DATA
    return DATA / "error_bands.toml"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snlab.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default="README.md")
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    from . import uncertainty
    from .validation.bands import bands_toml
    bands_new = bands_toml()
    bands_old = bands_path().read_text(encoding="utf-8") if bands_path().exists() else ""
    if args.check and bands_new != bands_old:
        print("error bands are out of date: run python -m snlab.docs")
        return 1
    if bands_new != bands_old:
        write_text(bands_path(), bands_new)
        uncertainty.reload()
    path = Path(args.readme)
    old = path.read_text(encoding="utf-8")
    new = render(old, blocks())
    if args.check:
        print("README is up to date" if new == old else "README is out of date: run python -m snlab.docs")
        return 0 if new == old else 1
    write_text(path, new)
    return 0


main = interruptible(_main, "python -m snlab.docs")


if __name__ == "__main__":
    sys.exit(main())
