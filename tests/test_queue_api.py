"""Serving under load through the API: colocated and disaggregated runs on every shipped
system, one-line errors for bad workloads, the KV transfer priced on each system's
links, capacity planning, and the latency-against-load chart (headless)."""

import json

import numpy as np
import pytest

import snlab
from snlab import charts
from snlab.errors import SnlabError
from snlab.presets.loader import names
from snlab.serving.disaggregation import kv_link, transfer_times
from snlab.serving.load import load_sweep, serve_load

SMALL = dict(lengths="sharegpt-distserve", requests=200, ttft_target=2.0, tpot_target=0.2)


@pytest.mark.parametrize("system", names("system"))
def test_every_shipped_system_reports_percentiles_and_goodput(system):
    """Llama 3 8B on every system, colocated and disaggregated (one prefill and one
    decode instance): every percentile present, ordered and finite, goodput at most the
    offered rate, and strict JSON."""
    for extra in ({}, {"prefill": {}, "decode": {}}):
        r = serve_load("llama3-8b", system, rate=2.0, **SMALL, **extra)
        for name in ("ttft_s", "tpot_s", "itl_s", "queue_s", "e2e_s"):
            s = getattr(r, name)
            assert 0 <= s["p50"] <= s["p90"] <= s["p99"] and np.isfinite(s["mean"]), (system, name)
        assert 0 < r.ttft_s["p50"] and 0 < r.tpot_s["p50"]
        assert 0 <= r.goodput_rps <= min(r.offered_rps, r.throughput_rps) * 1.0001 and 0 <= r.attainment <= 1
        assert json.loads(r.to_json())["mode"] == ("disaggregated" if extra else "colocated")
        assert ("KV transfer" in str(r)) == bool(extra)


def test_bad_workloads_name_the_field():
    cases = [(dict(rate=0, prompt_len=10, output_len=10), "rate"),
             (dict(rate=-1, prompt_len=10, output_len=10), "rate"),
             (dict(rate=1, prompt_len=-5, output_len=10), "prompt_len"),
             (dict(rate=1, prompt_len=10, output_len=0), "output_len"),
             (dict(rate=1, prompt_len=10.5, output_len=10), "prompt_len"),
             (dict(rate=1, lengths="nope"), "lengths"),
             (dict(concurrency=0, prompt_len=10, output_len=10), "concurrency"),
             (dict(rate=1, prompt_len=10, output_len=10, cache_hit_rate=1.5), "cache_hit_rate"),
             (dict(rate=1, prompt_len=10, output_len=10, warmup=1.0), "warmup"),
             (dict(rate=1, prompt_len=10, output_len=10, tpot_target=1e-4), "tpot_target"),
             (dict(rate=1, prompt_len=10, output_len=10, ttft_target=1e-5), "ttft_target"),
             (dict(rate=1, prompt_len=10, output_len=10, ttft_target=-1), "ttft_target"),
             (dict(rate=1, prompt_len=10, output_len=10, policy="fifo"), "policy"),
             (dict(rate=1, prompt_len=10, output_len=10, instances=0), "instances"),
             (dict(rate=1, prompt_len=10, output_len=10, batch=4), "batch"),
             (dict(rate=1, prompt_len=10, output_len=10, cache_tier="pool", cache_hit_rate=0.5), "cache_tier"),
             (dict(rate=1, prompt_len=10, output_len=10, cache_tier="hbm"), "cache_tier")]   # nothing reads it
    for kw, field in cases:
        with pytest.raises(SnlabError) as err:
            serve_load("llama3-8b", "dgx-h100", **kw)
        assert err.value.field == field, (kw, err.value)
        assert "\n" not in str(err.value)


def test_a_target_below_one_step_says_what_one_step_takes():
    with pytest.raises(SnlabError, match="below one decode step of a single sequence"):
        serve_load("llama3-70b", "dgx-h100", tp=8, rate=1, prompt_len=100, output_len=10, tpot_target=0.001)


