"""The instructor's guide (notebooks/README.md) says what the lessons compute.

Each "predict, then check" answer in the guide is recomputed here with the calls its
lesson makes; a model change that moves an answer fails this test until the guide says
the new one. The guide must also cover every lesson, in order.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import snlab
from snlab import charts, claims, compare, lessons, validation, widgets

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8")
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
CLUSTER, SUPERNODE = widgets.CLUSTER, widgets.SUPERNODE


def section(number: str) -> str:
    """The guide's text for lesson ``number`` ("00" ... "09")."""
    match = re.search(rf"^### {number} .*?(?=^### |^## |\Z)", GUIDE, flags=re.S | re.M)
    assert match, f"no section for lesson {number}"
    return " ".join(match.group(0).split())          # line breaks as spaces


def answer_in(number: str) -> str:
    match = re.search(r"\*\*Answer:\s*(.+?)\*\*", section(number), flags=re.S)
    assert match, f"lesson {number}: no **Answer: ...**"
    return match.group(1).strip()


def _plans() -> dict:
    """Each plan of the guide: its stated total [min] and its rows' (lesson, minutes)."""
    plans = {}
    for match in re.finditer(r"^### (.+?) \((\d+) h (\d+)\)\n(.*?)(?=^### |^## )", GUIDE, flags=re.S | re.M):
        rows = re.findall(r"^\| (\d\d)? ?\| .+? \| (\d+) min \|", match.group(4), flags=re.M)
        plans[match.group(1)] = (60 * int(match.group(2)) + int(match.group(3)), rows)
    return plans


def test_the_guide_covers_every_lesson_in_order():
    numbers = [p.name[:2] for p in LESSONS]
    full = _plans()["The full day"][1]
    assert [n for n, _ in full if n] == numbers
    assert all(5 <= int(m) <= 60 for _, m in full)
    for n in numbers:
        assert "Predict, then check" in section(n)


def test_every_plan_adds_up():
    plans = _plans()
    assert {"The full day", "A half day", "Two hours"} <= set(plans)
    times = {n: int(m) for n, m in plans["The full day"][1] if n}
    for name, (total, rows) in plans.items():
        assert sum(int(m) for _, m in rows) == total, name
        for n, m in rows:                       # a lesson takes the same time in every plan
            assert not n or int(m) == times[n], (name, n)


def test_the_guide_has_a_hand_out_troubleshooting_and_an_exercise_per_lesson():
    assert "## The participants' hand-out" in GUIDE and "Shut Down All Kernels" in GUIDE
    for topic in ("Windows without make", "Python below 3.11", "A slow Binder", "Many kernels open"):
        assert topic in GUIDE, topic
    for n in (p.name[:2] for p in LESSONS):
        text = section(n)
        assert "**Open exercise.**" in text and "**Its answer:**" in text, n


def _asks(number: str, key: str):
    """The guide quotes lesson ``number``'s question (:func:`snlab.lessons.question`) word
    for word and gives its answer, the first **Answer: ...** after the question: a model
    change that moves the answer moves both."""
    q = lessons.question(key)
    text = section(number)
    at = text.find(q.question)
    assert at >= 0, f"lesson {number}: the guide does not quote the question of {key}"
    match = re.search(r"\*\*Answer:\s*(.+?)\*\*", text[at:], flags=re.S)
    assert match, f"lesson {number}: no **Answer: ...** after the question of {key}"
    assert match.group(1).strip() == q.answer, f"lesson {number}: {key}"
    return q


def test_00_supernode_mfu_for_the_1t_model():
    q = _asks("00", "supernode-mfu")
    best = compare.best_plans(["megatron-1t"], [CLUSTER, SUPERNODE], devices=384, global_batch=768)
    mfu = best.set_index("system")["mfu"]
    assert f"MFU {mfu[SUPERNODE]:.0%} against {mfu[CLUSTER]:.0%}, {q.value:.2f} times" in section("00")
    assert f"between {q.low:.2f} and {q.high:.2f}" in section("00")
    # "a sixth ... and a fifth more to recomputing ...; the supernode loses under a tenth"
    rows = best.set_index("system")
    lost = (rows.exposed_comm_s + rows.time_bubble_s + rows.time_contention_s) / rows.step_time_s
    recomputing = rows.time_recompute_s / rows.step_time_s
    assert 1 / 7 < lost[CLUSTER] < 1 / 5 and 1 / 6 < recomputing[CLUSTER] < 1 / 4 and lost[SUPERNODE] < 0.1
    assert "a sixth" in section("00") and "a fifth more to recomputing" in section("00")


def test_01_throttling_slows_the_step_less_than_the_clock():
    q = _asks("01", "throttled-step")
    df = snlab.sweep("llama3-70b", "dgx-h100", tp=8, pp=4, dp=8, micro_batch=1, global_batch=512,
                     sustained_clock=[0.8, 1.0])
    slowdown = df["step_time_s"].iloc[0] / df["step_time_s"].iloc[1] - 1
    assert slowdown == pytest.approx(q.value, rel=1e-9)
    assert f"({slowdown:.0%})" in section("01")


