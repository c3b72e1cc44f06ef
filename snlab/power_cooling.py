"""Cooling: what a kind of cooling does to a system.

A system preset describes each kind of cooling it can run under (``[cooling.air]``,
``[cooling.liquid]``): the facility's PUE and the power a rack may draw. Under one of
them, :func:`cooling_state` says how many devices a rack holds, the power each device
may draw and the clock it sustains; :func:`cooled` gives the system under that cooling,
its device at that clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SnlabError
from .units import fmt_watts
from .walls import power as pw
from . import kernel as _kernel

_kernel.loaded(__name__)

#: the kinds of cooling
KINDS = ("air", "liquid")
#: a rack whose cooling removes what its devices draw: no cap on a device's power [W]
NO_CAP = 1e9
#: the lowest clock a device may be held to (the range of ``sustained_clock``), and the
#: digits a derived clock keeps
MIN_CLOCK, CLOCK_DIGITS = 1e-3, 6


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
    per_rack, cap, clock = p.devices_per_rack, NO_CAP, 1
    if full > limit:
        nodes = math.floor(limit / (system.devices_per_node * per_device))
        if p.rack_split and nodes >= 1:
            per_rack = min(nodes * system.devices_per_node, p.devices_per_rack)
        else:
            per_rack = p.devices_per_rack if not p.rack_split else system.devices_per_node
            cap = limit / per_rack - overhead
            clock = float(pw.thermal_clock(rack_power_limit=limit, rack_devices=float(per_rack),
                                           overhead_power=overhead, idle_power=dev.idle_power, tdp=dev.tdp))
            if clock <= MIN_CLOCK:
                need = per_rack * (dev.idle_power + overhead)
                raise SnlabError("cooling", f"{kind} cooling removes {fmt_watts(limit)} per rack; the "
                                 f"{per_rack} devices of a {system.name} rack draw {fmt_watts(need)} idle",
                                 f"another cooling ({', '.join(k for k in system.cooling if k != kind)}) or a "
                                 f"rack limit above {fmt_watts(full)}")
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
    key = (id(s), kind, bool(keep_clock))
    asked, made = _COOLED.get(key, (None, None))
    if asked is s:
        return made
    state = cooling_state(s, kind)
    out = s.replace(cooling_kind=kind)
    if not keep_clock:
        out = out.replace(device=s.device.replace(sustained_clock=round(state.sustained_clock, CLOCK_DIGITS)))
    if len(_COOLED) >= COOLED_KEPT:
        del _COOLED[next(iter(_COOLED))]
    _COOLED[key] = (s, out)
    return out


#: the systems :func:`cooled` made, by (system, cooling, clock kept), with the system
#: asked about: the same question gives the same object, which the planners' scalar
#: kernels (:mod:`snlab.kernel`) then know again; the oldest goes past COOLED_KEPT
_COOLED: dict = {}
COOLED_KEPT = 64
