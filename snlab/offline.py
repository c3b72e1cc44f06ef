"""Charts without internet: the offline switch.

By default Altair's charts load their JavaScript (Vega, Vega-Lite, vega-embed) from a
CDN when a notebook shows them. In a workshop room without internet that shows
"Error loading script" or a blank chart. The switch below makes every chart
self-contained, using the JavaScript bundled in the ``vl-convert-python`` package:

* set the environment variable ``SNLAB_OFFLINE=1`` before starting Jupyter (``make lab``
  and ``make test`` do), or
* call ``snlab.charts.enable_offline()`` (same as :func:`enable_offline`) at the top of
  a notebook, before the first chart.

Both switch :class:`altair.JupyterChart` (the widget the dashboards update in place)
and Altair's default renderer (charts displayed directly) to the bundled JavaScript.
The cost is about 0.9 MB of JavaScript per chart sent to the browser, and building
the bundle (about 2 s, once per vl-convert version: it is cached on disk under
``$XDG_CACHE_HOME/snlab`` or ``~/.cache/snlab``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENV = "SNLAB_OFFLINE"
_TRUE = {"1", "true", "yes", "on"}
_state = {"offline": False}


def requested() -> bool:
    """Whether the environment asks for offline charts (``SNLAB_OFFLINE=1``)."""
    return os.environ.get(ENV, "").strip().lower() in _TRUE


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
    try:
        import vl_convert
        key = hashlib.sha256((jupyter_chart.load_js_src() + vl_convert.__version__ + alt.__version__).encode())
        path = _cache_dir() / f"jupyterchart-{key.hexdigest()[:16]}.js"
        if path.is_file() and path.stat().st_size > 100_000:
            alt.JupyterChart._esm = path.read_text(encoding="utf-8")
            alt.JupyterChart._is_offline = True
            return
        alt.JupyterChart.enable_offline(True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(alt.JupyterChart._esm, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        alt.JupyterChart.enable_offline(True)


def enable_offline(offline: bool = True) -> None:
    """Render every Altair chart from bundled JavaScript (``offline=True``) or from the
    CDN again (``offline=False``). Needs ``vl-convert-python`` (the ``offline`` extra,
    installed by ``make setup`` and Binder)."""
    import altair as alt
    if offline:
        _bundle_jupyterchart()
        # charts shown directly (not in a dashboard) go through the same widget
        alt.renderers.enable("jupyter", offline=True)
    else:
        alt.JupyterChart.enable_offline(False)
        alt.renderers.enable("default")
    _state["offline"] = offline


def apply_env() -> None:
    """Switch to offline charts if ``SNLAB_OFFLINE`` asks for it (called on import of
    :mod:`snlab.charts` and :mod:`snlab.widgets`)."""
    if requested() and not is_offline():
        enable_offline(True)
