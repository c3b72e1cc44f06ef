"""The training step, part by part, pinned by hand.

Each test takes one part of :mod:`snlab.training.step` for one small case, GPT-3 1.7B of
Megatron-LM's Table 1 (h = 2304, L = 24, a = 24, V = 51,200, s = 2048, f = 4h, tied
embeddings) on a made-up system with round numbers, and recomputes its output here with
the papers' arithmetic written out, independently of the walls' formulas. A change to any
term of the step (a sign, a factor, a forgotten division) fails one of these tests; the
mutation check (``tests/mutate.py``, ``make mutate``) proves it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import pytest

import snlab
from snlab.hardware import hardware
from snlab.sizing import model_sizes
from snlab.training import plan as pl
from snlab.training import step as S

MODEL = snlab.model("megatron-1.7b")
SIZES = model_sizes(MODEL)
H, L, A, V, SEQ, DH = 2304.0, 24.0, 24.0, 51200.0, 2048.0, 96.0
DENSE = 12 * H * H                       # a GPT layer's matrix weights: 4 h^2 attention + 8 h^2 MLP
TAIL = 1                                 # floor(V h / 12 h^2): the output layer weighs one layer
#: a system with round numbers; one node of 8 devices is the scale-up domain
HW = dataclasses.replace(
    hardware(snlab.system("dgx-a100")),
    peak_flops=100e12, gemm_efficiency=0.5, sustained_clock=1.0, hbm_bandwidth=2e12, memory_efficiency=0.5,
    flash_attention_efficiency=0.25, attention_efficiency_ratio=1.0, attention_peak_ratio=1.0, cast_bytes=0.0,
    scale_up_domain_size=8.0, devices_per_node=8.0, scale_up_bandwidth=100e9, scale_up_efficiency=0.5,
    scale_up_latency=1e-6, scale_up_node_latency=1e-6, scale_up_call_latency=10e-6,
    scale_out_bandwidth=10e9, scale_out_efficiency=0.8, scale_out_latency=4e-6, scale_out_call_latency=20e-6,
    host_bandwidth=20e9, host_memory_bandwidth=100e9, host_capacity=1e12, pool_bandwidth=0.0, pool_capacity=0.0,
    pool_domain_capacity=0.0, overlap_contention=0.2, hbm_capacity=80e9, memory_reserve=0.0,
    allocator_efficiency=1.0)
FLOP_RATE = 0.5 * 100e12                 # achievable matrix-multiply FLOP/s
BYTE_RATE = 0.5 * 2e12                   # achievable HBM bytes/s
ATTN_RATE = 0.25 * 100e12                # the fused attention kernel's FLOP/s
UP = 0.5 * 100e9                         # achievable scale-up bytes/s
OUT = 0.8 * 10e9                         # achievable scale-out bytes/s
REL = 1e-12
TAU = 1e-3                               # each extra pass through a model chunk [s]


def approx(expected, rel=REL):
    """Equal to ``rel`` relative error, with no absolute floor (times here are microseconds)."""
    return pytest.approx(expected, rel=rel, abs=0)


def plan(**kw) -> pl.Plan:
    """A plan of scalars: tp = pp = dp = 1, micro-batch 1, 8 micro-batches, ZeRO-1,
    selective recomputation, FlashAttention, bf16 gradients, Adam, no overlap, 1 ms per
    extra pass through a model chunk."""
    base = dict(tp=1, pp=1, dp=1, ep=1, cp=1, micro_batch=1, global_batch=8, zero_stage=1, recompute=1,
                sequence_parallel=0, interleave=1, offload=0, grad_bytes=2, seq_len=SEQ, flash_attention=1,
                optimizer_bytes=12, first_stage_layers=0, last_stage_layers=0, ep_dispatcher=1, capacity_factor=0,
                expert_imbalance=1, chunk_overhead_s=TAU, fp8_activations=0, expert_tp=0, logit_bytes=4,
                offload_layers=0, fp8_params=0,
                **{f"overlap_{c}": 0.0 for c in pl.OVERLAP_CLASSES})
    base.update(kw)
    return pl.Plan(**{k: float(v) for k, v in base.items()})


def parts(p: pl.Plan, hw=HW, sizes=SIZES):
    lay = S.layout(sizes, p)
    act = S.activations(sizes, p)
    comp = S.compute(sizes, p, hw, lay, act)
    params = S.parameters(sizes, p, lay)
    return lay, act, comp, params


def gemm(m, k, n):
    """Roofline time of an (m x k) by (k x n) multiply in 16-bit."""
    return max(2 * m * k * n / FLOP_RATE, 2 * (m * k + k * n + m * n) / BYTE_RATE)


def ring_reduce_scatter(S_, n, call=10e-6, lat=1e-6):
    """One ring inside the domain: a call, n - 1 steps, (n - 1)/n of the buffer."""
    return call + (n - 1) * lat + (n - 1) / n * S_ / UP


def ring_all_reduce(S_, n, call=10e-6, lat=1e-6):
    return call + 2 * (n - 1) * lat + 2 * (n - 1) / n * S_ / UP


def two_level(S_, n1, n2, all_reduce=True, lat=1e-6):
    """A collective placed as n1 members in each of n2 domains of HW: each ring step's
    latency on its own level (the all-reduce's fill the faster of ring and tree), then
    the slower level's share; spanning domains, the larger call latency."""
    if n2 == 1:
        return ring_all_reduce(S_, n1, lat=lat) if all_reduce else ring_reduce_scatter(S_, n1, lat=lat)
    ring = n2 * (n1 - 1) * lat + (n2 - 1) * 4e-6
    fill = min(ring, (n1 - 1) * lat + math.log2(n2) * 4e-6) if all_reduce else ring
    data = max((n1 - 1) / n1 * S_ / UP, (n2 - 1) / n2 * S_ / n1 / OUT)
    return 20e-6 + (2 * (fill + data) if all_reduce else fill + data)


def placed(S_, n, all_reduce=True, per_domain=8):
    """The fastest equal-share placement of a group of n on domains holding ``per_domain``
    of its members: n1 of them in each of n / n1 domains, n1 a divisor of n."""
    return min(two_level(S_, d, n // d, all_reduce) for d in range(1, n + 1) if n % d == 0 and d <= per_domain)


def p2p(S_, inside=True):
    return 10e-6 + 1e-6 + S_ / UP if inside else 20e-6 + 4e-6 + S_ / OUT


# --- layout and activations -----------------------------------------------------------

def test_layout_of_one_stage():
    lay = S.layout(SIZES, plan(micro_batch=2, cp=2, flash_attention=0))
    assert (lay.first_layers, lay.middle_layers, lay.last_layers) == (L, 0, L)
    assert lay.stage_layers == L and lay.stage_share == 1
    assert lay.tokens == 2 * SEQ / 2                            # b s / c
    assert lay.context == SEQ                                   # materialised scores: all keys
    assert lay.micro_batches == 8 / (2 * 1) and lay.devices == 2


def test_layout_of_four_stages_carries_the_output_layer_on_the_last():
    # 24 layers + 1 tail unit over 4 stages: 6, 7, 6, 6 units; the last's tail leaves it 5 layers
    lay = S.layout(SIZES, plan(pp=4, dp=2, tp=2))
    assert (lay.first_layers, lay.middle_layers, lay.last_layers) == (6, 7, 5)
    assert lay.stage_layers == 7 and lay.stage_share == approx(7 / 24)
    assert lay.context == SEQ / 2                               # causal FlashAttention
    assert lay.devices == 16 and lay.micro_batches == 4


def test_activations_follow_korthikanti_table_2():
    sbh = SEQ * 1 * H
    act = S.activations(SIZES, plan())
    assert act.everything == approx(sbh * (34 + 5 * A * SEQ / H))
    assert act.selective == approx(34 * sbh)
    assert act.full == approx(2 * sbh)
    assert act.kept == act.selective                            # FlashAttention never stores scores
    tp4 = S.activations(SIZES, plan(tp=4, flash_attention=0))
    assert tp4.everything == approx(sbh * (10 + 24 / 4 + 5 * A * SEQ / (H * 4)))
    assert tp4.kept == tp4.everything
    sp4 = S.activations(SIZES, plan(tp=4, sequence_parallel=1, micro_batch=2))
    assert sp4.selective == approx(2 * sbh * 34 / 4)
    assert sp4.full == approx(2 * 2 * sbh / 4)


# --- compute --------------------------------------------------------------------------

def _layer_forward(tokens, t, context, flash=True):
    dense = gemm(tokens, H, DENSE / (H * t))
    scores = 4 * A * DH * context * tokens / t                  # Q K^T and scores x V
    attention = scores / (ATTN_RATE if flash else FLOP_RATE)
    act = S.activations(SIZES, plan(tp=t, flash_attention=int(flash)))
    elementwise = 2 * act.kept / BYTE_RATE                      # every kept byte written and read
    return dense + attention + elementwise, attention


def test_compute_of_one_stage():
    comp = S.compute(SIZES, plan(), HW, *parts(plan())[:1], S.activations(SIZES, plan()))
    layer, attention = _layer_forward(SEQ, 1, SEQ / 2)
    logits = gemm(SEQ, H, V) + 2 * 4 * SEQ * V / BYTE_RATE       # output GEMM, fp32 logits written and read
    assert comp.layer_forward == approx(layer)
    assert comp.attention == approx(attention)
    assert comp.logits == approx(logits)
    assert comp.stage_forward == approx(L * layer + logits)
    # backward twice the forward; FlashAttention recomputes the scores in its backward
    assert comp.recompute == approx(L * attention)
    assert comp.per_microbatch == approx(3 * (L * layer + logits) + L * attention)


def test_compute_of_a_middle_stage_with_full_recomputation():
    p = plan(pp=4, tp=2, recompute=2)
    lay, act, comp, _ = parts(p)
    layer, _ = _layer_forward(SEQ, 2, SEQ / 2)
    # stages 6, 7, 6 and 5 + the output layer: the 7-layer middle stage paces the pipeline
    logits = gemm(SEQ, H, V / 2) + 2 * 4 * SEQ * V / 2 / BYTE_RATE
    assert 7 * layer * 4 > 5 * layer * 4 + 3 * logits
    assert comp.stage_forward == approx(7 * layer)
    assert comp.recompute == approx(7 * layer)  # full: the forward again
    assert comp.per_microbatch == approx(4 * 7 * layer)


# --- communication --------------------------------------------------------------------

def test_tensor_parallel_all_reduces():
    p = plan(tp=8)
    lay = S.layout(SIZES, p)
    msg = SEQ * H * 2                                           # b s h 16-bit activations
    assert S.tensor_comm(SIZES, p, HW, lay) == approx(L * 4 * placed(msg, 8))
    # a NIC a sixth as fast as the bus: the group is faster as 4 + 4 on two domains, which
    # move their halves over the NICs while the bus carries 3/4 of the buffer, not 7/8
    assert placed(msg, 8) == two_level(msg, 4, 2) < ring_all_reduce(msg, 8)
    p = plan(tp=8, recompute=2)
    assert S.tensor_comm(SIZES, p, HW, lay) == approx(L * 6 * placed(msg, 8))


def test_tensor_parallel_across_two_domains():
    p = plan(tp=16)
    lay = S.layout(SIZES, p)
    msg = SEQ * H * 2
    # two levels: 8 per domain, 2 domains; the faster fill (tree: 7 steps + 1 between
    # domains), then the slower level's share; the call pays the larger call latency
    fill = min(2 * 7 * 1e-6 + 1 * 4e-6, 7 * 1e-6 + 1 * 4e-6)
    data = max(7 / 8 * msg / UP, 1 / 2 * msg / 8 / OUT)
    assert S.tensor_comm(SIZES, p, HW, lay) == approx(L * 4 * (20e-6 + 2 * fill + 2 * data))


def test_context_parallel_ring_passes():
    p = plan(cp=4, tp=2)
    lay = S.layout(SIZES, p)
    kv = (SEQ / 4) * 2 * A * DH * 2 / 2                         # K and V of the local chunk, split by tp
    assert S.context_comm(SIZES, p, HW, lay) == approx(L * 3 * 3 * p2p(kv))
    p = plan(cp=8, tp=2, recompute=2)                            # 16 devices: across domains
    kv = (SEQ / 8) * 2 * A * DH * 2 / 2
    assert S.context_comm(SIZES, p, HW, S.layout(SIZES, p)) == approx(L * 4 * 7 * p2p(kv, False))


def test_pipeline_sends():
    p = plan(pp=4, tp=2, interleave=2, global_batch=16)
    lay = S.layout(SIZES, p)
    msg = SEQ * H * 2 / 2
    # two chunks: four sends, and one extra chunk passed forward and backward
    assert S.pipeline_comm(SIZES, p, HW, lay) == approx(2 * 2 * p2p(msg) + 2 * TAU)
    p = plan(pp=4, tp=2, interleave=3, global_batch=16)
    assert S.pipeline_comm(SIZES, p, HW, S.layout(SIZES, p)) == approx(2 * 3 * p2p(msg) + 4 * TAU)
    p = plan(pp=4, tp=2, dp=2)                                   # 16 devices: across domains
    assert S.pipeline_comm(SIZES, p, HW, S.layout(SIZES, p)) == approx(2 * p2p(msg, False))
    assert S.pipeline_comm(SIZES, plan(), HW, S.layout(SIZES, plan())) == 0


def test_a_dense_model_sends_no_expert_traffic():
    p = plan(dp=8, ep=8)
    assert S.expert_comm(SIZES, p, HW, S.layout(SIZES, p)) == 0


# --- parameters, data parallelism, memory ----------------------------------------------

def test_parameters_per_device():
    p = plan(tp=2)
    params = S.parameters(SIZES, p, S.layout(SIZES, p))
    # one stage: every layer and the (tied) embedding and positions, split by tp
    layer_params = SIZES.layer_params
    emb = V * H + SEQ * H
    assert params.dense == approx((layer_params + emb) / 2)
    assert params.groups == ((params.dense, 1.0, 2.0),)
    p = plan(pp=4, tp=2)
    params = S.parameters(SIZES, p, S.layout(SIZES, p))
    assert params.dense == approx((layer_params * 7 / 24 + emb) / 2)


def test_data_parallel_collectives_by_zero_stage():
    p0, p1, p2, p3 = (plan(dp=8, zero_stage=z) for z in range(4))
    lay = S.layout(SIZES, p0)
    params = S.parameters(SIZES, p0, lay)
    P = params.dense
    # per layer (pp = 1), each call on its own: ZeRO-0 all-reduces the gradients
    dp0 = S.data_parallel(p0, HW, lay, params)
    assert dp0.reduce == approx(L * placed(P * 2 / L, 8))
    assert dp0.gather == 0 and dp0.per_microbatch == 0
    # ZeRO-1: reduce-scatter the gradients, all-gather the weights, once per step
    dp1 = S.data_parallel(p1, HW, lay, params)
    assert dp1.reduce == approx(L * placed(P * 2 / L, 8, False))
    assert dp1.gather == approx(L * placed(P * 2 / L, 8, False))
    # ZeRO-2: the gradients reduce-scattered after every micro-batch
    dp2 = S.data_parallel(p2, HW, lay, params)
    assert dp2.per_microbatch == approx(L * placed(P * 2 / L, 8, False))
    assert dp2.reduce == 0
    # ZeRO-3: two weight gathers and one gradient reduce-scatter per layer and micro-batch
    dp3 = S.data_parallel(plan(dp=8, zero_stage=3, grad_bytes=4), HW, lay, params)
    assert dp3.per_microbatch == approx(L * (2 * placed(P * 2 / L, 8, False)
                                                    + placed(P * 4 / L, 8, False)))
    assert dp3.reduce == 0 and dp3.gather == 0
    chunks = S.data_parallel(plan(dp=2, pp=4), HW, S.layout(SIZES, plan(dp=2, pp=4)),
                             S.parameters(SIZES, plan(dp=2, pp=4), S.layout(SIZES, plan(dp=2, pp=4))))
    assert chunks.chunks == 1                                    # with a pipeline: one bucket per chunk


def test_memory_per_device():
    p = plan(dp=8, zero_stage=1, micro_batch=2, global_batch=16)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    P = params.dense
    assert mem.weights == approx(2 * P)
    assert mem.grads == approx(2 * P)
    assert mem.optimizer == approx(12 * P / 8)  # ZeRO-1: optimizer state sharded
    assert mem.buffers == 0
    sbh = SEQ * 2 * H
    # one micro-batch in flight, every layer, plus the fp32 logits
    assert mem.activations == approx(L * 34 * sbh + 4 * SEQ * 2 * V)
    p3 = plan(dp=8, zero_stage=3, grad_bytes=4, recompute=2)
    lay, act, _, params = parts(p3)
    mem = S.memory(SIZES, p3, lay, act, params)
    assert mem.weights == approx(2 * P / 8) and mem.grads == approx(4 * P / 8)
    assert mem.buffers == approx(P / L * (2 * 2 + 4))   # two gathered layers + one's gradients
    full = 2 * SEQ * H
    # full recomputation keeps each layer's input, and the layer being recomputed its activations
    assert mem.activations == approx(L * full + 4 * SEQ * V + 34 * SEQ * H)


def test_memory_of_a_pipeline_stage_holds_its_micro_batches_in_flight():
    p = plan(pp=4, tp=2, global_batch=16, recompute=1)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    per_layer = act.selective
    # first stage: 6 layers x 4 in flight; second: 7 x 3; last: 5 x 1 + logits
    first, middle, last = 6 * 4 * per_layer, 7 * 3 * per_layer, 5 * per_layer + 4 * SEQ * V / 2
    assert mem.activations == approx(max(first, middle, last))
    p = plan(pp=4, tp=2, global_batch=16, interleave=2)
    lay, act, _, params = parts(p)
    # interleaved, first stage: (2 (p - 1) + (v - 1) p + 1) / v = (6 + 4 + 1) / 2 micro-batches
    assert S.memory(SIZES, p, lay, act, params).activations == approx(6 * 5.5 * act.selective)


def test_offload_of_the_optimizer_to_the_host():
    p = plan(dp=8, zero_stage=1, offload=1)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    off = S.offload(p, HW, lay, mem, params)
    P8 = params.dense / 8
    assert off.optimizer_far == approx(12 * P8) and off.activations_far == 0
    assert not off.in_pool and off.capacity == 1e12
    # the gradients go out (2 bytes) and the weights come back (2 bytes)
    assert off.optimizer_transfer == approx(P8 * (2 + 2) / 20e9)
    # the CPU's Adam streams 4 q_g + 2 q_o + q_w bytes per parameter through host DRAM
    assert off.optimizer_step == approx(P8 * (4 * 2 + 2 * 12 + 2) / 100e9)
    assert off.activation_transfer == 0


def test_offload_of_activations_moves_all_but_two_layers():
    p = plan(offload=2)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    off = S.offload(p, HW, lay, mem, params)
    # the layers' activations but two leave; the logits the loss needs stay
    assert mem.layered == approx(mem.per_layer * L * 1)
    assert off.activations_far == approx(mem.per_layer * L - 2 * mem.per_layer)
    assert off.activation_transfer == approx(2 * (L - 2) * mem.per_layer / 20e9)
    # those of 6 of the 24 layers only (Megatron-Core's cpu_offloading_num_layers): a quarter
    q = plan(offload=2, offload_layers=6)
    some = S.offload(q, HW, lay, S.memory(SIZES, q, lay, act, params), params)
    assert some.activations_far == approx(6 / L * (mem.per_layer * L - 2 * mem.per_layer))
    assert some.activation_transfer == approx(6 / L * 2 * (L - 2) * mem.per_layer / 20e9)
    many = S.offload(plan(offload=2, offload_layers=60), HW, lay, mem, params)
    assert many.activations_far == approx(off.activations_far)    # never more than every layer
    one = S.offload(plan(offload=2, offload_layers=1), HW, lay, mem, params)
    assert one.activations_far == approx((mem.per_layer * L - 2 * mem.per_layer) / L)
    # on two stages the first holds the most: its 13 layers' two micro-batches in flight,
    # against the last's 11 layers and one (the logits stay out of what can move)
    two = plan(pp=2, global_batch=16, offload=2)
    lay2, act2, _, params2 = parts(two)
    mem2 = S.memory(SIZES, two, lay2, act2, params2)
    assert mem2.layered == approx(mem2.per_layer * 13 * 2) and lay2.last_layers == 11
    # without offload the optimizer steps on the device, at HBM speed
    assert off.optimizer_step == approx(params.dense * (4 * 2 + 2 * 12 + 2) / BYTE_RATE)


# --- the schedule, utilisation and walls ----------------------------------------------

def _step(p, hw=HW, sizes=SIZES):
    """The chain of parts as step_columns runs it, up to the schedule."""
    lay, act, comp, params = parts(p, hw, sizes)
    dp = S.data_parallel(p, hw, lay, params)
    comm = {"tp": S.tensor_comm(sizes, p, hw, lay), "ep": S.expert_comm(sizes, p, hw, lay),
            "cp": S.context_comm(sizes, p, hw, lay), "pp": S.pipeline_comm(sizes, p, hw, lay),
            "zero": dp.per_microbatch}
    mem = S.memory(sizes, p, lay, act, params)
    off = S.offload(p, hw, lay, mem, params)
    sched = S.schedule(p, hw, lay, comp, comm, dp, off)
    return lay, comp, comm, dp, off, sched


def test_without_overlap_the_step_adds_up():
    p = plan(tp=2, pp=4, global_batch=16)
    lay, comp, comm, dp, off, sched = _step(p)
    m = 16
    mb = comp.per_microbatch + sum(comm.values())
    assert sched.microbatch == approx(mb)
    assert sched.bubble_fraction == approx(3 / 16)
    assert sched.bubble == approx(3 / 16 * m * mb)
    assert sched.step == approx(m * mb + 3 / 16 * m * mb + dp.reduce + dp.gather + off.optimizer_step)
    assert sched.contention == 0
    assert sched.exposed["tp"] == approx(m * comm["tp"])


def test_overlap_hides_communication_and_slows_the_compute():
    overlap = {f"overlap_{c}": 1.0 for c in pl.OVERLAP_CLASSES}
    p = plan(tp=8, sequence_parallel=1, dp=1, **overlap)
    lay, comp, comm, dp, off, sched = _step(p)
    c, t = comp.per_microbatch, comm["tp"]
    hidden = min(c, t)
    # the longer of the two, plus the contention on what was hidden
    assert sched.microbatch == approx(c + t - (1 - 0.2) * hidden)
    assert sched.contention == approx(8 * 0.2 * hidden)
    # tensor-parallel overlap needs sequence parallelism: without it nothing hides
    p = plan(tp=8, sequence_parallel=0, **overlap)
    lay, comp, comm, dp, off, sched = _step(p)
    assert sched.microbatch == approx(comp.per_microbatch + comm["tp"])


def test_the_data_parallel_reduction_hides_behind_the_last_backward_but_one_chunk():
    overlap = {f"overlap_{c}": 0.0 for c in pl.OVERLAP_CLASSES}
    p = plan(dp=8, zero_stage=1, **{**overlap, "overlap_dp": 1.0})
    lay, comp, comm, dp, off, sched = _step(p)
    backward = comp.per_microbatch - comp.stage_forward
    hidden = min(dp.reduce * (1 - 1 / L), backward) + min(dp.gather * (1 - 1 / L), comp.stage_forward)
    total = dp.reduce + dp.gather
    assert sched.exposed["dp"] == approx(total - hidden)
    assert sched.dp_exposed == approx(total - hidden + 0.2 * min(hidden, total))


def test_the_data_parallel_reduction_hides_only_behind_compute_left_free():
    """A micro-batch's compute that its own collectives already hide behind cannot hide the
    data-parallel reduction too: that reduction takes the rest, spread evenly over the pass."""
    overlap = {f"overlap_{c}": 0.0 for c in pl.OVERLAP_CLASSES}
    p = plan(tp=8, sequence_parallel=1, dp=8, zero_stage=1, **{**overlap, "overlap_tp": 1.0, "overlap_dp": 1.0})
    lay, comp, comm, dp, off, sched = _step(p)
    c = comp.per_microbatch
    busy = min(comm["tp"], c)                                    # what the tensor-parallel traffic hides behind
    assert 0 < busy < c
    free = 1 - busy / c
    backward = (c - comp.stage_forward) * free
    hidden = min(dp.reduce * (1 - 1 / L), backward) + min(dp.gather * (1 - 1 / L), comp.stage_forward * free)
    total = dp.reduce + dp.gather
    assert sched.exposed["dp"] == approx(total - hidden)
    assert sched.contention == approx(0.2 * (lay.micro_batches * busy + hidden))
    # a micro-batch hidden behind in full leaves the reduction nothing to hide behind
    slow = dataclasses.replace(HW, scale_up_bandwidth=1e8)
    lay, comp, comm, dp, off, sched = _step(p, slow)
    assert comm["tp"] > comp.per_microbatch
    assert sched.exposed["dp"] == approx(dp.reduce + dp.gather)


def test_utilisation_counts_causal_model_flops():
    p = plan(dp=8, global_batch=64, micro_batch=2)
    lay, comp, comm, dp, off, sched = _step(p)
    util = S.utilisation(SIZES, p, HW, lay, sched)
    tokens = 64 * SEQ
    matmul = SIZES.matmul_params

    def forward(ctx):
        return 2 * matmul + 2 * V * H + 4 * L * A * DH * ctx

    assert util.model_flops == approx(3 * tokens * forward(SEQ / 2))
    assert util.palm_flops == approx(3 * tokens * forward(SEQ))
    # the hardware also recomputes the scores (FlashAttention's backward)
    assert util.hardware_flops == approx(tokens * (3 * forward(SEQ / 2) + 4 * L * A * DH * SEQ / 2))
    assert util.mfu == approx(util.model_flops / (sched.step * 8 * 100e12))
    assert util.hfu == approx(util.hardware_flops / (sched.step * 8 * 100e12))


def test_the_walls_share_out_the_step():
    p = plan(tp=2, pp=4, global_batch=16, offload=1)
    lay, comp, comm, dp, off, sched = _step(p)
    w = S.walls(lay, comp, sched, off)
    assert w.compute + w.memory + w.communication == approx(sched.step, rel=1e-9)
    share = min(comp.per_microbatch / sched.microbatch, 1.0) * sched.bubble
    assert w.compute == approx(16 * 3 * comp.stage_forward + off.optimizer_step
                                      + share * 3 * comp.stage_forward / comp.per_microbatch)
    assert w.memory == approx(16 * comp.recompute + off.optimizer_transfer
                                     + share * comp.recompute / comp.per_microbatch)


def test_the_columns_lay_out_the_parts():
    p = plan(tp=2, pp=4, dp=2, global_batch=32)
    out = S.step_columns(SIZES, p, HW)
    lay, comp, comm, dp, off, sched = _step(p)
    assert out["step_time_s"] == approx(sched.step)
    assert out["devices"] == 16 and out["micro_batches"] == 16
    assert out["tokens_per_s"] == approx(32 * SEQ / sched.step)
    assert out["tokens_per_s_per_device"] == approx(32 * SEQ / sched.step / 16)
    assert out["time_compute_s"] == approx(16 * comp.per_microbatch)
    assert out["time_pp_s"] == approx(16 * comm["pp"])
    assert out["time_dp_s"] == approx(dp.reduce + dp.gather)
    mem = [out[f"memory_{k}_bytes"] for k in ("weights", "grads", "optimizer", "activations", "buffers")]
    assert out["memory_total_bytes"] == approx(sum(mem))
    assert out["memory_headroom_bytes"] == approx(80e9 - sum(mem))
    assert out["fits"] == (sum(mem) <= 80e9)
    assert out["model_tflops_per_device"] == approx(out["mfu"] * 100)


# --- without FlashAttention, in FP8, with a multi-token-prediction module -------------

def test_selective_recomputation_without_flashattention_recomputes_the_scores():
    p = plan(recompute=1, flash_attention=0)
    lay, act, comp, _ = parts(p)
    attention = 4 * A * DH * SEQ * SEQ / FLOP_RATE               # all keys, as 16-bit matrix multiplies
    scores = 2 * (act.everything - act.selective) / BYTE_RATE   # the scores written and read again
    assert comp.attention == approx(attention)
    assert comp.recompute == approx(L * (attention + scores))
    none = S.compute(SIZES, plan(recompute=0, flash_attention=0), HW, lay, act)
    assert none.recompute == 0
    # the layer being recomputed holds its scores again while its backward runs
    mem = S.memory(SIZES, p, lay, act, S.parameters(SIZES, p, lay))
    assert mem.activations == approx(L * act.selective + 4 * SEQ * V + act.everything - act.selective)


def test_fp8_casts_every_matrix_input_and_output_gradient():
    fp8 = dataclasses.replace(HW, cast_bytes=4.0)
    p = plan(tp=2)
    lay, act = S.layout(SIZES, p), S.activations(SIZES, p)
    comp = S.compute(SIZES, p, fp8, lay, act)
    # per token and layer: inputs 3h + h + 4h forward; output gradients h + 2h + h + 4h + h backward
    elements = (3 * H + H + 4 * H + H + 2 * H + 2 * H + 4 * H) / 2
    assert S.gemm_elements(SIZES, p) == approx(elements)
    assert comp.elementwise == approx((2 * act.kept + 4 * elements / 3 * SEQ) / BYTE_RATE)


MTP = dataclasses.replace(SIZES, mtp_modules=1.0, mtp_matmul_params=DENSE + 2 * H * H)


def test_a_multi_token_prediction_module_runs_on_the_last_stage():
    p = plan(tp=2)
    lay = S.layout(MTP, p)
    assert lay.last_layers == L and lay.stage_layers == L + 1
    act = S.activations(MTP, p)
    comp = S.compute(MTP, p, HW, lay, act)
    layer = comp.layer_forward
    logits = gemm(SEQ, H, V / 2) + 2 * 4 * SEQ * V / 2 / BYTE_RATE
    mtp = layer + logits + gemm(SEQ, 2 * H, H / 2)              # one more layer, the 2h -> h projection, the head
    assert comp.mtp == approx(mtp)
    assert comp.stage_forward == approx(L * layer + logits + mtp)
    assert comp.per_microbatch == approx(3 * (L * layer + logits + mtp) + (L + 1) * comp.attention)
    mem = S.memory(MTP, p, lay, act, S.parameters(MTP, p, lay))
    assert mem.activations == approx((L + 1) * act.selective + 2 * 4 * SEQ * V / 2)
    sched = _step(p, sizes=MTP)[-1]
    util = S.utilisation(MTP, p, HW, lay, sched)
    forward = 2 * (MTP.matmul_params + MTP.mtp_matmul_params) + 2 * V * H + 4 * (L + 1) * A * DH * SEQ / 2
    assert util.model_flops == approx(3 * 8 * SEQ * forward)


def test_a_pipeline_puts_the_mtp_module_on_its_last_stage():
    p = plan(pp=2, tp=2)
    lay = S.layout(MTP, p)
    # the output layer and the MTP module's matrices weigh 3 layers: 27 units on 2 stages,
    # 14 and 13, the last's 3 tail units leaving it 10 layers (and the MTP module's layer)
    assert (lay.first_layers, lay.last_layers) == (14, 10) and lay.stage_layers == 14
    mem = S.memory(MTP, p, lay, S.activations(MTP, p), S.parameters(MTP, p, lay))
    act = S.activations(MTP, p).selective
    # the first stage holds 2 micro-batches of 14 layers; the last 1 of 11 plus two heads' logits
    assert mem.activations == approx(max(14 * 2 * act, 11 * act + 2 * 4 * SEQ * V / 2))


# --- mixture of experts ------------------------------------------------------------------

QWEN = model_sizes(snlab.model("qwen3-30b-a3b"))   # 48 layers, h 2048, 128 experts of 3 x 2048 x 768, top 8
EP_HW = dataclasses.replace(HW, scale_up_ep_bulk_efficiency=0.4, scale_out_ep_bulk_efficiency=0.6)


def test_expert_compute_runs_the_busiest_device_s_experts():
    p = plan(dp=8, ep=8, expert_imbalance=1.2)
    lay, act = S.layout(QWEN, p), S.activations(QWEN, p)
    comp = S.compute(QWEN, p, HW, lay, act)
    tok = SEQ
    per_expert = tok * 8 * 8 / 128 * 1.2                         # tokens each local expert gets, busiest device
    experts = (128 / 8) * gemm(per_expert, 2048, 3 * 768)
    assert comp.expert_gemm == approx(experts)
    dense = gemm(tok, 2048, QWEN.dense_matmul_params / 2048)
    assert comp.dense_gemm == approx(dense)
    capped = S.compute(QWEN, plan(dp=8, ep=8, expert_imbalance=1.2, capacity_factor=1.1), HW, lay, act)
    assert capped.expert_gemm == approx(16 * gemm(tok * 8 * 8 / 128 * 1.1, 2048, 3 * 768))
    assert S.expert_load(plan(dp=8, ep=8, expert_imbalance=1.5, capacity_factor=2.0)) == 1.5


def test_without_expert_parallelism_no_device_is_busier():
    """With ep 1 every device holds every expert (a tensor slice of each with tp) and
    computes its share of every token: the routing's skew loads no device more."""
    assert S.expert_load(plan(dp=8, expert_imbalance=1.5)) == 1.0
    assert S.expert_load(plan(dp=8, ep=2, expert_imbalance=1.5)) == 1.5
    assert S.expert_load(plan(tp=2, dp=4, expert_imbalance=1.5, capacity_factor=1.2)) == 1.0
    p = plan(dp=8, expert_imbalance=1.5)
    lay, act = S.layout(QWEN, p), S.activations(QWEN, p)
    even = S.compute(QWEN, plan(dp=8, expert_imbalance=1.0), HW, lay, act)
    assert S.compute(QWEN, p, HW, lay, act).expert_gemm == approx(even.expert_gemm)
    assert even.expert_gemm == approx(128 * gemm(SEQ * 8 / 128, 2048, 3 * 768))


def test_expert_all_to_all_with_every_copy_sent():
    p = plan(dp=8, ep=8, ep_dispatcher=0, expert_imbalance=1.2)
    lay = S.layout(QWEN, p)
    msg = SEQ * 8 * 2048 * 2                                     # every (token, expert) copy, 16-bit
    a2a = 10e-6 + 7 * 1e-6 + 7 / 8 * msg / UP                   # one domain: its latency, its share
    assert S.expert_comm(QWEN, p, EP_HW, lay) == approx(48 * 2 * 2 * a2a * 1.2)
    full = plan(dp=8, ep=8, ep_dispatcher=0, expert_imbalance=1.2, recompute=2)
    assert S.expert_comm(QWEN, full, EP_HW, lay) == approx(48 * 3 * 2 * a2a * 1.2)
    sp = plan(dp=4, tp=2, ep=4, ep_dispatcher=0, sequence_parallel=1)
    msg = SEQ / 2 * 8 * 2048 * 2                                 # sequence parallelism splits the tokens
    # the expert group's 4 members sit tp = 2 ranks apart: 4 per domain of 8
    a2a = 10e-6 + 3 * 1e-6 + 3 / 4 * msg / UP
    assert S.expert_comm(QWEN, sp, EP_HW, S.layout(QWEN, sp)) == approx(48 * 2 * 2 * a2a)


def deepep_call(inner, outer, q, call=20e-6):
    """One DeepEP dispatch or combine on EP_HW spanning domains [s]: the larger call
    latency, then the slower of the copies inside the domain and those between domains
    (q bytes per element)."""
    return call + max(1e-6 + inner * q / (0.4 * 100e9), 4e-6 + outer * q / (0.6 * 10e9))


def test_deepep_sends_a_token_once_per_remote_domain():
    p = plan(dp=16, ep=16, expert_imbalance=1.0)
    lay = S.layout(QWEN, p)
    tok, k, h = SEQ, 8, 2048
    domains = 2 * (1 - (1 - 1 / 2) ** k)                         # domains a token's 8 experts reach, of 2
    inner = tok * k * h * 7 / 8                                  # copies for peers in the own domain
    outer = tok * h * domains * 1 / 2                            # once per remote domain
    # spanning domains, each call pays the larger call latency (deepep_call)
    assert S.expert_comm(QWEN, p, EP_HW, lay) == approx(48 * 2 * 2 * deepep_call(inner, outer, 2))
    fp8 = dataclasses.replace(EP_HW, cast_bytes=4.0)
    assert S.expert_comm(QWEN, p, fp8, lay) == approx(48 * 2 * (deepep_call(inner, outer, 1)
                                                               + deepep_call(inner, outer, 2)))


def test_group_limited_routing_caps_the_domains_a_token_reaches():
    grouped = dataclasses.replace(QWEN, expert_groups=8.0, groups_per_token=1.0)
    p = plan(dp=32, ep=32, expert_imbalance=1.0)
    lay = S.layout(grouped, p)
    tok, k, h = SEQ, 8, 2048
    # 4 domains of 8; a token reaches one group of 16 experts, 1/2 of a domain: at most 1 domain
    inner = tok * k * h * 7 / 8
    outer = tok * h * 1 * 3 / 4
    as_placed = 2 * deepep_call(inner, outer, 2)

    def on(n1):
        """Dispatch and combine with the 32 members placed n1 to a domain on n2 = 32 / n1
        domains: a token's group (16 of 128 experts) lies on n2 / 8 of them, at least one."""
        n2 = 32 // n1
        reach = min(n2 * (1 - (1 - 1 / n2) ** k), max(n2 / 8, 1))
        return 2 * deepep_call(tok * k * h * (n1 - 1) / n1, tok * h * reach * (n2 - 1) / n2, 2)

    assert on(8) == approx(as_placed)
    # more domains reached by fewer members each: 4 to a domain moves less over the bus
    assert S.expert_comm(grouped, p, EP_HW, lay) == approx(48 * 2 * min(on(n1) for n1 in (1, 2, 4, 8)))
    assert min(on(n1) for n1 in (1, 2, 4, 8)) == on(4) < as_placed


def test_expert_parameters_are_reduced_over_their_replicas():
    p = plan(dp=8, ep=4, tp=2, cp=2)
    lay = S.layout(QWEN, p)
    params = S.parameters(QWEN, p, lay)
    # untied embeddings: the input table and the output head on the one stage
    emb = QWEN.embedding_params + 151936 * 2048
    assert params.dense == approx((QWEN.layer_params + emb) / 2)
    assert params.experts == approx(QWEN.expert_params / (4 * 2))
    assert params.total == approx(params.dense + params.experts)
    # replicas t d c / (e etp), ranks etp x e apart: Megatron-Core's expert rank generator has cp = 1
    assert params.groups[1] == (params.experts, 8 * 2 / 4, 2 * 4)
    p = plan(pp=4, dp=2, ep=2)
    lay = S.layout(QWEN, p)
    assert S.parameters(QWEN, p, lay).dense == approx(QWEN.layer_params * lay.stage_share
                                                             + QWEN.embedding_params)


# --- memory buffers, pooled offload -----------------------------------------------------

def test_zero_2_holds_one_layer_s_gradient_bucket():
    p = plan(dp=8, zero_stage=2, grad_bytes=4)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    assert mem.buffers == approx(params.dense / L * 4)
    assert mem.grads == approx(params.dense * 4 / 8)
    dp = S.data_parallel(p, HW, lay, params)
    assert dp.gather == approx(L * placed(params.dense * 2 / L, 8, False))


def test_interleaved_pipelines_bucket_per_chunk():
    p = plan(pp=4, dp=2, interleave=2, global_batch=16)
    lay, act, _, params = parts(p)
    dp = S.data_parallel(p, HW, lay, params)
    assert dp.chunks == 2
    # 4 x 2 = 8 devices: the data-parallel pair sits 4 x 1 ... ranks apart inside the domain
    assert dp.reduce == approx(2 * ring_reduce_scatter(params.dense * 2 / 2, 2))


POOL_HW = dataclasses.replace(HW, pool_bandwidth=50e9, pool_latency=2e-6, pool_capacity=70e9,
                              pool_domain_capacity=8 * 70e9)


def test_offload_to_a_supernode_pool():
    p = plan(dp=4, offload=3)
    lay, act, _, params = parts(p, POOL_HW)
    mem = S.memory(SIZES, p, lay, act, params)
    off = S.offload(p, POOL_HW, lay, mem, params)
    # four devices outside the job lend 8 x 70 GB / 7 each, shared by the job's four
    free = 4 * 8 * 70e9 / 7 / 4
    assert off.in_pool and off.capacity == approx(free)
    P4 = params.dense / 4
    # in the pool the device updates the state in place: the state crosses the bus, at HBM pace
    assert off.optimizer_transfer == approx(P4 * 12 / 50e9)
    assert off.optimizer_step == approx(P4 * (4 * 2 + 2 * 12 + 2) / BYTE_RATE)
    assert off.activation_transfer == approx(2 * (L - 2) * mem.per_layer / 50e9)
    assert off.optimizer_far + off.activations_far <= free
    big = plan(dp=8, offload=1)                                  # the whole domain: nothing left to lend
    lay, act, _, params = parts(big, POOL_HW)
    off = S.offload(big, POOL_HW, lay, S.memory(SIZES, big, lay, act, params), params)
    assert not off.in_pool and off.optimizer_transfer == approx(params.dense / 8 * 4 / 20e9)


# --- what each class can hide -----------------------------------------------------------

def test_ring_attention_hides_only_behind_the_attention_blocks():
    p = plan(cp=4, overlap_cp=1.0, flash_attention=0)
    lay, comp, comm, dp, off, sched = _step(p)
    can = S.hideable(p, HW, lay, comp, comm)
    window = L * 3 * comp.attention                             # forward and backward attention
    assert can["cp"] == approx(min(comm["cp"], window))
    full = plan(cp=4, overlap_cp=0.5, recompute=2)
    lay, comp, comm, dp, off, sched = _step(full)
    can = S.hideable(full, HW, lay, comp, comm)
    assert can["cp"] == approx(0.5 * min(comm["cp"], L * 4 * comp.attention))


def test_zero_3_shows_one_layer_and_pipeline_sends_hide_only_when_interleaved():
    p = plan(dp=8, zero_stage=3, overlap_zero=1.0)
    lay, comp, comm, dp, off, sched = _step(p)
    can = S.hideable(p, HW, lay, comp, comm)
    assert can["zero"] == approx(min(comm["zero"] - comm["zero"] / L, comp.per_microbatch))
    flat = plan(pp=4, overlap_pp=1.0, global_batch=8)
    lay, comp, comm, dp, off, sched = _step(flat)
    assert S.hideable(flat, HW, lay, comp, comm)["pp"] == 0
    inter = plan(pp=4, interleave=2, overlap_pp=1.0, global_batch=8)
    lay, comp, comm, dp, off, sched = _step(inter)
    # the sends hide, the extra chunk's handshakes (forward and backward) show
    assert S.hideable(inter, HW, lay, comp, comm)["pp"] == approx(comm["pp"] - 2 * TAU)
    assert sched.exposed["pp"] == approx(8 * 2 * TAU)


def test_tensor_parallel_overlap_needs_one_scale_up_domain():
    p = plan(tp=8, sequence_parallel=1, overlap_tp=1.0)
    lay, comp, comm, dp, off, sched = _step(p)                  # eight devices in a domain of 8
    assert S.hideable(p, HW, lay, comp, comm)["tp"] == approx(min(comm["tp"], comp.per_microbatch))
    halves = dataclasses.replace(HW, scale_up_domain_size=4.0)  # the group spans two domains
    lay, comp, comm, dp, off, sched = _step(p, halves)
    assert S.hideable(p, halves, lay, comp, comm)["tp"] == 0
    assert sched.exposed["tp"] == approx(8 * comm["tp"])


def test_what_is_hidden_is_shared_out_in_proportion():
    p = plan(tp=8, sequence_parallel=1, dp=1, overlap_tp=0.5, overlap_offload=1.0, offload=2)
    lay, comp, comm, dp, off, sched = _step(p)
    parts_ = dict(comm, offload=off.activation_transfer)
    can = S.hideable(p, HW, lay, comp, parts_)
    hidden = min(sum(can.values()), comp.per_microbatch)
    total = sum(can.values())
    m = 8
    for x in ("tp", "offload"):
        assert sched.exposed[x] == approx(m * (parts_[x] - hidden * can[x] / total))
    assert sched.contention == approx(0.2 * m * hidden)
    w = S.walls(lay, comp, sched, off)
    assert w.communication == approx(sum(sched.exposed[x] for x in S.EXPOSED_COMM) + sched.contention)
    assert w.memory == approx(m * comp.recompute + sched.exposed["offload"])


def test_columns_of_an_offloading_plan():
    p = plan(dp=4, offload=3, zero_stage=1, global_batch=8)
    out = S.step_columns(SIZES, p, POOL_HW)
    lay, comp, comm, dp, off, sched = _step(p, POOL_HW)
    m = 2
    mem = S.memory(SIZES, p, lay, S.activations(SIZES, p), S.parameters(SIZES, p, lay))
    assert out["memory_optimizer_bytes"] == approx(mem.optimizer - off.optimizer_far)
    assert out["memory_activations_bytes"] == approx(mem.activations - off.activations_far)
    assert out["memory_offloaded_bytes"] == approx(off.optimizer_far + off.activations_far)
    assert out["offload_capacity_bytes"] == approx(off.capacity)
    assert out["time_offload_s"] == approx(off.optimizer_transfer + m * off.activation_transfer)
    assert out["time_recompute_s"] == approx(m * comp.recompute)
    assert out["time_optimizer_s"] == approx(off.optimizer_step)
    assert out["exposed_comm_s"] == approx(sum(sched.exposed[x] for x in S.EXPOSED_COMM))
    util = S.utilisation(SIZES, p, POOL_HW, lay, sched)
    assert out["palm_tflops_per_device"] == approx(util.palm_flops / sched.step / 4 / 1e12)
    assert out["hardware_tflops_per_device"] == approx(util.hardware_flops / sched.step / 4 / 1e12)
    assert out["hfu"] == approx(util.hfu)
    assert out["params_per_device"] == approx(S.parameters(SIZES, p, lay).total)
    assert out["bubble_fraction"] == 0 and out["time_contention_s"] == approx(sched.contention)
    assert out["wall_memory_s"] == approx(S.walls(lay, comp, sched, off).memory)


def test_hardware_flops_with_full_recomputation():
    p = plan(recompute=2, dp=8, global_batch=8)
    lay, comp, comm, dp, off, sched = _step(p)
    util = S.utilisation(SIZES, p, HW, lay, sched)
    tokens = 8 * SEQ
    scores = 4 * L * A * DH * SEQ / 2

    def forward(ctx):
        return 2 * SIZES.matmul_params + 2 * V * H + 4 * L * A * DH * ctx

    assert util.hardware_flops == approx(tokens * (3 * forward(SEQ / 2) + 2 * SIZES.matmul_params + scores))


# --- the network: placement, views, latencies ------------------------------------------

def test_a_domain_of_two_nodes_pays_the_crossing_latency_on_its_crossing_steps():
    from snlab import network as net
    hw = dataclasses.replace(HW, scale_up_domain_size=16.0, devices_per_node=8.0, scale_up_latency=3e-6)
    # a ring of 16 over 2 nodes: 16 hops, 2 of them between nodes
    assert net.inner_step_latency(16.0, hw) == approx((14 * 1e-6 + 2 * 3e-6) / 16)
    assert net.inner_step_latency(2.0, hw) == approx(1e-6)
    assert net.inner_step_latency(4.0, hw) == approx(1e-6)
    assert net.inner_step_latency(1.0, hw) == approx(3e-6)
    # members 8 ranks apart sit on a node each: every hop crosses; 4 apart, two per node
    assert net.inner_step_latency(2.0, hw, 8.0) == approx(3e-6)
    assert net.inner_step_latency(4.0, hw, 4.0) == approx((2 * 1e-6 + 2 * 3e-6) / 4)
    assert net.split(16.0, 1.0, hw) == (16.0, 1.0)
    assert net.split(8.0, 4.0, hw) == (4.0, 2.0)
    assert [(n1, n2) for _, n1, n2 in net.placements(16.0, 1.0, hw)] == [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
    msg = 1e9
    flat = 10e-6 + 15 * (14 * 1e-6 + 2 * 3e-6) / 16 + 15 / 16 * msg / UP
    # placed on nodes of 8 or fewer, every step inside a node pays the node's latency
    halves = [two_level(msg, d, 16 // d, False) for d in (1, 2, 4, 8)]
    assert net.reduce_scatter(msg, 16.0, 1.0, hw) == approx(min([flat] + halves))
    small = 1e3                                                  # latency-bound: the flat ring fills faster
    flat = 10e-6 + 15 * (14 * 1e-6 + 2 * 3e-6) / 16 + 15 / 16 * small / UP
    halves = [two_level(small, d, 16 // d, False) for d in (1, 2, 4, 8)]
    assert net.reduce_scatter(small, 16.0, 1.0, hw) == approx(min([flat] + halves)) == approx(flat)


def test_a_point_to_point_message_inside_a_domain_takes_the_faster_path():
    from snlab import network as net
    slow_up = dataclasses.replace(HW, scale_up_bandwidth=1e9)
    msg = 1e8
    assert net.point_to_point(msg, True, slow_up) == approx(20e-6 + 4e-6 + msg / OUT)
    assert net.point_to_point(msg, True, HW) == approx(p2p(msg))
    assert net.point_to_point(msg, False, HW) == approx(p2p(msg, False))


# --- the remaining branches --------------------------------------------------------------

def test_context_parallelism_splits_the_sequence_everywhere():
    p = plan(cp=2, tp=2, recompute=0)
    act = S.activations(SIZES, p)
    half = SEQ / 2 * H
    assert act.selective == approx(half * (10 + 24 / 2))
    lay = S.layout(SIZES, p)
    comp = S.compute(SIZES, p, HW, lay, act)
    assert comp.logits == approx(gemm(SEQ / 2, H, V / 2) + 2 * 4 * SEQ / 2 * V / 2 / BYTE_RATE)
    params = S.parameters(SIZES, p, lay)
    assert params.groups[0] == (params.dense, 2.0, 2.0)           # reduced over dp x cp, ranks tp apart
    mem = S.memory(SIZES, p, lay, act, params)
    assert mem.activations == approx(L * act.selective + 4 * SEQ / 2 * V / 2)   # no recomputation, nothing working
    assert mem.per_layer == act.kept


def test_flashattention_recomputes_scores_even_without_recomputation():
    p = plan(recompute=0, dp=8, global_batch=8)
    lay, comp, comm, dp, off, sched = _step(p)
    assert comp.recompute == approx(L * comp.attention)
    util = S.utilisation(SIZES, p, HW, lay, sched)
    scores = 4 * L * A * DH * SEQ / 2

    def forward(ctx):
        return 2 * SIZES.matmul_params + 2 * V * H + 4 * L * A * DH * ctx

    assert util.hardware_flops == approx(8 * SEQ * (3 * forward(SEQ / 2) + scores))


def test_two_stages_pace_by_the_heavier():
    p = plan(pp=2, tp=2)
    lay, act, comp, _ = parts(p)
    # 25 units on 2 stages: 13 layers, then 11 and the output layer
    assert (lay.first_layers, lay.last_layers) == (13, 11)
    layer = comp.layer_forward
    first, last = 13 * layer, 11 * layer + comp.logits
    totals = [3 * first + 13 * comp.attention, 3 * last + 11 * comp.attention]
    assert comp.stage_forward == approx(first if totals[0] >= totals[1] else last)
    assert S.pipeline_comm(SIZES, p, HW, lay) == approx(2 * p2p(SEQ * H * 2 / 2))
    dp = S.data_parallel(plan(pp=2, tp=2, dp=2, interleave=2, global_batch=8), HW, lay, S.parameters(SIZES, p, lay))
    assert dp.chunks == 2


def test_a_middle_stage_can_hold_the_most_activations():
    p = plan(pp=4, first_stage_layers=2, last_stage_layers=4, global_batch=8)
    lay, act, _, params = parts(p)
    assert (lay.first_layers, lay.middle_layers, lay.last_layers) == (2, 9, 4)
    mem = S.memory(SIZES, p, lay, act, params)
    # in flight: 4 on the first stage, 3 on the second, 1 on the last
    assert mem.activations == approx(max(2 * 4, 9 * 3, 4 * 1) * act.selective)


def test_pipeline_sends_leave_the_domain_with_context_parallelism():
    p = plan(pp=2, cp=2, tp=2, dp=2)                             # 16 devices
    msg = SEQ / 2 * H * 2 / 2
    assert S.pipeline_comm(SIZES, p, HW, S.layout(SIZES, p)) == approx(2 * p2p(msg, False))


def test_expert_traffic_and_weights_on_a_pipeline_stage():
    p = plan(pp=2, dp=4, ep=2, cp=2, ep_dispatcher=0, expert_imbalance=1.0)
    lay = S.layout(QWEN, p)
    share = lay.stage_share
    assert share < 1
    # members of the expert group sit expert_tp = 1 rank apart: both in the domain
    msg = SEQ / 2 * 8 * 2048 * 2
    a2a = 10e-6 + 1 * 1e-6 + 1 / 2 * msg / UP
    assert S.expert_comm(QWEN, p, EP_HW, lay) == approx(48 * share * 2 * 2 * a2a)
    params = S.parameters(QWEN, p, lay)
    assert params.experts == approx(QWEN.expert_params * share / 2)
    assert params.dense == approx(QWEN.layer_params * share + QWEN.embedding_params)   # no output head copy
    assert params.groups[1] == (params.experts, 4 * 2 / 2, 1 * 2)
    assert S.expert_comm(QWEN, plan(dp=4, ep=1), EP_HW, S.layout(QWEN, plan(dp=4, ep=1))) == 0


def test_expert_compute_with_tensor_parallel_experts_and_dropped_tokens():
    p = plan(tp=2, dp=4, ep=4, expert_imbalance=1.2, capacity_factor=0.5)
    lay, act = S.layout(QWEN, p), S.activations(QWEN, p)
    comp = S.compute(QWEN, p, HW, lay, act)
    per_expert = SEQ * 8 * 4 / 128 * 0.5                         # tokens beyond capacity are dropped
    assert comp.expert_gemm == approx(32 * gemm(per_expert, 2048, 3 * 768 / 2))
    assert comp.layer_forward == approx(comp.dense_gemm + comp.expert_gemm + comp.attention + comp.elementwise)


def test_an_expert_exchange_takes_dispatch_and_combine_from_its_fastest_placement():
    """FP8 dispatch, BF16 combine: the placement is chosen by their sum, and both come
    from it (32 members on domains of 8)."""
    from snlab import network as net
    tok, k, h = SEQ, 8, 2048

    def on(n1, q):
        n2 = 32 // n1
        reach = n2 * (1 - (1 - 1 / n2) ** k)
        return deepep_call(tok * k * h * (n1 - 1) / n1, tok * h * reach * (n2 - 1) / n2, q)

    best = min((1, 2, 4, 8), key=lambda n1: on(n1, 1) + on(n1, 2))
    disp, comb = net.expert_calls(tok, k, h, np.float64(32), 1.0, EP_HW, True)
    assert (disp, comb) == (approx(on(best, 1)), approx(on(best, 2)))
    assert best != 1 and on(best, 1) + on(best, 2) < on(1, 1) + on(1, 2)


def test_group_limited_routing_with_more_domains_than_groups():
    grouped = dataclasses.replace(QWEN, expert_groups=2.0, groups_per_token=1.0)
    p = plan(dp=32, ep=32, expert_imbalance=1.0)
    lay = S.layout(grouped, p)
    # 4 domains, 2 groups of 64 experts: a token's group spans 2 domains
    domains = min(4 * (1 - (1 - 1 / 4) ** 8), 2)
    inner, outer = SEQ * 8 * 2048 * 7 / 8, SEQ * 2048 * domains * 3 / 4
    assert S.expert_comm(grouped, p, EP_HW, lay) == approx(48 * 2 * 2 * deepep_call(inner, outer, 2))


def test_the_deepep_group_folds_context_parallel_ranks_in():
    """Megatron-Core builds the expert groups with cp = 1 (parallel_state's expert rank
    generator): with cp 2 the 8 members of ep 8 are 8 neighbouring ranks, one domain, the
    group of cp 1 with the same tokens per device."""
    p = plan(cp=2, dp=4, ep=8, expert_imbalance=1.0)
    same = plan(dp=8, ep=8, expert_imbalance=1.0, seq_len=SEQ / 2)
    assert S.layout(QWEN, p).tokens == S.layout(QWEN, same).tokens
    assert S.expert_comm(QWEN, p, EP_HW, S.layout(QWEN, p)) == approx(S.expert_comm(QWEN, same, EP_HW,
                                                                                    S.layout(QWEN, same)))
    # a bus fast enough for all 8 in one domain: they are, so the exchange takes the bus alone
    fast_bus = dataclasses.replace(EP_HW, scale_up_ep_bulk_efficiency=0.9)
    tok, k, h = SEQ / 2, 8, 2048
    inner, outer = tok * k * h * 3 / 4, tok * h * 2 * (1 - 0.5 ** 8) * 1 / 2
    split = 20e-6 + max(1e-6 + inner * 2 / (0.9 * 100e9), 4e-6 + outer * 2 / (0.6 * 10e9))
    assert S.expert_comm(QWEN, p, fast_bus, S.layout(QWEN, p)) < 48 * 2 * 2 * split


def test_optimizer_offload_without_zero_and_an_offload_that_outgrows_the_pool():
    p = plan(dp=2, zero_stage=0, offload=1)
    lay, act, _, params = parts(p)
    off = S.offload(p, HW, lay, S.memory(SIZES, p, lay, act, params), params)
    assert off.optimizer_transfer == approx(params.dense * 4 / 20e9)   # every parameter's state, unsharded
    p = plan(offload=3)
    lay, act, _, params = parts(p, POOL_HW)
    mem = S.memory(SIZES, p, lay, act, params)
    off = S.offload(p, POOL_HW, lay, mem, params)
    room = off.optimizer_far + off.activations_far / 2          # the seven peers lend this much
    tight = dataclasses.replace(POOL_HW, pool_domain_capacity=room)
    off = S.offload(p, tight, lay, mem, params)
    assert off.optimizer_far <= room < off.optimizer_far + off.activations_far
    assert not off.in_pool                                       # both together must fit


def test_the_step_adds_the_exposed_data_parallel_time():
    p = plan(dp=8, zero_stage=0, global_batch=16)
    lay, comp, comm, dp, off, sched = _step(p)
    assert dp.reduce > 0
    assert sched.step == approx(2 * sched.microbatch + dp.reduce + off.optimizer_step)
    slow = dataclasses.replace(HW, scale_up_bandwidth=1e8)      # a reduction longer than the backward
    q = plan(dp=8, zero_stage=1, overlap_dp=1.0)
    lay, comp, comm, dp, off, sched = _step(q, slow)
    backward = comp.per_microbatch - comp.stage_forward
    assert dp.reduce * (1 - 1 / L) > backward
    hidden = backward + min(dp.gather * (1 - 1 / L), comp.stage_forward)
    assert sched.exposed["dp"] == approx(dp.reduce + dp.gather - hidden)
    assert sched.contention == approx(0.2 * hidden)


def test_exposed_activation_offload_is_memory_time():
    p = plan(offload=2, global_batch=4)
    lay, comp, comm, dp, off, sched = _step(p)
    w = S.walls(lay, comp, sched, off)
    assert sched.exposed["offload"] == approx(4 * off.activation_transfer)
    assert w.memory == approx(4 * comp.recompute + 4 * off.activation_transfer)


def test_columns_count_every_memory_part():
    p = plan(dp=8, zero_stage=3, global_batch=8)
    out = S.step_columns(SIZES, p, HW)
    lay, act, _, params = parts(p)
    mem = S.memory(SIZES, p, lay, act, params)
    assert mem.buffers > 0
    assert out["memory_total_bytes"] == approx(mem.weights + mem.grads + mem.optimizer + mem.activations
                                               + mem.buffers)
    assert out["memory_optimizer_bytes"] == approx(mem.optimizer) and out["memory_offloaded_bytes"] == 0
    assert out["memory_activations_bytes"] == approx(mem.activations)


def test_the_all_to_all_group_folds_context_parallel_ranks_in():
    p = plan(cp=2, dp=4, ep=8, ep_dispatcher=0, expert_imbalance=1.0)
    lay = S.layout(QWEN, p)
    msg = SEQ / 2 * 8 * 2048 * 2
    # 8 members 1 rank apart (Megatron-Core's expert groups have cp = 1): one domain of 8
    a2a = 10e-6 + 7 * 1e-6 + 7 / 8 * msg / UP
    assert S.expert_comm(QWEN, p, EP_HW, lay) == approx(48 * 2 * 2 * a2a)


def test_placements_of_a_group_on_a_domain():
    """Every equal share of the group that a domain holds: a domain of 64 holds all of a
    group of 64, a group of 16 members 2 ranks apart 32 at most (all 16), a domain of 6
    a group of 8 as 4 + 4 (never 6 + 2)."""
    from snlab import network as net
    hw = dataclasses.replace(HW, scale_up_domain_size=64.0, devices_per_node=8.0)

    def shares(n, stride, h):
        return [n1 for fits, n1, _ in net.placements(n, stride, h) if fits]

    assert shares(64.0, 1.0, hw) == [1, 2, 4, 8, 16, 32, 64]
    assert shares(16.0, 2.0, hw) == [1, 2, 4, 8, 16]
    assert shares(16.0, 8.0, hw) == [1, 2, 4, 8]
    six = dataclasses.replace(HW, scale_up_domain_size=6.0)
    assert shares(8.0, 1.0, six) == [1, 2, 4] and net.split(8.0, 1.0, six) == (4.0, 2.0)
    # a row whose group does not divide evenly keeps the placements that fit it
    fits = {n1: f for f, n1, _ in net.placements(np.array([6.0, 8.0]), 1.0, hw)}
    assert fits[3].tolist() == [True, False] and fits[4].tolist() == [False, True]
    single = dataclasses.replace(HW, scale_up_domain_size=4.0, devices_per_node=1.0, scale_up_latency=3e-6)
    assert shares(4.0, 1.0, single) == [1, 2, 4]
    # a node of one device: every hop of the ring crosses nodes
    assert net.inner_step_latency(4.0, single) == approx(single.scale_up_latency)
    assert net.split(4.0, 16.0, HW) == (1.0, 4.0)                 # members further apart than a domain
    assert net.all_to_all(1e6, 1.0, 1.0, HW) == 0 and net.all_reduce(1e6, 1.0, 1.0, HW) == 0


def test_the_expert_microbenchmark_setting():
    from snlab import network as net
    from snlab.hardware import hardware as hw_of
    cm = hw_of(snlab.system("cloudmatrix384"))
    d8, _ = net.expert_calls(128.0 * cm.dies, 8, 7168, 32 / cm.dies, 1.0, cm, False)
    d16, _ = net.expert_calls(128.0 * cm.dies, 8, 7168, 32 / cm.dies, 2.0, cm, False)
    assert net.expert_all_to_all_time("cloudmatrix384", ranks=32) == approx(float(d8))
    assert net.expert_all_to_all_time("cloudmatrix384", ranks=32, dispatch_bytes=2) == approx(float(d16))


# --- the stage split ----------------------------------------------------------------------

def _split(*args):
    from snlab.training import stages
    s = stages.split(*args)
    return tuple(int(x) for x in (s.first, s.middle, s.last, s.fewest_units, s.fewest_middle))


def test_the_automatic_split_spreads_units_middle_first():
    # 24 layers and a 1-unit tail on 4 stages: 25 units, 6 7 6 6, the tail off the last
    assert _split(24, 4, 0, 0, 1) == (6, 7, 5, 6, 6)
    # 10 layers, tail 1, 3 stages: 11 units as 4 4 3, the last stage 2 layers
    assert _split(10, 3, 0, 0, 1) == (4, 4, 2, 3, 4)
    # a tail larger than a stage's share of the layers is cut to it
    assert _split(4, 2, 0, 0, 10) == (4, 0, 0, 4, 4)
    assert _split(10, 3, 0, 0, 10) == (5, 5, 0, 5, 5)          # tail cut to 10 // 2 = 5
    assert _split(24, 1, 0, 0, 1) == (24, 0, 24, 25, 24)      # one stage holds every layer


def test_a_fixed_first_or_last_stage_shares_the_rest():
    assert _split(24, 4, 2, 4, 1) == (2, 9, 4, 2, 9)
    assert _split(24, 4, 2, 0, 1) == (2, 8, 7, 2, 7)           # the tail is not added when a count is fixed
    assert _split(24, 4, 0, 3, 1) == (7, 7, 3, 3, 7)
    assert _split(24, 2, 10, 14, 0) == (10, 0, 14, 10, 24)
    assert _split(24, 4, 1, 1, 1) == (1, 11, 1, 1, 11)           # one layer each is a count, not "automatic"
    assert _split(24, 3, 1, 0, 1) == (1, 12, 11, 1, 12)
    assert _split(24, 3, 0, 1, 1) == (11, 12, 1, 1, 12)


def test_the_split_types_stay_scalar_or_array():
    import numpy as np
    from snlab.training import stages
    s = stages.split(24, 4, 0, 0, 1)
    assert type(s.first) is np.int64
    a = stages.split(24, np.array([2, 4]), 0, 0, 1)
    assert a.first.tolist() == [13, 6] and a.last.tolist() == [11, 5]


def test_which_splits_are_refused():
    from snlab.training import stages

    def bad(*args):
        return bool(stages.broken(*args))

    assert not bad(24, 4, 2, 0, 0, 1)
    assert bad(24, 4, 7, 0, 0, 1)                               # a stage of 6 units cannot hold 7 chunks
    assert bad(24, 4, 3, 2, 0, 1)                               # fixed first stage of 2 layers, 3 chunks
    assert bad(24, 4, 1, 0, 24, 1)                              # nothing left for the others
    assert bad(24, 4, 1, -1, 0, 1) and bad(24, 4, 1, 0, -1, 1)
    assert bad(24, 1, 1, 2, 0, 1) and bad(24, 1, 1, 0, 2, 1)   # fixed ends need a pipeline
    assert bad(24, 2, 1, 10, 10, 0) and not bad(24, 2, 1, 10, 14, 0)   # two fixed ends must add up
    assert bad(24, 3, 1, 20, 5, 0)                              # more than the layers
    assert bad(24, 4, 4, 2, 4, 0) and not bad(24, 4, 2, 2, 4, 0)      # the middle's 9 units for 4 chunks ... or 2
    assert not bad(10, 3, 2, 0, 0, 10)
    assert not bad(4, 2, 1, 0, 0, 10)                           # a last stage of only the output layer
    assert bad(24, 1, 1, 1, 0, 0) and bad(24, 1, 1, 0, 1, 0)   # one layer fixed is still fixed
    assert bad(24, 2, 1, 1, 1, 0) and bad(24, 2, 1, 1, 0, 0) is False
    assert bad(24, 3, 1, 1, 24, 0)                              # 1 + 24 layers fixed of 24
    assert not bad(24, 2, 1, 1, 23, 0) and not bad(24, 2, 1, 23, 1, 0)
    assert bad(24, 3, 1, 24, 1, 0)
    assert bad(24, 3, 2, 0, 0, 0) is False and bad(9, 3, 3, 0, 0, 0) is False
    # the automatic split may leave the first stage's first chunk to the embedding and the
    # last stage's last to the output layer (8 layers: 3 + 3 + 2 over 3 chunks each) ...
    assert not bad(8, 3, 3, 0, 0, 0) and not bad(126, 16, 8, 0, 0, 0)
    # ... but never a middle stage's chunk (6 layers: 2 each), nor one chunk more
    assert bad(6, 3, 3, 0, 0, 0) and bad(126, 16, 9, 0, 0, 0)
    assert not bad(5, 3, 2, 0, 0, 0) and bad(3, 3, 2, 0, 0, 0)  # 2 + 2 + 1 layers fit 2 chunks; 1 + 1 + 1 do not


def test_stage_layers_and_chunks():
    from snlab.training import stages
    assert stages.stage_layers(24, 4, tail=1) == [6, 7, 6, 5]
    assert stages.stage_layers(24, 4, 2, 4, 1) == [2, 9, 9, 4]
    assert stages.stage_layers(24, 4, 2, 0, 1) == [2, 8, 7, 7]
    assert stages.stage_layers(24, 4, 0, 3, 1) == [7, 7, 7, 3]
    assert stages.stage_layers(126, 16, tail=0) == [7] + [8] * 14 + [7]   # Llama 3 405B's, as trained
    assert stages.stage_layers(24, 1, tail=1) == [24]
    assert stages.stage_layers(24, 4, 1, 1, 1) == [1, 11, 11, 1]
    assert stages.stage_layers(24, 3, 1, 0, 1) == [1, 12, 11]
    assert stages.stage_layers(24, 3, 0, 1, 1) == [11, 12, 1]
    assert stages.stage_layers(24, 2, 0, 0, 30) == [24, 0]          # the tail is cut to 24 // 1
    assert stages.stage_layers(7, 2, 0, 0, 1) == [4, 3]
    assert stages.stage_layers(10, 3, 0, 0, 10) == [5, 5, 0]      # the tail is cut to 10 // 2
    assert stages.stage_layers(24, 3, 1, 0, 2) == [1, 12, 11]       # a fixed end: no tail added
    assert stages.stage_layers(24, 3, 0, 1, 2) == [11, 12, 1]
    assert stages.chunk_layers(7, 2) == [3, 4] and stages.chunk_layers(6, 4) == [1, 1, 2, 2]
    assert stages.chunk_layers(8, 1) == [8]


def test_the_stage_table_says_what_else_each_stage_runs():
    from snlab.training import stages
    table = stages.stage_table("deepseek-v3", 4)
    assert table["also"].tolist()[0] == "embedding"
    assert table["also"].tolist()[-1] == "output layer and loss, 1 MTP module"
    assert table["also"].tolist()[1] == ""
    assert sum(table["layers"]) == 61
    two = stages.stage_table(dataclasses.replace(snlab.model("deepseek-v3"), mtp_modules=2), 2)
    assert two["also"].tolist()[-1] == "output layer and loss, 2 MTP modules"


# --- recomputation by module, FP8 storage, expert tensor parallelism ---------------------

def test_recomputing_modules_drops_what_they_keep():
    """Megatron-Core's recompute_modules on GPT 1.7B (f = 4h, GELU: two hidden tensors)."""
    bf = 2.0
    base = S.activations(SIZES, plan(recompute=0))
    mlp = S.activations(SIZES, plan(recompute=pl.recompute_code("mlp")))
    assert mlp.stored == approx(base.kept - bf * SEQ * 2 * 4 * H)          # GELU input and output dropped
    norms = S.activations(SIZES, plan(recompute=pl.recompute_code("layernorm"), tp=2, sequence_parallel=0))
    plain = S.activations(SIZES, plan(recompute=0, tp=2, sequence_parallel=0))
    assert norms.stored == approx(plain.kept - bf * SEQ * 2 * H)          # replicated without SP
    both = S.activations(SIZES, plan(recompute=pl.recompute_code("layernorm,mlp"), tp=2, sequence_parallel=1))
    sp = S.activations(SIZES, plan(recompute=0, tp=2, sequence_parallel=1))
    assert both.stored == approx(sp.kept - bf * SEQ * (2 * H + 2 * 4 * H) / 2)
    assert both.modules == approx(bf * SEQ * (2 * H + 2 * 4 * H) / 2) and both.rebuilt == approx(both.modules)
    # modules a dense GPT does not have drop nothing
    other = S.activations(SIZES, plan(recompute=pl.recompute_code("mla_up_proj,moe_act,shared_experts,moe")))
    assert other.stored == approx(base.kept) and other.modules == 0
    # without FlashAttention, modules without core_attn keep the scores; with it, they go
    scores = S.activations(SIZES, plan(recompute=pl.recompute_code("mlp"), flash_attention=0))
    assert scores.stored == approx(scores.everything - bf * SEQ * 2 * 4 * H)
    attn = S.activations(SIZES, plan(recompute=pl.recompute_code("core_attn,mlp"), flash_attention=0))
    assert attn.stored == approx(attn.selective - bf * SEQ * 2 * 4 * H)
    assert attn.rebuilt == approx(attn.everything - attn.selective + bf * SEQ * 2 * 4 * H)


def test_module_recomputation_runs_their_matrix_multiplies_again():
    p = plan(recompute=pl.recompute_code("mlp"))
    lay, act = S.layout(SIZES, p), S.activations(SIZES, p)
    comp = S.compute(SIZES, p, HW, lay, act)
    base = S.compute(SIZES, plan(recompute=1), HW, lay, S.activations(SIZES, plan(recompute=1)))
    # the MLP's 8 h^2 of the layer's 12 h^2 forward again, and the dropped bytes written again
    mlp = comp.dense_gemm * 8 * H * H / DENSE + act.modules / BYTE_RATE
    assert comp.recompute == approx(base.recompute + L * mlp)


def test_moe_modules():
    k, fe, h, experts = 8.0, 768.0, 2048.0, 128.0
    base = S.activations(QWEN, plan(recompute=0, dp=8, ep=8))
    act = S.activations(QWEN, plan(recompute=pl.recompute_code("moe_act"), dp=8, ep=8))
    assert act.modules == approx(2 * SEQ * k * fe)                 # the routed experts' activation output
    moe = S.activations(QWEN, plan(recompute=pl.recompute_code("moe"), dp=8, ep=8))
    assert moe.modules == approx(2 * SEQ * (3 * k * fe + k * h))    # gate, up, product and the k token copies
    assert moe.stored == approx(base.kept - moe.modules)
    # recomputing the MoE block repeats its all-to-alls
    p = plan(dp=8, ep=8, ep_dispatcher=0, expert_imbalance=1.0, recompute=pl.recompute_code("moe"))
    q = plan(dp=8, ep=8, ep_dispatcher=0, expert_imbalance=1.0, recompute=0)
    lay = S.layout(QWEN, p)
    assert S.expert_comm(QWEN, p, EP_HW, lay) == approx(1.5 * S.expert_comm(QWEN, q, EP_HW, lay))
    # and its experts' matrix multiplies
    lay, act = S.layout(QWEN, p), S.activations(QWEN, p)
    comp = S.compute(QWEN, p, HW, lay, act)
    base = S.compute(QWEN, q, HW, lay, S.activations(QWEN, q))
    assert comp.recompute == approx(base.recompute + L * 2 * (comp.expert_gemm + act.modules / BYTE_RATE))


def test_fp8_keeps_the_linear_layers_inputs_in_one_byte():
    """Transformer Engine's FP8: the QKV and MLP inputs (2h, replicated), the second MLP
    input (f) at one byte, the output projection's input twice (16-bit and FP8)."""
    for tp, sp_ in ((1, 0), (2, 1), (2, 0)):
        bf16 = S.activations(SIZES, plan(recompute=0, tp=tp, sequence_parallel=sp_))
        fp8 = S.activations(SIZES, plan(recompute=0, tp=tp, sequence_parallel=sp_, fp8_activations=1))
        saved = SEQ * (2 * H / tp ** sp_ + (4 * H - H) / tp)
        assert fp8.stored == approx(bf16.kept - saved)
        everything = S.activations(SIZES, plan(recompute=0, tp=tp, sequence_parallel=sp_, fp8_activations=2))
        assert everything.stored == approx(fp8.stored - SEQ * 4 * H / tp)    # and the GELU input
    full = S.activations(SIZES, plan(recompute=2, fp8_activations=2))
    assert full.stored == approx(full.full)                       # full recomputation keeps the 16-bit input
    # what the norms' or the MLP's recomputation drops is not kept in FP8 either
    norms = S.activations(SIZES, plan(recompute=pl.recompute_code("layernorm,mlp"), fp8_activations=2))
    assert norms.stored == approx(S.activations(SIZES, plan(recompute=pl.recompute_code("layernorm,mlp"))).stored
                                  + SEQ * H)                          # only the output projection's FP8 copy


def test_fp8_moe_storage():
    k, fe, h = 8.0, 768.0, 2048.0
    bf16 = S.activations(QWEN, plan(recompute=0, dp=8, ep=8))
    fp8 = S.activations(QWEN, plan(recompute=0, dp=8, ep=8, fp8_activations=1))
    wo = QWEN.attention_output_width
    assert fp8.stored == approx(bf16.kept - SEQ * (2 * h + k * fe + k * h - wo))
    act = S.activations(QWEN, plan(recompute=pl.recompute_code("moe_act"), dp=8, ep=8, fp8_activations=2))
    plain = S.activations(QWEN, plan(recompute=pl.recompute_code("moe_act"), dp=8, ep=8))
    assert act.stored == approx(plain.stored - SEQ * (2 * h + k * h - wo + 2 * k * fe))
    whole = S.activations(QWEN, plan(recompute=pl.recompute_code("moe"), dp=8, ep=8, fp8_activations=2))
    assert whole.stored == approx(S.activations(QWEN, plan(recompute=pl.recompute_code("moe"), dp=8, ep=8)).stored
                                  - SEQ * (2 * h - wo))


def test_shared_experts_and_latent_attention_modules():
    ds = model_sizes(snlab.model("deepseek-v3"))
    p = plan(dp=8, ep=8)
    base = S.activations(ds, dataclasses.replace(p, recompute=np.float64(0)))
    up = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("mla_up_proj"))))
    assert up.modules == approx(2 * SEQ * (128 * 192 + 128 * (192 + 128)))  # queries, keys and values, 128 heads
    shared = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("shared_experts"))))
    assert shared.modules == approx(2 * SEQ * 58 / 61 * 3 * 2048)
    assert shared.stored == approx(base.kept - shared.modules)
    norms = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("layernorm"))))
    assert norms.modules == approx(2 * SEQ * (2 * 7168 + 1536 + 512))    # and the latents' norms
    fp8 = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("shared_experts")),
                                                fp8_activations=np.float64(2)))
    kept = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("shared_experts"))))
    dense_down, routed = 3 / 61 * 18432, 8 * 58 / 61 * 2048
    wo = 128 * 128
    inner = 2 / 3 * (3 / 61 * 3 * 18432 + 58 / 61 * 3 * 8 * 2048)        # gate and up, dense and routed
    assert fp8.stored == approx(kept.stored - SEQ * (2 * 7168 + dense_down + routed + ds.routed_copies * 7168 - wo
                                                     + inner))
    # the up-projections' weights run again
    comp = S.compute(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("mla_up_proj"))), HW,
                     S.layout(ds, p), up)
    ref = S.compute(ds, dataclasses.replace(p, recompute=np.float64(1)), HW, S.layout(ds, p),
                    S.activations(ds, dataclasses.replace(p, recompute=np.float64(1))))
    mla_up = 128 * 192 * 1536 + 128 * 256 * 512
    layers = S.layout(ds, p).stage_layers
    assert comp.recompute == approx(ref.recompute + layers * (comp.dense_gemm * mla_up / ds.dense_matmul_params
                                                              + up.modules / BYTE_RATE))


