"""Dashboards: ipywidgets controls that redraw Altair charts in place.

Each ``*_dashboard`` function builds and returns a :class:`Dashboard`. Moving a
control recomputes the numbers with the public API (:func:`snlab.search`,
:func:`snlab.sweep`, :func:`snlab.train`, the wall formulas) and hands new specs to
the same ``alt.JupyterChart`` widgets (``jchart.chart = new_chart``): the browser
keeps its views and only receives the new spec, instead of a new output per change.

A combination the model rejects (``tp`` that does not divide the heads, a model
that fits nowhere) raises :class:`~snlab.errors.SnlabError`; the dashboard shows its
one-line message above the charts, which keep the last valid picture. Tests drive a
dashboard without a browser: set ``dash.controls["micro_batch"].value`` and compare
``dash.charts["step"].chart.to_dict()`` before and after.
"""

from __future__ import annotations

from functools import partial

import functools
from dataclasses import dataclass
from html import escape
from typing import Callable

import altair as alt
import ipywidgets as W
import pandas as pd
from altair.utils.schemapi import debug_mode

from . import charts, compare, offline
from .errors import SnlabError
from .presets import device as load_device
from .presets import model as load_model
from .presets import system as load_system
from .units import fmt_bytes, fmt_seconds

offline.apply_env()

CLUSTER, SUPERNODE, SCALE_MODELS = compare.CLUSTER, compare.SUPERNODE, compare.SCALE_MODELS
EMBED = {"renderer": "svg", "actions": False}   # SVG: text in the DOM, comparable in browser tests


@dataclass
class View:
    """What a dashboard's render function returns: charts by name, a summary (HTML)
    and an optional note (shown in the message area, not as an error)."""

    charts: dict
    summary: str = ""
    note: str = ""


