"""Fuzzing the planners: arbitrary keyword values, whatever their type or size.

For ``train``, ``serve``, ``sweep``, ``serve_sweep``, ``search`` and ``serve_best``,
hypothesis draws a few keyword arguments among the real fields (and a name that is not
one) with values of any kind: integers of any size, floats with NaN and infinities,
strings with and without units, booleans, None, lists, dicts, numpy arrays of any shape,
bytes. Every call must either raise :class:`snlab.SnlabError` (naming a field and what
it allows) or return a result whose every number is finite, with 0 < MFU <= 1 and the
memory per device equal to the sum of its parts.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import snlab
from snlab.serving import deployment as dp_
from snlab.serving.planner import SYSTEM_FIELDS as SERVE_SYSTEM_FIELDS
from snlab.training.planner import OVERLAP_FIELDS, PLAN_FIELDS
from snlab.training.planner import SYSTEM_FIELDS as TRAIN_SYSTEM_FIELDS

#: numpy warnings (overflow, invalid casts) are failures here: they mean an input slipped through
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

SETTINGS = dict(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.filter_too_much])
MODELS = ["llama3-8b", "deepseek-v3", "qwen3-30b-a3b", "megatron-1t"]
SYSTEMS = ["dgx-h100", "cloudmatrix384", "pcie-ethernet-a100", "gb200-nvl72"]
WORDS = ["bf16", "fp8", "fp32", "none", "selective", "full", "standard", "all", "gradients", "optimizer",
         "activations", "both", "alltoall", "deepep", "auto", "hbm", "fixed", "uniform", "exponential",
         "dp=1,tp=0.5", "dp=x", "400 Gb/s", "2 us", "80 GB", "1e400", "nan", "inf", "-1", "0", "", "x", "\x00"]

numbers = st.one_of(
    st.integers(-3, 64), st.integers(2 ** 62, 2 ** 80), st.integers(-2 ** 80, -2 ** 62),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 1.0), st.floats(1e-320, 1e-300),
    st.floats(1e300, 1.7e308), st.sampled_from([0.5, 1.5, 8.0, 1e9, 1e15, 1e16]), st.just(10**400))
scalars = st.one_of(numbers, st.sampled_from(WORDS), st.booleans(), st.none(), st.binary(max_size=3))
values = st.one_of(
    scalars, scalars,
    st.lists(numbers | st.sampled_from(WORDS), max_size=3),
    st.dictionaries(st.sampled_from(["dp", "tp", "x", ""]), numbers | st.sampled_from(WORDS), max_size=2),
    st.builds(lambda xs: np.asarray(xs), st.lists(st.floats(allow_nan=True), min_size=0, max_size=3)),
    st.just(np.array([[1, 2], [4, 8]])), st.just(np.array(["a", "b"])), st.just(np.array([], dtype=float)),
    st.builds(np.asarray, st.integers(-3, 64) | st.floats(allow_nan=True)))     # arrays of no dimension


def kwargs(fields, max_size=3):
    return st.dictionaries(st.sampled_from(list(fields) + ["not_a_field"]), values, max_size=max_size)


def _plain_numbers(obj):
    """Every number in a nested result, as (path, value)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            for path, x in _plain_numbers(v):
                yield f"{k}.{path}" if path else k, x
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _plain_numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield "", obj


def check_result(result) -> None:
    data = result.to_dict()
    for path, x in _plain_numbers(data):
        assert math.isfinite(x), (path, x)
    json.loads(result.to_json())                    # strict JSON: no NaN or Infinity
    if isinstance(result, snlab.TrainResult):
        assert 0 < result.mfu <= 1 and 0 < result.hfu <= 1
        mem = result.memory_bytes_per_device
        parts = sum(mem[p] for p in ("weights", "grads", "optimizer", "activations", "buffers"))
        assert mem["total"] == pytest.approx(parts, rel=1e-9)
        assert result.step_time_s > 0
    else:
        assert result.tpot_s > 0 and result.ttft_s > 0


def check_frame(df: pd.DataFrame, training: bool) -> None:
    assert isinstance(df, pd.DataFrame)
    valid = df[df["valid"]]
    numeric = [c for c in valid.columns if valid[c].dtype.kind == "f" and not c.endswith(("_low", "_high"))]
    bad = [c for c in numeric if not np.isfinite(valid[c].to_numpy()).all()]
    assert not bad, bad
    for c in [c for c in df.columns if c.endswith(("_low", "_high"))]:   # bands: missing or finite, never NaN
        assert str(df[c].dtype) == "Float64", (c, df[c].dtype)
        present = df[c].dropna().to_numpy(dtype=float)
        assert np.isfinite(present).all(), c
    if training and len(valid):
        assert ((valid.mfu > 0) & (valid.mfu <= 1)).all()
        parts = valid[[f"memory_{p}_bytes" for p in ("weights", "grads", "optimizer", "activations",
                                                       "buffers")]].sum(axis=1)
        assert np.allclose(valid.memory_total_bytes, parts, rtol=1e-9)


