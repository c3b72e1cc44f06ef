"""Co-design: the scale-up fabric one would build for a model, explored with the plan.

A design is a base system (by default the PCIe/Ethernet A100 cluster) with three of its
numbers changed: how many devices share the scale-up bus (``scale_up_domain_size``), the
bus's bandwidth per direction (``scale_up_bandwidth``) and each device's HBM
(``hbm_capacity``). Everything else (the devices' compute, the bus's latencies and
efficiency, the scale-out network) stays the base system's, so a design's gain over the base
is what the fabric and the memory buy and nothing else. Each design is priced at its best
parallel plan: :func:`designs` explores the designs and a grid of plans together with
:func:`snlab.explore`, and keeps, per design, the fastest plan that fits.

The gain of the best design over the base is the most a supernode's fabric is worth for that
model, as a premium on the price of a device: a design that costs more per device than it
gains is the worse buy, and the base cluster stays the better one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from . import grid, schema, topology
from .compare import CLUSTER, SCALE_MODELS
from .errors import SnlabError
from .hardware import field_dimension
from .exploration import explore
from .exploration.api import MAX_TOP
from .presets import model as load_model
from .presets import system as load_system

#: the design axes' default values: devices on one bus, and bandwidths per direction [B/s]
#: besides the base system's own (PCIe Gen4 x16's 31.5 GB/s for the cluster), up to about
#: CloudMatrix384's (384 devices at 392 GB/s per direction, its preset's scale-up level)
DOMAINS = (8, 32, 128, 384)
BANDWIDTHS_B_PER_S = (100e9, 200e9, 400e9)
#: HBM per device, as multiples of the base device's
HBM_SCALES = (1, 2)
#: the plans each design is tried with: ``snlab.search``'s degrees and choices at micro-batch
#: 1 with sequence parallelism on (what it picks for these models on 384 devices)
PLAN_AXES = dict(tp=[1, 2, 4, 8, 16], pp=[1, 2, 4, 8, 16, 32, 64], cp=[1, 2, 4], interleave=[1, 2],
                 recompute=["none", "selective", "full"], zero=[1, 3], micro_batch=1, sequence_parallel=True)
#: the columns a design table keeps of the best plan
PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "interleave", "recompute", "zero")
DESIGN = ("scale_up_domain_size", "scale_up_bandwidth", "hbm_capacity")


def divisors(n: int) -> list[int]:
    """The data-parallel degrees a plan of ``n`` devices can take."""
    return topology.divisors(n)


def design_axes(base=CLUSTER, domains=DOMAINS, bandwidths=BANDWIDTHS_B_PER_S, hbm_scales=HBM_SCALES) -> dict:
    """The three design axes around ``base``: its own domain, bandwidth and HBM among them,
    so that the base system is one of the designs."""
    s = load_system(base)
    return {"scale_up_domain_size": sorted({s.scale_up.domain_size, *domains}),
            "scale_up_bandwidth": sorted({s.scale_up.bandwidth, *bandwidths}),
            "hbm_capacity": sorted({s.device.hbm_capacity * k for k in {1, *hbm_scales}})}


@lru_cache(maxsize=32)
def _designs(model, base, devices: int, global_batch: int, axes: tuple) -> pd.DataFrame:
    design = {name: list(values) for name, values in axes}
    model_name, base_name = load_model(model).name, load_system(base).name
    result = explore(model, base, devices=devices, global_batch=global_batch, dp=divisors(devices),
                     objective="tokens_per_s_per_device", top=MAX_TOP, progress=False, **PLAN_AXES, **design)
    if result.feasible > MAX_TOP:
        raise SnlabError("designs", f"{result.feasible:,} feasible plans", f"at most {MAX_TOP:,}: fewer axis values")
    if result.feasible == 0:
        raise SnlabError("model", f"{model_name} has no plan that fits any design on {devices} devices",
                         "a model the base system can train as it is")
    rows = result.top.sort_values("tokens_per_s_per_device", ascending=False, kind="stable")
    best = rows.drop_duplicates(list(DESIGN)).set_index(list(DESIGN))
    grid = pd.MultiIndex.from_product([design[n] for n in DESIGN], names=list(DESIGN))
    table = best.reindex(grid).reset_index()
    s = load_system(base)
    here = ((table["scale_up_domain_size"] == s.scale_up.domain_size) & (table["scale_up_bandwidth"] == s.scale_up.bandwidth)
            & (table["hbm_capacity"] == s.device.hbm_capacity))
    reference = table.loc[here, "tokens_per_s_per_device"].iloc[0]
    if not np.isfinite(reference):
        raise SnlabError("model", f"{model_name} has no plan that fits {base_name} on {devices} devices",
                         "a model the base system can train as it is")
    table["gain"] = table["tokens_per_s_per_device"] / reference
    table["base"] = here
    table["fits"] = table["tokens_per_s_per_device"].notna()
    columns = [*DESIGN, "tokens_per_s_per_device", "mfu", "gain", "fits", "base", *PLAN_COLUMNS,
               "step_time_s_low", "step_time_s_high", "validated"]
    table = table[columns].copy()
    table.insert(0, "model", model_name)
    table.attrs.update(base=base_name, devices=devices, global_batch=global_batch, evaluated=result.evaluated)
    return table


def _values(name: str, values) -> list:
    if isinstance(values, (str, bytes)) or np.ndim(values) == 0:
        return [values]
    return list(values)


def checked_axes(axes: dict) -> dict:
    """The design axes given to :func:`designs`, each value checked: ``domains`` whole
    numbers of devices, ``bandwidths`` in B/s or as strings such as ``"400 GB/s"``,
    ``hbm_scales`` multiples of the base device's HBM."""
    unknown = set(axes) - {"domains", "bandwidths", "hbm_scales"}
    if unknown:
        raise SnlabError(sorted(unknown)[0], "not a design axis", "domains, bandwidths, hbm_scales")
    out = {}
    if "domains" in axes:
        out["domains"] = [grid.whole_number("domains", d, 1, 1e9, "devices on one bus, whole numbers from 1 to "
                                            "1,000,000,000") for d in _values("domains", axes["domains"])]
    if "bandwidths" in axes:
        dimension = field_dimension("scale_up_bandwidth")
        out["bandwidths"] = [float(b) for b in grid.numbers("bandwidths", _values("bandwidths", axes["bandwidths"]),
                                                            schema.describe(dimension), dimension)]
    if "hbm_scales" in axes:
        allowed = "multiples of the base device's HBM, from 0.01 to 100"
        scales = grid.numbers("hbm_scales", _values("hbm_scales", axes["hbm_scales"]), allowed)
        if not len(scales) or np.any((scales < 0.01) | (scales > 100)):
            raise SnlabError("hbm_scales", f"got {[float(k) for k in scales]}", allowed)
        out["hbm_scales"] = [float(k) for k in scales]
    return out


