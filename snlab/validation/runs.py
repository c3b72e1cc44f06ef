"""Reading published-run files: ``[[run]]`` rows with their source and tolerance."""

from __future__ import annotations

from pathlib import Path

from ..errors import SnlabError
from ..presets import read_toml

HERE = Path(__file__).parent


def read_runs(path: Path, required: tuple, optional: set, fallback: str) -> list[dict]:
    """The ``[[run]]`` rows of a runs file, checked: no unknown field, none missing, a
    relative tolerance in (0, 1). ``fallback`` names the shipped file the format is in."""
    runs = read_toml(path, str(path)).get("run", [])
    allowed = set(required) | set(optional)
    for i, run in enumerate(runs):
        where = f"{path.name}: run {run.get('id', i + 1)}"
        unknown = set(run) - allowed
        if "tolerance" in unknown:
            raise SnlabError(f"{where}.tolerance", "a tolerance belongs to a kind of run, not to one row",
                             "no tolerance field: every row of a regime is held to that regime's tolerance "
                             "(TOLERANCE in snlab.validation.training and snlab.validation.serving)")
        if unknown:
            raise SnlabError(f"{where}.{sorted(unknown)[0]}", "unknown field", ", ".join(sorted(allowed)))
        for key in required:
            if key not in run:
                raise SnlabError(f"{where}.{key}", "missing", f"see {fallback} for the format")
        if "tolerance" in run and not 0 < run["tolerance"] < 1:
            raise SnlabError(f"{where}.tolerance", f"got {run['tolerance']}", "a relative tolerance in (0, 1)")
    return runs