def _call(fn, *args, **kw):
    """Call ``fn``; a SnlabError is a fine answer (it names a field), anything else fails."""
    try:
        out = fn(*args, **kw)
    except snlab.SnlabError as e:
        assert e.field and str(e), e
        event(f"refused: {e.field.split('.')[-1]}")
        return None
    event("answered")
    return out


TRAIN_FIELDS = PLAN_FIELDS + TRAIN_SYSTEM_FIELDS + OVERLAP_FIELDS + ("precision", "devices")
BASE_TRAIN = dict(tp=8, global_batch=8)


@settings(**SETTINGS)
@given(model=st.sampled_from(MODELS), system=st.sampled_from(SYSTEMS), kw=kwargs(TRAIN_FIELDS))
def test_train_takes_any_keyword_value(model, system, kw):
    result = _call(snlab.train, model, system, **{**BASE_TRAIN, **kw})
    if result is not None:
        check_result(result)


@settings(**{**SETTINGS, "max_examples": 80})
@given(model=st.sampled_from(MODELS), system=st.sampled_from(SYSTEMS), kw=kwargs(TRAIN_FIELDS))
def test_sweep_takes_any_keyword_value(model, system, kw):
    df = _call(snlab.sweep, model, system, **{**BASE_TRAIN, **kw})
    if df is not None:
        check_frame(df, training=True)


SEARCH_FIELDS = ("tp", "pp", "cp", "ep", "micro_batch", "zero", "recompute", "overlap", "interleave",
                 "sequence_parallel", "offload", "devices", "global_batch", "top", "precision")


@settings(**{**SETTINGS, "max_examples": 40})
@given(model=st.sampled_from(["llama3-8b", "qwen3-30b-a3b"]), system=st.sampled_from(SYSTEMS),
       kw=kwargs(SEARCH_FIELDS, max_size=2))
def test_search_takes_any_keyword_value(model, system, kw):
    df = _call(snlab.search, model, system, **{"devices": 64, "global_batch": 128, **kw})
    if df is not None:
        check_frame(df.assign(valid=True), training=True)
        assert len(df) <= 10 or "top" in kw


SERVE_FIELDS = tuple(dp_.DEFAULTS) + SERVE_SYSTEM_FIELDS
BASE_SERVE = dict(tp=8, batch=8, prompt_len=4096, output_len=256)


@settings(**SETTINGS)
@given(model=st.sampled_from(MODELS[:3]), system=st.sampled_from(SYSTEMS), kw=kwargs(SERVE_FIELDS))
def test_serve_takes_any_keyword_value(model, system, kw):
    base = dict(BASE_SERVE, **({"tp": 1, "dp": 8, "ep": 8} if model != "llama3-8b" else {}))
    result = _call(snlab.serve, model, system, **{**base, **kw})
    if result is not None:
        check_result(result)


@settings(**{**SETTINGS, "max_examples": 80})
@given(model=st.sampled_from(MODELS[:3]), system=st.sampled_from(SYSTEMS), kw=kwargs(SERVE_FIELDS))
def test_serve_sweep_takes_any_keyword_value(model, system, kw):
    base = dict(BASE_SERVE, **({"tp": 1, "dp": 8, "ep": 8} if model != "llama3-8b" else {}))
    df = _call(snlab.serve_sweep, model, system, **{**base, **kw})
    if df is not None:
        check_frame(df, training=False)


@settings(**{**SETTINGS, "max_examples": 40})
@given(system=st.sampled_from(SYSTEMS), kw=kwargs(SERVE_FIELDS + ("tpot_target", "max_batch"), max_size=2))
def test_serve_best_takes_any_keyword_value(system, kw):
    kw.pop("batch", None)
    result = _call(snlab.serve_best, "llama3-8b", system,
                   **{"tp": 8, "prompt_len": 4096, "output_len": 256, "tpot_target": 0.05, **kw})
    if result is not None:
        check_result(result)


# --- the command line ------------------------------------------------------------------

