"""One exploration as data a worker can take: the specs, the grid cut into chunks, the
objectives; and the reduction of one chunk (:func:`reduce_chunk`), which every scheduler
runs, in this process or another."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import itertools
import sys
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .. import grid
from ..errors import SnlabError
from . import kinds, parquet
from .reduce import Objective, Partial, front_index, top_index
from .space import Chunk, Space


@dataclass
class Problem:
    """Everything a chunk needs: what to evaluate, how to cut it, what to keep."""
    kind_name: str
    models: list
    systems: list
    precisions: list
    space: Space
    objective: Objective
    pareto: tuple
    top: int
    devices: int | None
    labels: dict
    out: str | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __getstate__(self):
        # what a worker process takes: presets' read-only provenance maps as plain dicts
        state = dict(self.__dict__, _cache={})
        state["models"], state["systems"] = _portable(self.models), _portable(self.systems)
        state["space"] = copy.copy(self.space)
        state["space"].specs = _portable(self.space.specs)
        return state

    def __setstate__(self, state):
        state["models"], state["systems"] = _restored(state["models"]), _restored(state["systems"])
        state["space"].specs = _restored(state["space"].specs)
        self.__dict__.update(state)

    @property
    def kind(self):
        k = self._cache.get("kind")
        if k is None:
            k = self._cache["kind"] = kinds.kind(self.kind_name)
        return k

    def spec(self, index: int) -> tuple:
        """(model, system, precision) of spec ``index``, in sweep's product order."""
        return self.space.specs[index]


class _Proxy(dict):
    """A read-only map (``types.MappingProxyType``, which pickle refuses) in transit."""


