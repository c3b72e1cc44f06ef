"""The training model against published training runs (``training_runs.toml``)."""

from __future__ import annotations

from pathlib import Path

from .runs import HERE, read_runs

_RUN_KEYS = {"id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance",
             "definition", "note", "precision"}


def training_runs(path: str | Path | None = None) -> list[dict]:
    """The published training runs (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "training_runs.toml"
    return read_runs(path, ("id", "source", "where", "model", "system", "plan", "metric", "measured", "tolerance"),
                     _RUN_KEYS, "training_runs.toml")


def training_table(path: str | Path | None = None):
    """Predicted against measured for every training run: a pandas DataFrame with the
    relative error and whether it is within the run's tolerance."""
    import pandas as pd

    from ..training import train
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
