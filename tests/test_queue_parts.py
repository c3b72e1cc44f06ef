"""Each part of serving under load pinned by hand: the instance's service times
(snlab/serving/service.py), the engine's step loop (snlab/serving/queueing.py) and the
disaggregated pools with their KV transfers (snlab/serving/disaggregation.py). The loop
runs on a toy instance whose step times are written out here, so every step of a run
is computed by hand below; the service times are checked against the serving step model
they come from. tests/mutate.py runs these against every mutant of those modules."""

import dataclasses
import math

import numpy as np
import pytest

import snlab
from snlab.errors import SnlabError
from snlab.serving import queueing, service
from snlab.serving.disaggregation import kv_link, run_disaggregated, transfer_times
from snlab.serving.service import Service, instance
from snlab.serving.workload import Requests


def D(b, c):
    """The toy's decode step [s]: 10 ms + 1 ms per sequence + 1 us per token of mean context."""
    return 0.010 + 0.001 * b + 1e-6 * c


def P(t, a):
    """The toy's prefill pass [s]: 20 ms + 0.1 ms per token + 0.1 us per key-query (t tokens attending to a keys)."""
    return 0.020 + 1e-4 * t + 1e-7 * t * a


def toy(**changes) -> Service:
    """An instance whose tables hold D and P at their corners (both are bilinear, so the
    interpolation is exact)."""
    base = dict(model="toy", system="dgx-h100", deployment={}, devices=1, dp=1, kv_tokens=1e6, max_sequences=64.0,
                step_tokens=1000.0, block=1.0, tokens_per_step=1.0, decode_tokens=1.0, kv_bytes_per_token=100.0,
                batch_axis=(1.0, 64.0), context_axis=(0.0, 1e4),
                decode_table=((D(1, 0), D(1, 1e4)), (D(64, 0), D(64, 1e4))),
                token_axis=(1.0, 2001.0), attention_axis=(0.5, 1000.5),
                prefill_table=((P(1, 0.5), P(1, 1000.5)), (P(2001, 0.5), P(2001, 1000.5))),
                one_token_pass_s=P(1, 0.5), cache_read_s_per_token=0.0, cache_read_fixed_s=0.0,
                fastest_decode_s=D(1, 0), hbm_tokens=1e6)
    base.update(changes)
    return Service(**base)


def reqs(arrivals, prompts, outputs) -> Requests:
    return Requests(np.asarray(arrivals, float), np.asarray(prompts, float), np.asarray(outputs, float))


# --- service.py ----------------------------------------------------------------------------

def test_bilinear_is_exact_on_bilinear_tables_and_holds_at_the_edges():
    xs, ys = (1.0, 3.0, 7.0), (0.0, 10.0, 30.0)
    table = tuple(tuple(2 * x + 3 * y + x * y for y in ys) for x in xs)
    for x, y in ((2.0, 4.0), (5.0, 2.5), (1.0, 0.0), (7.0, 10.0), (3.0, 7.5), (6.0, 20.0), (1.5, 29.0)):
        assert service._bilinear(xs, ys, table, x, y) == pytest.approx(2 * x + 3 * y + x * y, rel=1e-12)
    assert service._bilinear(xs, ys, table, 100.0, 50.0) == pytest.approx(table[2][2])
    assert service._bilinear(xs, ys, table, 0.0, -5.0) == pytest.approx(table[0][0])
    # a table that is not linear in x is interpolated within the cell that holds x
    square = tuple(tuple(x * x for _ in ys) for x in xs)
    assert service._bilinear(xs, ys, square, 2.0, 5.0) == pytest.approx(5.0)
    assert service._bilinear(xs, ys, square, 5.0, 25.0) == pytest.approx(29.0)


def test_axis_counts_one_by_one_then_grows_geometrically():
    assert list(service._axis(5.0, 8, 4)) == [1.0, 2.0, 3.0, 4.0, 5.0]
    a = service._axis(1000.0, 4, 3)
    assert list(a[:4]) == [1.0, 2.0, 3.0, 4.0] and a[-1] == pytest.approx(1000.0)
    assert len(a) == 6 and a[4] == pytest.approx(math.sqrt(4 * 1000))
    assert list(service._axis(3.0, 4, 5, start=2.0)) == [2.0, 3.0]