def designs(model: str, base=CLUSTER, devices: int = 384, global_batch: int = 768, **axes) -> pd.DataFrame:
    """Every design around ``base`` (:func:`design_axes`, or ``domains``, ``bandwidths`` and
    ``hbm_scales`` given) with the fastest plan for ``model`` on ``devices`` devices.

    One row a design: its three numbers, the best plan's tokens per second per device, MFU,
    degrees and band, and ``gain``: its rate over the base system's (the base row has 1). A
    design on which no plan fits has no rate (``fits`` False)."""
    m, s = load_model(model), load_system(base)
    devices = grid.whole_number("devices", devices, 1, 100_000_000)
    global_batch = grid.whole_number("global_batch", global_batch, 1, 1e9, "sequences, a whole number from 1 to "
                                                                           "1,000,000,000")
    values = tuple((k, tuple(v)) for k, v in design_axes(s, **checked_axes(axes)).items())
    if model == m.name and base == s.name:        # shipped presets by name: the same answer every time
        return _designs(m.name, s.name, devices, global_batch, values).copy()
    return _designs.__wrapped__(m, s, devices, global_batch, values)


def front(table: pd.DataFrame) -> pd.DataFrame:
    """The designs no other beats on all three of: a higher rate, a smaller domain, a lower
    bandwidth, at each HBM capacity (the least fabric for each rate), fastest first."""
    fits = table[table["fits"]]
    keep = []
    for _, group in fits.groupby("hbm_capacity"):
        points = group[["tokens_per_s_per_device", "scale_up_domain_size", "scale_up_bandwidth"]].to_numpy(float)
        points[:, 0] = -points[:, 0]
        for i, p in enumerate(points):
            beaten = np.all(points <= p, axis=1) & np.any(points < p, axis=1)
            if not beaten.any():
                keep.append(group.index[i])
    return table.loc[keep].sort_values("tokens_per_s_per_device", ascending=False)


def alone(table: pd.DataFrame) -> pd.Series:
    """What each design axis buys changed alone from the base (at its largest value), and all
    three together (the best design): gains over the base system."""
    base = table[table["base"]].iloc[0]
    out = {}
    for name in DESIGN:
        others = [n for n in DESIGN if n != name]
        mask = np.logical_and.reduce([table[n] == base[n] for n in others]) & (table[name] == table[name].max())
        out[name] = float(table.loc[mask, "gain"].max())
    out["all three"] = float(table["gain"].max())
    return pd.Series(out, name="gain over the base")


def scale_table(models=SCALE_MODELS, base=CLUSTER, devices: int = 384, global_batch: int = 768) -> pd.DataFrame:
    """Per model: the base system's best rate, the best design's, the gain, the most each axis
    buys alone, and the best design itself. The gain less one is the largest premium per
    device the best design is worth over the base."""
    rows = []
    for m in models:
        table = designs(m, base, devices, global_batch)
        best = table.loc[table["gain"].idxmax()]
        parts = alone(table)
        rows.append({"model": table["model"].iloc[0], "params": load_model(m).params,
                     "base_tokens_per_s_per_device": float(table.loc[table["base"], "tokens_per_s_per_device"].iloc[0]),
                     "best_tokens_per_s_per_device": float(best["tokens_per_s_per_device"]),
                     "gain": float(best["gain"]), "domain_alone": parts["scale_up_domain_size"],
                     "bandwidth_alone": parts["scale_up_bandwidth"], "hbm_alone": parts["hbm_capacity"],
                     **{n: best[n] for n in DESIGN}})
    return pd.DataFrame(rows)


__all__ = ["designs", "design_axes", "checked_axes", "front", "alone", "scale_table", "divisors", "DOMAINS", "BANDWIDTHS_B_PER_S",
           "HBM_SCALES", "PLAN_AXES"]
