"""The memory wall and the training planner's memory against published memory figures
(``memory_runs.toml``).

Every row is held to one tolerance, :data:`TOLERANCE`, the memory regime's: the same for
a formula checked against a paper's table and for a planner's peak against a measured
one; a row the model misses says why in ``outside``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from .runs import HERE, read_runs

#: the relative error every memory row is held to
TOLERANCE = {"memory": 0.10}
_KINDS = ("value", "saving", "train")
_MEMORY_KEYS = {"id", "source", "where", "kind", "formula", "inputs", "vary", "scale", "measured", "definition",
                "note", "outside", "model", "system", "precision", "plan", "stage"}
_NEEDS = {"value": ("formula", "inputs"), "saving": ("formula", "inputs", "vary"),
          "train": ("model", "system", "plan", "stage")}
_STAGES = ("max", "first", "last")


def memory_runs(path: str | Path | None = None) -> list[dict]:
    """Published memory figures (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "memory_runs.toml"
    runs = read_runs(path, ("id", "source", "where", "kind", "measured"), _MEMORY_KEYS, "memory_runs.toml")
    for run in runs:
        where = f"{path.name}: run {run['id']}"
        if run["kind"] not in _KINDS:
            raise SnlabError(f"{where}.kind", f"got {run['kind']!r}", ", ".join(_KINDS))
        for key in _NEEDS[run["kind"]]:
            if key not in run:
                raise SnlabError(f"{where}.{key}", "missing", f"a {run['kind']} row needs " + ", ".join(_NEEDS[run["kind"]]))
        if run["kind"] == "train" and run["stage"] not in _STAGES:
            raise SnlabError(f"{where}.stage", f"got {run['stage']!r}", ", ".join(_STAGES))
    return runs


def predicted_peak(run: dict) -> float:
    """snlab's memory per device for a ``train`` row [bytes]: the planner's (the most
    loaded stage), or one stage's (:func:`snlab.training.stage_memory`)."""
    from ..training import stage_memory, train
    precision = run.get("precision", "bf16")
    if run["stage"] == "max":
        return float(train(run["model"], run["system"], precision=precision, **run["plan"])
                     .memory_bytes_per_device["total"])
    frame = stage_memory(run["model"], run["system"], precision=precision, **run["plan"])
    return float(frame["total_bytes"].iloc[0 if run["stage"] == "first" else -1])


def memory_table(path: str | Path | None = None):
    """Predicted against measured for every memory figure (a pandas DataFrame)."""
    import pandas as pd

    from ..walls import formulas
    registry = formulas()
    rows = []
    tolerance = TOLERANCE["memory"]
    for run in memory_runs(path):
        if run["kind"] == "train":
            predicted = predicted_peak(run)
        else:
            f = registry[run["formula"]]
            base = float(f(**run["inputs"]))
            if run["kind"] == "saving":
                predicted = 1 - float(f(**{**run["inputs"], **run["vary"]})) / base
            else:
                predicted = base * run.get("scale", 1.0)
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run.get("model", ""),
                     "system": run.get("system", ""), "regime": "memory", "metric": run["definition"],
                     "measured": run["measured"], "predicted": predicted, "error": error, "tolerance": tolerance,
                     "within": abs(error) <= tolerance, "definition": run["definition"],
                     "note": run.get("note", ""), "outside": run.get("outside", "")})
    return pd.DataFrame(rows)
