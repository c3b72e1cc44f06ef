"""A formula: one sympy expression, shown as LaTeX, compiled once into numpy.

Every formula in snlab is a :class:`Formula`. The expression is the single source of
truth: ``formula.latex()`` prints it, ``formula.subs(...)`` evaluates it exactly in
sympy, and ``formula(...)`` evaluates the same expression compiled with
``sympy.lambdify`` (explicit argument order, ``cse=True``, compiled on first use and
kept). Numeric calls broadcast: pass numpy arrays to evaluate a whole grid at once.

A formula checks its dimension when it is built: the expression must have the
dimension of the quantity it defines (a fraction cannot be defined as a time), and
every sum must add like to like. There is no global registry: the walls list their
formulas by scanning their modules (:func:`snlab.walls.formulas`), so reloading a wall
module simply replaces its formulas.

The compiled code is kept on disk (:mod:`snlab.formula_cache`), keyed on the expression's
content, so that a later process reads it back instead of compiling again; a formula
filled from a cached wall module (:meth:`Formula.cached`) builds its expression, and
imports sympy, only when something asks for it.
"""

from __future__ import annotations

import operator
from functools import cached_property
from typing import Callable, Mapping

import numpy as np

from . import formula_cache, kernel
from .errors import SnlabError
from .symbols import NOMENCLATURE, ORDER, describe_dimension, dimension, latex_names

kernel.loaded(__name__)

_ANY = None  # the dimension of 0: compatible with every other
_NONE = dimension("1")  # a pure number


class DimensionError(RuntimeError):
    """A formula whose expression does not have a consistent dimension."""


def _combine(dims: list, what: str, expr):
    known = [d for d in dims if d is not _ANY]
    if any(d != known[0] for d in known[1:]):
        shown = ", ".join(describe_dimension(d) for d in dict.fromkeys(known))
        raise DimensionError(f"{what} of unlike dimensions ({shown}) in {expr}")
    return known[0] if known else _ANY


def expression_dimension(expr):
    """The dimension of ``expr`` as exponents of bytes, seconds, joules and dollars;
    ``None`` for 0.

    Symbols take their nomenclature unit; numbers are dimensionless (0 fits any
    dimension); sums, maxima, minima and the branches of a piecewise expression must
    agree; a power with a symbolic exponent, and the argument of a function such as
    ``log``, must be dimensionless.
    """
    import sympy as sp
    if expr.is_Symbol:
        return dimension(NOMENCLATURE[expr.name].unit)
    if expr.is_Number:
        return _ANY if expr == 0 else _NONE
    if expr.is_NumberSymbol:
        return _NONE
    if isinstance(expr, (sp.Add, sp.Max, sp.Min)):
        return _combine([expression_dimension(a) for a in expr.args], type(expr).__name__, expr)
    if isinstance(expr, sp.Mul):
        dims = [expression_dimension(a) for a in expr.args]
        if any(d is _ANY for d in dims):
            return _ANY
        return tuple(sum(d[i] for d in dims) for i in range(len(_NONE)))
    if isinstance(expr, sp.Pow):
        base, exp = expression_dimension(expr.base), expr.exp
        if exp.is_Number:
            return _ANY if base is _ANY else tuple(int(b * exp) for b in base)
        if base not in (_ANY, _NONE) or expression_dimension(exp) not in (_ANY, _NONE):
            raise DimensionError(f"power with a symbolic exponent of a dimensioned quantity: {expr}")
        return base
    if isinstance(expr, sp.Piecewise):
        return _combine([expression_dimension(e) for e, _ in expr.args], "Piecewise branches", expr)
    if isinstance(expr, sp.Function):
        for arg in expr.args:
            if expression_dimension(arg) not in (_ANY, _NONE):
                raise DimensionError(f"{type(expr).__name__} of a dimensioned quantity: {expr}")
        return _NONE
    raise DimensionError(f"cannot find the dimension of {expr!r}")


