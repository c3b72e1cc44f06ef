"""Reductions an exploration keeps while it walks its chunks: the best rows by one
objective, the Pareto front over several, why rows were refused, and each axis value's
best.

Every reduction is a function of the set of rows alone, whatever the order the chunks
come in: ties are broken by the row's place in the grid (the first wins), so merging
partial results from any number of workers in any order gives the same answer as one
pass over the whole grid, to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SnlabError

#: outputs that are better larger even though their names end like costs
_LARGER = ("memory_headroom_bytes", "memory_capacity_bytes", "memory_usable_bytes", "offload_capacity_bytes",
           "max_batch", "max_batch_hbm", "max_context", "max_context_hbm")
#: outputs that are better smaller though nothing in their names says so
_SMALLER = ("devices", "bubble_fraction", "micro_batches", "params_per_device", "kv_spill_slowdown",
            "lender_devices", "offline_waves", "tokens_per_step")


@dataclass(frozen=True)
class Objective:
    """A column to rank rows by, and whether larger (``sign`` +1) or smaller (-1) is better."""
    name: str
    sign: int

    @property
    def label(self) -> str:
        return ("max:" if self.sign > 0 else "min:") + self.name

    @property
    def sense(self) -> str:
        return "max" if self.sign > 0 else "min"


def default_sign(name: str, inputs: tuple) -> int:
    """Larger is better for rates and fractions of peak; smaller for times, memory used,
    devices, and for a swept input (less hardware is the cheaper machine)."""
    if name in inputs:
        return -1
    if name in _LARGER or "_per_s" in name:
        return 1
    if name in _SMALLER or name.endswith("_s") or name.endswith("_bytes") or name.endswith("_bytes_per_device"):
        return -1
    return 1


def objective(spec, outputs: tuple, inputs: tuple, field: str = "objective") -> Objective:
    """An objective from ``"tokens_per_s"``, ``"max:mfu"``, ``"min:step_time_s"`` or a
    pair ``("step_time_s", "min")``; the name an output column or a numeric swept input."""
    if isinstance(spec, Objective):
        return spec
    sense = None
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and all(isinstance(x, str) for x in spec):
        spec, sense = spec
    if not isinstance(spec, str) or not spec.strip():
        raise SnlabError(field, f"got {spec!r}", "a column name, optionally max:NAME or min:NAME")
    spec = spec.strip()
    if sense is None and ":" in spec:
        sense, spec = (x.strip() for x in spec.split(":", 1))
    if sense is not None and sense not in ("max", "min"):
        raise SnlabError(field, f"got {sense!r} for {spec!r}", "max or min")
    known = tuple(outputs) + tuple(inputs)
    if spec not in known:
        raise SnlabError(field, f"unknown column {spec!r}",
                         "an output (" + ", ".join(sorted(outputs)[:12]) + ", ...) or a swept numeric input ("
                         + (", ".join(inputs) if inputs else "none swept") + ")")
    sign = default_sign(spec, tuple(inputs)) if sense is None else (1 if sense == "max" else -1)
    return Objective(spec, sign)


def concat(parts: list[dict]) -> dict:
    parts = [p for p in parts if p]
    if not parts:
        return {}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def take(records: dict, index) -> dict:
    return {k: v[index] for k, v in records.items()}


def top_index(key: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` rows of largest ``key`` (first in the grid on ties), best first."""
    n = key.shape[0]
    if n > k:
        # every row at least as good as the k-th best, ties included, then an exact order
        threshold = np.partition(key, n - k)[n - k]
        candidates = np.flatnonzero(key >= threshold)
    else:
        candidates = np.arange(n)
    order = np.lexsort((rows[candidates], -key[candidates]))
    return candidates[order[:k]]


def _dominated_by(point: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Rows of ``keys`` that ``point`` dominates: no better anywhere, worse somewhere."""
    return np.all(keys <= point, axis=1) & np.any(keys < point, axis=1)


def front_index(keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions of the Pareto front of ``keys`` (n x d, larger better in each column):
    the rows no other row dominates, one per distinct point (the first in the grid),
    ordered by the first objective, best first."""
    n, d = keys.shape
    if n == 0:
        return np.arange(0)
    alive = np.arange(n)
    # cheap first cut: what the best row of each objective dominates is off the front
    for j in range(d):
        best = keys[alive][int(np.argmax(keys[alive, j]))]
        alive = alive[~_dominated_by(best, keys[alive])]
    # one row per distinct point: sorted by the objectives (best first), then by row
    order = np.lexsort((rows[alive],) + tuple(-keys[alive, j] for j in range(d - 1, -1, -1)))
    alive = alive[order]
    k = keys[alive]
    if len(alive) > 1:
        same = np.all(k[1:] == k[:-1], axis=1)
        alive, k = alive[np.r_[True, ~same]], k[np.r_[True, ~same]]
    if d == 1:
        return alive[:1]
    if d == 2:
        # sorted by the first objective (best first): a row is on the front when its
        # second beats every row before it
        before = np.maximum.accumulate(np.r_[-np.inf, k[:-1, 1]])
        return alive[k[:, 1] > before]
    keep = np.ones(len(alive), dtype=bool)
    for i in range(len(alive)):
        if keep[i]:
            # rows after i are no better in the first objective; drop what i dominates
            later = slice(i + 1, None)
            keep[later] &= ~_dominated_by(k[i], k[later])
    return alive[keep]


@dataclass
class Partial:
    """What a set of chunks reduced to; :meth:`merge` adds another set's."""
    rows: int = 0
    feasible: int = 0
    chunks: list = field(default_factory=list)
    reasons: np.ndarray | None = None
    top: dict = field(default_factory=dict)
    front: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)
    files: list = field(default_factory=list)

    def merge(self, other: "Partial", k: int, pareto: bool) -> "Partial":
        self.rows += other.rows
        self.feasible += other.feasible
        self.chunks += other.chunks
        self.files += other.files
        if other.reasons is not None:
            self.reasons = other.reasons.copy() if self.reasons is None else self.reasons + other.reasons
        if other.top:
            both = concat([self.top, other.top])
            self.top = take(both, top_index(both["_key"], both["_row"], k))
        if pareto and other.front:
            both = concat([self.front, other.front])
            self.front = take(both, front_index(both["_keys"], both["_row"]))
        for name, (rows, feasible, best) in other.axes.items():
            if name not in self.axes:
                self.axes[name] = (rows.copy(), feasible.copy(), best.copy())
            else:
                r, f, b = self.axes[name]
                r += rows
                f += feasible
                np.maximum(b, best, out=b)
        return self
