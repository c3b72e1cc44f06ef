"""The training model against published training runs (``training_runs.toml``).

Every row is held to one tolerance, :data:`TOLERANCE`: the training regime's, set for
the kind of run and not per row. The runs of today's software (NeMo on H100, LLM Foundry
on A100) and the Megatron-LM papers' runs on A100 show no difference between chip
families that would call for a tolerance of their own.
"""

from __future__ import annotations

from pathlib import Path

from .runs import HERE, read_runs

_RUN_KEYS = {"id", "source", "where", "model", "system", "plan", "metric", "measured", "definition", "note",
             "precision", "outside"}
#: the relative error every training row is held to; a row outside it fails its test
#: (tests/test_validation_training.py) unless it says, in ``outside``, why the model misses it
TOLERANCE = {"training": 0.20}


#: the shipped files of training runs: switched clusters and supernodes, then the systems
#: beyond one switch (tori, larger NVLink racks)
SHIPPED = ("training_runs.toml", "topology_runs.toml")


def training_runs(path: str | Path | None = None) -> list[dict]:
    """The published training runs (default: the shipped files), validated."""
    paths = [Path(path)] if path else [HERE / name for name in SHIPPED]
    return [run for p in paths
            for run in read_runs(p, ("id", "source", "where", "model", "system", "plan", "metric", "measured"),
                                 _RUN_KEYS, "training_runs.toml")]


def training_table(path: str | Path | None = None):
    """Predicted against measured for every training run: a pandas DataFrame with the
    relative error and whether it is within the training regime's tolerance."""
    import pandas as pd

    from ..training import train
    rows = []
    for run in training_runs(path):
        result = train(run["model"], run["system"], precision=run.get("precision", "bf16"), **run["plan"])
        predicted = result.to_dict()[run["metric"]]
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "metric": run["metric"], "measured": run["measured"],
                     "predicted": predicted, "regime": "training", "error": error,
                     "tolerance": TOLERANCE["training"], "within": abs(error) <= TOLERANCE["training"],
                     "definition": run.get("definition", ""), "note": run.get("note", ""),
                     "outside": run.get("outside", "")})
    return pd.DataFrame(rows)


_RECIPE_KEYS = {"id", "source", "where", "model", "system", "precision", "plan", "note"}


def recipe_runs(path: str | Path | None = None) -> list[dict]:
    """Published training recipes that ran (``recipes.toml``), validated."""
    path = Path(path) if path else HERE / "recipes.toml"
    return read_runs(path, ("id", "source", "where", "model", "system", "plan"), _RECIPE_KEYS, "recipes.toml")


def recipe_table(path: str | Path | None = None):
    """Whether snlab fits each published recipe, with its memory per device against what
    the device offers: a pandas DataFrame."""
    import pandas as pd

    from ..training import train
    rows = []
    for run in recipe_runs(path) + [dict(r, note=r.get("note", "")) for r in training_runs()]:
        result = train(run["model"], run["system"], precision=run.get("precision", "bf16"), **run["plan"])
        memory = result.memory_bytes_per_device
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "model": run["model"],
                     "system": run["system"], "fits": result.fits, "memory_bytes": memory["total"],
                     "usable_bytes": memory["usable"], "headroom_bytes": memory["headroom"],
                     "mfu": result.mfu, "note": run.get("note", "")})
    return pd.DataFrame(rows)
