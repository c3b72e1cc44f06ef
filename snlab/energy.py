"""Power, energy and cost of a plan: the fourth wall applied to the step models' columns.

The step models say how long each part of a step takes; this module turns those times
into the activity of each device (:func:`training_activity`, :func:`decode_activity`,
:func:`prefill_activity`), the activity into power (:data:`snlab.walls.power.device_power`
and the formulas after it) and the power, with the token rate, into energy and cost per
token (:func:`power_columns`). The cooling a system runs under (its PUE, the devices a
rack holds, the clock they sustain) comes from :mod:`snlab.power_cooling`.

Every function is vectorised over a grid of plans; the columns carry their units in
their names (``device_power_w``, ``energy_per_token_j``, ``cost_per_million_tokens_usd``).
"""

from __future__ import annotations

import numpy as np

from .energy_prices import Prices, example_prices, prices  # noqa: F401 (re-exported)
from .grid import maximum, minimum, spread, where
from .power_cooling import KINDS, NO_CAP, CoolingState, cooled, cooling_state  # noqa: F401 (re-exported)
from .walls import power as pw
from . import kernel as _kernel

_kernel.loaded(__name__)

#: seconds in an hour, tokens in a million, FLOP/s in a TFLOP/s
HOUR_S, MILLION, TERA = 3600.0, 1e6, 1e12
#: a tolerance that lets a job of exactly a rack's devices take one rack
ROUNDING = 1e-9

# --- activity --------------------------------------------------------------------------

def _fraction(x):
    """``x`` clipped to [0, 1] (a scalar inside it as it is)."""
    if type(x) is np.float64 and 0.0 < x < 1.0:
        return x
    return np.clip(x, 0.0, 1.0)


def training_activity(out: dict, hw, optimizer_on_host) -> tuple:
    """Compute, memory and link activity of a training step [1], from its columns.

    Compute: the step's hardware FLOPs at the matrix multiplies' achievable rate, over
    the step. Memory: the compute kernels' time beyond that (element-wise work, attention
    below the GEMM rate, small GEMMs reading their weights) and the optimizer step on the
    device, which stream HBM. Links: every collective's time, hidden or not."""
    step = out["step_time_s"]
    rate = hw.gemm_efficiency * hw.sustained_clock * hw.peak_flops
    flop_time = out["hardware_tflops_per_device"] * TERA * step / rate
    optimizer = where(optimizer_on_host, 0.0, out["time_optimizer_s"])
    memory = maximum(out["time_compute_s"] - flop_time, 0.0) + optimizer
    comm = sum(out[f"time_{x}_s"] for x in ("tp", "ep", "cp", "pp", "dp", "zero"))
    return _fraction(flop_time / step), _fraction(memory / step), _fraction(comm / step)


def decode_activity(out: dict) -> tuple:
    """Activity of a decode step [1]: its FLOPs at the achievable rate and its HBM bytes
    at the achievable bandwidth (the step's compute and memory walls), and its
    tensor-parallel, expert and pipeline traffic, over the step."""
    step = out["decode_step_s"]
    comm = out["time_tp_s"] + out["time_ep_s"] + out["time_pp_s"]
    return (_fraction(out["wall_compute_s"] / step), _fraction(out["wall_memory_s"] / step),
            _fraction(comm / step))


def prefill_activity(out: dict, dep: dict, hw, flops_per_token) -> tuple:
    """Activity of a prefill pass [1]: the prompt tokens' FLOPs per device at the
    achievable rate of the weights' precision, the weights read once per pass, and its
    tensor-parallel and expert traffic, over the pass."""
    ttft = out["ttft_s"]
    charged = (out["devices"] + out["lender_devices"]) / out["devices"]
    rate = hw.gemm_efficiency * dep["efficiency_ratio"] * hw.sustained_clock * hw.peak_flops * dep["gemm_ratio"]
    compute = out["prefill_tokens_per_s_per_device"] * charged * flops_per_token / rate
    stage = ttft / dep["pp"]
    memory = out["weights_bytes_per_device"] / (hw.memory_efficiency * hw.hbm_bandwidth) / stage
    comm = (out["prefill_time_tp_s"] + out["prefill_time_ep_s"]) / ttft
    return _fraction(compute), _fraction(memory), _fraction(comm)


