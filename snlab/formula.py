"""A formula: one sympy expression, shown as LaTeX, compiled once into numpy.

Every formula in snlab is a :class:`Formula`. The expression is the single source of
truth: ``formula.latex()`` prints it, ``formula.subs(...)`` evaluates it exactly in
sympy, and ``formula(...)`` evaluates the same expression compiled with
``sympy.lambdify`` (explicit argument order, ``cse=True``, compiled on first use and
kept). Numeric calls broadcast: pass numpy arrays to evaluate a whole grid at once.
"""

from __future__ import annotations

from functools import cached_property
from typing import Callable, Mapping

import numpy as np
import sympy as sp

from .errors import SnlabError
from .symbols import LATEX_NAMES, NOMENCLATURE, ORDER

REGISTRY: dict[str, "Formula"] = {}


class Formula:
    """A named quantity ``lhs = expr`` with its unit and source.

    Parameters
    ----------
    name : str
        Registry key, e.g. ``"ring_all_reduce_time"``.
    lhs : str
        Nomenclature name of the quantity it defines (gives LaTeX name and unit).
    expr : sympy.Expr
        The expression, in nomenclature symbols only.
    source : str
        Where it comes from (paper, equation or table).
    """

    def __init__(self, name: str, lhs: str, expr: sp.Expr, source: str, doc: str = "",
                 register: bool = True):
        unknown = [s.name for s in expr.free_symbols if s.name not in NOMENCLATURE]
        if unknown:
            raise RuntimeError(f"formula {name}: symbols not in the nomenclature: {unknown}")
        if register and name in REGISTRY:
            raise RuntimeError(f"formula {name!r} defined twice")
        self.name = name
        self.lhs = NOMENCLATURE[lhs]
        self.expr = expr
        self.source = source
        self.doc = doc
        self.args: tuple[sp.Symbol, ...] = tuple(
            sorted(expr.free_symbols, key=lambda s: ORDER[s.name]))
        self.arg_names: tuple[str, ...] = tuple(s.name for s in self.args)
        if register:
            REGISTRY[name] = self

    @property
    def unit(self) -> str:
        return self.lhs.unit

    @cached_property
    def func(self) -> Callable[..., np.ndarray]:
        """The expression compiled to a numpy function of ``self.args`` (positional)."""
        return sp.lambdify(self.args, self.expr, modules="numpy", cse=True)

    def __call__(self, **values) -> np.ndarray | float:
        """Evaluate numerically; keyword names are the nomenclature's long names.

        Arrays broadcast against each other. Inputs are converted to float64 so
        that large products (B s L h^2) cannot overflow integer arithmetic.
        """
        missing = [n for n in self.arg_names if n not in values]
        if missing:
            raise SnlabError(self.name, "missing input " + ", ".join(missing),
                             "inputs: " + ", ".join(self.arg_names))
        extra = [n for n in values if n not in self.arg_names]
        if extra:
            raise SnlabError(self.name, "unexpected input " + ", ".join(extra),
                             "inputs: " + ", ".join(self.arg_names))
        out = self.func(*(np.asarray(values[n], dtype=np.float64) for n in self.arg_names))
        out = np.asarray(out, dtype=np.float64)
        return out[()] if out.ndim == 0 else out

    def evaluate(self, values: Mapping[str, object]) -> np.ndarray | float:
        """Evaluate with the inputs this formula needs taken from a larger mapping."""
        missing = [n for n in self.arg_names if n not in values]
        if missing:
            raise SnlabError(self.name, "missing input " + ", ".join(missing),
                             "inputs: " + ", ".join(self.arg_names))
        return self(**{n: values[n] for n in self.arg_names})

    def partial(self, **values) -> "Formula":
        """The same formula with some inputs fixed to exact values, compiled apart.

        Fixing a selector (``recompute=2``) collapses a piecewise expression to one
        branch, so the numeric function evaluates only that branch. Cached per values.
        """
        key = tuple(sorted(values.items()))
        cache = self.__dict__.setdefault("_partials", {})
        if key not in cache:
            expr = self.subs(**values)
            cache[key] = Formula(f"{self.name}[{', '.join(f'{k}={v}' for k, v in key)}]", self.lhs.name,
                                 expr, self.source, self.doc, register=False)
        return cache[key]

    def subs(self, **values) -> sp.Expr:
        """Substitute exact values symbolically (integers and fractions stay exact)."""
        return self.expr.subs({NOMENCLATURE[k].symbol: sp.nsimplify(v) for k, v in values.items()})

    def latex(self) -> str:
        """``lhs = expr`` in LaTeX with the nomenclature's short names."""
        body = sp.latex(self.expr, symbol_names=LATEX_NAMES)
        return f"{self.lhs.latex} = {body}"

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex()}$"

    def _repr_markdown_(self) -> str:
        return (f"$\\displaystyle {self.latex()}$\n\n"
                f"**{self.name}** [{self.unit}]: {self.doc} *Source: {self.source}.*")

    def __repr__(self) -> str:
        return f"Formula({self.name}: {self.lhs.name} = {self.expr}  [{self.unit}])"


def formulas() -> dict[str, Formula]:
    """Every formula defined by the three walls, by name."""
    from . import walls  # noqa: F401  (importing the walls registers their formulas)
    return dict(REGISTRY)
