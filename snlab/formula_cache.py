"""Compiled formulas kept on disk, keyed on what they are compiled from.

Compiling every formula with ``sympy.lambdify`` (and importing sympy to do it) is most of
what a fresh process spends on its first planner call. The numbers only need the code
lambdify generates, so that code is kept in a cache directory and read back:

* a formula's **record** holds the code of its compiled functions (the numpy and the
  ``math`` one, each as a marshalled code object with the origin of every global name it
  reads) and its argument names. It is keyed on the formula's content: the ``srepr`` of
  its sympy expression, its argument order and what it defines (:meth:`Formula.key
  <snlab.formula.Formula.key>`); a partial formula on its parent's key and the values fixed.
* a formula module's **record** (:class:`snlab.walls.loader.FormulaModuleLoader`) holds its formulas' names,
  units, sources, argument names and keys. It is keyed on the source text of every formula
  module, so that a module is filled from its record without running (or importing sympy)
  while none of them has changed; its expressions are built when first asked for, by
  running the module's code apart.

Every key also covers this package's compiling code (``formula.py``, ``symbols.py`` and
this file), the Python, numpy and sympy versions and :data:`FORMAT`: a cached entry is
found only for exactly what would compile to it, so none can be stale. An entry is
checked against its own SHA-256 digest when read; a damaged, unreadable or unwritable
cache is ignored and the formulas compile in memory as they would without one.

Where: ``$SNLAB_CACHE_DIR`` if set (empty: no disk cache), else ``$XDG_CACHE_HOME/snlab``,
else ``~/.cache/snlab``; entries go into its ``formulas`` folder.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.util
import marshal
import os
import re
import sys
import types
from pathlib import Path
from typing import Callable
from . import kernel as _kernel

_kernel.loaded(__name__)

#: the layout of entries and keys: change it to set every cached entry aside
FORMAT = "snlab-formula-cache-1"
#: the environment variable naming the cache directory (empty: no disk cache)
ENV = "SNLAB_CACHE_DIR"
#: what every entry file starts with, before the SHA-256 digest of its payload
MAGIC = b"SNLABFC1"
#: the modules the global names of compiled code may come from
ORIGINS = ("math", "numpy", "builtins", "functools", "snlab.formula")
#: the sources of the compiling code, next to this file, that every key covers
COMPILER_SOURCES = ("formula.py", "formula_cache.py", "symbols.py")

_HERE = Path(__file__).parent
_usable: dict[str, bool] = {}
_base: list[str] = []
_generation = [object()]


def generation() -> object:
    """A token that changes whenever a formula module is loaded again (:func:`loaded`):
    values memoised from formulas are kept only while it is the same."""
    return _generation[0]


def loaded() -> None:
    """Say that a formula module was (re)loaded: :func:`generation` changes."""
    _generation[0] = object()


def directory() -> Path | None:
    """The folder of cached formulas, created if need be; None when there is none to use
    (``SNLAB_CACHE_DIR`` empty, or the folder cannot be created or written)."""
    root = os.environ.get(ENV)
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "snlab") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "snlab")
    if not root:
        return None
    folder = os.path.join(root, "formulas")
    ok = _usable.get(folder)
    if ok is None:
        try:
            os.makedirs(folder, exist_ok=True)
            ok = os.access(folder, os.W_OK | os.X_OK)
        except OSError:
            ok = False
        _usable[folder] = ok
    return Path(folder) if ok else None


def _sympy_version() -> str:
    """sympy's version, read from its ``release.py`` without importing it."""
    module = sys.modules.get("sympy")
    spec = module.__spec__ if module is not None else importlib.util.find_spec("sympy")
    if spec is None or spec.origin is None:
        return "no sympy"
    try:
        text = (Path(spec.origin).parent / "release.py").read_text(encoding="utf-8")
    except OSError:
        text = ""
    found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", text)
    if found:
        return found.group(1)
    import sympy                # a layout without release.py: ask sympy itself
    return sympy.__version__


