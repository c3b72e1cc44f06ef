"""Scalar kernels: a planner's vectorised chain, traced once and run as one function.

The planners evaluate a plan through chains of small numpy functions and compiled
formulas (:mod:`snlab.training.step`, :mod:`snlab.serving.step`), written for whole
grids. A single configuration pays for every one of those calls: a few hundred numpy
scalar operations and function calls, each a fraction of a microsecond.

:func:`trace` runs such a chain once on :class:`Traced` inputs. Every numpy operation,
operator and formula call on them is recorded as a line of straight-line Python over
floats (each formula as its ``math`` compilation, :attr:`snlab.formula.Formula.scalar_func`),
and the lines are compiled into one function: the chain's *kernel*. The kernel takes the
chain's numeric inputs (the plan's fields) and returns its outputs, for any values of
those inputs; what the chain fixed while it was traced (the model, the system, and any
value the chain's Python code branched on, such as the divisors of a group size it lays
out) the kernel checks, and it gives up (:class:`Fallback`) when a check fails, as it
does on a division by zero, a logarithm of zero or an overflow: the caller then runs
the chain itself, which gives numpy's answer or the planner's error. A kernel is kept
only when it reproduces the traced outputs exactly.

:class:`Kernels` keeps the kernels of one chain, one per key (the constants and the
structural fields of a plan), and traces a key once it has been asked for a few times,
so that a loop over distinct structures pays one dictionary lookup per call and nothing
else, while a loop over one structure (a slider, a scan of a continuous field) runs its
kernel.
"""

from __future__ import annotations

import bisect
import math
import operator
from typing import Callable, Mapping

import numpy as np


class Untraceable(Exception):
    """The chain did something a scalar kernel cannot reproduce (an array result, a numpy
    function it has no scalar form of, numpy arithmetic on booleans or integers that
    Python's differs from)."""


class Fallback(Exception):
    """A kernel's check failed for these inputs: run the chain itself."""


#: the exceptions after which a caller runs the chain itself
GIVE_UP = (Fallback, ArithmeticError, ValueError, TypeError)

_BOOL_TYPES = (bool, np.bool_)
_INT_TYPES = (int, np.integer)


def _plain(x):
    """A numpy scalar as the Python scalar of its kind (the kernel computes in Python
    floats, ints and bools; IEEE arithmetic gives the same numbers)."""
    if isinstance(x, np.ndarray):
        if x.ndim:
            raise Untraceable("an array constant")
        x = x[()]
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def _scalar(x):
    """A concrete value of a traced operation: a numpy scalar, never an array."""
    if isinstance(x, np.ndarray):
        if x.ndim:
            raise Untraceable("an array result")
        return x[()]
    return x


#: ufuncs the kernel takes from numpy itself, on scalars: ``math``'s differ from numpy's in
#: the last bit for some inputs (IEEE fixes only +, -, *, / and the square root)
_NUMPYS = ("log", "log2", "log10", "exp", "log1p", "expm1", "power")


def _numpys(name: str) -> Callable:
    ufunc = getattr(np, name)

    def call(*args):
        with np.errstate(all="ignore"):
            return ufunc(*args).item()
    return call


