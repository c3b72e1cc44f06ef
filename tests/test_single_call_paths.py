"""The shortcuts of a single planner call give what the general path gives.

A single ``train`` or ``serve`` keeps each field's checked column per value
(:class:`snlab.grid.FieldMemo`), each system's group placements per hardware
(:func:`snlab.hardware.memo`), and takes numpy scalars through ``grid.maximum``,
``grid.minimum`` and ``grid.nearest`` without numpy calls. These tests hold the
shortcuts to numpy's answers (value, type, the sign of zero, NaN) and to the errors and
results of calls that see a value for the first time.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import snlab
from snlab import grid
from snlab.errors import SnlabError
from snlab.training import planner as tp

SCALARS = ([np.float64(x) for x in (-0.0, 0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 3.0)]
           + [0.0, -0.0, 1.5, np.nan, 3.0, 2, 0, -5, 2 ** 60, np.int64(3), np.int64(-1), np.int64(2 ** 62), True])


def _same(got, want) -> bool:
    if type(got) is not type(want):
        return False
    if np.isnan(want):
        return bool(np.isnan(got))
    return got == want and np.signbit(got) == np.signbit(want)


@pytest.mark.parametrize("ours, numpys", [(grid.maximum, np.maximum), (grid.minimum, np.minimum)])
def test_maximum_and_minimum_are_numpys(ours, numpys):
    for a, b in itertools.product(SCALARS, SCALARS):
        assert _same(ours(a, b), numpys(a, b)), (a, b)
    x, y = np.array([1.0, np.nan, -0.0]), np.array([0.5, 2.0, 0.0])
    np.testing.assert_array_equal(ours(x, y), numpys(x, y))


def test_nearest_is_numpys_round():
    for x in (-0.4, -0.0, 0.0, 0.5, 1.5, 2.5, -2.5, -2.6, 3.7, -0.6, 1e300, 2.0 ** 52 + 1, np.inf, -np.inf, np.nan):
        assert _same(grid.nearest(np.float64(x)), np.round(np.float64(x))), x
    np.testing.assert_array_equal(grid.nearest(np.array([0.5, 1.5, -2.5])), np.round(np.array([0.5, 1.5, -2.5])))


def test_memo_keys_tell_types_and_signed_zeros_apart():
    assert len({grid.memo_key("tp", v) for v in (1, 1.0, True, np.float64(1.0), np.int64(1))}) == 5
    assert grid.memo_key("zero", -0.0) is None and grid.memo_key("zero", 0.0) is not None
    assert grid.memo_key("overlap", {"dp": 1.0}) is None and grid.memo_key("tp", [8]) is None


def test_a_value_seen_before_still_reports_another_fields_error():
    snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64)
    for bad, field in ((dict(zero=5), "zero"), (dict(recompute="sometimes"), "recompute"),
                       (dict(seq_len=2e9), "seq_len"), (dict(fp8_params=True), "fp8_params")):
        with pytest.raises(SnlabError) as err:
            snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64, **bad)
        assert err.value.field == field


def test_a_filled_value_is_checked_when_given():
    """A model's own expert imbalance fills expert_imbalance without the range check a
    given value gets: the memo keeps the two apart."""
    base = snlab.model("mixtral-8x7b")
    model = dataclasses.replace(base, moe=dataclasses.replace(base.moe, load_imbalance=100.0))
    snlab.train(model, "dgx-h100", tp=8, ep=1, global_batch=64)
    with pytest.raises(SnlabError) as err:
        snlab.train(model, "dgx-h100", tp=8, ep=1, global_batch=64, expert_imbalance=100.0)
    assert err.value.field == "expert_imbalance"


def test_changing_what_a_call_returns_changes_no_later_call():
    g, _, labels = tp._grid(snlab.model("llama3-8b"), snlab.system("dgx-h100"), dict(tp=8, global_batch=64))
    g2, _, labels2 = tp._grid(snlab.model("llama3-8b"), snlab.system("dgx-h100"), dict(tp=8, global_batch=64))
    labels2["_overlap_levels"][0]["dp"] = 0.25
    labels2["recompute"].append("full")
    g2["tp"] = np.float64(2)
    g3, _, labels3 = tp._grid(snlab.model("llama3-8b"), snlab.system("dgx-h100"), dict(tp=8, global_batch=64))
    assert labels3 == labels and {k: float(v) for k, v in g3.items()} == {k: float(v) for k, v in g.items()}
    first = snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64)
    first.plan["tp"] = 1
    first.time_s["exposed"]["tp"] = -1.0
    again = snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=64)
    assert again.plan["tp"] == 8 and again.time_s["exposed"]["tp"] >= 0


def test_single_calls_agree_with_sweep_rows():
    frame = snlab.sweep("llama3-8b", "dgx-h100", tp=[4, 8], global_batch=[64, 128], recompute=["none", "full"])
    for row in frame.itertuples():
        for _ in range(2):                      # the first call fills the memos, the second reads them
            r = snlab.train("llama3-8b", "dgx-h100", tp=row.tp, global_batch=row.global_batch,
                            recompute=str(row.recompute))
            assert r.step_time_s == row.step_time_s and r.memory_bytes_per_device["total"] == row.memory_total_bytes
    frame = snlab.serve_sweep("llama3-70b", "dgx-h100", tp=8, batch=[1, 16], prompt_len=[1000, 4000], output_len=500)
    for row in frame.itertuples():
        for _ in range(2):
            r = snlab.serve("llama3-70b", "dgx-h100", tp=8, batch=row.batch, prompt_len=row.prompt_len,
                            output_len=500)
            assert r.tpot_s == row.tpot_s and r.ttft_s == row.ttft_s
