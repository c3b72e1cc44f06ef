"""Invariants of the walls, checked with hypothesis."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from snlab.walls import communication as cm
from snlab.walls import memory as mw

size = st.floats(min_value=1.0, max_value=1e11)
bandwidth = st.floats(min_value=1e8, max_value=1e13)
latency = st.floats(min_value=0.0, max_value=1e-3)
eff = st.floats(min_value=0.05, max_value=1.0)
group = st.integers(min_value=2, max_value=4096)
factor = st.floats(min_value=1.0, max_value=100.0)

SINGLE_LEVEL = [cm.point_to_point_time, cm.ring_all_reduce_time, cm.tree_all_reduce_time,
                cm.reduce_scatter_time, cm.all_gather_time, cm.all_to_all_time]
TWO_LEVEL = [cm.hierarchical_all_reduce_time, cm.hierarchical_reduce_scatter_time,
             cm.hierarchical_all_to_all_time]


@settings(max_examples=200, deadline=None)
@given(S=size, n=group, a=latency, beta=bandwidth, e=eff, k=factor)
def test_more_bandwidth_is_never_slower_one_level(S, n, a, beta, e, k):
    for f in SINGLE_LEVEL:
        kw = dict(message_bytes=S, group_size=n, latency=a, link_efficiency=e, call_latency=a)
        kw = {key: v for key, v in kw.items() if key in f.arg_names}
        assert f(link_bandwidth=beta * k, **kw) <= f(link_bandwidth=beta, **kw)


@settings(max_examples=200, deadline=None)
@given(S=size, n1=st.integers(1, 384), n2=st.integers(1, 64), a1=latency, a2=latency,
       b1=bandwidth, b2=bandwidth, e1=eff, e2=eff, k=factor, which=st.sampled_from(["inner", "outer"]))
def test_more_bandwidth_is_never_slower_two_levels(S, n1, n2, a1, a2, b1, b2, e1, e2, k, which):
    kw = dict(call_latency=a1, message_bytes=S, inner_size=n1, outer_size=n2, inner_latency=a1, outer_latency=a2,
              inner_bandwidth=b1, outer_bandwidth=b2, inner_efficiency=e1, outer_efficiency=e2)
    faster = dict(kw, **{f"{which}_bandwidth": kw[f"{which}_bandwidth"] * k})
    for f in TWO_LEVEL:
        assert f(**faster) <= f(**kw) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(S=size, n=group, a=latency, beta=bandwidth, e=eff)
def test_more_latency_is_never_faster(S, n, a, beta, e):
    kw = dict(message_bytes=S, group_size=n, link_bandwidth=beta, link_efficiency=e, call_latency=0.0)
    assert cm.ring_all_reduce_time(latency=a * 2 + 1e-9, **kw) > cm.ring_all_reduce_time(latency=a, **kw)


@settings(max_examples=200, deadline=None)
@given(S=size, n1=st.integers(1, 64), a=latency, beta=bandwidth, e=eff)
def test_one_domain_hierarchy_is_a_ring(S, n1, a, beta, e):
    """With a single domain the two-level all-reduce is the ring all-reduce."""
    two = cm.hierarchical_all_reduce_time(call_latency=a, message_bytes=S, inner_size=n1, outer_size=1,
                                          inner_latency=a, outer_latency=1.0, inner_bandwidth=beta,
                                          outer_bandwidth=1.0, inner_efficiency=e, outer_efficiency=1.0)
    ring = cm.ring_all_reduce_time(call_latency=a, message_bytes=S, group_size=n1, latency=a, link_bandwidth=beta,
                                   link_efficiency=e)
    assert np.isclose(two, ring, rtol=1e-9, atol=0)


@settings(max_examples=200, deadline=None)
@given(c=st.floats(0, 10), m=st.floats(0, 10), eps=st.floats(0, 1), kappa=st.floats(0, 1))
def test_overlap_lies_between_max_and_sum(c, m, eps, kappa):
    t = cm.overlapped_time(compute_time=c, comm_time=m, overlap=eps, overlap_contention=kappa)
    assert max(c, m) - 1e-12 <= t <= c + m + 1e-12
    # contention only takes back part of what overlap hides
    assert t <= cm.overlapped_time(compute_time=c, comm_time=m, overlap=eps * 0.5, overlap_contention=kappa) + 1e-12
    assert t >= cm.overlapped_time(compute_time=c, comm_time=m, overlap=eps, overlap_contention=kappa * 0.5) - 1e-12


@settings(max_examples=200, deadline=None)
@given(P=st.floats(1e6, 1e12), z=st.integers(0, 3), d=st.integers(1, 4096),
       qg=st.sampled_from([2, 4]), qo=st.sampled_from([0, 4, 12]))
def test_memory_parts_add_up_and_zero_never_grows(P, z, d, qg, qo):
    kw = dict(params_per_device=P, weight_bytes=2, grad_bytes=qg, optimizer_bytes=qo, zero_shards=d)
    parts = sum(f(zero_stage=z, **{k: v for k, v in kw.items() if k in f.arg_names})
                for f in (mw.weight_memory, mw.grad_memory, mw.optimizer_memory))
    total = mw.model_state_memory(zero_stage=z, **kw)
    assert np.isclose(parts, total, rtol=1e-12)
    if z < 3:
        assert mw.model_state_memory(zero_stage=z + 1, **kw) <= total * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(s=st.integers(128, 32768), b=st.integers(1, 16), a=st.sampled_from([8, 32, 64, 128]),
       t=st.sampled_from([1, 2, 4, 8]), sp_=st.integers(0, 1), dropout=st.integers(0, 1))
def test_recomputation_never_stores_more(s, b, a, t, sp_, dropout):
    h = a * 128
    kw = dict(seq_len=s, micro_batch=b, hidden_size=h, heads=a, tp=t, kv_heads=a, head_dim=128,
              ffn_activation_width=4 * h, mlp_matrices=2, sequence_parallel=sp_, activation_bytes=2,
              query_width=h, attention_output_width=h, latent_width=0, routed_copies=0, router_width=0, logit_bytes=4)
    none, sel, full = (mw.activation_memory_per_layer(recompute=r, dropout=dropout, **kw) for r in (0, 1, 2))
    assert full <= sel <= none
    # dropout only adds masks (and the scores' dropout output), never takes a byte away;
    # full recomputation keeps the layer input alone, with or without them
    with_masks = mw.activation_memory_per_layer(recompute=0, dropout=1, **kw)
    without = mw.activation_memory_per_layer(recompute=0, dropout=0, **kw)
    assert without < with_masks
    assert mw.activation_memory_per_layer(recompute=2, dropout=1, **kw) == \
        mw.activation_memory_per_layer(recompute=2, dropout=0, **kw)