class Tape:
    """The lines of a kernel being traced, its constants and its checks.

    Each line is ``(target, expression, operands, kind)``: a value (``kind`` "value"), a
    check on control flow that always stays (``"branch"``), or a check of a value's
    range that stays only while the value is used (``"range"``). An expression already
    on the tape is not computed twice."""

    def __init__(self):
        self.lines: list[tuple] = []
        self.namespace: dict = {"_Fallback": Fallback, "_sqrt": math.sqrt, "_isfinite": math.isfinite,
                                "_copysign": math.copysign, "_pow": math.pow,
                                **{f"_{name}": _numpys(name) for name in _NUMPYS}}
        self._constants: dict = {}
        self._computed: dict[str, str] = {}
        self.inputs: list[str] = []

    def constant(self, x) -> str:
        """The kernel's name for a constant operand."""
        x = _plain(x)
        if isinstance(x, (bool, int, float)) and not (isinstance(x, float) and not math.isfinite(x)):
            return repr(x)
        key = (type(x), x if isinstance(x, (int, float, str)) else id(x))
        name = self._constants.get(key)
        if name is None:
            name = self._constants[key] = f"_c{len(self._constants)}"
            self.namespace[name] = x
        return name

    def operand(self, x) -> str:
        return x.name if type(x) is Traced else self.constant(x)

    def emit(self, template: str, args, value) -> "Traced":
        """Record ``v = template.format(*operands)`` with its concrete value."""
        expression = template.format(*(self.operand(a) for a in args))
        name = self._computed.get(expression)
        if name is None:
            name = self._computed[expression] = f"v{len(self.lines)}"
            self.lines.append((name, expression, [a.name for a in args if type(a) is Traced], "value"))
        return Traced(self, name, _scalar(value))

    def check(self, condition: str, operand: "Traced", kind: str = "branch") -> None:
        """Record a check on ``operand``: the kernel gives up where ``condition`` is false."""
        self.lines.append((None, condition, [operand.name], kind))

    def source(self, results: list[str]) -> tuple[str, int]:
        """The kernel's source returning ``results`` (operands), without the lines
        nothing needs, and its number of checks."""
        live = set(results)
        kept = []
        for target, expression, operands, kind in reversed(self.lines):
            if kind == "range" and operands[0] not in live or kind == "value" and target not in live:
                continue
            live.update(operands)
            kept.append(f"{target} = {expression}" if target else f"if not ({expression}): raise _Fallback")
        kept.reverse()
        head = f"def kernel({', '.join(f'a{i}' for i in range(len(self.inputs)))}):"
        body = "".join(f"    {line}\n" for line in kept)
        return f"{head}\n{body}    return ({', '.join(results)},)\n", sum(line.startswith("if") for line in kept)


def _value(x):
    return x.value if type(x) is Traced else x


def _is_bool(x) -> bool:
    return isinstance(_value(x), _BOOL_TYPES)


def _tape(args) -> Tape:
    return next(a.tape for a in args if type(a) is Traced)


#: numpy ufuncs and the Python expression of each on scalars
_UFUNCS = {
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}", "true_divide": "{0} / {1}",
    "divide": "{0} / {1}", "floor_divide": "{0} // {1}", "remainder": "{0} % {1}", "mod": "{0} % {1}",
    "power": "_power({0}, {1})", "scalar_power": "_pow({0}, {1})", "negative": "-{0}", "positive": "+{0}",
    "absolute": "abs({0})", "fabs": "abs({0})", "square": "{0} * {0}", "reciprocal": "1.0 / {0}",
    "greater": "{0} > {1}", "greater_equal": "{0} >= {1}", "less": "{0} < {1}", "less_equal": "{0} <= {1}",
    "equal": "{0} == {1}", "not_equal": "{0} != {1}",
    "maximum": "({0} if {0} > {1} or {0} != {0} else {1})",       # ties give the second, as numpy
    "minimum": "({0} if {0} < {1} or {0} != {0} else {1})",
    "fmax": "({0} if {0} >= {1} or {1} != {1} else {1})", "fmin": "({0} if {0} <= {1} or {1} != {1} else {1})",
    "floor": "{0} // 1.0", "ceil": "-(-{0} // 1.0)", "rint": "round({0}, 0)",
    "sqrt": "_sqrt({0})", "log": "_log({0})", "log2": "_log2({0})", "log10": "_log10({0})", "exp": "_exp({0})",
    "log1p": "_log1p({0})", "expm1": "_expm1({0})", "isfinite": "_isfinite({0})", "isnan": "{0} != {0}",
    "logical_and": "(bool({0}) and bool({1}))", "logical_or": "(bool({0}) or bool({1}))",
    "logical_not": "(not {0})", "copysign": "_copysign({0}, {1})",
}
#: ufuncs that numpy computes differently on booleans than Python does (a sum of two is
#: their 'or'; a logarithm of one is a float16)
_NOT_ON_BOOLS = frozenset(("add", "subtract", "multiply", "floor_divide", "remainder", "mod", "power",
                           "scalar_power", "negative",
                           "absolute", "square", "floor", "ceil", "rint", "sqrt", *_NUMPYS))
