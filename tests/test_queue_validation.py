"""Serving under load against published latency-against-load and goodput runs.

Each row of snlab/validation/queue_runs.toml names its source, the deployment and the
workload as the authors ran them, the metric and why prediction and measurement differ.
Every row of a regime (time to first token, time per output token, goodput) is held to
that regime's one tolerance (snlab.validation.queue.TOLERANCE); a row the model misses
says why in ``outside`` and is a strict expected failure.
"""

import pytest
from conftest import assert_within, published_rows

from snlab.presets import bibliography
from snlab.serving.deployment import DEFAULTS
from snlab.validation import queue as q

TABLE = q.queue_table()


@pytest.mark.parametrize("row", published_rows(TABLE.to_dict("records")))
def test_prediction_within_tolerance(row):
    assert_within(row)


def test_one_tolerance_per_regime_and_enough_rows_inside():
    """Every row of a regime has its regime's tolerance; at least six published rows are
    within it, colocated and disaggregated runs both among the rows, and most rows were
    held back while the model was built."""
    for regime, part in TABLE.groupby("regime"):
        assert set(part["tolerance"]) == {q.TOLERANCE[regime]}, regime
    assert TABLE["within"].sum() >= 6
    assert set(TABLE["mode"]) == {"colocated", "disaggregated"}
    assert TABLE["held_back"].mean() > 0.5
    assert set(TABLE["regime"]) == set(q.TOLERANCE)


def test_every_run_names_its_source_and_its_gap():
    bib = bibliography()
    for run in q.queue_runs():
        assert run["source"] in bib, run["id"]
        assert run["where"] and len(run["gap"]) > 10, run["id"]


def test_one_set_of_device_constants():
    """Rows set deployments and workloads only, never a system or device number."""
    for run in q.queue_runs():
        for part in ("deployment", "prefill", "decode"):
            assert set(run.get(part, {})) <= set(DEFAULTS), run["id"]


def test_the_closed_loop_saturates_where_the_kv_cache_binds():
    """NIM's table: past 100 users the inter-token latency stays flat while the time to
    first token grows by about a request's worth of output per user; the model must show
    both (flat within 5%, TTFT rising by more than 20 s per 50 users)."""
    rows = TABLE.set_index("id")["predicted"]
    itl = [rows[f"nim-llama3.3-70b-h100-tp2-c{c}-itl"] for c in (150, 200, 250)]
    ttft = [rows[f"nim-llama3.3-70b-h100-tp2-c{c}-ttft"] for c in (150, 200, 250)]
    assert max(itl) / min(itl) < 1.05
    assert min(b - a for a, b in zip(ttft, ttft[1:])) > 20


def test_a_user_run_file_is_read_and_checked(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[run]]\nid = "mine"\nsource = "me"\nwhere = "lab"\nmodel = "llama3-8b"\nsystem = "dgx-h100"\n'
                    'deployment = {}\nworkload = { rate = 2.0, prompt_len = 500, output_len = 50, requests = 100 }\n'
                    'metric = "tpot_s.mean"\nmeasured = 0.01\nheld_back = false\ngap = "none known"\n')
    table = q.queue_table(path)
    assert list(table["id"]) == ["mine"] and 0 < table["predicted"][0] < 1
    assert table["regime"][0] == "queue tpot" and table["mode"][0] == "colocated"
    path.write_text(path.read_text().replace("deployment = {}", "deployment = { hbm_bandwidth = 1e12 }"))
    with pytest.raises(Exception, match="not a deployment field"):
        q.queue_runs(path)
    path.write_text(path.read_text().replace("{ hbm_bandwidth = 1e12 }", "{}").replace("requests = 100", "users = 3"))
    with pytest.raises(Exception, match="not a workload field"):
        q.queue_runs(path)


def test_regimes():
    assert q.regime({"metric": "ttft_s.p90"}) == "queue ttft"
    assert q.regime({"metric": "tpot_s.mean"}) == "queue tpot"
    assert q.regime({"metric": "itl_s.p99"}) == "queue tpot"
    assert q.regime({"metric": "max_rate_rps"}) == "queue goodput"
