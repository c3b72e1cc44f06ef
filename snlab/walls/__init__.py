"""The walls: compute, memory and communication, as sympy formulas; the serving and
request-queue formulas that compose them for inference; and the fourth wall, power and
cost."""

from ..formula import Formula, collect
from . import communication, compute, memory, power, queueing, serving

__all__ = ["compute", "memory", "communication", "serving", "queueing", "power", "formulas"]


def formulas() -> dict[str, Formula]:
    """Every formula of the walls, by name (read from the wall modules as they are now,
    so a reloaded wall shows its new formulas)."""
    return collect(compute, memory, communication, serving, queueing, power)
