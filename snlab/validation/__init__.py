"""Validation: published runs, what snlab predicts for them, and the error.

The runs live in TOML files beside this module (``training_runs.toml``,
``memory_runs.toml``, ``serving_runs.toml``), one ``[[run]]`` per published number
with its source, inputs, metric and tolerance. ``table()`` gathers all three;
``parity_chart()`` draws predicted against measured.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from ..presets import read_toml

HERE = Path(__file__).parent
_RUN_KEYS = {"id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance",
             "definition", "note", "precision"}


def read_runs(path: Path, required: tuple, optional: set, fallback: str) -> list[dict]:
    """The ``[[run]]`` rows of a runs file, checked: no unknown field, none missing, a
    relative tolerance in (0, 1). ``fallback`` names the shipped file the format is in."""
    runs = read_toml(path, str(path)).get("run", [])
    allowed = set(required) | set(optional)
    for i, run in enumerate(runs):
        where = f"{path.name}: run {run.get('id', i + 1)}"
        unknown = set(run) - allowed
        if unknown:
            raise SnlabError(f"{where}.{sorted(unknown)[0]}", "unknown field", ", ".join(sorted(allowed)))
        for key in required:
            if key not in run:
                raise SnlabError(f"{where}.{key}", "missing", f"see {fallback} for the format")
        if "tolerance" in run and not 0 < run["tolerance"] < 1:
            raise SnlabError(f"{where}.tolerance", f"got {run['tolerance']}", "a relative tolerance in (0, 1)")
    return runs


def training_runs(path: str | Path | None = None) -> list[dict]:
    """The published training runs (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "training_runs.toml"
    return read_runs(path, ("id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance"),
                     _RUN_KEYS, "training_runs.toml")


def training_table(path: str | Path | None = None):
    """Predicted against measured for every training run: a pandas DataFrame with the
    relative error and whether it is within the run's tolerance."""
    import pandas as pd

    from ..planner import train
    rows = []
    for run in training_runs(path):
        result = train(run["model"], run["system"], precision=run.get("precision", "bf16"), **run["plan"])
        predicted = result.to_dict()[run["metric"]]
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "metric": run["metric"], "measured": run["measured"],
                     "predicted": predicted, "error": error, "tolerance": run["tolerance"],
                     "within": abs(error) <= run["tolerance"], "definition": run.get("definition", ""),
                     "note": run.get("note", "")})
    return pd.DataFrame(rows)


_MEMORY_KEYS = {"id", "source", "where", "kind", "formula", "inputs", "vary", "scale", "measured", "tolerance",
                "definition", "note"}


def memory_runs(path: str | Path | None = None) -> list[dict]:
    """Published memory figures (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "memory_runs.toml"
    runs = read_runs(path, ("id", "source", "where", "kind", "formula", "inputs", "measured", "tolerance"),
                     _MEMORY_KEYS, "memory_runs.toml")
    for run in runs:
        if run["kind"] not in ("value", "saving"):
            raise SnlabError(f"{path.name}: run {run['id']}.kind", f"got {run['kind']!r}", "value, saving")
    return runs


def memory_table(path: str | Path | None = None):
    """Predicted against measured for every memory figure (a pandas DataFrame)."""
    import pandas as pd

    from ..formula import formulas
    registry = formulas()
    rows = []
    for run in memory_runs(path):
        f = registry[run["formula"]]
        base = float(f(**run["inputs"]))
        if run["kind"] == "saving":
            predicted = 1 - float(f(**{**run["inputs"], **run["vary"]})) / base
        else:
            predicted = base * run.get("scale", 1.0)
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": "",
                     "system": "", "metric": run["definition"], "measured": run["measured"],
                     "predicted": predicted, "error": error, "tolerance": run["tolerance"],
                     "within": abs(error) <= run["tolerance"], "definition": run["definition"],
                     "note": run.get("note", "")})
    return pd.DataFrame(rows)


def table():
    """Every shipped run, training, memory and serving, with a ``kind`` column."""
    import pandas as pd

    from .serving import serving_table
    parts = []
    for kind, frame in (("training", training_table()), ("memory", memory_table()), ("serving", serving_table())):
        frame = frame.copy()
        frame.insert(0, "kind", kind)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def summary(frame=None):
    """Per kind of run and source: how many runs, the median and worst absolute error,
    and how many are within their tolerance."""
    frame = table() if frame is None else frame
    g = frame.assign(abs_error=frame["error"].abs()).groupby(["kind", "source"], sort=False)
    return g.agg(runs=("id", "size"), median_abs_error=("abs_error", "median"),
                 worst_abs_error=("abs_error", "max"), within=("within", "sum")).reset_index()


def parity_chart(frame=None):
    """Predicted against measured, each run relative to its published value (1 = exact),
    with the run's tolerance band; colour by kind of run."""
    import altair as alt
    frame = table() if frame is None else frame
    data = frame.assign(ratio=frame["predicted"] / frame["measured"],
                        low=1 - frame["tolerance"], high=1 + frame["tolerance"])[
        ["kind", "id", "source", "metric", "measured", "predicted", "ratio", "low", "high", "error"]]
    y = alt.Y("id:N", sort=None, title="published run")
    band = alt.Chart(data).mark_rule(strokeWidth=6, opacity=0.25).encode(
        y=y, x=alt.X("low:Q", title="predicted / published [1]"), x2="high:Q")
    dots = alt.Chart(data).mark_point(filled=True, size=70).encode(
        y=y, x="ratio:Q", color=alt.Color("kind:N", title="kind of run"),
        tooltip=["id", "source", "metric", alt.Tooltip("measured:Q", format=".4g"),
                 alt.Tooltip("predicted:Q", format=".4g"), alt.Tooltip("error:Q", format="+.1%", title="error")])
    exact = alt.Chart(data).mark_rule(color="black").encode(x=alt.datum(1.0))
    return (band + dots + exact).properties(width=420, title="snlab against published runs (bars: tolerance)")


def summary_markdown(frame=None) -> str:
    """The accuracy summary as the Markdown table the README shows."""
    rows = ["| kind | source | runs | median error | worst error | within tolerance |",
            "|---|---|---|---|---|---|"]
    for r in summary(frame).itertuples():
        rows.append(f"| {r.kind} | {r.source} | {r.runs} | {r.median_abs_error:.1%} | {r.worst_abs_error:.1%} "
                    f"| {r.within}/{r.runs} |")
    return "\n".join(rows)
