"""The training claims: C4-C8, C11, C12, C15, C16. Each takes the inputs that decide it
as arguments, defaulting to the article's setting, so that a different system, model
or plan can flip it."""

from __future__ import annotations

import math

import numpy as np

from .. import uncertainty
from .verdict import CONDITIONAL, FAILS, HOLDS, Decision, Verdict, verdict_of

TRILLION = dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072, recompute="full")


def _band(system):
    from ..presets import system as load
    return uncertainty.band("training", load(system).device.family)


def _lost(row) -> float:
    """Share of a step lost to synchronisation: exposed communication, the pipeline
    bubble, and the compute slowed by the communication hidden beside it."""
    return float((row.exposed_comm_s + row.time_bubble_s + row.time_contention_s) / row.step_time_s)


def c4_c5(cluster="pcie-ethernet-a100", supernode="cloudmatrix384", model="megatron-1t", devices=3072) -> Verdict:
    """C4/C5: on PCIe/Ethernet clusters, synchronisation eats 30-40% of utilisation at
    trillion scale; such clusters reach 30-40% MFU. Tested with the plan of the
    published trillion-parameter run (Narayanan et al. 2021) and with the best plan
    ``search`` finds for the same cluster."""
    from ..training import search, sweep
    paper = sweep(model, cluster, **TRILLION).iloc[0]
    best = search(model, cluster, devices=devices, global_batch=devices, top=1).iloc[0]
    cm = search(model, supernode, devices=devices, global_batch=devices, top=1).iloc[0]
    band = _band(cluster)
    decisions = (Decision("share lost with the paper's plan", _lost(paper), 0.25, True, band),
                 Decision("MFU with the paper's plan", float(paper.mfu), 0.45, False, band),
                 Decision("share lost with the best plan", _lost(best), 0.25, True, band),
                 Decision("MFU with the best plan", float(best.mfu), 0.45, False, band))
    verdict = HOLDS if all(d.passes for d in decisions) else (
        CONDITIONAL if decisions[0].passes and decisions[1].passes else FAILS)
    return Verdict("C4/C5", "On PCIe-in-server, Ethernet-between-servers clusters, synchronisation and link "
                            "bandwidth eat 30-40% of utilisation at trillion scale; MFU stays at 30-40%.",
                   verdict, "the plan is the one built for NVLink servers (tp 8 across PCIe, 64 pipeline "
                            "stages); the best plan for the cluster keeps tensor parallelism small and loses less",
                   {"paper's plan: MFU": float(paper.mfu), "paper's plan: share lost": _lost(paper),
                    "best plan: MFU": float(best.mfu), "best plan: share lost": _lost(best),
                    "supernode best plan: MFU": float(cm.mfu), "supernode best plan: share lost": _lost(cm)},
                   f"{model} on {devices:,} devices of {cluster} (and {supernode} for contrast); the paper's plan is "
                   "tp 8, pp 64, dp 6 with full recomputation. 'Share lost' is exposed communication, the "
                   "pipeline bubble and the compute slowed by overlapped communication, as a share of the step.",
                   decisions)