def test_step_times_of_the_toy():
    s = toy(dp=2)
    assert s.decode_time(8, 500) == pytest.approx(D(4, 500))            # per replica: 8 sequences over 2
    assert s.prefill_time(200, 200 * 60) == pytest.approx(P(100, 60))   # 100 tokens a replica, 60 keys each
    assert s.prefill_time(2, 0.0) == pytest.approx(P(1, 0.5))           # at least half a key
    s = toy()
    assert s.step_time(3, 400, 0, 0) == pytest.approx(D(3, 400))
    assert s.step_time(0, 0, 300, 300 * 150) == pytest.approx(P(300, 150))
    assert s.step_time(3, 400, 300, 300 * 150) == pytest.approx(D(3, 400) + P(300, 150) - P(1, 0.5))
    # a chunk cheaper than a one-token pass adds nothing
    cheap = toy(one_token_pass_s=1.0)
    assert cheap.step_time(3, 400, 300, 300 * 150) == pytest.approx(D(3, 400))
    assert toy(block=16.0).reserve(33) == 48 and toy(block=16.0).reserve(32) == 32


OPT = dict(weight_dtype="fp16", kv_dtype="fp16")


def test_instance_takes_the_serving_step_model_unchanged():
    s = instance("opt-13b", "dgx-a100", max_context=2048, **OPT)
    for b, c in ((1, 1.0), (4, 900.0), (37, 1500.0), (300, 2048.0)):
        want = snlab.serve("opt-13b", "dgx-a100", batch=b, prompt_len=1, output_len=10, context=int(c),
                           kv_offload="hbm", **OPT).decode_step_s
        exact = b in s.batch_axis and c in s.context_axis
        assert s.decode_time(b, c) == pytest.approx(want, rel=1e-9 if exact else 0.02), (b, c)
    for L in (1, 17, 800, 1800):
        want = snlab.serve("opt-13b", "dgx-a100", batch=1, prompt_len=L, output_len=10, **OPT).ttft_s
        assert s.prefill_time(L, L * L / 2) == pytest.approx(want, rel=0.02), L
    assert s.one_token_pass_s == pytest.approx(snlab.serve("opt-13b", "dgx-a100", prompt_len=1, output_len=1,
                                                           **OPT).ttft_s, rel=1e-9)
    assert s.fastest_decode_s == s.decode_table[0][0]


def test_instance_grids_follow_their_rule():
    s = instance("opt-13b", "dgx-a100", max_context=2048, **OPT)
    assert s.batch_axis[:256] == tuple(float(i) for i in range(1, 257))
    # the KV cache binds here (one-block sequences), below the engine's 2,048 in flight
    assert s.batch_axis[-1] == pytest.approx(s.kv_tokens / s.block) and len(s.batch_axis) == 256 + 47
    assert 1900 < s.batch_axis[-1] < service.MAX_IN_FLIGHT
    capped = instance("opt-13b", "dgx-a100", max_context=2048, max_sequences=1000, **OPT)
    assert capped.batch_axis[-1] == pytest.approx(1000.0) and len(capped.batch_axis) == 256 + 47
    assert s.context_axis[0] == 1.0 and s.context_axis[-1] == pytest.approx(2048.0) and len(s.context_axis) == 14
    assert s.token_axis[:16] == tuple(float(i) for i in range(1, 17)) and s.token_axis[-1] == pytest.approx(8192.0)
    assert len(s.token_axis) == 16 + 39 and len(s.attention_axis) == 14
    long = instance("opt-13b", "dgx-a100", max_context=20000, max_step_tokens=2048, **OPT)
    assert long.token_axis[-1] == pytest.approx(20000.0)
    assert s.attention_axis[0] == 0.5 and s.attention_axis[-1] == pytest.approx(2048.0)
    assert len(instance("opt-13b", "dgx-a100", max_context=2048, max_sequences=8, **OPT).batch_axis) == 8


