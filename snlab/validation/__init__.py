"""Validation: published runs, what snlab predicts for them, and the error.

The runs live in TOML files beside this module (``training_runs.toml``), one
``[[run]]`` per published number with its source, plan, metric and tolerance.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from ..presets import read_toml

HERE = Path(__file__).parent
_RUN_KEYS = {"id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance",
             "definition", "note", "precision"}


def training_runs(path: str | Path | None = None) -> list[dict]:
    """The published training runs (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "training_runs.toml"
    runs = read_toml(path, str(path)).get("run", [])
    for i, run in enumerate(runs):
        where = f"{path.name}: run {run.get('id', i + 1)}"
        unknown = set(run) - _RUN_KEYS
        if unknown:
            raise SnlabError(f"{where}.{sorted(unknown)[0]}", "unknown field", ", ".join(sorted(_RUN_KEYS)))
        for key in ("id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance"):
            if key not in run:
                raise SnlabError(f"{where}.{key}", "missing", "see training_runs.toml for the format")
        if not 0 < run["tolerance"] < 1:
            raise SnlabError(f"{where}.tolerance", f"got {run['tolerance']}", "a relative tolerance in (0, 1)")
    return runs


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