class Dashboard:
    """Controls, the charts they drive, a summary and a message area.

    ``controls`` maps names to ipywidgets; ``render(values) -> View`` computes the
    charts for the current values. ``charts`` maps the same names as the View to
    ``alt.JupyterChart`` widgets, created once. ``error`` holds the message of the last
    rejected combination (``None`` while the view is current); ``updates`` counts
    successful redraws. Display the dashboard itself (or ``dash.widget``).
    """

    def __init__(self, controls: dict, render: Callable[[dict], View], title: str = ""):
        self.controls = controls
        self.render = render
        self.title = title
        self.error: str | None = None
        self.updates = 0
        self.message = W.HTML(value="")
        self.message.add_class("snlab-message")
        self.summary = W.HTML(value="")
        view = self._render()                 # the defaults must work: a bad default raises here
        self.charts = {name: alt.JupyterChart(chart, embed_options=EMBED) for name, chart in view.charts.items()}
        self._show(view)
        for control in controls.values():
            control.observe(self._changed, names="value")
        head = [W.HTML(f"<b>{escape(title)}</b>")] if title else []
        items = list(controls.values())
        rows = [W.HBox(items[i:i + 3]) for i in range(0, len(items), 3)]
        body = W.HBox(list(self.charts.values()), layout=W.Layout(flex_flow="row wrap"))
        self.widget = W.VBox([*head, *rows, self.message, body, self.summary])
        self.widget.add_class("snlab-dashboard")

    def values(self) -> dict:
        """The controls' current values by name."""
        return {name: control.value for name, control in self.controls.items()}

    def _changed(self, change) -> None:
        self.update()

    def _render(self) -> View:
        # Altair validates every schema object as it is built and the whole spec again
        # when the JupyterChart serialises it; the second check is enough, and skipping
        # the first halves the cost of an update.
        with debug_mode(False):
            return self.render(self.values())

    def update(self) -> None:
        """Recompute and redraw; a rejected combination only sets the message."""
        try:
            view = self._render()
        except SnlabError as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # a bug must not leave a traceback in the view either
            self._fail(f"unexpected {type(exc).__name__}: {exc} (please report this as a bug in snlab)")
            return
        for name, chart in view.charts.items():
            # the JupyterChart serialises the chart with to_dict(), which validates the
            # whole spec against the Vega-Lite schema again: the chart builders' specs
            # are validated by the test suite, so the dashboards skip it on every move
            object.__setattr__(chart, "to_dict", partial(type(chart).to_dict, chart, validate=False))
            self.charts[name].chart = chart
        self._show(view)
        self.updates += 1

    def _show(self, view: View) -> None:
        self.error = None
        self.summary.value = view.summary
        self.message.value = (f"<div class='snlab-note' style='color:#555'>{escape(view.note)}</div>"
                              if view.note else "")

    def _fail(self, text: str) -> None:
        self.error = text
        self.message.value = ("<div class='snlab-error' style='color:#a61c00;font-weight:bold'>"
                              f"Not possible: {escape(text)}. The charts still show the last valid choice.</div>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


_SCALES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def _readout(option) -> str:
    """A slider's readout for one choice: large numbers shortened (2e12 -> "2T", 64000 ->
    "64k") so the readout fits beside its slider; anything else as ``str`` gives it."""
    if isinstance(option, bool) or not isinstance(option, (int, float)) or abs(option) < 1e4:
        return str(option)
    for scale, suffix in _SCALES:
        if abs(option) >= scale:
            short = option / scale
            if float(f"{short:.3g}") == short:
                return f"{short:g}{suffix}"
            break
    return str(option) if len(str(option)) <= 8 else f"{option:.3g}"


def _slider(description: str, options, value, css: str | None = None) -> W.SelectionSlider:
    options = [(_readout(o), o) for o in options]
    slider = W.SelectionSlider(options=options, value=value, description=description,
                               continuous_update=False, style={"description_width": "initial"},
                               layout=W.Layout(width="330px"))
    if css:
        slider.add_class(css)
    return slider


def _dropdown(description: str, options, value) -> W.Dropdown:
    return W.Dropdown(options=options, value=value, description=description,
                      style={"description_width": "initial"}, layout=W.Layout(width="400px"))


#: the system picker's "none" choice
NO_SYSTEM = "(none)"


def system_options() -> list[tuple[str, str]]:
    """Every shipped system as a picker choice, labelled with how its scale-up level is wired
    ("tpu-v5p-pod: torus 16x16x24 ..."), after a "none" choice."""
    from .presets import names
    return [("none", NO_SYSTEM)] + [(f"{n}: {load_system(n).scale_up.topology.describe()}", n) for n in names("system")]


def _picker(value: str = NO_SYSTEM) -> W.Dropdown:
    """A dropdown that adds any shipped system to a comparison."""
    picker = W.Dropdown(options=system_options(), value=value, description="compare with",
                        style={"description_width": "initial"}, layout=W.Layout(width="330px"))
    picker.add_class("snlab-system")
    return picker


def _with(systems: tuple, picked: str) -> tuple:
    """The dashboard's systems and the one picked (once)."""
    return systems if picked == NO_SYSTEM or picked in systems else (*systems, picked)


def _model_options(names) -> list[tuple[str, str]]:
    def size(n):
        b = load_model(n).params / 1e9
        return f"{b:.3g}" if b < 100 else f"{b:,.0f}"
    return [(f"{n} ({size(n)} billion parameters)", n) for n in names]


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th style='text-align:left;padding-right:1em'>{escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td style='padding-right:1em'>{escape(str(v))}</td>" for v in r.values())
                   + "</tr>" for r in rows)
    return f"<table class='snlab-summary'><tr>{head}</tr>{body}</table>"


def _records(frame: pd.DataFrame, columns) -> list[dict]:
    # to_dict on the few columns needed: itertuples over a sweep's ~70 columns is slow
    return frame[list(columns)].to_dict("records")


def _plan_text(r: dict) -> str:
    text = f"tp {r['tp']} x pp {r['pp']} x dp {r['dp']}"
    if r["cp"] > 1:
        text += f" x cp {r['cp']}"
    if r["ep"] > 1:
        text += f", ep {r['ep']}"
    return text + f", {r['recompute']} recompute, ZeRO {r['zero']}"


def _result_rows(frame: pd.DataFrame) -> list[dict]:
    cols = ("system", "tp", "pp", "dp", "cp", "ep", "recompute", "zero", "step_time_s", "mfu",
            "memory_total_bytes", "limited_by")
    return [{"system": r["system"], "plan": _plan_text(r), "step time": fmt_seconds(r["step_time_s"]),
             "MFU": f"{r['mfu']:.1%}", "memory per device": fmt_bytes(r["memory_total_bytes"]),
             "limited by": r["limited_by"]} for r in _records(frame, cols)]


# --- the central comparison: cluster against supernode -----------------------------------------

@functools.lru_cache(maxsize=512)
def best_plan(model: str, system: str, devices: int, global_batch: int, micro_batch: int,
              overlap: str) -> pd.DataFrame:
    """The fastest fitting plan (one row, possibly empty) for these fixed choices;
    cached, since dashboards revisit the same settings as sliders move back and forth."""
    from .training import search
    return search(model, system, devices=devices, global_batch=global_batch, top=1,
                  micro_batch=micro_batch, overlap=overlap)


def _best_frame(values: dict, systems) -> tuple[pd.DataFrame, list[str]]:
    rows, missing = [], []
    for s in systems:
        top = best_plan(values["model"], s, int(values["devices"]), int(values["global_batch"]),
                        int(values["micro_batch"]), values["overlap"])
        (rows.append(top) if len(top) else missing.append(s))
    if not rows:
        raise SnlabError("plan", f"{values['model']} fits on none of the systems with {values['devices']} devices, "
                         f"global batch {values['global_batch']} and micro-batch {values['micro_batch']}",
                         "more devices, a smaller micro-batch or a larger global batch")
    return pd.concat(rows, ignore_index=True), missing


def training_dashboard(model: str = "megatron-1t", systems=(CLUSTER, SUPERNODE), devices: int = 384,
                       global_batch: int = 768, micro_batch: int = 1, overlap: str = "standard",
                       compare_with: str = NO_SYSTEM) -> Dashboard:
    """Cluster against supernode for training: for each system the fastest plan that
    fits (parallel layout, recomputation, ZeRO and, on a torus pod, the slice chosen by
    :func:`snlab.search`) at the chosen model, devices, global batch [sequences],
    micro-batch [sequences] and overlap level; charts of where the step time goes and of
    MFU. ``compare_with`` (and the "compare with" picker) adds any shipped system: a full mesh,
    a torus pod, a larger NVLink rack."""
    systems = tuple(load_system(s).name for s in systems)
    models = list(dict.fromkeys([*SCALE_MODELS, load_model(model).name]))
    controls = {
        "model": _dropdown("model", _model_options(models), load_model(model).name),
        "devices": _slider("devices", sorted({64, 128, 256, 384, 512, 768, 1024, 1536, 3072, devices}), devices),
        "global_batch": _slider("global batch [sequences]",
                                sorted({256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, global_batch}), global_batch),
        "micro_batch": _slider("micro-batch [sequences]", [1, 2, 4, 8, 16], micro_batch, "snlab-micro-batch"),
        "overlap": _slider("overlap", charts.OVERLAP_ORDER, overlap, "snlab-overlap"),
        "compare": _picker(compare_with),
    }

    def render(v: dict) -> View:
        shown = _with(systems, v["compare"])
        frame, missing = _best_frame(v, shown)
        step = charts.step_breakdown(frame, by=("system",), sort=list(shown),
                                     title=f"{v['model']} on {v['devices']} devices: where the step goes")
        mfu = charts.metric_chart(frame, x="system", y="mfu", color="system", mark="bar", sort=list(shown),
                                  title="Model FLOPs utilisation", width=220)
        note = ("No plan fits on " + ", ".join(missing) + ".") if missing else ""
        return View({"step": step, "mfu": mfu}, _table(_result_rows(frame)), note)

    return Dashboard(controls, render, "Training: cluster against supernode (fastest plan that fits on each)")


# --- pipelines and micro-batches --------------------------------------------------------------

MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


def pipeline_dashboard(model: str = "llama3-70b", systems=(CLUSTER, SUPERNODE), seq_len: int = 4096,
                       tp: int = 8, pp: int = 8, dp: int = 4, global_batch: int = 512,
                       overlap: str = "standard") -> Dashboard:
    """The same plan on each system across micro-batch sizes [sequences]: step time
    and its parts, to see where the bubble stops paying for smaller micro-batches."""
    systems = tuple(load_system(s).name for s in systems)
    controls = {
        "model": _dropdown("model", _model_options(SCALE_MODELS[1:]), load_model(model).name),
        "seq_len": _slider("sequence [tokens]", [256, 512, 1024, 2048, 4096, 8192], seq_len),
        "tp": _slider("tp", [1, 2, 4, 8, 16], tp),
        "pp": _slider("pp", [1, 2, 4, 8, 16, 32, 64], pp, "snlab-pp"),
        "dp": _slider("dp", [1, 2, 4, 8, 16, 32], dp),
        "global_batch": _slider("global batch [sequences]", [128, 256, 512, 1024, 2048, 4096], global_batch),
        "overlap": _slider("overlap", charts.OVERLAP_ORDER, overlap),
    }

    def render(v: dict) -> View:
        from .training import sweep, train
        plan = dict(tp=v["tp"], pp=v["pp"], dp=v["dp"], global_batch=v["global_batch"], seq_len=v["seq_len"],
                    overlap=v["overlap"], recompute="selective")
        frame = sweep(v["model"], list(systems), micro_batch=list(MICRO_BATCHES), **plan)
        frame = frame[frame["valid"]]
        if frame.empty:
            train(v["model"], systems[0], micro_batch=1, **plan)     # raises the rule it breaks, with details
            raise SnlabError("global_batch", f"{v['global_batch']} sequences leave no micro-batch size",
                             "a multiple of micro_batch x dp")
        line = charts.metric_chart(frame, x="micro_batch", y="step_time_s", title="Step time by micro-batch")
        bars = charts.step_breakdown(frame, by=("system", "micro_batch"), normalize=True,
                                     title="Share of the step by part")
        rows = []
        for s in systems:
            ok = frame[(frame["system"] == s) & frame["fits"]]
            if len(ok):
                best = ok.loc[ok["step_time_s"].idxmin()]
                rows.append({"system": s, "best micro-batch": int(best.micro_batch),
                             "step time": fmt_seconds(best.step_time_s), "MFU": f"{best.mfu:.1%}",
                             "bubble": f"{best.bubble_fraction:.1%} of ideal"})
        note = "" if len(rows) == len(systems) else "Some systems fit no micro-batch size (crosses: does not fit)."
        return View({"line": line, "parts": bars}, _table(rows), note)

    return Dashboard(controls, render, "Pipelines: bubble against per-micro-batch costs")


# --- the memory wall --------------------------------------------------------------------------

def memory_dashboard(model: str = "llama3-70b", system: str = "dgx-h100", tp: int = 8, pp: int = 4, dp: int = 8,
                     micro_batch: int = 1, recompute: str = "selective", offload: str = "none") -> Dashboard:
    """Memory per device [GB] of one plan under each ZeRO stage, against HBM capacity."""
    from .presets import names
    controls = {
        "model": _dropdown("model", _model_options([*SCALE_MODELS, "deepseek-v3"]), load_model(model).name),
        "system": _dropdown("system", names("system"), load_system(system).name),
        "tp": _slider("tp", [1, 2, 3, 4, 8, 16, 32], tp, "snlab-tp"),
        "pp": _slider("pp", [1, 2, 4, 8, 16, 32, 64], pp),
        "dp": _slider("dp", [1, 2, 4, 8, 16, 32, 64, 128], dp),
        "micro_batch": _slider("micro-batch [sequences]", [1, 2, 4, 8, 16], micro_batch),
        "recompute": W.ToggleButtons(options=["none", "selective", "full"], value=recompute,
                                     description="recompute"),
        "offload": W.ToggleButtons(options=["none", "optimizer", "activations", "both"], value=offload,
                                   description="offload"),
    }

    def render(v: dict) -> View:
        from .training import sweep, train
        plan = {k: v[k] for k in ("tp", "pp", "dp", "micro_batch", "recompute", "offload")}
        plan["global_batch"] = v["micro_batch"] * v["dp"] * max(4, v["pp"])
        frame = sweep(v["model"], v["system"], zero=[0, 1, 2, 3], **plan)
        if not frame["valid"].any():
            train(v["model"], v["system"], zero=0, **plan)           # raises the rule it breaks, with details
        chart = charts.memory_breakdown(frame, by=("zero",), title=f"{v['model']} on {v['system']}: memory per "
                                        "device by ZeRO stage")
        cols = ("zero", "memory_total_bytes", "memory_capacity_bytes", "fits", "reason", "valid")
        rows = [{"ZeRO": int(r["zero"]), "total": fmt_bytes(r["memory_total_bytes"]),
                 "capacity": fmt_bytes(r["memory_capacity_bytes"]), "verdict": "fits" if r["fits"] else str(r["reason"])}
                for r in _records(frame, cols) if r["valid"]]
        note = "ZeRO 3 is not shown: it cannot be combined with pipeline parallelism." if not frame["valid"].all() else ""
        return View({"memory": chart}, _table(rows), note)

    return Dashboard(controls, render, "Memory: what one device must hold")


# --- the compute wall -------------------------------------------------------------------------

def compute_dashboard(device: str = "a100-pcie-80gb", model: str = "llama3-70b", tokens: int = 16,
                      sustained_clock: float = 1.0) -> Dashboard:
    """Roofline of a device with one layer-sized GEMM (tokens x h by h x h) on it:
    few tokens per micro-batch or per decode step make it memory-bound."""
    from .presets import names
    controls = {
        "device": _dropdown("device", names("device"), load_device(device).name),
        "model": _dropdown("hidden size from", _model_options(SCALE_MODELS), load_model(model).name),
        "tokens": _slider("tokens in the GEMM (M)", [2 ** i for i in range(17)], tokens, "snlab-tokens"),
        "clock": W.FloatSlider(value=sustained_clock, min=0.5, max=1.0, step=0.05, description="sustained clock",
                               continuous_update=False, style={"description_width": "initial"}),
    }

    def render(v: dict) -> View:
        d = load_device(v["device"])
        h = load_model(v["model"]).hidden_size
        sweep_m = [2 ** i for i in range(0, 17, 2)]
        gemms = charts.gemm_frame(d, sorted({*sweep_m, v["tokens"]}), h, h, sustained_clock=v["clock"])
        chart = charts.roofline([d], gemms=gemms, sustained_clock=v["clock"], highlight=v["tokens"],
                                title=f"{d.name}: GEMM of M tokens x {h} by {h} x {h}")
        row = gemms[gemms["tokens"] == v["tokens"]].iloc[0]
        peak = d.peak("bf16") * v["clock"] / 1e12
        summary = _table([{"tokens M": int(row.tokens), "intensity": f"{row.intensity:.3g} FLOP/byte",
                           "attainable": f"{row.tflops:.4g} TFLOP/s", "of derated peak": f"{row.tflops / peak:.0%}",
                           "time": f"{row.time_us:.3g} µs", "verdict": row.bound}])
        return View({"roofline": chart}, summary)

    return Dashboard(controls, render, "Compute: the roofline")


# --- the communication wall -------------------------------------------------------------------

def collective_dashboard(systems=(CLUSTER, "dgx-h100", SUPERNODE), collective: str = "all-reduce",
                         group_size: int = 16, message_bytes: float = 64e3, compare_with: str = NO_SYSTEM) -> Dashboard:
    """Time of one collective against message size on each system, and at one size, with
    the algorithm each is priced with; ``compare_with`` (the "compare with" picker) adds any
    shipped system (a full mesh, a torus pod, an n-dimensional mesh)."""
    systems = tuple(load_system(s).name for s in systems)
    sizes = [10 ** k for k in range(2, 11)]
    controls = {
        "collective": _dropdown("collective", list(charts.COLLECTIVES), collective),
        "group_size": _slider("devices in the group", [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], group_size,
                              "snlab-group"),
        "message": _slider("message [bytes]", sizes, min(sizes, key=lambda s: abs(s - message_bytes))),
        "levels": W.Checkbox(value=False, description="show each level alone"),
        "compare": _picker(compare_with),
    }

    def render(v: dict) -> View:
        from .network import collective as priced
        shown = _with(systems, v["compare"])
        chart = charts.collective_time(shown, v["collective"], int(v["group_size"]), levels=v["levels"])
        at = charts.collective_frame(shown, v["collective"], int(v["group_size"]), sizes=[v["message"]],
                                     levels=False)
        op = "all-reduce" if v["collective"] == "point-to-point" else v["collective"]
        rows = []
        for r in at.to_dict("records"):
            c = priced(r["system"], op, float(v["message"]), int(v["group_size"]))
            rows.append({"system": r["system"], "time": fmt_seconds(r["time_us"] * 1e-6),
                         "algorithm bandwidth": f"{r['bandwidth_gbs']:.3g} GB/s",
                         "algorithm": "one message" if v["collective"] == "point-to-point" else c.algorithm,
                         "where the group sits": c.placement})
        return View({"collective": chart}, _table(rows))

    return Dashboard(controls, render, "Communication: collectives on each system")


# --- serving --------------------------------------------------------------------------------------

SERVING_SYSTEMS = (CLUSTER, "dgx-h100", SUPERNODE)


def serving_dashboard(model: str = "llama3-70b", systems=SERVING_SYSTEMS, prompt_len: int = 131072,
                      batch: int = 8, tp: int = 8, output_len: int = 1000, kv_offload: str = "auto",
                      compare_with: str = NO_SYSTEM) -> Dashboard:
    """Long-context serving on each system: where the KV cache lives (HBM, the
    supernode's pool, host DRAM, SSD) and what that does to decode speed;
    ``compare_with`` (the "compare with" picker) adds any shipped system."""
    systems = tuple(load_system(s).name for s in systems)
    contexts = [4096, 16384, 32768, 131072, 262144, 524288, 1048576]
    controls = {
        "model": _dropdown("model", _model_options(["llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v3"]),
                           load_model(model).name),
        "prompt_len": _slider("prompt [tokens]", sorted({*contexts, prompt_len}), prompt_len, "snlab-context"),
        "batch": _slider("batch [sequences]", sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, batch}), batch),
        "tp": _slider("tp", [1, 2, 4, 8, 16], tp),
        "kv_offload": W.ToggleButtons(options=[("spill to other tiers", "auto"), ("HBM only", "hbm")],
                                      value=kv_offload, description="KV cache"),
        "compare": _picker(compare_with),
    }

    def render(v: dict) -> View:
        from .serving import serve, serve_sweep
        shown = _with(systems, v["compare"])
        dep = dict(tp=v["tp"], batch=v["batch"], prompt_len=v["prompt_len"], output_len=output_len,
                   kv_offload=v["kv_offload"])
        frame = serve_sweep(v["model"], list(shown), **dep)
        if not frame["valid"].any():
            serve(v["model"], shown[0], **dep)           # raises the rule it breaks, with details
        kv = charts.kv_placement(frame, title=f"{v['model']}: {v['batch']} x {v['prompt_len']:,} tokens of context")
        speed = charts.metric_chart(frame, x="system", y="decode_tokens_per_s_per_device", mark="bar",
                                    sort=list(shown), title="Decode throughput per device", width=240)
        cols = ("system", "ttft_s", "tpot_s", "decode_tokens_per_s_per_device", "kv_location", "max_batch", "fits",
                "reason")
        rows = [{"system": r["system"], "first token": fmt_seconds(r["ttft_s"]),
                 "per output token": fmt_seconds(r["tpot_s"]),
                 "tokens/s per device": f"{r['decode_tokens_per_s_per_device']:,.1f}",
                 "KV cache lives in": r["kv_location"], "largest batch": f"{int(r['max_batch']):,}",
                 "verdict": "fits" if r["fits"] else str(r["reason"])} for r in _records(frame, cols)]
        return View({"kv": kv, "speed": speed}, _table(rows))

    return Dashboard(controls, render, "Serving: long contexts and where their KV cache lives")


