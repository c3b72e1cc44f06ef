"""Power, energy and cost of a plan: the fourth wall applied to the step models' columns.

The step models say how long each part of a step takes; this module turns those times
into the activity of each device (:func:`training_activity`, :func:`decode_activity`,
:func:`prefill_activity`), the activity into power (:data:`snlab.walls.power.device_power`
and the formulas after it) and the power, with the token rate, into energy and cost per
token (:func:`power_columns`). It also applies a kind of cooling to a system
(:func:`cooling_state`, :func:`cooled`): the PUE, how many devices a rack holds, and
the clock the devices sustain when the rack cannot remove what they would draw.

Every function is vectorised over a grid of plans; the columns carry their units in
their names (``device_power_w``, ``energy_per_token_j``, ``cost_per_million_tokens_usd``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SnlabError
from .grid import where
from .walls import power as pw

#: seconds in a year (365.25 days) and joules in a kWh
YEAR_S, KWH_J = 365.25 * 86400.0, 3.6e6
#: the kinds of cooling
KINDS = ("air", "liquid")
#: a rack whose cooling removes what its devices draw: no cap on a device's power [W]
NO_CAP = 1e9


# --- prices -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Prices:
    """What a job pays: ``device_hour`` [$] rent per device-hour (electricity usually
    included), or ``capex`` [$] purchase price per device (its share of the system
    included) written off over ``years``; ``kwh`` [$] per kWh the facility draws; and
    ``utilisation``, the share of the paid hours the devices do this work (1: every hour
    is used)."""

    device_hour: float = 0.0
    capex: float = 0.0
    years: float = 4.0
    kwh: float = 0.0
    utilisation: float = 1.0

    def __post_init__(self):
        for name, low, high, allowed in (
                ("device_hour", 0.0, 1e4, "a price per device-hour from 0 to 10,000 $"),
                ("capex", 0.0, 1e8, "a purchase price per device from 0 to 100,000,000 $"),
                ("years", 0.1, 50.0, "a write-off period from 0.1 to 50 years"),
                ("kwh", 0.0, 10.0, "an electricity price from 0 to 10 $ per kWh"),
                ("utilisation", 0.01, 1.0, "a share of the paid hours from 0.01 to 1")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise SnlabError(f"prices.{name}", f"got {value!r}", allowed)
        if not (self.device_hour or self.capex or self.kwh):
            raise SnlabError("prices", "no price given", "device_hour, capex (with years) or kwh")

    def inputs(self) -> dict:
        """The inputs of :data:`snlab.walls.power.cost_rate` in SI units ($/s, $, s, $/J)."""
        return dict(device_price=self.device_hour / 3600.0, capex=float(self.capex),
                    lifetime=self.years * YEAR_S, fleet_utilisation=float(self.utilisation),
                    energy_price=self.kwh / KWH_J)


def prices(spec=None, **given) -> Prices | None:
    """A :class:`Prices` from a Prices, a mapping of its fields, ``"example"`` (the dated
    example prices shipped in ``prices.toml``, see :func:`example_prices`; needs
    ``system=``), or keywords; None for None."""
    if spec is None and not given:
        return None
    if isinstance(spec, Prices):
        return spec
    if isinstance(spec, str):
        if spec not in ("example", "example-rent", "example-purchase"):
            raise SnlabError("prices", f"got {spec!r}", "'example', 'example-rent', 'example-purchase', a mapping of "
                             "device_hour, capex, years, kwh, utilisation, or a snlab.energy.Prices")
        system = given.pop("system")
        return example_prices(system, rent={"example-rent": True, "example-purchase": False}.get(spec), **given)
    fields = dict(spec or {}, **given)
    bad = [k for k in fields if k not in Prices.__dataclass_fields__]
    if bad:
        raise SnlabError(f"prices.{bad[0]}", "no such price", ", ".join(Prices.__dataclass_fields__))
    return Prices(**fields)


def example_prices(system, rent: bool | None = None, **override) -> Prices:
    """Dated example prices for ``system`` from ``prices.toml`` (sources and dates there):
    its devices' rent per hour (``rent=True``) or their purchase price over four years
    with the example electricity price of the region it typically runs in (``False``);
    by default rent where an example rent exists, else purchase. They are examples to
    start from, not quotes."""
    from .presets import read_toml
    from .presets import system as load_system
    from .presets.loader import DATA
    s = load_system(system)
    table = read_toml(DATA / "prices.toml", "prices.toml")
    devices, systems = table.get("device_hour", {}), table.get("capex", {})
    if rent is None:
        rent = s.device.name in devices
    if rent:
        if s.device.name not in devices:
            raise SnlabError("prices", f"no example rent for {s.device.name}", ", ".join(devices))
        base = dict(device_hour=float(devices[s.device.name]["value"]))
    else:
        if s.name not in systems:
            raise SnlabError("prices", f"no example purchase price for {s.name}", ", ".join(systems))
        region = systems[s.name].get("electricity", "us")
        base = dict(capex=float(systems[s.name]["value"]), years=4.0,
                    kwh=float(table["kwh"][region]["value"]))
    return Prices(**{**base, **override})


# --- cooling -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CoolingState:
    """A system under one kind of cooling: its PUE; the power a device may draw
    [W] (``NO_CAP`` when the rack removes what its devices draw at their limit); the
    clock the devices sustain; how many devices a rack holds; and the full-load power of
    a rack [W] as built."""

    kind: str
    pue: float
    rack_power_limit_w: float
    device_cap_w: float
    sustained_clock: float
    devices_per_rack: int
    rack_full_power_w: float


def _rack_overhead(system) -> float:
    """Power per device beyond the device that sits in its rack [W]: its share of the
    node's host, and of the scale-up switches when they are in the compute racks (no
    separate switch racks)."""
    p, n_dom = system.power, system.scale_up.domain_size
    return p.host_power / system.devices_per_node + (p.switch_power / n_dom if not p.network_racks else 0.0)


def cooling_state(system, kind: str | None = None) -> CoolingState:
    """``system`` under the cooling ``kind`` (default: the one it is built for).

    A rack holds ``devices_per_rack`` as built. If its cooling cannot remove what they
    draw at their limit, a rack of separate servers holds fewer whole nodes; a rack
    whose scale-up wiring fixes it (``rack_split`` False) keeps them and the devices are
    held to the power it allows, at the clock :data:`~snlab.walls.power.thermal_clock`
    gives (or the clock the preset measured under that cooling). Raises
    :class:`SnlabError` when a rack cannot even hold its devices' idle power."""
    if not system.has_power:
        raise SnlabError(f"{system.name}.power", "the preset has no power model",
                         "a system whose device has [power] and which has [power] and [cooling] sections")
    kind = kind or system.cooling_kind
    if kind not in system.cooling:
        raise SnlabError("cooling", f"got {kind!r}", ", ".join(system.cooling))
    cool, dev, p = system.cooling[kind], system.device, system.power
    overhead = _rack_overhead(system)
    per_device = dev.tdp + overhead
    full = p.devices_per_rack * per_device
    limit = cool.rack_power_limit
    per_rack, cap, clock = p.devices_per_rack, NO_CAP, 1.0
    if full > limit:
        nodes = math.floor(limit / (system.devices_per_node * per_device))
        if p.rack_split and nodes >= 1:
            per_rack = min(nodes * system.devices_per_node, p.devices_per_rack)
        else:
            per_rack = p.devices_per_rack if not p.rack_split else system.devices_per_node
            cap = limit / per_rack - overhead
            clock = float(pw.thermal_clock(rack_power_limit=limit, rack_devices=float(per_rack),
                                           overhead_power=overhead, idle_power=dev.idle_power, tdp=dev.tdp))
            if clock <= 1e-3:
                need = per_rack * (dev.idle_power + overhead) / 1e3
                raise SnlabError("cooling", f"{kind} cooling removes {limit / 1e3:.3g} kW per rack; the "
                                 f"{per_rack} devices of a {system.name} rack draw {need:.3g} kW idle",
                                 f"another cooling ({', '.join(k for k in system.cooling if k != kind)}) or a "
                                 f"rack limit above {full / 1e3:.3g} kW")
    if cool.sustained_clock:
        clock = cool.sustained_clock
    return CoolingState(kind=kind, pue=cool.pue, rack_power_limit_w=limit, device_cap_w=cap,
                        sustained_clock=clock, devices_per_rack=int(per_rack), rack_full_power_w=full)


