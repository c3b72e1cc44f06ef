"""Every formula: the compiled numpy function agrees with exact sympy substitution,
shows itself as LaTeX, and broadcasts over arrays."""

import math

import numpy as np
import pytest
import sympy as sp

from snlab.errors import SnlabError
from snlab.walls import formulas
from snlab.symbols import NOMENCLATURE

ALL = formulas()

# Representative exact inputs: integers for counts, fractions for efficiencies.
SAMPLE = {
    "zero_stage": 2, "recompute": 1, "sequence_parallel": 1, "interleave": 2,
    "bias": 1, "learned_positions": 1, "dropout": 1, "mlp_matrices": 3, "norm_params": 2,
    "embedding_copies": 2, "q_lora_rank": 1536, "dense_layers": 3, "layers": 61,
    "gemm_efficiency": sp.Rational(4, 5), "memory_efficiency": sp.Rational(9, 10),
    "sustained_clock": sp.Rational(4, 5), "link_efficiency": sp.Rational(3, 4),
    "inner_efficiency": sp.Rational(4, 5), "outer_efficiency": sp.Rational(9, 10),
    "overlap": sp.Rational(1, 2), "causal_fraction": sp.Rational(1, 2),
    "latency": sp.Rational(5, 10**6), "inner_latency": sp.Rational(1, 10**6),
    "outer_latency": sp.Rational(10, 10**6), "call_latency": sp.Rational(66, 10**7), "group_size": 16, "inner_size": 8,
    "outer_size": 4, "time": sp.Rational(3, 1000),
    # request queues: a stable server (utilization below 1) and probabilities below 1
    "arrival_rate": 5, "service_time": sp.Rational(1, 10), "arrival_scv": 1, "service_scv": sp.Rational(1, 2),
    "utilization": sp.Rational(1, 2), "quantile_level": sp.Rational(9, 10), "attainment": sp.Rational(9, 10),
    "cache_hit_rate": sp.Rational(2, 5),
}


def sample_value(name: str, i: int):
    if name in SAMPLE:
        return SAMPLE[name]
    return 7 + 13 * i  # distinct positive integers


@pytest.mark.parametrize("name", sorted(ALL))
def test_compiled_matches_symbolic(name):
    f = ALL[name]
    values = {n: sample_value(n, i) for i, n in enumerate(f.arg_names)}
    exact = f.subs(**values)
    assert exact.free_symbols == set()
    numeric = f(**{k: float(v) for k, v in values.items()})
    assert numeric == pytest.approx(float(exact), rel=1e-9)


@pytest.mark.parametrize("name", sorted(ALL))
def test_latex_uses_short_names(name):
    text = ALL[name].latex()
    assert "=" in text
    for arg in ALL[name].args:
        assert NOMENCLATURE[arg.name].latex in text, arg.name
        assert arg.name not in text or len(arg.name) == 1
    assert ALL[name]._repr_latex_().startswith("$")


@pytest.mark.parametrize("name", sorted(ALL))
def test_broadcasts_over_arrays(name):
    f = ALL[name]
    values = {n: float(sample_value(n, i)) for i, n in enumerate(f.arg_names)}
    first = f.arg_names[0]
    grid = dict(values, **{first: np.array([values[first], values[first]])})
    out = f(**grid)
    assert np.shape(out) == (2,) and np.all(out == out[0])


def test_missing_and_unexpected_inputs_name_the_field():
    f = ALL["ring_all_reduce_time"]
    with pytest.raises(SnlabError, match="missing input .*group_size"):
        f(message_bytes=1, latency=0, link_bandwidth=1, link_efficiency=1, call_latency=0)
    with pytest.raises(SnlabError, match="unexpected input bogus"):
        f(message_bytes=1, group_size=2, latency=0, link_bandwidth=1, link_efficiency=1, call_latency=0, bogus=3)


def test_every_formula_cites_a_source():
    for f in ALL.values():
        assert len(f.source) > 8 and f.doc, f.name


def test_large_products_do_not_overflow():
    """B s L h^2 for a trillion-parameter step exceeds int64 if computed in integers."""
    f = ALL["model_step_flops"]
    out = f(tokens=np.int64(3072 * 2048), forward_flops_per_token=np.int64(2 * 10**12))
    assert math.isclose(out, 3 * 3072 * 2048 * 2e12)
