"""The lessons as a static web site: executed, charts included, readable without a kernel.

Runs each notebook on a fresh kernel, then replaces every widget output (a dashboard, a
chart) by a snapshot of it as it was drawn: each chart as an SVG image (exported by
vl-convert from the chart's own Vega-Lite spec, offline), each control as its label and
value, each message as its text. The pages need no JavaScript to show their charts, so
they read the same with or without internet (formulas are typeset by MathJax from its
CDN when there is one, and show as LaTeX source when there is not).

    .venv/bin/python notebooks/build_site.py --out site          # every lesson
    .venv/bin/python notebooks/build_site.py --out site notebooks/01-compute-wall.ipynb

``make site`` runs the first form and writes ``site/index.html`` with the lessons in order.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

import nbformat

from snlab.files import interruptible, write_text

HERE = Path(__file__).resolve().parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: controls shown as "label: value" in a snapshot
CONTROLS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "SelectionSliderModel", "DropdownModel",
            "RadioButtonsModel", "ToggleButtonsModel", "CheckboxModel", "IntTextModel", "FloatTextModel",
            "BoundedIntTextModel", "BoundedFloatTextModel", "TextModel", "SelectModel", "IntRangeSliderModel",
            "FloatRangeSliderModel", "ToggleButtonModel", "SelectMultipleModel", "SelectionRangeSliderModel"}
BOXES = {"VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel", "StackModel"}


def execute(path: Path):
    """The notebook run top to bottom on a fresh kernel, with its widgets' state."""
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def _model_id(ref) -> str | None:
    return ref[len("IPY_MODEL_"):] if isinstance(ref, str) and ref.startswith("IPY_MODEL_") else None


def _value_text(model: dict) -> str:
    state = model["state"]
    value = state.get("value")
    if model["model_name"] in ("SelectionSliderModel", "DropdownModel", "RadioButtonsModel", "ToggleButtonsModel",
                               "SelectModel"):
        labels = state.get("_options_labels") or []
        index = state.get("index")
        value = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else value
    if isinstance(value, float):
        value = f"{value:g}"
    return str(value)


def chart_svg(spec: dict) -> str:
    """A chart's Vega-Lite spec as an SVG image (vl-convert, offline)."""
    import vl_convert
    svg = vl_convert.vegalite_to_svg(spec)
    return re.sub(r"^<\?xml[^>]*>\s*", "", svg)


def snapshot(model_id: str, models: dict, depth: int = 0) -> str:
    """HTML for one widget as it was last drawn: boxes laid out, charts as SVG."""
    model = models.get(model_id)
    if model is None or depth > 50:
        return ""
    name, state = model["model_name"], model["state"]
    if name == "AnyModel" and isinstance(state.get("spec"), dict):
        return f"<div class='snlab-chart'>{chart_svg(state['spec'])}</div>"
    if name in BOXES:
        parts = [snapshot(_model_id(c), models, depth + 1) for c in state.get("children", [])]
        direction = "row" if name == "HBoxModel" else "column"
        return (f"<div class='snlab-box' style='display:flex;flex-direction:{direction};gap:0.5em;"
                f"flex-wrap:wrap'>{''.join(p for p in parts if p)}</div>")
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{state.get('value', '')}</div>"
    if name == "LabelModel":
        return f"<div>{html.escape(str(state.get('value', '')))}</div>"
    if name in CONTROLS:
        label = html.escape(str(state.get("description") or "").rstrip(":"))
        return (f"<div class='snlab-control'><b>{label}</b>{': ' if label else ''}"
                f"{html.escape(_value_text(model))}</div>")
    if name == "OutputModel":
        return "".join(_output_html(o) for o in state.get("outputs", []))
    return ""


def _output_html(output: dict) -> str:
    data = output.get("data", {})
    if "text/html" in data:
        return "".join(data["text/html"]) if isinstance(data["text/html"], list) else data["text/html"]
    if "text/plain" in data:
        return f"<pre>{html.escape(str(data['text/plain']))}</pre>"
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(str(output.get('text', '')))}</pre>"
    return ""


def make_static(nb):
    """Replace every widget output of an executed notebook by its snapshot and drop the
    widget state, so that the page needs no widget JavaScript."""
    models = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            # links from lesson to lesson point at their pages
            cell.source = re.sub(r"\(((?:\.\./notebooks/|notebooks/)?)(\d\d-[\w-]+)\.ipynb\)", r"(\2.html)",
                                 cell.source)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            quiz = data.get("text/html", "")
            if WIDGET_VIEW in data and "snlab-quiz-static" in ("".join(quiz) if isinstance(quiz, list) else quiz):
                # a question: its options and the answer behind a click, not the live control
                output["data"] = {"text/html": quiz}
                continue
            if WIDGET_VIEW in data:
                view = data[WIDGET_VIEW]
                model_id = view.get("model_id") if isinstance(view, dict) else None
                body = snapshot(model_id, models) if model_id else ""
                output["data"] = {"text/html": body or "<p><i>(an interactive control: open the lesson in "
                                                       "JupyterLab to use it)</i></p>"}
    nb.metadata.pop("widgets", None)
    return nb


def title_of(nb, path: Path) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return path.stem


def to_html(nb) -> str:
    from nbconvert import HTMLExporter
    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(nb)
    return body


def index_page(pages: list[tuple[str, str]]) -> str:
    items = "\n".join(f"<li><a href='{html.escape(href)}'>{html.escape(title)}</a></li>" for href, title in pages)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>SuperNode Lab: the lessons</title></head>"
            "<body style='font-family:sans-serif;max-width:50em;margin:2em auto'>"
            "<h1>SuperNode Lab: the lessons</h1>"
            "<p>Each lesson as it runs, with its charts as drawn by the default settings. To move the "
            "sliders, open the lessons in JupyterLab (<code>make lab</code> or the Binder link).</p>"
            f"<ol>\n{items}\n</ol></body></html>")


def build(paths: list[Path], out: Path) -> list[Path]:
    """Write one page per notebook and the index into ``out``; return the pages."""
    out.mkdir(parents=True, exist_ok=True)
    pages, written = [], []
    for path in paths:
        nb = make_static(execute(path))
        page = out / f"{path.stem}.html"
        write_text(page, to_html(nb))
        pages.append((page.name, title_of(nb, path)))
        written.append(page)
        print(f"site: wrote {page}")
    write_text(out / "index.html", index_page(pages))
    write_text(out / "lessons.json", json.dumps([{"page": p, "title": t} for p, t in pages], indent=1))
    print(f"site: wrote {out / 'index.html'}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("site"), help="output folder (default: site)")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every lesson, in order)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(HERE.glob("[0-9][0-9]-*.ipynb"))
    build(paths, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(interruptible(main, "make site")())