#: ufuncs whose numpy result on integers is not Python's (numpy's wraps at 64 bits, or
#: stays an integer)
_NOT_ON_INTS = frozenset(("reciprocal", "power", "scalar_power", "square"))
#: ufuncs that give one of their operands: numpy's result takes their common type
_PICKS = frozenset(("maximum", "minimum", "fmax", "fmin"))


def _ufunc(name: str, args):
    template = _UFUNCS.get(name)
    if template is None:
        raise Untraceable(f"numpy.{name}")
    bools = [_is_bool(a) for a in args]
    if name in _NOT_ON_BOOLS and (all(bools) or name in _NUMPYS and any(bools)):
        raise Untraceable(f"numpy.{name} of booleans")
    ints = [isinstance(_value(a), _INT_TYPES) and not b for a, b in zip(args, bools)]
    if name in _NOT_ON_INTS and all(i or b for i, b in zip(ints, bools)):
        raise Untraceable(f"numpy.{name} of integers")
    if name in ("floor", "ceil", "rint") and ints[0]:
        template = "float({0})"
    operands = [_value(a) for a in args]
    value = operands[0] ** operands[1] if name == "scalar_power" else getattr(np, name)(*operands)
    if name in _PICKS and isinstance(value, np.floating) and not all(isinstance(_value(a), float) for a in args):
        template = f"float{template}"                   # an int or a bool picked: as numpy's float
    out = _tape(args).emit(template, args, value)
    if name in ("floor", "ceil") and template != "float({0})":
        out.tape.check(f"{out.name} == {out.name}", out, "range")     # of an infinity: numpy's is itself
    return out


def _bitwise(name: str, args):
    """``&``, ``|`` and ``~`` on booleans (on anything else numpy's and Python's differ)."""
    if not all(_is_bool(a) for a in args):
        raise Untraceable(f"numpy.{name} of numbers")
    template = {"bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
                "invert": "(not {0})"}[name]
    value = getattr(np, name)(*(_value(a) for a in args))
    return _tape(args).emit(template, args, value)


def _where(cond, a, b):
    value = np.where(_value(cond), _value(a), _value(b))
    args = (cond, a, b)
    if not any(type(x) is Traced for x in args):
        return value[()]
    template = "({1} if {0} else {2})"
    if value.dtype.kind == "f" and not (isinstance(_value(a), float) and isinstance(_value(b), float)):
        template = f"float{template}"                   # an int or a bool picked: as numpy's float
    elif value.dtype.kind == "i" and not (isinstance(_value(a), _INT_TYPES) and isinstance(_value(b), _INT_TYPES)) \
            or value.dtype.kind not in "fib":
        raise Untraceable("numpy.where of unlike operands")
    return _tape(args).emit(template, args, value)


def _clip(x, low=None, high=None, out=None):
    """``numpy.clip`` of a float: ``low`` below it, ``high`` above, else itself (NaN and
    a signed zero inside the range included)."""
    if out is not None or not all(isinstance(_value(v), float) for v in (x, low, high) if v is not None):
        raise Untraceable("numpy.clip of integers or into an array")
    if low is None or high is None:             # numpy's maximum or minimum, ties to the bound
        return _ufunc("minimum", (x, high)) if low is None else _ufunc("maximum", (x, low))
    value = np.clip(_value(x), _value(low), _value(high))
    return _tape((x, low, high)).emit("({1} if {0} < {1} or {1} != {1} else {2} if {0} > {2} or {2} != {2} "
                                      "else {0})", (x, low, high), value)


def _round(x, decimals=0, out=None):
    """``numpy.round``: to decimals as numpy does it (scaled, rounded half to even,
    scaled back)."""
    if out is not None or type(decimals) is not int or decimals < 0:
        raise Untraceable("numpy.round with out or negative decimals")
    if decimals == 0 or isinstance(_value(x), _INT_TYPES):
        return _ufunc("rint", (x,)) if decimals == 0 else x
    scale = 10.0 ** decimals
    value = np.round(_value(x), decimals)
    return x.tape.emit("round({0} * {1}, 0) / {1}", (x, scale), value)


