"""Golden forms and values from Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (MLSys 2023, arXiv 2205.05198)."""

import pytest
import sympy as sp

from snlab import sizing
from snlab.symbols import sym
from snlab.walls import compute as cw
from snlab.walls import memory as mw
from conftest import gpt

s, b, h, a, t = sym.seq_len, sym.micro_batch, sym.hidden_size, sym.heads, sym.tp
GPT_SHAPE = {sym.kv_heads: a, sym.head_dim: h / a, sym.mlp_matrices: 2,
             sym.ffn_activation_width: 4 * h, sym.activation_bytes: 2,   # 16-bit activations
             sym.query_width: h, sym.attention_output_width: h,         # a d_h = h
             sym.latent_width: 0, sym.routed_copies: 0, sym.router_width: 0,   # no MLA, no experts
             sym.dropout: 1}                                              # GPT trains with dropout

# Table 2, activation bytes per transformer layer, as printed.
TABLE_2 = [
    # (recompute, sequence_parallel, tensor degree or None for "no parallelism", form)
    (0, 0, 1, s * b * h * (34 + 5 * a * s / h)),
    (0, 0, t, s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (0, 1, t, s * b * h / t * (34 + 5 * a * s / h)),
    (1, 0, t, s * b * h * (10 + 24 / t)),
    (1, 1, t, s * b * h / t * 34),
    (2, 0, t, 2 * s * b * h),
]


@pytest.mark.parametrize("recompute, seqpar, degree, printed", TABLE_2)
def test_table_2_activation_forms(recompute, seqpar, degree, printed):
    """For a GPT layer, snlab's generalised expression reduces to Table 2 exactly."""
    expr = mw.activation_memory_per_layer.expr.subs(GPT_SHAPE).subs(
        {sym.recompute: recompute, sym.sequence_parallel: seqpar, t: degree})
    assert sp.simplify(expr - printed) == 0


@pytest.mark.parametrize("name, layers, hidden, heads, five_as_over_h, saving", [
    ("GPT-3 175B", 96, 12288, 96, 80, 0.70),   # Sec. 5: 5as/h = 80, saves 70%
    ("MT-NLG 530B", 105, 20480, 128, 64, 0.65),  # Sec. 5: 5as/h = 64, saves 65%
])
def test_section_5_selective_recompute_saving(name, layers, hidden, heads, five_as_over_h, saving):
    model = gpt(layers, hidden, heads)
    common = dict(seq_len=2048, micro_batch=1, hidden_size=hidden, heads=heads, tp=8,
                  kv_heads=heads, head_dim=hidden // heads, ffn_activation_width=4 * hidden,
                  mlp_matrices=2, sequence_parallel=1, activation_bytes=2, query_width=hidden,
                  attention_output_width=hidden, latent_width=0, routed_copies=0, router_width=0, logit_bytes=4,
                  dropout=1)
    full = mw.activation_memory_per_layer(recompute=0, **common)
    selective = mw.activation_memory_per_layer(recompute=1, **common)
    assert 5 * heads * 2048 / hidden == five_as_over_h
    assert 1 - selective / full == pytest.approx(saving, abs=0.005)
    assert model.layers == layers


def test_equation_7_model_flops():
    """Eq. 7: model FLOPs = 72 B s L h^2 (1 + s/(6h) + V/(12 h L))."""
    model = gpt(48, 6144, 64)   # the 22B model of Table 3
    B, s_, V, L, h_ = 4, 2048, 51200, 48, 6144
    f_fwd = sizing.forward_flops_per_token(model, context_len=s_)
    flops = cw.model_step_flops(tokens=B * s_, forward_flops_per_token=f_fwd)
    assert flops == pytest.approx(72 * B * s_ * L * h_**2 * (1 + s_ / (6 * h_) + V / (12 * h_ * L)), rel=1e-12)


def test_first_stage_holds_all_layers_without_interleaving():
    """Sec. 4.2.3: with 1F1B the first stage stores p micro-batches of L/p layers; the
    interleaved schedule multiplies that by 1 + (p - 1)/(p v)."""
    per_layer = 1.0e9

    def first_stage(interleave, micro_batches=64):
        in_flight = mw.stage_in_flight(pp=8, interleave=interleave, micro_batches=micro_batches, stage_rank=0)
        return mw.activation_memory_stage(activation_memory=per_layer, stage_layers=96 / 8, in_flight=in_flight)

    assert first_stage(1) == pytest.approx(96 * per_layer)
    assert first_stage(4) == pytest.approx(96 * per_layer * (1 + 7 / 32))
    assert first_stage(1, micro_batches=3) == pytest.approx(3 * 12 * per_layer)   # fewer micro-batches than stages


def test_later_stages_hold_fewer_micro_batches():
    """1F1B: stage r holds p - r micro-batches (Narayanan et al. 2021 Sec. 2.2); the
    interleaved schedule's rank r warms up 2 (p - r - 1) + (v - 1) p chunks (Megatron-Core)."""
    flights = [float(mw.stage_in_flight(pp=8, interleave=1, micro_batches=64, stage_rank=r)) for r in range(8)]
    assert flights == [8, 7, 6, 5, 4, 3, 2, 1]
    last = float(mw.stage_in_flight(pp=8, interleave=2, micro_batches=64, stage_rank=7))
    assert last == pytest.approx((0 + 8 + 1) / 2)