def test_fp8_weight_copies_sit_beside_the_weights():
    p = plan(dp=8)
    lay, act = S.layout(SIZES, p), S.activations(SIZES, p)
    params = S.parameters(SIZES, p, lay)
    assert S.memory(SIZES, p, lay, act, params, 2.0).buffers == approx(2.0 * params.total)
    z3 = plan(dp=8, zero_stage=3)
    lay3 = S.layout(SIZES, z3)
    params3 = S.parameters(SIZES, z3, lay3)
    buffers = S.memory(SIZES, z3, lay3, act, params3, 1.0).buffers
    layer = params3.total / lay3.stage_layers
    assert buffers == approx(layer * (4 + 2) + 1.0 * 2 * layer)          # two gathered layers' copies
    assert snlab.hardware.hardware(snlab.system("dgx-h100"), "fp8").weight_copy_bytes == 2.0
    assert snlab.hardware.hardware(snlab.system("dgx-b200"), "fp8").weight_copy_bytes == 1.0
    assert snlab.hardware.hardware(snlab.system("dgx-h100"), "bf16").weight_copy_bytes == 0.0


def test_experts_split_fewer_ways_than_the_dense_layers():
    """expert_tp 1 with tp 2: whole experts, the expert group spanning the tensor ranks."""
    p = plan(tp=2, dp=4, ep=8, expert_tp=1, expert_imbalance=1.0, sequence_parallel=1)
    lay, act = S.layout(QWEN, p), S.activations(QWEN, p)
    params = S.parameters(QWEN, p, lay)
    assert params.experts == approx(QWEN.expert_params / 8)
    assert params.groups[1][1:] == (1.0, 8.0)                      # 2 x 4 / 8 replicas, ranks 1 x 1 x 8 apart
    comp = S.compute(QWEN, p, HW, lay, act)
    per_expert = SEQ / 2 * 8 * 8 / 128                               # half the tokens reach each rank's experts
    assert comp.expert_gemm == approx(16 * gemm(per_expert, 2048, 3 * 768))
    a2a = S.expert_comm(QWEN, dataclasses.replace(p, ep_dispatcher=np.float64(0)), EP_HW, lay)
    msg = SEQ / 2 * 8 * 2048 * 2
    assert a2a == approx(48 * 2 * 2 * (10e-6 + 7 * 1e-6 + 7 / 8 * msg / UP))   # 8 ranks in one domain
    no_sp = plan(tp=2, dp=4, ep=8, expert_tp=1, expert_imbalance=1.0, sequence_parallel=0, ep_dispatcher=0)
    assert S.expert_comm(QWEN, no_sp, EP_HW, S.layout(QWEN, no_sp)) == approx(a2a)   # each rank its half
    same = plan(tp=2, dp=4, ep=4, expert_imbalance=1.0)
    assert same.etp == 2 and p.etp == 1