def c6(cluster="pcie-ethernet-a100", supernode="cloudmatrix384") -> Verdict:
    """C6: a cross-node all-reduce costs tens of microseconds conventionally and is
    sub-microsecond inside a supernode."""
    from ..hardware import hardware
    from ..network import all_reduce, inner_step_latency
    from ..presets import system as load
    hw_p, hw_c = hardware(load(cluster)), hardware(load(supernode))
    small, big, n = np.array(64e3), np.array(2048 * 25600 * 2.0), np.array(16.0)
    t = {k: float(all_reduce(S, n, 1.0, hw)) for k, S, hw in
         (("small_p", small, hw_p), ("small_c", small, hw_c), ("big_p", big, hw_p), ("big_c", big, hw_c))}
    basis = "the collective model, checked against nccl-tests on DGX A100 and H100, with no published run on the supernode"
    decisions = (Decision("large all-reduce, cluster over supernode", t["big_p"] / t["big_c"], 10.0, True,
                          basis=basis),
                 Decision("64 kB all-reduce over 16 on the supernode [us]", t["small_c"] * 1e6, 1.0, False,
                          basis=basis))
    hop = float(inner_step_latency(n, hw_c))
    return Verdict("C6", "A cross-node all-reduce costs tens of microseconds on a conventional network; "
                         "inside a supernode it is sub-microsecond and almost negligible.", verdict_of(decisions),
                   "the messages are large: bandwidth-bound all-reduces are far faster on the supernode, but a "
                   "small all-reduce still pays tens of microseconds of per-call and per-step latency there too",
                   {"64 kB over 16, cluster [us]": t["small_p"] * 1e6, "64 kB over 16, supernode [us]": t["small_c"] * 1e6,
                    "105 MB over 16, cluster [ms]": t["big_p"] * 1e3, "105 MB over 16, supernode [ms]": t["big_c"] * 1e3,
                    "supernode: mean ring step [us]": hop * 1e6,
                    "supernode: per-call latency [us]": hw_c.scale_up_call_latency * 1e6},
                   "Two-level alpha-beta all-reduce; each ring step pays its own level's latency (inside a node, "
                   "between nodes of the bus, between domains) and each call a fixed cost, with their sources in "
                   "the system presets. 105 MB is one layer's activations of the 1T model. The collective model is "
                   "checked against nccl-tests on DGX A100 and H100 (tests/test_collectives.py), not on the "
                   "supernode.", decisions)


def c7(parallelism="tp") -> Verdict:
    """C7: tensor parallelism depends on high-bandwidth all-to-all. Measured as how much
    slower ``parallelism``'s traffic gets when the all-to-all kernels run at half speed."""
    from ..presets import system as load
    from ..training import train
    cm = load("cloudmatrix384")
    half = cm.replace(scale_up_ep_bulk_efficiency=cm.scale_up.ep_bulk_efficiency / 2)
    plan = dict(tp=4, pp=16, dp=8, ep=8, micro_batch=1, global_batch=256, recompute="full")
    base, slow = train("deepseek-v3", cm, **plan), train("deepseek-v3", half, **plan)
    sensitivity = slow.time_s[parallelism] / base.time_s[parallelism] - 1 if base.time_s[parallelism] else 0.0
    d = Decision(f"slow-down of the {parallelism} traffic with all-to-all at half speed", sensitivity, 0.1, True,
                 basis="which collective each parallelism issues: a property of the algorithms, not a fit")
    return Verdict("C7", "Tensor parallelism depends on high-bandwidth all-to-all communication.",
                   HOLDS if d.passes else FAILS, "",
                   {"tensor-parallel all-reduce time per step [s]": base.time_s["tp"],
                    "expert-parallel all-to-all time per step [s]": base.time_s["ep"],
                    f"{parallelism} traffic with all-to-all at half speed [s]": slow.time_s[parallelism]},
                   "Tensor parallelism exchanges partial sums with all-reduce (or reduce-scatter and all-gather "
                   "with sequence parallelism), 4 per layer per micro-batch (Narayanan et al. 2021); all-to-all "
                   "is the collective of expert parallelism (dispatch and combine). DeepSeek-V3 on CloudMatrix384.",
                   (d,))


def c8(system="dgx-a100", model="llama3-70b") -> Verdict:
    """C8: offloading optimizer state to CPU memory roughly halves training efficiency."""
    from ..training import train
    base = dict(tp=8, pp=4, dp=2, recompute="full", zero=1, micro_batch=1)
    kept, parts = {}, {}
    for batch in (2, 1024):
        on = train(model, system, offload="optimizer", global_batch=batch, **base)
        off = train(model, system, offload="none", global_batch=batch, **base)
        kept[batch] = on.tokens_per_s / off.tokens_per_s
        parts[batch] = (on.time_s["optimizer"], on.time_s["offload"], off.step_time_s)
    band = _band(system)
    decisions = (Decision("throughput kept, one micro-batch per step", kept[2], 0.6, False, band),
                 Decision("throughput kept, 512 micro-batches per step", kept[1024], 0.6, False, band))
    host, pcie, step = parts[2]
    return Verdict("C8", "Offloading optimizer state or weights to CPU memory roughly halves training efficiency.",
                   verdict_of(decisions), "the step is short next to the CPU's Adam update and the PCIe round trip",
                   {"throughput kept, one micro-batch per step": kept[2],
                    "throughput kept, 512 micro-batches per step": kept[1024],
                    "CPU Adam step [s]": host, "gradients out and weights back over PCIe [s]": pcie,
                    "step without offload, one micro-batch [s]": step},
                   f"{model} on 64 devices of {system} (tp 8, pp 4, dp 2), ZeRO-1, optimizer state on the host. The "
                   "CPU's Adam streams about 34 bytes per parameter through host DRAM (snlab.walls.memory."
                   "optimizer_step_traffic at the host's peak DRAM bandwidth: a lower bound), and the gradients "
                   "out and the weights back cross PCIe, once per step: many micro-batches per step amortise both.",
                   decisions)


