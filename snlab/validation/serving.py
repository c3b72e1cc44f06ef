"""The serving model against published serving runs it was not fitted to.

The runs live in ``serving_runs.toml`` beside this module, one ``[[run]]`` per published
number with its source, deployment, metric, tolerance and the reasons for the gap.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from .runs import read_runs

HERE = Path(__file__).parent
_REQUIRED = ("id", "source", "where", "model", "system", "deployment", "metric", "measured", "tolerance", "gap")
_KEYS = set(_REQUIRED) | {"definition", "note", "title", "url"}


def serving_runs(path: str | Path | None = None) -> list[dict]:
    """The published serving runs (default: the shipped file), validated."""
    from ..serving.deployment import DEFAULTS
    path = Path(path) if path else HERE / "serving_runs.toml"
    runs = read_runs(path, _REQUIRED, _KEYS, "serving_runs.toml")
    for run in runs:
        bad = set(run["deployment"]) - set(DEFAULTS)
        if bad:   # system fields would change a device constant for one row
            raise SnlabError(f"{path.name}: run {run['id']}.deployment.{sorted(bad)[0]}", "not a deployment field",
                             ", ".join(DEFAULTS))
    return runs


def serving_table(path: str | Path | None = None):
    """Predicted against measured for every serving run: a pandas DataFrame with the
    relative error, whether it is within the run's tolerance, and the stated gap."""
    import pandas as pd

    from ..serving import serve
    rows = []
    for run in serving_runs(path):
        result = serve(run["model"], run["system"], **run["deployment"])
        predicted = result.to_dict()[run["metric"]]
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "metric": run["metric"], "measured": run["measured"],
                     "predicted": predicted, "error": error, "tolerance": run["tolerance"],
                     "within": abs(error) <= run["tolerance"], "tpot_s": result.tpot_s,
                     "definition": run.get("definition", ""), "gap": run["gap"]})
    return pd.DataFrame(rows)