def test_recomputing_a_moe_block_with_shared_experts():
    ds = model_sizes(snlab.model("deepseek-v3"))
    p = plan(dp=8, ep=8, recompute=0)
    base = S.activations(ds, p)
    assert base.modules == 0 and base.rebuilt == 0
    moe_share, k, fe, h = 58 / 61, 8.0, 2048.0, 7168.0
    whole = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("moe"))))
    assert whole.modules == approx(2 * SEQ * moe_share * (3 * k * fe + 3 * fe + k * h))
    act = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("moe_act,shared_experts"))))
    assert act.modules == approx(2 * SEQ * moe_share * (k * fe + 3 * fe))
    # in FP8 the shared experts' down-projection input is kept in one byte unless recomputed
    fp8 = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("moe_act")),
                                                fp8_activations=np.float64(2)))
    bf = S.activations(ds, dataclasses.replace(p, recompute=np.float64(pl.recompute_code("moe_act"))))
    wo, dense = 128 * 128, 3 / 61
    inner = 2 / 3 * (dense * 3 * 18432 + moe_share * 3 * k * fe + moe_share * 3 * fe)
    assert fp8.stored == approx(bf.stored - SEQ * (2 * h + dense * 18432 - wo + moe_share * fe + ds.routed_copies * h
                                                   + inner))
    # recomputing the MoE block runs the shared experts' matrix multiplies again too
    q = dataclasses.replace(p, recompute=np.float64(pl.recompute_code("moe")))
    lay = S.layout(ds, q)
    comp = S.compute(ds, q, HW, lay, whole)
    ref = S.compute(ds, dataclasses.replace(p, recompute=np.float64(1)), HW, lay,
                    S.activations(ds, dataclasses.replace(p, recompute=np.float64(1))))
    shared = moe_share * 3 * h * fe
    assert comp.recompute == approx(ref.recompute + lay.stage_layers * (
        comp.dense_gemm * shared / ds.dense_matmul_params + comp.expert_gemm + whole.modules / BYTE_RATE))


