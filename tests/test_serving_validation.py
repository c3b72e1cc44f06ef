"""The serving model against published serving runs it was not fitted to.

Each row of snlab/validation/serving_runs.toml names its source, the deployment as the
authors ran it, the metric, a tolerance, and why prediction and measurement differ.
Every row uses the shipped presets unchanged (one set of device constants, their
kernel- and collective-level numbers taken from microbenchmarks: tests/test_serving_microbench.py).
The tolerances say how good the model is: within 15% on the SGLang runs on H100 (where
the omitted kernel costs and the uncredited overlap cancel), 15% on CloudMatrix384
prefill with perfect expert balance and on decode at 96 sequences per NPU, 20% at 112-128
sequences, 10% at 24; 35% at 8 sequences per NPU (fixed per-layer costs no
microbenchmark separates) and for prefill with the default expert placement (imbalance).
"""

import pytest

from snlab.presets import bibliography
from snlab.serving.deployment import DEFAULTS
from snlab.validation import serving as sv_runs

TABLE = sv_runs.serving_table()


@pytest.mark.parametrize("row", TABLE.to_dict("records"), ids=list(TABLE["id"]))
def test_prediction_within_tolerance(row):
    assert abs(row["error"]) <= row["tolerance"], (
        f"{row['id']} ({row['where']}): predicted {row['predicted']:.4g} vs measured "
        f"{row['measured']:.4g} {row['metric']}: {row['error']:+.1%}")


def test_every_run_names_its_source_and_its_gap():
    bib = bibliography()
    for run in sv_runs.serving_runs():
        assert run["source"] in bib or (run.get("title") and run.get("url", "").startswith("https://")), run["id"]
        assert run["where"] and len(run["gap"]) > 10, run["id"]


def test_one_set_of_device_constants():
    """Rows may set the deployment only, never a system or device number."""
    for run in sv_runs.serving_runs():
        assert set(run["deployment"]) <= set(DEFAULTS), run["id"]


def test_cloudmatrix_decode_curve_keeps_its_order():
    """Zuo et al. 2025 Table 4: throughput per NPU falls with the TPOT target (batch 128,
    112, 96, 24, 8). The model must rank the five points as measured, and for the 4K
    prompts order their TPOTs as measured (14.9 < 24.6 < 49.4 ms at batch 8, 24, 96)."""
    rows = TABLE[TABLE.id.str.startswith("cloudmatrix-decode")].sort_values("measured")
    assert list(rows.predicted.rank()) == list(rows.measured.rank())
    four_k = TABLE.set_index("id").loc[["cloudmatrix-decode-slo15-4k256", "cloudmatrix-decode-slo30-4k256",
                                        "cloudmatrix-decode-4k-b96"], "tpot_s"]
    assert four_k.is_monotonic_increasing


def test_h100_prefill_default_is_below_perfect_balance():
    """The model has no expert imbalance: the same prediction sits above the default-EPLB
    measurement and below the perfect-EPLB one (SGLang: 50,302 vs 59,337 per node)."""
    rows = TABLE.set_index("id")
    default = rows.loc["sglang-h100-prefill-4k-default", "error"]
    perfect = rows.loc["sglang-h100-prefill-4k-perfect-eplb", "error"]
    assert default > 0 > perfect


def test_a_user_run_file_is_read_and_checked(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[run]]\nid = "mine"\nsource = "me"\nwhere = "lab"\nmodel = "llama3-8b"\nsystem = "dgx-h100"\n'
                    'deployment = { batch = 8, prompt_len = 1000, output_len = 100 }\n'
                    'metric = "tpot_s"\nmeasured = 0.01\ntolerance = 0.5\ngap = "none known"\n')
    table = sv_runs.serving_table(path)
    assert list(table["id"]) == ["mine"] and 0 < table["predicted"][0] < 1
    path.write_text(path.read_text().replace("batch = 8", "batch = 8, hbm_bandwidth = 1e12"))
    with pytest.raises(Exception, match="not a deployment field"):
        sv_runs.serving_runs(path)


def test_tolerances_stay_tight():
    """The tolerances record what the model achieves; loosening one is a regression to
    explain in the row's gap, not a fix. No row above 35%, the H100 rows at 15%."""
    for run in sv_runs.serving_runs():
        assert run["tolerance"] <= (0.15 if run["system"] == "dgx-h100" else 0.35), run["id"]