# --- the planner --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=128)
def _plans(model: str, systems: tuple, devices: int, global_batch: int) -> pd.DataFrame:
    return compare.best_plans([model], systems, devices, global_batch)


def planner_dashboard(model: str = "llama3-70b", systems=(CLUSTER, SUPERNODE), tokens: float = 2e12,
                      devices: int = 384, global_batch: int = 768, compare_with: str = NO_SYSTEM) -> Dashboard:
    """Size a training job: time to train [days] and device-hours on each system, with
    the fastest plan that fits; ``compare_with`` (the "compare with" picker) adds any shipped
    system."""
    systems = tuple(load_system(s).name for s in systems)
    controls = {
        "model": _dropdown("model", _model_options([*SCALE_MODELS, "deepseek-v3"]), load_model(model).name),
        "tokens": _slider("training tokens", [1e11, 3e11, 1e12, 2e12, 5e12, 1e13, 1.5e13], tokens),
        "devices": _slider("devices", sorted({64, 128, 256, 384, 768, 1536, 3072, devices}), devices),
        "global_batch": _slider("global batch [sequences]", [256, 512, 768, 1024, 2048, 4096], global_batch),
        "compare": _picker(compare_with),
    }

    def render(v: dict) -> View:
        shown = _with(systems, v["compare"])
        frame = compare.with_job(_plans(v["model"], shown, int(v["devices"]), int(v["global_batch"])), v["tokens"])
        days = charts.metric_chart(frame, x="system", y="train_days", mark="bar", sort=list(shown),
                                   title=f"{v['model']}: {v['tokens'] / 1e12:g}T tokens on {v['devices']} devices",
                                   width=240)
        rows = [{**row, "time to train": f"{d:.3g} days", "device-hours": f"{h:,.0f}"}
                for row, d, h in zip(_result_rows(frame), frame["train_days"], frame["device_hours"])]
        missing = frame.attrs.get("no_plan", [])
        note = ("No plan fits on " + ", ".join(s for _, s in missing) + ".") if missing else ""
        return View({"days": days}, _table(rows), note)

    return Dashboard(controls, render, "Planner: how long, on what")