def test_instance_limits_and_kv_capacity_by_hand():
    s = instance("opt-13b", "dgx-a100", max_context=2048, tp=2, kv_block_tokens=16, kv_fraction=0.5,
                 max_sequences=100, max_step_tokens=4096, draft_tokens=1, acceptance=0.5, **OPT)
    hw = snlab.hardware.hardware(snlab.system("dgx-a100"))
    weights = snlab.serve("opt-13b", "dgx-a100", tp=2, prompt_len=1, output_len=1, **OPT).weights_bytes_per_device
    per_token = 2 * 40 * 5120 * 2 / 2                       # K and V, 40 layers, 5,120 wide, fp16, over 2 devices
    free = hw.hbm_capacity - hw.memory_reserve - 4.55 * 2**30 - weights   # the engine's own 4.55 GiB
    blocks = math.floor(0.5 * free / (16 * per_token))
    assert s.kv_tokens == s.hbm_tokens == blocks * 16
    assert s.devices == 2 and s.dp == 1 and s.block == 16 and s.max_sequences == 100 and s.step_tokens == 4096
    assert s.tokens_per_step == pytest.approx(1.5) and s.decode_tokens == 2
    assert s.kv_bytes_per_token == 2 * 40 * 5120 * 2
    assert s.deployment["kv_offload"] == "hbm"
    default = instance("opt-13b", "dgx-a100", max_context=2048, dp=2, **OPT)
    assert default.max_sequences == 2 * service.MAX_IN_FLIGHT and default.step_tokens == 2 * service.STEP_TOKENS
    assert default.devices == 2 and default.dp == 2


def test_replicas_share_the_batch_and_the_prompt_tokens():
    s = instance("llama3-8b", "dgx-h100", max_context=4096, dp=2)
    for b, c in ((2, 1000.0), (16, 3000.0)):
        want = snlab.serve("llama3-8b", "dgx-h100", dp=2, batch=b, prompt_len=10, output_len=10, context=int(c),
                           kv_offload="hbm").decode_step_s
        assert s.decode_time(b, c) == pytest.approx(want, rel=0.02)
    want = snlab.serve("llama3-8b", "dgx-h100", dp=2, batch=2, prompt_len=1000, output_len=10).ttft_s
    assert s.prefill_time(2000, 2000 * 500) == pytest.approx(want, rel=0.02)
    assert s.step_tokens == 2 * service.STEP_TOKENS


def test_small_limits_and_short_requests_keep_two_points_per_axis():
    s = instance("llama3-8b", "dgx-h100", max_context=1, max_sequences=1, max_step_tokens=1)
    assert s.max_sequences == 1 and s.step_tokens == 1
    assert s.batch_axis == (1.0, 2.0) and s.context_axis[-1] == pytest.approx(2.0)
    assert s.token_axis == (1.0, 2.0) and s.attention_axis[-1] == pytest.approx(2.0)
    few = instance("llama3-8b", "dgx-h100", max_context=100, kv_fraction=0.001, kv_block_tokens=64)
    blocks = few.kv_tokens / 64
    assert few.batch_axis[-1] == pytest.approx(blocks) and blocks < service.MAX_IN_FLIGHT
    two = instance("llama3-8b", "dgx-h100", max_context=100, kv_fraction=0.001, kv_block_tokens=64, dp=2)
    assert two.batch_axis[-1] == pytest.approx(two.kv_tokens / 2 / 64)


def test_the_pool_and_its_lenders_by_hand():
    s = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=8, kv_offload="auto")
    hw = snlab.hardware.hardware(snlab.system("cloudmatrix384"))
    per_device = 2 * 80 * 8 * 128 * 2 / 8
    pool = hw.free_pool(8) / 8
    assert s.pool_tokens == math.floor(pool / per_device)
    lendable = 0.9 * hw.hbm_capacity
    peak = s.hbm_tokens + 1e6
    assert s.lender_devices(peak) == math.ceil(1e6 * per_device * 8 / lendable)
    assert s.lender_devices(s.hbm_tokens - 1) == 0
    assert s.lender_devices(s.hbm_tokens + 10 * s.pool_tokens) == math.ceil(s.pool_tokens * per_device * 8 / lendable)
    assert instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=8).lender_devices(peak) == 0
    two = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=4, dp=2, kv_offload="auto")
    assert two.pool_tokens == 2 * math.floor(hw.free_pool(8) / 8 / (2 * per_device))
    assert two.lender_devices(two.hbm_tokens + 2e6) == math.ceil(1e6 * 2 * per_device * 8 / lendable)


