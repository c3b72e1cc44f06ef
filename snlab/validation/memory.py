"""The memory wall against published memory figures (``memory_runs.toml``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from .runs import HERE, read_runs

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

    from ..walls import formulas
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