# --- co-design -------------------------------------------------------------------------------------

def codesign_dashboard(model: str = "megatron-1t", global_batch: int = 768) -> Dashboard:
    """The fabric one would build for a model on 384 of the cluster's A100s: every design of
    :func:`snlab.codesign.designs` at its best plan, the base cluster ringed; the summary
    names the best design, its gain and what each axis buys alone."""
    from . import codesign
    controls = {
        "model": _dropdown("model", _model_options(SCALE_MODELS), load_model(model).name),
        "global_batch": _slider("global batch [sequences]", [384, 768, 1536, 3072], global_batch),
    }

    def render(v: dict) -> View:
        table = codesign.designs(v["model"], global_batch=int(v["global_batch"]))
        parts = codesign.alone(table)
        best = table.loc[table["gain"].idxmax()]
        chart = charts.design_chart(table, title=f"{v['model']} on 384 A100s: each design at its best plan")
        rows = [{"design": "best of the grid",
                 "devices on one bus": f"{int(best['scale_up_domain_size'])}",
                 "bandwidth": f"{best['scale_up_bandwidth'] / 1e9:.0f} GB/s",
                 "HBM": f"{best['hbm_capacity'] / 1e9:.0f} GB",
                 "over the cluster": f"{best['gain']:.2f}x"},
                {"design": "each alone", "devices on one bus": f"{parts['scale_up_domain_size']:.2f}x",
                 "bandwidth": f"{parts['scale_up_bandwidth']:.2f}x", "HBM": f"{parts['hbm_capacity']:.2f}x",
                 "over the cluster": ""}]
        missing = int((~table["fits"]).sum())
        note = f"No plan fits on {missing} of {len(table)} designs." if missing else ""
        return View({"designs": chart}, _table(rows), note)

    return Dashboard(controls, render, "Co-design: the fabric to build")