def test_memory_stage_by_stage():
    """GPT 1.7B on 2 stages (the output layer counted as one more layer on the last: 13 +
    11), 8 micro-batches, dp 2: each stage's own weights and in-flight activations."""
    hw = dataclasses.replace(HW, weight_copy_bytes=2.0)
    p = plan(pp=2, dp=2, global_batch=16, recompute=0)
    rows = S.stage_memory(SIZES, p, hw)
    act = S.activations(SIZES, p)
    assert [r["layers"] for r in rows] == [13, 11] and [r["in_flight"] for r in rows] == [2, 1]
    emb = V * H + 2048 * H                                        # the input embedding and learned positions
    first = SIZES.layer_params * 13 / L + emb
    last = SIZES.layer_params * 11 / L + V * H                    # the output layer's copy
    for row, params in ((rows[0], first), (rows[1], last)):
        assert row["weights"] == approx(2 * params)
        assert row["grads"] == approx(2 * params)
        assert row["optimizer"] == approx(12 * params / 2)
        assert row["buffers"] == approx(2.0 * params)             # the FP8 copies
    logits = 4 * SEQ * V
    assert rows[0]["activations"] == approx(act.stored * 13 * 2)
    assert rows[1]["activations"] == approx(act.stored * 11 * 1 + logits)
    for row in rows:
        assert row["total"] == approx(row["weights"] + row["grads"] + row["optimizer"] + row["activations"]
                                      + row["buffers"])
    # ZeRO-3 holds two gathered layers and their gradients; full recomputation's working layer
    z3 = plan(dp=8, zero_stage=3, recompute=2)
    one = S.stage_memory(SIZES, z3, HW)[0]
    params = SIZES.layer_params + emb
    per_layer = params / L
    assert one["buffers"] == approx(per_layer * (4 + 2)) and one["weights"] == approx(2 * params / 8)
    full = S.activations(SIZES, z3)
    assert one["activations"] == approx(full.full * 24 * 1 + logits + full.kept)
    z2 = S.stage_memory(SIZES, plan(dp=8, zero_stage=2), HW)[0]
    assert z2["buffers"] == approx(params / L * 2) and z2["grads"] == approx(2 * params / 8)
    mtp = S.stage_memory(MTP, plan(pp=2, global_batch=16), HW)
    # the MTP module weighs 3 more layers on the last stage (floor((V h + 14 h^2) / 12 h^2)):
    # 14 + 10 layers, the last also running the module's layer and its logits
    assert mtp[1]["layers"] == 10 and mtp[1]["activations"] == approx(
        S.activations(MTP, plan(pp=2, global_batch=16)).stored * 11 * 1 + 2 * logits)
    tied = S.stage_memory(SIZES, plan(), HW)[0]
    assert tied["weights"] == approx(2 * (SIZES.layer_params + emb))   # one stage: the tied embedding once
    moe = S.stage_memory(QWEN, plan(dp=8, ep=8, expert_tp=1), HW)[0]
    assert moe["weights"] == approx(2 * (QWEN.layer_params + QWEN.embedding_params + 151936 * 2048
                                         + QWEN.expert_params / 8))
    assert moe["optimizer"] == approx(12 * ((QWEN.layer_params + QWEN.embedding_params + 151936 * 2048) / 8
                                            + QWEN.expert_params / 8))


