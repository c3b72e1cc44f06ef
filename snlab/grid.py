"""The grid scaffold shared by the training and serving planners.

A planner call is a Cartesian product of axes (a scalar is an axis of one value). The
product is kept as an *open* grid: each axis varies along a dimension of its own, so a
quantity that depends on a few axes is computed over those alone and numpy broadcasts
the rest; :func:`flatten` lays the outputs out one row per configuration at the end.
Rules are checked row by row (:func:`first_broken`), so a single call can raise the
first broken rule and a sweep can flag each row with its reason.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from . import kernel, schema
from .errors import SnlabError
from .units import parse_quantity

kernel.loaded(__name__)

#: the most configurations one call evaluates at once: about 1 kB of outputs and
#: intermediates per row keeps this under a few GB
MAX_ROWS = 4_000_000


def axis_values(name: str, value) -> list | np.ndarray:
    """An axis as a list of values (a scalar is a one-value axis, a numpy array of no
    dimensions a scalar); a numeric numpy array stays an array. Arrays must be
    one-dimensional."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return [value.item()]
    if isinstance(value, np.ndarray):
        if value.ndim > 1:
            raise SnlabError(name, f"got an array of shape {value.shape}", "a scalar or a one-dimensional list")
        if value.size == 0:
            raise SnlabError(name, "empty array", "at least one value")
        return value if value.dtype.kind in "iuf" else value.tolist()
    if isinstance(value, (list, tuple, range)):
        values = list(value)
        if not values:
            raise SnlabError(name, "empty list", "at least one value")
        return values
    return [value]


