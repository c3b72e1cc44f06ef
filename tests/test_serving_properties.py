"""Invariants of the serving model, checked with hypothesis over whole grids."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from snlab.serving import serve_sweep
from snlab.walls import serving as sv

CASES = st.sampled_from([
    ("llama3-8b", "dgx-h100", dict(tp=1)),
    ("llama3-70b", "dgx-h100", dict(tp=8)),
    ("llama3-70b", "cloudmatrix384", dict(tp=4, pp=2)),
    ("llama3-70b", "gb200-nvl72", dict(tp=8, dp=2)),
    ("deepseek-v3", "cloudmatrix384", dict(dp=32, ep=32, weight_dtype="int8")),
    ("deepseek-v3", "dgx-h100", dict(dp=32, ep=32, weight_dtype="fp8", microbatches=2)),
])
lengths = st.sampled_from([(512, 128), (4096, 256), (32_000, 1000)])
drafts = st.sampled_from([(0, 0.7), (1, 0.7), (3, 0.5)])


def _sweep(case, prompt_output, draft, **axes):
    model, system, dep = case
    p, o = prompt_output
    k, a = draft
    return serve_sweep(model, system, prompt_len=p, output_len=o, draft_tokens=k, acceptance=a, **{**dep, **axes})


@settings(max_examples=40, deadline=None)
@given(case=CASES, po=lengths, draft=drafts, per=st.integers(1, 64), factor=st.floats(1.0, 4.0))
def test_more_hbm_bandwidth_never_slows_decode_or_prefill(case, po, draft, per, factor):
    dp = case[2].get("dp", 1)
    bw = 3.0e12
    df = _sweep(case, po, draft, batch=per * dp, hbm_bandwidth=[bw, bw * factor])
    assert df.tpot_s.iloc[1] <= df.tpot_s.iloc[0] * (1 + 1e-12)
    assert df.ttft_s.iloc[1] <= df.ttft_s.iloc[0] * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(case=CASES, po=lengths, draft=drafts)
def test_bigger_batch_never_lowers_throughput_while_the_kv_cache_is_in_hbm(case, po, draft):
    dp = case[2].get("dp", 1)
    df = _sweep(case, po, draft, batch=[dp * b for b in (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512)])
    df = df[df.valid & df.fits & (df.kv_location == "hbm")]
    rate = df.decode_tokens_per_s_per_device.to_numpy()
    assert np.all(np.diff(rate) >= -1e-9 * rate[:-1])
    assert np.all(np.diff(df.tpot_s.to_numpy()) >= -1e-12)      # and latency never improves with batch


@settings(max_examples=30, deadline=None)
@given(case=CASES, po=lengths, draft=drafts, per=st.integers(1, 64), factor=st.floats(1.0, 8.0),
       field=st.sampled_from(["scale_up_bandwidth", "scale_out_bandwidth", "peak_flops"]))
def test_faster_links_or_compute_never_slow_anything(case, po, draft, per, factor, field):
    from snlab import system as load_system
    from snlab.hardware import hardware
    base = getattr(hardware(load_system(case[1])), field)
    dp = case[2].get("dp", 1)
    df = _sweep(case, po, draft, batch=per * dp, **{field: [base, base * factor]})
    for col in ("tpot_s", "ttft_s"):
        assert df[col].iloc[1] <= df[col].iloc[0] * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 32), ctx=st.sampled_from([128_000, 500_000, 1_000_000, 4_000_000]),
       system=st.sampled_from(["dgx-h100", "cloudmatrix384", "gb200-nvl72"]), factor=st.floats(1.0, 10.0))
def test_kv_tiers_add_up_and_a_faster_far_tier_never_hurts(batch, ctx, system, factor):
    df = serve_sweep("llama3-70b", system, tp=8, batch=batch, prompt_len=ctx, output_len=1, context=ctx,
                     host_bandwidth=[50e9, 50e9 * factor], pool_bandwidth=[200e9, 200e9 * factor])
    tiers = df[["kv_hbm_bytes_per_device", "kv_pool_bytes_per_device", "kv_host_bytes_per_device",
                "kv_ssd_bytes_per_device"]].sum(axis=1)
    fits = df.fits.to_numpy()
    assert np.allclose(tiers[fits], df.kv_cache_bytes_per_device[fits], rtol=1e-12)
    slow, fast = df.iloc[0], df.iloc[3]                       # both bandwidths low vs both high
    assert fast.tpot_s <= slow.tpot_s * (1 + 1e-12)
    # a step never beats reading its weights (roofline lower bound)
    assert (df.decode_step_s >= df.time_weights_s * (1 - 1e-12)).all()


@settings(max_examples=100, deadline=None)
@given(k=st.integers(0, 8), a=st.floats(0.0, 0.999), da=st.floats(0.0, 0.5))
def test_speculative_tokens_between_one_and_k_plus_one_and_rising_with_acceptance(k, a, da):
    lo = sv.speculative_tokens_per_step(draft_tokens=k, acceptance_rate=a)
    hi = sv.speculative_tokens_per_step(draft_tokens=k, acceptance_rate=min(a + da, 0.999))
    assert 1 - 1e-12 <= lo <= k + 1 + 1e-12 and hi >= lo - 1e-12


@settings(max_examples=40, deadline=None)
@given(case=CASES, po=st.sampled_from([(4096, 256), (131_072, 1000), (1_000_000, 1000)]),
       per=st.integers(1, 64), factor=st.floats(1.0, 4.0))
def test_more_hbm_never_slows_serving_nor_stops_it_fitting(case, po, per, factor):
    """The KV cache spilling less (more HBM) never makes decode or prefill slower: far
    bytes are staged into HBM and read from there like the rest."""
    from snlab import system as load_system
    from snlab.hardware import hardware
    base = hardware(load_system(case[1])).hbm_capacity
    dp = case[2].get("dp", 1)
    df = _sweep(case, po, (0, 0.7), batch=per * dp, hbm_capacity=[base, base * factor])
    small, large = df.iloc[0], df.iloc[1]
    assert large.fits or not small.fits
    if small.fits:
        for col in ("tpot_s", "ttft_s"):
            assert large[col] <= small[col] * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(case=CASES, po=lengths, per=st.integers(1, 64), factor=st.sampled_from([2, 4, 8, 48]))
def test_a_larger_scale_up_domain_never_slows_serving(case, po, per, factor):
    from snlab import system as load_system
    from snlab.hardware import hardware
    base = hardware(load_system(case[1])).scale_up_domain_size
    dp = case[2].get("dp", 1)
    df = _sweep(case, po, (0, 0.7), batch=per * dp, scale_up_domain_size=[base, base * factor])
    small, large = df.iloc[0], df.iloc[1]
    assert large.fits or not small.fits
    for col in ("tpot_s", "ttft_s"):
        assert large[col] <= small[col] * (1 + 1e-12)
