"""The three walls: compute, memory and communication, as sympy formulas, and the
serving formulas that compose them for inference."""

from . import communication, compute, memory, serving

__all__ = ["compute", "memory", "communication", "serving"]