def _truth(x):
    """``numpy.any`` or ``numpy.all`` of one scalar: whether it is true."""
    if type(x) is not Traced:
        return np.bool_(x)
    return x if _is_bool(x) else x.tape.emit("bool({0})", (x,), np.bool_(x.value))


def _itself(x, axis=None):
    """``numpy.max`` or ``min`` of one scalar: the scalar."""
    if axis not in (None, 0, -1, ()):
        raise Untraceable("a reduction along an axis")
    return x


def _broadcast_to(x, shape, subok=False):
    if tuple(shape) != ():
        raise Untraceable("numpy.broadcast_to a shape")
    return x


def _searchsorted(a, v, side="left", sorter=None):
    """``numpy.searchsorted`` of a traced value in a constant sorted array (NaN sorts last)."""
    if type(a) is Traced or type(v) is not Traced or sorter is not None or np.ndim(a) != 1:
        raise Untraceable("numpy.searchsorted of a traced array")
    values = [_plain(x) for x in np.asarray(a)]
    tape = v.tape
    search = tape.constant(bisect.bisect_left if side == "left" else bisect.bisect_right)
    return tape.emit(f"({len(values)} if {{0}} != {{0}} else {search}({{1}}, {{0}}))", (v, tuple(values)),
                     np.int64(np.searchsorted(a, v.value, side=side)))


def _choose(index, choices, out=None, mode="raise"):
    """``numpy.choose`` of a constant list of scalars by a traced index."""
    if type(index) is not Traced or out is not None or mode != "raise" or np.ndim(choices) != 1:
        raise Untraceable("numpy.choose of traced choices")
    values = tuple(_plain(x) for x in np.asarray(choices))
    return index.tape.emit("{1}[{0}]", (index, values), np.choose(index.value, choices))


def _like(fill):
    def like(x, *args, dtype=None, **kwargs):
        if kwargs.get("shape") not in (None, ()):
            raise Untraceable("an array like a traced value")
        value = fill(_value(x), *args, dtype=dtype)
        if args and type(args[0]) is Traced:        # full_like(x, traced): the value, in x's type
            if np.asarray(value).dtype != np.asarray(args[0].value).dtype:
                raise Untraceable("numpy.full_like casting a traced value")
            return args[0]
        return _scalar(value)
    return like


_FUNCTIONS: dict = {
    np.ones_like: _like(np.ones_like), np.zeros_like: _like(np.zeros_like),
    np.full_like: _like(lambda x, v, dtype=None: np.full_like(x, _value(v), dtype=dtype)),
    np.searchsorted: _searchsorted, np.choose: _choose,
    np.where: _where, np.ndim: lambda x: 0, np.shape: lambda x: (),
    np.clip: _clip, np.round: _round, np.broadcast_to: _broadcast_to, np.max: _itself, np.min: _itself,
    np.isfinite: lambda x: _ufunc("isfinite", (x,)), np.any: lambda x, axis=None: _truth(x),
    np.all: lambda x, axis=None: _truth(x),
}