class Formula:
    """A named quantity ``lhs = expr`` with its unit and source.

    Parameters
    ----------
    name : str
        Name, e.g. ``"ring_all_reduce_time"`` (the wall module's attribute of the same name).
    lhs : str
        Nomenclature name of the quantity it defines (gives LaTeX name and unit).
    expr : sympy.Expr
        The expression, in nomenclature symbols only, of the dimension of ``lhs``.
    source : str
        Where it comes from (paper, equation or table).
    """

    def __init__(self, name: str, lhs: str, expr, source: str, doc: str = ""):
        unknown = [s.name for s in expr.free_symbols if s.name not in NOMENCLATURE]
        if unknown:
            raise RuntimeError(f"formula {name}: symbols not in the nomenclature: {unknown}")
        self._describe(name, lhs, source, doc)
        self._expr = expr
        got, want = expression_dimension(expr), dimension(self.lhs.unit)
        if got is not _ANY and got != want:
            raise DimensionError(f"formula {name}: defines {lhs} [{self.lhs.unit}] but its expression is "
                                 f"in {describe_dimension(got)}")
        self._set_args(tuple(s.name for s in sorted(expr.free_symbols, key=lambda s: ORDER[s.name])))

    @classmethod
    def cached(cls, name: str, lhs: str, arg_names: tuple[str, ...], source: str, doc: str, key: str,
               expression: Callable[[], object]) -> "Formula":
        """A formula read from the cache (:mod:`snlab.formula_cache`): its name, the
        quantity it defines, argument names, source and content ``key`` as recorded, and
        ``expression()``, which builds the sympy expression it was recorded from when first
        asked for. Numbers come from the cached compiled code of that expression."""
        self = cls.__new__(cls)
        self._describe(name, lhs, source, doc)
        self._expr, self._expression, self._key = None, expression, key
        self._set_args(tuple(arg_names))
        return self

    def _describe(self, name: str, lhs: str, source: str, doc: str) -> None:
        self.name = name
        self.lhs = NOMENCLATURE[lhs]
        self.source = source
        self.doc = doc
        self._key: str | None = None
        self._partials: dict = {}

    def _set_args(self, arg_names: tuple[str, ...]) -> None:
        self.arg_names: tuple[str, ...] = arg_names
        self._arg_set = frozenset(arg_names)
        self._arity = len(arg_names)
        # the inputs in argument order, as a tuple, from a mapping of them
        self._take = (operator.itemgetter(*arg_names) if len(arg_names) > 1
                      else (lambda v, n=arg_names: tuple(v[k] for k in n)))

    @property
    def expr(self):
        """The sympy expression: the single source of truth of the formula."""
        if self._expr is None:
            self._expr = self._expression()
        return self._expr

    @property
    def args(self) -> tuple:
        """The sympy symbols of the arguments, in argument order."""
        return tuple(NOMENCLATURE[n].symbol for n in self.arg_names)

    @property
    def unit(self) -> str:
        return self.lhs.unit

    @property
    def key(self) -> str:
        """The content key of the compiled code (:func:`snlab.formula_cache.key`): the
        ``srepr`` of the expression, the argument order and what it defines (for a partial
        formula: its parent's key and the values fixed)."""
        if self._key is None:
            import sympy as sp
            self._key = formula_cache.key("formula", self.lhs.name, ",".join(self.arg_names), sp.srepr(self.expr))
        return self._key

    @cached_property
    def func(self) -> Callable[..., np.ndarray]:
        """The expression compiled to a numpy function of ``self.args`` (positional)."""
        return self._compiled("numpy")

    @cached_property
    def scalar_func(self) -> Callable[..., float]:
        """The same expression compiled to Python's ``math``, for calls whose inputs are
        all scalars (a planner's single configuration): several times faster than numpy
        on scalars, and equal to it wherever it is defined."""
        return self._compiled("math")

    def _compiled(self, kind: str) -> Callable:
        """The compiled function of ``kind`` (``"numpy"`` or ``"math"``): read from the
        cache when a record of this key holds it, else compiled and recorded."""
        record = formula_cache.load(self.key)
        if record is not None and tuple(record.get("args", ())) == self.arg_names and kind in record:
            fn = formula_cache.function_from(record[kind])
            if fn is not None:
                return fn
        fn = self.lambdify(kind)
        entry = formula_cache.function_record(fn)
        if entry is not None:
            formula_cache.store(self.key, {**(record or {}), "args": list(self.arg_names), kind: entry})
        return fn

    def lambdify(self, kind: str) -> Callable:
        """The expression compiled by ``sympy.lambdify`` (explicit argument order,
        ``cse=True``), to numpy (``kind="numpy"``, with a scalar-fast ``select``) or to
        Python's ``math`` (``kind="math"``); no cache."""
        import sympy as sp
        modules = [{"select": _select}, "numpy"] if kind == "numpy" else "math"
        return sp.lambdify(self.args, self.expr, modules=modules, cse=True)

    def __call__(self, **values) -> np.ndarray | float:
        """Evaluate numerically; keyword names are the nomenclature's long names.

        Arrays broadcast against each other. Inputs are converted to float64 so
        that large products (B s L h^2) cannot overflow integer arithmetic. When every
        input is a float the ``math`` compilation runs; where it cannot (a division by
        zero, a logarithm of zero, an overflow, a NaN) the numpy one does, with numpy's
        answer.
        """
        try:
            args = self._take(values)
        except KeyError:
            args = None
        if args is None or len(values) != self._arity:       # a name missing or one too many
            self._check_inputs(values)
        return self._run(args)

    def _run(self, args: tuple) -> np.ndarray | float:
        """Evaluate at the inputs ``args``, in argument order (see :meth:`__call__`)."""
        if _FLOATS.issuperset(map(type, args)):
            try:
                out = self.scalar_func(*args)
            except (ArithmeticError, ValueError):
                pass
            else:
                if out == out and type(out) is not bool:       # not NaN, not a comparison
                    return out if type(out) is np.float64 else np.float64(out)
        if any(type(a) is kernel.Traced for a in args):
            return kernel.formula_call(self, args)
        out = self.func(*[_float64(a) for a in args])
        if isinstance(out, float):
            return out
        out = np.asarray(out, dtype=np.float64)
        return out[()] if out.ndim == 0 else out

    def _check_inputs(self, values: Mapping[str, object]) -> None:
        """Raise naming what is missing or unexpected (the slow path of a call)."""
        missing = [n for n in self.arg_names if n not in values]
        if missing:
            raise SnlabError(self.name, "missing input " + ", ".join(missing),
                             "inputs: " + ", ".join(self.arg_names))
        extra = [n for n in values if n not in self.arg_names]
        raise SnlabError(self.name, "unexpected input " + ", ".join(extra),
                         "inputs: " + ", ".join(self.arg_names))

    def evaluate(self, values: Mapping[str, object]) -> np.ndarray | float:
        """Evaluate with the inputs this formula needs taken from a larger mapping."""
        missing = [n for n in self.arg_names if n not in values]
        if missing:
            raise SnlabError(self.name, "missing input " + ", ".join(missing),
                             "inputs: " + ", ".join(self.arg_names))
        return self._run(self._take(values))

    def partial(self, **values) -> "Formula":
        """The same formula with some inputs fixed to exact values, compiled apart.

        Fixing a selector (``recompute=2``) collapses a piecewise expression to one
        branch, so the numeric function evaluates only that branch. Cached per values.
        """
        key = tuple(sorted(values.items()))
        if key not in self._partials:
            self._partials[key] = self._partial(key)
        return self._partials[key]

    def _partial(self, items: tuple) -> "Formula":
        """The partial formula of ``items``, keyed on this formula's key and the values:
        from its cached record (argument names) when there is one, else built."""
        label = ", ".join(f"{k}={v}" for k, v in items)
        name = f"{self.name}[{label}]"
        key = formula_cache.key("partial", self.key, repr(items))
        record = formula_cache.load(key)
        if record is not None and isinstance(record.get("args"), list):
            return Formula.cached(name, self.lhs.name, tuple(record["args"]), self.source, self.doc, key,
                                  lambda: self.subs(**dict(items)))
        formula = Formula(name, self.lhs.name, self.subs(**dict(items)), self.source, self.doc)
        formula._key = key
        if record is None:
            formula_cache.store(key, {"args": list(formula.arg_names)})
        return formula

    def subs(self, **values):
        """Substitute exact values symbolically (integers and fractions stay exact)."""
        import sympy as sp
        return self.expr.subs({NOMENCLATURE[k].symbol: sp.nsimplify(v) for k, v in values.items()})

    def latex(self) -> str:
        """``lhs = expr`` in LaTeX with the nomenclature's short names."""
        import sympy as sp
        body = sp.latex(self.expr, symbol_names=latex_names())
        return f"{self.lhs.latex} = {body}"

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex()}$"

    def _repr_markdown_(self) -> str:
        return (f"$\\displaystyle {self.latex()}$\n\n"
                f"**{self.name}** [{self.unit}]: {self.doc} *Source: {self.source}.*")

    def __repr__(self) -> str:
        return f"Formula({self.name}: {self.lhs.name} = {self.expr}  [{self.unit}])"


