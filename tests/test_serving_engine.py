"""What an inference engine adds to a step, term by term, pinned by hand.

The same small case as ``test_serving_parts.py`` (GPT-3 1.7B of Megatron-LM's Table 1 on a
made-up system with round numbers), with the engine's terms switched on one at a time: the
kernels' fixed time, captured-graph padding, GEMM occupancy, the element-wise kernels,
sampling, the one-shot all-reduce, the busiest expert device and two-batch overlap's
default, then the offline scenario's waves. Each expected value is written out here from
the terms' definitions, independently of :mod:`snlab.serving.engine`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import snlab
from snlab import network as net
from snlab.hardware import hardware
from snlab.serving import deployment as dp_
from snlab.serving import engine as E
from snlab.serving import offline as off
from snlab.serving import step as S

from test_serving_parts import (BYTE_RATE, FLOP_RATE, HW, H, L, V, DENSE, KV_TOKEN, SS, QWEN_SS, QK, UP, approx,
                                deployment, placed)

ENGINE = dataclasses.replace(HW, kernel_floor=3e-6, decode_attention_floor=20e-6, launch_overhead=10e-6)
#: the engine's own working memory the offline KV cache is sized after (TensorRT-LLM's
#: profiled peak beyond the weights on an H100, less the device reserve)
ENGINE_MEMORY = 4.55 * 2**30
SHARE = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}


# --- kernels and their fixed time ----------------------------------------------------------

def test_kernels_a_layer_launches():
    # GPT-3: two residual-add norms, rotary, QKV and output GEMMs, up, activation, down
    assert E.kernels(snlab.model("megatron-1.7b")) == E.Kernels(per_layer=2 + 1 + 2 + 3, head=2)
    # DeepSeek-V3: latent attention (5 GEMMs, a query down-projection, two latent norms);
    # 3 dense layers of 3 MLP kernels and 58 MoE layers of router, top-k, grouped up and
    # down, activation and a shared expert's three
    ds = E.kernels(snlab.model("deepseek-v3"))
    assert ds.per_layer == approx(2 + 1 + 5 + 1 + 2 + (3 * 3 + 58 * (2 + 3 + 3)) / 61)


def test_a_kernel_s_fixed_time_with_and_without_a_graph():
    assert E.kernel_time(ENGINE, 1.0) == 3e-6
    assert E.kernel_time(ENGINE, 0.0) == 10e-6              # the host launches each one
    slow_floor = dataclasses.replace(ENGINE, kernel_floor=12e-6)
    assert E.kernel_time(slow_floor, 0.0) == 12e-6
    fixed = E.fixed_time(SS.kernels, 12.0, ENGINE, 1.0)
    assert fixed == approx(12 * (8 * 3e-6 + 20e-6) + 2 * 3e-6)
    eager = E.fixed_time(SS.kernels, 12.0, dataclasses.replace(ENGINE, decode_attention_floor=5e-6), 0.0)
    assert eager == approx(12 * (8 * 10e-6 + 10e-6) + 2 * 10e-6)


def test_captured_batches_pad_a_decode_step():
    assert E.padded(24.0, 1.0) == 32 and E.padded(24.0, 0.0) == 24
    assert E.padded(1.0, 1.0) == 1 and E.padded(256.0, 1.0) == 256
    # 300 runs the 384 graph (trtllm-bench's largest batch for 300 is 384 too)
    assert E.padded(300.0, 1.0) == 384
    # 3,000: the 4,096 graph is above the engine's largest batch, 256 x ceil(3000 / 256)
    assert E.padded(3000.0, 1.0) == 3072
    assert E.padded(9000.0, 1.0) == 9000                    # above every captured size
    np.testing.assert_array_equal(E.max_batch(np.array([10.0, 100.0, 300.0, 1100.0])), [64, 128, 384, 1280])


def test_the_largest_graph_bounds_the_padding():
    # TensorRT-LLM captures the listed sizes up to its bound and the bound itself
    assert E.padded(744.0, 1.0, 1024.0) == 1024                  # the listed 1,024 graph
    assert E.padded(744.0, 1.0, 896.0) == 896                    # 1,024 exceeds the bound: padded to it
    assert E.padded(600.0, 1.0, 640.0) == 640
    assert E.padded(700.0, 1.0, 640.0) == 700                    # above the largest graph: the batch itself
    assert E.padded(744.0, 1.0) == 768                           # by default the bound is max_batch(744)


def test_a_decode_step_pads_to_the_engine_s_largest_graph():
    def computed(**limits):
        dep = deployment(tp=2, batch=625, graphs=1, **limits)
        w, place = placed(dep)
        dec = S.decode(SS, dep, HW, w, place)
        return [n for n in (625.0, 640.0, 700.0, 768.0, 1024.0)
                if dec.stage.parts.dense == approx(S.forward_pass(SS, dep, HW, w, 625.0, 4096.0, dec.kv_read,
                                                                  place.share, n, prefill=False,
                                                                  computed=n).dense)]
    assert computed() == [640.0]                                  # max_batch(625): 640
    assert computed(max_sequences=768, max_step_tokens=2048) == [768.0]
    assert computed(max_sequences=1280, max_step_tokens=2048) == [1024.0]
    assert computed(max_sequences=1280, max_step_tokens=700) == [700.0]   # the token budget bounds it
    assert computed(max_sequences=600) == [625.0]                 # beyond the largest graph: no padding
    assert computed(max_sequences=1) == [625.0] and computed(max_sequences=1280, max_step_tokens=1) == [625.0]
    assert computed(max_step_tokens=600) == [625.0]               # the token budget bounds the default too
    # max_batch_size bounds a pipeline stage's micro-batch: 2 stages of 625 under 1,280 in flight
    for step_tokens in (4096, 0):
        dep = deployment(tp=2, pp=2, batch=1250, graphs=1, max_sequences=1280, max_step_tokens=step_tokens)
        w, place = placed(dep)
        dec = S.decode(SS, dep, HW, w, place)
        assert dec.stage.parts.dense == approx(S.forward_pass(SS, dep, HW, w, 625.0, 4096.0, dec.kv_read,
                                                              place.share, 640.0, prefill=False,
                                                              computed=640.0).dense)
    # a stage's share of an odd max_sequences rounds up: 1,281 over 2 stages, graphs up to 641
    dep = deployment(tp=2, pp=2, batch=1250, graphs=1, max_sequences=1281)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    assert dec.stage.parts.dense == approx(S.forward_pass(SS, dep, HW, w, 625.0, 4096.0, dec.kv_read, place.share,
                                                          641.0, prefill=False, computed=641.0).dense)
    # with a draft token a sequence takes two tokens of the budget: 1,401 tokens hold 700 of them
    dep = deployment(tp=2, batch=625, graphs=1, draft_tokens=1, max_sequences=1280, max_step_tokens=1401)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    assert dec.stage.parts.dense == approx(S.forward_pass(SS, dep, HW, w, 1250.0, 4096.0, dec.kv_read, place.share,
                                                          2 * 700.0, prefill=False, computed=2 * 700.0).dense)


def test_trtllm_bench_sizes_the_engine_from_its_own_estimate():
    """Llama 3.1 405B NVFP4 on 4 B200 at ISL/OSL 500/2000, as tuning.py computes it."""
    model, sizes = snlab.model("llama3-405b"), S.serving_sizes(snlab.model("llama3-405b"))
    hw = hardware(snlab.system("dgx-b200"))
    dep = deployment(tp=4, weight_bytes=0.5625, kv_bytes=1, scenario=1, requests=3000, prompt_len=500,
                     output_len=2000)
    layers = 126 * (16384 * (2 * 16384 + 2 * 1024) + 3 * 16384 * 53248 + 2 * 16384) + 16384   # and the norms
    stored = layers / 2 + layers / 16 + 2 * 128256 * 16384      # packed pairs, FP8 scales; BF16 embeddings, head
    weights = stored * 0.5                                       # at NVFP4's 0.5 bytes an element
    per_request = 2 * 126 * 8 * 128 * 1.0 * 2500                 # FP8 K and V of 8 heads, 2,500 tokens
    requests = 0.95 * (4 * 183359 * 2**20 - weights) / per_request
    assert requests == approx(963.07, rel=1e-4)
    assert float(off.bench_requests(dep, hw, sizes.checkpoint)) == approx(requests)
    batch, tokens = off.bench_settings(dep, hw, sizes.checkpoint, 1.0)
    assert (float(batch), float(tokens)) == (1024, 2048)          # 128 ceil(963 / 128); 963 x 1.25 below 2,048
    short = deployment(tp=4, weight_bytes=0.5625, kv_bytes=1, prompt_len=128, output_len=128)
    assert [float(x) for x in off.bench_settings(short, hw, sizes.checkpoint, 1.0)] == [4096, 8192]   # capped at 4,096
    fp8 = deployment(tp=8, weight_bytes=1, kv_bytes=1, prompt_len=500, output_len=2000)
    weights8 = (layers + 2 * 128256 * 16384) * 1.0               # every element stored as one byte
    assert float(off.bench_requests(fp8, hw, sizes.checkpoint)) == approx(
        0.95 * (8 * 183359 * 2**20 - weights8) / per_request)
    assert model.head_dim == 128
    # end to end: 1,000 + 2,000 tokens, 1,500 requests; the cache holds 625, the engine takes 896
    o = snlab.serve("llama3-405b", "dgx-b200", tp=4, weight_dtype="fp4", kv_dtype="fp8", scenario="offline",
                    requests=1500, prompt_len=1000, output_len=2000).offline
    requests3 = 0.95 * (4 * 183359 * 2**20 - weights) / (per_request / 2500 * 3000)
    assert o["max_batch_size"] == E.max_batch(requests3) == 896 and o["sequences"] == o["kv_sequences"] == 625
    assert o["step_tokens"] == 2048
    # INT8 weights have no heuristic: TensorRT-LLM's defaults; an INT8 KV cache counts 2 bytes
    int8 = deployment(tp=8, weight_dtype=3, weight_bytes=1, kv_bytes=1, prompt_len=500, output_len=2000)
    assert [float(x) for x in off.bench_settings(int8, hw, sizes.checkpoint, 100.0)] == [2048, 8192]
    kv8 = deployment(tp=8, weight_bytes=1, kv_dtype=3, kv_bytes=1, prompt_len=500, output_len=2000)
    assert float(off.bench_requests(kv8, hw, sizes.checkpoint)) == approx(
        0.95 * (8 * 183359 * 2**20 - weights8) / (2 * per_request))
    # no request left by its estimate: the sequences the cache holds stand in
    tiny = dataclasses.replace(hw, hbm_capacity=1e9)
    assert float(off.bench_requests(dep, tiny, sizes.checkpoint)) < 0
    assert [float(x) for x in off.bench_settings(dep, tiny, sizes.checkpoint, 300.0)] == [384, 2048]
    one_and_half = dataclasses.replace(hw, hbm_capacity=(weights + 1.5 * per_request / 0.95) / 4)
    assert float(off.bench_requests(dep, one_and_half, sizes.checkpoint)) == approx(1.5)
    assert [float(x) for x in off.bench_settings(dep, one_and_half, sizes.checkpoint, 300.0)] == [64, 2048]
    # a mixture of experts stores its experts quantised too; embeddings and head stay 16-bit
    ds = S.serving_sizes(snlab.model("deepseek-v3")).checkpoint
    assert ds.quantised == approx(671026404352 - 2 * 129280 * 7168) and ds.kept == 2 * 129280 * 7168
    assert (ds.layers, ds.kv_heads, ds.head_size) == (61, 128, 56)     # its configuration's heads, 7,168 / 128
    # attention data-parallel over an expert group of 8: one engine of 8 GPUs holds one copy
    adp = deployment(dp=8, ep=8, weight_bytes=0.5625, kv_bytes=1, prompt_len=1024, output_len=2048)
    adp_weights = (ds.quantised * 0.5625 + ds.kept) * 0.5
    assert float(off.bench_requests(adp, hw, ds)) == approx(
        0.95 * (8 * 183359 * 2**20 - adp_weights) / (2 * 61 * 128 * 56 * 3072))
    assert float(off.engine_group(adp)) == 8 and float(off.engine_group(deployment(tp=4, ep=2))) == 4
    bf16 = deployment(tp=8, weight_bytes=2, kv_bytes=2, prompt_len=500, output_len=2000)
    weights16 = (layers + 2 * 128256 * 16384) * 2.0              # one element a weight, two bytes each
    assert float(off.bench_requests(bf16, hw, sizes.checkpoint)) == approx(
        0.95 * (8 * 183359 * 2**20 - weights16) / (2 * per_request))
    # two pipeline stages: the group's memory is 8 devices', the batch a stage's half of it
    pp2 = deployment(tp=4, pp=2, weight_bytes=0.5625, kv_bytes=1, prompt_len=500, output_len=2000)
    requests2 = 0.95 * (8 * 183359 * 2**20 - weights) / per_request
    assert float(off.bench_requests(pp2, hw, sizes.checkpoint)) == approx(requests2)
    assert [float(x) for x in off.bench_settings(pp2, hw, sizes.checkpoint, 1.0)] == [
        E.max_batch(requests2 / 2), off.step_budget(requests2 / 2, pp2)]
    # more tensor-parallel ranks than KV heads: each rank still keeps one
    wide = deployment(tp=16, weight_bytes=1, kv_bytes=1, prompt_len=500, output_len=2000)
    assert float(off.bench_requests(wide, hw, sizes.checkpoint)) == approx(
        0.95 * (16 * 183359 * 2**20 - weights8) / (2 * per_request))


def test_a_padded_decode_step_computes_its_empty_slots():
    dep = deployment(tp=2, batch=24, graphs=1)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    half = S.forward_pass(SS, dep, HW, w, 24.0, 4096.0, dec.kv_read, place.share, 32.0, prefill=False, computed=32.0)
    assert dec.stage.parts.dense == approx(half.dense)
    assert dec.stage.parts.head == approx(half.head) and half.head_flops == 2 * 32 * V * H / 2
    dense_flops = (2 * 32 * DENSE * L + 2 * 32 * V * H) / 2     # 32 slots' GEMMs and logits
    dense_bytes = (SS.base.layer_params + V * H) / 2 * 2 + 2 * 32 * H * L * 4 / 2
    assert half.dense == approx(max(dense_flops / FLOP_RATE, dense_bytes / BYTE_RATE))
    # attention and the KV cache are the 24 sequences' only
    unpadded = S.forward_pass(SS, dep, HW, w, 24.0, 4096.0, dec.kv_read, place.share, 24.0, prefill=False)
    assert half.attention == approx(unpadded.attention)
    # the graph's all-reduces move its 32 rows, two a layer
    assert dec.stage.parts.tp == approx(half.tp) == approx(2 * L * E.tensor_all_reduce(32 * H * 2.0, 2.0, HW))
    assert unpadded.tp == approx(2 * L * E.tensor_all_reduce(24 * H * 2.0, 2.0, HW)) and unpadded.tp < half.tp


def test_a_padded_step_dispatches_its_empty_slots_to_the_experts():
    dep = deployment(tp=1, dp=16, ep=16, weight_bytes=1, batch=16 * 24, graphs=1)
    w = S.weights(QWEN_SS.base, dep, HW)
    place = S.placement(QWEN_SS, dep, HW, w)
    dec = S.decode(QWEN_SS, dep, HW, w, place)
    padded = S.forward_pass(QWEN_SS, dep, HW, w, 24.0, 4096.0, dec.kv_read, place.share, 32.0, prefill=False,
                            computed=32.0)
    sent = 32 * 8 * 2048                                           # 32 rows, 8 experts each, h 2,048
    disp = 10e-6 + 1e-6 + sent * 15 / 16 * 1 / UP
    comb = 10e-6 + 1e-6 + sent * 15 / 16 * 2 / UP
    assert dec.stage.parts.ep == approx(padded.ep) == approx(48 * (disp + comb))
    # split by tensor parallelism, each rank dispatches its share of the padded rows
    wide = deployment(tp=2, dp=8, ep=16, weight_bytes=1, batch=8 * 24, graphs=1)
    w = S.weights(QWEN_SS.base, wide, HW)
    place = S.placement(QWEN_SS, wide, HW, w)
    dec = S.decode(QWEN_SS, wide, HW, w, place)
    def exchange(n):
        return S.forward_pass(QWEN_SS, wide, HW, w, 24.0, 4096.0, dec.kv_read, place.share, n, prefill=False,
                              computed=n).ep
    assert dec.stage.parts.ep == approx(exchange(32.0)) and exchange(24.0) < exchange(32.0)


def test_the_host_s_step_time_adds_unless_hidden():
    dep = deployment(tp=2, batch=16)
    w, place = placed(dep)
    slow = dataclasses.replace(dep, host_step_s=np.float64(1e-3))
    assert S.decode(SS, slow, HW, w, place).step == approx(S.decode(SS, dep, HW, w, place).step + 1e-3)


# --- occupancy, element-wise kernels, sampling ---------------------------------------------

def test_few_tokens_fill_few_tiles():
    occ = snlab.walls.compute.gemm_occupancy
    assert occ(gemm_m=64.0, gemm_n=4096.0, gemm_half_elements=64 * 4096.0) == 0.5
    assert occ(gemm_m=1e9, gemm_n=4096.0, gemm_half_elements=4e5) == approx(1.0, rel=1e-4)
    assert occ(gemm_m=16.0, gemm_n=1000.0, gemm_half_elements=0.0) == 1.0


def test_a_dense_pass_runs_at_its_gemms_occupancy():
    dep = deployment(tp=2, gemm_half=4e5, efficiency_ratio=0.9)
    w = S.weights(SS.base, dep, HW)
    tok = 512.0
    p = S.forward_pass(SS, dep, HW, w, tok, 1.0, 1.0, SHARE, tok, prefill=True)
    n = DENSE / 2 / (2 * H + (H + 4 * H) / 2)                  # QKV + up over K, out + down over K / t
    rate = FLOP_RATE * 0.9 * tok / (tok + 4e5 / n)
    flops = (2 * tok * DENSE * L + 2 * tok * V * H) / 2
    bytes_ = (SS.base.layer_params + V * H) / 2 * 2 + 2 * tok * H * L * 4 / 2
    assert p.dense == approx(max(flops / rate, bytes_ / BYTE_RATE))
    # the output head is one large GEMM per call: no occupancy limit, no precision ratio
    assert p.head == approx(max(2 * tok * V * H / 2 / FLOP_RATE, V * H / 2 * 2 / BYTE_RATE))
    # the compute wall is the pass's FLOPs at the large-GEMM rate at the weights' precision
    attn = tok * 1.0 * SS.prefill_attention_per_key / 2
    assert p.compute_wall == approx(flops / (FLOP_RATE * 0.9) + attn / FLOP_RATE)


def test_element_wise_kernels_move_the_hidden_state():
    dep = deployment(tp=2)
    w = S.weights(SS.base, dep, HW)
    p = S.forward_pass(SS, dep, HW, w, 8.0, 1000.0, 1e6, SHARE, 8.0, prefill=False)
    # two residual-add norms read and write hidden state and residual (replicated); rotary
    # reads and writes q and k; GPT-3's GELU reads its 4h input and writes its output (a
    # gated MLP's reads gate and up); the last two split by tensor parallelism
    per_layer = 2 * 8 * (2 * 4 * H + (2 * (H + H) + 2 * 4 * H) / 2)
    assert p.elementwise == approx(L * per_layer / BYTE_RATE)


def test_sampling_reads_the_logits_twice():
    assert E.sampling_time(48.0, V, ENGINE, 1.0) == approx(3e-6 + 2 * 48 * V * 4 / BYTE_RATE)
    assert E.sampling_time(48.0, V, ENGINE, 0.0) == approx(10e-6 + 2 * 48 * V * 4 / BYTE_RATE)


# --- the one-shot all-reduce ---------------------------------------------------------------

def test_small_messages_take_the_one_shot_all_reduce():
    direct = dataclasses.replace(HW, scale_up_direct_call_latency=5e-6)
    small = 8 * H * 2.0
    one_shot = 5e-6 + 1e-6 + 7 * small / UP
    ring = 10e-6 + 2 * 7 * 1e-6 + 2 * 7 / 8 * small / UP
    assert one_shot < ring
    assert E.tensor_all_reduce(small, 8.0, direct) == approx(one_shot)
    big = 1e9                                                    # the library's algorithm wins
    assert 5e-6 + 1e-6 + 7 * big / UP > net.all_reduce(big, 8.0, 1.0, direct)
    assert E.tensor_all_reduce(big, 8.0, direct) == approx(net.all_reduce(big, 8.0, 1.0, direct))
    # without the engine's kernel, or across domains, the library's ring
    assert E.tensor_all_reduce(small, 8.0, HW) == approx(ring)
    assert E.tensor_all_reduce(small, 32.0, direct) > one_shot


# --- experts: the busiest device, two-batch overlap's default --------------------------------

def test_the_busiest_expert_device_sets_the_pace():
    dep = deployment(tp=1, dp=16, ep=16, weight_bytes=1, batch=16)
    skew = dataclasses.replace(dep, expert_imbalance=np.float64(1.25))
    w = S.weights(QK, dep, HW)
    even = S.forward_pass(QWEN_SS, dep, HW, w, 4.0, 1000.0, 1e6, SHARE, 4.0, prefill=False)
    busy = S.forward_pass(QWEN_SS, skew, HW, w, 4.0, 1000.0, 1e6, SHARE, 4.0, prefill=False)
    assert busy.ep == approx(1.25 * even.ep)
    r0, f0, _ = S.routed_experts(QWEN_SS, dep, HW, 4.0, HW.gemm_efficiency)
    r1, f1, _ = S.routed_experts(QWEN_SS, skew, HW, 4.0, HW.gemm_efficiency)
    assert f1 == approx(1.25 * f0) and r1 == approx(r0)       # the same slots are read


def test_an_expert_s_gemm_sees_its_own_tokens():
    dep = deployment(tp=1, dp=16, ep=16, batch=16, gemm_half=4e5)
    tok = 64.0
    read, flops, t = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)
    per_expert = tok * 16 * 8 / 128                              # every device's tokens reach its experts
    n = QK.expert_params_one / (2048 + 768)
    rate = FLOP_RATE * per_expert / (per_expert + 4e5 / n)
    assert t == approx(max(flops / rate, read / BYTE_RATE))


def test_two_batch_overlap_defaults_to_the_measured_fraction():
    dep = deployment(tp=1, dp=16, ep=16, microbatches=2, ep_overlap=float("nan"), batch=64)
    w = S.weights(QK, dep, HW)
    for prefill, level in ((False, 0.8), (True, 0.6)):
        st = S.stage(QWEN_SS, dep, HW, w, 8.0, 1000.0, 2e6, SHARE, 8.0, prefill=prefill)
        half = S.forward_pass(QWEN_SS, dep, HW, w, 4.0, 1000.0, 1e6, SHARE, 4.0, prefill=prefill)
        c = 2 * (half.dense + half.expert + half.attention + half.elementwise + half.fixed)
        e = 2 * half.ep
        assert st.time == approx(c + e - (1 - 0.2) * level * min(c, e) + 2 * half.tp)
    assert dp_.TBO_OVERLAP == {"decode": 0.8, "prefill": 0.6}


# --- the offline scenario ------------------------------------------------------------------

def offline_deployment(**kw):
    base = dict(tp=2, scenario=1, requests=1000, prompt_len=1000, output_len=200, context=1100,
                capacity_context=1200, kv_offload=0, max_sequences=0, max_step_tokens=0)
    base.update(kw)
    return deployment(**base)


def test_the_kv_cache_holds_whole_blocks_of_sequences():
    dep = offline_deployment()
    w, place = placed(dep)
    held = off.kv_sequences(dep, HW, w.per_device, place.kv_per_token, place.shard)
    free = 40e9 - HW.memory_reserve - ENGINE_MEMORY - w.per_device
    blocks = math.ceil(1200 / 32) * 32                           # 1,200 tokens in blocks of 32: 1,216
    assert held == math.floor(0.95 * free / (blocks * KV_TOKEN / 2))


def test_the_step_budget_is_rounded_as_trtllm_bench_rounds_it():
    dep = offline_deployment()
    np.testing.assert_array_equal(off.step_budget(np.array([100.0, 600.0, 1300.0, 9000.0]), dep),
                                  [2048, 3840, 8192, 32768])    # b (1 + 1000 / 200) = 600, 3600, 7800, 54000


def test_an_offline_run_takes_its_waves_one_after_another():
    dep = offline_deployment(max_sequences=100, requests=350)
    w, place = placed(dep)
    run = off.offline(dep, HW, w.per_device, place.kv_per_token, place.shard,
                      lambda d: 1e-3 * float(d.prefill_batch), lambda d: 1e-6 * float(d.batch) + 0.01, 1.0, SS.checkpoint)
    assert run.batch == 100 and run.waves == 4 and run.last_batch == 50
    assert run.step_tokens == 2048                               # 100 (1 + 1000 / 200) = 600, at least 2,048
    chunks, c_last = math.ceil(100 * 1000 / 2048), math.ceil(50 * 1000 / 2048)
    assert run.chunks == chunks == 49 and c_last == 25
    chunk, chunk_last = 1e-3 * 100 / chunks, 1e-3 * 50 / c_last  # a pass over each chunk's prompts
    step, step_last = 1e-6 * 100 + 0.01, 1e-6 * 50 + 0.01
    full = chunks * chunk + 199 * step
    partial = c_last * chunk_last + 199 * step_last
    assert run.makespan == approx(3 * full + partial)
    assert run.tokens_per_s == approx(350 * 200 / (3 * full + partial))
    first, last_first = (chunks + 1) / 2 * chunk, (c_last + 1) / 2 * chunk_last
    # waves 0, 1, 2 wait 0, 1, 2 full waves; the last waits 3
    ttft = (100 * ((0 + 1 + 2) * full + 3 * first) + 50 * (3 * full + last_first)) / 350
    assert run.ttft == approx(ttft)
    assert run.tpot == approx((300 * step + 50 * step_last) / 350)


def test_an_offline_wave_flows_through_the_pipeline():
    dep = offline_deployment(pp=2, requests=100, max_sequences=0)
    w, place = placed(dep)
    held = off.kv_sequences(dep, HW, w.per_device, place.kv_per_token, place.shard)
    run = off.offline(dep, HW, w.per_device, place.kv_per_token, place.shard,
                      lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert held > 100 and run.batch == 100 and run.waves == 1      # every request in one wave
    chunks = math.ceil(100 * 1000 / 2048)
    assert run.makespan == approx((chunks + 1) * 1e-3 + 199 * 0.01)   # one more stage to drain
    assert run.ttft == approx(((chunks + 1) / 2 + 1) * 1e-3)
    tiny = dataclasses.replace(HW, hbm_capacity=4e9)
    w = S.weights(SS.base, dep, tiny)
    starved = off.offline(dep, tiny, w.per_device, place.kv_per_token, place.shard, lambda d: 1e-3,
                          lambda d: 0.01, 1.0, SS.checkpoint)
    assert not starved.fits


def test_a_lone_long_prompt_gets_its_first_token_after_its_last_chunk():
    # one prompt of 8,000 tokens in chunks of 1,000: its first token comes after all eight
    dep = offline_deployment(requests=1, prompt_len=8000, output_len=2, max_step_tokens=1000)
    w, place = placed(dep)
    run = off.offline(dep, HW, w.per_device, place.kv_per_token, place.shard,
                      lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert run.chunks == 8 and run.ttft == approx(8e-3) and run.makespan == approx(8e-3 + 0.01)
    # four prompts of 2,000 tokens: the i-th is done after 2i chunks, 5 on average
    four = dataclasses.replace(dep, requests=4, prompt_len=2000)
    run = off.offline(four, HW, w.per_device, place.kv_per_token, place.shard,
                      lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert run.chunks == 8 and run.ttft == approx(5e-3)


def test_a_prompt_s_first_token_comes_after_its_last_chunk_on_average():
    from snlab.walls import serving as sv
    # 100 prompts in 4 chunks: each ends in one of them, 2.5 on average; one prompt in 8: after all 8;
    # four prompts in 8 chunks: the i-th after 2i, 5 on average
    np.testing.assert_allclose(sv.offline_first_token_chunks(prefill_chunks=np.array([4.0, 8.0, 8.0]),
                                                             batch_sequences=np.array([100.0, 1.0, 4.0])),
                               [2.5, 8.0, 5.0])


def test_offline_draft_tokens_shorten_each_output_token():
    kw = dict(tp=2, scenario="offline", requests=3000, prompt_len=1000, output_len=1000, weight_dtype="fp8",
              kv_dtype="fp8")
    plain = snlab.serve("llama3-70b", "dgx-h100", **kw)
    drafted = snlab.serve("llama3-70b", "dgx-h100", draft_tokens=3, acceptance=1.0, **kw)
    # every draft accepted: a step emits four tokens per sequence, so an output token takes a quarter of
    # it, as in the fixed-batch result of the same batch (whose mean context differs a little)
    assert drafted.tokens_per_step == 4.0 and drafted.deployment["batch"] == plain.deployment["batch"]
    assert drafted.offline["tpot_s"] == approx(drafted.tpot_s, rel=0.02)
    assert plain.offline["tpot_s"] == approx(plain.tpot_s, rel=0.02)
    assert drafted.offline["tpot_s"] < plain.offline["tpot_s"]
    assert drafted.offline["tokens_per_s"] > plain.offline["tokens_per_s"]
    assert drafted.offline["makespan_s"] < plain.offline["makespan_s"]


def test_offline_columns_and_the_fixed_scenario():
    dep = offline_deployment(max_sequences=64)
    out = S.serve_columns(snlab.model("megatron-1.7b"), dep, HW)
    assert out["offline_sequences"] == 64 and out["offline_waves"] == math.ceil(1000 / 64)
    assert out["offline_max_batch_size"] == 64
    assert out["offline_tokens_per_s"] == approx(1000 * 200 / out["offline_makespan_s"])
    assert out["offline_tokens_per_s_per_device"] == approx(out["offline_tokens_per_s"] / 2)
    assert bool(out["fits"])
    fixed = S.serve_columns(snlab.model("megatron-1.7b"), deployment(tp=2, batch=8), HW)
    assert fixed["offline_tokens_per_s"] == 0 and fixed["offline_waves"] == 0


# --- the remaining branches -----------------------------------------------------------------

def test_kernels_without_a_query_projection_or_shared_experts():
    ds = snlab.model("deepseek-v3")
    no_q = dataclasses.replace(ds, mla=dataclasses.replace(ds.mla, q_lora_rank=0))
    assert E.kernels(no_q).per_layer == approx(E.kernels(ds).per_layer - 1)
    # Qwen3-30B-A3B: every layer a MoE block of router, top-k, grouped up and down, activation
    assert E.kernels(snlab.model("qwen3-30b-a3b")).per_layer == 2 + 1 + 2 + (2 + 3)


def test_a_batch_between_the_largest_captured_sizes_is_padded():
    assert E.padded(5000.0, 1.0) == 5120          # the 8,192 graph is above 256 x ceil(5000 / 256)


def test_two_devices_take_the_one_shot_all_reduce_too():
    direct = dataclasses.replace(HW, scale_up_direct_call_latency=5e-6)
    small = 8 * H * 2.0
    assert E.tensor_all_reduce(small, 2.0, direct) == approx(5e-6 + 1e-6 + small / UP)
    assert E.tensor_all_reduce(small, 1.0, direct) == E.tensor_all_reduce(small, 1.0, HW)


def test_inner_dimensions_of_latent_attention_and_experts():
    ss = S.serving_sizes(snlab.model("deepseek-v3"))
    h = 7168
    col = 1536 + 512 + 2 * h + (3 * h + 58 * (h + h)) / 61        # q, kv up and down; MLP or router + shared up
    row = 128 * 128 + (3 * 18432 + 58 * 1 * 2048) / 61            # output projection; down, or the shared down
    assert (ss.gemm_k_col, ss.gemm_k_row) == (approx(col), approx(row))
    qwen = QWEN_SS                                                 # no shared expert: the router alone
    assert (qwen.gemm_k_col, qwen.gemm_k_row) == (approx(2048 + 2048), approx(32 * 128 + 0))


def test_a_compute_bound_expert_gemm_at_its_occupancy():
    dep = deployment(tp=2, dp=8, ep=16, batch=16, gemm_half=4e5, gemm_ratio=2, weight_bytes=1,
                     expert_imbalance=1.2)
    tok = 4096.0
    read, flops, t = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)
    reaching = tok * 16 / 2                                        # every tensor-parallel group's tokens
    per_expert = reaching * 8 / 128 * 1.2                          # the busiest device's experts
    n = QK.expert_params_one / (2048 + 768)                        # whole experts (tp / ep < 1)
    rate = 2 * FLOP_RATE * per_expert / (per_expert + 4e5 / n)
    assert flops == approx(2 * tok * 8 * QK.expert_params_one / 2 * 48 * 1.2)
    assert flops / rate > read / BYTE_RATE and t == approx(flops / rate)


def test_expert_imbalance_loads_the_busiest_device_only_under_expert_parallelism():
    """With ep 1 each device computes a tensor slice of every expert for every token, so
    no device is busier; from ep 2 the busiest device's experts get ``expert_imbalance``
    times their share of the tokens."""
    tok = 256.0
    flops = {}
    for ep in (1, 2):
        for imbalance in (1.0, 1.5):
            dep = deployment(tp=2, dp=1, ep=ep, batch=16, expert_imbalance=imbalance)
            flops[ep, imbalance] = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)[1]
    even = 2 * tok * 8 * QK.expert_params_one / 2 * 48
    assert flops[1, 1.0] == approx(even) and flops[1, 1.5] == approx(even)
    assert flops[2, 1.0] == approx(even) and flops[2, 1.5] == approx(1.5 * even)


def test_a_stage_pays_its_kernels_fixed_time():
    dep = deployment(tp=2, graphs=1)
    w = S.weights(SS.base, dep, ENGINE)
    st = S.stage(SS, dep, ENGINE, w, 8.0, 4096.0, 1e8, SHARE, 8.0, prefill=False)
    p = st.parts
    assert p.fixed == approx(E.fixed_time(SS.kernels, L, ENGINE, 1.0)) and p.fixed > 0
    assert st.time == approx(p.dense + p.expert + p.attention + p.elementwise + p.fixed + p.tp)
    two = deployment(tp=2, pp=2, batch=2, graphs=1)
    out = S.serve_columns(snlab.model("megatron-1.7b"), two, ENGINE)
    w2, place = S.weights(SS.base, two, ENGINE), None
    dec = S.decode(SS, two, ENGINE, w2, S.placement(SS, two, ENGINE, w2))
    assert out["time_fixed_s"] == approx(2 * dec.stage.parts.fixed)          # both stages' kernels
    assert out["time_elementwise_s"] == approx(2 * dec.stage.parts.elementwise)
    assert out["time_sampling_s"] == approx(dec.sampling)


def test_the_offline_engine_limits():
    big = dataclasses.replace(HW, hbm_capacity=1e12)
    dep = offline_deployment(pp=2, dp=2, requests=9000, max_sequences=0)
    w = S.weights(SS.base, dep, big)
    place = S.placement(SS, dep, big, w)
    seen = []
    run = off.offline(dep, big, w.per_device, place.kv_per_token, place.shard,
                      lambda d: 1e-3, lambda d: seen.append(d) or 0.01, 1.0, SS.checkpoint)
    # trtllm-bench's max_batch_size bounds a micro-batch: 4,096 / 2 stages, and a replica keeps
    # one a stage in flight; 4,500 requests a replica take two waves
    assert run.batch == 2 * 2048 and run.waves == math.ceil(4500 / 4096)
    assert seen[0].batch == 4096 * 2                              # the decode step sees both replicas
    # and the engine's limits, from which it knows its largest captured graph
    assert seen[0].max_sequences == 4096 and seen[0].max_step_tokens == run.step_tokens
    assert run.max_batch == 2048                                  # max_batch_size, a stage's
    # a token budget of its own caps the sequences in flight: a step decodes as many as it holds,
    # a micro-batch of 64 in each of two stages
    staged = off.offline(offline_deployment(pp=2, max_step_tokens=64, requests=500), HW, w.per_device,
                         place.kv_per_token, place.shard, lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert staged.step_tokens == 64 and staged.batch == 128 and staged.max_batch == 64
    one = off.offline(offline_deployment(max_sequences=1, max_step_tokens=1, requests=3), HW, w.per_device,
                      place.kv_per_token, place.shard, lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert one.batch == 1 and one.step_tokens == 1 and one.chunks == 1000  # a prompt token a step
    drafts = off.offline(offline_deployment(max_step_tokens=64, requests=500), HW, w.per_device,
                         place.kv_per_token, place.shard, lambda d: 1e-3, lambda d: 0.01, 2.0, SS.checkpoint)
    assert drafts.step_tokens == 64 and drafts.batch == 32        # two tokens a sequence verifies
    lone = off.offline(offline_deployment(max_step_tokens=1, requests=500), HW, w.per_device, place.kv_per_token,
                       place.shard, lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert lone.step_tokens == 1 and lone.batch == 1              # a one-token budget decodes one sequence
    # left to trtllm-bench, a step still holds every sequence's tokens
    held = off.offline(offline_deployment(requests=500), HW, w.per_device, place.kv_per_token, place.shard,
                       lambda d: 1e-3, lambda d: 0.01, 64.0, SS.checkpoint)
    assert held.step_tokens == 64 * held.batch
    # 4,500 and 8,502 tokens: rounded to 512 below 8,192, to 1,024 above
    np.testing.assert_array_equal(off.step_budget(np.array([750.0, 1417.0]), offline_deployment()), [4608, 9216])
    np.testing.assert_array_equal(off.step_budget(np.array([1350.0]), offline_deployment()), [8192])


def test_a_cache_for_exactly_one_sequence_runs():
    dep = offline_deployment()
    w = S.weights(SS.base, dep, HW)
    place = S.placement(SS, dep, HW, w)
    one_sequence = 1216 * place.kv_per_token / place.shard / 0.95
    hw = dataclasses.replace(HW, hbm_capacity=HW.memory_reserve + ENGINE_MEMORY + w.per_device + 1.5 * one_sequence)
    run = off.offline(dep, hw, w.per_device, place.kv_per_token, place.shard, lambda d: 1e-3, lambda d: 0.01, 1.0, SS.checkpoint)
    assert run.kv_sequences == 1 and run.fits and run.batch == 1
    starved = dataclasses.replace(HW, hbm_capacity=HW.memory_reserve + ENGINE_MEMORY + w.per_device
                                  + 0.5 * one_sequence)
    none = off.offline(dep, starved, w.per_device, place.kv_per_token, place.shard, lambda d: 1e-3,
                       lambda d: 0.01, 1.0, SS.checkpoint)
    assert none.kv_sequences == 0 and not none.fits and none.batch == 1


def test_an_expert_split_by_tensor_parallelism_has_a_narrower_gemm():
    dep = deployment(tp=8, dp=1, ep=2, batch=16, gemm_half=4e5)
    tok = 4096.0
    read, flops, t = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)
    per_expert = tok * 8 / 8 * 8 / 128                             # one group's tokens
    n = QK.expert_params_one / 4 / (2048 + 768 / 4)                # each expert split four ways
    rate = FLOP_RATE * per_expert / (per_expert + 4e5 / n)
    assert flops / rate > read / BYTE_RATE and t == approx(flops / rate)


def test_offline_replicas_each_keep_their_batch():
    dep = offline_deployment(dp=2, max_sequences=100, requests=1000)
    out = S.serve_columns(snlab.model("megatron-1.7b"), dep, HW)
    assert out["batch_in_flight"] == 200 and out["offline_sequences"] == 100


def test_offline_rows_beside_fixed_ones():
    dep = offline_deployment(max_sequences=0, draft_tokens=1, max_step_tokens=64, batch=8)
    dep = dataclasses.replace(dep, scenario=np.array([0.0, 1.0]), kv_offload=np.array([1.0, 1.0]))
    out = S.serve_columns(snlab.model("megatron-1.7b"), dep, HW)
    w = S.weights(SS.base, dep, HW)
    kv_memory = 0.95 * (40e9 - HW.memory_reserve - ENGINE_MEMORY - w.per_device)
    held = math.floor(kv_memory / (1216 * KV_TOKEN / 2))
    b = min(held, 1000, 64 // 2)                                    # a step's 64 tokens: a draft token each
    assert b == 32
    assert out["offline_tokens_per_s"][0] == 0 and out["offline_waves"][0] == 0
    assert out["batch_in_flight"].tolist() == [8, b]
    assert out["offline_step_tokens"][1] == 2 * b
    # the offline row's batch sits in HBM, in the memory the run gives the KV cache
    assert out["kv_location"][1] == 0 and out["kv_hbm_bytes_per_device"][1] == approx(b * 1200 * KV_TOKEN / 2)
    assert out["max_batch_hbm"][1] == math.floor(kv_memory / (1200 * KV_TOKEN / 2)) == out["max_batch"][1]
    assert out["max_batch"][0] > out["max_batch_hbm"][0]           # the fixed row may spill to the pool


def test_the_engine_memory_reproduces_the_log_it_was_measured_from():
    """TensorRT-LLM 0.20.0's trtllm-bench of Llama 3.1 8B FP8 on one H100 (NVIDIA/TensorRT-LLM
    issue 6294) gave the KV cache 860,320 tokens (52.51 GiB) at kv_fraction 0.8 for sequences
    of at most 157 tokens, beside 8.46 GiB of weights: the default engine memory holds as much."""
    kw = dict(weight_dtype="fp8", kv_dtype="fp8", scenario="offline", requests=30000, prompt_len=128,
              output_len=29, kv_fraction=0.8)
    run = snlab.serve("llama3-8b", "dgx-h100", **kw)
    assert run.deployment["engine_memory_bytes"] == ENGINE_MEMORY
    assert run.weights_bytes_per_device / 2**30 == pytest.approx(8.46, abs=0.01)
    tokens = run.to_dict()["offline"]["kv_sequences"] * 160          # 157 tokens in blocks of 32
    assert tokens == pytest.approx(860_320, rel=0.002)
    assert run.offline["kv_pool_bytes_per_device"] / 2**30 == pytest.approx(52.51, rel=0.002)   # the log's pool
    assert "KV cache allocated          56.4 GB per device" in str(run)                 # 52.51 GiB
    bare = snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes=0, **kw).to_dict()["offline"]["kv_sequences"]
    assert bare * 160 * 65536 == pytest.approx(tokens * 65536 + 0.8 * ENGINE_MEMORY, rel=0.002)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 2e13])
def test_an_impossible_engine_memory_names_its_field(bad):
    with pytest.raises(snlab.SnlabError, match="engine_memory_bytes") as err:
        snlab.serve("llama3-8b", "dgx-h100", scenario="offline", requests=10, prompt_len=10, output_len=10,
                    engine_memory_bytes=bad)
    assert "10 TB" in str(err.value)
    with pytest.raises(snlab.SnlabError, match="engine_memory_bytes"):    # a grid holding it, too
        snlab.serve_sweep("llama3-8b", "dgx-h100", scenario="offline", requests=10, prompt_len=10, output_len=10,
                          engine_memory_bytes=[0.0, bad])


def test_the_engine_memory_reads_a_size_with_its_unit_and_a_full_device_says_why():
    kw = dict(scenario="offline", requests=10, prompt_len=100, output_len=100)
    assert snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes="4.55 GiB", **kw).deployment[
        "engine_memory_bytes"] == ENGINE_MEMORY
    table = snlab.serve_sweep("llama3-8b", "dgx-h100", engine_memory_bytes=["1 GiB", 0], **kw)
    assert table["engine_memory_bytes"].tolist() == [2**30, 0.0]
    with pytest.raises(snlab.SnlabError, match="engine_memory_bytes.*not a unit of bytes"):
        snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes="4 GHz", **kw)
    full = snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes="80 GB", **kw)
    assert not full.fits and "engine_memory_bytes" in full.reason and "80 GB" in full.reason


def test_a_step_budget_holds_one_micro_batch_of_the_sequences():
    kw = dict(tp=2, pp=2, scenario="offline", requests=100, prompt_len=100, output_len=100, max_sequences=101)
    run = snlab.serve("llama3-70b", "dgx-h100", max_step_tokens=51, **kw)     # 101 over 2 stages: 51 a step
    assert run.offline["step_tokens"] == 51 and run.offline["max_batch_size"] == 51
    with pytest.raises(snlab.SnlabError, match="max_step_tokens"):
        snlab.serve("llama3-70b", "dgx-h100", max_step_tokens=50, **kw)


def test_offline_weights_fit_beside_the_reserve_and_the_engine_s_memory():
    # 16 GB of Llama 3 8B beside an engine that keeps 70 GB: an H100's 85.9 GB less its reserve and the
    # engine's memory leaves 14.4 GB, too little for the weights though HBM holds both
    kw = dict(scenario="offline", requests=10, prompt_len=1024, output_len=256)
    big = snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes=70e9, **kw)
    assert not big.fits and big.reason.startswith("weights need 16.1 GB per device; h100-sxm-80gb has 14.4 GB after")
    assert snlab.serve("llama3-8b", "dgx-h100", engine_memory_bytes=60e9, **kw).fits
    # the same on the bare chain: 1.65 GB of weights a device; 40 GB less its 9.66 GB reserve and an
    # engine of 29.5 GB leave 0.84 GB, of 27 GB 3.34 GB
    model = snlab.model("megatron-1.7b")
    for engine, fit in ((29.5e9, False), (27e9, True)):
        out = S.serve_columns(model, offline_deployment(engine_memory_bytes=engine), HW)
        assert bool(out["fits_weights"]) is fit and bool(out["fits"]) is fit


def test_an_engine_memory_beyond_the_device_is_a_plan_that_does_not_fit():
    """An engine that keeps more than the device has leaves nothing for the weights: the
    deployment does not fit, says why, and every number stays finite, alone and in a grid."""
    kw = dict(tp=2, scenario="offline", requests=10, prompt_len=1000, output_len=100)
    for engine in (200e9, 1e12, 1e13):
        run = snlab.serve("llama3-70b", "dgx-h100", engine_memory_bytes=engine, **kw)
        assert not run.fits and "engine_memory_bytes" in run.reason and run.offline["kv_sequences"] == 0
        assert "none: the run cannot start" in str(run)
    table = snlab.serve_sweep("llama3-70b", "dgx-h100", engine_memory_bytes=[4e9, 2e11], **kw)
    assert table["fits"].tolist() == [True, False]
    numbers = table.select_dtypes("number").astype(float)
    assert np.isfinite(numbers.fillna(0.0).to_numpy()).all()