def c11(model="llama3-70b", cluster="pcie-ethernet-a100", supernode="cloudmatrix384", plan=None) -> Verdict:
    """C11: synchronisation takes tens of milliseconds per iteration on a conventional
    cluster, and a supernode overlaps communication with computation >= 40% better."""
    from ..training import train
    plan = plan or dict(tp=16, pp=4, dp=8, micro_batch=1, global_batch=512, recompute="selective")
    p, c = train(model, cluster, **plan), train(model, supernode, **plan)

    def hidden_share(r):
        total = sum(r.time_s[k] for k in ("tp", "ep", "cp", "pp", "dp", "zero"))
        return 1 - r.time_s["exposed_communication"] / total if total else 1.0

    # "40% better": the supernode's share at least 1.4 times the cluster's, as a difference
    # so that a cluster hiding nothing gives a number one can read, not a ratio over zero
    better = hidden_share(c) - 1.4 * hidden_share(p)
    decisions = (Decision("exposed synchronisation per step on the cluster [s]",
                          p.time_s["exposed_communication"], 0.1, False, _band(cluster)),
                 Decision("share of communication hidden on the supernode less 1.4 times the cluster's", better,
                          0.0, True, _band(supernode), strict=True))
    passes = [d.passes for d in decisions]
    verdict = HOLDS if all(passes) else (CONDITIONAL if any(passes) else FAILS)
    condition = ("taken as its overlap half alone: the cluster's synchronisation takes far more than tens of "
                 "milliseconds per step" if passes[1] else "taken as its first half alone: the cluster's "
                 "synchronisation is tens of milliseconds, but the supernode hides less than 40% more of it")
    return Verdict("C11", "Synchronisation takes tens of milliseconds per iteration on a conventional cluster; on "
                          "the supernode communication overlaps computation 40% better or more.", verdict, condition,
                   {"exposed communication per step, cluster [s]": p.time_s["exposed_communication"],
                    "exposed communication per step, supernode [s]": c.time_s["exposed_communication"],
                    "communication hidden, cluster": hidden_share(p), "communication hidden, supernode": hidden_share(c)},
                   f"{model} with the plan {plan} on {cluster} and {supernode}, overlap 'standard'.", decisions)


def _micro_batch_steps(model, system, seq, **plan):
    """Step time by micro-batch (1 to 32) of the plans that fit."""
    from ..training import sweep
    df = sweep(model, system, micro_batch=[1, 2, 4, 8, 16, 32], seq_len=seq, **plan)
    return df[df.fits].set_index("micro_batch")["step_time_s"]


