"""The snlab serve command: table, comparison, JSON keys, one-line errors."""

import json
import re
import subprocess
import sys

import pytest

import snlab

LONG = ["--model", "llama3-70b", "--tp", "8", "--batch", "4", "--prompt-len", "1M", "--output-len", "1000",
        "--context", "1M"]


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "snlab", "serve", *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_json_has_the_issue_keys():
    out = json.loads(run(*LONG, "--system", "cloudmatrix384", "--json").stdout)
    for key in ("ttft_s", "tpot_s", "decode_tokens_per_s_per_device", "prefill_tokens_per_s_per_device",
                "kv_cache_bytes_per_device", "weights_bytes_per_device", "fits", "kv_location"):
        assert key in out
    assert out["kv_location"] == "pool" and out["deployment"]["context"] == 1_000_000


def test_side_by_side_shows_where_the_kv_cache_lives():
    out = run(*LONG, "--system", "dgx-h100,cloudmatrix384").stdout
    assert "KV cache lives in" in out and "host" in out and "pool" in out
    assert "KV time per output token" in out and "decode tokens/s per device" in out


def test_table_and_tpot_target():
    out = run("--model", "deepseek-v3", "--system", "cloudmatrix384", "--dp", "160", "--ep", "160",
              "--prompt-len", "4096", "--output-len", "256", "--weight-dtype", "int8", "--draft-tokens", "1",
              "--acceptance", "0.7", "--microbatches", "2", "--tpot-target", "50ms").stdout
    assert out.startswith("best batch with time per output token <= 50ms")
    assert "expert all-to-alls" in out


