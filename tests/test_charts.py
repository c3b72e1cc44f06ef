"""Chart builders: the specs they return, the numbers they draw, the offline switch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import snlab
from snlab import charts, compare, offline
from snlab.errors import SnlabError

TRILLION = dict(tp=8, pp=64, dp=6, global_batch=3072, recompute="full")


@pytest.fixture(scope="module")
def frame():
    """A small grid with every part of the step present somewhere (offload included)."""
    return snlab.sweep("megatron-1t", ["pcie-ethernet-a100", "cloudmatrix384"], micro_batch=[1, 2],
                       overlap=["none", "all"], offload=["none", "optimizer"], **TRILLION)


def _fields(spec) -> list[str]:
    """Every ``field`` an encoding or tooltip of the spec refers to."""
    out = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key == "field" and isinstance(value, str):
                out.append(value)
            else:
                out += _fields(value)
    elif isinstance(spec, list):
        for item in spec:
            out += _fields(item)
    return out


def _titles(spec) -> list[str]:
    out = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key == "title" and isinstance(value, str):
                out.append(value)
            else:
                out += _titles(value)
    elif isinstance(spec, list):
        for item in spec:
            out += _titles(item)
    return out


def _all_charts(frame):
    best = compare.best_plans(["llama3.2-1b", "llama3-70b"], ["pcie-ethernet-a100", "cloudmatrix384"],
                             devices=64, global_batch=128)
    return {
        "step": charts.step_breakdown(frame, by=("system", "micro_batch")),
        "step_share": charts.step_breakdown(best, by=("model", "system"), normalize=True),
        "mfu": charts.mfu_chart(frame, x="overlap", detail="micro_batch"),
        "scale": charts.mfu_chart(best, x="model", sort=compare.model_order(best)),
        "memory": charts.memory_breakdown(frame, by=("system", "micro_batch")),
        "roofline": charts.roofline(gemms=charts.gemm_frame("ascend-910c", [1, 64, 4096], 8192, 8192)),
        "collective": charts.collective_time(group_size=32),
    }


def test_field_names_are_plain(frame):
    """Vega-Lite reads '[' and '.' in a field name as nested access and draws nothing:
    every field the charts use must be a plain name."""
    for name, chart in _all_charts(frame).items():
        fields = _fields(chart.to_dict())
        assert fields, name
        bad = [f for f in fields if any(c in f for c in "[].")]
        assert not bad, (name, bad)


def test_axes_and_tooltips_carry_units(frame):
    specs = {name: chart.to_dict() for name, chart in _all_charts(frame).items()}
    for name, spec in specs.items():
        titles = _titles(spec)
        with_units = [t for t in titles if "[" in t and "]" in t]
        assert len(with_units) >= 2, (name, titles)
    step = specs["step"]
    assert step["encoding"]["x"]["title"] == "time per step [s]"
    tips = [t.get("title") for t in step["encoding"]["tooltip"]]
    assert "time [s]" in tips and "MFU [%]" in tips
    assert specs["memory"]["layer"][0]["encoding"]["y"]["title"] == "memory per device [GB]"
    assert specs["collective"]["encoding"]["y"]["title"] == "time [µs]"


def test_step_parts_add_up_to_the_step(frame):
    long = charts.step_parts_frame(frame, by=("system", "micro_batch", "overlap", "offload"))
    valid = frame[frame["valid"]]
    totals = long.groupby("label", sort=False)["time_s"].sum().to_numpy()
    assert len(totals) == len(valid)
    np.testing.assert_allclose(totals, valid["step_time_s"].to_numpy(), rtol=1e-9)
    assert (long["time_s"] >= 0).all()
    shares = long.groupby("label", sort=False)["share_pct"].sum()
    np.testing.assert_allclose(shares, 100.0, rtol=1e-9)
    # the offloaded rows show their transfer time in the last part, the others nothing
    last = long[long["part"] == "optimizer and offload"].set_index("label")["time_s"]
    assert last.max() > 10 * last.min()


def test_overlap_removes_exposed_communication_from_the_bars(frame):
    long = charts.step_parts_frame(frame[(frame.system == "pcie-ethernet-a100") & (frame.micro_batch == 1)
                                         & (frame.offload == "none")], by=("overlap",))
    tp = long[long.part == "tensor-parallel comm (exposed)"].set_index("label")["time_s"]
    assert tp["none"] > 0
    assert tp["all"] < tp["none"]


def test_train_results_draw_like_sweep_rows():
    plan = dict(micro_batch=1, overlap="standard", **TRILLION)
    results = [snlab.train("megatron-1t", s, **plan) for s in ("pcie-ethernet-a100", "cloudmatrix384")]
    swept = snlab.sweep("megatron-1t", ["pcie-ethernet-a100", "cloudmatrix384"], **plan)
    a = charts.step_parts_frame(results)
    b = charts.step_parts_frame(swept)
    np.testing.assert_allclose(a["time_s"].to_numpy(), b["time_s"].to_numpy(), rtol=1e-9)
    assert list(charts.as_frame(results)["overlap"]) == ["standard", "standard"]


def test_memory_parts_add_up_and_the_limit_is_the_usable_memory(frame):
    long = charts.memory_parts_frame(frame, by=("system", "micro_batch", "overlap", "offload"))
    valid = frame[frame["valid"]]
    totals = long.groupby("label", sort=False)["memory_gb"].sum().to_numpy()
    np.testing.assert_allclose(totals * 1e9, valid["memory_total_bytes"].to_numpy(), rtol=1e-9)
    cap = long.groupby("system")["capacity_gb"].first()
    for system, device in (("pcie-ethernet-a100", "a100-pcie-80gb"), ("cloudmatrix384", "ascend-910c")):
        d = snlab.device(device)
        usable = (d.hbm_capacity - d.memory_reserve) * d.allocator_efficiency
        assert cap[system] == pytest.approx(usable / 1e9)
        assert cap[system] < d.hbm_capacity / 1e9


def test_invalid_rows_are_not_drawn():
    df = snlab.sweep("llama3-70b", "dgx-h100", tp=[3, 8], pp=1, dp=8, micro_batch=1, global_batch=64)
    assert not df["valid"].all()
    long = charts.step_parts_frame(df)
    assert set(long["tp"]) == {8}
    with pytest.raises(SnlabError, match="plan"):
        charts.step_breakdown(df[~df["valid"]])


def test_metric_chart_orders_overlap_and_scales_mfu(frame):
    chart = charts.mfu_chart(frame, x="overlap", detail="micro_batch")
    spec = chart.to_dict()
    line = spec["layer"][0] if "layer" in spec else spec
    assert line["encoding"]["x"]["sort"] == charts.OVERLAP_ORDER
    values = spec["data"]["values"]
    mfu = sorted(v["metric"] for v in values)
    valid = frame[frame["valid"]]
    np.testing.assert_allclose(mfu, sorted(100 * valid["mfu"]), rtol=1e-12)


def test_mfu_chart_draws_the_error_band_where_published_runs_exist():
    """A100 plans carry the band of published A100 training runs; the supernode's
    (no published training runs) draws no bar."""
    df = snlab.sweep("megatron-1t", ["dgx-a100", "cloudmatrix384"], tp=8, pp=64, dp=6, global_batch=3072)
    spec = charts.mfu_chart(df, x="system", mark="bar").to_dict()
    marks = [layer["mark"]["type"] for layer in spec["layer"]]
    assert marks == ["bar", "rule"]               # a vertical range on each bar, no wider than it
    # one axis: the band's layer carries the metric's title, not its column name
    assert [layer["encoding"]["y"]["title"] for layer in spec["layer"]] == ["MFU [%]"] * 2
    rows = {v["system"]: v for v in spec["data"]["values"]}
    a100 = rows["dgx-a100"]
    assert a100["band_low"] < a100["metric"] * 1.0 + 1e-9 <= a100["band_high"] + a100["metric"]
    assert a100["band_runs"] >= 8
    band = snlab.uncertainty.band("training", "A100")
    assert a100["band_low"] == pytest.approx(a100["metric"] / band.high)
    assert rows["cloudmatrix384"]["band_runs"] == 0


def test_roofline_shape():
    """Attainable compute never falls as intensity grows, is flat past the ridge and
    proportional to intensity before it (slope 1 on log-log axes)."""
    rf = charts.roofline_frame(["a100-pcie-80gb"])
    y = rf["tflops"].to_numpy()
    x = rf["intensity"].to_numpy()
    assert np.all(np.diff(y) >= -1e-9)
    assert y[-1] == pytest.approx(y[-10])
    slope = np.diff(np.log(y[:5])) / np.diff(np.log(x[:5]))
    np.testing.assert_allclose(slope, 1.0, rtol=1e-9)
    throttled = charts.roofline_frame(["a100-pcie-80gb"], sustained_clock=0.8)["tflops"].to_numpy()
    assert throttled[-1] == pytest.approx(0.8 * y[-1])
    assert throttled[0] == pytest.approx(y[0])      # memory-bound work does not care


def test_gemm_points_move_from_memory_to_compute_bound():
    g = charts.gemm_frame("h100-sxm-80gb", [1, 16, 256, 4096, 65536], 8192, 8192)
    assert list(g["bound"])[0] == "memory-bound"
    assert list(g["bound"])[-1] == "compute-bound"
    assert np.all(np.diff(g["intensity"]) > 0)
    assert np.all(np.diff(g["tflops"]) >= 0)


def test_collective_frame():
    df = charts.collective_frame(["pcie-ethernet-a100", "cloudmatrix384"], "all-reduce", 16)
    for (_, _), part in df.groupby(["system", "level"]):
        assert np.all(np.diff(part["time_us"].to_numpy()) >= 0)
    big = df[df["message_bytes"] == df["message_bytes"].max()].set_index(["system", "level"])["time_us"]
    # 16 devices span two servers of the cluster but sit inside the supernode's domain
    assert big[("cloudmatrix384", "as placed")] == pytest.approx(big[("cloudmatrix384", "scale-up only")])
    # two servers: the pipelined two-level ring costs about its larger (PCIe) phase
    assert big[("pcie-ethernet-a100", "as placed")] == pytest.approx(big[("pcie-ethernet-a100", "scale-up only")],
                                                                      rel=0.1)
    assert big[("pcie-ethernet-a100", "as placed")] < big[("pcie-ethernet-a100", "scale-out only")]
    with pytest.raises(SnlabError, match="collective"):
        charts.collective_frame(["dgx-h100"], "broadcast", 8)
    with pytest.raises(SnlabError, match="group_size"):
        charts.collective_frame(["dgx-h100"], "all-reduce", 1)


def test_best_plans_and_model_order():
    best = compare.best_plans(["llama3-70b", "llama3.2-1b"], ["cloudmatrix384"], devices=64, global_batch=128)
    assert compare.model_order(best) == ["llama3.2-1b", "llama3-70b"]
    assert (best["fits"]).all()
    with pytest.raises(SnlabError, match="no plan fits"):
        compare.best_plans(["megatron-1t"], ["pcie-ethernet-a100"], devices=8, global_batch=8)


def test_save_writes_images_offline(tmp_path, frame):
    chart = charts.step_breakdown(frame)
    charts.save(chart, tmp_path / "step.png")
    charts.save(chart, tmp_path / "step.svg")
    assert (tmp_path / "step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "step.svg").read_text()
    assert "<svg" in svg and "time per step [s]" in svg


def test_offline_switch(monkeypatch):
    import altair as alt
    monkeypatch.delenv(offline.ENV, raising=False)
    assert offline.requested()                   # offline unless told otherwise
    for value in ("1", "yes", ""):
        monkeypatch.setenv(offline.ENV, value)
        assert offline.requested()
    for value in ("0", "no", "False", " off "):
        monkeypatch.setenv(offline.ENV, value)
        assert not offline.requested()
    charts.enable_offline()
    assert offline.is_offline()
    assert alt.JupyterChart._esm.count("\n") > 1000 or len(alt.JupyterChart._esm) > 500_000
    assert "cdn" not in alt.JupyterChart._esm[:2000].lower()
    assert alt.renderers.active == "jupyter"


def test_import_snlab_stays_light():
    code = ("import sys, snlab; heavy = [m for m in ('altair', 'ipywidgets', 'pandas') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "SNLAB_OFFLINE": "1"})
    assert out.stdout.strip() == ""
    lazy = subprocess.run([sys.executable, "-c", "import snlab; print(type(snlab.charts.step_breakdown).__name__)"],
                          capture_output=True, text=True, check=True)
    assert lazy.stdout.strip() == "function"


def _kernel_check(env: dict, code: str) -> str:
    """Run ``code`` after importing snlab.charts in a process that looks like a Jupyter
    kernel (an IPython shell with a kernel attached) and return what it prints."""
    prelude = ("import IPython, types; from IPython.core.interactiveshell import InteractiveShell; "
               "shell = InteractiveShell.instance(); shell.kernel = types.SimpleNamespace(); "
               "import altair as alt, snlab.charts, snlab.offline as o; ")
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, check=True,
                         env=env)
    return out.stdout.strip()


def test_charts_are_offline_by_default_in_a_kernel(tmp_path):
    """With nothing set, importing snlab.charts in a kernel bundles the JavaScript; with
    SNLAB_OFFLINE=0 the CDN stays; outside a kernel nothing is switched."""
    env = {k: v for k, v in os.environ.items() if k != offline.ENV}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    assert _kernel_check(env, "print(o.is_offline(), alt.JupyterChart._is_offline, alt.renderers.active)") \
        == "True True jupyter"
    assert _kernel_check({**env, offline.ENV: "0"}, "print(o.is_offline(), alt.JupyterChart._is_offline)") \
        == "False False"
    plain = subprocess.run([sys.executable, "-c", "import altair as alt, snlab.charts, snlab.offline as o; "
                            "print(o.in_kernel(), o.is_offline())"], capture_output=True, text=True, check=True,
                           env=env)
    assert plain.stdout.strip() == "False False"


def test_offline_without_vl_convert_warns_instead_of_failing(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_vl_convert(name, *args, **kwargs):
        if name == "vl_convert":
            raise ImportError("no vl_convert")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(offline, "_state", {"offline": False})
    monkeypatch.setattr(builtins, "__import__", no_vl_convert)
    with pytest.warns(UserWarning, match="vl-convert-python is not installed"):
        offline.enable_offline(True)
    assert not offline.is_offline()


def test_offline_bundle_cache_is_reused(tmp_path):
    """A second kernel reads the bundled JavaScript from the cache instead of rebuilding it."""
    code = ("import altair as alt, snlab.offline as o; o.enable_offline(); "
            "print(len(alt.JupyterChart._esm))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "SNLAB_OFFLINE": "0"}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    cached = list((tmp_path / "snlab").glob("jupyterchart-*.js"))
    assert len(cached) == 1
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert first.stdout == second.stdout and int(first.stdout) > 100_000


def test_figures_export_writes_the_readme_images(tmp_path):
    from snlab import figures
    paths = figures.export(tmp_path, formats=("png", "svg"), scale=1)
    assert {p.name for p in paths} == {f"{stem}.{fmt}" for stem in figures.figures() for fmt in ("png", "svg")}
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" if p.suffix == ".png" else b"<svg" in data[:200]
    assert figures.main(["--out", str(tmp_path / "again"), "--format", "png", "--scale", "1"]) == 0
    again = tmp_path / "again" / "mfu-by-model-scale.png"
    assert again.read_bytes() == (tmp_path / "mfu-by-model-scale.png").read_bytes()   # deterministic
