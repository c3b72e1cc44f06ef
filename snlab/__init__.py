"""snlab (SuperNode Lab): the compute, memory and communication walls of large-model
training and serving, as live formulas, on conventional clusters and supernodes.

Quick start::

    import snlab
    snlab.model("megatron-1t").params          # 1.008e12
    snlab.walls.communication.ring_all_reduce_time   # shows itself as LaTeX
    snlab.presets.names("system")

Heavy dependencies (pandas, altair, ipywidgets) are imported only when used.
"""

from __future__ import annotations

from importlib import import_module

from .errors import SnlabError, UnknownPresetError
from .presets import device, model, system
from .specs import Device, Model, System

__version__ = "0.1.0"

_LAZY = {
    "walls": "snlab.walls",
    "sizing": "snlab.sizing",
    "symbols": "snlab.symbols",
    "units": "snlab.units",
    "presets": "snlab.presets",
    "charts": "snlab.charts",
    "widgets": "snlab.widgets",
}


_LAZY_FUNCTIONS = {
    "train": "snlab.planner", "sweep": "snlab.planner", "search": "snlab.planner",
    "serve": "snlab.serve_planner", "serve_sweep": "snlab.serve_planner", "serve_best": "snlab.serve_planner",
}


def __getattr__(name: str):
    if name in _LAZY:
        return import_module(_LAZY[name])
    if name in _LAZY_FUNCTIONS:
        return getattr(import_module(_LAZY_FUNCTIONS[name]), name)
    if name == "formulas":
        return import_module("snlab.formula").formulas
    raise AttributeError(f"module 'snlab' has no attribute {name!r}")


__all__ = ["train", "sweep", "search", "serve", "serve_sweep", "serve_best", "device", "model", "system", "Device", "Model", "System", "SnlabError",
           "UnknownPresetError", "walls", "sizing", "symbols", "formulas", "presets"]