def c12(cluster="pcie-ethernet-a100", supernode="cloudmatrix384", cases=None) -> Verdict:
    """C12: on a supernode, use about a quarter of the micro-batch a conventional network
    wants. Decided on step times, not on which micro-batch wins by a hair: the
    supernode's step at a quarter of the cluster's best micro-batch, over its own best. A
    quarter that runs within the model's margin (10%) of the best would let the advice
    stand; one clearly slower refutes it."""
    cases = cases or {"8B at s=256": ("llama3-8b", 256, dict(tp=8, pp=8, dp=1, global_batch=512, recompute="selective")),
                      "1T at s=2048": ("megatron-1t", 2048, dict(tp=8, pp=32, dp=4, global_batch=512,
                                                                  recompute="full"))}
    numbers, ratios = {}, []
    for name, (model, seq, plan) in cases.items():
        cl, sn = _micro_batch_steps(model, cluster, seq, **plan), _micro_batch_steps(model, supernode, seq, **plan)
        quarter = max(1, int(cl.idxmin()) // 4)
        ratio = float(sn.loc[quarter] / sn.min())
        numbers[f"best micro-batch, {name}, cluster"] = int(cl.idxmin())
        numbers[f"supernode step at micro-batch {quarter} over its best, {name}"] = ratio
        ratios.append(ratio)
    d = Decision("supernode step at a quarter of the cluster's best micro-batch, over its best", max(ratios), 1.10,
                 False, basis="the same system and plan on both sides: the 10% margin of a comparison inside the "
                              "model")
    return Verdict("C12", "On a supernode, maximise overlap and cut the micro-batch to about a quarter of what a "
                          "conventional network wants.", HOLDS if d.passes else FAILS, "", numbers,
                   "Long sequences: both prefer micro-batch 1 (the bubble dominates). Short sequences: once "
                   "bandwidth-bound traffic is cheap, per-micro-batch fixed costs (weights read, latency) "
                   "dominate, so a quarter of the cluster's micro-batch runs the supernode clearly slower than its "
                   "best.", (d,))


def c15(supernode="cloudmatrix384", cluster="dgx-h100", air_rack_limit=None) -> Verdict:
    """C15: air cooling throttled the chips and cost about 20% of compute. Decided on the
    clock each system sustains under air cooling (:func:`snlab.power_cooling.cooling_state`):
    the supernode, built for liquid, in a conventional air-cooled room (its preset's
    ``[cooling.air]``, or a room removing ``air_rack_limit`` per rack), against a cluster
    built for air; and the training throughput that clock costs."""
    from ..power_cooling import cooling_state
    from ..presets import system as load
    from ..specs import Cooling
    from ..training import train
    plan = dict(tp=8, pp=16, dp=2, micro_batch=1, global_batch=512, recompute="full")
    sn = load(supernode)
    if air_rack_limit is not None:
        from ..units import parse_quantity
        limit = parse_quantity(air_rack_limit, "W", "air_rack_limit")[0] if isinstance(air_rack_limit, str) \
            else float(air_rack_limit)
        cools = dict(sn.cooling)
        cools["air"] = Cooling(kind="air", pue=cools["air"].pue, rack_power_limit=limit)
        sn = sn.replace(cooling=cools)
    lost, states = {}, {}
    for system in (sn, load(cluster)):
        states[system.name] = cooling_state(system, "air")
        design = train("llama3-70b", system, **plan)
        air = train("llama3-70b", system, cooling="air", **plan)
        lost[system.name] = 1 - air.tokens_per_s / design.tokens_per_s
    cs, cc = states[sn.name], states[load(cluster).name]
    decisions = (Decision(f"throughput lost under air cooling, {sn.name}", lost[sn.name], 0.15, True, _band(supernode)),
                 Decision(f"throughput lost under air cooling, {cc.kind} room, {cluster}", lost[load(cluster).name],
                          0.15, True, _band(cluster)))
    # the rack power at which the supernode's clock would lose 15%: each device at its idle
    # power, 85% of its dynamic power and its share of the rack's host
    full_kw = cs.rack_full_power_w / 1e3
    dev = sn.device
    overhead = cs.rack_full_power_w / cs.devices_per_rack - dev.tdp
    edge_kw = cs.devices_per_rack * (overhead + dev.idle_power + 0.85 * (dev.tdp - dev.idle_power)) / 1e3
    return Verdict("C15", "Air cooling let the chips throttle and cost about 20% of compute.", verdict_of(decisions),
                   f"the system was built for liquid and its racks stand in an air-cooled room that removes less "
                   f"than about {edge_kw:.0f} kW per rack (they draw {full_kw:.0f} kW at full clock); a system "
                   "built for air loses nothing to it",
                   {f"sustained clock under air, {sn.name}": cs.sustained_clock,
                    f"rack limit of the air room, {sn.name} [kW]": cs.rack_power_limit_w / 1e3,
                    f"rack power at full clock, {sn.name} [kW]": full_kw,
                    f"throughput lost under air, {sn.name}": lost[sn.name],
                    f"sustained clock under air, {cluster}": cc.sustained_clock,
                    f"throughput lost under air, {cluster}": lost[load(cluster).name],
                    "measured air against liquid, 8 x H100 under a GPU burn (Latif et al. 2025)": 1 - 46 / 54},
                   "The clock follows from the heat a rack's cooling removes: devices held to the rack's power "
                   "give up the dynamic power they cannot draw, and their clock with it (snlab.walls.power."
                   "thermal_clock; at a fixed voltage, an upper bound on the loss). llama3-70b, tp 8, pp 16, dp 2. "
                   "Measured: an air-cooled H100 node ran a sustained GPU burn 17% slower than a liquid-cooled "
                   "one (Latif et al. 2025, two different machines); Llama 3's 16k H100s varied 1-2% with the "
                   "day's temperature (Dubey et al. 2024). The article's 20% is one report of a supernode built "
                   "for liquid, in air-cooled racks.", decisions)


def c16(model="llama3-405b", system="cloudmatrix384", devices=384, global_batch=1024, seq_len=None,
        power_budget=None) -> Verdict:
    """C16: size the job first from parameters, batch and context, then choose one
    supernode or several. Tested by whether the sizing a reader can do by hand (model
    states at 16 bytes per parameter, plus one layer input per layer and token kept for
    recomputation) agrees with the fastest plan ``search`` finds on one supernode; and,
    given a ``power_budget`` [W or e.g. '1 MW'], whether that plan's facility power fits
    it. The numbers give each choice's power and racks: one supernode, and two."""
    from ..presets import model as load_model
    from ..presets import system as load_system
    from ..training import search
    from ..training.planner import power_budget_w
    m, s = load_model(model), load_system(system)
    seq = seq_len or m.seq_len
    states = 16 * m.params
    activations = 2.0 * m.hidden_size * m.layers * seq * global_batch / 32    # full recompute, 1/32 of the batch in flight
    estimate = math.ceil((states + activations) / s.device.usable_memory)
    df = search(m, s, devices=devices, global_batch=global_batch, seq_len=seq, top=1)
    two = search(m, s, devices=2 * devices, global_batch=global_batch, seq_len=seq, top=1)
    feasible = not df.empty
    agree = (estimate <= devices) == feasible
    decisions = [Decision("hand sizing and the planner agree (1 yes, 0 no)", float(agree), 1.0, True,
                          basis="a yes-or-no agreement between the estimate and the planner")]
    budget = power_budget_w(power_budget)
    numbers = {"devices the hand sizing asks for": estimate, "devices of one supernode": devices,
               "a plan fits one supernode": feasible,
               "best MFU on one supernode": float(df.iloc[0].mfu) if feasible else 0.0}
    for label, frame in (("one supernode", df), ("two supernodes", two)):
        if not frame.empty and "facility_power_w" in frame:
            row = frame.iloc[0]
            numbers.update({f"facility power, {label} [kW]": float(row.facility_power_w) / 1e3,
                            f"racks, {label}": int(row.racks),
                            f"energy per training token, {label} [J]": float(row.energy_per_token_j),
                            f"tokens per second, {label}": float(row.tokens_per_s)})
    if budget is not None:
        power = float(df.iloc[0].facility_power_w) if feasible else math.inf
        decisions.append(Decision("facility power of the plan on one supernode [W]", power, budget, False,
                                  basis="the power model's sum over devices, hosts, switches and the PUE"))
    return Verdict("C16", "Size the job first: estimate memory and compute from parameters, batch and context, "
                          "then choose one supernode or several.", HOLDS if all(d.passes for d in decisions) else FAILS,
                   "", numbers,
                   f"{model}, {global_batch} sequences of {seq:,} tokens, on {system}: the hand estimate says "
                   f"{'one supernode' if estimate <= devices else 'several supernodes'}; snlab.search "
                   f"{'finds a' if feasible else 'finds no'} plan that fits {devices} devices. The power and racks "
                   "are what each choice asks of the building"
                   + (f"; the budget is {budget / 1e3:,.0f} kW." if budget is not None else "."), tuple(decisions))