def test_kv_transfer_differs_by_the_ratio_of_the_links():
    """A disaggregated Llama 3 70B (two TP8 instances) on CloudMatrix384 moves each
    request's KV cache over the bus, on a DGX H100 cluster over RDMA (the two instances
    fill two servers): the transfer times differ by the ratio of the links' effective
    bandwidths, within the per-message latencies."""
    kw = dict(rate=1.0, prompt_len=32768, output_len=64, requests=50, prefill=dict(tp=8), decode=dict(tp=8))
    cm = serve_load("llama3-70b", "cloudmatrix384", **kw).kv_transfer
    dgx = serve_load("llama3-70b", "dgx-h100", **kw).kv_transfer
    assert cm["level"] == "scale-up" and dgx["level"] == "scale-out"
    links = cm["effective_bandwidth_bytes_per_s"] / dgx["effective_bandwidth_bytes_per_s"]
    assert links == pytest.approx(8 * 392e9 * 0.67 / (8 * 50e9 * 0.91))
    assert dgx["mean_s"] / cm["mean_s"] == pytest.approx(links, rel=0.02)
    assert cm["mean_bytes"] == dgx["mean_bytes"] == 32768 * 327680


def test_transfer_time_is_latency_plus_bytes_over_the_links():
    link = kv_link("dgx-h100", 8, 8, "scale-out")
    t = transfer_times("dgx-h100", link, np.asarray([8e9]))
    hw = snlab.hardware.hardware(snlab.system("dgx-h100"))
    expected = hw.scale_out_call_latency + hw.scale_out_latency + 1e9 / (hw.scale_out_efficiency * hw.scale_out_bandwidth)
    assert float(t[0]) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(SnlabError, match="kv_link_level"):
        kv_link("dgx-h100", 8, 8, "scale-up")


def test_decode_memory_holds_the_transfers_in_flight():
    """The decode pool reserves a request's KV cache when its transfer starts: with a
    slow link more is held at once than with a fast one."""
    kw = dict(rate=4.0, prompt_len=8000, output_len=20, requests=150, prefill=dict(tp=8), decode=dict(tp=8))
    slow = serve_load("llama3-70b", "dgx-h100", kv_link_level="scale-out", **kw)
    fast = serve_load("llama3-70b", "cloudmatrix384", **kw)
    assert slow.kv_transfer["mean_s"] > 3 * fast.kv_transfer["mean_s"]
    assert slow.peak_kv_tokens >= fast.peak_kv_tokens


def test_prefix_cache_hits_save_prefill_and_cost_a_read_from_their_tier():
    base = dict(rate=0.5, prompt_len=32000, output_len=10, requests=60, tp=8)
    miss = serve_load("llama3-70b", "cloudmatrix384", **base)
    pool = serve_load("llama3-70b", "cloudmatrix384", **base, cache_hit_rate=0.9, cache_tier="pool")
    hbm = serve_load("llama3-70b", "cloudmatrix384", **base, cache_hit_rate=0.9, cache_tier="hbm")
    host = serve_load("llama3-70b", "dgx-h100", **base, cache_hit_rate=0.9, cache_tier="host")
    near = serve_load("llama3-70b", "dgx-h100", **base, cache_hit_rate=0.9, cache_tier="hbm")
    assert hbm.ttft_s["p50"] < pool.ttft_s["p50"] < miss.ttft_s["p50"]
    # 0.9 x 32,000 tokens x 320 KiB over 8 devices: 1.18 GB a device, over PCIe (63 GB/s) or the bus (392 GB/s)
    per_device = 0.9 * 32000 * 327680 / 8
    assert host.ttft_s["p50"] - near.ttft_s["p50"] == pytest.approx(per_device / 63e9, rel=0.05)
    assert pool.ttft_s["p50"] - hbm.ttft_s["p50"] == pytest.approx(per_device / 392e9, rel=0.05)


def test_capacity_plans_meet_the_rate():
    plan = snlab.serve_capacity("llama3-8b", "dgx-h100", rate=20, ttft_target=0.5, tpot_target=0.05,
                                lengths="sharegpt-distserve")
    for p in (plan.colocated, plan.disaggregated):
        assert p is not None and p.check.attainment >= 0.9
        assert p.devices == p.check.devices and p.devices >= 1
    assert plan.best.devices == min(plan.colocated.devices, plan.disaggregated.devices)
    assert "devices" in str(plan)
    json.dumps(plan.to_dict(), allow_nan=False)