def test_far_tiers_by_hand():
    s = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=4, pp=2, dp=2, kv_offload="auto",
                 kv_block_tokens=64)
    near = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=4, pp=2, dp=2, kv_block_tokens=64)
    hw = snlab.hardware.hardware(snlab.system("cloudmatrix384"))
    per_device = 2 * 80 * 8 * 128 * 2 / 8                  # over tp 4 x pp 2
    far = hw.free_pool(16) / 16 + hw.host_capacity + hw.storage_capacity
    far_tokens = math.floor(far / per_device / 64) * 64
    assert s.kv_tokens == pytest.approx(near.kv_tokens + 2 * far_tokens)
    assert s.hbm_tokens == near.kv_tokens == near.hbm_tokens
    weights = snlab.serve("llama3-70b", "cloudmatrix384", tp=4, pp=2, dp=2, batch=2, prompt_len=1,
                          output_len=1).weights_bytes_per_device
    free = hw.hbm_capacity - hw.memory_reserve - 4.55 * 2**30 - weights   # the engine's own 4.55 GiB
    blocks = math.floor(0.95 * free / (64 * per_device))
    assert near.kv_tokens == 2 * 64 * blocks


def test_far_tiers_add_to_the_kv_cache_only_when_allowed():
    hbm = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=8)
    auto = instance("llama3-70b", "cloudmatrix384", max_context=10000, tp=8, kv_offload="auto")
    assert auto.hbm_tokens == hbm.kv_tokens and auto.kv_tokens > 10 * hbm.kv_tokens


def test_cache_reads_from_a_tier_by_hand():
    hw = snlab.hardware.hardware(snlab.system("dgx-h100"))
    s = instance("llama3-70b", "dgx-h100", max_context=4096, tp=8, cache_tier="host")
    per_device = 2 * 80 * 8 * 128 * 2 / 8
    assert s.cache_read_s_per_token == pytest.approx(per_device / hw.host_bandwidth, rel=1e-12)
    assert s.cache_read_fixed_s == pytest.approx(80 * hw.host_latency, rel=1e-12)
    s = instance("llama3-70b", "dgx-h100", max_context=4096, tp=8, pp=2, cache_tier="ssd")
    assert s.cache_read_s_per_token == pytest.approx(per_device / 2 / hw.storage_bandwidth, rel=1e-12)
    assert s.cache_read_fixed_s == pytest.approx(40 * hw.storage_latency, rel=1e-12)
    near = instance("llama3-70b", "dgx-h100", max_context=4096, tp=8)
    assert near.cache_read_s_per_token == 0 and near.cache_read_fixed_s == 0
    with pytest.raises(SnlabError, match="cache_tier"):
        instance("llama3-70b", "dgx-h100", max_context=4096, tp=8, cache_tier="pool")
    with pytest.raises(SnlabError, match="batch"):
        instance("llama3-70b", "dgx-h100", max_context=4096, tp=8, batch=4)


# --- queueing.py: the step loop, by hand ---------------------------------------------------

def test_one_request_prefills_then_decodes():
    run = queueing.run_instance(toy(), reqs([0.0], [100], [3]), "chunked")
    t1 = P(100, 50)
    t2 = t1 + D(1, 101)
    t3 = t2 + D(1, 102)
    assert run.first[0] == pytest.approx(t1) and run.last[0] == pytest.approx(t3)
    assert run.admitted[0] == 0.0 and run.end == pytest.approx(t3)
    assert list(run.gaps) == pytest.approx([D(1, 101), D(1, 102)]) and list(run.batches) == [1, 1]
    assert run.peak_kv_tokens == 103 and np.isnan(run.transfer_start[0])