# --- power, cooling and cost ---------------------------------------------------------------------

POWER_SYSTEMS, POWER_WORKLOAD, power_tp = compare.POWER_SYSTEMS, compare.POWER_WORKLOAD, compare.power_tp


@functools.lru_cache(maxsize=128)
def _best_batch(model: str, system: str, cooling: str | None) -> int:
    """The batch with the best throughput per device under the workload's time-per-token target."""
    from .serving import serve_best
    return serve_best(model, system, tp=power_tp(model, system), cooling=cooling, **POWER_WORKLOAD).deployment["batch"]



def power_frame(results: dict) -> pd.DataFrame:
    """Serving or training results by system as rows with the sweep's power column names,
    for charts: energy per token (facility and devices), cost per million tokens (NaN
    without prices), power per device, the cooling, its PUE and the devices' clock."""
    rows = [{"system": name, "energy_per_token_j": r.energy_per_token_j,
             "device_energy_per_token_j": r.power["device_energy_per_token_j"],
             "cost_per_million_tokens_usd": float("nan") if r.cost_per_million_tokens_usd is None
             else r.cost_per_million_tokens_usd,
             "device_power_w": r.device_power_w, "cooling": r.cooling, "pue": r.power["pue"],
             "clock": r.power["sustained_clock"]} for name, r in results.items()]
    return pd.DataFrame(rows)