def _portable(x):
    if isinstance(x, MappingProxyType):
        return _Proxy({k: _portable(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return type(x)(_portable(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        new = copy.copy(x)
        for f in dataclasses.fields(x):
            object.__setattr__(new, f.name, _portable(getattr(x, f.name)))
        return new
    return x


def _restored(x):
    if isinstance(x, _Proxy):
        return MappingProxyType({k: _restored(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return type(x)(_restored(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        new = copy.copy(x)
        for f in dataclasses.fields(x):
            object.__setattr__(new, f.name, _restored(getattr(x, f.name)))
        return new
    return x


def build_specs(models: list, systems: list, precisions: list) -> list:
    return list(itertools.product(models, systems, precisions))


def _values(ev, name: str) -> np.ndarray:
    source = ev.outputs if name in ev.outputs else ev.inputs
    return np.broadcast_to(np.asarray(source[name], dtype=float), ev.shape)


def _records(problem: Problem, ev, chunk: Chunk, local: np.ndarray) -> dict:
    """Every input and output of the chunk's rows at flat positions ``local``."""
    if local.size == 0:
        return {}
    multi = np.unravel_index(local, ev.shape)
    rec = {}
    for prefix, group in (("in:", ev.inputs), ("out:", ev.outputs)):
        for key, v in group.items():
            rec[prefix + key] = np.broadcast_to(np.asarray(v), ev.shape)[multi]
    rec["_broken"] = np.broadcast_to(ev.broken, ev.shape)[multi].astype(np.int64)
    rec["_row"] = chunk.start + local.astype(np.int64)
    return rec


def _check_finite(problem: Problem, ev, chunk: Chunk, names, mask) -> None:
    for name in names:
        v = _values(ev, name)
        bad = mask & ~np.isfinite(v)
        if bad.any():
            i = int(np.flatnonzero(bad.ravel())[0])
            multi = np.unravel_index(i, ev.shape)
            row = {k: float(np.broadcast_to(np.asarray(x), ev.shape)[multi]) for k, x in ev.inputs.items()
                   if k in problem.space.dims}
            grid.check_finite({name: np.nan}, row or {"row": chunk.start + i})


def reduce_chunk(problem: Problem, index: int) -> Partial:
    """Evaluate chunk ``index`` and reduce it: its best rows, its front, its reasons and
    each axis value's best; its valid rows written to Parquet when ``out`` is set."""
    space, kind = problem.space, problem.kind
    chunk = space.chunk(index)
    model, system, precision = problem.spec(chunk.spec)
    axes = space.axes_of(chunk)
    ev = kind.evaluate(problem._cache, model, system, precision, axes, problem.devices)
    feasible = np.broadcast_to(ev.feasible, ev.shape)
    objectives = (problem.objective,) + tuple(problem.pareto)
    _check_finite(problem, ev, chunk, {o.name for o in objectives}, feasible)
    flat_ok = feasible.ravel()
    local = np.flatnonzero(flat_ok)
    key_nd = _values(ev, problem.objective.name) * problem.objective.sign
    part = Partial(rows=chunk.rows, feasible=int(local.size), chunks=[index])
    part.reasons = np.bincount(np.broadcast_to(ev.reason, ev.shape).ravel(), minlength=len(kind.reasons))
    if local.size:
        key = key_nd.ravel()[local]
        rows = chunk.start + local
        best = local[top_index(key, rows, problem.top)]
        part.top = _records(problem, ev, chunk, best)
        part.top["_key"] = key_nd.ravel()[best]
        if problem.pareto:
            keys = np.stack([(_values(ev, o.name) * o.sign).ravel()[local] for o in problem.pareto], axis=1)
            on = front_index(keys, rows)
            part.front = _records(problem, ev, chunk, local[on])
            part.front["_keys"] = keys[on]
    part.axes = _by_axis(problem, ev, chunk, feasible, key_nd)
    if problem.out is not None:
        part.files = parquet.write_chunk(problem, ev, chunk, axes)
    return part


def _by_axis(problem: Problem, ev, chunk: Chunk, feasible: np.ndarray, key_nd: np.ndarray) -> dict:
    """Rows, feasible rows and the best objective (signed) per value of each axis."""
    space = problem.space
    masked = np.where(feasible, key_nd, -np.inf)
    total_rows, total_ok = chunk.rows, int(feasible.sum())
    total_best = float(masked.max()) if masked.size else -np.inf
    out = {}
    order = problem.kind.order(space.axes_of(chunk))
    for i, (name, values) in enumerate(space.dims.items()):
        n = len(values)
        rows, ok, best = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -np.inf)
        if i < space.split:
            j = chunk.fixed[i]
            rows[j], ok[j], best[j] = total_rows, total_ok, total_best
        else:
            d = order.index(name)
            other = tuple(a for a in range(len(ev.shape)) if a != d)
            lo, hi = (chunk.lo, chunk.hi) if i == space.split else (0, n)
            rows[lo:hi] = chunk.rows // (hi - lo)
            ok[lo:hi] = feasible.sum(axis=other)
            best[lo:hi] = masked.max(axis=other)
        out[name] = (rows, ok, best)
    spec_index = np.unravel_index(chunk.spec, [len(v) for v in space.spec_axes.values()])
    for (name, values), j in zip(space.spec_axes.items(), spec_index):
        if len(values) > 1:
            n = len(values)
            rows, ok, best = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -np.inf)
            rows[j], ok[j], best[j] = total_rows, total_ok, total_best
            out[name] = (rows, ok, best)
    return out


_MALLOC_SET = False


def keep_freed_memory() -> None:
    """Let this worker process reuse the memory numpy frees, as a fresh interpreter does.

    A chunk allocates and frees a few hundred arrays of a few MB each; glibc serves them
    from the heap once its mmap threshold has adapted to them, unless a trim threshold was
    set, as Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_`` for its workers: every array then
    costs fresh pages, and a worker explores about a third slower. Fixing the thresholds
    (arrays up to 32 MB from the heap, freed memory kept up to 256 MB) restores the rate.
    Linux with glibc only; elsewhere nothing changes."""
    global _MALLOC_SET
    if _MALLOC_SET or not sys.platform.startswith("linux"):
        return
    _MALLOC_SET = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 256 << 20)


def reduce_chunks(problem: Problem, indices) -> Partial:
    """Chunks ``indices`` reduced and merged into one partial result (a worker's task)."""
    keep_freed_memory()
    total = Partial()
    for index in indices:
        total.merge(reduce_chunk(problem, index), problem.top, bool(problem.pareto))
    return total


def check_axis(problem_kind, model, system, precision, axes: dict, name: str, devices) -> dict:
    """Refuse a bad axis before any chunk runs: every value of ``name`` read by the
    planner with every other axis at its first value, a piece at a time."""
    values = axes[name]
    labels = {}
    piece = grid.MAX_ROWS // 4
    for lo in range(0, len(values), piece):
        labels = problem_kind.check(model, system, precision, {**axes, name: values[lo:lo + piece]}, devices)
    return labels


def no_rows(name: str) -> SnlabError:
    return SnlabError(name, "empty", "at least one value")