def test_a_prompt_rides_with_the_decodes_in_a_chunked_step():
    run = queueing.run_instance(toy(), reqs([0.0, 0.031], [100, 200], [3, 2]), "chunked")
    t1 = P(100, 50)
    t2 = t1 + D(1, 101)
    t3 = t2 + D(1, 102) + P(200, 100) - P(1, 0.5)
    t4 = t3 + D(1, 201)
    assert run.first[0] == pytest.approx(t1) and run.last[0] == pytest.approx(t3)
    assert run.admitted[1] == pytest.approx(t2)
    assert run.first[1] == pytest.approx(t3) and run.last[1] == pytest.approx(t4)
    assert run.peak_kv_tokens == 103 + 202


def test_a_chunk_is_cut_to_the_budget_and_the_rest_follows():
    run = queueing.run_instance(toy(step_tokens=60.0), reqs([0.0], [100], [2]), "chunked")
    t1 = P(60, 30)                       # 60 tokens attending to 30 keys each
    t2 = t1 + P(40, 60 + 20)             # the other 40 attend to the first 60 and half of themselves
    assert run.first[0] == pytest.approx(t2) and run.last[0] == pytest.approx(t2 + D(1, 101))


def test_whole_prompts_wait_for_room_in_a_mixed_step():
    # the decodes leave 1000 - 1 tokens: a prompt of 999 fits beside them, one of 1000 waits for them to end
    fits = queueing.run_instance(toy(), reqs([0.0, 0.0301], [10, 999], [3, 2]), "mixed")
    t1 = P(10, 5)
    # the second arrives during the first decode step and rides the next one
    assert fits.first[1] == pytest.approx(t1 + D(1, 11) + D(1, 12) + P(999, 499.5) - P(1, 0.5))
    waits = queueing.run_instance(toy(), reqs([0.0, 0.0301], [10, 1000], [3, 2]), "mixed")
    t3 = t1 + D(1, 11) + D(1, 12)
    assert waits.first[1] == pytest.approx(t3 + P(1000, 500))
    # alone in a step of the full budget a prompt larger than the budget still runs
    big = queueing.run_instance(toy(), reqs([0.0], [1500], [1]), "mixed")
    assert big.first[0] == pytest.approx(P(1500, 750)) and big.last[0] == big.first[0]


def test_prefill_first_stalls_the_decodes():
    run = queueing.run_instance(toy(), reqs([0.0, 0.031], [100, 200], [3, 2]), "prefill-first")
    t1 = P(100, 50)
    t2 = t1 + D(1, 101)
    t3 = t2 + P(200, 100)                            # decodes wait while the prompt is prefilled
    t4 = t3 + D(2, (101 + 200 + 2) / 2)              # both decode; each finishes here
    assert run.first[1] == pytest.approx(t3)
    assert run.last[0] == pytest.approx(t4) and run.last[1] == pytest.approx(t4)
    assert list(run.gaps) == pytest.approx([D(1, 101), t4 - t2]) and list(run.batches) == [1, 2]


def test_prefill_first_batches_waiting_prompts_within_the_budget():
    run = queueing.run_instance(toy(step_tokens=500.0), reqs([0, 0, 0], [200, 250, 100], [1, 1, 1]), "prefill-first")
    t1 = P(450, (200 * 100 + 250 * 125) / 450)       # the first two fit in 500 tokens, the third waits
    assert run.first[0] == pytest.approx(t1) and run.first[1] == pytest.approx(t1)
    assert run.first[2] == pytest.approx(t1 + P(100, 50)) and run.last[2] == run.first[2]


def test_admission_waits_for_kv_room_and_for_a_free_slot():
    r = reqs([0.0, 0.0], [100, 100], [3, 3])
    one = queueing.run_instance(toy(kv_tokens=150.0), r, "chunked")
    alone = queueing.run_instance(toy(), reqs([0.0], [100], [3]), "chunked").last[0]
    assert one.admitted[1] == pytest.approx(alone) and one.first[1] == pytest.approx(alone + P(100, 50))
    slots = queueing.run_instance(toy(max_sequences=1.0), r, "chunked")
    assert slots.admitted[1] == pytest.approx(alone)
    both = queueing.run_instance(toy(kv_tokens=206.0), r, "chunked")
    assert both.admitted[1] == 0.0 and both.first[1] == pytest.approx(P(200, 50 * 100 / 100 * 1))
    with pytest.raises(SnlabError, match="more KV cache than the instance holds"):
        queueing.run_instance(toy(kv_tokens=50.0), reqs([0.0], [100], [3]), "chunked")


