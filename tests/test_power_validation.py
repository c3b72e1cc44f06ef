"""The power model against published power and energy measurements it was not fitted to.

snlab/validation/power_runs.toml holds the device-level rows the one fitted constant
(the HBM's energy per byte) comes from, and the held-back rows: ML.ENERGY's steady-state
GPU energy per output token for the models and GPUs with presets, and published rack
and supernode power at full load. Each regime has one tolerance; a row outside it says
why in ``outside`` and is a strict expected failure.
"""

import pytest
from conftest import assert_within, published_rows

from snlab import presets
from snlab.validation import power as pv

TABLE = pv.power_table()


@pytest.mark.parametrize("row", published_rows(TABLE.to_dict("records")))
def test_prediction_within_tolerance(row):
    assert_within(row)


def test_one_tolerance_per_regime_and_enough_rows_within_it():
    """The done criterion: energy per token within 25% of at least 8 published
    measurements, every row of a regime held to its one tolerance."""
    assert pv.TOLERANCE == {"serving energy per token": 0.25, "system power at full load": 0.20}
    for regime, part in TABLE.groupby("regime"):
        assert set(part["tolerance"]) == {pv.TOLERANCE[regime]}, regime
    energy = TABLE[TABLE["regime"] == "serving energy per token"]
    assert energy["within"].sum() >= 8 and len(energy) >= 20
    assert set(energy["system"]) == {"dgx-h100", "dgx-b200"}


def test_every_row_says_what_it_counts_and_where_it_comes_from():
    bib = presets.bibliography()
    for run in pv.power_runs():
        assert run["counts"] in pv.COUNTS and run["source"] in bib, run["id"]
        assert run["where"] and len(run["gap"]) > 20, run["id"]
    assert set(TABLE["counts"]) == {"gpu", "system"}


def test_the_calibration_gives_the_presets_constant():
    """The HBM energy in the device presets is the one the device-level rows give, and
    the serving rows use the prompt length fitted with it; the calibration rows are
    none of the validation rows."""
    fit = pv.calibrate_hbm_energy()
    h100 = presets.device("h100-sxm-80gb")
    assert h100.hbm_energy == pytest.approx(fit["hbm_energy"], rel=0.01)
    assert max(abs(e) for e in fit["errors"]) < 0.05
    for run in pv.power_runs():
        if run["kind"] == "serve":
            assert run["deployment"]["prompt_len"] == fit["prompt_len"], run["id"]
            assert run["deployment"]["prefill_batch"] == pv.VLLM_STEP_TOKENS // fit["prompt_len"], run["id"]
    calibrated = {(c["model"], c["system"]) for c in pv.calibration_rows()}
    assert not calibrated & {(r["model"], r["system"]) for r in pv.power_runs()}


def test_a_row_that_names_its_tolerance_is_refused(tmp_path):
    text = (pv.HERE / "power_runs.toml").read_text()
    path = tmp_path / "runs.toml"
    path.write_text(text.replace('counts = "system"', 'counts = "system"\ntolerance = 0.5', 1))
    with pytest.raises(Exception, match="tolerance belongs to a kind of run"):
        pv.power_runs(path)
    path.write_text(text.replace('counts = "system"', 'counts = "rack"', 1))
    with pytest.raises(Exception, match="counts"):
        pv.power_runs(path)
