"""What an exploration evaluates: training plans or serving deployments.

Each kind reads a chunk's axes with its planner's open-grid kernels (the ones
``snlab.sweep`` and ``snlab.serve_sweep`` call) and hands back the chunk as an open grid:
rule codes, outputs and inputs that broadcast to one shape, a dimension per field in the
planner's order, so row ``i`` of the chunk, flat, is row ``start + i`` of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import grid
from ..errors import SnlabError


@dataclass
class Evaluated:
    """One chunk as an open grid of ``shape`` (a dimension per field of ``order``)."""
    shape: tuple
    broken: np.ndarray
    feasible: np.ndarray
    reason: np.ndarray
    inputs: dict
    outputs: dict
    labels: dict


def _shape(shape: tuple, ndim: int) -> tuple:
    # a chunk of one configuration comes back as scalars
    if len(shape) == ndim:
        return shape
    if shape == ():
        return (1,) * ndim
    raise AssertionError(f"an open grid of {len(shape)} dimensions, not {ndim}")


class Training:
    """Training plans: :func:`snlab.sweep`'s grid and kernels."""
    name = "train"
    default_objective = "tokens_per_s"

    def __init__(self):
        from ..training import planner
        self.planner = planner
        self.reasons = planner.REASONS
        self.fields = planner.PLAN_FIELDS + planner.OVERLAP_FIELDS + planner.SYSTEM_FIELDS

    def order(self, axes) -> tuple:
        """The open grid's dimensions, by the field each varies (the order of sweep's rows)."""
        p = self.planner
        return p.PLAN_FIELDS + tuple(f for f in p.OVERLAP_FIELDS if f in axes) \
            + tuple(f for f in p.SYSTEM_FIELDS if f in axes)

    def dimension(self, name: str):
        from ..hardware import field_dimension
        p = self.planner
        if name in p.SYSTEM_FIELDS:
            return field_dimension(name)
        if name in p.OVERLAP_FIELDS:
            return "fraction0"
        return None

    def allowed(self, name: str) -> str:
        from .. import schema
        p = self.planner
        if name in p.SYSTEM_FIELDS:
            return schema.describe(self.dimension(name))
        if name in p.OVERLAP_FIELDS:
            return "levels in [0, 1]"
        return p.pl.ALLOWED.get(name, "a number")

    def check_spec(self, precision) -> None:
        self.planner.check_precision(precision)

    def check(self, model, system, precision, axes: dict, devices) -> dict:
        """Refuse bad axes as the planner would (naming the field); the labels of the
        named choices."""
        p = self.planner
        p.check_devices(devices)
        _, _, labels = p.build_grid(model, system, axes, precision)
        return labels

    def check_read(self, model, system, axes: dict) -> None:
        """Refuse a plan field no point of the grid reads, as :func:`snlab.sweep` does."""
        self.planner.pl.check_read(model, axes)

    def evaluate(self, cache: dict, model, system, precision, axes: dict, devices) -> Evaluated:
        p = self.planner
        from ..sizing import model_sizes
        sizes = cache.get(("sizes", id(model)))
        if sizes is None:
            sizes = cache[("sizes", id(model))] = model_sizes(model)
        from .. import energy
        # the system under its default cooling, with its power columns, as sweep has them
        cooled, ratio, price = p.power_options(system, None, None, None, "sustained_clock" in axes)
        g, hw, labels = p.build_grid(model, cooled, axes, precision)
        plan = p.plan_of(g)
        broken = p.pl.violations(model, plan, devices)
        hw = p.place_slices(cooled, hw, g, labels)       # each plan's slice of a torus, as sweep places it
        with np.errstate(all="ignore"):
            out = p.step_columns(sizes, plan, hw)
            if cooled.has_power:
                out.update(energy.training_columns(out, g, hw, price, ratio))
        out.update(p.slice_columns(hw))
        hw_cols = {k: getattr(hw, k) for k in p.SYSTEM_FIELDS if k in axes}
        shape = _shape(grid.grid_shape(broken, g, hw_cols), len(self.order(axes)))
        feasible = (broken < 0) & np.asarray(out["fits"], dtype=bool)
        return Evaluated(shape, broken, feasible, p.reason_codes(broken, out), {**g, **hw_cols}, out, labels)

    def frame(self, model, system, precision, inputs: dict, labels: dict, broken, outputs: dict, axes: dict):
        p = self.planner
        hw = {k: inputs[k] for k in p.SYSTEM_FIELDS if k in axes}
        g = {k: v for k, v in inputs.items() if k not in hw}
        return p.build_frame(model, system, precision, g, labels, broken, outputs, hw)

    def flat(self, ev: Evaluated, axes: dict):
        """The chunk's columns laid out flat, checked finite, as ``sweep`` lays them out."""
        p = self.planner
        broken = np.broadcast_to(ev.broken, ev.shape).ravel()
        hw = {k: ev.inputs[k] for k in p.SYSTEM_FIELDS if k in axes}
        g = {k: v for k, v in ev.inputs.items() if k not in hw}
        g, hw = grid.flatten(g, ev.shape), grid.flatten(hw, ev.shape)
        out = grid.outputs(ev.outputs, ev.shape, broken < 0, {**g, **hw})
        return {**g, **hw}, broken, out