def test_idle_time_is_skipped_and_blocks_round_up():
    run = queueing.run_instance(toy(block=16.0), reqs([5.0], [100], [3]), "chunked")
    assert run.admitted[0] == 5.0 and run.first[0] == pytest.approx(5.0 + P(100, 50))
    assert run.peak_kv_tokens == 112


def test_speculative_steps_emit_several_tokens():
    s = toy(tokens_per_step=2.0, decode_tokens=2.0)
    run = queueing.run_instance(s, reqs([0.0], [100], [6]), "chunked")
    t1 = P(100, 50)
    # five tokens after the first: three steps of two (the last one partly used), contexts 101, 103, 105
    assert run.last[0] == pytest.approx(t1 + D(1, 101) + D(1, 103) + D(1, 105))


def test_decodes_use_their_budget_before_prompts():
    s = toy(step_tokens=3.0, decode_tokens=2.0, tokens_per_step=1.5)
    run = queueing.run_instance(s, reqs([0.0, 0.0205], [1, 2], [3, 1]), "chunked")
    t1 = P(1, 0.5)
    # the first request verifies two tokens a step, leaving one token of the budget: the second prompt's first
    # token rides with it (adding nothing over a one-token pass), its second waits for a step of its own
    t2 = t1 + D(1, 2)
    t3 = t2 + D(1, 3.5) + P(1, 0.5) - P(1, 0.5)
    assert run.first[1] == pytest.approx(t3 + P(1, 1.5))
    assert run.last[0] == pytest.approx(t3)


def test_cached_prefixes_skip_their_prefill_and_pay_their_read():
    s = toy(cache_read_s_per_token=1e-5, cache_read_fixed_s=0.002)
    run = queueing.run_instance(s, reqs([0.0], [100], [2]), "chunked", cached=np.asarray([60.0]))
    t1 = P(40, 60 + 20) + 60 * 1e-5 + 0.002
    assert run.first[0] == pytest.approx(t1) and run.last[0] == pytest.approx(t1 + D(1, 101))
    # at most all but one prompt token comes from the cache
    full = queueing.run_instance(s, reqs([0.0], [100], [1]), "chunked", cached=np.asarray([100.0]))
    assert full.first[0] == pytest.approx(P(1, 99.5) + 99 * 1e-5 + 0.002)


def test_a_closed_loop_sends_the_next_request_when_one_ends():
    run = queueing.run_instance(toy(), reqs([0, 0, 0], [100, 100, 100], [2, 2, 2]), "chunked", closed=1)
    one = P(100, 50) + D(1, 101)
    assert list(run.arrival) == pytest.approx([0.0, one, 2 * one])
    assert list(run.last) == pytest.approx([one, 2 * one, 3 * one])


def test_a_decode_instance_takes_each_kv_cache_over_its_link_in_turn():
    r = reqs([0.0, 0.0], [100, 100], [3, 2])
    run = queueing.run_instance(toy(), r, "decode-only", first_token=np.asarray([0.1, 0.1]),
                                transfer_s=np.asarray([0.005, 0.004]))
    assert list(run.transfer_start) == pytest.approx([0.1, 0.105]) and list(run.transfer_end) == pytest.approx(
        [0.105, 0.109])
    t1 = 0.105 + D(1, 101)                 # the first lands and decodes alone; the second lands meanwhile
    t2 = t1 + D(2, (102 + 101) / 2)
    assert list(run.first) == [0.1, 0.1]
    assert run.last[1] == pytest.approx(t2) and run.last[0] == pytest.approx(t2)
    assert run.admitted[0] == 0.1 and run.admitted[1] == 0.1


