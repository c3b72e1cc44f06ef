"""What the subcommands share: a parser whose errors are one line, side-by-side tables,
and number parsing that names the flag it reads."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from ..errors import SnlabError
from ..units import parse_quantity


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the problem."""

    def error(self, message: str):
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        prefix = f"{command}: " if command else ""
        print(f"snlab: error: {prefix}{message} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def side_by_side(results, rows, min_width: int = 12) -> None:
    """Print ``(label, fn)`` rows with one column per result, headed by its system."""
    width = max(len(label) for label, _ in rows)
    cols = [max(len(r.system), min_width) for r in results]
    print(" " * (width + 2) + "  ".join(f"{r.system:>{w}}" for r, w in zip(results, cols)))
    for label, fn in rows:
        print(f"{label:<{width}}  " + "  ".join(f"{fn(r):>{w}}" for r, w in zip(results, cols)))


_SUFFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
#: the largest whole number a flag takes unless it says otherwise (it fits the planners'
#: 64-bit integers)
MAX_COUNT = 10**15
_COUNT = re.compile(r"\s*(\d+(?:\.\d*)?(?:[eE][+]?\d+)?)\s*([kKMG]?)\s*")


def names(field: str, text: str | None, allowed: str) -> list[str]:
    """Comma-separated names (systems to compare): none empty, none twice."""
    if not text:
        raise SnlabError(field, "missing", allowed)
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise SnlabError(field, f"got {text!r}, with an empty name", allowed)
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:
        raise SnlabError(field, f"got {twice[0]!r} twice", allowed + ", each once")
    return items


def count(field: str, text: str, low: int = 1, high: float = MAX_COUNT) -> int:
    """A whole number from text (``4096``, ``1e3``, ``128k``, ``1M``) from ``low`` to ``high``."""
    m = _COUNT.fullmatch(str(text))
    value = float(m.group(1)) * _SUFFIX[m.group(2)] if m else None
    if value is None or not math.isfinite(value) or value != int(value) or not low <= value <= high:
        examples = ", e.g. 4096, 1e3, 128k or 1M" if high >= 1e6 else ""
        raise SnlabError(field, f"got {text!r}", f"a whole number from {low:,} to {high:,.0f}{examples}")
    return int(value)


def number(field: str, text: str, low: float = -math.inf, high: float = math.inf, allowed: str = "a number") -> float:
    """A finite number from text, within [low, high]."""
    try:
        value = float(text)
    except ValueError:
        raise SnlabError(field, f"got {text!r}", allowed) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise SnlabError(field, f"got {text!r}", allowed)
    return value


def seconds(field: str, text: str, zero: bool = False) -> float:
    """A time from text: a bare number is seconds, or a quantity such as ``50ms``; more
    than 0 (or 0 itself where ``zero``)."""
    try:
        value = float(text)
    except ValueError:
        value = parse_quantity(text, "s", field)[0]
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise SnlabError(field, f"got {text!r}", "a time >= 0, e.g. 0.05 or 50ms" if zero else
                         "a time > 0, e.g. 0.05 or 50ms")
    return value


def target(field: str, text: str) -> float:
    """A latency target from text, as :func:`seconds` reads it: more than 0, at most an hour."""
    try:
        value = seconds(field, text)
    except SnlabError:
        value = math.inf
    if not value <= 3600:
        raise SnlabError(field, f"got {text!r}", "a time > 0 and at most an hour, e.g. 0.05 or 50ms")
    return value


def integer_flag(field: str, low: int = 1, high: float = MAX_COUNT):
    """An argparse type for a whole number from ``low`` to ``high`` whose errors name ``field``."""
    def parse(text: str) -> int:
        try:
            return count(field, text, low, high)
        except SnlabError as exc:
            raise argparse.ArgumentTypeError(exc.problem + f" (allowed: {exc.allowed})") from None
    parse.__name__ = field
    return parse


def print_json(data) -> None:
    """Strict JSON on stdout (a NaN or infinity is an error, never ``NaN``)."""
    print(json.dumps(data, indent=2, allow_nan=False))