class Traced:
    """A scalar the chain computes from the kernel's inputs: its name in the kernel and
    its value for the inputs being traced."""

    __slots__ = ("tape", "name", "value")
    __array_priority__ = 1e9

    def __init__(self, tape: Tape, name: str, value):
        self.tape, self.name, self.value = tape, name, value

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            raise Untraceable(f"numpy.{ufunc.__name__}.{method}")
        name = ufunc.__name__
        if name in ("bitwise_and", "bitwise_or", "bitwise_xor", "invert"):
            return _bitwise(name, inputs)
        return _ufunc(name, inputs)

    def __array_function__(self, func, types, args, kwargs):
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise Untraceable(f"numpy.{func.__name__}")
        return handler(*args, **kwargs)

    def __array__(self, dtype=None, copy=None):
        # the chain needs the number itself (for example to list a group size's
        # divisors): the kernel holds for this value only
        return np.asarray(self._fixed(), dtype=dtype)

    def __bool__(self):
        truth = bool(self.value)
        self.tape.check(self.name if truth else f"not {self.name}", self)
        return truth

    def _fixed(self):
        """The value itself, which the kernel then checks."""
        self.tape.check(f"{self.name} == {self.tape.constant(self.value)}", self)
        return self.value

    def __float__(self):
        return float(self._fixed())

    def __int__(self):
        return int(self._fixed())

    def __index__(self):
        return operator.index(self._fixed())

    def __round__(self, ndigits=None):
        if ndigits is not None:
            raise Untraceable("round() to digits")
        return rounded(self)

    def astype(self, dtype, copy=True):
        kind = np.dtype(dtype).kind
        if kind == "f":
            return self.tape.emit("float({0})", (self,), np.float64(self.value))
        if kind in "iu":
            return self.tape.emit("int({0})", (self,), np.int64(self.value))
        if kind == "b":
            return self.tape.emit("bool({0})", (self,), np.bool_(self.value))
        raise Untraceable(f"astype({dtype})")

    @property
    def ndim(self):
        return 0

    @property
    def shape(self):
        return ()

    def item(self):
        raise Untraceable("item() of a traced value")

    def __repr__(self):
        return f"Traced({self.name}={self.value!r})"

    def __hash__(self):
        raise Untraceable("a traced value as a key")


def _binary(name):
    if name == "scalar_power":      # ``**``: C's pow, as numpy's scalars compute it (its ufunc may differ)
        return (lambda self, other: _ufunc(name, (self, other)), lambda self, other: _ufunc(name, (other, self)))

    def forward(self, other):
        return self.__array_ufunc__(getattr(np, name), "__call__", self, other)

    def reverse(self, other):
        return self.__array_ufunc__(getattr(np, name), "__call__", other, self)
    return forward, reverse


for _op, _ufunc_name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                         ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "scalar_power"),
                         ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    _f, _r = _binary(_ufunc_name)
    setattr(Traced, f"__{_op}__", _f)
    setattr(Traced, f"__r{_op}__", _r)
for _op, _ufunc_name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                         ("eq", "equal"), ("ne", "not_equal")):
    setattr(Traced, f"__{_op}__", _binary(_ufunc_name)[0])
Traced.__neg__ = lambda self: _ufunc("negative", (self,))
Traced.__pos__ = lambda self: _ufunc("positive", (self,))
Traced.__abs__ = lambda self: _ufunc("absolute", (self,))
Traced.__invert__ = lambda self: _bitwise("invert", (self,))


def rounded(x) -> Traced:
    """The nearest whole number as an int (:func:`snlab.grid.rounded` on a traced value)."""
    value = np.int64(round(float(x.value)))
    out = x.tape.emit("round({0})", (x,), value)
    x.tape.check(f"{-2 ** 63} <= {out.name} < {2 ** 63}", out, "range")    # an int64, or numpy's OverflowError
    return out


def is_traced(x) -> bool:
    return type(x) is Traced


def formula_call(formula, args: tuple) -> Traced:
    """A compiled formula's value at traced inputs: a call of its ``math`` compilation
    in the kernel, given up when that gives NaN (as :meth:`Formula.__call__` then takes
    numpy's answer instead)."""
    value = formula(**dict(zip(formula.arg_names, (_value(a) for a in args))))
    tape = _tape(args)
    name = tape.constant(formula.scalar_func)
    # as a float, as the formula gives it (a comparison's True as 1.0; a complex number,
    # which a power of a negative base gives in math, is a TypeError: the kernel gives up)
    out = tape.emit(f"float({name}(" + ", ".join("{%d}" % i for i in range(len(args))) + "))", args, value)
    tape.check(f"{out.name} == {out.name}", out, "range")
    return out