def power_dashboard(model: str = "llama3-70b", systems=POWER_SYSTEMS, cooling: str = "as built", kwh: float = 0.08,
                    pue: float | None = None, utilisation: float = 1.0, years: float = 4.0) -> Dashboard:
    """Serving a chat workload on each system: facility energy [J] and cost [$] per
    output token at the best batch under 50 ms per token, with the devices bought at the
    dated example prices (snlab.energy.example_prices) and written off over ``years``.
    Sliders: the kWh price, the PUE (or the cooling's), the cooling, and the share of
    the paid hours the devices serve."""
    from .energy import Prices, example_prices
    systems = tuple(load_system(s).name for s in systems)
    # 0 stands for the cooling's own PUE (a selection slider has no empty value)
    pues = [("the cooling's", 0.0), *[(f"{x:.2f}", x) for x in (1.05, 1.1, 1.2, 1.3, 1.4, 1.56, 1.8, 2.0)]]
    controls = {
        "model": _dropdown("model", _model_options(["llama3.2-1b", "llama3-8b", "llama3-70b"]), load_model(model).name),
        "cooling": W.ToggleButtons(options=["as built", "air", "liquid"], value=cooling, description="cooling"),
        "kwh": _slider("electricity [$/kWh]", sorted({0.03, 0.05, 0.08, 0.12, 0.2, 0.3, kwh}), kwh),
        "pue": W.SelectionSlider(options=pues, value=pue or 0.0, description="PUE", continuous_update=False,
                                 style={"description_width": "initial"}),
        "utilisation": _slider("hours used", [0.2, 0.4, 0.6, 0.8, 1.0], utilisation),
    }

    def render(v: dict) -> View:
        from .serving import serve
        cooling_kind = None if v["cooling"] == "as built" else v["cooling"]
        results, skipped = {}, []
        for name in systems:
            try:
                batch = _best_batch(v["model"], name, cooling_kind)
                base = example_prices(name, rent=False)
                prices = Prices(capex=base.capex, years=years, kwh=v["kwh"], utilisation=v["utilisation"])
                r = serve(v["model"], name, tp=power_tp(v["model"], name), batch=batch, cooling=cooling_kind,
                          pue=v["pue"] or None, prices=prices, prompt_len=POWER_WORKLOAD["prompt_len"],
                          output_len=POWER_WORKLOAD["output_len"])
            except SnlabError as exc:
                skipped.append(f"{name}: {exc.problem}")
                continue
            results[name] = r
        if not results:
            raise SnlabError("cooling", "no system runs under this cooling: " + "; ".join(skipped), "another cooling")
        frame = power_frame(results)
        frame["batch"] = [r.deployment["batch"] for r in results.values()]
        rows = frame.to_dict("records")
        order = list(results)
        energy = charts.metric_chart(frame, x="system", y="energy_per_token_j", mark="bar", sort=order,
                                     title=f"{v['model']}: facility energy per output token", width=240)
        cost = charts.metric_chart(frame, x="system", y="cost_per_million_tokens_usd", mark="bar", sort=order,
                                   title="Cost per million output tokens", width=240)
        table = [{"system": r["system"], "cooling": f"{r['cooling']} (PUE {r['pue']:.2f}, clock {r['clock']:.2f})",
                  "batch": f"{r['batch']:,}", "power per device": f"{r['device_power_w']:,.0f} W",
                  "J per token": f"{r['energy_per_token_j']:.3g}",
                  "$ per million tokens": f"{r['cost_per_million_tokens_usd']:.3g}"} for r in rows]
        note = ("Cannot run: " + "; ".join(skipped) + ".") if skipped else ""
        return View({"energy": energy, "cost": cost}, _table(table), note)

    return Dashboard(controls, render, "Power and cost: per token, per watt, per dollar")


