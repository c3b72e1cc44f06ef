"""Collectives against published collective benchmarks (``collective_runs.toml``).

Each row is priced by :func:`snlab.network.collective`, the function the planners' collectives
and ``snlab collective`` share, and held to one tolerance, :data:`TOLERANCE`: the collective
regime's, the same for every row and set before the rows were compared. A row outside it fails
its test (tests/test_topology.py) unless it says, in ``outside``, why the model misses it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from .runs import HERE, read_runs

_REQUIRED = ("id", "source", "where", "system", "op", "message_bytes", "devices", "metric", "measured")
_KEYS = set(_REQUIRED) | {"stride", "slice", "note", "outside"}
#: what a row may compare: NCCL's bus bandwidth [GB/s] or the time [us]
METRICS = {"bus_bandwidth_gbs": ("bus_bandwidth", 1e-9), "time_us": ("time_s", 1e6)}
#: the relative error every collective row is held to
TOLERANCE = {"collective": 0.20}


def collective_runs(path: str | Path | None = None) -> list[dict]:
    """The published collective benchmarks (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "collective_runs.toml"
    runs = read_runs(path, _REQUIRED, _KEYS, "collective_runs.toml")
    for run in runs:
        if run["metric"] not in METRICS:
            raise SnlabError(f"{path.name}: run {run['id']}.metric", f"got {run['metric']!r}", ", ".join(METRICS))
    return runs


def system_of(run: dict):
    """A row's system: a shipped preset, or a file beside this module (``topology_systems/...``)."""
    from ..presets import system
    name = run["system"]
    return system(str(HERE / name) if name.endswith(".toml") else name)


def collective_table(path: str | Path | None = None):
    """Predicted against measured for every collective benchmark: a pandas DataFrame with
    the algorithm priced, the relative error and whether it is within the tolerance."""
    import pandas as pd

    from ..network import collective
    rows = []
    for run in collective_runs(path):
        c = collective(system_of(run), run["op"], run["message_bytes"], run["devices"], stride=run.get("stride", 1),
                       slice=run.get("slice"))
        field, scale = METRICS[run["metric"]]
        predicted = getattr(c, field) * scale
        error = predicted / run["measured"] - 1
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "system": c.system,
                     "op": run["op"], "message_bytes": run["message_bytes"], "devices": run["devices"],
                     "metric": run["metric"], "measured": run["measured"], "predicted": predicted,
                     "regime": "collective", "error": error, "tolerance": TOLERANCE["collective"],
                     "within": abs(error) <= TOLERANCE["collective"], "algorithm": c.algorithm,
                     "placement": c.placement, "note": run.get("note", ""), "outside": run.get("outside", "")})
    return pd.DataFrame(rows)
