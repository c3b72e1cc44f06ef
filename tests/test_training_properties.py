"""Invariants of the training-step model, checked with hypothesis over random valid plans.

Each example costs a few ``snlab.train`` calls (milliseconds each), so the example
counts are modest. The plans are drawn valid by construction (degrees that divide
heads, layers, batch), on every shipped system and on dense, grouped-query and
mixture-of-experts models.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import snlab
from snlab.specs import Model, MoE

MOE = Model(name="moe-test", description="test MoE model", layers=16, hidden_size=2048, heads=16, kv_heads=16,
            head_dim=128, ffn_hidden_size=8192, vocab_size=32000, seq_len=2048, gated_mlp=True,
            moe=MoE(experts=16, experts_per_token=2, expert_ffn_hidden_size=1408, shared_experts=1,
                    dense_layers=1))
MODELS = ["megatron-1.7b", "megatron-7.5b", "megatron-22b", "llama3-8b", "llama3-70b", "gpt3-175b", MOE]
SYSTEMS = ["dgx-a100", "dgx-h100", "pcie-ethernet-a100", "cloudmatrix384", "gb200-nvl72", "atlas-800t-a2"]
REL = 1e-12
SETTINGS = dict(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def _model(spec) -> Model:
    return snlab.model(spec)


@lru_cache(maxsize=None)
def _system(name):
    return snlab.system(name)


CLASSES = ("dp", "zero", "tp", "pp", "ep", "cp", "offload")
levels = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0)
overlaps = st.sampled_from(["none", "gradients", "standard", "all"]) | st.fixed_dictionaries(
    {c: levels for c in ("dp", "zero", "tp", "pp", "ep", "cp", "offload")})


@st.composite
def plans(draw, *, zero=None, recompute=None, overlap=None, offload=None):
    """(model, system, plan) with a plan that obeys every rule."""
    spec = draw(st.sampled_from(MODELS))
    m = _model(spec)
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8, 16) if m.heads % t == 0
                               and (m.kv_heads % t == 0 or t % m.kv_heads == 0)]))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 8) if p <= m.layers]))
    interleave = draw(st.sampled_from([v for v in (1, 2) if v == 1 or m.layers % (pp * v) == 0 and pp > 1]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (dp * cp) % e == 0 and m.moe.experts % e == 0])) \
        if m.moe else 1
    micro_batch = draw(st.sampled_from([1, 2, 4]))
    micro_batches = draw(st.integers(1, 16))
    if interleave > 1:        # the interleaved schedule needs whole rounds of pp micro-batches
        micro_batches = pp * draw(st.integers(1, 4))
    plan = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=micro_batch,
                global_batch=micro_batch * dp * micro_batches, interleave=interleave,
                zero=draw(st.sampled_from([0, 1, 2] + ([3] if pp == 1 else []))) if zero is None else zero,
                recompute=draw(st.sampled_from(["none", "selective", "full"])) if recompute is None else recompute,
                sequence_parallel=draw(st.sampled_from([None, True, False])),
                overlap=draw(overlaps) if overlap is None else overlap,
                offload=draw(st.sampled_from(["none", "optimizer", "activations", "both"]))
                if offload is None else offload,
                flash_attention=draw(st.booleans()))
    return spec, draw(st.sampled_from(SYSTEMS)), plan


def _le(a, b):
    return a <= b * (1 + REL) + 1e-300


# --- faster hardware, more overlap: never slower --------------------------------------

def _base_value(system, field):
    s = _system(system)
    return {"scale_out_bandwidth": s.scale_out.bandwidth, "scale_up_bandwidth": s.scale_up.bandwidth,
            "peak_flops": s.device.peak_flops["bf16"], "hbm_bandwidth": s.device.hbm_bandwidth,
            "host_bandwidth": s.host.bandwidth, "scale_out_latency": s.scale_out.latency,
            "scale_up_latency": s.scale_up.latency}[field]


def _faster_is_not_slower(case, factor, field):
    model, system, plan = case
    x = _base_value(system, field)
    slow = snlab.train(model, system, **plan, **{field: x})
    fast = snlab.train(model, system, **plan, **{field: x * factor})
    assert _le(fast.step_time_s, slow.step_time_s)
    if field != "peak_flops":          # same model FLOPs and peak: MFU follows the time
        assert fast.mfu >= slow.mfu * (1 - REL)


@settings(**SETTINGS)
@given(case=plans(), factor=st.floats(1.0, 50.0),
       field=st.sampled_from(["scale_out_bandwidth", "scale_up_bandwidth", "host_bandwidth"]))
def test_faster_links_never_slow_a_step(case, factor, field):
    _faster_is_not_slower(case, factor, field)


#: a plan whose only communication is tensor-parallel traffic across two 8-GPU domains,
#: comparable to its compute: with overlap "all", faster compute makes the step slower
#: tensor parallelism inside one scale-up domain (eight devices), the only place its
#: collectives can hide
TP_ONLY = ("megatron-7.5b", "dgx-a100", dict(tp=8, pp=1, dp=1, cp=1, ep=1, micro_batch=1, global_batch=1,
                                             interleave=1, zero=0, recompute="none", sequence_parallel=None,
                                             overlap="all", offload="none", flash_attention=False))


@settings(**SETTINGS)
@example(case=TP_ONLY, factor=2.0, field="peak_flops")
@given(case=plans(), factor=st.floats(1.0, 50.0), field=st.sampled_from(["peak_flops", "hbm_bandwidth"]))
def test_faster_chips_never_slow_a_step(case, factor, field):
    _faster_is_not_slower(case, factor, field)


@pytest.mark.parametrize("system", ["dgx-a100", "pcie-ethernet-a100"])
def test_full_overlap_takes_the_longer_of_compute_and_communication(system):
    """Fully overlapped, the step is the longer of the two plus what hiding the shorter
    costs the compute (``overlap_contention`` per second hidden)."""
    model, _, plan = TP_ONLY
    r = snlab.train(model, system, **plan)
    t = r.time_s
    assert t["tp"] > 0 and t["compute"] > 0 and t["bubble"] == 0 and t["dp"] == 0
    kappa = snlab.system(system).device.overlap_contention
    assert 0 < kappa < 1
    assert t["contention"] == pytest.approx(kappa * min(t["compute"], t["tp"]), rel=1e-9)
    assert r.step_time_s == pytest.approx(max(t["compute"], t["tp"]) + t["contention"] + t["optimizer"], rel=1e-9)


def test_both_orders_of_compute_and_communication_are_covered():
    longer = {s: snlab.train(TP_ONLY[0], s, **TP_ONLY[2]).time_s for s in ("dgx-a100", "pcie-ethernet-a100")}
    assert longer["dgx-a100"]["compute"] > longer["dgx-a100"]["tp"]
    assert longer["pcie-ethernet-a100"]["tp"] > longer["pcie-ethernet-a100"]["compute"]


@settings(**SETTINGS)
@given(case=plans(), factor=st.floats(1.0, 100.0),
       field=st.sampled_from(["scale_out_latency", "scale_up_latency"]))
def test_more_latency_never_speeds_a_step(case, factor, field):
    model, system, plan = case
    x = max(_base_value(system, field), 1e-7)
    low = snlab.train(model, system, **plan, **{field: x})
    high = snlab.train(model, system, **plan, **{field: x * factor})
    assert _le(low.step_time_s, high.step_time_s)


@settings(**SETTINGS)
@given(case=plans(overlap="none"), lo=st.fixed_dictionaries({c: levels for c in CLASSES}),
       up=st.fixed_dictionaries({c: st.floats(0.0, 1.0) for c in CLASSES}))
def test_more_overlap_never_slows_a_step(case, lo, up):
    model, system, plan = case
    hi = {c: lo[c] + (1.0 - lo[c]) * up[c] for c in lo}
    steps = [snlab.train(model, system, **dict(plan, overlap=ov)).step_time_s for ov in ("none", lo, hi, "all")]
    for a, b in zip(steps[1:], steps[:-1]):
        assert _le(a, b)


# --- the step's bookkeeping ------------------------------------------------------------

COMM = ("tp", "ep", "cp", "pp", "dp", "zero")


@settings(**SETTINGS)
@given(case=plans())
def test_step_time_lies_between_its_lower_and_upper_bounds(case):
    """Overlap only hides communication: the step is at least compute + bubble +
    optimizer, and at most that plus every communication and offload in full."""
    model, system, plan = case
    r = snlab.train(model, system, **plan)
    t = r.time_s
    for key in ("compute", "recompute", "bubble", "optimizer", "offload") + COMM:
        assert t[key] >= 0, key
    floor = t["compute"] + t["bubble"] + t["optimizer"]
    ceiling = floor + sum(t[c] for c in COMM) + t["offload"]
    assert _le(floor, r.step_time_s)
    assert _le(r.step_time_s, ceiling)
    assert t["compute"] >= t["recompute"] * (1 - REL)


@settings(**SETTINGS)
@given(case=plans(overlap="none"))
def test_without_overlap_the_step_is_the_sum_of_its_parts(case):
    model, system, plan = case
    r = snlab.train(model, system, **plan)
    t = r.time_s
    parts = t["compute"] + sum(t[c] for c in COMM) + t["bubble"] + t["optimizer"] + t["offload"]
    assert r.step_time_s == pytest.approx(parts, rel=1e-9)
    for c in COMM:                                          # nothing is hidden
        assert t["exposed"][c] == pytest.approx(t[c], rel=1e-9, abs=1e-15)


@settings(**SETTINGS)
@given(case=plans())
def test_exposed_communication_accounts_for_the_step(case):
    """What is not hidden is what the step sees: the step is compute + exposed
    communication + bubble + optimizer, plus the optimizer's offload round trip
    (never hidden, at most the whole offload time)."""
    model, system, plan = case
    r = snlab.train(model, system, **plan)
    t = r.time_s
    seen = (t["compute"] + t["exposed_communication"] + t["exposed"]["offload"] + t["bubble"] + t["optimizer"]
            + t["contention"])
    if plan["offload"] == "none":
        assert r.step_time_s == pytest.approx(seen, rel=1e-9)
    else:
        assert _le(seen, r.step_time_s)
        assert _le(r.step_time_s, seen + t["offload"])


def test_exposed_communication_accounts_for_the_step_with_partial_overlap():
    """With overlap 0.5 on the only communication class, the step sees exactly the
    exposed part: step = compute + exposed + optimizer (pp = 1, dp = 1: no bubble,
    no gradient all-reduce)."""
    r = snlab.train("megatron-7.5b", "pcie-ethernet-a100", tp=8, pp=1, dp=1, global_batch=8, zero=0,
                    overlap="tp=0.5")
    t = r.time_s
    assert t["tp"] > 0 and t["bubble"] == 0 and t["dp"] == 0
    assert r.step_time_s == pytest.approx(t["compute"] + t["exposed_communication"] + t["contention"]
                                          + t["optimizer"], rel=1e-9)


@settings(**SETTINGS)
@given(case=plans())
def test_utilisation_is_bounded(case):
    model, system, plan = case
    r = snlab.train(model, system, **plan)
    dev = _system(system).device
    achievable = dev.gemm_efficiency * dev.sustained_clock
    assert 0 < r.mfu <= r.hfu * (1 + REL)
    assert r.mfu <= achievable * (1 + REL)          # model FLOPs cannot run faster than the roofline
    if plan["recompute"] != "none" or not plan["flash_attention"]:
        assert r.hfu <= achievable * (1 + REL)
    assert r.hardware_tflops_per_device == pytest.approx(r.hfu * dev.peak_flops["bf16"] / 1e12, rel=1e-9)


def test_hfu_never_exceeds_the_achievable_fraction_of_peak():
    dev = _system("dgx-a100").device
    achievable = dev.gemm_efficiency * dev.sustained_clock
    fast_links = dict(scale_up_bandwidth=1e15, scale_out_bandwidth=1e15, overlap="all")
    r = snlab.train("llama3-8b", "dgx-a100", tp=1, pp=1, dp=8, micro_batch=1, global_batch=128, seq_len=32768,
                    recompute="none", flash_attention=True, **fast_links)
    assert r.hfu <= achievable * (1 + REL), f"HFU {r.hfu:.3f} > {achievable}"


def test_same_hardware_flops_take_the_same_compute_time():
    plan = dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=128, seq_len=32768, flash_attention=True)
    none = snlab.train("llama3-8b", "dgx-a100", recompute="none", **plan)
    sel = snlab.train("llama3-8b", "dgx-a100", recompute="selective", **plan)
    flops_none = none.hardware_tflops_per_device * none.step_time_s
    flops_sel = sel.hardware_tflops_per_device * sel.step_time_s
    if flops_none == pytest.approx(flops_sel, rel=1e-9):
        assert none.time_s["compute"] == pytest.approx(sel.time_s["compute"], rel=1e-9)


@settings(**SETTINGS)
@given(case=plans(), factor=st.sampled_from([2, 4]))
def test_more_micro_batches_never_lower_throughput(case, factor):
    """The same plan with more micro-batches per step amortises the bubble, the
    gradient reduction and the optimizer: tokens per second never drop, as long as the
    memory sits where it did. More micro-batches in flight offload more activations, which
    may overflow a supernode's pool into host memory (megatron-22b on GB200 NVL72 at tp 2,
    pp 2, interleave 2, dp 8, cp 2: 19.7 GB a device fits the 23.2 GB a device the eight idle
    GPUs lend, 24.8 GB does not): a slower tier, not a smaller amortisation."""
    model, system, plan = case
    one = snlab.train(model, system, **plan)
    more = snlab.train(model, system, **dict(plan, global_batch=plan["global_batch"] * factor))
    # the far tier each offloads to: the pool's free memory, or the host's
    tiers = snlab.sweep(model, system, **dict(plan, global_batch=[plan["global_batch"], plan["global_batch"] * factor]))
    assume(tiers["offload_capacity_bytes"].nunique() == 1)
    assert more.tokens_per_s >= one.tokens_per_s * (1 - 1e-9)
    assert _le(more.step_time_s, one.step_time_s * factor)


# --- memory ------------------------------------------------------------------------

PARTS = ("weights", "grads", "optimizer", "activations", "buffers")


@settings(**SETTINGS)
@given(case=plans())
def test_memory_parts_add_up_and_fits_agrees_with_capacity(case):
    model, system, plan = case
    r = snlab.train(model, system, **plan)
    mem = r.memory_bytes_per_device
    assert all(mem[p] >= 0 for p in PARTS)
    assert mem["total"] == pytest.approx(sum(mem[p] for p in PARTS), rel=1e-12)
    device = _system(system).device
    usable = (device.hbm_capacity - device.memory_reserve) * device.allocator_efficiency
    assert mem["capacity"] == device.hbm_capacity
    assert mem["usable"] == pytest.approx(usable, rel=1e-12) and 0 < usable < device.hbm_capacity
    assert mem["headroom"] == pytest.approx(usable - mem["total"], rel=1e-9, abs=1.0)
    if r.fits:
        assert mem["total"] <= usable
    if mem["total"] > usable:
        assert not r.fits
    if plan["offload"] == "none":
        assert mem["offloaded"] == 0
        assert r.fits == (mem["total"] <= usable)


@settings(**SETTINGS)
@given(case=plans(zero=0))
def test_each_zero_stage_never_uses_more_memory(case):
    model, system, plan = case
    stages = [0, 1, 2, 3] if plan["pp"] == 1 else [0, 1, 2]
    mems = [snlab.train(model, system, **dict(plan, zero=z)).memory_bytes_per_device for z in stages]
    for lo, hi in zip(mems, mems[1:]):
        # the model states never grow; the working buffers of ZeRO-2/3 (one or two
        # layers) are what a higher stage may add
        assert _le(hi["total"] - hi["buffers"], lo["total"] - lo["buffers"])
        for part in ("weights", "grads", "optimizer"):
            assert _le(hi[part], lo[part]), part
        assert hi["activations"] == pytest.approx(lo["activations"], rel=1e-12)
    if plan["dp"] * plan["cp"] > 1:          # something to shard over: stage 1 saves optimizer memory
        assert mems[1]["optimizer"] < mems[0]["optimizer"] or plan["offload"] in ("optimizer", "both")


@settings(**SETTINGS)
@given(case=plans(recompute="none", offload="none"))
def test_recomputation_never_stores_more_activations(case):
    """Selective never stores more than none; full never more than selective once a
    stage holds at least two layers' activations (with one layer the checkpointed
    input plus the recomputed layer exceeds what selective keeps)."""
    model, system, plan = case
    act = {rc: snlab.train(model, system, **dict(plan, recompute=rc)).memory_bytes_per_device["activations"]
           for rc in ("none", "selective", "full")}
    assert _le(act["selective"], act["none"])
    if not plan["flash_attention"]:
        assert act["selective"] < act["none"]          # the attention scores are dropped
    layers = _model(model).layers
    if layers // plan["pp"] >= 2:
        assert _le(act["full"], act["selective"])


@settings(**SETTINGS)
@given(case=plans(offload="none"), where=st.sampled_from(["optimizer", "activations", "both"]))
def test_offload_never_adds_device_memory(case, where):
    model, system, plan = case
    kept = snlab.train(model, system, **plan)
    moved = snlab.train(model, system, **dict(plan, offload=where))
    assert _le(moved.memory_bytes_per_device["total"], kept.memory_bytes_per_device["total"])
    assert moved.memory_bytes_per_device["offloaded"] >= 0
    if where in ("optimizer", "both"):
        assert moved.memory_bytes_per_device["optimizer"] == 0
        assert moved.memory_bytes_per_device["offloaded"] >= kept.memory_bytes_per_device["optimizer"] * (1 - REL)
    assert _le(kept.step_time_s, moved.step_time_s)     # moving state off the device is never free


@settings(deadline=None, max_examples=15)
@given(case=plans())
def test_a_sweep_row_is_train(case):
    """Vectorised and one-row evaluation agree for any plan (a grid of 2 x 2 around it)."""
    model, system, plan = case
    plan = {k: v for k, v in plan.items() if v is not None}
    grid = snlab.sweep(model, system, **dict(plan, micro_batch=[plan["micro_batch"], 1],
                                             recompute=[plan["recompute"], "full"]))
    assume(bool(grid["valid"].iloc[0]))
    r = snlab.train(model, system, **plan)
    row = grid.iloc[0]
    assert row.step_time_s == pytest.approx(r.step_time_s, rel=1e-9)
    assert row.mfu == pytest.approx(r.mfu, rel=1e-9)
    assert row.memory_total_bytes == pytest.approx(r.memory_bytes_per_device["total"], rel=1e-9)
    assert bool(row.fits) == r.fits


@pytest.mark.parametrize("overlap", ["standard", "all"])
def test_a_gather_longer_than_the_compute_stays_exposed(overlap):
    """ZeRO-3 over 256 devices on 25 GB/s Ethernet: each layer's weight gather takes longer
    than the layer's compute, so whatever the overlap, the step sees at least the
    difference and the plan is communication-bound."""
    r = snlab.train("llama3-70b", "pcie-ethernet-a100", tp=1, pp=1, dp=256, zero=3, micro_batch=1,
                    global_batch=512, seq_len=2048, recompute="full", overlap=overlap)
    t = r.time_s
    assert t["zero"] > 2 * t["compute"]
    assert t["exposed"]["zero"] >= (t["zero"] - t["compute"]) * (1 - 1e-9)
    assert r.limited_by == "communication"


def test_zero3_pays_a_latency_per_layer_call():
    """ZeRO-3 issues two gathers and one reduce-scatter per layer and micro-batch, each
    paying the ring's fill on the real group: with tiny layers the per-step ZeRO time
    is about calls x per-call latency, far above one whole-model call."""
    from snlab import network
    from snlab.hardware import hardware
    hw = hardware(snlab.system("dgx-h100"))
    r = snlab.train("llama3.2-1b", "dgx-h100", tp=1, pp=1, dp=512, zero=3, micro_batch=1, global_batch=512,
                    seq_len=256, overlap="none")
    layers = snlab.model("llama3.2-1b").layers
    one_call = float(network.reduce_scatter(1.0, 512, 1.0, hw))       # latency of one call on the group
    assert r.time_s["zero"] >= 3 * layers * one_call * (1 - 1e-9)


# --- more capacity, a larger domain: never worse ---------------------------------------

def _capacity(system, field):
    from snlab.hardware import hardware
    return float(getattr(hardware(_system(system)), field))


@settings(**SETTINGS)
@given(case=plans(), factor=st.floats(1.0, 8.0),
       field=st.sampled_from(["hbm_capacity", "host_capacity", "pool_capacity"]))
def test_more_memory_never_stops_a_plan_fitting_nor_slows_it(case, factor, field):
    """More HBM, host memory or pool never makes a plan stop fitting or run slower (the
    pool is what the devices outside the job lend: the job's own HBM does not shrink it)."""
    model, system, plan = case
    x = _capacity(system, field)
    assume(x > 0)
    small = snlab.train(model, system, **plan, **{field: x})
    large = snlab.train(model, system, **plan, **{field: min(x * factor, 1e16)})
    assert large.fits or not small.fits
    assert _le(large.step_time_s, small.step_time_s)


@settings(**SETTINGS)
@given(case=plans(), factor=st.sampled_from([1.25, 1.5, 2, 3, 4, 8, 16, 48]))
def test_a_larger_scale_up_domain_never_slows_a_step(case, factor):
    """A larger domain never forces a slower collective or expert exchange: a group may
    still sit on the placements a smaller domain gives it (snlab.network.placements) and
    a point-to-point message may still take the NIC."""
    model, system, plan = case
    d = _capacity(system, "scale_up_domain_size")
    small = snlab.train(model, system, **plan, scale_up_domain_size=d)
    large = snlab.train(model, system, **plan, scale_up_domain_size=round(d * factor))
    assert _le(large.step_time_s, small.step_time_s)
    assert large.fits or not small.fits