@pytest.mark.parametrize("args, needle", [
    (["--system", "dgx-h100", "--tp", "3", "--prompt-len", "10", "--output-len", "10"], "tp: broken rule"),
    (["--system", "dgx-h100", "--batch", "x", "--prompt-len", "10", "--output-len", "10"], "batch: got 'x'"),
    (["--system", "dgx-h100", "--output-len", "10"], "prompt_len: missing"),
    (["--system", "nope", "--prompt-len", "10", "--output-len", "10"], "unknown system preset 'nope'"),
    (["--system", "dgx-h100", "--prompt-len", "10", "--output-len", "10", "--kv-dtype", "fp3"], "kv_dtype"),
])
def test_errors_are_one_line(args, needle):
    proc = run("--model", "llama3-70b", *args, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snlab: error:") and needle in lines[0]


def test_borrowed_memory_is_charged_to_the_lenders(capsys):
    """1M-token contexts of Llama 3 70B on CloudMatrix384: the KV cache that does not fit
    borrows peers' HBM through the pool; those peers serve nothing, so the result names
    them and every per-device throughput counts them."""
    import json

    from snlab.cli import main
    args = ["serve", "--model", "llama3-70b", "--system", "cloudmatrix384", "--tp", "8", "--batch", "4",
            "--prompt-len", "1000000", "--output-len", "1000", "--context", "1000000"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lenders = out["lender_devices"]
    pooled = out["kv_bytes_per_device"]["pool"] * out["devices"]
    usable = out["deployment"]["hbm_utilization"] * snlab.device("ascend-910c").hbm_capacity
    assert lenders == -(-pooled // usable) and lenders >= 1
    assert out["decode_tokens_per_s_per_device"] == pytest.approx(out["decode_tokens_per_s"] / (8 + lenders))
    for key in ("tpot_s_low", "tpot_s_high", "decode_tokens_per_s_per_device_low",
                "decode_tokens_per_s_per_device_high", "band_runs", "band"):
        assert key in out
    assert out["band_runs"] >= 2 and out["tpot_s_low"] <= out["tpot_s"] * 1.0001 <= out["tpot_s_high"] * 1.0001 + 1e-12
    assert main(args) == 0
    assert "lending HBM to the pool" in capsys.readouterr().out


def test_no_band_without_published_runs():
    r = snlab.serve("llama3-70b", "dgx-a100", tp=8, batch=4, prompt_len=1000, output_len=100)
    assert r.band_runs == 0 and r.tpot_s_low is None and "no published" in r.band
    assert "null" in r.to_json()


OFFLINE = ["--scenario", "offline", "--requests", "3000", "--prompt-len", "1000", "--output-len", "1000"]


@pytest.mark.parametrize("system", snlab.presets.names("system"))
def test_the_offline_scenario_runs_dense_and_moe_models_on_every_system(system):
    for model, kw in (("llama3-8b", dict(tp=1)), ("qwen3-30b-a3b", dict(tp=1, weight_dtype="fp8"))):
        r = snlab.serve(model, system, scenario="offline", requests=3000, prompt_len=1000, output_len=1000, **kw)
        o = r.offline
        assert r.fits and o["tokens_per_s"] > 0 and o["waves"] >= 1 and o["sequences"] >= 1, (model, system)
        assert r.deployment["batch"] == o["sequences"] and r.kv_location == "hbm"
        assert o["ttft_s"] > 0 and o["tpot_s"] > 0 and o["makespan_s"] > o["tpot_s"] * 999


def test_the_offline_table_and_json():
    out = run("--model", "llama3-70b", "--system", "dgx-h100,dgx-b200", "--tp", "2", "--weight-dtype", "fp8",
              "--kv-dtype", "fp8", *OFFLINE).stdout
    assert "offline: output tokens/s" in out and "waves" in out and "tokens per step" in out
    data = json.loads(run("--model", "deepseek-v3", "--system", "dgx-b200", "--tp", "8", "--ep", "8",
                          "--weight-dtype", "fp8", *OFFLINE, "--max-sequences", "256", "--json").stdout)
    assert data["deployment"]["scenario"] == "offline" and data["offline"]["sequences"] == 256
    assert data["offline"]["waves"] == 12 and data["deployment"]["batch"] == 256


def test_an_offline_run_that_cannot_start_prints_no_rate_and_says_why():
    """A KV cache that holds no request (a prompt too long, or weights and the engine's own
    memory filling the device) gives no offline rate, TTFT or band: the engine would not
    start, and the fits line says why."""
    for extra, why in ((("--prompt-len", "100000000"), "KV cache needs"),
                       (("--prompt-len", "100", "--engine-memory-bytes", "200GB"), "weights need 16.1 GB")):
        out = run("--model", "llama3-8b", "--system", "dgx-h100", "--scenario", "offline", "--requests", "100",
                  "--output-len", "128", *extra).stdout
        line = next(line for line in out.splitlines() if "offline: output tokens/s" in line)
        assert line.split(None, 3)[3] == "none: the run cannot start (see fits below)", out
        assert "published runs: " not in line and "offline: mean TTFT" not in out, out
        assert re.search(rf"^\s*fits\s+NO: {why}", out, re.M), out


def test_a_prompt_too_long_to_fit_prints_its_slow_prefill_and_batching_rates_not_zero():
    out = run("--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "100000000", "--output-len", "128").stdout
    prefill = next(line for line in out.splitlines() if "prefill tokens/s per device" in line).split()[-1]
    assert "." in prefill and 0 < float(prefill) < 100, out
    batching = next(line for line in out.splitlines() if "continuous vs static batching" in line).split()
    assert 0 < float(batching[4]) < 1e-3 and 0 < float(batching[6]) < 1e-3, out


def test_rates_read_as_whole_numbers_from_100_and_three_digits_below():
    from snlab.units import fmt_rate
    assert fmt_rate(43146.2) == "43,146" and fmt_rate(100) == "100"
    assert fmt_rate(99.94) == "99.9" and fmt_rate(3.1456e-5) == "3.15e-05" and fmt_rate(0) == "0"


@pytest.mark.parametrize("flags, field", [
    (["--requests", "0"], "requests"), (["--kv-fraction", "1.5"], "kv_fraction"),
    (["--kv-fraction", "0"], "kv_fraction"), (["--max-sequences", "64", "--max-step-tokens", "10"], "max_step_tokens"),
    (["--kv-block-tokens", "0"], "kv_block_tokens"), (["--graphs", "maybe"], "graphs"),
    (["--expert-imbalance", "0.5"], "expert_imbalance"), (["--host-step-s", "5"], "host_step_s"),
    (["--scenario", "bogus"], "scenario"), (["--max-sequences", "-1"], "max_sequences"),
    (["--engine-memory-bytes", "-1"], "engine_memory_bytes"), (["--engine-memory-bytes", "lots"], "engine_memory_bytes"),
    (["--engine-memory-bytes", "20TB"], "engine_memory_bytes"), (["--engine-memory-bytes", "4 GHz"], "engine_memory_bytes"),
])
def test_impossible_offline_inputs_name_their_field(flags, field):
    args = ["--model", "llama3-8b", "--system", "dgx-h100", "--scenario", "offline", "--requests", "100",
            "--prompt-len", "100", "--output-len", "100"]
    proc = run(*args, *flags, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(f"snlab: error: {field}:"), proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_offline_scenario_needs_its_requests():
    proc = run("--model", "llama3-8b", "--system", "dgx-h100", "--scenario", "offline", "--prompt-len", "100",
               "--output-len", "100", check=False)
    assert proc.returncode == 2 and "requests" in proc.stderr and "missing" in proc.stderr
    with pytest.raises(snlab.SnlabError, match="requests"):
        snlab.serve("llama3-8b", "dgx-h100", scenario="offline", prompt_len=100, output_len=100)


def test_the_engine_memory_flag_takes_a_size():
    args = ["--model", "llama3-70b", "--system", "dgx-h100", "--tp", "2", "--weight-dtype", "fp8", "--kv-dtype",
            "fp8", "--scenario", "offline", "--requests", "3000", "--prompt-len", "1000", "--output-len", "1000",
            "--json"]
    default = json.loads(run(*args).stdout)
    given = json.loads(run(*args, "--engine-memory-bytes", "4.55GiB").stdout)
    none = json.loads(run(*args, "--engine-memory-bytes", "0").stdout)
    assert default["deployment"]["engine_memory_bytes"] == given["deployment"]["engine_memory_bytes"] \
        == pytest.approx(4.55 * 2**30)
    assert default["offline"]["sequences"] == given["offline"]["sequences"] < none["offline"]["sequences"]


@pytest.mark.parametrize("flags, field", [
    (["--requests", "3000"], "requests"), (["--max-sequences", "64"], "max_sequences"),
    (["--max-step-tokens", "4096"], "max_step_tokens"), (["--kv-fraction", "0.5"], "kv_fraction"),
    (["--kv-block-tokens", "64"], "kv_block_tokens"), (["--engine-memory-bytes", "2GiB"], "engine_memory_bytes"),
    (["--scenario", "offline", "--requests", "100", "--batch", "8"], "batch"),
    (["--scenario", "offline", "--requests", "100", "--context", "100000"], "context"),
    (["--scenario", "offline", "--requests", "100", "--hbm-utilization", "0.5"], "hbm_utilization"),
])
def test_a_flag_its_scenario_does_not_read_is_an_error_not_ignored(flags, field):
    proc = run("--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "100", "--output-len", "100", *flags,
               check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(f"snlab: error: {field}:"), proc.stderr
    assert "does not read it" in proc.stderr or "keeps as many" in proc.stderr or "grow from" in proc.stderr
    # the defaults themselves are no error
    assert run("--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "100", "--output-len", "100",
               "--max-sequences", "0", "--kv-fraction", "0.95").returncode == 0


@pytest.mark.parametrize("flag, value", [("--batch", "64"), ("--context", "4096"), ("--scenario", "offline")])
def test_a_flag_a_request_stream_does_not_read_is_an_error_not_ignored(flag, value):
    proc = run("--model", "llama3-8b", "--system", "dgx-h100", "--rate", "5", "--prompt-len", "128",
               "--output-len", "128", flag, value, check=False)
    field = flag[2:]
    assert proc.returncode == 2 and proc.stderr.startswith(f"snlab: error: {field}:"), proc.stderr
    assert "--rate" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_an_offline_tpot_target_picks_the_engine_s_limit():
    out = run("--model", "llama3-70b", "--system", "hgx-h200", "--tp", "8", "--weight-dtype", "fp8",
              "--scenario", "offline", "--requests", "3000", "--prompt-len", "1024", "--output-len", "1024",
              "--tpot-target", "30ms").stdout
    chosen = int(re.search(r"best max_sequences with mean time per output token <= 30ms: ([\d,]+)", out)
                 .group(1).replace(",", ""))
    assert re.search(rf"sequences in flight\s+{chosen:,} per replica", out), out


@pytest.mark.parametrize("flags, field", [
    (["--ttft-target", "1ms"], "ttft_target"), (["--tpot-target", "30ms", "--ttft-target", "1s"], "ttft_target"),
    (["--cache-hit-rate", "0.5"], "cache_hit_rate"), (["--lengths", "sharegpt-distserve"], "lengths"),
    (["--policy", "mixed"], "policy"), (["--instances", "2"], "instances"), (["--prefill-tp", "2"], "prefill_tp"),
    (["--decode-instances", "2"], "decode_instances"), (["--kv-link", "scale-up"], "kv_link"),
    (["--seed", "3"], "seed"), (["--arrival-scv", "2"], "arrival_scv"), (["--cache-tier", "hbm"], "cache_tier"),
])
def test_a_request_stream_s_flag_without_a_rate_is_an_error_not_ignored(flags, field):
    proc = run("--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "100", "--output-len", "100", *flags,
               check=False)
    assert proc.returncode == 2 and proc.stderr.startswith(f"snlab: error: {field}:"), proc.stderr
    assert "without --rate" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_host_time_may_be_zero_its_default_and_states_one_range():
    base = ("--model", "llama3-8b", "--system", "dgx-h100", "--batch", "1", "--prompt-len", "10",
            "--output-len", "10")
    assert "1 device:" in run(*base, "--host-step-s", "0").stdout
    for bad in ("-1", "2", "abc", "nan"):
        proc = run(*base, "--host-step-s", bad, check=False)
        assert proc.returncode == 2 and "host_step_s" in proc.stderr and "from 0 to 1 s" in proc.stderr, proc.stderr


def test_the_hbm_fraction_states_one_range():
    base = ("--model", "llama3-8b", "--system", "dgx-h100", "--batch", "1", "--prompt-len", "10",
            "--output-len", "10")
    for bad in ("0", "1.5", "-1"):
        proc = run(*base, "--hbm-utilization", bad, check=False)
        assert proc.returncode == 2 and "hbm_utilization" in proc.stderr and "(0, 1]" in proc.stderr, proc.stderr


def test_a_context_holds_the_prompt():
    proc = run("--model", "llama3-70b", "--system", "dgx-h100", "--tp", "2", "--batch", "1", "--prompt-len", "1000",
               "--output-len", "100", "--context", "10", check=False)
    assert proc.returncode == 2 and "context=10, prompt_len=1000" in proc.stderr
    assert "at least prompt_len" in proc.stderr
    assert "KV length 1,000" in run("--model", "llama3-70b", "--system", "dgx-h100", "--tp", "2", "--batch", "1",
                                    "--prompt-len", "1000", "--output-len", "100", "--context", "1000").stdout


def test_a_rate_beyond_the_simulated_instances_names_the_rate():
    proc = run("--model", "llama3-70b", "--system", "dgx-h100", "--rate", "1e6", "--prompt-len", "1000",
               "--output-len", "100", "--ttft-target", "1s", "--tpot-target", "50ms", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("snlab: error: rate: 1e+06 requests/s needs ")
    assert "more than the 100,000 a simulated queue runs" in proc.stderr


@pytest.mark.parametrize("systems, why", [("dgx-h100,", "with an empty name"), (",dgx-h100", "with an empty name"),
                                          ("dgx-h100,dgx-h100", "'dgx-h100' twice")])
def test_a_list_of_systems_names_each_once(systems, why):
    proc = run("--model", "llama3-8b", "--system", systems, "--batch", "1", "--prompt-len", "10", "--output-len", "10",
               check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("snlab: error: system: ") and why in proc.stderr