def trace(chain: Callable[[dict], Mapping], inputs: Mapping[str, float]) -> Callable | None:
    """The :class:`Kernel` of ``chain`` (a function of a dict of named scalars returning a
    dict of outputs) traced at ``inputs``: called with a dict of the same names, it gives
    the dict of outputs; None when the chain cannot be traced or the kernel does not
    reproduce its outputs (the caller then runs the chain, which gives its own answer or
    error)."""
    tape = Tape()
    traced = {}
    for i, (name, value) in enumerate(inputs.items()):
        tape.inputs.append(name)
        traced[name] = Traced(tape, f"a{i}", _scalar(np.asarray(value)))
    try:
        with np.errstate(all="ignore"):
            out = dict(chain(traced))
        names = tuple(out)
        source, checks = tape.source([tape.operand(out[k]) for k in names])
    except Exception:       # Untraceable, or an error the chain itself raises on these inputs
        return None
    namespace = dict(tape.namespace)
    order = tuple(inputs)
    try:
        exec(compile(source, "<snlab kernel>", "exec"), namespace)
        fn = namespace["kernel"]
        got = fn(*(_plain(inputs[k]) for k in order))
    except Exception:
        return None
    expected = [_plain(_value(out[k])) for k in names]
    for a, b in zip(got, expected):
        if not (a == b or (a != a and b != b)) or type(a) is bool and type(b) is not bool:
            return None
    return Kernel(fn, order, names, source, checks)


class Kernel:
    """A traced chain: ``kernel(inputs)`` is the dict of its outputs (Python scalars),
    or raises one of :data:`GIVE_UP`."""

    __slots__ = ("fn", "order", "names", "source", "checks")

    def __init__(self, fn, order, names, source, checks):
        self.fn, self.order, self.names, self.source, self.checks = fn, order, names, source, checks

    def __call__(self, inputs: Mapping) -> dict:
        return dict(zip(self.names, self.fn(*[float(inputs[k]) for k in self.order])))


#: times the code kernels are traced through was (re)loaded; kernels older than it are
#: forgotten, so that a reloaded or edited module (``importlib.reload``, IPython's
#: ``%autoreload``) computes with its new code
GENERATION = 0
#: the modules that announce their loading (:func:`loaded`)
WATCHED: set[str] = set()


def loaded(module: str) -> None:
    """Called by each module that chains trace through, as it loads: the kernels traced
    before may run its old code."""
    global GENERATION
    GENERATION += 1
    WATCHED.add(module)


class Kernels:
    """The kernels of one chain, by key: :meth:`run` gives the chain's outputs from the
    key's kernel, traced once the key has been asked for :attr:`TRACE_AFTER` times; None
    where there is none (the caller runs the chain itself)."""

    #: keys kept before the oldest are forgotten
    LIMIT = 256
    #: calls of a key that run the chain before its kernel is traced: tracing costs about
    #: 30 chain calls (10 ms against 0.35 ms), which a kernel (0.1 ms a call) earns back in
    #: about 40 more, so a structure asked for only a few times is never traced
    TRACE_AFTER = 16

    def __init__(self):
        self._kernels: dict = {}
        self._generation = GENERATION

    def run(self, key, make_chain: Callable[[], Callable[[dict], Mapping]], inputs: Mapping,
            refs: tuple = ()) -> dict | None:
        """The outputs at ``inputs`` of the chain ``make_chain()`` builds, from the kernel of
        ``key``; ``refs``: the objects whose identities the key holds, kept alive with it."""
        if self._generation != GENERATION:
            self._kernels.clear()
            self._generation = GENERATION
        found = self._kernels.get(key)
        if found is None:
            if len(self._kernels) >= self.LIMIT:        # the oldest key goes
                del self._kernels[next(iter(self._kernels))]
            self._kernels[key] = [1, refs]
            return None
        state = found[0]
        if type(state) is not Kernel:
            if state is None or state < self.TRACE_AFTER:       # untraceable, or not asked for enough
                if state is not None:
                    found[0] = state + 1
                return None
            found[0] = state = trace(make_chain(), inputs)
            if state is None:
                return None
        try:
            return state(inputs)
        except GIVE_UP:
            return None

    def clear(self) -> None:
        self._kernels.clear()

    def __len__(self) -> int:
        return sum(type(k[0]) is Kernel for k in self._kernels.values())
