"""A grid to explore, described in TOML (``snlab explore --spec grid.toml``)::

    kind = "train"                  # or "serve"
    model = "llama3-70b"
    system = ["dgx-h100", "gb200-nvl72"]
    objective = "tokens_per_s"      # optional; max:NAME or min:NAME to say which way
    pareto = ["tokens_per_s", "memory_headroom_bytes"]
    top = 10

    [axes]
    tp = [1, 2, 4, 8]
    global_batch = 1024
    scale_up_bandwidth = { from = "100 GB/s", to = "1.8 TB/s", steps = 8 }
    micro_batch = { from = 1, to = 8, steps = 4, scale = "log" }
    dp = { from = 8, to = 64, step = 8 }

An axis is a value, a list, or a range: ``from`` and ``to`` (numbers, or quantities in a
unit of the field's kind) with ``steps`` values (evenly spaced, or ``scale = "log"``) or
a ``step`` between them. Counts (degrees, batches, lengths) are rounded to whole numbers.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np

from ..errors import SnlabError
from ..units import parse_quantity
from . import kinds

TOP_KEYS = ("kind", "model", "system", "precision", "devices", "objective", "pareto", "top", "chunk_rows",
            "workers", "axes")
RANGE_KEYS = ("from", "to", "steps", "step", "scale")
#: the most values one range may hold
MAX_RANGE = 100_000_000
_UNIT_KIND = {"bytes0": "bytes", "fraction0": "1", "count": "count", "factor": "1"}


def read(path) -> dict:
    """The spec at ``path`` as keyword arguments of :func:`snlab.explore`."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SnlabError("spec", f"no file {str(path)!r}", "a TOML file describing the grid") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnlabError("spec", f"cannot read {str(path)!r} ({exc})", "a TOML file describing the grid") from None
    except tomllib.TOMLDecodeError as exc:
        raise SnlabError("spec", f"{str(path)!r} is not valid TOML ({exc})", "a TOML file describing the grid") \
            from None
    return parse(data)


def parse(data: dict) -> dict:
    for key in data:
        if key not in TOP_KEYS:
            raise SnlabError(key, "not a key of an exploration spec", ", ".join(TOP_KEYS))
    for key in ("model", "system"):
        if key not in data:
            raise SnlabError(key, "missing from the spec", "a preset name, a TOML path, or a list of them")
    kind_name = data.get("kind", "train")
    k = kinds.kind(kind_name)
    axes = data.get("axes", {})
    if not isinstance(axes, dict):
        raise SnlabError("axes", f"got {type(axes).__name__}", "a table of fields, e.g. [axes] tp = [1, 2, 4]")
    out = {key: data[key] for key in TOP_KEYS if key in data and key not in ("axes",)}
    for name, value in axes.items():
        if name not in k.fields:
            raise SnlabError(name, f"not a {'plan' if kind_name == 'train' else 'deployment'} or system field",
                             ", ".join(k.fields))
        out[name] = axis(name, value, k)
    return out


def _counting(name: str, k) -> bool:
    if k.dimension(name) == "count":
        return True
    from ..serving.planner import COUNTS
    from ..training.planner import NUMERIC
    if k.name == "train":
        return name in NUMERIC and name not in ("optimizer_bytes", "capacity_factor", "expert_imbalance",
                                                 "chunk_overhead_s")
    return name in COUNTS


def _endpoint(name: str, text, key: str, dimension) -> float:
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise SnlabError(name, f"{key} = {text!r}", "a number, or a quantity such as '100 GB/s'")
    if isinstance(text, str):
        if dimension is None:
            raise SnlabError(name, f"{key} = {text!r}", "a number (this field has no unit)")
        return parse_quantity(text, _UNIT_KIND.get(dimension, dimension), name)[0]
    if not math.isfinite(text):
        raise SnlabError(name, f"{key} = {text!r}", "a finite number")
    return float(text)


def axis(name: str, value, k):
    """One axis of the spec: a value, a list, or a range table."""
    if not isinstance(value, dict):
        if isinstance(value, list) and not value:
            raise SnlabError(name, "empty list", "at least one value")
        return value
    for key in value:
        if key not in RANGE_KEYS:
            raise SnlabError(name, f"{key!r} is not a key of a range", ", ".join(RANGE_KEYS))
    if "from" not in value or "to" not in value:
        raise SnlabError(name, "a range needs from and to", "{ from = ..., to = ..., steps = N } or step = ...")
    if ("steps" in value) == ("step" in value):
        raise SnlabError(name, "a range needs steps or step, not both or neither",
                         "steps = N values, or step = the increment")
    dimension = k.dimension(name)
    lo, hi = _endpoint(name, value["from"], "from", dimension), _endpoint(name, value["to"], "to", dimension)
    scale = value.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise SnlabError(name, f"scale = {scale!r}", "linear or log")
    if "steps" in value:
        steps = value["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_RANGE:
            raise SnlabError(name, f"steps = {steps!r}", f"a whole number of values from 1 to {MAX_RANGE:,}")
        if steps > 1 and lo == hi:
            raise SnlabError(name, f"empty range: from = to with {steps} steps",
                             "from and to that differ, or steps = 1")
        if hi < lo:   # as with step =: a range runs upwards
            raise SnlabError(name, f"from {value['from']!r} above to {value['to']!r}", "from <= to")
        if scale == "log":
            if lo <= 0 or hi <= 0:
                raise SnlabError(name, "a log range from or to <= 0", "from and to > 0")
            values = np.geomspace(lo, hi, steps)
        else:
            values = np.linspace(lo, hi, steps)
    else:
        step = _endpoint(name, value["step"], "step", dimension)
        if scale == "log":
            raise SnlabError(name, "scale = 'log' with step", "steps = N for a log range")
        if step <= 0 or hi < lo:
            raise SnlabError(name, f"empty range: from {value['from']!r} to {value['to']!r} by {value['step']!r}",
                             "from <= to and a step > 0")
        count = math.floor((hi - lo) / step * (1 + 1e-12)) + 1
        if count > MAX_RANGE:
            raise SnlabError(name, f"{count:,} values", f"at most {MAX_RANGE:,} values a range")
        values = lo + step * np.arange(count)
    if _counting(name, k):
        values = np.round(values)
        # a log range of counts can round two values onto one; keep each once, in order
        _, first = np.unique(values, return_index=True)
        values = values[np.sort(first)]
    return values
