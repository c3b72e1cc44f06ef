"""Co-design: designs around a base system, each at its best plan, agree with the planner,
never get slower with more fabric or memory, and refuse what they cannot price."""

from __future__ import annotations

import numpy as np
import pytest

import snlab
from snlab import charts, codesign, widgets
from snlab.errors import SnlabError
from snlab.presets import system as load_system

CLUSTER = "pcie-ethernet-a100"


@pytest.fixture(scope="module", params=["llama3-8b", "megatron-1t"])
def table(request):
    return codesign.designs(request.param)


def _plan(row) -> dict:
    return dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), cp=int(row["cp"]),
                interleave=int(row["interleave"]), recompute=row["recompute"], zero=int(row["zero"]),
                micro_batch=1, global_batch=768, sequence_parallel=True)


def test_the_base_system_is_one_design_with_gain_one(table):
    s = load_system(CLUSTER)
    base = table[table["base"]]
    assert len(base) == 1
    row = base.iloc[0]
    assert row["scale_up_domain_size"] == s.scale_up.domain_size and row["scale_up_bandwidth"] == s.scale_up.bandwidth
    assert row["hbm_capacity"] == s.device.hbm_capacity and row["gain"] == 1.0
    assert len(table) == 4 * 4 * 2                   # every design has a row, fitting or not


def test_each_design_is_priced_by_the_planner_itself(table):
    """A row's rate is snlab.train's for its plan on the base system with the design's three
    numbers: the exploration adds no arithmetic of its own."""
    for _, row in table[table["fits"]].iloc[[0, 7, -1]].iterrows():
        base = load_system(CLUSTER)
        variant = base.replace(name="design", scale_up_domain_size=int(row["scale_up_domain_size"]),
                               scale_up_bandwidth=row["scale_up_bandwidth"],
                               device=base.device.replace(hbm_capacity=row["hbm_capacity"]))
        result = snlab.train(row["model"], variant, **_plan(row))
        assert result.tokens_per_s_per_device == pytest.approx(row["tokens_per_s_per_device"], rel=1e-9)


def test_the_base_row_is_at_least_as_fast_as_a_plan_of_the_grid(table):
    """The base row is the best of the grid's plans: a plan of it picked by hand is no faster."""
    row = table[table["base"]].iloc[0]
    other = snlab.train(row["model"], CLUSTER, tp=1, pp=1, dp=384, zero=1, micro_batch=1, global_batch=768,
                        recompute="full", sequence_parallel=True) if row["model"] == "llama3-8b" else \
        snlab.train(row["model"], CLUSTER, tp=8, pp=16, dp=3, zero=1, micro_batch=1, global_batch=768,
                    recompute="full", sequence_parallel=True)
    assert row["tokens_per_s_per_device"] >= other.tokens_per_s_per_device


@pytest.mark.parametrize("axis", codesign.DESIGN)
def test_more_fabric_or_memory_never_slows_the_best_plan(table, axis):
    others = [n for n in codesign.DESIGN if n != axis]
    for _, group in table.groupby(others):
        rates = group.sort_values(axis)["tokens_per_s_per_device"].fillna(0).to_numpy()
        assert np.all(np.diff(rates) >= -1e-9 * rates[:-1]), (axis, rates)


def test_the_front_holds_no_design_another_beats(table):
    front = codesign.front(table)
    assert front["base"].any() and len(front) <= table["fits"].sum()
    cols = ["tokens_per_s_per_device", "scale_up_domain_size", "scale_up_bandwidth"]
    for _, group in front.groupby("hbm_capacity"):
        p = group[cols].to_numpy(float) * [-1, 1, 1]
        for i in range(len(p)):
            assert not np.any(np.all(p <= p[i], axis=1) & np.any(p < p[i], axis=1))


def test_what_each_axis_buys_alone_is_at_most_all_three(table):
    parts = codesign.alone(table)
    assert set(parts.index) == {*codesign.DESIGN, "all three"}
    assert (parts >= 1.0 - 1e-12).all() and (parts.drop("all three") <= parts["all three"] + 1e-12).all()