def test_the_end_stages_may_hold_one_chunk_fewer():
    from snlab.training import stages
    # two stages of 3 chunks: 2 + 2 layers, a chunk of each end for the embedding and the
    # loss; 2 + 1 leaves the last stage short
    assert not stages.broken(4, 2, 3) and stages.broken(3, 2, 3)
    # the output layer as a unit of the last stage counts toward its chunks
    assert not stages.broken(3, 2, 3, 0, 0, 1) and stages.broken(2, 2, 3, 0, 0, 1)
    assert stages.split(4, 2, 0, 0, 1).last_units == 2 and stages.split(7, 1).last_units == 8


def test_stage_memory_with_tensor_context_and_expert_parallelism():
    hw = dataclasses.replace(HW, weight_copy_bytes=1.0)
    p = plan(tp=2, cp=2, dp=4, ep=4, expert_tp=2, pp=2, global_batch=16, expert_imbalance=1.0)
    rows = S.stage_memory(QWEN, p, hw)
    act = S.activations(QWEN, p)
    n0, n1 = rows[0]["layers"], rows[1]["layers"]
    assert n0 + n1 == 48
    dense0 = (QWEN.layer_params * n0 / 48 + QWEN.embedding_params) / 2
    experts0 = QWEN.expert_params * n0 / 48 / (4 * 2)
    # dense states over dp x cp = 8; expert states over the 2 x 4 x 2 / (4 x 2) = 2 replicas
    assert rows[0]["optimizer"] == approx(12 * (dense0 / 8 + experts0 / 2))
    assert rows[0]["buffers"] == approx(1.0 * (dense0 + experts0))
    logits = 4 * SEQ / 2 * 151936 / 2                             # the sequence over cp, the vocabulary over tp
    assert rows[1]["activations"] == approx(act.stored * n1 * rows[1]["in_flight"] + logits)
    # a last stage of the output layer alone (24 stages of GPT 1.7B: the tail takes a layer's place)
    lone = S.stage_memory(SIZES, plan(pp=24, global_batch=24, zero_stage=2), HW)[-1]
    assert lone["layers"] == 0 and lone["buffers"] == approx(V * H * 2)
    z3 = S.stage_memory(SIZES, plan(dp=8, zero_stage=3), hw)[0]
    per_layer = (SIZES.layer_params + V * H + 2048 * H) / L
    assert z3["buffers"] == approx(per_layer * (4 + 2) + 1.0 * 2 * per_layer)


