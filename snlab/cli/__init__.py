"""The ``snlab`` command: one module per subcommand.

Every subcommand prints a readable table, or JSON with ``--json``. Bad input prints
one line naming the field and what it accepts, and exits with status 2; no traceback
(set ``SNLAB_DEBUG=1`` to see one).
"""

from __future__ import annotations

import os
import sys

from ..errors import SnlabError
from .common import Parser


def build_parser() -> Parser:
    from . import collective, compare, evidence, explore, formulas, presets, search, serve, symbols, train
    parser = Parser(prog="snlab", description="SuperNode Lab: the compute, memory and communication walls "
                                              "of large-model training and serving")
    sub = parser.add_subparsers(dest="command", required=True)
    # the subcommand modules, each with register(subparsers), in the order of --help
    for module in (presets, symbols, formulas, train, compare, search, explore, serve, collective, evidence):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the snlab command; Ctrl-C ends it with one line and status 130."""
    try:
        parser = build_parser()
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
        print("snlab: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line, with the way to see more
        if os.environ.get("SNLAB_DEBUG"):
            raise
        print(f"snlab: internal error: {type(exc).__name__}: {exc} "
              "(run with SNLAB_DEBUG=1 for details)", file=sys.stderr)
        return 1
