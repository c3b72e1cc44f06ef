"""Dashboards without a browser: move a control, the same chart widget gets a new spec."""

from __future__ import annotations

import altair as alt
import pytest

from snlab import widgets


def _specs(dash) -> dict:
    return {name: jchart.spec for name, jchart in dash.charts.items()}


def _move(dash, name, value):
    """Set a control; return (specs before, specs after) and the chart widget ids."""
    ids = {k: id(v) for k, v in dash.charts.items()}
    before = _specs(dash)
    dash.controls[name].value = value
    assert {k: id(v) for k, v in dash.charts.items()} == ids, "charts must be updated in place, not replaced"
    return before, _specs(dash)


@pytest.fixture(scope="module")
def training():
    return widgets.training_dashboard()


def test_training_dashboard_updates_in_place(training):
    assert set(training.charts) == {"step", "mfu"}
    assert all(isinstance(c, alt.JupyterChart) for c in training.charts.values())
    updates = training.updates
    before, after = _move(training, "micro_batch", 2)
    assert training.error is None
    assert after["step"] != before["step"]
    assert after["step"]["data"] != before["step"]["data"]
    assert training.updates == updates + 1
    before, after = _move(training, "overlap", "all")
    assert after["step"]["data"] != before["step"]["data"]
    assert after["mfu"]["data"] != before["mfu"]["data"]
    training.controls["micro_batch"].value = 1
    training.controls["overlap"].value = "standard"
    assert training.error is None


def test_training_dashboard_shows_both_systems_and_a_summary(training):
    values = training.charts["mfu"].spec["data"]["values"]
    assert {v["system"] for v in values} == {widgets.CLUSTER, widgets.SUPERNODE}
    assert widgets.CLUSTER in training.summary.value and "MFU" in training.summary.value
    assert training.message.value == ""


def test_model_scale_changes_the_plans(training):
    before, after = _move(training, "model", "llama3-8b")
    assert "llama3-8b" in after["step"]["title"]["text"] if isinstance(after["step"]["title"], dict) \
        else "llama3-8b" in after["step"]["title"]
    training.controls["model"].value = "megatron-1t"
    assert training.error is None


def test_impossible_combination_shows_a_message_not_a_traceback(training):
    """A trillion-parameter model on 64 devices fits nowhere: the view says so in one
    line, keeps the last charts, and recovers when the control moves back."""
    before = _specs(training)
    training.controls["devices"].value = 64
    assert training.error is not None and "fits on none" in training.error
    assert "Not possible" in training.message.value and "snlab-error" in training.message.value
    assert "Traceback" not in training.message.value
    assert _specs(training) == before
    training.controls["devices"].value = 384
    assert training.error is None and training.message.value == ""


def test_memory_dashboard():
    dash = widgets.memory_dashboard()
    before, after = _move(dash, "recompute", "full")
    assert after["memory"] != before["memory"]
    before, after = _move(dash, "tp", 3)          # 3 does not divide llama3-70b's 64 heads
    assert dash.error is not None and dash.error.startswith("tp:")
    assert "allowed" in dash.error
    assert after == before
    dash.controls["tp"].value = 8
    assert dash.error is None
    dash.controls["pp"].value = 8                 # ZeRO 3 cannot go with pipelines: a note, not an error
    assert dash.error is None and "ZeRO 3" in dash.message.value


def test_pipeline_dashboard():
    dash = widgets.pipeline_dashboard()
    before, after = _move(dash, "seq_len", 1024)
    assert after["line"] != before["line"] and after["parts"] != before["parts"]
    dash.controls["model"].value = "llama3-8b"
    _move(dash, "pp", 64)                         # llama3-8b has 32 layers
    assert dash.error is not None and dash.error.startswith("pp:")
    dash.controls["pp"].value = 8
    assert dash.error is None
    assert "best micro-batch" in dash.summary.value


def test_compute_dashboard():
    dash = widgets.compute_dashboard(tokens=1)
    assert "memory-bound" in dash.summary.value
    before, after = _move(dash, "tokens", 65536)
    assert after["roofline"] != before["roofline"]
    assert "compute-bound" in dash.summary.value
    before, after = _move(dash, "clock", 0.8)
    assert after["roofline"] != before["roofline"]


def test_collective_dashboard():
    dash = widgets.collective_dashboard()
    before, after = _move(dash, "group_size", 512)
    assert after["collective"] != before["collective"]
    before, after = _move(dash, "collective", "all-to-all")
    assert after["collective"] != before["collective"]
    summary = dash.summary.value
    dash.controls["message"].value = 10 ** 9
    assert dash.summary.value != summary


def test_dashboard_displays_as_one_widget(training):
    bundle = training._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert training.charts["step"].embed_options["renderer"] == "svg"