CLI_FLAGS = {
    "train": ["--tp", "--pp", "--dp", "--ep", "--cp", "--micro-batch", "--global-batch", "--zero", "--recompute",
              "--interleave", "--first-stage-layers", "--last-stage-layers", "--ep-dispatcher",
              "--capacity-factor", "--expert-imbalance", "--overlap", "--offload", "--precision", "--grad-dtype",
              "--seq-len", "--tokens"],
    "serve": ["--tp", "--pp", "--dp", "--ep", "--batch", "--prompt-len", "--output-len", "--context",
              "--weight-dtype", "--kv-dtype", "--draft-tokens", "--acceptance", "--microbatches", "--ep-overlap",
              "--prefill-batch", "--hbm-utilization", "--pool-share", "--kv-offload", "--output-dist",
              "--tpot-target", "--engine-memory-bytes"],
    "collective": ["--op", "--bytes", "--devices"],
}
CLI_BASE = {"train": ["--model", "llama3-8b", "--system", "dgx-h100", "--tp", "8", "--global-batch", "8"],
            "serve": ["--model", "llama3-8b", "--system", "dgx-h100", "--tp", "8", "--batch", "4",
                      "--prompt-len", "4096", "--output-len", "256"],
            "collective": ["--system", "dgx-h100", "--op", "all-reduce", "--bytes", "1e9", "--devices", "16"]}
cli_values = st.one_of(numbers.map(str), st.sampled_from(WORDS + ["128k", "1M", "1e15", "50 ms", "-0", "0x10",
                                                                  "1_000", "all-to-all", "reduce-scatter"]),
                       st.text(max_size=6))


@settings(**{**SETTINGS, "max_examples": 200, "suppress_health_check": [
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture]})
@given(command=st.sampled_from(sorted(CLI_FLAGS)), data=st.data(), json_out=st.booleans())
def test_the_command_line_takes_any_flag_value(command, data, json_out, capsys, monkeypatch):
    """Each run ends with a result (strict JSON with --json) or a one-line error naming a
    field; never a traceback or an internal error."""
    from snlab.cli import main
    monkeypatch.setenv("SNLAB_DEBUG", "1")            # an internal error raises instead of printing
    flags = data.draw(st.lists(st.tuples(st.sampled_from(CLI_FLAGS[command]), cli_values), max_size=3))
    argv = [command] + CLI_BASE[command] + [x for flag, value in flags for x in (f"{flag}={value}",)]
    argv += ["--json"] if json_out else []
    try:
        code = main(argv)
    except SystemExit as exit_:                       # argparse's own errors: a usage line, code 2
        code = exit_.code
    except snlab.SnlabError:                          # SNLAB_DEBUG re-raises what main would print
        code = 2
    out = capsys.readouterr()
    assert code in (0, 2), (argv, out.err)
    if code == 0 and json_out:
        json.loads(out.out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output of {argv}"))
    if code == 0:
        assert "nan" not in out.out.lower().replace("nanos", "") and "inf " not in out.out.lower(), out.out
    else:
        assert "Traceback" not in out.err


# --- the edges a hostile user found, one by one ------------------------------------------

NAN, INF = float("nan"), float("inf")
#: (call, the field its error must name, a fragment of the range it must state)
EDGES = [
    (lambda: snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8, devices=NAN), "devices", "100,000,000"),
    (lambda: snlab.sweep("llama3-8b", "dgx-h100", tp=8, global_batch=8, devices=NAN), "devices", "100,000,000"),
    (lambda: snlab.search("llama3-8b", "dgx-h100", devices=NAN, global_batch=8), "devices", "100,000,000"),
    (lambda: snlab.search("llama3-8b", "dgx-h100", devices=8, global_batch=8, top=NAN), "top", "1,000,000"),
    (lambda: snlab.serve_best("llama3-8b", "dgx-h100", tpot_target=0.05, max_batch=NAN, prompt_len=100,
                              output_len=10), "max_batch", "1,000,000,000"),
    (lambda: snlab.collective_time("dgx-h100", "all-reduce", 1e6, INF), "devices", "100,000,000"),
    (lambda: snlab.collective_time("dgx-h100", "all-reduce", INF, 8), "message_bytes", "1e+15"),
    (lambda: snlab.train("llama3-8b", "dgx-h100", tp=10**400, global_batch=8), "tp", "whole number"),
    (lambda: snlab.sweep("llama3-8b", "dgx-h100", tp=[10**400], global_batch=8), "tp", "whole number"),
    (lambda: snlab.search("llama3-8b", "dgx-h100", devices=8, global_batch=8, tp=10**400), "tp", "whole number"),
    (lambda: snlab.serve("llama3-8b", "dgx-h100", tp=10**400, prompt_len=100, output_len=10), "tp",
     "whole number"),
    (lambda: snlab.serve_sweep("llama3-8b", "dgx-h100", batch=[10**400], prompt_len=100, output_len=10), "batch",
     "multiple of dp"),
    (lambda: snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8, hbm_capacity=0), "hbm_capacity", "1 MB"),
    (lambda: snlab.serve("llama3-8b", "dgx-h100", prompt_len=100, output_len=10, hbm_capacity=0), "hbm_capacity",
     "1 MB"),
    (lambda: snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8, seq_len=10**400), "seq_len", ">= 1"),
    (lambda: snlab.sweep("llama3-8b", ["dgx-h100", "dgx-a100", "gb200-nvl72"], tp=8, global_batch=8,
                         scale_out_bandwidth=np.linspace(1e9, 1e11, 2_000_000)), "sweep", "4,000,000"),
    (lambda: snlab.serve_sweep(["llama3-8b", "llama3-70b"], ["dgx-h100", "dgx-a100"], prompt_len=100,
                               output_len=10, hbm_bandwidth=np.linspace(1e12, 5e12, 1_000_001)), "sweep",
     "4,000,000"),
    (lambda: snlab.model(""), "model", ".toml"),
]


