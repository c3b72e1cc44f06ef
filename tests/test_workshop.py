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


def _options_answer(value, cuts, options):
    for cut, option in zip(cuts, options):
        if value < cut:
            return option
    return options[-1]


def _asks(number: str, key: str):
    """The guide quotes lesson ``number``'s question (:func:`snlab.lessons.question`) word
    for word and gives its answer: a model change that moves the answer moves both."""
    q = lessons.question(key)
    assert q.question in section(number), f"lesson {number}: the guide does not quote the question"
    assert answer_in(number) == q.answer
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


def test_03_small_all_reduce():
    small = charts.collective_frame([CLUSTER, SUPERNODE], "all-reduce", 16, sizes=[64e3],
                                    levels=False).set_index("system")["time_us"]
    assert answer_in("03").startswith(small.idxmin())
    assert f"cluster {small[CLUSTER]:.0f} µs, supernode {small[SUPERNODE]:.0f} µs" in section("03")


def test_04_small_model_mfu():
    best = compare.best_plans(["llama3.2-1b"], [CLUSTER, SUPERNODE], devices=384, global_batch=768)
    mfu = best.set_index("system")["mfu"]
    winner = "the cluster" if mfu[CLUSTER] >= mfu[SUPERNODE] else "the supernode"
    assert answer_in("04").startswith(winner)
    low, high = sorted([mfu[CLUSTER], mfu[SUPERNODE]])
    assert f"({high:.0%} against {low:.0%})" in section("04")


def test_05_micro_batch_1_on_the_supernode():
    q = _asks("05", "quarter-micro-batch")
    assert f"({q.value:.2f} times the supernode's best step)" in section("05")


def test_06_million_token_decode():
    long = snlab.serve_sweep("llama3-70b", ["dgx-h100", "cloudmatrix384"], tp=8, batch=8, prompt_len=1048576,
                             output_len=1000).set_index("system")
    speedup = (long.loc["cloudmatrix384", "decode_tokens_per_s_per_device"]
               / long.loc["dgx-h100", "decode_tokens_per_s_per_device"])
    expected = _options_answer(speedup, (2, 4), ["about the same", "2 to 4 times", "more than 4 times"])
    assert answer_in("06") == expected
    assert f"(about {speedup:.0f} times)" in section("06")


def test_07_what_the_bus_is_worth_for_a_small_model():
    fabric = compare.with_scale_up_of(CLUSTER, SUPERNODE)
    scale = compare.job_table(["llama3.2-1b", "megatron-1t"], [CLUSTER, fabric], devices=384, global_batch=768,
                              tokens=1e12)
    worth = scale.pivot(index="model", columns="system", values="tokens_per_device_s")
    worth = worth[fabric.name] / worth[CLUSTER] - 1
    expected = "almost nothing (under 10%)" if worth["llama3.2-1b"] < 0.10 else "10% or more"
    assert answer_in("07") == expected
    assert f"({worth['llama3.2-1b']:.0%} for 1B, {worth['megatron-1t']:.0%} for 1T)" in section("07")


def test_08_deep_pipeline_error():
    _asks("08", "deep-pipeline")
    table = validation.training_table().set_index("id")
    big, small = table.loc["narayanan2021-table1-529.6b"], table.loc["narayanan2021-table1-39.1b"]
    assert f"({big.error:+.1%} against {small.error:+.1%})" in section("08")


def test_09_air_cooling_costs_a_liquid_built_supernode_more_than_a_fifth():
    numbers = claims.c15().numbers
    lost = numbers["throughput lost under air, cloudmatrix384"]
    answer = "less than 15%" if lost < 0.15 else "about 20%" if lost <= 0.25 else "more than 25%"
    assert answer_in("09") == answer
    assert f"({lost:.0%}: its racks would draw {numbers['rack power at full clock, cloudmatrix384 [kW]']:.0f} kW" \
        in section("09")
    assert f"the clock falls to {numbers['sustained clock under air, cloudmatrix384']:.2f}" in section("09")


def test_10_the_least_energy_per_token_and_the_cost_ratio():
    systems = list(widgets.POWER_SYSTEMS)
    served = {s: snlab.serve_best("llama3-8b", s, tp=1, **widgets.POWER_WORKLOAD) for s in systems}
    joules = {s: r.energy_per_token_j for s, r in served.items()}
    least = min(joules, key=joules.get)
    assert answer_in("10") == least
    assert f"({joules[least]:.2g} J against {joules[CLUSTER]:.2g} J on the PCIe cluster" in section("10")
    cost = {s: snlab.serve_best("llama3-70b", s, tp=widgets.power_tp("llama3-70b", s), prices="example-purchase",
                                **widgets.POWER_WORKLOAD).cost_per_million_tokens_usd for s in (CLUSTER, SUPERNODE)}
    assert f"({cost[CLUSTER] / cost[SUPERNODE]:.1f} times" in section("10")


@pytest.mark.parametrize("number", ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10"])
def test_every_lesson_has_an_answer(number):
    assert answer_in(number)


def test_11_the_queue_passes_one_second_above_ten_requests_per_second():
    from snlab.serving import load_sweep
    load = load_sweep("llama3-70b", ["dgx-h100"], [1, 2, 4, 6, 8, 10, 12, 16], modes=("colocated",),
                      lengths="azure-conv-2023", requests=600, tp=8, ttft_target=1.0, tpot_target=0.05)
    cluster = load.set_index("rate_rps")
    over = cluster[cluster.ttft_p90_s > 1.0].index.min()
    expected = "below 5 requests/s" if over < 5 else "5 to 10 requests/s" if over <= 10 else "above 10 requests/s"
    assert answer_in("11") == expected
    below = cluster.index[cluster.index < over].max()
    assert f"(between {below} and {over})" in section("11")
    c13 = claims.c13().numbers["pool vs host memory with a request queue"]
    assert c13 < 2 and "less than twice" in section("11")
