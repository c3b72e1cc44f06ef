"""Helpers that compare systems: best plans, sweeps around them, job sizing, what-ifs."""

from __future__ import annotations

import pytest

import snlab
from snlab import charts, compare
from snlab.errors import SnlabError

SYSTEMS = ["pcie-ethernet-a100", "cloudmatrix384"]


@pytest.fixture(scope="module")
def best():
    return compare.best_plans(["llama3-70b"], SYSTEMS, devices=128, global_batch=256)


def test_plan_of_round_trips_through_train(best):
    for _, row in best.iterrows():
        result = snlab.train(row["model"], row["system"], **compare.plan_of(row))
        assert result.step_time_s == pytest.approx(row["step_time_s"], rel=1e-12)


def test_vary_changes_one_axis_and_keeps_the_plan(best):
    swept = compare.vary(best, overlap=charts.OVERLAP_ORDER)
    assert len(swept) == len(best) * 4
    for system, group in swept.groupby("system"):
        row = best[best.system == system].iloc[0]
        assert (group["tp"] == row["tp"]).all() and (group["pp"] == row["pp"]).all()
        assert list(group["overlap"]) == charts.OVERLAP_ORDER
        assert group.set_index("overlap").loc[row["overlap"], "step_time_s"] == pytest.approx(row["step_time_s"])


def test_job_table_days_agree_with_train(best):
    table = compare.job_table(["llama3-70b"], SYSTEMS, devices=128, global_batch=256, tokens=1e12)
    for _, row in table.iterrows():
        result = snlab.train(row["model"], row["system"], **compare.plan_of(row))
        assert row["train_days"] == pytest.approx(result.time_to_train_s(1e12) / 86400, rel=1e-9)
        assert row["device_hours"] == pytest.approx(row["train_days"] * 24 * 128, rel=1e-9)
    with pytest.raises(SnlabError, match="tokens"):
        compare.job_table(["llama3-70b"], SYSTEMS, devices=128, global_batch=256, tokens=-1)


def test_optimum_ignores_rows_that_do_not_fit():
    df = snlab.sweep("llama3-70b", SYSTEMS, tp=8, pp=4, dp=4, global_batch=256, micro_batch=[1, 2, 4, 8, 16])
    best = compare.optimum(df)
    for system, value in best.items():
        rows = df[(df.system == system) & df.fits]
        assert value == rows.loc[rows.step_time_s.idxmin(), "micro_batch"]
    assert not df[(df.micro_batch == 16)]["fits"].all()     # the case the filter exists for


def test_with_scale_up_of_changes_only_the_scale_up_level():
    base, donor = snlab.system("pcie-ethernet-a100"), snlab.system("cloudmatrix384")
    what_if = compare.with_scale_up_of(base, donor)
    assert what_if.scale_up.bandwidth == donor.scale_up.bandwidth
    assert what_if.scale_up.domain_size == donor.scale_up.domain_size
    assert what_if.device == base.device and what_if.scale_out == base.scale_out
    assert what_if.name != base.name
    # a faster scale-up level never makes the best plan slower
    plans = compare.best_plans(["llama3-70b"], [base, what_if], devices=128, global_batch=256)
    t = plans.set_index("system")["step_time_s"]
    assert t[what_if.name] <= t[base.name]
