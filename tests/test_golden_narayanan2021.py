"""Golden values from Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM" (SC'21, arXiv 2104.04473)."""

import numpy as np
import pytest

from snlab import sizing
from snlab.walls import compute as cw
from conftest import gpt

# Table 1: (parameters in billions as printed, attention heads, hidden size, layers);
# s = 2048, V = 51,200 for every row.
TABLE_1 = [
    (1.7, 24, 2304, 24),
    (3.6, 32, 3072, 30),
    (7.5, 32, 4096, 36),
    (18.4, 48, 6144, 40),
    (39.1, 64, 8192, 48),
    (76.1, 80, 10240, 60),
    (145.6, 96, 12288, 80),
    (310.1, 128, 16384, 96),
    (529.6, 128, 20480, 105),
    (1008.0, 160, 25600, 128),
]


@pytest.mark.parametrize("billions, heads, hidden, layers", TABLE_1)
def test_table_1_parameter_counts(billions, heads, hidden, layers):
    """Table 1 prints parameters to 0.1 B; the count must round to it."""
    n = sizing.params(gpt(layers, hidden, heads))
    assert round(n / 1e9, 1) == pytest.approx(billions)


@pytest.mark.parametrize("billions, heads, hidden, layers", TABLE_1)
def test_equation_2_exactly(billions, heads, hidden, layers):
    """Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)); snlab adds the final
    LayerNorm (2h), which Eq. 2 leaves out."""
    V, s, L, h = 51200, 2048, layers, hidden
    eq2 = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert sizing.params(gpt(layers, hidden, heads)) == pytest.approx(eq2 + 2 * h, rel=1e-12)


@pytest.mark.parametrize("billions, heads, hidden, layers", TABLE_1[::3])
def test_equation_3_flops_with_full_recomputation(billions, heads, hidden, layers):
    """Eq. 3: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration."""
    B, s, V, L, h = 512, 2048, 51200, layers, hidden
    model = gpt(layers, hidden, heads)
    tokens = B * s
    f_fwd = sizing.forward_flops_per_token(model, context_len=s)
    hw = cw.hardware_step_flops(tokens=tokens, forward_flops_per_token=f_fwd, recompute=2,
                                matmul_params=sizing.matmul_params(model), layers=L,
                                heads=heads, head_dim=h // heads, context_len=s)
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert hw == pytest.approx(eq3, rel=1e-12)


def test_megatron_1t_is_a_trillion():
    """Table 1, last row: 1008.0 B parameters."""
    assert sizing.params(gpt(128, 25600, 160)) == pytest.approx(1.008e12, rel=5e-4)


def test_parameters_vectorise_over_hidden_size():
    """One call sizes a whole family; each element equals the scalar call."""
    model = gpt(24, 2304, 24)
    hidden = np.array([2304, 3072, 4096])
    many = sizing.params(model, hidden_size=hidden, head_dim=hidden // 24, ffn_hidden_size=4 * hidden)
    one = [sizing.params(gpt(24, int(h_), 24)) for h_ in hidden]
    np.testing.assert_allclose(many, one, rtol=1e-12)