def test_fp8_parameters_keep_one_byte_a_weight_and_no_copy():
    """Weights kept in FP8 (Megatron-Core's fp8_param): one byte each, none of the FP8
    copies 16-bit weights need beside them, and FP8 layers gathered under ZeRO-3."""
    p = plan(dp=8, zero_stage=1, fp8_params=1)
    lay, act, _, params = parts(p)
    P = params.dense
    mem = S.memory(SIZES, p, lay, act, params, weight_copy_bytes=1.0)
    assert mem.weights == approx(1 * P) and mem.grads == approx(2 * P) and mem.buffers == 0
    sixteen = S.memory(SIZES, plan(dp=8, zero_stage=1), lay, act, params, weight_copy_bytes=1.0)
    assert sixteen.weights == approx(2 * P) and sixteen.buffers == approx(1.0 * P)
    z3 = plan(dp=8, zero_stage=3, fp8_params=1)
    lay, act, _, params = parts(z3)
    mem = S.memory(SIZES, z3, lay, act, params, weight_copy_bytes=1.0)
    assert mem.weights == approx(P / 8)
    assert mem.buffers == approx(P / L * (2 * 1 + 2))             # two FP8 layers + one's gradients
    hw = dataclasses.replace(HW, weight_copy_bytes=1.0)
    one = S.stage_memory(SIZES, plan(dp=8, zero_stage=1, fp8_params=1), hw)[0]
    emb = V * H + 2048 * H
    assert one["weights"] == approx(SIZES.layer_params + emb) and one["buffers"] == 0
    three = S.stage_memory(SIZES, z3, hw)[0]
    assert three["buffers"] == approx((SIZES.layer_params + emb) / L * (2 * 1 + 2))