class Serving:
    """Serving deployments: :func:`snlab.serve_sweep`'s grid and kernels."""
    name = "serve"
    default_objective = "decode_tokens_per_s_per_device"

    def __init__(self):
        from ..serving import planner
        self.planner = planner
        self.reasons = planner.dp_.REASONS
        self.fields = tuple(planner.dp_.DEFAULTS) + tuple(planner.SYSTEM_FIELDS)

    def order(self, axes) -> tuple:
        p = self.planner
        return tuple(p.dp_.DEFAULTS) + tuple(f for f in p.SYSTEM_FIELDS if f in axes)

    def dimension(self, name: str):
        from ..hardware import field_dimension
        return field_dimension(name) if name in self.planner.SYSTEM_FIELDS else None

    def allowed(self, name: str) -> str:
        from .. import schema
        p = self.planner
        if name in p.SYSTEM_FIELDS:
            return schema.describe(self.dimension(name))
        return p.dp_.ALLOWED.get(name, "a number")

    def check_spec(self, precision) -> None:
        if precision is not None:
            raise SnlabError("precision", "given for serving", "none: serving sets weight_dtype and kv_dtype")

    def check(self, model, system, precision, axes: dict, devices) -> dict:
        if devices is not None:
            raise SnlabError("devices", "given for serving", "none: a deployment's devices are tp x pp x dp")
        self.planner.build_grid(model, system, axes)
        return {}

    def check_read(self, model, system, axes: dict) -> None:
        """Refuse a deployment field no point of the grid reads, as :func:`snlab.serve_sweep` does."""
        self.planner.dp_.check_scenario(axes)
        self.planner.dp_.check_read(model, system, axes)

    def evaluate(self, cache: dict, model, system, precision, axes: dict, devices) -> Evaluated:
        p = self.planner
        from ..training.planner import power_options
        cooled, ratio, price = power_options(system, None, None, None, "sustained_clock" in axes)
        dep, hw, hw_cols = p.build_grid(model, cooled, axes)
        broken = p.dp_.violations(model, cooled, dep)
        with np.errstate(all="ignore"):
            out = p.serve_columns(model, dep, hw)
            out.update(p.power_columns(model, cooled, out, dep, hw, price, ratio))
        cols = {f: getattr(dep, f) for f in p.dp_.Deployment.__dataclass_fields__}
        shape = _shape(grid.grid_shape(broken, cols, hw_cols), len(self.order(axes)))
        feasible = (broken < 0) & np.asarray(out["fits"], dtype=bool)
        return Evaluated(shape, broken, feasible, p.reason_codes(broken, out), {**cols, **hw_cols}, out, {})

    def frame(self, model, system, precision, inputs: dict, labels: dict, broken, outputs: dict, axes: dict):
        p = self.planner
        hw = {k: inputs[k] for k in p.SYSTEM_FIELDS if k in axes}
        g = {k: v for k, v in inputs.items() if k not in hw}
        return p.build_frame(model, system, g, hw, broken, dict(outputs))

    def flat(self, ev: Evaluated, axes: dict):
        broken = np.broadcast_to(ev.broken, ev.shape).ravel()
        cols = grid.flatten(ev.inputs, ev.shape)
        out = grid.outputs(ev.outputs, ev.shape, broken < 0, cols)
        return cols, broken, out


KINDS = {"train": Training, "serve": Serving}


def kind(name: str):
    if name not in KINDS:
        raise SnlabError("kind", f"got {name!r}", "train or serve")
    return KINDS[name]()