@pytest.mark.parametrize("call, field, allowed", EDGES)
def test_each_edge_is_one_clear_error(call, field, allowed):
    with pytest.raises(snlab.SnlabError) as raised:
        call()
    assert raised.value.field == field and allowed in str(raised.value) and "\n" not in str(raised.value)


def test_a_zero_dimensional_array_is_a_number():
    assert snlab.train("llama3-8b", "dgx-h100", tp=np.array(8), global_batch=8).plan["tp"] == 8
    assert snlab.serve("llama3-8b", "dgx-h100", tp=np.array(8), prompt_len=100, output_len=10).deployment["tp"] == 8
    assert snlab.sweep("llama3-8b", "dgx-h100", tp=np.array(8), global_batch=8)["tp"].tolist() == [8]
    assert snlab.search("llama3-8b", "dgx-h100", devices=8, global_batch=8, tp=np.array(8))["tp"].eq(8).all()
    assert snlab.serve_sweep("llama3-8b", "dgx-h100", tp=np.array(8), prompt_len=100, output_len=10)["tp"].tolist() \
        == [8]


def test_a_preset_file_nested_too_deeply_or_with_a_key_twice_is_one_error(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 3000 + "]" * 3000 + "\n")
    twice = tmp_path / "twice.toml"
    twice.write_text('kind = "model"\nname = "x"\nlayers = 2\nlayers = 3\n')
    number = tmp_path / "device5.toml"
    number.write_text('kind = "system"\nname = "s"\ndevice = 5\n')
    for path, text in ((deep, "nested too deeply"), (twice, "'layers' is defined twice (line 4)"),
                       (number, "got 5")):
        with pytest.raises(snlab.SnlabError, match=re.escape(text)):
            snlab.system(str(path)) if path == number else snlab.model(str(path))


#: (argv, a fragment the one-line error must carry)
CLI_EDGES = [
    (["train", "--model", "", "--system", "dgx-h100", "--global-batch", "8"], "model: empty name"),
    (["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "0", "--global-batch", "8"],
     "from 1 to 100,000,000"),
    (["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "8", "--top", "0",
      "--global-batch", "8"], "from 1 to 1,000,000"),
    (["collective", "--system", "dgx-h100", "--op", "all-reduce", "--bytes", "1e9", "--devices", "1e9"],
     "from 2 to 100,000,000"),
    (["train", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "1e400", "--global-batch", "8"],
     "tp"),
    (["presets", "show", "dgx-h100", "--toml", "--json"], "not allowed with"),
    (["serve", "--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "100", "--output-len", "10",
      "--draft-tokens", "99"], "from 0 to 64"),
]


@pytest.mark.parametrize("argv, text", CLI_EDGES)
def test_the_command_line_gives_one_line_for_each_edge(argv, text, capsys):
    from snlab.cli import main
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("snlab: error:") and text in err and err.count("\n") == 1, err


def test_whole_number_flags_take_scientific_notation(capsys):
    from snlab.cli import main
    assert main(["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch",
                 "1e3", "--top", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["tp"] >= 1


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(monkeypatch, capsys):
    from snlab import cli, figures

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("snlab.cli.train.run", interrupted)
    assert cli.main(["train", "--model", "llama3-8b", "--system", "dgx-h100", "--global-batch", "8"]) == 130
    assert capsys.readouterr().err == "snlab: interrupted\n"
    monkeypatch.setattr(figures, "export", interrupted)
    assert figures.main(["--out", "unused"]) == 130
    assert capsys.readouterr().err == "python -m snlab.figures: interrupted\n"


def test_devices_as_a_numpy_scalar_or_0d_array():
    """numpy's forms of a whole number count as that number; an array of them is refused."""
    plain = snlab.train("llama3-8b", "dgx-h100", devices=8, dp=8, global_batch=64)
    for devices in (np.int64(8), np.array(8), np.float64(8.0)):
        assert snlab.train("llama3-8b", "dgx-h100", devices=devices, dp=8, global_batch=64).mfu == plain.mfu
    with pytest.raises(snlab.SnlabError, match="devices"):
        snlab.train("llama3-8b", "dgx-h100", devices=np.array([8, 16]), dp=8, global_batch=64)
