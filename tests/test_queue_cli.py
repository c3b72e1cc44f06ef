"""``snlab serve --rate``: percentiles and goodput, colocated and disaggregated, on every
shipped system; capacity planning; one-line errors for bad workloads."""

import json
import subprocess
import sys

import pytest

from snlab.presets.loader import names

BASE = ["serve", "--model", "llama3-8b", "--prompt-len", "500", "--output-len", "50", "--requests", "100"]


def _run(*args):
    proc = subprocess.run([sys.executable, "-m", "snlab", *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def test_rate_reports_percentiles_and_goodput_on_every_system():
    systems = ",".join(names("system"))
    code, out, err = _run(*BASE, "--system", systems, "--rate", "2", "--ttft-target", "1s", "--tpot-target", "200ms",
                          "--tp", "1")
    assert code == 0, err
    head = out.splitlines()[1]
    for system in names("system"):
        assert f"{system} colocated" in head and f"{system} disagg." in head
    for row in ("TTFT p50 / p90 / p99", "TPOT p50 / p90 / p99", "goodput [req/s]", "KV transfer (mean)"):
        assert any(line.startswith(row) for line in out.splitlines()), row


def test_rate_json_has_both_deployments():
    code, out, err = _run(*BASE, "--system", "cloudmatrix384", "--rate", "2", "--json", "--tp", "2")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["mode"] for r in runs] == ["colocated", "disaggregated"]
    assert runs[0]["deployment"]["tp"] == 2 and runs[1]["deployment"]["prefill"]["tp"] == 2
    assert {"p50", "p90", "p99", "mean"} <= set(runs[1]["ttft_s"]) and runs[1]["kv_transfer"]["level"] == "scale-up"


def test_capacity_planning_answers_how_many_devices():
    code, out, err = _run("serve", "--model", "llama3-8b", "--system", "dgx-h100", "--rate", "10", "--lengths",
                          "sharegpt-distserve", "--ttft-target", "500ms", "--tpot-target", "50ms")
    assert code == 0, err
    assert "colocated" in out and "disaggregated" in out and "devices:" in out and "within targets" in out
    assert out.count("TTFT p50 / p90 / p99") == 2 and out.count("goodput") == 2


def test_bad_workloads_get_one_line_naming_the_field():
    cases = [(["--rate", "0"], "rate"), (["--rate", "-2"], "rate"), (["--rate", "1", "--prompt-len", "-5"], "prompt_len"),
             (["--rate", "1", "--tpot-target", "1ms", "--tp", "1"], "tpot_target"),
             (["--rate", "1", "--ttft-target", "0.01ms", "--tp", "1"], "ttft_target"),
             (["--rate", "1", "--lengths", "nope"], "lengths"), (["--rate", "1", "--policy", "fifo"], "policy")]
    for extra, field in cases:
        args = [a for a in BASE if a not in ("--prompt-len", "500")] if "--prompt-len" in extra else BASE
        code, out, err = _run(*args, "--system", "dgx-h100", *extra)
        assert code == 2 and err.startswith(f"snlab: error: {field}:"), (extra, err)
        assert len(err.strip().splitlines()) == 1


def test_a_bad_kv_link_names_the_flag():
    proc = subprocess.run([sys.executable, "-m", "snlab", "serve", "--model", "llama3-8b", "--system", "dgx-h100",
                           "--prompt-len", "100", "--output-len", "100", "--rate", "2", "--kv-link", "foo"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("snlab: error: kv_link: got 'foo'"), proc.stderr


@pytest.mark.parametrize("flags, field", [
    (["--instances", "foo"], "instances"), (["--instances", "1e9"], "instances"),
    (["--tpot-target", "1e400"], "tpot_target"), (["--tpot-target", "1e12"], "tpot_target"),
    (["--ttft-target", "-1"], "ttft_target"),
])
def test_a_flag_s_range_reads_the_same_whatever_breaks_it(flags, field):
    proc = subprocess.run([sys.executable, "-m", "snlab", "serve", "--model", "llama3-8b", "--system", "dgx-h100",
                           "--prompt-len", "100", "--output-len", "100", "--rate", "2", *flags],
                          capture_output=True, text=True)
    allowed = {"instances": "a whole number from 1 to 100,000",
               "tpot_target": "a time > 0 and at most an hour", "ttft_target": "a time > 0 and at most an hour"}
    assert proc.returncode == 2 and proc.stderr.startswith(f"snlab: error: {field}:"), proc.stderr
    assert f"(allowed: {allowed[field]}" in proc.stderr
