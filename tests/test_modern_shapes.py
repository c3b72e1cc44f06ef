"""Today's model shapes: uneven pipeline stages, MoE training as DeepSeek-V3 runs it, and
the activation memory of MoE and latent-attention layers."""

from __future__ import annotations

import numpy as np
import pytest

import snlab
from snlab import presets
from snlab.errors import SnlabError
from snlab.sizing import activation_bytes_per_layer
from snlab.training import stages
from snlab.walls import memory as mw

# --- uneven pipeline stages --------------------------------------------------------------

LLAMA_405B = dict(tp=8, pp=16, dp=64, micro_batch=1, global_batch=2048, recompute="none", zero=2)


def test_llama3_405b_trains_on_16_stages_with_interleaving():
    """126 layers on 16 stages: the first and last stage get one layer fewer (Dubey et al.
    2024, Sec. 3.3.2), and the interleaved schedule runs: the bubble falls from
    (p - 1)/m to (p - 1)/(v m)."""
    assert stages.stage_layers(126, 16) == [7] + [8] * 14 + [7]
    flat = snlab.train("llama3-405b", "dgx-h100", **LLAMA_405B)
    inter = snlab.train("llama3-405b", "dgx-h100", interleave=2, **LLAMA_405B)
    m = 2048 // 64
    assert flat.bubble_fraction == pytest.approx(15 / m)
    assert inter.bubble_fraction == pytest.approx(15 / (2 * m))
    assert inter.step_time_s < flat.step_time_s
    # Table 4 of the paper: 430 TFLOP/s per GPU counting the scores in full, on 8,192 GPUs
    assert inter.palm_tflops_per_device == pytest.approx(430, rel=0.15)


def test_the_slowest_stage_sets_the_pace():
    """Fixing the last stage at 14 layers (the other 112 over 15 stages) makes it the
    slowest stage: the step grows by about the extra layers over the even split."""
    even = snlab.train("llama3-405b", "dgx-h100", **LLAMA_405B)
    heavy = snlab.train("llama3-405b", "dgx-h100", last_stage_layers=14, **LLAMA_405B)
    assert heavy.step_time_s > 1.5 * even.step_time_s
    assert stages.stage_layers(126, 16, last=14)[-1] == 14
    assert sum(stages.stage_layers(126, 16, last=14)) == 126


@pytest.mark.parametrize("layers, pp, first, last, tail", [
    (126, 16, 0, 0, 0), (61, 16, 0, 0, 4), (61, 8, 0, 0, 4), (80, 8, 0, 0, 1), (80, 8, 10, 10, 0),
    (61, 4, 16, 0, 0), (61, 4, 0, 13, 0), (94, 16, 0, 0, 2), (16, 16, 0, 0, 4), (96, 7, 0, 0, 0),
])
def test_every_layer_is_placed_once(layers, pp, first, last, tail):
    per_stage = stages.stage_layers(layers, pp, first, last, tail)
    s = stages.split(layers, pp, first, last, tail)
    assert sum(per_stage) == layers and len(per_stage) == pp and min(per_stage) >= 0
    assert per_stage[0] == int(s.first) and per_stage[-1] == int(s.last)
    assert max(per_stage[1:-1] or [0]) == int(s.middle)
    if first:
        assert per_stage[0] == first
    if last:
        assert per_stage[-1] == last


@pytest.mark.parametrize("name", presets.names("model"))
def test_every_model_plans_on_4_8_16_stages_with_1_2_4_virtual_stages(name):
    """Wherever the layers allow a layer per chunk, every preset plans without error."""
    model = snlab.model(name)
    for pp in (4, 8, 16):
        for v in (1, 2, 4):
            if pp * v > model.layers:
                continue
            r = snlab.train(model, "gb200-nvl72", tp=1, pp=pp, dp=1, micro_batch=1, global_batch=pp * 2,
                            interleave=v, seq_len=1024, recompute="full")
            assert np.isfinite(r.step_time_s) and r.step_time_s > 0 and 0 < r.mfu < 1, (name, pp, v)


def test_a_split_without_a_layer_per_chunk_is_refused():
    with pytest.raises(SnlabError, match="every model chunk"):
        snlab.train("llama3.2-1b", "dgx-h100", pp=16, interleave=4, global_batch=64)
    with pytest.raises(SnlabError, match="first_stage_layers"):
        snlab.train("llama3-405b", "dgx-h100", pp=16, first_stage_layers=1, interleave=2, global_batch=64)
    with pytest.raises(SnlabError, match="first_stage_layers"):
        snlab.train("llama3-405b", "dgx-h100", pp=1, first_stage_layers=10, global_batch=8)
    with pytest.raises(SnlabError, match="first_stage_layers"):
        snlab.train("llama3-405b", "dgx-h100", pp=2, first_stage_layers=60, last_stage_layers=60, global_batch=8)


