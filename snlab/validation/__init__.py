"""Validation: published runs, what snlab predicts for them, and the error.

The runs live in TOML files beside this module (``training_runs.toml`` and
``topology_runs.toml``, ``memory_runs.toml``, ``serving_runs.toml``, ``power_runs.toml``,
``collective_runs.toml``), one ``[[run]]`` per published number with its source, inputs,
metric and tolerance. ``table()`` gathers them; serving under load has its own
(``queue_runs.toml``, :func:`queue_table`);
:func:`snlab.charts.parity` draws predicted against measured.
"""

from __future__ import annotations

from .collectives import collective_runs, collective_table
from .memory import memory_runs, memory_table
from .power import power_runs, power_table
from .queue import queue_runs, queue_table
from .runs import read_runs
from .serving import serving_runs, serving_table
from .training import training_runs, training_table

__all__ = ["table", "summary", "summary_markdown", "fits_markdown", "training_runs", "training_table",
           "collective_runs", "collective_table", "memory_runs", "memory_table", "serving_runs", "serving_table",
           "power_runs", "power_table", "queue_runs", "queue_table", "read_runs"]


def table():
    """Every shipped run, training, memory, serving, power and collective, with a ``kind`` column."""
    import pandas as pd

    parts = []
    for kind, frame in (("training", training_table()), ("memory", memory_table()), ("serving", serving_table()),
                        ("power", power_table()), ("collective", collective_table())):
        frame = frame.copy()
        frame.insert(0, "kind", kind)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def summary(frame=None):
    """Per kind of run and source: how many runs, the median and worst absolute error,
    the median signed error (positive: snlab predicts more than was measured), and how
    many are within their tolerance."""
    frame = table() if frame is None else frame
    g = frame.assign(abs_error=frame["error"].abs()).groupby(["kind", "source"], sort=False)
    return g.agg(runs=("id", "size"), median_abs_error=("abs_error", "median"),
                 median_error=("error", "median"), worst_abs_error=("abs_error", "max"),
                 within=("within", "sum")).reset_index()


def fits_markdown(frame=None) -> str:
    """Does it fit: the published plans that ran (training runs and recipes) and how many
    snlab reports as fitting, as one Markdown line."""
    from .training import recipe_table
    frame = recipe_table() if frame is None else frame
    tight = frame.loc[frame["headroom_bytes"].idxmin()]
    return (f"Does it fit: {int(frame['fits'].sum())} of {len(frame)} published training plans that ran "
            f"(the training runs above and {len(frame) - len(training_runs())} recipes of Megatron-Bridge, "
            f"the Llama 3 paper and DeepSeek-V3's report) are reported as fitting; the tightest, "
            f"{tight['id']}, with {tight['headroom_bytes'] / 1e9:.1f} GB to spare.")


def summary_markdown(frame=None) -> str:
    """The accuracy summary as the Markdown table the README shows."""
    rows = ["| kind | source | runs | median error | median bias | worst error | within tolerance |",
            "|---|---|---|---|---|---|---|"]
    for r in summary(frame).itertuples():
        rows.append(f"| {r.kind} | {r.source} | {r.runs} | {r.median_abs_error:.1%} | {r.median_error:+.1%} "
                    f"| {r.worst_abs_error:.1%} | {r.within}/{r.runs} |")
    return "\n".join(rows)
