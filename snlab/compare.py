"""Comparing systems: the best plan per model and system, and what-ifs around it.

Thin helpers on top of :func:`snlab.search` and :func:`snlab.sweep` that the notebooks
and dashboards share: find the fastest plan that fits (:func:`best_plans`), sweep one
axis around it (:func:`vary`), size a job in days and device-hours (:func:`job_table`),
find the best value of an axis (:func:`optimum`), and build what-if systems
(:func:`with_scale_up_of`). Everything returns pandas DataFrames with the sweep's
column names (units in the names).
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from .errors import SnlabError
from .presets import model as load_model
from .presets import system as load_system


#: the lab's two reference systems and its ladder of model scales, smallest to largest
CLUSTER, SUPERNODE = "pcie-ethernet-a100", "cloudmatrix384"
SCALE_MODELS = ("llama3.2-1b", "llama3-8b", "llama3-70b", "gpt3-175b", "llama3-405b", "megatron-1t")
#: the systems the lab compares power, energy and cost on, and the serving workload it prices:
#: a chat request under a 50 ms per-token target
POWER_SYSTEMS = (CLUSTER, "dgx-h100", SUPERNODE, "gb200-nvl72")
POWER_WORKLOAD = dict(prompt_len=1000, output_len=500, tpot_target=0.05)


def power_tp(model: str, system: str) -> int:
    """The tensor-parallel degree a power comparison serves ``model`` with on ``system``:
    one replica per device for a model that fits one, else the node's devices."""
    s, m = load_system(system), load_model(model)
    return 1 if 2.2 * m.params < s.device.hbm_capacity else s.devices_per_node


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Categoricals as strings, so frames from different sweeps concatenate cleanly."""
    out = frame.copy()
    for col in out.columns:
        if isinstance(out[col].dtype, pd.CategoricalDtype):
            out[col] = out[col].astype(str)
    return out.reset_index(drop=True)


def best_plans(models: Iterable, systems: Iterable, devices: int, global_batch: int, **fixed) -> pd.DataFrame:
    """The fastest plan that fits, per model and system (one :func:`snlab.search` each).

    Adds ``params`` (total parameters) for ordering by scale. A (model, system) pair
    with no fitting plan is left out and listed in ``frame.attrs["no_plan"]``.
    """
    from .training import search
    frames, missing = [], []
    for m in models:
        model = load_model(m)
        for s in systems:
            top = search(model, s, devices=devices, global_batch=global_batch, top=1, **fixed)
            if top.empty:
                missing.append((model.name, load_system(s).name))
                continue
            top = plain(top)
            top["params"] = float(model.params)
            frames.append(top)
    if not frames:
        raise SnlabError("plan", f"no plan fits on {devices} devices with global batch {global_batch}",
                         "more devices, a smaller model or another batch")
    out = pd.concat(frames, ignore_index=True)
    out.attrs["no_plan"] = missing
    return out


PLAN_COLUMNS = ("tp", "pp", "dp", "ep", "cp", "micro_batch", "global_batch", "zero", "recompute",
                "sequence_parallel", "interleave", "offload", "overlap", "seq_len")


def plan_of(row) -> dict:
    """The plan of one sweep/search row as keywords for :func:`snlab.train` or :func:`snlab.sweep`."""
    out = {}
    for name in PLAN_COLUMNS:
        value = row[name]
        out[name] = value.item() if hasattr(value, "item") else value     # numpy scalars as Python ones
    return out


def vary(frame: pd.DataFrame, **axes) -> pd.DataFrame:
    """Each row's plan (model, system, plan columns) swept over ``axes``: e.g. the best
    plan per system across overlap levels, ``vary(best, overlap=charts.OVERLAP_ORDER)``.
    Systems are looked up by name, so rows must come from preset systems."""
    from .training import sweep
    parts = []
    for _, row in frame.iterrows():
        plan = {k: v for k, v in plan_of(row).items() if k not in axes}
        parts.append(sweep(str(row["model"]), str(row["system"]), **plan, **axes))
    return pd.concat([plain(p) for p in parts], ignore_index=True)


def job_table(models: Iterable, systems: Iterable, devices: int, global_batch: int, tokens: float,
              **fixed) -> pd.DataFrame:
    """Size a training job: the fastest plan per model and system (:func:`best_plans`)
    with the time to train on ``tokens`` tokens [days], the device-hours it takes
    [device h] and the throughput per device [tokens/s]."""
    _check_tokens(tokens)
    return with_job(best_plans(models, systems, devices, global_batch, **fixed), tokens)


def _check_tokens(tokens) -> None:
    if not isinstance(tokens, (int, float)) or isinstance(tokens, bool) or not tokens > 0:
        raise SnlabError("tokens", f"got {tokens!r}", "a number of training tokens > 0")


def with_job(frame: pd.DataFrame, tokens: float) -> pd.DataFrame:
    """A copy of a plan frame with ``train_days`` [days], ``device_hours`` [device h] and
    ``tokens_per_device_s`` [tokens/s] for training on ``tokens`` tokens; with the
    facility energy ``energy_to_train_j`` [J] where the frame has power columns, and
    ``cost_to_train_usd`` [$] where it has prices."""
    _check_tokens(tokens)
    out = frame.copy()
    seconds = float(tokens) / out["tokens_per_s"]
    out["train_days"] = seconds / 86400.0
    out["device_hours"] = seconds / 3600.0 * out["devices"]
    out["tokens_per_device_s"] = out["tokens_per_s"] / out["devices"]
    if "energy_per_token_j" in out:
        out["energy_to_train_j"] = float(tokens) * out["energy_per_token_j"]
    if "cost_per_million_tokens_usd" in out:
        out["cost_to_train_usd"] = float(tokens) / 1e6 * out["cost_per_million_tokens_usd"]
    return out


def optimum(frame: pd.DataFrame, over: str = "micro_batch", by: str = "system") -> pd.Series:
    """For each ``by`` group, the value of ``over`` with the shortest step among the rows
    that are valid and fit (groups with no such row are left out)."""
    ok = frame[frame["fits"].astype(bool) & frame.get("valid", True)]
    best = ok.loc[ok.groupby(by, observed=True)["step_time_s"].idxmin()]
    return best.set_index(best[by].astype(str))[over].rename(f"best {over}")


def near_optimum(frame: pd.DataFrame, over: str = "micro_batch", by: str = "system", within: float = 0.10) -> pd.Series:
    """For each ``by`` group, every value of ``over`` whose step is within ``within`` of
    the group's shortest (the model cannot tell them apart: "about the same"), as text
    ("2, 4 and 8"), among the rows that are valid and fit."""
    ok = frame[frame["fits"].astype(bool) & frame.get("valid", True)]
    out = {}
    for key, part in ok.groupby(by, observed=True):
        best = part["step_time_s"].min()
        values = sorted(part.loc[part["step_time_s"] <= best * (1 + within), over].tolist())
        text = [f"{v:g}" if isinstance(v, float) else str(v) for v in values]
        out[str(key)] = text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]
    return pd.Series(out, name=f"{over} within {within:.0%} of the best")


def with_scale_up_of(system, donor):
    """A what-if system: ``system`` (its devices, scale-out, host) with the scale-up
    level of ``donor`` (domain size, bandwidth, latencies, efficiency, wiring). Used to
    separate what the network buys from what the chip buys."""
    base, other = load_system(system), load_system(donor)
    up = other.scale_up
    return base.replace(name=f"{base.name} + {other.name} scale-up",
                        description=f"{base.description}; scale-up level of {other.name} (what-if)",
                        scale_up_domain_size=up.domain_size, scale_up_bandwidth=up.bandwidth,
                        scale_up_latency=up.latency, scale_up_efficiency=up.efficiency,
                        scale_up_call_latency=up.call_latency, scale_up_topology=up.topology)


def model_order(frame: pd.DataFrame) -> list[str]:
    """Model names ordered by parameter count (for ``sort=`` of a nominal axis)."""
    if "params" in frame.columns:
        return list(frame.sort_values("params")["model"].astype(str).drop_duplicates())
    names = list(dict.fromkeys(frame["model"].astype(str)))
    return sorted(names, key=lambda n: load_model(n).params)