def test_the_last_stage_memory_follows_its_own_layers():
    """Interleaving: the last stage holds (v - 1) p + 1 chunks over v (Megatron-Core's warm-up);
    stage r of 1F1B holds p - r micro-batches."""
    assert float(mw.stage_in_flight(pp=16, interleave=2, micro_batches=32, stage_rank=15)) == pytest.approx(8.5)
    assert float(mw.stage_in_flight(pp=16, interleave=1, micro_batches=32, stage_rank=15)) == 1


# --- MoE training ---------------------------------------------------------------------------

DEEPSEEK = dict(tp=1, pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360, precision="fp8")


def test_deepseek_v3_trains_at_about_the_published_rate():
    """DeepSeek-V3 reports 180K H800 GPU-hours per trillion tokens (Table 1): 1,543 tokens
    per second per GPU. The same plan on DGX H100 (same SMs and NIC per GPU, faster NVLink)."""
    r = snlab.train("deepseek-v3", "dgx-h100", **DEEPSEEK)
    assert r.tokens_per_s_per_device == pytest.approx(1e12 / (180e3 * 3600), rel=0.20)
    assert r.time_s["ep"] > 0


def test_deepep_sends_less_than_every_copy():
    """Once per node (at most 4 nodes, group-limited routing) instead of every one of the
    8 copies, and FP8 dispatch: the expert all-to-all takes far less time."""
    a2a = snlab.train("deepseek-v3", "dgx-h100", ep_dispatcher="alltoall", **DEEPSEEK)
    deep = snlab.train("deepseek-v3", "dgx-h100", ep_dispatcher="deepep", **DEEPSEEK)
    assert deep.time_s["ep"] < 0.6 * a2a.time_s["ep"]
    bf16 = snlab.train("deepseek-v3", "dgx-h100", **dict(DEEPSEEK, precision="bf16"))
    assert deep.time_s["ep"] < bf16.time_s["ep"]            # FP8 dispatch halves the dispatch bytes


def test_imbalance_and_capacity_bound_the_busiest_device():
    base = dict(DEEPSEEK, expert_imbalance=1.0)
    even = snlab.train("deepseek-v3", "dgx-h100", **base)
    skew = snlab.train("deepseek-v3", "dgx-h100", **dict(base, expert_imbalance=1.5))
    capped = snlab.train("deepseek-v3", "dgx-h100", **dict(base, expert_imbalance=1.5, capacity_factor=1.25))
    assert even.step_time_s < capped.step_time_s < skew.step_time_s
    assert skew.time_s["ep"] == pytest.approx(1.5 * even.time_s["ep"], rel=1e-9)
    assert capped.time_s["ep"] == pytest.approx(1.25 * even.time_s["ep"], rel=1e-9)
    # the preset's default is the measured imbalance of the routing it trains with
    assert snlab.train("deepseek-v3", "dgx-h100", **DEEPSEEK).plan["expert_imbalance"] == 1.04


def test_the_mtp_module_costs_a_layer_and_a_head():
    model = snlab.model("deepseek-v3")
    without = model.replace(mtp_modules=0)
    a = snlab.train(model, "dgx-h100", **DEEPSEEK)
    b = snlab.train(without, "dgx-h100", **DEEPSEEK)
    assert a.step_time_s > b.step_time_s
    # MFU counts the module's FLOPs: more model FLOPs per token
    assert a.model_tflops_per_device * a.step_time_s > b.model_tflops_per_device * b.step_time_s


def test_experts_are_data_parallel_over_what_expert_parallelism_leaves():
    """Expert parallelism is folded into data parallelism (Megatron-Core): it needs no
    devices of its own, and experts' gradients are reduced over d c / e replicas."""
    r = snlab.train("mixtral-8x7b", "dgx-h100", tp=2, pp=1, dp=8, ep=8, micro_batch=1, global_batch=64,
                    seq_len=4096)
    assert r.devices == 16
    with pytest.raises(SnlabError, match="ep"):
        snlab.train("mixtral-8x7b", "dgx-h100", tp=2, dp=4, ep=8, global_batch=64, seq_len=4096)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b"])
def test_the_new_moe_presets(name):
    model = snlab.model(name)
    published = {"mixtral-8x7b": (46.7e9, 12.9e9), "qwen3-30b-a3b": (30.5e9, 3.3e9),
                 "qwen3-235b-a22b": (235e9, 22e9)}[name]
    assert model.params == pytest.approx(published[0], rel=0.02)
    assert model.active_params == pytest.approx(published[1], rel=0.03)
    for key in ("layers", "hidden_size", "moe.experts", "moe.load_imbalance"):
        assert model.provenance[key].source, key