def test_unknown_policy_and_runs_that_never_drain():
    with pytest.raises(SnlabError, match="policy"):
        queueing.run_instance(toy(), reqs([0.0], [10], [2]), "fifo")
    old = queueing.MAX_STEPS
    queueing.MAX_STEPS = 3
    try:
        with pytest.raises(SnlabError, match="did not drain"):
            queueing.run_instance(toy(), reqs([0.0], [10], [20]), "chunked")
    finally:
        queueing.MAX_STEPS = old


# --- disaggregation.py -----------------------------------------------------------------------

def test_the_link_is_the_domain_when_the_unit_fits_in_it():
    hw = snlab.hardware.hardware(snlab.system("dgx-h100"))
    inside = kv_link("dgx-h100", 2, 4)
    assert inside.level == "scale-up" and inside.links == 2
    assert inside.bandwidth == hw.scale_up_bandwidth and inside.efficiency == hw.scale_up_efficiency
    assert inside.latency == pytest.approx(hw.scale_up_latency + hw.scale_up_call_latency)
    assert inside.effective_bandwidth == pytest.approx(2 * hw.scale_up_bandwidth * hw.scale_up_efficiency)
    assert kv_link("dgx-h100", 4, 4).level == "scale-up"
    assert kv_link("dgx-h100", 4, 4, unit_devices=12).level == "scale-out"
    out = kv_link("dgx-h100", 8, 4)
    assert out.level == "scale-out" and out.links == 4 and out.bandwidth == hw.scale_out_bandwidth
    assert out.latency == pytest.approx(hw.scale_out_latency + hw.scale_out_call_latency)
    assert kv_link("dgx-h100", 2, 2, "scale-out").level == "scale-out"
    assert kv_link("cloudmatrix384", 16, 16, unit_devices=384).level == "scale-up"
    with pytest.raises(SnlabError, match="kv_link_level"):
        kv_link("dgx-h100", 2, 2, "nvlink")


def test_transfers_split_over_the_device_pairs():
    hw = snlab.hardware.hardware(snlab.system("cloudmatrix384"))
    link = kv_link("cloudmatrix384", 8, 8)
    t = transfer_times("cloudmatrix384", link, np.asarray([8e9, 16e9]))
    one = hw.scale_up_call_latency + hw.scale_up_latency + 1e9 / (hw.scale_up_efficiency * hw.scale_up_bandwidth)
    two = hw.scale_up_call_latency + hw.scale_up_latency + 2e9 / (hw.scale_up_efficiency * hw.scale_up_bandwidth)
    assert list(t) == pytest.approx([one, two], rel=1e-12)


def test_pools_deal_requests_in_turn():
    link = kv_link("dgx-h100", 1, 1)
    r = reqs([0.0, 0.0, 0.0], [100, 100, 100], [2, 2, 2])
    out = run_disaggregated(toy(), toy(), r, 2, 1, link)
    # two prefill instances take requests 0 and 2 (prefilled together), and 1, in turn
    pair, one = P(200, 50), P(100, 50)
    assert list(out.run.first) == pytest.approx([pair, one, pair])
    assert list(out.kv_bytes) == [100 * 100.0] * 3
    x = float(transfer_times("dgx-h100", link, np.asarray([1e4]))[0])
    assert list(out.transfer_s) == pytest.approx([x] * 3)
    # the decode instance takes request 1's KV cache first, decodes it a step, then takes the other two in turn
    later = one + x + D(1, 101)
    assert list(out.run.transfer_start) == pytest.approx([later, one, later + x])
    assert len(out.prefill_runs) == 2 and len(out.decode_runs) == 1 and out.link is link
    assert out.run.end == pytest.approx(max(r.end for r in out.decode_runs + out.prefill_runs))
    two = run_disaggregated(toy(), toy(), r, 1, 2, link)
    three = P(300, 50)
    assert list(two.run.transfer_start) == pytest.approx([three, three, three + x])
    assert two.run.peak_kv_tokens == 204
    cached = run_disaggregated(toy(), toy(), r, 1, 1, link, cached=np.asarray([50.0, 50.0, 50.0]))
    assert list(cached.run.first) == pytest.approx([P(150, 75)] * 3)


