"""The serving step, part by part, pinned by hand.

Each test takes one part of :mod:`snlab.serving.step` for one small case, GPT-3 1.7B of
Megatron-LM's Table 1 (h = 2304, L = 24, a = 24 heads of 96, V = 51,200, tied
embeddings) on a made-up system with round numbers, and recomputes its output here with
the arithmetic written out, independently of the walls' formulas. A change to any term
of the step fails one of these tests (``tests/mutate.py``, ``make mutate``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import snlab
from snlab.hardware import hardware
from snlab.serving import deployment as dp_
from snlab.serving import step as S

MODEL = snlab.model("megatron-1.7b")
SS = S.serving_sizes(MODEL)
H, L, A, V, DH = 2304.0, 24.0, 24.0, 51200.0, 96.0
DENSE = 12 * H * H                               # a layer's matrix weights
KV_TOKEN = 2 * L * A * DH * 2                    # K and V of every layer, 16-bit [bytes per token]
PER_KEY = 4 * L * A * DH                         # attention FLOPs per query per key, all layers
HW = dataclasses.replace(
    hardware(snlab.system("cloudmatrix384")),
    peak_flops=100e12, gemm_efficiency=0.5, sustained_clock=0.8, hbm_bandwidth=2e12, memory_efficiency=0.5,
    decode_attention_efficiency=0.25, hbm_capacity=40e9, dies=1.0,
    scale_up_domain_size=16.0, devices_per_node=16.0, scale_up_bandwidth=100e9, scale_up_efficiency=0.5,
    scale_up_latency=1e-6, scale_up_node_latency=1e-6, scale_up_call_latency=10e-6,
    scale_out_bandwidth=10e9, scale_out_efficiency=0.8, scale_out_latency=4e-6, scale_out_call_latency=20e-6,
    pool_bandwidth=50e9, pool_latency=2e-6, pool_capacity=40e9 * 15 / 16, pool_domain_capacity=40e9 * 15,
    host_bandwidth=20e9, host_latency=5e-6, host_capacity=100e9, storage_bandwidth=5e9, storage_latency=50e-6,
    storage_capacity=1e12, overlap_contention=0.2, scale_up_ep_dispatch_efficiency=0.0,
    scale_up_ep_combine_efficiency=0.0, scale_up_ep_bulk_efficiency=0.0, scale_out_ep_dispatch_efficiency=0.0,
    scale_out_ep_combine_efficiency=0.0, scale_out_ep_bulk_efficiency=0.0,
    kernel_floor=0.0, decode_attention_floor=0.0, launch_overhead=0.0, scale_up_direct_call_latency=0.0)
#: achievable FLOP/s (efficiency x sustained clock x peak), HBM bytes/s, decode-attention FLOP/s, scale-up bytes/s
FLOP_RATE, BYTE_RATE, ATTN_RATE, UP = 0.5 * 0.8 * 100e12, 0.5 * 2e12, 0.25 * 0.8 * 100e12, 0.5 * 100e9
OUT = 0.8 * 10e9
REL = 1e-12


def approx(expected, rel=REL):
    """Equal to ``rel`` relative error, with no absolute floor (times here are microseconds)."""
    return pytest.approx(expected, rel=rel, abs=0)


def deployment(**kw) -> dp_.Deployment:
    """A deployment of scalars: one device, batch 1, bf16 weights and KV cache; no graph,
    no kernel fixed time, no occupancy limit and balanced experts (the engine's terms are
    pinned on their own below)."""
    base = dict(tp=1, pp=1, dp=1, ep=1, batch=1, prompt_len=4096, output_len=512, context=4096,
                capacity_context=4096, weight_dtype=0, kv_dtype=0, weight_bytes=2, kv_bytes=2, gemm_ratio=1,
                draft_tokens=0, acceptance=0.7, microbatches=1, ep_overlap=0, prefill_batch=1, hbm_utilization=0.9,
                pool_share=1, kv_offload=1, output_dist=0, expert_imbalance=1, graphs=0, host_step_s=0,
                efficiency_ratio=1, gemm_half=0, scenario=0, requests=1, max_sequences=0, max_step_tokens=0,
                kv_fraction=0.95, kv_block_tokens=32, engine_memory_bytes=4.55 * 2**30)
    base.update(kw)
    return dp_.Deployment(**{k: float(v) for k, v in base.items()})


def placed(dep: dp_.Deployment):
    """The weights of ``dep`` on HW and where its KV cache goes."""
    w = S.weights(SS.base, dep, HW)
    return w, S.placement(SS, dep, HW, w)


def roofline(flops, bytes_, rate=FLOP_RATE):
    return max(flops / rate, bytes_ / BYTE_RATE)


def ring_all_reduce(msg, n):
    return 10e-6 + 2 * (n - 1) * 1e-6 + 2 * (n - 1) / n * msg / UP


def test_serving_sizes():
    assert SS.kv_elements_per_token * 2 == KV_TOKEN
    assert SS.prefill_attention_per_key == PER_KEY == SS.decode_attention_per_key
    assert SS.kv_shard_max == A


def test_weights_per_device():
    w = S.weights(SS.base, deployment(tp=2), HW)
    emb = V * H + 2048 * H                       # tied output head, learned positions
    assert w.per_device == approx((SS.base.layer_params + emb) / 2 * 2)
    w = S.weights(SS.base, deployment(tp=2, pp=2, weight_bytes=1), HW)
    # 8-bit layers; the output head stays in 16 bits (HEAD_BYTES)
    assert w.per_device == approx((SS.base.layer_params / 2 * 1 + V * H * 2) / 2)
    assert w.rank_dies == 1
    two_dies = dataclasses.replace(HW, dies=2.0)
    w1 = S.weights(SS.base, deployment(tp=1), two_dies)
    assert w1.rank_dies == 2 and w1.per_device == approx(2 * (SS.base.layer_params + emb) * 2)


def test_the_kv_cache_fills_hbm_then_the_pool_then_the_host():
    dep = deployment(tp=2, batch=24, capacity_context=150_000)
    w, place = placed(dep)
    kv = 24 * 150_000 * KV_TOKEN / 2
    assert place.kv_per_device == approx(kv) and place.shard == 2
    hbm = 0.9 * 40e9 - w.per_device
    # the pool: 14 devices outside the job lend theirs (the pool over the 15 others each)
    pool = 14 * 40e9 / 2
    assert place.capacity["hbm"] == approx(hbm)
    assert place.capacity["pool"] == approx(pool)
    assert place.placed["hbm"] == approx(hbm)
    assert place.placed["pool"] == approx(min(kv - hbm, pool))
    assert place.placed["host"] == approx(kv - hbm - pool)
    assert place.location == 2 and place.unplaced == 0
    assert place.share["pool"] == approx(pool / kv)
    # the lenders: the pool bytes of both devices over what one peer lends (90% of its HBM)
    assert place.lenders == math.ceil(pool * 2 / (0.9 * 40e9))
    assert 0 < place.placed["host"] < 100e9 and place.placed["ssd"] == 0
    hbm_only = S.placement(SS, deployment(tp=2, batch=24, capacity_context=150_000, kv_offload=0), HW, w)
    assert hbm_only.unplaced == approx(kv - hbm) and hbm_only.location == 4


def test_far_reads_add_per_tier():
    share = {"hbm": 0.5, "pool": 0.3, "host": 0.2, "ssd": 0.0}
    t = S.far_read_time(1e9, share, HW, 24.0)
    assert t == approx(0.3e9 / 50e9 + 24 * 2e-6 + 0.2e9 / 20e9 + 24 * 5e-6)


def _decode_pass(dep, tok, ctx, kv_bytes, share, logits):
    w = S.weights(SS.base, dep, HW)
    return w, S.forward_pass(SS, dep, HW, w, tok, ctx, kv_bytes, share, logits, prefill=False)


def test_one_decode_pass():
    dep = deployment(tp=2)
    tok, ctx = 8.0, 4096.0
    kv = tok * ctx * KV_TOKEN / 2
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    w, p = _decode_pass(dep, tok, ctx, kv, share, tok)
    dense_read = (SS.base.layer_params + V * H) / 2 * 2
    dense_flops = (2 * tok * DENSE * L + 2 * tok * V * H) / 2
    act = 2 * tok * H * L * 4 / 2
    assert p.dense == approx(roofline(dense_flops, dense_read + act))
    assert p.head == approx(roofline(2 * tok * V * H / 2, V * H / 2 * 2))
    attn = tok * ctx * PER_KEY / 2 / ATTN_RATE
    assert p.kv == approx(kv / BYTE_RATE)
    assert p.attention == approx(max(attn, kv / BYTE_RATE))
    assert p.tp == approx(2 * L * ring_all_reduce(tok * H * 2, 2))
    assert p.ep == 0 and p.expert == 0
    assert p.weights_read == approx(dense_read)
    assert p.memory_wall == approx((dense_read + act) / BYTE_RATE + kv / BYTE_RATE)
    assert p.compute_wall == approx(dense_flops / FLOP_RATE + tok * ctx * PER_KEY / 2 / FLOP_RATE)


def test_a_spilled_kv_cache_is_staged_into_hbm():
    dep = deployment(tp=2)
    kv = 1e9
    share = {"hbm": 0.25, "pool": 0.75, "host": 0.0, "ssd": 0.0}
    _, p = _decode_pass(dep, 8.0, 4096.0, kv, share, 8.0)
    far = 0.75e9 / 50e9 + L * 2e-6
    assert p.kv == approx(max(kv / BYTE_RATE, far))   # every byte still read from HBM


def test_the_stage_with_two_micro_batches_hides_the_expert_traffic():
    dep = deployment(tp=2, microbatches=2, ep_overlap=0.5)
    w = S.weights(SS.base, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    st = S.stage(SS, dep, HW, w, 16.0, 4096.0, 1e8, share, 16.0, prefill=False)
    half = S.forward_pass(SS, dep, HW, w, 8.0, 4096.0, 0.5e8, share, 8.0, prefill=False)
    compute = 2 * (half.dense + half.expert + half.attention + half.elementwise + half.fixed)
    assert st.ep_exposed == 0                                    # a dense model has no expert traffic
    assert st.time == approx(compute + 2 * half.tp)
    assert st.parts.dense == approx(2 * half.dense)


def test_decode_step_tpot_and_rate():
    dep = deployment(tp=2, batch=16, context=10_000, draft_tokens=2, acceptance=0.5)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    tau = (1 - 0.5 ** 3) / (1 - 0.5)                             # Leviathan et al. Eq. 1
    assert dec.tokens_per_step == approx(tau)
    tok = 16 * 3
    assert dec.kv_read == approx(16 * 10_000 * KV_TOKEN / 2)
    st = S.stage(SS, dep, HW, w, tok, 10_000, dec.kv_read, place.share, tok, prefill=False)
    draft = 1 + 2 / L                                             # one MTP block per draft token
    sampling = 2 * tok * V * 4 / BYTE_RATE                        # fp32 logits read twice, no graph
    assert dec.sampling == approx(sampling)
    assert dec.step == approx(st.time * draft + 2 * st.parts.head + sampling)
    assert dec.tpot == approx(dec.step / tau)
    assert dec.rate == approx(16 * tau / dec.step)


def test_decode_through_a_pipeline_pays_its_hops():
    dep = deployment(tp=2, pp=2, batch=16)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    hop = 10e-6 + 1e-6 + 8 * H * 2 / 2 / UP                      # 8 sequences a micro-batch, inside the domain
    assert dec.hop == approx(hop)
    assert dec.step == approx(2 * (dec.stage.time + hop) + dec.sampling)
    assert dec.sampling == approx(2 * 16 * V * 4 / BYTE_RATE)   # the last stage samples every sequence


def test_prefill():
    dep = deployment(tp=2, pp=2, prefill_batch=2, prompt_len=8192)
    w, place = placed(dep)
    pre = S.prefill(SS, dep, HW, w, place)
    tok = 2 * 8192
    st = S.stage(SS, dep, HW, w, tok, 8192 / 2, tok * KV_TOKEN / 4, place.share, 2.0, prefill=True)
    hop = 10e-6 + 1e-6 + tok * H * 2 / 2 / UP
    assert pre.ttft == approx(2 * st.time + hop)
    assert pre.rate == approx(tok / (st.time * 2 * 2))


def test_continuous_and_static_batching():
    dep = deployment(tp=2, batch=8, output_len=500, output_dist=1)
    w, place = placed(dep)
    dec, pre = S.decode(SS, dep, HW, w, place), S.prefill(SS, dep, HW, w, place)
    cont, static = S.batching(dep, dec, pre)
    # Orca/vLLM: every slot refilled at once; static: the batch waits for its longest answer
    assert cont == approx(8 * 500 / (8 * pre.ttft + 500 * dec.step))
    longest = 2 * 500 * 8 / 9                                      # uniform lengths, E[max of 8]
    assert static == approx(8 * 500 / (8 * pre.ttft + longest * dec.step))


def test_limits():
    dep = deployment(tp=2, dp=2, batch=8, capacity_context=100_000)
    w, place = placed(dep)
    fit = S.limits(SS, dep, place)
    hbm = (0.9 * 40e9 - w.per_device) * 2                          # a replica's two devices
    assert fit["max_batch_hbm"] == 2 * math.floor(hbm / (100_000 * KV_TOKEN))
    assert fit["max_context_hbm"] == math.floor(hbm / (4 * KV_TOKEN))
    every = sum(place.capacity.values()) * 2
    assert fit["max_batch_all"] == 2 * math.floor(every / (100_000 * KV_TOKEN))


def test_walls_and_columns():
    dep = deployment(tp=2, batch=64, capacity_context=100_000, context=100_000)
    out = S.serve_columns(MODEL, dep, HW)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    wall = S.walls(dep, HW, dec)
    parts = dec.stage.parts
    assert wall["compute"] == approx(parts.compute_wall)
    assert wall["memory"] == approx(parts.memory_wall)
    assert wall["communication"] == approx(parts.tp)
    lenders = place.lenders
    assert lenders > 0
    assert out["decode_tokens_per_s_per_device"] == approx(dec.rate / (2 + lenders))
    assert out["tpot_s"] == approx(dec.tpot)
    assert out["kv_pool_bytes_per_device"] == approx(place.placed["pool"])
    assert out["time_weights_s"] == approx(parts.weights_read / BYTE_RATE)
    assert out["kv_spill_slowdown"] == approx(parts.kv / (dec.kv_read / BYTE_RATE))
    assert bool(out["fits"]) is True


# --- latent attention, experts, FP8 weights, pipelines, drafts ----------------------------

def test_latent_attention_sizes():
    ss = S.serving_sizes(snlab.model("deepseek-v3"))
    assert ss.kv_elements_per_token == 61 * (512 + 64)             # the latent and the rotary key
    assert ss.decode_attention_per_key == 2 * 61 * 128 * (2 * 512 + 64)   # absorbed: every head reads the latent
    assert ss.prefill_attention_per_key == 4 * 61 * 128 * (128 + 64 + 128) / 2
    assert ss.kv_shard_max == 1                                     # tensor parallelism replicates the latent


QWEN_SS = S.serving_sizes(snlab.model("qwen3-30b-a3b"))
QK = QWEN_SS.base                                                # 48 layers, h 2048, 128 experts top 8


def test_expert_weights_per_device():
    dep = deployment(tp=4, dp=2, ep=8, weight_bytes=1, pp=2)
    w = S.weights(QK, dep, HW)
    # 16 experts a device, whole (tp / ep < 1), half the layers; untied: the head on the last stage
    expert = 16 * QK.expert_params_one * 48 / 2
    dense = (QK.layer_params / 2 * 1 + 151936 * 2048 * 2) / 4
    assert w.per_device == approx(dense + expert * 1)
    wide = deployment(tp=16, dp=1, ep=2, weight_bytes=2)
    w = S.weights(QK, wide, HW)
    # 64 experts a device split 8 ways by tensor parallelism; one stage: both embedding tables
    assert w.per_device == approx((QK.layer_params + 2 * 151936 * 2048) / 16 * 2
                                  + 64 * QK.expert_params_one * 48 / 8 * 2)


def test_expert_reads_only_the_slots_some_token_reached():
    dep = deployment(tp=2, dp=4, ep=8, weight_bytes=1, gemm_ratio=2)
    tok = 16.0
    read, flops, t = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)
    fp8_rate = 2 * FLOP_RATE
    rho = 1 - (1 - 8 / 128) ** (tok * 8 / 2)                      # 16 slots, tokens from 4 tp groups
    assert read == approx(16 * rho * QK.expert_params_one * 1 * 48)
    assert flops == approx(2 * tok * 8 * QK.expert_params_one / 2 * 48)
    assert t == approx(max(flops / fp8_rate, read / BYTE_RATE))
    tp_split = deployment(tp=8, dp=1, ep=2)
    read, _, _ = S.routed_experts(QWEN_SS, tp_split, HW, tok, HW.gemm_efficiency)
    rho = 1 - (1 - 8 / 128) ** (tok * 8 / 8)
    assert read == approx(64 * rho * QK.expert_params_one / 4 * 2 * 48)


def test_expert_dispatch_in_a_decode_pass():
    dep = deployment(tp=1, dp=16, ep=16, weight_bytes=1, batch=16)
    w = S.weights(QK, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    p = S.forward_pass(QWEN_SS, dep, HW, w, 4.0, 1000.0, 1e6, share, 4.0, prefill=False)
    # low-latency kernels: every (token, expert) copy written to its device, 8-bit dispatch, 16-bit combine
    sent = 4 * 8 * 2048
    disp = 10e-6 + 1e-6 + sent * 15 / 16 * 1 / UP
    comb = 10e-6 + 1e-6 + sent * 15 / 16 * 2 / UP
    assert p.ep == approx(48 * (disp + comb))
    assert p.tp == 0
    bf16 = deployment(tp=1, dp=16, ep=16, weight_bytes=2, batch=16)
    p16 = S.forward_pass(QWEN_SS, bf16, HW, S.weights(QK, bf16, HW), 4.0, 1000.0, 1e6, share, 4.0, prefill=False)
    assert p16.ep == approx(48 * 2 * comb)
    one = deployment(tp=1, dp=16, ep=1, batch=16)
    assert S.forward_pass(QWEN_SS, one, HW, S.weights(QK, one, HW), 4.0, 1000.0, 1e6, share, 4.0,
                          prefill=False).ep == 0


def test_two_batch_overlap_hides_part_of_the_expert_traffic():
    dep = deployment(tp=1, dp=16, ep=16, microbatches=2, ep_overlap=0.5, batch=64)
    w = S.weights(QK, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    st = S.stage(QWEN_SS, dep, HW, w, 8.0, 1000.0, 2e6, share, 8.0, prefill=False)
    half = S.forward_pass(QWEN_SS, dep, HW, w, 4.0, 1000.0, 1e6, share, 4.0, prefill=False)
    c, e = 2 * (half.dense + half.expert + half.attention + half.elementwise + half.fixed), 2 * half.ep
    body = c + e - (1 - 0.2) * 0.5 * min(c, e)
    assert st.time == approx(body + 2 * half.tp)
    assert st.ep_exposed == approx(body - c)
    single = deployment(tp=1, dp=16, ep=16, microbatches=1, ep_overlap=0.5, batch=64)
    st1 = S.stage(QWEN_SS, single, HW, w, 8.0, 1000.0, 2e6, share, 8.0, prefill=False)
    assert st1.ep_exposed == approx(st1.parts.ep)                 # one batch: nothing to hide behind


def test_a_decode_pass_on_a_pipeline_stage_in_fp8():
    dep = deployment(tp=2, pp=2, weight_bytes=1, gemm_ratio=2)
    tok, ctx = 8.0, 4096.0
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    w = S.weights(SS.base, dep, HW)
    kv = tok * ctx * KV_TOKEN / 4
    p = S.forward_pass(SS, dep, HW, w, tok, ctx, kv, share, tok, prefill=False)
    dense_read = (SS.base.layer_params / 2 * 1 + V * H * 2) / 2
    dense_flops = (2 * tok * DENSE * L / 2 + 2 * tok * V * H) / 2
    act = 2 * tok * H * L / 2 * 4 / 2
    fp8_rate = 2 * FLOP_RATE
    assert p.dense == approx(max(dense_flops / fp8_rate, (dense_read + act) / BYTE_RATE))
    attn = tok * ctx * PER_KEY / (2 * 2)
    assert p.attention == approx(max(attn / ATTN_RATE, kv / BYTE_RATE))
    assert p.tp == approx(2 * L / 2 * ring_all_reduce(tok * H * 2, 2))
    assert p.compute_wall == approx(dense_flops / (FLOP_RATE * 2) + attn / FLOP_RATE)
    plain = dataclasses.replace(HW, decode_attention_efficiency=0.0)   # no kernel measured: as a GEMM
    q = S.forward_pass(SS, dep, plain, w, tok, ctx, kv, share, tok, prefill=False)
    assert q.attention == approx(max(attn / FLOP_RATE, kv / BYTE_RATE))


def test_where_the_kv_cache_lands():
    w = S.weights(SS.base, deployment(tp=2), HW)
    pool = S.placement(SS, deployment(tp=2, batch=8, capacity_context=150_000), HW, w)
    assert pool.location == 1 and pool.placed["host"] == 0
    ssd = S.placement(SS, deployment(tp=2, batch=40, capacity_context=150_000), HW, w)
    assert ssd.location == 3 and ssd.placed["ssd"] > 0 and ssd.unplaced == 0
    kv = 2000 * 150_000 * KV_TOKEN / 2
    over = S.placement(SS, deployment(tp=2, batch=2000, capacity_context=150_000), HW, w)
    # what finds no room is charged, for timing, to the farthest tier there is
    assert over.location == 4 and over.unplaced > 0
    assert over.placed["ssd"] == approx(kv - (0.9 * 40e9 - w.per_device) - 14 * 40e9 / 2 - 100e9)
    no_far = dataclasses.replace(HW, storage_bandwidth=0.0, host_bandwidth=0.0)
    hostless = S.placement(SS, deployment(tp=2, batch=2000, capacity_context=150_000), no_far, w)
    assert hostless.placed["pool"] == approx(kv - (0.9 * 40e9 - w.per_device))
    no_pool = dataclasses.replace(no_far, pool_bandwidth=0.0)
    alone = S.placement(SS, deployment(tp=2, batch=2000, capacity_context=150_000), no_pool, w)
    assert alone.placed["hbm"] == approx(kv) and alone.share["hbm"] == 1
    shared = S.placement(SS, deployment(tp=2, batch=8, capacity_context=150_000, pool_share=0.5), HW, w)
    assert shared.capacity["pool"] == approx(14 * 40e9 / 2 * 0.5)


def test_prefill_attends_to_half_the_prompt_and_writes_its_kv_cache():
    dep = deployment(tp=2, prefill_batch=2, prompt_len=8192)
    w, place = placed(dep)
    pre = S.prefill(SS, dep, HW, w, place)
    tok = 2 * 8192
    p = S.forward_pass(SS, dep, HW, w, tok, 4096, tok * KV_TOKEN / 2, place.share, 2.0, prefill=True)
    assert pre.stage.parts.attention == approx(max(tok * 4096 * PER_KEY / 2 / FLOP_RATE, tok * KV_TOKEN / 2 / BYTE_RATE))
    assert pre.ttft == approx(p.dense + p.expert + p.attention + p.elementwise + p.fixed + p.tp)
    assert pre.rate == approx(tok / (pre.ttft * 2))
    out = deployment(tp=2, pp=2, dp=8, prefill_batch=1, prompt_len=8192)      # 32 devices: hops leave the domain
    w = S.weights(SS.base, out, HW)
    pre = S.prefill(SS, out, HW, w, S.placement(SS, out, HW, w))
    assert pre.ttft == approx(2 * pre.stage.time + 20e-6 + 4e-6 + 8192 * H * 2 / 2 / OUT)


def test_static_batches_wait_for_their_longest_answer():
    dep = deployment(tp=2, batch=8, output_len=500, output_dist=2)
    w, place = placed(dep)
    dec, pre = S.decode(SS, dep, HW, w, place), S.prefill(SS, dep, HW, w, place)
    _, static = S.batching(dep, dec, pre)
    longest = 500 * (math.log(8) + 0.5772156649015329 + 1 / 16 - 1 / (12 * 64))   # E[max of 8 exponentials]
    assert static == approx(8 * 500 / (8 * pre.ttft + longest * dec.step), rel=1e-9)
    fixed = deployment(tp=2, batch=8, output_len=500, output_dist=0)
    cont, static = S.batching(fixed, dec, pre)
    assert static == approx(cont)
    replicas = deployment(tp=2, dp=2, batch=8, output_len=500, prefill_batch=2)
    cont, _ = S.batching(replicas, dec, pre)
    assert cont == approx(4 * 500 / (4 * pre.ttft / 2 + 500 * dec.step))


def test_decode_with_drafts_on_a_pipeline():
    dep = deployment(tp=2, pp=2, dp=2, batch=16, draft_tokens=1, acceptance=0.8, weight_bytes=1, gemm_ratio=2)
    w, place = placed(dep)
    dec = S.decode(SS, dep, HW, w, place)
    seqs = 16 / 2 / 2
    assert dec.kv_read == approx(seqs * 4096 * KV_TOKEN / (2 * 2))
    st = S.stage(SS, dep, HW, w, seqs * 2, 4096, dec.kv_read, place.share, seqs * 2, prefill=False)
    hop = 10e-6 + 1e-6 + seqs * 2 * H * 2 / 2 / UP
    draft = 1 + 1 / L
    assert dec.step == approx(2 * (st.time + hop) * draft + st.parts.head + 2 * 16 / 2 * 2 * V * 4 / BYTE_RATE)
    wall = S.walls(dep, HW, dec)
    parts = dec.stage.parts
    assert wall["compute"] == approx(2 * draft * parts.compute_wall + parts.head_flops / (FLOP_RATE * 2))
    assert wall["memory"] == approx(2 * draft * parts.memory_wall + parts.head_bytes / BYTE_RATE)
    assert wall["communication"] == approx(2 * draft * (parts.tp + hop))
    out = S.serve_columns(MODEL, dep, HW)
    rounds = 2 * draft
    pre = S.prefill(SS, dep, HW, w, place)
    cont, static = S.batching(dep, dec, pre)
    expected = {
        "tokens_per_step": 1 + 0.8, "decode_tokens_per_s": 16 * 1.8 / dec.step,
        "prefill_tokens_per_s_per_device": pre.rate, "continuous_tokens_per_s_per_device": cont / 4,
        "static_tokens_per_s_per_device": static / 4, "continuous_over_static": cont / static,
        "kv_bytes_per_token": KV_TOKEN / 2 * 2, "kv_read_bytes_per_step_per_device": rounds * dec.kv_read,
        "time_kv_s": rounds * parts.kv, "kv_time_per_output_token_s": rounds * parts.kv / 1.8,
        "time_weights_s": (rounds * parts.weights_read + parts.head_bytes) / BYTE_RATE,
        "time_dense_s": rounds * parts.dense + parts.head, "time_draft_head_s": parts.head,
        "time_experts_s": 0.0, "time_attention_s": rounds * parts.attention, "time_tp_s": rounds * parts.tp,
        "time_ep_s": 0.0, "exposed_ep_s": 0.0, "time_pp_s": rounds * hop,
        "prefill_time_tp_s": 2 * pre.stage.parts.tp, "prefill_time_ep_s": 0.0, "prefill_exposed_ep_s": 0.0,
        "decode_step_s": dec.step, "ttft_s": pre.ttft,
    }
    for key, value in expected.items():
        assert out[key] == approx(value), key
    assert out["kv_bytes_per_token"] == KV_TOKEN                  # the 8-bit weights leave the cache in bf16


def test_per_device_rates_count_the_lenders():
    dep = deployment(tp=2, batch=24, capacity_context=150_000, context=100_000, prefill_batch=2)
    out = S.serve_columns(MODEL, dep, HW)
    w, place = placed(dep)
    dec, pre = S.decode(SS, dep, HW, w, place), S.prefill(SS, dep, HW, w, place)
    cont, static = S.batching(dep, dec, pre)
    lenders = place.lenders
    charged = (2 + lenders) / 2
    assert lenders > 0
    assert out["prefill_tokens_per_s_per_device"] == approx(pre.rate / charged)
    assert out["continuous_tokens_per_s_per_device"] == approx(cont / (2 * charged))
    assert out["static_tokens_per_s_per_device"] == approx(static / (2 * charged))
    assert out["kv_spill_slowdown"] >= 1
    fit = S.limits(SS, dep, place)
    assert out["max_batch"] == fit["max_batch_all"] and out["max_context_hbm"] == fit["max_context_hbm"]


# --- the remaining branches --------------------------------------------------------------

def test_a_two_die_package_with_tensor_parallelism_holds_one_copy():
    two_dies = dataclasses.replace(HW, dies=2.0)
    w = S.weights(SS.base, deployment(tp=2), two_dies)
    assert w.rank_dies == 1
    emb = V * H + 2048 * H
    assert w.per_device == approx((SS.base.layer_params + emb) / 2 * 2)


def test_data_parallel_replicas_split_the_batch_and_big_weights_leave_no_room():
    w = S.weights(SS.base, deployment(tp=2, dp=2), HW)
    place = S.placement(SS, deployment(tp=2, dp=2, batch=8, capacity_context=10_000), HW, w)
    assert place.kv_per_device == approx(8 / 2 * 10_000 * KV_TOKEN / 2)
    tiny = dataclasses.replace(HW, hbm_capacity=1e9)
    w = S.weights(SS.base, deployment(tp=1), tiny)
    place = S.placement(SS, deployment(tp=1, batch=1, capacity_context=1000), tiny, w)
    assert place.capacity["hbm"] == 0 and not place.weights_fit


def test_what_finds_no_room_is_charged_to_the_host_without_storage():
    no_ssd = dataclasses.replace(HW, storage_bandwidth=0.0)
    w = S.weights(SS.base, deployment(tp=2), no_ssd)
    kv = 2000 * 150_000 * KV_TOKEN / 2
    over = S.placement(SS, deployment(tp=2, batch=2000, capacity_context=150_000), no_ssd, w)
    assert over.placed["host"] == approx(kv - (0.9 * 40e9 - w.per_device) - 14 * 40e9 / 2)


def test_prefill_in_fp8_is_compute_bound_at_the_fp8_peak():
    dep = deployment(tp=2, weight_bytes=1, gemm_ratio=2, prompt_len=8192)
    w = S.weights(SS.base, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    tok = 8192.0
    p = S.forward_pass(SS, dep, HW, w, tok, 4096.0, tok * KV_TOKEN / 2, share, 1.0, prefill=True)
    dense_flops = (2 * tok * DENSE * L + 2 * 1 * V * H) / 2
    dense_bytes = (SS.base.layer_params * 1 + V * H * 2) / 2 + 2 * tok * H * L * 4 / 2
    assert dense_flops / (2 * FLOP_RATE) > dense_bytes / BYTE_RATE
    assert p.dense == approx(dense_flops / (2 * FLOP_RATE))
    assert p.head_flops == approx(2 * 1 * V * H / 2) and p.head_bytes == approx(V * H / 2 * 2)   # the head in 16 bits
    place = S.placement(SS, dep, HW, w)
    pre = S.prefill(SS, dep, HW, w, place)
    assert pre.stage.parts.kv == approx(tok * KV_TOKEN / 2 / BYTE_RATE)   # the prompt's KV written


def test_latent_attention_decode_is_compute_bound_at_the_kernel_s_efficiency():
    ds = snlab.model("deepseek-v3")
    ss = S.serving_sizes(ds)
    dep = deployment(tp=1, dp=32, ep=32, batch=32)
    w = S.weights(ss.base, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    tok, ctx = 4.0, 8192.0
    kv = tok * ctx * ss.kv_elements_per_token * 2
    p = S.forward_pass(ss, dep, HW, w, tok, ctx, kv, share, tok, prefill=False)
    flops = tok * ctx * ss.decode_attention_per_key
    assert flops / ATTN_RATE > kv / BYTE_RATE
    assert p.attention == approx(flops / ATTN_RATE)


def test_tensor_parallel_decode_spans_the_domain_as_a_group():
    dep = deployment(tp=16)
    w = S.weights(SS.base, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    p = S.forward_pass(SS, dep, HW, w, 8.0, 1000.0, 1e6, share, 8.0, prefill=False)
    assert p.tp == approx(2 * L * ring_all_reduce(8 * H * 2, 16))


def test_experts_on_a_pipeline_stage_with_tensor_parallelism():
    dep = deployment(tp=2, pp=2, dp=8, ep=16, weight_bytes=2, batch=16)
    w = S.weights(QK, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    tok = 8.0
    p = S.forward_pass(QWEN_SS, dep, HW, w, tok, 1000.0, 1e6, share, tok, prefill=False)
    read, flops, t = S.routed_experts(QWEN_SS, dep, HW, tok, HW.gemm_efficiency)
    slots, rho = 8, 1 - (1 - 8 / 128) ** (tok * 16 / 2)
    assert read == approx(slots * rho * QK.expert_params_one * 2 * 48 / 2)
    assert flops == approx(2 * tok * 8 * QK.expert_params_one / 2 * 48 / 2)
    sent = tok / 2 * 8 * 2048                                    # each rank dispatches its share of the tokens
    disp = 10e-6 + 1e-6 + sent * 15 / 16 * 2 / UP
    assert p.ep == approx(48 / 2 * 2 * disp)
    dense_flops = (2 * tok * QK.dense_matmul_params * 24 + 2 * tok * 151936 * 2048) / 2
    attn_flops = tok * 1000 * QWEN_SS.decode_attention_per_key / (2 * 2)
    assert p.compute_wall == approx((dense_flops + flops) / FLOP_RATE + attn_flops / FLOP_RATE)
    dense_read = (QK.layer_params / 2 + 151936 * 2048) / 2 * 2
    act = 2 * tok * 2048 * 24 * 4 / 2
    assert p.weights_read == approx(dense_read + read)
    assert p.memory_wall == approx((dense_read + act + read) / BYTE_RATE + p.kv)
    two = deployment(tp=1, dp=2, ep=2, batch=2)
    q = S.forward_pass(QWEN_SS, two, HW, S.weights(QK, two, HW), 1.0, 1000.0, 1e6, share, 1.0, prefill=False)
    assert q.ep > 0


def test_a_stage_of_two_micro_batches_runs_each_output_head_on_its_half():
    dep = deployment(tp=2, microbatches=2)
    w = S.weights(SS.base, dep, HW)
    share = {"hbm": 1.0, "pool": 0.0, "host": 0.0, "ssd": 0.0}
    st = S.stage(SS, dep, HW, w, 16.0, 4096.0, 1e8, share, 16.0, prefill=False)
    assert st.parts.head_flops == approx(2 * (2 * 8 * V * H / 2))


def test_drafts_count_in_static_and_continuous_batching():
    dep = deployment(tp=2, batch=8, output_len=500, output_dist=1, draft_tokens=2, acceptance=0.5)
    w, place = placed(dep)
    dec, pre = S.decode(SS, dep, HW, w, place), S.prefill(SS, dep, HW, w, place)
    cont, static = S.batching(dep, dec, pre)
    tau = 1.75
    assert cont == approx(8 * 500 / (8 * pre.ttft + 500 / tau * dec.step))
    assert static == approx(8 * 500 / (8 * pre.ttft + 2 * 500 * 8 / 9 / tau * dec.step))


def test_the_communication_wall_counts_the_exposed_expert_traffic():
    dep = deployment(tp=1, dp=16, ep=16, batch=64, microbatches=2, ep_overlap=0.5)
    w = S.weights(QK, dep, HW)
    place = S.placement(QWEN_SS, dep, HW, w)
    dec = S.decode(QWEN_SS, dep, HW, w, place)
    assert dec.stage.ep_exposed > 0
    wall = S.walls(dep, HW, dec)
    assert wall["communication"] == approx(dec.stage.parts.tp + dec.stage.ep_exposed + dec.hop)