def test_more_load_means_more_latency_and_the_chart_shows_it():
    frame = load_sweep("llama3-70b", ["dgx-h100", "cloudmatrix384"], [1.0, 6.0, 14.0], tp=8, requests=200,
                       lengths="azure-conv-2023", prefill=dict(tp=8), decode=dict(tp=8),
                       ttft_target=1.0, tpot_target=0.05)
    for (_, _), part in frame.groupby(["system", "mode"]):
        assert part["ttft_p90_s"].is_monotonic_increasing and part["tpot_p90_s"].iloc[-1] >= part["tpot_p90_s"].iloc[0]
    spec = charts.latency_load(frame).to_dict()
    panels = spec["vconcat"][0]["hconcat"]
    assert [p["encoding"]["y"]["field"] for p in panels] == ["ttft_ms", "tpot_ms"]
    assert all("[ms]" in p["encoding"]["y"]["title"] for p in panels)
    bars = spec["vconcat"][1]
    kv = {row["system"]: row["kv_transfer_ms"] for row in bars["data"]["values"]}
    assert kv["dgx-h100"] > 4 * kv["cloudmatrix384"]
    with pytest.raises(SnlabError, match="percentile"):
        charts.latency_load(frame, percentile="p75")


def test_c13_with_a_request_queue():
    """With a queue the engine admits every long context its memory holds; the pool
    holds them as host memory does, the lenders count, and the gain is no longer
    several-fold. A pool as slow as the host's link leaves nothing of it."""
    v = snlab.claims.c13()
    n = v.numbers
    assert 1.0 < n["pool vs host memory with a request queue"] < 2.0
    assert n["devices lending HBM with a queue"] >= 1
    queue = v.decisions[2]
    assert not queue.passes and not queue.within_uncertainty and v.verdict == snlab.claims.CONDITIONAL
    slow = snlab.claims.c13(system=snlab.system("cloudmatrix384").replace(pool_bandwidth=80e9))
    assert slow.numbers["pool vs host memory with a request queue"] < 1.0


def test_an_overloaded_engine_serves_no_more_within_targets_than_it_completes():
    # 1,000 requests/s at an engine that completes about 22: the requests it serves within the
    # targets are a share of those it completes, not of those that arrive
    r = serve_load("llama3-8b", "dgx-h100", rate=1000, prompt_len=1024, output_len=256, requests=1000,
                   ttft_target=5.0, tpot_target=0.2)
    assert r.throughput_rps < 0.1 * r.offered_rps and 0 < r.attainment < 1
    assert r.goodput_rps == pytest.approx(r.throughput_rps * r.attainment)


def test_a_plan_whose_weights_do_not_fit_names_its_tensor_parallel_degree():
    # Llama 3 70B in BF16 on one H100: the weights, not the workload or the targets, are at fault
    for kw in ({}, {"tpot_target": 0.05}):
        with pytest.raises(SnlabError, match=r"^tp: weights need 141 GB per device at tp=1"):
            serve_load("llama3-70b", "dgx-h100", rate=5, prompt_len=1024, output_len=256, **kw)
    # a pool's own plan is named as that pool's
    with pytest.raises(SnlabError, match=r"^decode_tp: weights need"):
        serve_load("llama3-70b", "dgx-h100", rate=5, prompt_len=1024, output_len=256, tp=8, prefill={},
                   decode={"tp": 1})
    with pytest.raises(SnlabError, match=r"^prefill_tp: broken rule: tp=3"):
        serve_load("llama3-70b", "dgx-h100", rate=5, prompt_len=1024, output_len=256, tp=8, prefill={"tp": 3},
                   decode={})
    # a shared field stays the shared one's
    with pytest.raises(SnlabError, match=r"^tp: broken rule: tp=3"):
        serve_load("llama3-70b", "dgx-h100", rate=5, prompt_len=1024, output_len=256, tp=3, prefill={}, decode={})


@pytest.mark.parametrize("kw, message", [
    (dict(rate=1, outputs=[1] * 999), r"^prompts: missing beside outputs"),
    (dict(rate=1, prompts=[10] * 999, outputs=[5] * 999), r"^prompts: got 999 values for 1,000 requests"),
    (dict(rate=1, prompts=[0] * 1000, outputs=[5] * 1000), r"^prompts: got 0\.0 at position 0 "),
    (dict(rate=1, prompts=[10] * 1000, outputs=[5] * 999 + [5.5]), r"^outputs: got 5\.5 at position 999 "),
    (dict(rate=1, prompts=["a"] * 1000, outputs=[5] * 1000), r"^prompts: not a list of numbers"),
    (dict(arrival="trace", times_s=[1, -5, 2], prompt_len=10, output_len=10), r"^times_s: got -5\.0 at position 1 "),
    (dict(arrival="trace", prompt_len=10, output_len=10), r"^times_s: missing"),
])
def test_a_bad_per_request_list_says_which_value_is_wrong(kw, message):
    with pytest.raises(SnlabError, match=message):
        serve_load("llama3-8b", "dgx-h100", **kw)
