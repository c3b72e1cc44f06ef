"""Training: the rules of a plan (:mod:`.plan`), how a pipeline splits the layers
(:mod:`.stages`), the step as named parts (:mod:`.step`), the planners ``train``, ``sweep``
and ``search`` (:mod:`.planner`) and their result (:mod:`.result`). The planners load on first use, so reading the plan rules stays light."""

from importlib import import_module

_LAZY = {"train": "planner", "sweep": "planner", "search": "planner", "TrainResult": "result", "Plan": "plan",
         "stage_table": "stages", "stage_memory": "planner"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
