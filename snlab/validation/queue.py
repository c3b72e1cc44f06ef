"""Serving under load against published latency-against-load and goodput runs.

The runs live in ``queue_runs.toml`` beside this module, one ``[[run]]`` per published
number: its source, the model and system presets, the deployment (colocated, or the
``prefill`` and ``decode`` plans of a disaggregated one), the workload as the authors
ran it, the scheduler, the metric (a dotted path into :meth:`LoadResult.to_dict`, such as
``ttft_s.mean``, or ``max_rate_rps``: the largest rate with ``attainment_level`` of the
requests within the row's targets), the measured value, and ``gap``: why prediction and
measurement differ. ``held_back`` rows were compared only once the model was done.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from .runs import read_runs
from .serving import metric_value

HERE = Path(__file__).parent
_REQUIRED = ("id", "source", "where", "model", "system", "deployment", "workload", "metric", "measured", "gap",
             "held_back")
_KEYS = set(_REQUIRED) | {"definition", "note", "title", "url", "outside", "policy", "prefill", "decode",
                          "prefill_instances", "decode_instances", "targets", "attainment_level", "kv_link_level"}
#: one tolerance per regime, set before the held-back rows were compared: latency under
#: load compounds the step model's error (15% on decode and on prefill) through the queue
TOLERANCE = {"queue ttft": 0.25, "queue tpot": 0.20, "queue goodput": 0.20}


def regime(run: dict) -> str:
    """``queue ttft`` for times to first token, ``queue goodput`` for rates within
    targets, ``queue tpot`` for times per output token and inter-token latencies."""
    metric = run["metric"]
    if metric.startswith("ttft"):
        return "queue ttft"
    if metric.startswith(("max_rate", "goodput")):
        return "queue goodput"
    return "queue tpot"


def queue_runs(path: str | Path | None = None) -> list[dict]:
    """The published runs under load (default: the shipped file), validated."""
    from ..serving.deployment import DEFAULTS
    from ..serving.load import WORKLOAD_FIELDS
    path = Path(path) if path else HERE / "queue_runs.toml"
    runs = read_runs(path, _REQUIRED, _KEYS, "queue_runs.toml")
    for run in runs:
        where = f"{path.name}: run {run['id']}"
        for part in ("deployment", "prefill", "decode"):
            bad = set(run.get(part, {})) - set(DEFAULTS)
            if bad:
                raise SnlabError(f"{where}.{part}.{sorted(bad)[0]}", "not a deployment field", ", ".join(DEFAULTS))
        bad = set(run["workload"]) - set(WORKLOAD_FIELDS)
        if bad:
            raise SnlabError(f"{where}.workload.{sorted(bad)[0]}", "not a workload field", ", ".join(WORKLOAD_FIELDS))
    return runs


def _kwargs(run: dict) -> dict:
    kw = {**run["deployment"], **run["workload"], **run.get("targets", {})}
    if "prefill" in run or "decode" in run:
        kw.update(prefill=run.get("prefill", {}), decode=run.get("decode", {}),
                  prefill_instances=run.get("prefill_instances", 1), decode_instances=run.get("decode_instances", 1),
                  kv_link_level=run.get("kv_link_level", "auto"))
    else:
        kw["policy"] = run.get("policy", "chunked")
    return kw


def predict(run: dict) -> float:
    """The model's value of a run's metric."""
    from ..serving.load import serve_load
    kw = _kwargs(run)
    if run["metric"] == "max_rate_rps":
        from ..serving.capacity import max_rate
        level = run.get("attainment_level", 0.9)
        start = kw.pop("rate")

        def attained(rate):
            return serve_load(run["model"], run["system"], rate=rate, attainment_level=level, **kw).attainment

        return max_rate(attained, start, level, steps=8)
    result = serve_load(run["model"], run["system"], **kw)
    return metric_value(result.to_dict(), run["metric"])


def queue_table(path: str | Path | None = None, held_back: bool | None = None):
    """Predicted against measured for every run under load (``held_back``: only those
    rows, or only the others): a pandas DataFrame with the relative error, whether it is
    within its regime's tolerance, and the stated gap."""
    import pandas as pd
    rows = []
    for run in queue_runs(path):
        if held_back is not None and run["held_back"] != held_back:
            continue
        predicted = predict(run)
        error = predicted / run["measured"] - 1
        tolerance = TOLERANCE[regime(run)]
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "mode": "disaggregated" if "decode" in run else "colocated",
                     "regime": regime(run), "metric": run["metric"], "measured": run["measured"],
                     "predicted": predicted, "error": error, "tolerance": tolerance, "within": abs(error) <= tolerance,
                     "held_back": run["held_back"], "definition": run.get("definition", ""), "gap": run["gap"],
                     "outside": run.get("outside", "")})
    return pd.DataFrame(rows)
