"""Serving: the rules of a deployment (:mod:`.deployment`), the serving model as named
parts (:mod:`.step`), the planners ``serve``, ``serve_sweep`` and ``serve_best``
(:mod:`.planner`) and their result (:mod:`.result`). The planners load on first use."""

from importlib import import_module

_LAZY = {"serve": "planner", "serve_sweep": "planner", "serve_best": "planner", "ServeResult": "result",
         "Deployment": "deployment", "package_weight_bytes": "step"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
