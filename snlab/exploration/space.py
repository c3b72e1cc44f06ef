"""The grid an exploration walks, cut into chunks.

A grid is the Cartesian product of the specs (models x systems x precisions, outermost)
and the axes that hold more than one value, in the order of the planner's open grid, so
that row ``r`` here is row ``r`` of the frame ``snlab.sweep`` returns for the same call.
A chunk is a run of consecutive rows: the axes before a *split* axis fixed at one value
each, a slice of the split axis, and every value of the axes after it; it is evaluated
with the planner's own open-grid kernels, as one ``sweep`` of its own would be.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from .. import grid
from ..errors import SnlabError

#: memory one row of a chunk costs while it is evaluated and reduced [bytes]: the open
#: grid's broadcast outputs and intermediates (about 0.6 kB a row of the training kernels,
#: measured with tracemalloc on 2**18-row chunks), with room for the reductions
BYTES_PER_ROW = 1_500
#: the default chunk: large enough that the kernels' fixed cost per call (about 1 ms)
#: vanishes, small enough that the arrays stay near the cache sizes where numpy keeps
#: its per-row rate (larger chunks are slower per row, not faster)
DEFAULT_CHUNK_ROWS = 1 << 18
#: the share of the memory available when the call starts that a chunk may take
MEMORY_SHARE = 0.25
MIN_CHUNK_ROWS = 1 << 10


def available_memory_bytes() -> float:
    """Memory available to this process now [bytes] (Linux's MemAvailable; the physical
    memory elsewhere; infinite when neither can be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return math.inf


def chunk_rows_for(memory_bytes: float | None = None) -> int:
    """The rows of a chunk: :data:`DEFAULT_CHUNK_ROWS`, fewer when a quarter of the
    available memory would not hold them (at :data:`BYTES_PER_ROW` a row)."""
    memory_bytes = available_memory_bytes() if memory_bytes is None else memory_bytes
    fits = int(memory_bytes * MEMORY_SHARE // BYTES_PER_ROW)
    return int(max(MIN_CHUNK_ROWS, min(DEFAULT_CHUNK_ROWS, fits)))


@dataclass(frozen=True)
class Chunk:
    """Rows ``start`` to ``start + rows`` of the grid: spec ``spec``, the axes before
    ``split`` at the value indices ``fixed``, ``split`` from ``lo`` to ``hi``."""
    index: int
    spec: int
    start: int
    rows: int
    fixed: tuple
    lo: int
    hi: int


@dataclass
class Space:
    """Specs (model, system, precision) and the axes of an exploration, in grid order.

    ``dims`` are the axes with more than one value, in the order of the planner's open
    grid (``order``); ``singles`` every other axis, as given.
    """
    specs: list
    spec_axes: dict
    dims: dict
    singles: dict
    chunk_rows: int
    split: int = field(init=False)
    step: int = field(init=False)
    inner: int = field(init=False)

    def __post_init__(self):
        lengths = [len(v) for v in self.dims.values()]
        # the split axis: the last one whose values, with every axis after it, overflow
        # a chunk; the axes after it go whole into every chunk (the first axis when the
        # whole grid fits in one)
        self.split, self.inner = 0, math.prod(lengths[1:])
        after = 1
        for i in range(len(lengths) - 1, -1, -1):
            if after * lengths[i] > self.chunk_rows:
                self.split, self.inner = i, after
                break
            after *= lengths[i]
        self.step = max(1, self.chunk_rows // self.inner) if lengths else 1

    @property
    def lengths(self) -> list[int]:
        return [len(v) for v in self.dims.values()]

    @property
    def rows_per_spec(self) -> int:
        return math.prod(self.lengths)

    @property
    def rows(self) -> int:
        return len(self.specs) * self.rows_per_spec

    @property
    def chunks_per_spec(self) -> int:
        lengths = self.lengths
        if not lengths:
            return 1
        return math.prod(lengths[:self.split]) * math.ceil(lengths[self.split] / self.step)

    @property
    def chunks(self) -> int:
        return len(self.specs) * self.chunks_per_spec

    def chunk(self, index: int) -> Chunk:
        """Chunk ``index`` (0 to :attr:`chunks` - 1), in row order."""
        if not 0 <= index < self.chunks:
            raise IndexError(index)
        spec, local = divmod(index, self.chunks_per_spec)
        lengths = self.lengths
        if not lengths:
            return Chunk(index, spec, spec, 1, (), 0, 1)
        pieces = math.ceil(lengths[self.split] / self.step)
        outer, piece = divmod(local, pieces)
        fixed = tuple(int(i) for i in np.unravel_index(outer, lengths[:self.split])) if self.split else ()
        lo = piece * self.step
        hi = min(lo + self.step, lengths[self.split])
        start = spec * self.rows_per_spec + (outer * lengths[self.split] + lo) * self.inner
        return Chunk(index, spec, start, (hi - lo) * self.inner, fixed, lo, hi)

    def axes_of(self, chunk: Chunk) -> dict:
        """The planner's axes for one chunk: fixed axes at one value, the split axis
        sliced, the axes after it whole."""
        axes = dict(self.singles)
        for i, (name, values) in enumerate(self.dims.items()):
            if i < self.split:
                axes[name] = values[chunk.fixed[i]:chunk.fixed[i] + 1]
            elif i == self.split:
                axes[name] = values[chunk.lo:chunk.hi]
            else:
                axes[name] = values
        return axes

    def decode(self, rows: np.ndarray) -> tuple[np.ndarray, dict]:
        """The spec index and each axis's value index of global rows."""
        rows = np.asarray(rows, dtype=np.int64)
        spec, local = np.divmod(rows, self.rows_per_spec)
        if not self.dims:
            return spec, {}
        idx = np.unravel_index(local, self.lengths)
        return spec, dict(zip(self.dims, idx))


def normalise_axis(name: str, values, dimension: str | None, allowed: str):
    """An axis as a one-dimensional float array when every value is a number (or a
    quantity string of ``dimension``), so a chunk slices it without reading it again;
    anything else (names, flags, None) as a list."""
    values = grid.axis_values(name, values)
    if isinstance(values, np.ndarray):
        return grid.numbers(name, values, allowed, dimension) if dimension else values.astype(float)
    if dimension is not None:
        return grid.numbers(name, values, allowed, dimension)
    if all(grid.is_number(v) for v in values):
        return grid.numbers(name, values, allowed)
    return values


def check_chunk_rows(chunk_rows) -> int | None:
    if chunk_rows is None:
        return None
    return grid.whole_number("chunk_rows", chunk_rows, 1, grid.MAX_ROWS,
                             f"a whole number of rows from 1 to {grid.MAX_ROWS:,}")


def no_empty(name: str, values) -> None:
    if len(values) == 0:
        raise SnlabError(name, "empty", "at least one value")