def device_power(hw, activity: tuple):
    """Power of one device [W] at the activity ``(compute, memory, links)``, held to the
    TDP and to what the rack's cooling allows (:data:`snlab.walls.power.device_power`)."""
    uc, um, ul = activity
    return pw.device_power(tdp=minimum(hw.tdp, hw.power_cap), idle_power=hw.idle_power, compute_activity=uc,
                           memory_activity=um, link_activity=ul, hbm_energy=hw.hbm_energy,
                           memory_efficiency=hw.memory_efficiency, memory_bandwidth=hw.hbm_bandwidth,
                           link_energy=hw.link_energy, inner_efficiency=hw.scale_up_efficiency,
                           inner_bandwidth=hw.scale_up_bandwidth)


def overhead(hw):
    """Power per device beyond the device [W] (:data:`snlab.walls.power.overhead_power`)."""
    return pw.overhead_power(host_power=hw.host_power, node_devices=hw.devices_per_node,
                             switch_power=hw.switch_power, domain_devices=hw.scale_up_domain_size,
                             network_power=hw.network_power)


# --- columns ----------------------------------------------------------------------------

#: the power columns every plan gets, and the cost columns a plan with prices adds
POWER_COLUMNS = ("activity_compute", "activity_memory", "activity_links", "device_power_w", "it_power_w",
                 "facility_power_w", "device_energy_per_token_j", "it_energy_per_token_j", "energy_per_token_j",
                 "tokens_per_joule", "racks", "pue")
COST_COLUMNS = ("cost_per_hour_usd", "cost_per_million_tokens_usd", "tokens_per_dollar")


def racks(devices, hw):
    """Racks ``devices`` devices fill under the cooling: their compute racks, and the
    switch racks of every scale-up domain they reach into."""
    return (np.ceil(devices / hw.devices_per_rack - ROUNDING)
            + hw.network_racks * np.ceil(devices / hw.scale_up_domain_size - ROUNDING))


def power_columns(devices, device_w, tokens_per_s, hw, activity: tuple, prices: Prices | None = None,
                  pue=None, idle_devices=0.0) -> dict:
    """The power, energy and cost columns of a grid of plans.

    ``devices`` run at ``device_w`` each; ``idle_devices`` (a supernode's lenders of
    pooled HBM) draw idle power and their share of the rest. Energy per token is given
    for the devices alone (what NVML counts), for the IT equipment, and for the facility
    (``energy_per_token_j``, IT power times the PUE: the cooling's, or ``pue``)."""
    uc, um, ul = activity
    everyone = devices + idle_devices
    device_total = devices * device_w + idle_devices * hw.idle_power
    it = pw.it_power(devices=everyone, device_power=device_total / everyone, overhead_power=overhead(hw))
    ratio = hw.pue if pue is None else pue
    facility = pw.facility_power(pue=ratio, it_power=it)
    out = {"activity_compute": uc, "activity_memory": um, "activity_links": ul, "device_power_w": device_w,
           "it_power_w": it, "facility_power_w": facility,
           "device_energy_per_token_j": pw.energy_per_token(power=device_total, throughput=tokens_per_s),
           "it_energy_per_token_j": pw.energy_per_token(power=it, throughput=tokens_per_s),
           "energy_per_token_j": pw.energy_per_token(power=facility, throughput=tokens_per_s),
           "tokens_per_joule": tokens_per_s / facility, "racks": racks(everyone, hw),
           "pue": spread(np.float64(ratio), np.shape(facility))}
    if prices is not None:
        rate = pw.cost_rate(devices=everyone, facility_power=facility, **prices.inputs())
        per_token = pw.cost_per_token(cost_rate=rate, throughput=tokens_per_s)
        out.update(cost_per_hour_usd=rate * HOUR_S, cost_per_million_tokens_usd=per_token * MILLION,
                   tokens_per_dollar=1 / per_token)
    return out