def is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def finite(v) -> bool:
    """Whether ``v`` is a real number (not a flag) that is finite as a float: NaN,
    infinities and integers too large for a float are not."""
    if not is_number(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def show(v) -> str:
    """A value as a message quotes it: an integer too long to read by its digits."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and abs(int(v)) >= 10**16:
        return f"an integer of {len(str(abs(int(v))))} digits"
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return show(v.item())
    return repr(v.item() if isinstance(v, np.generic) else v)


def unwrap(v):
    """A numpy array of no dimensions as the number it holds; anything else as it is."""
    return v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v


def whole_number(name: str, v, low: float, high: float, allowed: str | None = None) -> int:
    """``v`` as an int, when it is a whole number from ``low`` to ``high`` (a numpy
    scalar or a 0-d array counts); anything else, NaN, infinities and huge integers
    included, raises naming ``name`` and the range."""
    v = unwrap(v)
    if not finite(v) or v != round(v) or not low <= v <= high:
        raise SnlabError(name, f"got {show(v)}", allowed or f"a whole number from {low:,.0f} to {high:,.0f}")
    return int(v)


def numbers(name: str, values, allowed: str, dimension: str | None = None) -> np.ndarray:
    """A numeric axis as float64, each value a finite number; with a physical
    ``dimension`` strings such as ``"400 Gb/s"`` are read and the range checked."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        out = values.astype(float)
        if not np.all(np.isfinite(out)):
            raise SnlabError(name, "got a NaN or infinite value", allowed)
    else:
        out = np.empty(len(values))
        for i, v in enumerate(values):
            if isinstance(v, str) and dimension is not None:
                v = parse_quantity(v, schema.unit_dimension(dimension), name)[0]
            if not finite(v):
                raise SnlabError(name, f"got {show(v)}", allowed)
            out[i] = float(v)
    if dimension is not None:
        schema.check_values(out, dimension, name)
    return out


def coded(name: str, values, table: Mapping, allowed: str) -> np.ndarray:
    """Codes of a named choice (``recompute="full"`` -> 2); codes pass through if valid."""
    out = np.empty(len(values))
    codes = set(table.values())
    for i, v in enumerate(values):
        if isinstance(v, str) and v in table:
            out[i] = table[v]
        elif is_number(v) and v in codes and not isinstance(v, str):
            out[i] = float(v)
        else:
            raise SnlabError(name, f"got {v!r}", allowed)
    return out


def flags(name: str, values) -> np.ndarray:
    """A yes/no axis as 0.0 / 1.0."""
    out = np.empty(len(values))
    for i, v in enumerate(values):
        if not isinstance(v, (bool, np.bool_)) and not (is_number(v) and v in (0, 1)):
            raise SnlabError(name, f"got {v!r}", "true or false")
        out[i] = float(bool(v))
    return out


def check_size(axes: Mapping[str, Sequence], *, limit: int = MAX_ROWS, extra: int = 1) -> int:
    """The number of configurations of the product of ``axes`` (times ``extra``), lists
    of models, systems and precisions included when they are axes; refuses a product
    larger than ``limit`` with a message that says how large it is and how to split it."""
    size = extra
    for values in axes.values():
        size *= len(values)
    if size > limit:
        longest = sorted(axes, key=lambda k: -len(axes[k]))[:3]
        raise SnlabError("sweep", f"{size:,} configurations, more than one call evaluates at once ({limit:,})",
                         "fewer values on the longest axes (" + ", ".join(f"{k}: {len(axes[k]):,}" for k in longest)
                         + f"), or a loop over one of them with at most {limit:,} configurations a call")
    return size


def open_grid(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each axis reshaped to vary along its own dimension of an open grid."""
    ndim = len(columns)
    out = {}
    for i, (name, arr) in enumerate(columns.items()):
        shape = [1] * ndim
        shape[i] = len(arr)
        out[name] = np.asarray(arr, dtype=float).reshape(shape)
    return out


def broadcast_shape(*shapes: tuple) -> tuple:
    """``numpy.broadcast_shapes`` for any number of dimensions (numpy's own, and
    ``numpy.broadcast``, stop at 32, and an open grid of a wide exploration has more)."""
    ndim = max(map(len, shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, n in enumerate(shape, ndim - len(shape)):
            if n == 1 or n == out[i]:
                continue
            if out[i] != 1:
                raise ValueError(f"shapes {shapes} do not broadcast")
            out[i] = n
    return tuple(out)


def grid_shape(*groups) -> tuple:
    """The broadcast shape of every array in the given mappings (or arrays)."""
    shapes = []
    for group in groups:
        values = group.values() if isinstance(group, Mapping) else [group]
        shapes += [np.shape(v) for v in values]
    return broadcast_shape(*shapes)


def flatten(arrays: Mapping, shape: tuple) -> dict:
    """Arrays of an open grid broadcast to ``shape`` and laid out flat, one row per point."""
    if math.prod(shape) == 1:                   # one configuration: no broadcasting needed
        return {k: np.reshape(v, 1) for k, v in arrays.items()}
    return {k: (np.broadcast_to(v, shape).ravel() if np.ndim(v) else v) for k, v in arrays.items()}


_BOOLS = frozenset((bool, np.bool_))
_NUMPY_SCALARS = frozenset((np.float64, np.int64, np.bool_))
_PYTHON_SCALARS = {float: np.float64, int: np.int64, bool: np.bool_}
_SCALAR_NUMBERS = frozenset((float, int, np.float64, np.int64))
_SCALARS = _NUMPY_SCALARS | frozenset(_PYTHON_SCALARS)


def where(cond, a, b):
    """``numpy.where`` that returns a numpy scalar, not a 0-d array, when every input is a
    scalar: a planner's single configuration then stays in numpy scalars, which numpy
    evaluates several times faster than 0-d arrays."""
    if type(cond) in _BOOLS and type(a) in _SCALARS and type(b) in _SCALARS:
        x = a if cond else b
        return _PYTHON_SCALARS[type(x)](x) if type(x) in _PYTHON_SCALARS else x
    out = np.where(cond, a, b)
    return out if type(out) is kernel.Traced else out[()]


#: Python integers a float64 holds exactly
_EXACT = 2 ** 53


def _pair(a, b):
    """The numpy scalar type of ``a`` when ``b`` combines with it without a change of
    type (float64 with float64, float or a small int; int64 with int64 or a small int),
    else None."""
    ta, tb = type(a), type(b)
    if ta is np.float64:
        return ta if tb is ta or tb is float or (tb is int and -_EXACT < b < _EXACT) else None
    if ta is np.int64:
        return ta if tb is ta or (tb is int and -_EXACT < b < _EXACT) else None
    return None


def maximum(a, b):
    """``numpy.maximum(a, b)``; for a numpy scalar and a number of its kind that differ
    from it (not NaN, not zeros of two signs), the larger without a numpy call."""
    kind = _pair(a, b)
    if kind is not None:
        if a > b:
            return a
        if b > a:
            return kind(b)
    return np.maximum(a, b)


def minimum(a, b):
    """``numpy.minimum(a, b)``, as :func:`maximum` is ``numpy.maximum``."""
    kind = _pair(a, b)
    if kind is not None:
        if a < b:
            return a
        if b < a:
            return kind(b)
    return np.minimum(a, b)


def spread(value, shape: tuple):
    """``numpy.broadcast_to(value, shape)``, except that a float64 scalar stays one for a
    single configuration's shape ``()`` (the same number, without a read-only 0-d array)."""
    if shape == () and type(value) is np.float64:
        return value
    return np.broadcast_to(value, shape)


def rounded(x):
    """``x`` rounded to the nearest integer as int64: a numpy scalar for a scalar, an
    array for an array (exact integer arithmetic for the plan rules and stage splits)."""
    if type(x) in _SCALAR_NUMBERS or np.ndim(x) == 0:
        if type(x) is kernel.Traced:
            return kernel.rounded(x)
        return np.int64(round(float(x)))
    return np.round(x).astype(np.int64)


def at_largest(keys: Sequence, *choices: Sequence) -> tuple:
    """For each of ``choices``, its element at the position of the largest of ``keys``
    (the first on ties), row by row; numpy scalars in, numpy scalars out."""
    if all(type(k) in _NUMPY_SCALARS or type(k) in _PYTHON_SCALARS for k in keys):
        i = max(range(len(keys)), key=keys.__getitem__)
        return tuple(c[i] for c in choices)
    if any(type(k) is kernel.Traced for k in keys):
        # the same choice as comparisons: a later key wins only when it is larger
        best, picked = keys[0], [c[0] for c in choices]
        for i in range(1, len(keys)):
            larger = keys[i] > best
            best = where(larger, keys[i], best)
            picked = [where(larger, c[i], p) for c, p in zip(choices, picked)]
        return tuple(picked)
    shape = broadcast_shape(*(np.shape(x) for x in (*keys, *(y for c in choices for y in c))))
    i = np.argmax(np.stack([np.broadcast_to(k, shape) for k in keys]), axis=0)[None]
    return tuple(np.take_along_axis(np.stack([np.broadcast_to(x, shape) for x in c]), i, axis=0)[0]
                 for c in choices)


def first_broken(conditions: Sequence) -> np.ndarray:
    """Index of the first true condition per row (a rule broken), or -1 when none is."""
    if all(type(c) in _BOOLS for c in conditions):
        return np.int16(next((i for i, c in enumerate(conditions) if c), -1))
    if any(type(c) is kernel.Traced for c in conditions):
        first = -1
        for i in range(len(conditions) - 1, -1, -1):
            first = where(conditions[i], i, first)
        return first
    first = np.full(broadcast_shape(*map(np.shape, conditions)), -1, dtype=np.int16)
    for i in range(len(conditions) - 1, -1, -1):
        first = np.where(conditions[i], i, first)
    return first


def axis_items(value) -> list:
    """The values of an axis as a flat list (a scalar is an axis of one value); ``None``
    entries, which leave a field at its default, dropped."""
    if isinstance(value, (str, bytes)) or np.ndim(value) == 0:
        value = [value]
    return [v for v in np.ravel(np.asarray(value, dtype=object)).tolist() if v is not None]


def moved(fields: Mapping, name: str, default) -> bool:
    """Whether ``fields`` sets ``name`` away from ``default`` at some point of its axis."""
    return name in fields and any(v != default for v in axis_items(fields[name]))


def everywhere(fields: Mapping, name: str, default, test: Callable) -> bool:
    """Whether ``test`` holds for every value of ``name``'s axis (``default`` when
    ``fields`` leaves it out): a field it guards is then read at no point of the grid."""
    values = axis_items(fields[name]) if name in fields else []
    return all(test(v) for v in (values or [default]))


def fails_everywhere(check: Callable, combinations: Sequence) -> None:
    """Run ``check`` on each combination (of model, system, ...); raise the first one's
    :class:`SnlabError` only when it raises for every combination, so that a field a
    sweep reads for one model of its list is not refused for another."""
    first = None
    for combination in combinations:
        try:
            check(*combination)
        except SnlabError as error:
            first = first or error
        else:
            return
    if first is not None:
        raise first


def nearest(x):
    """``numpy.round(x)``: the nearest whole number, halves to even, keeping the sign
    (-0.4 gives -0.0); a finite float64 scalar without a numpy call."""
    if type(x) is np.float64 and math.isfinite(x):
        return np.float64(math.copysign(round(float(x)), x))
    return np.round(x)


def whole(x) -> np.ndarray:
    """Whether each value is a whole number >= 1."""
    return (x == nearest(x)) & (x >= 1)


_FLOATING = (float, np.floating)


def check_finite(row: Mapping, inputs: Mapping) -> None:
    """Refuse a result with a NaN or infinite number in it, naming the outputs and the
    inputs given (every input is range-checked first, so this is the last guard)."""
    isfinite = math.isfinite
    bad = [k for k, v in row.items() if isinstance(v, _FLOATING) and not isfinite(v)]
    if bad:
        given = ", ".join(f"{k}={v!r}" for k, v in inputs.items()) or "the defaults"
        raise SnlabError("result", f"{', '.join(bad[:4])} not finite for {given}",
                         "inputs that give a finite result; please report this case")


def outputs(out: Mapping, shape: tuple, valid: np.ndarray, columns: Mapping) -> dict:
    """The output columns of a sweep laid out flat (:func:`flatten`), each checked finite
    on the rows that break no rule (:func:`check_finite`, naming the first bad row's
    inputs, ``columns``: the swept inputs, flat); rows that break a rule get NaN (False
    for flags). One copy per column: broadcast, checked and masked in place."""
    if valid.all():
        flat = {k: np.broadcast_to(np.asarray(v), shape).reshape(-1) for k, v in out.items()}
        check_finite_rows(flat, valid, columns)
        return flat
    flat, invalid = {}, ~valid
    for key, v in out.items():
        v = np.asarray(v)
        column = np.empty(shape, dtype=v.dtype)
        np.copyto(column, v)
        column = column.reshape(-1)
        if column.dtype == bool:
            column &= valid
        flat[key] = column
    check_finite_rows(flat, valid, columns)
    for column in flat.values():
        if column.dtype.kind == "f":
            np.copyto(column, np.nan, where=invalid)
    return flat


def check_finite_rows(flat: Mapping, valid: np.ndarray, columns: Mapping) -> None:
    """:func:`check_finite` for every valid row of a sweep, naming the first bad row's
    inputs (``columns``: the swept inputs, flat)."""
    names, bad = [], None
    for key, v in flat.items():
        v = np.asarray(v)
        if v.dtype.kind != "f":
            continue
        finite = np.isfinite(v)
        if finite.all():
            continue
        wrong = valid & ~np.broadcast_to(finite, valid.shape)
        if wrong.any():
            bad = wrong if bad is None else bad | wrong
            names.append(key)
    if names:
        i = int(np.argmax(bad))
        row = {k: (np.broadcast_to(c, valid.shape)[i].item() if np.ndim(c) else c) for k, c in columns.items()}
        check_finite({k: np.nan for k in names}, row)


def full(column, n: int) -> np.ndarray:
    """A column of ``n`` rows: as it is when it has them, else broadcast (a read-only
    view, which :func:`writable` copies when a frame takes it)."""
    column = np.asarray(column)
    return column if column.shape == (n,) else np.broadcast_to(column, (n,))


def writable(value):
    """An array a DataFrame can own and a user can assign into: read-only views (a
    broadcast, a column shared with the grid) copied, everything else as it is."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()
    return value


def first_row(columns: Mapping) -> dict:
    """The first row of flat columns as Python numbers (whole numbers as int), for
    messages that quote a configuration."""
    return {k: (int(v[0]) if float(v[0]).is_integer() else float(v[0])) for k, v in columns.items()}


def unknown_fields(axes: Mapping, known: Sequence[str], what: str, extra: Callable[[str], bool] = lambda k: False):
    """Raise naming the first axis that is not a known field."""
    for key in axes:
        if key not in known and not extra(key):
            raise SnlabError(key, f"not a {what} field", ", ".join(known))


#: the values a :class:`FieldMemo` keeps entries for: immutable, hashable scalars
MEMO_SCALARS = frozenset((int, float, str, bool, type(None), np.float64, np.int64, np.bool_))


def memo_key(name: str, value, *extra):
    """The key of a one-value axis in a :class:`FieldMemo`: the field, the value's type
    and the value (1 and 1.0 and True apart), then ``extra``; None for a value that
    gets no entry (anything but :data:`MEMO_SCALARS`, and a negative zero, which equals
    a positive one)."""
    kind = type(value)
    if kind not in MEMO_SCALARS or (value == 0 and kind is not str and math.copysign(1.0, value) < 0):
        return None
    return (name, kind, value, *extra)


class FieldMemo:
    """What a planner makes of one field's value alone (its column, its label), kept per
    :func:`memo_key` once a call has checked and converted that value, so that a call
    whose every field was seen before skips the checks it has already passed. At most
    ``size`` entries (then it starts again); entries are immutable."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._kept: dict = {}

    def get(self, keys: Sequence | None) -> list | None:
        """The entries of ``keys``, or None unless every one is kept."""
        if keys is None:
            return None
        kept = self._kept
        found = [kept.get(k) for k in keys]
        return None if None in found else found

    def put(self, key, entry) -> None:
        """Keep ``entry`` (not None) under ``key`` (a :func:`memo_key`; None keeps nothing)."""
        if key is None:
            return
        if len(self._kept) >= self.size:
            self._kept.clear()
        self._kept[key] = entry
