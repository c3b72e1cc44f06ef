"""Design-space exploration past one machine: a grid of any size walked in chunks with the
planners' own kernels, reduced as it goes (the best rows, the Pareto front, why rows were
refused, each axis value's best), in this process, local processes or on a Dask cluster
(:func:`explore`); every valid row optionally written to Parquet."""

from .api import explore, explore_serve
from .result import ExploreResult

__all__ = ["explore", "explore_serve", "ExploreResult"]
