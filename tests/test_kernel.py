"""Scalar kernels (:mod:`snlab.kernel`) give what the chains they are traced from give.

Each operation a chain uses is held to numpy's answer (value, NaN, the sign of zero) on
scalars of every kind, or gives up; a branch on a traced value is checked; the planners'
kernels reproduce the chain's whole output row for plans and deployments of the same
structure as the one traced, and ``train`` and ``serve`` return the same result, and the
same errors, from a kernel as from the chain.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools

import numpy as np
import pytest

import snlab
from snlab import grid, kernel
from snlab.errors import SnlabError
from snlab.serving import planner as sp
from snlab.training import planner as tp

VALUES = [-0.0, 0.0, 1.0, 1.5, -2.0, 2.5, 3.0, 7.0, 1e-300, 1e300, np.inf, -np.inf, np.nan]


def _same(got, want) -> bool:
    if np.isnan(want):
        return bool(np.isnan(got))
    return got == want and bool(np.signbit(got)) == bool(np.signbit(want))


def _check(chain, arity: int, values=VALUES, at=(1.5, 2.5)):
    """The kernel of ``chain`` traced at ``at`` gives numpy's answer at every combination
    of ``values``, or gives up; returns how many it answered."""
    names = [f"x{i}" for i in range(arity)]
    k = kernel.trace(chain, dict(zip(names, map(np.float64, at[:arity]))))
    assert k is not None
    answered = 0
    for point in itertools.product(values, repeat=arity):
        inputs = dict(zip(names, map(np.float64, point)))
        try:
            with np.errstate(all="ignore"):
                want = chain(inputs)
        except (OverflowError, ValueError):             # the chain refuses it: so must the kernel
            with pytest.raises(kernel.GIVE_UP):
                k(inputs)
            continue
        try:
            got = k(inputs)
        except kernel.GIVE_UP:
            continue
        answered += 1
        for name in want:
            assert _same(float(got[name]), float(want[name])), (chain, point, name, got[name], want[name])
    return answered


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "pow": lambda a, b: a ** b, "power": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "grid.maximum": grid.maximum, "grid.minimum": grid.minimum,
    "less": lambda a, b: a < b, "greater_equal": lambda a, b: a >= b, "equal": lambda a, b: a == b,
    "where": lambda a, b: grid.where(a > b, a, b), "and": lambda a, b: (a > 1) & (b > 1),
    "or": lambda a, b: (a > 1) | ~(b > 1),
}
UNARY = {
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "round9": lambda a: np.round(a, 9),
    "nearest": grid.nearest, "sqrt": np.sqrt, "log": np.log, "log2": np.log2, "exp": np.exp, "abs": np.abs,
    "exp_dense": lambda a: np.exp(a / 7.0) + np.log1p(a * a) + np.expm1(a / 3.0) + np.log10(a * a + 1.0),
    "negative": lambda a: -a, "isfinite": np.isfinite, "rounded": lambda a: grid.rounded(a) * 1.0,
    "astype": lambda a: (a > 2).astype(float) + a.astype(int) * 0.5 if np.isfinite(a.value if kernel.is_traced(a)
                                                                                     else a) else a,
    "ones_like": lambda a: a * np.ones_like(a) + np.full_like(a, 2.0),
    "clip": lambda a: np.clip(a, 0.0, 2.0), "clip_below": lambda a: np.clip(a, -0.0, None),
    "where_int": lambda a: grid.where(a > 2, a, 0) + np.maximum(a, 1),
    "searchsorted": lambda a: np.choose(np.minimum(np.searchsorted(np.asarray([1.0, 2.0, 4.0]), a), 2),
                                        np.asarray([10.0, 20.0, 40.0])),
}


@pytest.mark.parametrize("name", BINARY)
def test_each_binary_operation_gives_numpys_answer_or_gives_up(name):
    op = BINARY[name]
    assert _check(lambda d: {"y": op(d["x0"], d["x1"])}, 2) > 20


@pytest.mark.parametrize("name", [n for n in UNARY if n != "astype"])
def test_each_unary_operation_gives_numpys_answer_or_gives_up(name):
    op = UNARY[name]
    assert _check(lambda d: {"y": op(d["x0"])}, 1) > 3


def test_a_cast_gives_numpys_answer():
    chain = lambda d: {"y": (d["x0"] > 2).astype(float) + d["x0"].astype(int) * 0.5}  # noqa: E731
    assert _check(chain, 1, values=[-2.5, -0.0, 0.0, 1.5, 2.5, 7.0, 1e10]) == 7


def test_first_broken_and_at_largest_pick_as_numpy_does():
    chain = lambda d: {"first": grid.first_broken([d["x0"] > 2, d["x1"] > 2, d["x0"] > d["x1"]]),  # noqa: E731
                       "largest": grid.at_largest([d["x0"], d["x1"], d["x0"] * 0.5], [1.0, 2.0, 3.0])[0]}
    assert _check(chain, 2, values=[0.0, 1.0, 2.5, 3.0, 7.0]) == 25


def test_a_formula_runs_its_math_compilation():
    from snlab.walls import communication as cm
    f = cm.ring_all_reduce_time
    inputs = {n: np.float64(v) for n, v in zip(f.arg_names, (1e9, 8.0, 1e-6, 4e11, 0.8, 1e-5, 2.0, 3.0, 4.0))}

    def chain(d):
        return {"t": f.evaluate(d)}
    k = kernel.trace(chain, inputs)
    assert k is not None and "_c" in k.source
    for scale in (0.5, 1.0, 3.0):
        moved = {**inputs, "message_bytes": inputs["message_bytes"] * scale}
        assert k(moved)["t"] == chain(moved)["t"]


def test_a_branch_on_a_traced_value_is_checked():
    def chain(d):
        return {"y": d["x0"] * 2 if d["x0"] > 0 else -d["x0"]}
    k = kernel.trace(chain, {"x0": np.float64(3.0)})
    assert k.checks == 1 and k({"x0": 5.0})["y"] == 10.0
    with pytest.raises(kernel.Fallback):
        k({"x0": -1.0})


def test_a_division_by_zero_gives_up_where_numpy_gives_infinity():
    k = kernel.trace(lambda d: {"y": 1.0 / d["x0"]}, {"x0": np.float64(2.0)})
    with pytest.raises(kernel.GIVE_UP):
        k({"x0": 0.0})


@pytest.mark.parametrize("chain", [
    lambda d: {"y": np.sort(d["x0"])},
    lambda d: {"y": (d["x0"] > 1) + (d["x0"] > 2)},                  # numpy adds booleans as 'or'
    lambda d: {"y": np.cumsum(d["x0"])},
    lambda d: {"y": d["x0"] * np.ones(3)},
])
def test_what_a_kernel_cannot_reproduce_gives_no_kernel(chain):
    assert kernel.trace(chain, {"x0": np.float64(3.0)}) is None


#: calls of one structure after which the planners run its kernel
WARM = kernel.Kernels.TRACE_AFTER + 1


def test_kernels_trace_a_key_asked_for_often_and_forget_when_code_reloads():
    kernels = kernel.Kernels()
    make = lambda: lambda d: {"y": d["x0"] + 1.0}  # noqa: E731
    for i in range(kernel.Kernels.TRACE_AFTER):
        assert kernels.run("k", make, {"x0": float(i)}) is None and len(kernels) == 0
    assert kernels.run("k", make, {"x0": 2.0}) == {"y": 3.0} and len(kernels) == 1
    assert kernels.run("k", make, {"x0": 5.0}) == {"y": 6.0}
    assert kernels.run("another", make, {"x0": 5.0}) is None
    kernel.loaded("a module")
    assert kernels.run("k", make, {"x0": 5.0}) is None and len(kernels) == 0


def test_kernels_keep_a_bounded_number_of_keys():
    kernels = kernel.Kernels()
    make = lambda: lambda d: {"y": d["x0"]}  # noqa: E731
    for i in range(kernel.Kernels.LIMIT + 50):
        kernels.run(i, make, {"x0": 1.0})
    assert len(kernels._kernels) <= kernel.Kernels.LIMIT


def test_every_module_a_chain_runs_announces_its_loading():
    """A module missing from :data:`snlab.kernel.WATCHED` could be edited under a kernel
    traced from its old code."""
    import sys
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_globals.get("__name__", ""))
    for m, s, plan in TRAIN_CASES[:4]:
        model, system = tp._resolve(m, s)
        g, hw, _ = tp._grid(model, system, plan, "bf16")
        sys.setprofile(profile)
        try:
            kernel.trace(tp.plan_chain(model, system, hw), g)
        finally:
            sys.setprofile(None)
    for m, s, dep in SERVE_CASES[:4]:
        values, chain = _deployment(m, s, dep)
        sys.setprofile(profile)
        try:
            kernel.trace(chain, values)
        finally:
            sys.setprofile(None)
    ours = {n for n in seen if n.startswith("snlab")} - {"snlab.kernel"}
    assert ours and ours <= kernel.WATCHED, ours - kernel.WATCHED
    walls = {f"snlab.walls.{n}" for n in ("communication", "compute", "memory", "power", "queueing", "serving")}
    assert walls <= kernel.WATCHED


TRAIN_CASES = [
    ("llama3-8b", "dgx-h100", dict(tp=8, global_batch=64)),
    ("llama3-70b", "dgx-h100", dict(tp=8, pp=4, dp=4, global_batch=512, interleave=2)),
    ("deepseek-v3", "gb200-nvl72", dict(tp=1, pp=8, ep=64, dp=64, global_batch=4096, zero=1, recompute="selective")),
    ("mixtral-8x7b", "cloudmatrix384", dict(tp=2, ep=8, dp=16, global_batch=256, zero=3, recompute="full")),
    ("megatron-1t", "dgx-a100", dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072)),
    ("gpt3-175b", "dgx-a100", dict(tp=8, pp=8, dp=4, global_batch=1536, offload="optimizer", overlap="all")),
    ("qwen3-30b-a3b", "dgx-h100", dict(tp=2, ep=8, dp=8, cp=2, global_batch=512, capacity_factor=1.25)),
    ("llama3-405b", "gb200-nvl72", dict(tp=8, pp=8, dp=8, cp=2, global_batch=2048, seq_len=8192)),
]
# continuous fields a kernel of the same structure runs for
MOVES = [dict(global_batch_scale=2), dict(global_batch_scale=4, seq_len=2048), dict(overlap="dp=0.3,tp=0.7"),
         dict(expert_imbalance=1.3), dict(global_batch_scale=8, capacity_factor=2.0)]


def _moved(plan: dict, move: dict) -> dict:
    out = dict(plan)
    scale = move.get("global_batch_scale", 1)
    out["global_batch"] = plan["global_batch"] * scale
    out.update({k: v for k, v in move.items() if k != "global_batch_scale"})
    return out


def _row(chain, inputs):
    with np.errstate(all="ignore"):
        return {k: (v.item() if isinstance(v, np.ndarray) else v) for k, v in chain(inputs).items()}


@pytest.mark.parametrize("m, s, plan", TRAIN_CASES, ids=[f"{m}-{s}" for m, s, _ in TRAIN_CASES])
def test_a_training_kernel_gives_the_chains_row_for_every_plan_of_its_structure(m, s, plan):
    model, system = tp._resolve(m, s)
    g, hw, _ = tp._grid(model, system, plan, "bf16")
    chain = tp.plan_chain(model, system, hw)
    k = kernel.trace(chain, g)
    assert k is not None
    for move in MOVES:
        other = _moved(plan, move)
        if "expert_imbalance" in other and model.moe is None or "capacity_factor" in other and model.moe is None:
            continue
        g2, _, _ = tp._grid(model, system, other, "bf16")
        want, got = _row(chain, g2), k(g2)
        assert set(got) == set(want)
        bad = [n for n in want if not (got[n] == want[n] or (got[n] != got[n] and want[n] != want[n]))]
        assert not bad, (other, [(n, got[n], want[n]) for n in bad[:4]])


SERVE_CASES = [
    ("llama3-70b", "dgx-h100", dict(tp=8, batch=16, prompt_len=1000, output_len=500)),
    ("llama3-8b", "dgx-h100", dict(tp=1, scenario="offline", requests=3000, prompt_len=128, output_len=128)),
    ("deepseek-v3", "cloudmatrix384", dict(dp=32, ep=32, weight_dtype="int8", batch=3072, prompt_len=4096,
                                           output_len=256, draft_tokens=1, acceptance=0.7, microbatches=2)),
    ("deepseek-v3", "dgx-h100", dict(dp=32, ep=32, weight_dtype="fp8", batch=1024, prompt_len=2000,
                                     output_len=100, expert_imbalance=1.25)),
    ("llama3-405b", "gb200-nvl72", dict(tp=4, weight_dtype="fp4", kv_dtype="fp8", scenario="offline",
                                        requests=2000, prompt_len=1000, output_len=2000, graphs=True)),
    ("llama3-70b", "cloudmatrix384", dict(tp=4, pp=2, batch=8, prompt_len=500_000, output_len=100)),
    ("qwen3-235b-a22b", "gb200-nvl72", dict(tp=1, dp=8, ep=8, batch=256, prompt_len=8000, output_len=1000)),
]
SERVE_MOVES = [dict(prompt_len=2.0), dict(output_len=3.0), dict(batch=2.0, prompt_len=0.5), dict(requests=4.0),
               dict(output_len=0.25, batch=0.5)]


def _deployment(m, s, dep):
    model, system = sp._resolve(m, s)
    d, hw, _ = sp._grid(model, system, dep)
    values = {f: getattr(d, f) for f in sp.dp_.Deployment.__dataclass_fields__}
    return values, sp.deployment_chain(model, system, hw)


@pytest.mark.parametrize("m, s, dep", SERVE_CASES, ids=[f"{m}-{s}" for m, s, _ in SERVE_CASES])
def test_a_serving_kernel_gives_the_chains_row_for_every_deployment_of_its_structure(m, s, dep):
    values, chain = _deployment(m, s, dep)
    k = kernel.trace(chain, values)
    assert k is not None
    for move in SERVE_MOVES:
        other = {**dep, **{f: max(1, round(dep[f] * x)) for f, x in move.items() if f in dep}}
        if "batch" in other and "dp" in other:
            other["batch"] = max(other["dp"], other["batch"] // other["dp"] * other["dp"])
        values2, _ = _deployment(m, s, other)
        want, got = _row(chain, values2), k(values2)          # no check fails: the lengths are continuous
        bad = [n for n in want if not (got[n] == want[n] or (got[n] != got[n] and want[n] != want[n]))]
        assert not bad, (other, [(n, got[n], want[n]) for n in bad[:4]])


def test_train_returns_the_same_result_from_its_kernel():
    for m, s, plan in TRAIN_CASES[:5]:
        tp._KERNELS.clear()
        first = snlab.train(m, s, **plan)                # the chain
        again = [snlab.train(m, s, **plan) for _ in range(WARM)]
        assert len(tp._KERNELS) == 1                      # traced, then run
        assert all(dataclasses.asdict(r) == dataclasses.asdict(first) and repr(r) == repr(first) for r in again)
        moved = _moved(plan, MOVES[1])
        through = snlab.train(m, s, **moved)            # the same structure: its kernel
        tp._KERNELS.clear()
        assert dataclasses.asdict(through) == dataclasses.asdict(snlab.train(m, s, **moved))


def test_serve_returns_the_same_result_from_its_kernel():
    sp._KERNELS.clear()
    for m, s, dep in SERVE_CASES:
        first = snlab.serve(m, s, **dep)
        again = [snlab.serve(m, s, **dep) for _ in range(WARM)]
        assert all(dataclasses.asdict(r) == dataclasses.asdict(first) and repr(r) == repr(first) for r in again)
    assert len(sp._KERNELS) >= 5


def test_a_plan_that_breaks_a_rule_gets_the_chains_error_through_a_kernel():
    tp._KERNELS.clear()
    with pytest.raises(SnlabError) as fresh:
        snlab.train("llama3-8b", "dgx-h100", tp=4, dp=2, global_batch=63)
    for _ in range(WARM):
        snlab.train("llama3-8b", "dgx-h100", tp=4, dp=2, global_batch=64)
    assert len(tp._KERNELS) == 1
    with pytest.raises(SnlabError) as through:
        snlab.train("llama3-8b", "dgx-h100", tp=4, dp=2, global_batch=63)
    assert str(through.value) == str(fresh.value)


def test_a_deployment_that_breaks_a_rule_gets_the_chains_error_through_a_kernel():
    sp._KERNELS.clear()
    dep = dict(tp=8, prompt_len=1000, output_len=100)
    with pytest.raises(SnlabError) as fresh:
        snlab.serve("llama3-70b", "dgx-h100", batch=10, dp=4, **dep)
    for _ in range(WARM):
        snlab.serve("llama3-70b", "dgx-h100", batch=16, dp=4, **dep)
    assert len(sp._KERNELS) == 1
    with pytest.raises(SnlabError) as through:
        snlab.serve("llama3-70b", "dgx-h100", batch=10, dp=4, **dep)
    assert str(through.value) == str(fresh.value)


def test_a_reloaded_wall_is_not_run_from_an_old_kernel():
    from snlab.walls import compute
    for _ in range(WARM):
        snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64)
    assert len(tp._KERNELS) >= 1
    importlib.reload(compute)
    snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64)
    assert len(tp._KERNELS) == 0


def test_a_broken_deployment_whose_formula_turns_complex_gets_the_rule_error():
    """A negative acceptance with fractional draft tokens breaks a rule; the math
    compilation of its speculative tokens per step is then a complex number."""
    dep = dict(tp=1, batch=16, prompt_len=1024, output_len=256, draft_tokens=1.5)
    sp._KERNELS.clear()
    with pytest.raises(SnlabError) as fresh:
        snlab.serve("llama3-8b", "dgx-h100", acceptance=-0.5, **dep)
    for _ in range(WARM):
        try:
            snlab.serve("llama3-8b", "dgx-h100", acceptance=0.7, **dep)
        except SnlabError:
            pass
    with pytest.raises(SnlabError) as through:
        snlab.serve("llama3-8b", "dgx-h100", acceptance=-0.5, **dep)
    assert str(through.value) == str(fresh.value)


def test_a_serving_grid_of_more_than_32_dimensions_sweeps():
    frame = snlab.serve_sweep("llama3-70b", "gb200-nvl72", tp=[1, 8], batch=[8, 64], prompt_len=1024,
                              output_len=256, scale_up_bandwidth=[100e9, 900e9], hbm_capacity=[80e9, 192e9],
                              scale_out_bandwidth=[25e9, 50e9], hbm_bandwidth=[3e12, 8e12],
                              scale_up_latency=[1e-6, 2e-6])
    assert len(frame) == 128
    one = snlab.serve("llama3-70b", "gb200-nvl72", tp=8, batch=64, prompt_len=1024, output_len=256,
                      scale_up_bandwidth=900e9, hbm_capacity=192e9, scale_out_bandwidth=50e9, hbm_bandwidth=8e12,
                      scale_up_latency=2e-6)
    assert frame.tpot_s.iloc[-1] == pytest.approx(one.tpot_s, rel=1e-12)


def test_a_plan_under_another_cooling_and_prices_given_as_a_mapping_runs_its_kernel():
    """The cooled system is the same object each time and prices compare by value, so a
    repeated call knows its kernel again; its result is the chain's."""
    tp._KERNELS.clear()
    kwargs = dict(tp=8, pp=4, dp=8, global_batch=512, cooling="liquid", prices={"device_hour": 2.5, "kwh": 0.1})
    first = snlab.train("llama3-70b", "dgx-h100", **kwargs)          # built for air
    again = [snlab.train("llama3-70b", "dgx-h100", **kwargs) for _ in range(WARM)]
    assert len(tp._KERNELS) == 1
    assert first.cost_per_million_tokens_usd is not None
    assert all(dataclasses.asdict(r) == dataclasses.asdict(first) for r in again)
