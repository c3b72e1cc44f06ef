"""Charts without internet, whatever starts Jupyter.

Altair's charts load their JavaScript (Vega, Vega-Lite, vega-embed) from a CDN by
default; in a workshop room without internet that shows "Error loading script" or a
blank chart. snlab therefore renders every chart from the JavaScript bundled in
``vl-convert-python`` (a dependency of snlab) as soon as :mod:`snlab.charts` or
:mod:`snlab.widgets` is imported in a Jupyter kernel: nothing to set, whether the lab was
started by ``make lab``, a plain ``jupyter lab``, VS Code, a JupyterHub or Voila.

* ``SNLAB_OFFLINE=0`` (or ``false``, ``no``, ``off``) in the environment keeps the CDN;
* :func:`enable_offline` switches either way at run time (``snlab.charts.enable_offline``).

Both :class:`altair.JupyterChart` (the widget the dashboards update in place) and
Altair's default renderer (charts displayed directly) switch. The cost is about 0.9 MB of
JavaScript per chart sent to the browser, and building the bundle (about 2 s, once per
vl-convert and Altair version: it is cached on disk under ``$XDG_CACHE_HOME/snlab`` or
``~/.cache/snlab``). Outside a kernel (a script, the CLI) nothing is switched: nothing
is displayed there, and files are written offline anyway (:func:`snlab.charts.save`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

from .files import write_text

ENV = "SNLAB_OFFLINE"
_FALSE = {"0", "false", "no", "off"}
_state = {"offline": False}


def requested() -> bool:
    """Whether charts should be offline: yes unless ``SNLAB_OFFLINE`` says no."""
    return os.environ.get(ENV, "").strip().lower() not in _FALSE


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def is_offline() -> bool:
    """Whether :func:`enable_offline` is in force in this process."""
    return _state["offline"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "snlab"


def _bundle_jupyterchart() -> None:
    """``alt.JupyterChart.enable_offline()``, with its bundle cached on disk.

    Altair builds the bundle with vl-convert on every call (about 2 s per kernel);
    the result depends only on Altair's widget source and the vl-convert version, so
    it is keyed on both and reused. Any problem with the cache falls back to Altair.
    """
    import altair as alt
    from altair.jupyter import jupyter_chart

    if getattr(alt.JupyterChart, "_is_offline", False):
        return
    if not hasattr(alt.JupyterChart, "_esm"):          # an Altair that keeps its bundle elsewhere
        alt.JupyterChart.enable_offline(True)
        return
    try:
        import vl_convert
        key = hashlib.sha256((jupyter_chart.load_js_src() + vl_convert.__version__ + alt.__version__).encode())
        path = _cache_dir() / f"jupyterchart-{key.hexdigest()[:16]}.js"
        if path.is_file() and path.stat().st_size > 100_000:
            alt.JupyterChart._esm = path.read_text(encoding="utf-8")
            alt.JupyterChart._is_offline = True
            return
        alt.JupyterChart.enable_offline(True)
        write_text(path, alt.JupyterChart._esm)
    except OSError:
        alt.JupyterChart.enable_offline(True)


def enable_offline(offline: bool = True) -> None:
    """Render every Altair chart from bundled JavaScript (``offline=True``) or from the
    CDN again (``offline=False``). Without ``vl-convert-python`` (installed with snlab;
    missing only if snlab was installed without its dependencies) the charts stay on the
    CDN, with a warning that says so."""
    import altair as alt
    if offline:
        try:
            import vl_convert  # noqa: F401
        except ImportError:
            warnings.warn("snlab: vl-convert-python is not installed, so charts load their JavaScript from "
                          "the CDN and need internet; `pip install vl-convert-python` makes them work offline",
                          stacklevel=2)
            return
        _bundle_jupyterchart()
        # charts shown directly (not in a dashboard) go through the same widget
        alt.renderers.enable("jupyter", offline=True)
    else:
        alt.JupyterChart.enable_offline(False)
        alt.renderers.enable("default")
    _state["offline"] = offline


def apply_env() -> None:
    """In a Jupyter kernel, switch to offline charts unless ``SNLAB_OFFLINE`` says no
    (called on import of :mod:`snlab.charts` and :mod:`snlab.widgets`)."""
    if requested() and not is_offline() and in_kernel():
        enable_offline(True)