# --- activation memory of MoE and MLA layers ------------------------------------------------

def test_deepseek_v3_moe_layer_activation_bytes():
    """One MoE layer of DeepSeek-V3 keeps, per token, in bf16 (2 bytes) unless stated,
    without recomputation, FlashAttention (no scores), no tensor parallelism:

    kept whole (Korthikanti's 10 h bytes less the two dropout masks, since DeepSeek-V3
    trains without dropout): two RMSNorm inputs 2 x 2h, the attention and MoE inputs
    2 x 2h                                                            =  8 x 7168 =  57,344
    latents: c_Q and its norm 2 x 1536, c_KV 512 and its norm, k_rope 64: 4,160 x 2 =   8,320
    router logits, fp32: 256 x 4                                                    =   1,024
    queries a (128 + 64) and output-projection input a 128: 40,960 x 2             =  81,920
    keys a (128 + 64) and values a 128: 40,960 x 2                                  =  81,920
    expert hidden tensors (gate, up, product) of 8 routed + 1 shared: 3 x 9 x 2048 x 2 = 110,592
    8 dispatched token copies: 8 x 7168 x 2                                         = 114,688
    (the routing weights are applied in the experts' activation, so the combine keeps
    no expert outputs: Megatron-Core's moe_permute_fusion)
                                                                            total = 455,808
    The dense formula with the expert width counted the queries and output as h wide and
    left out the copies: about half of this.
    """
    h, a, k, E, fe = 7168, 128, 8, 256, 2048
    by_hand = 8 * h + 2 * 4160 + 4 * E + 2 * a * 320 + 2 * a * 320 + 2 * 3 * (k + 1) * fe + 2 * k * h
    assert by_hand == 455_808
    got = mw.activation_memory_per_layer(
        seq_len=1, micro_batch=1, hidden_size=h, heads=a, kv_heads=a, head_dim=160, tp=1, sequence_parallel=0,
        recompute=1, activation_bytes=2, logit_bytes=4, ffn_activation_width=(k + 1) * fe, mlp_matrices=3,
        query_width=a * 192, attention_output_width=a * 128, latent_width=4160, routed_copies=k, router_width=E,
        dropout=0)
    assert got == by_hand
    # the model's average layer mixes in the 3 dense layers
    average = activation_bytes_per_layer(snlab.model("deepseek-v3"), seq_len=1, recompute=1)
    assert 0.9 * by_hand < average < by_hand


def test_dense_models_keep_korthikanti_s_34_bytes_per_hidden_unit():
    """GPT-style (a d_h = h, f = 4h, no experts): 34 s b h bytes without the scores."""
    model = snlab.model("megatron-22b")
    per_token = activation_bytes_per_layer(model, seq_len=1, recompute=1)
    assert per_token == 34 * model.hidden_size


def test_models_trained_without_dropout_keep_no_masks():
    """Llama 3 8B (no dropout), per token and layer, bf16, no tensor parallelism, the
    scores left to FlashAttention:

    two RMSNorm inputs and the attention and MLP inputs 4 x 2h             =  32,768
    queries a d_h = 4096 and the output-projection input 4096: 2 x 2 x 4096 =  16,384
    keys and values 2 a_kv d_h = 2 x 8 x 128, x 2 bytes                    =   4,096
    gate, up and product of the SwiGLU MLP 3 x 14336 x 2                   =  86,016
                                                                   total = 139,264
    With dropout the two masks (1 byte per hidden unit each) would add 2h; with the scores
    materialised a model with dropout keeps 5 a s^2 bytes per sequence, one without 2 a s^2
    (the softmax output alone)."""
    model = snlab.model("llama3-8b")
    assert model.dropout is False
    by_hand = 4 * 2 * 4096 + 2 * 2 * 4096 + 2 * 8 * 128 * 2 + 3 * 14336 * 2
    assert by_hand == 139_264
    assert activation_bytes_per_layer(model, seq_len=1, recompute=1) == by_hand
    masked = model.replace(dropout=True)
    assert activation_bytes_per_layer(masked, seq_len=1, recompute=1) == by_hand + 2 * 4096
    s, a = 1024, model.heads
    scores = {m.dropout: activation_bytes_per_layer(m, seq_len=s, recompute=0)
              - activation_bytes_per_layer(m, seq_len=s, recompute=1) for m in (model, masked)}
    assert scores == {False: 2 * a * s**2, True: 5 * a * s**2}
