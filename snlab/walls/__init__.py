"""The walls: compute, memory and communication, as sympy formulas; the serving and
request-queue formulas that compose them for inference; and the fourth wall, power and
cost.

The wall modules are loaded by :mod:`snlab.walls.loader`: while no wall's source has
changed, each is filled from its cached record (its formulas, with their compiled code,
:mod:`snlab.formula_cache`), without running it or importing sympy; an expression is
built when first asked for."""

from . import loader

#: the wall modules, each a module of formulas
WALLS = ("communication", "compute", "memory", "power", "queueing", "serving")
loader.install(__name__, WALLS)

from ..formula import Formula, collect  # noqa: E402  (after the loader is installed)
from . import communication, compute, memory, power, queueing, serving  # noqa: E402

__all__ = ["compute", "memory", "communication", "serving", "queueing", "power", "formulas"]


def formulas() -> dict[str, Formula]:
    """Every formula of the walls, by name (read from the wall modules as they are now,
    so a reloaded wall shows its new formulas)."""
    return collect(compute, memory, communication, serving, queueing, power)
