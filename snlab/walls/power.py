"""The fourth wall: power, energy and cost.

A device draws its idle power (static power and the clocks of a device with a model
resident) plus a dynamic part for each kind of activity: its compute units working at
their achievable rate, its HBM streaming, its scale-up links carrying traffic; the sum
is held to the device's power limit (TDP), which is where a power-limited matrix
multiply runs. This static-plus-dynamic split is the one the ML.ENERGY leaderboard uses
to explain energy per token (Chung et al. 2025, arXiv 2505.06371; ML.ENERGY blog,
"Static power wastage"), and a compute-bound phase at the power limit is what Patel et
al. 2024 (Splitwise, ISCA; POLCA, ASPLOS) measured for prefill and training.

A job's IT power adds, per device, its share of the node's host (CPUs, memory, NICs,
fans, power conversion), of the scale-up domain's switches and optics, and of the
scale-out network. Facility power multiplies by the PUE (The Green Grid, White Paper 49,
2012). Energy per token divides a power by the token rate. A job's cost per second of
work is the devices' rent, or their purchase written off over their years of use, both
over the share of paid hours the devices do this work, plus the electricity the facility
draws; per token, divided by the token rate.

When a rack's cooling removes less heat than its devices would draw at their limit,
the devices are held to what the rack allows and their clock falls with the dynamic
power they give up (:data:`thermal_clock`).
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

Pidle, Ptdp = sym.idle_power, sym.tdp
uc, um, ul = sym.compute_activity, sym.memory_activity, sym.link_activity
eB, eL = sym.hbm_energy, sym.link_energy
B, eta_m = sym.memory_bandwidth, sym.memory_efficiency
b1, e1 = sym.inner_bandwidth, sym.inner_efficiency
Pdev, Phost, Psw, Pnet, Po = (sym.device_power, sym.host_power, sym.switch_power, sym.network_power,
                              sym.overhead_power)
Ndev, nnode, ndom = sym.devices, sym.node_devices, sym.domain_devices
Pit, pue, Pfac, P, X = sym.it_power, sym.pue, sym.facility_power, sym.power, sym.throughput
ch, Ccap, Tlife, rho, cE = sym.device_price, sym.capex, sym.lifetime, sym.fleet_utilisation, sym.energy_price
Cdot = sym.cost_rate
Prack, nrack = sym.rack_power_limit, sym.rack_devices

# --- a device -----------------------------------------------------------------------

device_power = Formula(
    "device_power", "device_power",
    sp.Min(Ptdp, Pidle + (Ptdp - Pidle) * uc + eB * eta_m * B * um + eL * e1 * b1 * ul),
    "static plus dynamic power (Chung et al. 2025, ML.ENERGY); a compute-bound phase at the power limit "
    "(Patel et al. 2024, Splitwise: prefill at TDP)",
    "Idle power, plus the power limit's headroom for the time the compute units work at "
    "their achievable rate (a power-limited matrix multiply draws the TDP), plus the HBM's "
    "energy per byte at its achievable bandwidth for the time it streams, plus the links' "
    "energy per byte sent at the scale-up bandwidth for the time they carry traffic; never "
    "above the TDP (the device lowers its clock to stay under it).",
)

# --- a job's IT and facility power ---------------------------------------------------

overhead_power = Formula(
    "overhead_power", "overhead_power",
    Phost / nnode + Psw / ndom + Pnet,
    "vendors' system power specifications, split per device",
    "Power per device beyond the device: its share of its node's host (CPUs, memory, NICs, "
    "fans, power conversion), of its scale-up domain's switches and optics, and its "
    "scale-out network ports.",
)

it_power = Formula(
    "it_power", "it_power",
    Ndev * (Pdev + Po),
    "sum over the job's devices",
    "IT power of a job on N devices: each device and its share of hosts, switches and network.",
)

facility_power = Formula(
    "facility_power", "facility_power",
    pue * Pit,
    "The Green Grid, White Paper 49 (2012): PUE = facility energy / IT equipment energy",
    "Power drawn from the grid: IT power times the facility's PUE (cooling, power "
    "distribution and conversion losses, lighting).",
)

energy_per_token = Formula(
    "energy_per_token", "energy_per_token",
    P / X,
    "energy = power x time",
    "Energy per token of a job that draws power P while producing X tokens per second "
    "(device, IT or facility power: say which).",
)

# --- cost ------------------------------------------------------------------------------

cost_rate = Formula(
    "cost_rate", "cost_rate",
    Ndev * (ch + Ccap / Tlife) / rho + cE * Pfac,
    "total cost of ownership per busy second: rent or straight-line depreciation, plus electricity",
    "What a second of the job's work costs: each device's rent per second, or its purchase "
    "price written off over its years of use, spread over the share rho of paid hours the "
    "devices do this work; plus the electricity the facility draws while it runs (a rented "
    "device's price usually includes it: give no energy price then).",
)

cost_per_token = Formula(
    "cost_per_token", "cost_per_token",
    Cdot / X,
    "cost = cost rate x time",
    "Cost per token of a job that costs C-dot per second and produces X tokens per second.",
)

# --- cooling: the clock a rack's heat removal allows ------------------------------------

thermal_clock = Formula(
    "thermal_clock", "sustained_clock",
    sp.Min(1, sp.Max(0, (Prack / nrack - Po - Pidle) / (Ptdp - Pidle))),
    "dynamic power ~ switched capacitance x V^2 x clock (CMOS); at a fixed voltage the clock falls in proportion "
    "to the dynamic power removed, which bounds the loss from above (DVFS also lowers the voltage)",
    "The sustained clock of devices whose rack can remove P_rack: each device may draw the "
    "rack's power over its n_rack devices less its share of host, switches and network; "
    "what it gives up of its dynamic power (TDP - idle) it gives up of its clock. 1 when "
    "the rack removes what its devices draw at their limit.",
)