def collect(*modules) -> dict[str, Formula]:
    """The formulas defined in ``modules`` (module attributes that are formulas), by
    name; a name defined in two modules is an error."""
    found: dict[str, Formula] = {}
    owner: dict[str, str] = {}
    for module in modules:
        for attr, value in vars(module).items():
            if isinstance(value, Formula) and not attr.startswith("_"):
                if value.name != attr:
                    raise RuntimeError(f"{module.__name__}.{attr} holds formula {value.name!r}: names must match")
                if attr in found and found[attr] is not value:
                    raise RuntimeError(f"formula {attr!r} defined in {owner[attr]} and {module.__name__}")
                found[attr], owner[attr] = value, module.__name__
    return found


_FLOATS = frozenset((float, np.float64))


def _float64(v):
    """An input as float64: floats and float64 arrays as they are (the planners' case),
    anything else converted, so that large integer products cannot overflow."""
    if type(v) is float or (type(v) is np.ndarray and v.dtype == np.float64) or type(v) is np.float64:
        return v
    return np.asarray(v, dtype=np.float64)


def _select(condlist, choicelist, default=np.nan):
    """numpy.select: the first choice whose condition holds, with a fast path for scalars
    (a planner's single configuration evaluates piecewise formulas this way); on arrays as
    ``numpy.where`` from the last condition to the first, which takes any number of
    dimensions (``numpy.select`` stops at 32, and a wide exploration's open grid has more)."""
    if all(np.ndim(c) == 0 for c in condlist) and all(np.ndim(c) == 0 for c in choicelist):
        for cond, choice in zip(condlist, choicelist):
            if cond:
                return choice
        return default
    out = default
    for cond, choice in zip(reversed(condlist), reversed(choicelist)):
        out = np.where(cond, choice, out)
    return out
