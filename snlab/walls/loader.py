"""How the wall modules are loaded: from their cached records while their sources are
unchanged (:mod:`snlab.formula_cache`), else by running them.

A wall module filled from its record holds :class:`~snlab.formula.Formula` objects with
their names, units, sources, argument names and content keys, whose compiled code is
read from the cache; it does not run, and sympy is not imported, until an expression (or
another name of the module, such as a symbol it names) is asked for. Then the module's
code runs once in a namespace of its own, and the expression asked for is checked to be
the one the record was made from.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Callable, Iterable

from .. import kernel
from ..formula import Formula
from ..formula_cache import directory, key, load, loaded, store

kernel.loaded(__name__)


class FormulaModuleLoader:
    """Runs a module of formulas, or fills it from its cached record.

    The record of a module (its formulas' names, the quantities they define, sources,
    argument names and keys, and its docstring) is keyed on the source of every module in
    ``siblings`` (the formula modules, which may build on each other) and
    :func:`snlab.formula_cache.base`.
    Filled from it, the module holds :class:`~snlab.formula.Formula` objects whose
    expressions are built when first asked for, by running the module's code in a
    namespace of its own (:meth:`definitions`), as are its other names (the symbols it
    names, its helper expressions). Anything else the module loader does (its source,
    code and file name) is the source loader's.
    """

    def __init__(self, loader: importlib.machinery.SourceFileLoader, siblings: Iterable[Path]):
        self.loader = loader
        self.siblings = tuple(siblings)
        self.namespace: dict = {}

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return None

    def module_key(self, name: str) -> str:
        """The key of module ``name``'s record: the source of every formula module."""
        return key("module", name, *(path.read_bytes() for path in self.siblings))

    def exec_module(self, module: types.ModuleType) -> None:
        loaded()
        kernel.loaded(module.__name__)          # kernels traced before may hold its old formulas
        try:
            entry = self.module_key(module.__name__)
        except OSError:                         # a source that cannot be read: run the module
            entry = None
        record = load(entry) if entry else None
        if record is not None and self.fill(module, record):
            return
        self.loader.exec_module(module)
        if entry and directory() is not None:
            store(entry, record_of(module))

    def fill(self, module: types.ModuleType, record: dict) -> bool:
        """Put the record's formulas into ``module``; False for a record of another shape."""
        try:
            formulas = [Formula.cached(name, lhs, tuple(args), source, doc, formula_key,
                                       self.expression(module, attr, formula_key))
                        for attr, name, lhs, args, source, doc, formula_key in record["formulas"]]
            attrs = [row[0] for row in record["formulas"]]
            doc = record["doc"]
        except (KeyError, TypeError, ValueError):
            return False
        module.__doc__ = doc
        for attr, formula in zip(attrs, formulas):
            setattr(module, attr, formula)
        module.__getattr__ = self.attribute(module)
        return True

    def definitions(self, module: types.ModuleType) -> dict:
        """The namespace of the module's own code, run once (apart from the module) when
        an expression or another name of a module filled from its record is asked for."""
        if not self.namespace:
            namespace = {"__name__": module.__name__, "__file__": module.__file__,
                         "__package__": module.__package__, "__spec__": module.__spec__,
                         "__loader__": module.__loader__, "__builtins__": builtins}
            exec(self.loader.get_code(module.__name__), namespace)
            self.namespace.update(namespace)
        return self.namespace

    def expression(self, module: types.ModuleType, attr: str, formula_key: str) -> Callable:
        """The builder of formula ``attr``'s expression: the module's code run apart, its
        formula's expression, which must be the one the cached record was made from."""
        def build():
            formula = self.definitions(module)[attr]
            if formula.key != formula_key:
                raise RuntimeError(f"{module.__name__}.{attr} changed since the module was loaded: reload it")
            return formula.expr
        return build

    def attribute(self, module: types.ModuleType) -> Callable:
        def __getattr__(name: str):
            if not (name.startswith("__") and name.endswith("__")):
                namespace = self.definitions(module)
                if name in namespace:
                    return namespace[name]
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        return __getattr__


def record_of(module: types.ModuleType) -> dict:
    """A module's record: its docstring and, for each formula it holds, its attribute,
    name, the quantity it defines, argument names, source, doc and key."""
    return {"doc": module.__doc__,
            "formulas": [(attr, f.name, f.lhs.name, list(f.arg_names), f.source, f.doc, f.key)
                         for attr, f in vars(module).items() if isinstance(f, Formula)]}


class FormulaModuleFinder:
    """Finds the formula modules ``package.<name>`` for ``name`` in ``names`` as the path
    finder does, and has :class:`FormulaModuleLoader` load them."""

    def __init__(self, package: str, names: Iterable[str]):
        self.package = package
        self.names = tuple(names)
        self.modules = frozenset(f"{package}.{name}" for name in self.names)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in self.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        folder = Path(spec.origin).parent
        spec.loader = FormulaModuleLoader(spec.loader, [folder / f"{name}.py" for name in self.names])
        return spec

    def invalidate_caches(self) -> None:
        pass


def install(package: str, names: Iterable[str]) -> FormulaModuleFinder:
    """Load the formula modules ``package.<name>`` through :class:`FormulaModuleLoader`
    (installed once per package: installing again replaces the finder)."""
    finder = FormulaModuleFinder(package, names)
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (type(f).__name__ == "FormulaModuleFinder" and getattr(f, "package", None) == package)]
    sys.meta_path.insert(0, finder)
    return finder
