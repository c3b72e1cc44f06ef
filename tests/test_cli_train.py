"""The ``snlab train``, ``snlab compare`` and ``snlab search`` commands, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import snlab

PLAN_ARGS = ["--model", "megatron-1t", "--tp", "8", "--pp", "64", "--dp", "6", "--micro-batch", "1",
             "--global-batch", "3072", "--recompute", "full"]
PLAN = dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072, recompute="full")
SYSTEMS = ["dgx-a100", "cloudmatrix384", "pcie-ethernet-a100"]
KEYS = {"step_time_s", "mfu", "hfu", "model_tflops_per_device", "hardware_tflops_per_device", "tokens_per_s",
        "fits", "memory_bytes_per_device", "time_s"}


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "snlab", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
    return proc


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("snlab: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture(scope="module")
def train_json():
    return json.loads(run("train", "--system", "dgx-a100", *PLAN_ARGS, "--tokens", "450e9", "--json").stdout)


def test_train_json_is_one_object_with_the_result_keys(train_json):
    d = train_json
    assert isinstance(d, dict)
    assert KEYS <= set(d)
    mem = d["memory_bytes_per_device"]
    assert {"weights", "grads", "optimizer", "activations", "total"} <= set(mem)
    assert mem["total"] == pytest.approx(mem["weights"] + mem["grads"] + mem["optimizer"] + mem["activations"],
                                         rel=1e-12)
    assert {"compute", "tp", "pp", "dp", "bubble"} <= set(d["time_s"])
    assert d["plan"]["tp"] == 8 and d["plan"]["pp"] == 64 and d["plan"]["dp"] == 6
    assert d["devices"] == 3072 and d["system"] == "dgx-a100" and d["model"] == "megatron-1t"
    assert 0 < d["mfu"] < d["hfu"] < 1 and d["fits"] is True


def test_train_json_is_what_the_api_gives(train_json):
    result = snlab.train("megatron-1t", "dgx-a100", **PLAN)
    api = json.loads(json.dumps(result.to_dict()))
    added = ("time_to_train_s", "energy_to_train_j", "cost_to_train_usd")
    assert {k: v for k, v in train_json.items() if k not in added} == api
    # --tokens adds the time to train that many tokens, the facility energy and (with prices) the cost
    assert train_json["time_to_train_s"] == pytest.approx(450e9 / train_json["tokens_per_s"], rel=1e-12)
    assert train_json["time_to_train_s"] == pytest.approx(result.time_to_train_s(450e9), rel=1e-12)
    assert train_json["energy_to_train_j"] == pytest.approx(result.energy_to_train_j(450e9), rel=1e-12)
    assert train_json["cost_to_train_usd"] is None


def test_a_toml_copy_of_the_system_gives_identical_json(tmp_path, train_json):
    toml = run("presets", "show", "dgx-a100", "--toml").stdout
    path = tmp_path / "x.toml"
    path.write_text(toml)
    copy = json.loads(run("train", "--system", str(path), *PLAN_ARGS, "--tokens", "450e9", "--json").stdout)
    assert copy == train_json


def test_train_table_is_readable():
    out = run("train", "--system", "cloudmatrix384", *PLAN_ARGS, "--tokens", "450e9").stdout
    for needle in ("megatron-1t", "cloudmatrix384", "step time", "MFU", "tokens per second", "memory per device",
                   "time to train"):
        assert needle in out, needle


def test_plan_flags_reach_the_model():
    args = ["train", "--system", "pcie-ethernet-a100", "--model", "megatron-22b", "--tp", "8", "--pp", "2",
            "--dp", "4", "--micro-batch", "2", "--global-batch", "512", "--zero", "2", "--recompute", "selective",
            "--interleave", "3", "--overlap", "dp=1,tp=0.5", "--offload", "optimizer", "--grad-dtype", "bf16",
            "--no-sequence-parallel", "--json"]
    d = json.loads(run(*args).stdout)
    p = d["plan"]
    assert (p["zero"], p["interleave"], p["micro_batch"], p["offload"], p["sequence_parallel"]) == \
        (2, 3, 2, "optimizer", False)
    assert p["overlap"]["tp"] == 0.5 and p["overlap"]["dp"] == 1.0 and p["overlap"]["pp"] == 0.0
    api = snlab.train("megatron-22b", "pcie-ethernet-a100", tp=8, pp=2, dp=4, micro_batch=2, global_batch=512,
                      zero=2, recompute="selective", interleave=3, overlap="dp=1,tp=0.5", offload="optimizer",
                      grad_dtype="bf16", sequence_parallel=False)
    assert d["step_time_s"] == pytest.approx(api.step_time_s, rel=1e-12)
    assert d["memory_bytes_per_device"]["total"] == pytest.approx(api.memory_bytes_per_device["total"], rel=1e-12)


def test_compare_shows_every_system_side_by_side():
    out = run("compare", "--systems", ",".join(SYSTEMS), *PLAN_ARGS).stdout
    lines = out.splitlines()
    header = next(line for line in lines if all(s in line for s in SYSTEMS))
    assert header.index(SYSTEMS[0]) < header.index(SYSTEMS[1]) < header.index(SYSTEMS[2])
    for label in ("step time", "MFU", "exposed TP comm", "memory/device", "fits"):
        row = next((line for line in lines if line.startswith(label)), None)
        assert row is not None, label
        assert len(row[len(label):].split()) >= 3, row


def test_compare_json_matches_train_on_each_system():
    out = json.loads(run("compare", "--systems", ",".join(SYSTEMS), *PLAN_ARGS, "--json").stdout)
    assert [d["system"] for d in out] == SYSTEMS
    for d in out:
        api = snlab.train("megatron-1t", d["system"], **PLAN)
        assert d["step_time_s"] == pytest.approx(api.step_time_s, rel=1e-12)
        assert d["mfu"] == pytest.approx(api.mfu, rel=1e-12)


def test_search_prints_the_best_plans():
    out = run("search", "--model", "megatron-22b", "--system", "dgx-a100", "--devices", "64",
              "--global-batch", "512", "--top", "3").stdout
    lines = out.strip().splitlines()
    assert "megatron-22b" in lines[0] and "64" in lines[0]
    header = lines[1].split()
    for col in ("tp", "pp", "dp", "mb", "zero", "recompute", "mfu"):
        assert col in header, col
    plans = [l for l in lines[2:] if not l.startswith("*")]
    assert len(plans) == 3
    # a plan the published runs do not cover is marked, and the mark explained
    assert any(l.rstrip().endswith("*") for l in plans) == any(l.startswith("* outside") for l in lines)
    validated = run("search", "--model", "megatron-22b", "--system", "dgx-a100", "--devices", "64",
                    "--global-batch", "512", "--top", "3", "--validated-only").stdout.strip().splitlines()
    assert not any(l.rstrip().endswith("*") for l in validated[2:]) and len(validated) == 5


def test_search_json_plans_use_all_devices_and_are_sorted():
    rows = json.loads(run("search", "--model", "megatron-22b", "--system", "pcie-ethernet-a100", "--devices", "64",
                          "--global-batch", "512", "--top", "5", "--recompute", "full", "--json").stdout)
    assert len(rows) == 5
    for r in rows:
        assert r["tp"] * r["pp"] * r["dp"] * r["cp"] == 64
        assert 512 % (r["micro_batch"] * r["dp"]) == 0
        assert r["recompute"] == "full"
    times = [r["step_time_s"] for r in rows]
    assert times == sorted(times)
    api = snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512, recompute="full", top=1)
    assert times[0] == pytest.approx(float(api["step_time_s"].iloc[0]), rel=1e-12)


# --- bad input: one line, no traceback --------------------------------------------------

def test_tp_not_dividing_the_heads_is_one_line():
    proc = run("train", "--system", "dgx-a100", *PLAN_ARGS[:2], "--tp", "3", "--pp", "64", "--dp", "16",
               "--global-batch", "3072", check=False)
    assert_one_line_error(proc, "tp", "160", "heads")


def test_unknown_system_is_one_line_listing_the_systems():
    proc = run("train", "--system", "no-such-system", *PLAN_ARGS, check=False)
    assert_one_line_error(proc, "no-such-system", *snlab.presets.names("system"))


def test_impossible_search_is_one_line():
    proc = run("search", "--model", "megatron-1t", "--system", "dgx-a100", "--devices", "131", "--global-batch",
               "3072", check=False)
    assert_one_line_error(proc, "devices")


ARGPARSE_ERRORS = [
    (["--tp", "0"], "--tp"),
    (["--recompute", "sometimes"], "recompute: unknown module"),
]


@pytest.mark.parametrize("extra, needle", ARGPARSE_ERRORS, ids=[" ".join(e) for e, _ in ARGPARSE_ERRORS])
def test_malformed_flags_are_one_line(extra, needle):
    args = ["train", "--system", "dgx-a100", "--model", "megatron-1t", "--global-batch", "3072", *extra]
    proc = run(*args, check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc, needle)


def test_json_carries_the_error_band(capsys):
    """Training on A100 has published runs: the JSON bounds step time, MFU and throughput
    by their spread; on CloudMatrix384 there are none, and the fields are null."""
    import json

    from snlab.cli import main
    plan = ["--tp", "8", "--pp", "64", "--dp", "6", "--micro-batch", "1", "--global-batch", "3072",
            "--recompute", "full", "--json"]
    assert main(["train", "--model", "megatron-1t", "--system", "dgx-a100", *plan]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["band_runs"] >= 8
    assert out["step_time_s_low"] < out["step_time_s_high"]
    band = snlab.uncertainty.band("training", "A100")
    assert out["step_time_s_high"] == pytest.approx(out["step_time_s"] * band.high)
    assert out["mfu_low"] < out["mfu_high"] and out["tokens_per_s_low"] < out["tokens_per_s_high"]
    assert main(["train", "--model", "megatron-1t", "--system", "cloudmatrix384", *plan]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["band_runs"] == 0 and out["mfu_low"] is None and "no published" in out["band"]


def test_search_keeps_one_of_the_zero_stages_a_single_data_parallel_rank_makes_the_same():
    df = snlab.search("llama3-8b", "dgx-h100", devices=7, global_batch=64)
    plan = ["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "sequence_parallel", "step_time_s",
            "memory_total_bytes"]
    assert not df[plan].duplicated().any()
    first = df.iloc[0]
    assert first.dp == 1 and first.zero == 0                  # ZeRO 1 shards nothing over one rank


@pytest.mark.parametrize("flags, why", [
    (["--validated-only"], "none is validated (--validated-only)"),
    (["--power-budget", "1W"], "none is within the power budget 1W"),
])
def test_a_search_says_which_filter_left_no_plan(flags, why):
    """Plans that fit but that a filter removes are not reported as plans that do not fit."""
    out = run("search", "--model", "llama3-70b", "--system", "cloudmatrix384" if "--validated-only" in flags
              else "dgx-h100", "--devices", "64", "--global-batch", "512", *flags).stdout
    assert out.startswith("plans fit llama3-70b on 64 devices") and why in out, out
    none = run("search", "--model", "llama3-405b", "--system", "dgx-h100", "--devices", "8", "--global-batch",
               "512", *flags).stdout
    assert none.strip() == "no plan fits llama3-405b on 8 devices of dgx-h100"


def test_a_bad_optimizer_size_states_its_range():
    proc = run("train", "--system", "dgx-a100", *PLAN_ARGS, "--optimizer-bytes", "100", check=False)
    assert_one_line_error(proc, "optimizer_bytes", "from 0 to 64")
    assert run("train", "--system", "dgx-a100", *PLAN_ARGS, "--optimizer-bytes", "64").returncode == 0


def test_a_single_device_is_one_device():
    out = run("train", "--model", "llama3.2-1b", "--system", "dgx-h100", "--global-batch", "8").stdout
    assert "on dgx-h100: 1 device (tp=1" in out
