"""Serving: the rules of a deployment (:mod:`.deployment`), the serving model as named
parts (:mod:`.step`), the planners ``serve``, ``serve_sweep`` and ``serve_best``
(:mod:`.planner`) and their result (:mod:`.result`); under load, a workload of arriving
requests (:mod:`.workload`) run through engine instances step by step (:mod:`.service`,
:mod:`.queueing`, :mod:`.disaggregation`), its closed forms (:mod:`.approx`), and the
planners ``serve_load``, ``load_sweep`` (:mod:`.load`) and ``serve_capacity``
(:mod:`.capacity`). The planners load on first use."""

from importlib import import_module

_LAZY = {"serve": "planner", "serve_sweep": "planner", "serve_best": "planner", "ServeResult": "result",
         "Deployment": "deployment", "package_weight_bytes": "step", "serve_load": "load", "load_sweep": "load",
         "LoadResult": "load_result", "serve_capacity": "capacity", "CapacityPlan": "capacity",
         "workload": "workload", "Workload": "workload"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