def test_02_zero_1_is_the_lowest_stage_that_fits():
    _asks("02", "zero-stage-that-fits")
    fits = {z: snlab.train("llama3-70b", "dgx-h100", tp=8, dp=32, micro_batch=1, global_batch=256,
                        zero=z).memory_bytes_per_device
            for z in (0, 1)}
    assert f"{fits[1]['total'] / 1e9:.0f} GB of the {fits[1]['usable'] / 1e9:.0f} GB usable" in section("02")
    assert f"against {fits[0]['total'] / 1e9:.0f} GB at ZeRO 0" in section("02")


def test_03_small_all_reduce_four_devices_and_the_torus():
    q = _asks("03", "small-all-reduce")
    us = charts.collective_frame([CLUSTER, SUPERNODE], "all-reduce", 16, sizes=[64e3, 105e6], levels=False
                                 ).pivot(index="message_bytes", columns="system", values="time_us")
    small, big = us.loc[64e3], us.loc[105e6]
    assert small[SUPERNODE] == pytest.approx(q.value, rel=1e-9)
    assert f"({small[SUPERNODE]:.0f} µs on the supernode, {small[CLUSTER]:.0f} µs on the cluster" in section("03")
    assert f"between {q.low:.0f} and {q.high:.0f} µs on the supernode" in section("03")
    assert f"only {small[CLUSTER] / small[SUPERNODE]:.1f} times faster here" in section("03")
    assert f"{big[CLUSTER] / 1e3:.1f} ms on the cluster, {big[SUPERNODE] / 1e3:.2f} ms on the supernode" in section("03")
    q = _asks("03", "four-device-all-reduce")
    four = snlab.network.collective_frame(list(lessons.WIRINGS), "all-reduce", [4], 256e6).set_index("system")
    ms = four["time_s"] * 1e3
    assert (f"({ms['dgx-b200']:.2f} ms against {ms['tpu-v5p-pod']:.2f} ms on the torus and "
            f"{ms['mi300x-platform']:.2f} ms on the mesh: {q.value:.1f} times, between {q.low:.1f} and "
            f"{q.high:.1f}") in section("03")
    q = _asks("03", "torus-axes")
    assert f"({q.value:.2f} times" in section("03")


def test_04_small_model_mfu():
    q = _asks("04", "small-model-mfu")
    best = compare.best_plans(["llama3.2-1b"], [CLUSTER, SUPERNODE], devices=384, global_batch=768)
    mfu = best.set_index("system")["mfu"]
    assert f"(MFU {mfu[SUPERNODE]:.0%} against {mfu[CLUSTER]:.0%}, {q.value:.2f} times" in section("04")
    assert f"between {q.low:.2f} and {q.high:.2f}" in section("04")
    assert f"a {q.value - 1:.0%} lead" in section("04")


def test_05_micro_batch_1_on_the_supernode():
    q = _asks("05", "quarter-micro-batch")
    assert f"({q.value:.2f} times the supernode's best step)" in section("05")


def test_06_million_token_decode():
    q = _asks("06", "million-token-decode")
    long = snlab.serve_sweep("llama3-70b", ["dgx-h100", "cloudmatrix384"], tp=8, batch=8, prompt_len=1048576,
                             output_len=1000).set_index("system")
    speedup = (long.loc["cloudmatrix384", "decode_tokens_per_s_per_device"]
               / long.loc["dgx-h100", "decode_tokens_per_s_per_device"])
    assert speedup == pytest.approx(q.value, rel=1e-9)
    assert f"({speedup:.1f} times; with both systems' decode error bands, between {q.low:.1f} and " \
           f"{q.high:.1f})" in section("06")


def test_07_what_the_bus_is_worth_for_a_small_model():
    q = _asks("07", "bus-worth-small-model")
    fabric = compare.with_scale_up_of(CLUSTER, SUPERNODE)
    scale = compare.job_table(["llama3.2-1b", "megatron-1t"], [CLUSTER, fabric], devices=384, global_batch=768,
                              tokens=1e12)
    worth = scale.pivot(index="model", columns="system", values="tokens_per_device_s")
    worth = worth[fabric.name] / worth[CLUSTER] - 1
    assert worth["llama3.2-1b"] == pytest.approx(q.value, rel=1e-9)
    assert f"({worth['llama3.2-1b']:.0%} for 1B, {worth['megatron-1t']:.0%} for 1T)" in section("07")


def test_08_deep_pipeline_error():
    _asks("08", "deep-pipeline")
    table = validation.training_table().set_index("id")
    big, small = table.loc["narayanan2021-table1-529.6b"], table.loc["narayanan2021-table1-39.1b"]
    assert f"({big.error:+.1%} against {small.error:+.1%})" in section("08")


