"""snlab (SuperNode Lab): the compute, memory, communication and power walls of
large-model training and serving, as live formulas, on conventional clusters and supernodes.

Quick start::

    import snlab
    snlab.model("megatron-1t").params          # 1.008e12
    snlab.walls.communication.ring_all_reduce_time   # shows itself as LaTeX
    snlab.train("llama3-70b", "dgx-h100", tp=8, pp=4, dp=8, global_batch=512)

Heavy dependencies (sympy, pandas, altair, ipywidgets) are imported only when used.
"""

from __future__ import annotations

from importlib import import_module

from .errors import SnlabError, UnknownPresetError
from .presets import device, model, system
from .specs import Device, Model, System

__version__ = "0.2.0"

_LAZY_MODULES = ("walls", "sizing", "symbols", "units", "presets", "charts", "widgets", "network", "hardware",
                 "training", "serving", "validation", "claims", "compare", "grid", "uncertainty", "energy",
                 "energy_prices", "power_cooling", "exploration")

_LAZY_FUNCTIONS = {
    "train": "snlab.training", "sweep": "snlab.training", "search": "snlab.training",
    "serve": "snlab.serving", "serve_sweep": "snlab.serving", "serve_best": "snlab.serving",
    "serve_load": "snlab.serving", "load_sweep": "snlab.serving", "serve_capacity": "snlab.serving",
    "formulas": "snlab.walls", "TrainResult": "snlab.training", "ServeResult": "snlab.serving",
    "collective_time": "snlab.network", "full_load": "snlab.energy", "Prices": "snlab.energy_prices",
    "cooling_state": "snlab.power_cooling",
    "explore": "snlab.exploration", "explore_serve": "snlab.exploration", "ExploreResult": "snlab.exploration",
    "collective": "snlab.network",
}


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return import_module(f"snlab.{name}")
    if name in _LAZY_FUNCTIONS:
        return getattr(import_module(_LAZY_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'snlab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_FUNCTIONS))


__all__ = ["train", "sweep", "search", "serve", "serve_sweep", "serve_best", "serve_load", "load_sweep",
           "serve_capacity", "explore", "explore_serve", "collective_time", "collective", "device", "model",
           "system", "Device",
           "Model", "System", "SnlabError", "UnknownPresetError", "TrainResult", "ServeResult", "walls", "sizing",
           "symbols", "formulas", "presets", "network", "full_load", "cooling_state", "Prices"]
