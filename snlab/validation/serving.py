"""The serving model against published serving runs it was not fitted to.

The runs live in ``serving_runs.toml`` beside this module, one ``[[run]]`` per published
number with its source, deployment, metric, tolerance and the reasons for the gap.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from ..uncertainty import offline_regime
from .runs import read_runs

HERE = Path(__file__).parent
_REQUIRED = ("id", "source", "where", "model", "system", "deployment", "metric", "measured", "gap")
_KEYS = set(_REQUIRED) | {"definition", "note", "title", "url", "outside"}
#: one tolerance per regime, the same for every row of it: a row outside it fails its test
#: (tests/test_serving_validation.py) unless it says, in ``outside``, why the model misses it
TOLERANCE = {"serving decode": 0.15, "serving prefill": 0.15}


def regime(run: dict) -> str:
    """The regime a run's metric measures: ``serving prefill`` for prefill rates and for
    offline runs whose prompts are at least
    :data:`~snlab.uncertainty.PREFILL_HEAVY` times their outputs, ``serving decode``
    otherwise."""
    if run["metric"].startswith("prefill"):
        return "serving prefill"
    dep = run["deployment"]
    if run["metric"].startswith("offline"):
        return offline_regime(dep["prompt_len"], dep["output_len"])
    return "serving decode"


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


def metric_value(data: dict, metric: str) -> float:
    """A result's number by name: a key of ``ServeResult.to_dict()``, or a dotted path
    into it (``offline.tokens_per_s``)."""
    value = data
    for part in metric.split("."):
        if not isinstance(value, dict) or part not in value:
            raise SnlabError("metric", f"{metric!r} is not a result field", "a key of ServeResult.to_dict(), or "
                             "a dotted path such as offline.tokens_per_s")
        value = value[part]
    return float(value)


def serving_table(path: str | Path | None = None):
    """Predicted against measured for every serving run: a pandas DataFrame with the
    relative error, whether it is within the run's tolerance, and the stated gap."""
    import pandas as pd

    from ..serving import serve
    rows = []
    for run in serving_runs(path):
        result = serve(run["model"], run["system"], **run["deployment"])
        predicted = metric_value(result.to_dict(), run["metric"])
        error = predicted / run["measured"] - 1
        tolerance = TOLERANCE[regime(run)]
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "regime": regime(run), "metric": run["metric"],
                     "measured": run["measured"], "predicted": predicted, "error": error, "tolerance": tolerance,
                     "within": abs(error) <= tolerance, "tpot_s": result.tpot_s,
                     "definition": run.get("definition", ""), "gap": run["gap"], "outside": run.get("outside", "")})
    return pd.DataFrame(rows)