def test_a_bug_in_render_is_shown_not_raised():
    def render(values):
        if values["x"] == 2:
            raise ZeroDivisionError("boom")
        return widgets.View({"c": alt.Chart(alt.Data(values=[{"a": values["x"]}])).mark_point().encode(x="a:Q")})

    import ipywidgets as W
    dash = widgets.Dashboard({"x": W.IntSlider(value=1, min=1, max=3)}, render)
    dash.controls["x"].value = 2
    assert dash.error.startswith("unexpected ZeroDivisionError")
    dash.controls["x"].value = 3
    assert dash.error is None and dash.charts["c"].spec["data"]["values"] == [{"a": 3}]


def test_quiz_checks_against_the_live_answer():
    quiz = widgets.Quiz("Which is larger?", ["a", "b"], "b", "because b.")
    assert quiz.check() is False and "Pick" in quiz.feedback.value
    assert quiz.check("a") is False and "Not quite" in quiz.feedback.value and "because b." in quiz.feedback.value
    quiz.choice.value = "b"
    quiz.button.click()
    assert "Right" in quiz.feedback.value
    with pytest.raises(widgets.SnlabError, match="answer"):
        widgets.Quiz("?", ["a"], "c")


def test_serving_dashboard():
    dash = widgets.serving_dashboard(prompt_len=32768, batch=8)
    assert set(dash.charts) == {"kv", "speed"}
    before, after = _move(dash, "prompt_len", 1048576)
    assert after["kv"]["layer"][0]["data"] != before["kv"]["layer"][0]["data"]
    parts = {v["part"] for v in after["kv"]["layer"][0]["data"]["values"]}
    assert "KV cache in the pool" in parts          # a million tokens spill beyond HBM on the supernode
    before, after = _move(dash, "kv_offload", "hbm")
    assert dash.error is None and "does not fit" in dash.summary.value
    dash.controls["kv_offload"].value = "auto"
    dash.controls["model"].value = "llama3-8b"      # 8 key/value heads: tp = 16 is fine, a multiple
    assert dash.error is None


def test_planner_dashboard():
    dash = widgets.planner_dashboard()
    before, after = _move(dash, "tokens", 1e13)
    assert after["days"]["data"] != before["days"]["data"]
    days = {v["system"]: v["metric"] for v in after["days"]["data"]["values"]}
    old = {v["system"]: v["metric"] for v in before["days"]["data"]["values"]}
    assert all(days[s] == pytest.approx(old[s] * 1e13 / 2e12) for s in days)   # same plans, 5x the tokens
    dash.controls["model"].value = "megatron-1t"
    dash.controls["devices"].value = 64
    assert dash.error is not None and dash.error.startswith("plan:")
    dash.controls["devices"].value = 384
    assert dash.error is None


def test_power_dashboard():
    dash = widgets.power_dashboard(model="llama3-8b")
    assert set(dash.charts) == {"energy", "cost"}
    before, after = _move(dash, "kwh", 0.3)
    cost = {v["system"]: v["metric"] for v in after["cost"]["data"]["values"]}
    old = {v["system"]: v["metric"] for v in before["cost"]["data"]["values"]}
    assert all(cost[s] > old[s] for s in cost)                     # dearer electricity, dearer tokens
    assert after["energy"]["data"] == before["energy"]["data"]     # the same joules
    before, after = _move(dash, "pue", 2.0)
    energy = {v["system"]: v["metric"] for v in after["energy"]["data"]["values"]}
    assert all(energy[s] > v for s, v in {v["system"]: v["metric"] for v in before["energy"]["data"]["values"]}.items())
    before, after = _move(dash, "utilisation", 0.4)
    assert after["cost"]["data"] != before["cost"]["data"]
    dash.controls["cooling"].value = "air"
    assert dash.error is None and "gb200-nvl72" in dash.message.value      # it cannot run in air: said, not raised
    assert "gb200-nvl72" not in {v["system"] for v in dash.charts["energy"].chart.to_dict()["data"]["values"]}


@pytest.mark.parametrize("build", [widgets.training_dashboard, widgets.memory_dashboard, widgets.pipeline_dashboard,
                                   widgets.compute_dashboard, widgets.collective_dashboard, widgets.serving_dashboard,
                                   widgets.planner_dashboard, widgets.power_dashboard])
def test_every_slider_readout_is_short(build):
    """A readout longer than about eight characters is cut off beside a 330 px slider (2e12
    tokens read "2000000000000.0"); large numbers are shortened ("2T", "64k")."""
    dash = build()
    sliders = [c for c in dash.controls.values() if hasattr(c, "options") and hasattr(c, "readout")]
    assert any(isinstance(v, (int, float)) for s in sliders for v in s._options_values)
    for slider in sliders:
        numbers = [str(label) for label, value in zip(slider._options_labels, slider._options_values)
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and label == widgets._readout(value)]    # not a worded choice ("the cooling's")
        assert all(len(label) <= 8 for label in numbers), (slider.description, numbers)
    assert widgets._readout(2e12) == "2T" and widgets._readout(64e3) == "64k" and widgets._readout(16384) == "16384"