def test_the_bus_is_worth_more_to_the_larger_model():
    scale = codesign.scale_table(["llama3-8b", "megatron-1t"])
    gain = scale.set_index("model")["gain"]
    assert gain["megatron-1t"] > gain["llama3-8b"] > 1.0
    assert np.isfinite(scale.select_dtypes("number").to_numpy()).all()


def test_bad_input_gets_a_clear_error():
    with pytest.raises(SnlabError, match="model"):
        codesign.designs("no-such-model")
    with pytest.raises(SnlabError, match="widths"):
        codesign.designs("llama3-8b", widths=[1])
    with pytest.raises(SnlabError, match="table"):
        charts.design_chart(codesign.scale_table(["llama3-8b"]))
    with pytest.raises(SnlabError, match="scale"):
        charts.design_gain_chart(codesign.designs("llama3-8b"))


def test_a_model_the_base_cannot_train_is_refused_by_name():
    with pytest.raises(SnlabError, match="has no plan that fits"):
        codesign.designs("megatron-1t", devices=8, global_batch=64)


def test_the_designs_are_a_copy():
    first = codesign.designs("llama3-8b")
    first.loc[:, "gain"] = -1.0
    assert (codesign.designs("llama3-8b")["gain"] >= 1.0 - 1e-12).all()


def test_charts_draw_the_designs_and_the_gains():
    spec = charts.design_chart(codesign.designs("megatron-1t")).to_dict()
    values = spec["datasets"][next(iter(spec["datasets"]))] if "datasets" in spec else spec["data"]["values"]
    assert len(values) == 32 and sum(v["base"] for v in values) == 1
    gains = charts.design_gain_chart(codesign.scale_table(["llama3-8b", "megatron-1t"])).to_dict()
    assert gains["encoding"]["y"]["field"] == "added"


def test_the_dashboard_redraws_for_another_model():
    dash = widgets.codesign_dashboard()
    before = dash.charts["designs"].spec
    dash.controls["model"].value = "llama3-8b"
    assert dash.error is None and dash.charts["designs"].spec != before
    assert "llama3-8b" in str(dash.charts["designs"].spec["title"] if "title" in dash.charts["designs"].spec else "")


@pytest.mark.parametrize("kw, field", [(dict(devices=2.5), "devices"), (dict(devices=float("nan")), "devices"),
                                       (dict(devices="x"), "devices"), (dict(global_batch=float("inf")), "global_batch"),
                                       (dict(domains=["a"]), "domains"), (dict(domains=[0]), "domains"),
                                       (dict(bandwidths=["fast"]), "bandwidths"), (dict(bandwidths=["400 GB"]), "bandwidths"),
                                       (dict(hbm_scales=[0]), "hbm_scales"), (dict(hbm_scales=[]), "hbm_scales")])
def test_a_bad_axis_or_size_is_named(kw, field):
    with pytest.raises(SnlabError, match=rf"^{field}:"):
        codesign.designs("llama3-8b", **kw)


def test_design_axes_read_units_and_always_hold_the_base():
    table = codesign.designs("llama3-8b", bandwidths="400 GB/s", hbm_scales=1.5, domains=16)
    assert sorted(table["scale_up_bandwidth"].unique()) == [31.5e9, 400e9]
    assert table["base"].sum() == 1 and len(table) == 2 * 2 * 2


def test_a_system_object_is_explored_as_given_not_as_its_namesake():
    """A what-if base keeps its own numbers: the A100 cluster with a 16-device domain has
    16 among its designs' domains and its own base row (not the shipped cluster's 8)."""
    wider = load_system(CLUSTER).replace(scale_up_domain_size=16)
    table = codesign.designs("llama3-8b", wider, domains=[32])
    assert sorted(table["scale_up_domain_size"].unique()) == [16, 32]
    assert table.loc[table["base"], "scale_up_domain_size"].item() == 16
    assert table["model"].iloc[0] == "llama3-8b" and table.attrs["base"] == CLUSTER