def training_columns(out: dict, g: dict, hw, prices: Prices | None = None, pue=None) -> dict:
    """Power, energy and cost columns of a grid of training plans (``out``: the step's
    columns, ``g``: the plan columns)."""
    on_host = (g["offload"] == 1) | (g["offload"] == 3)
    activity = training_activity(out, hw, on_host)
    return power_columns(out["devices"], device_power(hw, activity), out["tokens_per_s"], hw, activity, prices, pue)


def serving_flops_per_token(model, prompt_len):
    """Forward FLOPs of one prompt token in prefill [FLOP]: 2 per weight it passes
    through, and its attention over half the prompt (causal)."""
    from .sizing import model_sizes
    from .walls import compute as cw
    s = model_sizes(model)
    return 2 * s.matmul_params + cw.attention_score_flops(layers=s.layers, heads=s.heads,
                                                          head_dim=s.attention_head_dim, context_len=prompt_len / 2)


def serving_columns(model, out: dict, dep: dict, hw, prices: Prices | None = None, pue=None) -> dict:
    """Power, energy and cost columns of a grid of serving deployments, per output token.

    Each replica alternates prefills and decode steps as continuous batching runs them
    (:data:`snlab.walls.serving.batching_throughput`): the device's power is the two
    phases' weighted by their share of the time, and the tokens are the continuous
    batching rate (the offline run's rate on offline rows). Lenders of pooled HBM draw
    idle power, and so, offline, do the ``dp - requests`` replicas a run of fewer
    requests than replicas leaves without one (a replica given any request decodes for
    the whole run, :func:`snlab.serving.offline.offline`)."""
    dec = decode_activity(out)
    pre = prefill_activity(out, dep, hw, serving_flops_per_token(model, dep["prompt_len"]))
    p_dec, p_pre = device_power(hw, dec), device_power(hw, pre)
    b = dep["batch"] / dep["dp"]
    prefill_time = b * out["ttft_s"] / dep["prefill_batch"]
    decode_time = dep["output_len"] / out["tokens_per_step"] * out["decode_step_s"]
    share = prefill_time / (prefill_time + decode_time)
    device_w = share * p_pre + (1 - share) * p_dec
    activity = tuple(share * p + (1 - share) * d for p, d in zip(pre, dec))
    lenders = out["lender_devices"]
    continuous = out["continuous_tokens_per_s_per_device"] * (out["devices"] + lenders)
    offline = dep["scenario"] == 1
    tokens = where(offline, out["offline_tokens_per_s"], continuous)
    busy = where(offline, minimum(dep["requests"], dep["dp"]) / dep["dp"], 1.0)
    return power_columns(out["devices"] * busy, device_w, tokens, hw, activity, prices, pue,
                         idle_devices=lenders + out["devices"] * (1 - busy))


def full_load(system, cooling: str | None = None, devices: int | None = None) -> dict:
    """Power of ``devices`` devices of ``system`` (default: one scale-up domain) with
    every device at its limit, as rack and system power ratings count it: device, IT and
    facility power [W] and the racks."""
    from .hardware import hardware
    from .presets import system as load_system
    s = cooled(load_system(system), cooling)
    hw = hardware(s)
    n = float(devices or s.scale_up.domain_size)
    device_w = minimum(hw.tdp, hw.power_cap)
    it = pw.it_power(devices=n, device_power=device_w, overhead_power=overhead(hw))
    facility = pw.facility_power(pue=hw.pue, it_power=it)
    return {"device_power_w": float(device_w), "it_power_w": float(it), "facility_power_w": float(facility),
            "racks": float(racks(n, hw)), "pue": float(hw.pue)}