def test_admission_counts_prompt_and_output_and_frees_them_at_the_end():
    r = reqs([0.0, 0.0], [100, 100], [3, 3])
    tight = queueing.run_instance(toy(kv_tokens=205.0), r, "chunked")      # 103 + 103 > 205: the second waits
    assert tight.admitted[1] > 0
    # the first ends and frees its 103 tokens: the third fits beside the second only if all of them were freed
    three = reqs([0.0, 0.0, 0.0], [100, 97, 100], [3, 6, 3])
    run = queueing.run_instance(toy(kv_tokens=206.0), three, "chunked")
    assert run.admitted[2] == pytest.approx(run.last[0]) and run.admitted[2] < run.last[1]
    slots = queueing.run_instance(toy(max_sequences=1.0), reqs([0, 0, 0], [100, 100, 100], [2, 2, 2]), "chunked")
    assert slots.admitted[1] == pytest.approx(slots.last[0]) and slots.admitted[2] == pytest.approx(slots.last[1])


def test_a_chunk_takes_several_prompts_up_to_the_budget():
    run = queueing.run_instance(toy(step_tokens=150.0), reqs([0.0, 0.0], [100, 100], [1, 1]), "chunked")
    t1 = P(150, (100 * 50 + 50 * 25) / 150)         # all of the first and half of the second
    t2 = t1 + P(50, 50 + 25)
    assert run.first[0] == pytest.approx(t1) and run.first[1] == pytest.approx(t2)


def test_a_whole_prompt_after_a_one_token_prompt_waits_for_the_next_step():
    run = queueing.run_instance(toy(step_tokens=100.0), reqs([0.0, 0.0], [1, 150], [1, 1]), "prefill-first")
    assert run.first[0] == pytest.approx(P(1, 0.5)) and run.first[1] == pytest.approx(P(1, 0.5) + P(150, 75))


def test_a_one_token_cached_prefix_is_read_too():
    s = toy(cache_read_s_per_token=1e-3, cache_read_fixed_s=0.0)
    run = queueing.run_instance(s, reqs([0.0], [10], [1]), "chunked", cached=np.asarray([1.0]))
    assert run.first[0] == pytest.approx(P(9, 1 + 4.5) + 1e-3)


def test_speculative_contexts_of_sequences_that_join_later():
    s = toy(tokens_per_step=2.0, decode_tokens=2.0)
    run = queueing.run_instance(s, reqs([0.0, 0.031], [100, 100], [7, 3]), "chunked")
    t1 = P(100, 50)
    t2 = t1 + D(1, 101)
    # the second prompt rides the next step; then both decode, the second from context 101 at the first's 105
    t3 = t2 + D(1, 103) + P(100, 50) - P(1, 0.5)
    t4 = t3 + D(2, (105 + 101) / 2)
    assert run.first[1] == pytest.approx(t3) and run.last[1] == pytest.approx(t4)
    assert run.last[0] == pytest.approx(t4)


def test_a_prefill_first_instance_idles_until_the_next_request():
    run = queueing.run_instance(toy(), reqs([0.0, 1.0], [100, 100], [2, 2]), "prefill-first")
    assert run.first[1] == pytest.approx(1.0 + P(100, 50)) and run.end == pytest.approx(1.0 + P(100, 50) + D(1, 101))


def test_an_instance_whose_weights_leave_no_room_names_its_plan():
    from snlab.serving.service import instance
    # 16 GB of Llama 3 8B beside an engine keeping 70 GB of an H100's 85.9 GB, or more than all of it
    with pytest.raises(SnlabError, match=r"^tp: weights need 16.1 GB per device at tp=1, pp=1, ep=1; "
                                         r"h100-sxm-80gb has 14.4 GB after"):
        instance("llama3-8b", "dgx-h100", max_context=2048, engine_memory_bytes=70e9)
    with pytest.raises(SnlabError, match=r"h100-sxm-80gb has 0 B after"):
        instance("llama3-8b", "dgx-h100", max_context=2048, engine_memory_bytes=90e9)
    assert instance("llama3-8b", "dgx-h100", max_context=2048, engine_memory_bytes=60e9).kv_tokens > 0