# --- predict, then check ------------------------------------------------------------------------

class Quiz:
    """A "predict, then check" question: pick an answer, press *Check*, compare with
    what the model computes. ``answer`` must be computed live from snlab, so the quiz
    follows the model; ``check(choice)`` does the same from code (and returns whether
    the choice was right)."""

    def __init__(self, question: str, options, answer, explanation: str = ""):
        options = list(options)
        if answer not in options:
            raise SnlabError("answer", f"{answer!r} is not one of the options", ", ".join(map(str, options)))
        self.question, self.options, self.answer, self.explanation = question, options, answer, explanation
        self.choice = W.RadioButtons(options=options, value=None, layout=W.Layout(width="auto"))
        self.button = W.Button(description="Check", button_style="info")
        self.feedback = W.HTML(value="")
        self.button.on_click(lambda _: self.check())
        self.widget = W.VBox([W.HTML(f"<b>Predict:</b> {escape(question)}"), self.choice, self.button,
                              self.feedback])
        self.widget.add_class("snlab-quiz")

    def check(self, choice=None) -> bool:
        if choice is not None:
            self.choice.value = choice
        if self.choice.value is None:
            self.feedback.value = "<i>Pick an answer first.</i>"
            return False
        right = self.choice.value == self.answer
        verdict = ("<b style='color:#38761d'>Right.</b>" if right else
                   f"<b style='color:#a61c00'>Not quite:</b> the model says <b>{escape(str(self.answer))}</b>.")
        self.feedback.value = f"{verdict} {escape(self.explanation)}"
        return right

    def html(self) -> str:
        """The question for a page without a kernel: the options, and the answer behind a
        click (an HTML details element), as the static lessons show it."""
        items = "".join(f"<li>{escape(str(o))}</li>" for o in self.options)
        return (f"<div class='snlab-quiz-static'><p><b>Predict:</b> {escape(self.question)}</p><ol>{items}</ol>"
                f"<details><summary>Check your answer</summary><p>The model says <b>{escape(str(self.answer))}"
                f"</b>. {escape(self.explanation)}</p></details></div>")

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/html"] = self.html()
        data["text/plain"] = f"Predict: {self.question}"
        return bundle


def quiz(key: str) -> Quiz:
    """The "predict, then check" question ``key`` of a lesson (:mod:`snlab.lessons`), its
    answer and explanation computed from the model and shown only after Check."""
    from . import lessons
    q = lessons.question(key)
    quiz_ = Quiz(q.question, q.options, q.answer, q.explanation)
    quiz_.widget.add_class(f"snlab-quiz-{key}")
    return quiz_