def test_09_air_cooling_costs_a_liquid_built_supernode_more_than_a_fifth():
    q = _asks("09", "air-cooled-supernode")
    numbers = claims.c15().numbers
    lost = numbers["throughput lost under air, cloudmatrix384"]
    assert lost == pytest.approx(q.value, rel=1e-9)
    assert f"({lost:.0%}: its racks would draw {numbers['rack power at full clock, cloudmatrix384 [kW]']:.0f} kW" \
        in section("09")
    assert f"the clock falls to {numbers['sustained clock under air, cloudmatrix384']:.2f}" in section("09")


def test_10_the_least_energy_per_token_and_the_cost_ratio():
    q = _asks("10", "least-energy-per-token")
    systems = list(widgets.POWER_SYSTEMS)
    served = {s: snlab.serve_best("llama3-8b", s, tp=1, **widgets.POWER_WORKLOAD) for s in systems}
    joules = {s: r.energy_per_token_j for s, r in served.items()}
    least = min(joules, key=joules.get)
    assert q.answer.startswith(least)
    assert f"({joules[least]:.2g} J against {joules[CLUSTER]:.2g} J on the PCIe cluster" in section("10")
    assert f"{q.value:.1f} times less than the next; within the power model's 25% tolerance on each, between " \
           f"{q.low:.1f} and {q.high:.1f} times" in section("10")
    q = _asks("10", "cluster-cost-ratio")
    cost = {s: snlab.serve_best("llama3-70b", s, tp=widgets.power_tp("llama3-70b", s), prices="example-purchase",
                                **widgets.POWER_WORKLOAD).cost_per_million_tokens_usd for s in (CLUSTER, SUPERNODE)}
    assert cost[CLUSTER] / cost[SUPERNODE] == pytest.approx(q.value, rel=1e-9)
    assert f"({q.value:.1f} times at the dated example purchase prices, ${cost[CLUSTER]:.3g} against " \
           f"${cost[SUPERNODE]:.3g}" in section("10")
    assert f"between {q.low:.1f} and {q.high:.1f} times" in section("10")


@pytest.mark.parametrize("number", ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"])
def test_every_lesson_has_an_answer(number):
    assert answer_in(number)


def test_11_the_queue_the_kv_transfer_and_c13_with_a_queue():
    from snlab.serving import load_sweep
    q = _asks("11", "queue-ttft")
    load = load_sweep("llama3-70b", ["dgx-h100"], [1, 2, 4, 6, 8, 10, 12, 16], modes=("colocated",),
                      lengths="azure-conv-2023", requests=600, tp=8, ttft_target=1.0, tpot_target=0.05)
    cluster = load.set_index("rate_rps")
    over = cluster[cluster.ttft_p90_s > 1.0].index.min()
    below = cluster.index[cluster.index < over].max()
    assert below < q.value <= over
    assert f"(between {below} and {over}, at about {q.value:.0f}; with times to first token a quarter longer, the " \
           f"tolerance of published runs under load, at about {q.low:.0f})" in section("11")
    q = _asks("11", "kv-transfer-ratio")
    assert f"({q.value:.1f} times" in section("11") and f"between {q.low:.1f} and {q.high:.1f})" in section("11")
    q = _asks("11", "queue-pool-gain")
    c13 = claims.c13().numbers["pool vs host memory with a request queue"]
    assert c13 == pytest.approx(q.value, rel=1e-9)
    assert f"({c13:.2f} times; with the decode error band on both, between {q.low:.2f} and {q.high:.2f})" \
        in section("11")


def test_12_the_fabric_one_would_build():
    from snlab import codesign
    q = _asks("12", "codesign-domain-alone")
    assert f"(almost nothing)** ({q.value - 1:.0%})" in section("12")
    q = _asks("12", "codesign-best-gain")
    parts = codesign.alone(codesign.designs("megatron-1t"))
    assert (f"({q.value:.2f} times; each alone: domain {parts['scale_up_domain_size']:.2f}, bandwidth "
            f"{parts['scale_up_bandwidth']:.2f}, HBM {parts['hbm_capacity']:.2f})") in section("12")
    q = _asks("12", "codesign-small-model")
    assert f"larger premium** ({q.value - 1:.0%})" in section("12")
    gain = codesign.scale_table(["llama3-70b", "megatron-1t"]).set_index("model")["gain"]
    assert f"({gain['llama3-70b'] - 1:.0%} at 70B, {gain['megatron-1t'] - 1:.0%} at 1T)" in section("12")
    seventy = codesign.alone(codesign.designs("llama3-70b"))
    alone = seventy.drop("all three")
    assert alone.idxmax() == "scale_up_bandwidth" and seventy["all three"] > alone.prod()
    assert (f"bandwidth alone ({alone['scale_up_bandwidth']:.2f} against {alone['scale_up_domain_size']:.2f} for "
            f"the domain and {alone['hbm_capacity']:.2f} for HBM); the best design's {seventy['all three']:.2f} is "
            f"more than their product, {alone.prod():.2f}") in section("12")