def base() -> str:
    """What every key covers: :data:`FORMAT`, the Python, numpy and sympy versions and the
    source text of the compiling code (:data:`COMPILER_SOURCES`). Read once per process."""
    if not _base:
        import numpy
        digest = hashlib.sha256()
        for name in COMPILER_SOURCES:
            digest.update((_HERE / name).read_bytes())
        _base.append("|".join((FORMAT, sys.version, sys.implementation.cache_tag, f"numpy {numpy.__version__}",
                               f"sympy {_sympy_version()}", digest.hexdigest())))
    return _base[0]


def key(*parts: str | bytes) -> str:
    """A cache key: the SHA-256 of :func:`base` and ``parts``, each length-prefixed."""
    digest = hashlib.sha256()
    for part in (base(), *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def encode(name: str, value: dict) -> bytes:
    """An entry as stored: :data:`MAGIC`, the SHA-256 of the payload, the payload (the
    marshalled ``value`` with its key)."""
    payload = marshal.dumps({**value, "key": name})
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode(name: str, data: bytes) -> dict | None:
    """The value of a stored entry; None unless it is whole, undamaged and of this key."""
    head = len(MAGIC)
    if data[:head] != MAGIC or hashlib.sha256(data[head + 32:]).digest() != data[head:head + 32]:
        return None
    try:
        value = marshal.loads(data[head + 32:])
    except (EOFError, ValueError, TypeError):
        return None
    return value if isinstance(value, dict) and value.get("key") == name else None


def load(name: str) -> dict | None:
    """The cached entry of key ``name``, or None (no cache, no entry, or a damaged one)."""
    folder = directory()
    if folder is None:
        return None
    try:
        data = (folder / name).read_bytes()
    except OSError:
        return None
    return decode(name, data)


def store(name: str, value: dict) -> bool:
    """Write the entry of key ``name`` whole (a temporary file renamed into place), and
    say whether it was written; a cache that cannot be written is left as it is."""
    folder = directory()
    if folder is None:
        return False
    temporary = folder / f".{name}.{os.getpid()}.tmp"
    try:
        temporary.write_bytes(encode(name, value))
        os.replace(temporary, folder / name)
    except (OSError, ValueError):
        try:
            temporary.unlink()
        except OSError:
            pass
        return False
    return True


# --- compiled functions ---------------------------------------------------------------

def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _origin(name: str, value) -> tuple[str, str] | None:
    """The (module, attribute) of :data:`ORIGINS` that holds ``value``: the same name
    first, else any attribute holding that very object; None if none does."""
    for module_name in ORIGINS:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, name, None) is value:
            return module_name, name
    for module_name in ORIGINS:
        module = sys.modules.get(module_name)
        for attr, held in vars(module).items() if module is not None else ():
            if held is value:
                return module_name, attr
    return None


def function_record(fn: Callable) -> dict | None:
    """A generated function as a cache record: its code and, for each global name the
    code reads, the module attribute it is bound to; None when some name is bound to
    something no module of :data:`ORIGINS` holds (such a function is not cached)."""
    code = getattr(fn, "__code__", None)
    if code is None or fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__:
        return None
    bound = {}
    for name in sorted(_global_names(code)):
        if name not in fn.__globals__:
            if hasattr(builtins, name):
                continue                          # found among the builtins, as at run time
            return None
        origin = _origin(name, fn.__globals__[name])
        if origin is None:
            return None
        bound[name] = origin
    return {"code": code, "globals": bound}


def function_from(record) -> Callable | None:
    """The function of a :func:`function_record`, its globals bound again; None when the
    record is not one or a name cannot be bound."""
    try:
        namespace = {"__builtins__": builtins}
        for name, (module, attr) in record["globals"].items():
            namespace[name] = getattr(importlib.import_module(module), attr)
        code = record["code"]
        if not isinstance(code, types.CodeType):
            return None
        return types.FunctionType(code, namespace, code.co_name)
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        return None