def cooled(system, kind: str | None, keep_clock: bool = False):
    """``system`` under the cooling ``kind``: the same system when ``kind`` is None or the
    one it is built for (its device's sustained clock was measured under it), else a copy
    whose cooling is ``kind`` and whose device runs at the clock that cooling sustains
    (the user's own ``sustained_clock`` wins: ``keep_clock``)."""
    from .presets import system as load_system
    s = load_system(system)
    if kind is None or kind == s.cooling_kind:
        if kind is not None:
            cooling_state(s, kind)    # checks the system has a power model
        return s
    if not isinstance(kind, str) or kind not in KINDS:
        raise SnlabError("cooling", f"got {kind!r}", ", ".join(KINDS))
    state = cooling_state(s, kind)
    out = s.replace(cooling_kind=kind)
    if not keep_clock:
        out = out.replace(device=s.device.replace(sustained_clock=round(state.sustained_clock, 6)))
    return out


# --- activity --------------------------------------------------------------------------

def _fraction(x):
    return np.clip(x, 0.0, 1.0)


def training_activity(out: dict, hw, optimizer_on_host) -> tuple:
    """Compute, memory and link activity of a training step [1], from its columns.

    Compute: the step's hardware FLOPs at the matrix multiplies' achievable rate, over
    the step. Memory: the compute kernels' time beyond that (element-wise work, attention
    below the GEMM rate, small GEMMs reading their weights) and the optimizer step on the
    device, which stream HBM. Links: every collective's time, hidden or not."""
    step = out["step_time_s"]
    rate = hw.gemm_efficiency * hw.sustained_clock * hw.peak_flops
    flop_time = out["hardware_tflops_per_device"] * 1e12 * step / rate
    optimizer = where(optimizer_on_host, 0.0, out["time_optimizer_s"])
    memory = np.maximum(out["time_compute_s"] - flop_time, 0.0) + optimizer
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
    return pw.device_power(tdp=np.minimum(hw.tdp, hw.power_cap), idle_power=hw.idle_power, compute_activity=uc,
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
POWER_COLUMNS = ("compute_activity", "memory_activity", "link_activity", "device_power_w", "it_power_w",
                 "facility_power_w", "device_energy_per_token_j", "it_energy_per_token_j", "energy_per_token_j",
                 "tokens_per_joule", "racks", "pue")
COST_COLUMNS = ("cost_per_hour_usd", "cost_per_million_tokens_usd", "tokens_per_dollar")


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
    per_rack = np.maximum(hw.devices_per_rack, 1.0)
    racks = np.ceil(everyone / per_rack - 1e-9) + hw.network_racks * np.ceil(everyone / hw.scale_up_domain_size - 1e-9)
    out = {"compute_activity": uc, "memory_activity": um, "link_activity": ul, "device_power_w": device_w,
           "it_power_w": it, "facility_power_w": facility,
           "device_energy_per_token_j": pw.energy_per_token(power=device_total, throughput=tokens_per_s),
           "it_energy_per_token_j": pw.energy_per_token(power=it, throughput=tokens_per_s),
           "energy_per_token_j": pw.energy_per_token(power=facility, throughput=tokens_per_s),
           "tokens_per_joule": tokens_per_s / facility, "racks": racks,
           "pue": np.broadcast_to(np.float64(ratio), np.shape(facility))}
    if prices is not None:
        rate = pw.cost_rate(devices=everyone, facility_power=facility, **prices.inputs())
        per_token = pw.cost_per_token(cost_rate=rate, throughput=tokens_per_s)
        out.update(cost_per_hour_usd=rate * 3600.0, cost_per_million_tokens_usd=per_token * 1e6,
                   tokens_per_dollar=1.0 / per_token)
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
    idle power."""
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
    tokens = where(dep["scenario"] == 1, out["offline_tokens_per_s"], continuous)
    return power_columns(out["devices"], device_w, tokens, hw, activity, prices, pue, idle_devices=lenders)


def full_load(system, cooling: str | None = None, devices: int | None = None) -> dict:
    """Power of ``devices`` devices of ``system`` (default: one scale-up domain) with
    every device at its limit, as rack and system power ratings count it: device, IT and
    facility power [W] and the racks."""
    from .hardware import hardware
    from .presets import system as load_system
    s = cooled(load_system(system), cooling)
    hw = hardware(s)
    n = float(devices or s.scale_up.domain_size)
    activity = (1.0, 0.0, 0.0)
    cols = power_columns(n, device_power(hw, activity), 1.0, hw, activity)
    return {k: float(cols[k]) for k in ("device_power_w", "it_power_w", "facility_power_w", "racks", "pue")}
