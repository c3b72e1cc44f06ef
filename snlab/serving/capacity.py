"""Capacity planning: how many devices of a system serve a request rate within latency
targets, colocated or disaggregated, and in which split.

For each plan of an instance (tensor-parallel degrees from the smallest that holds the
weights and a working KV cache, doubling up to the scale-up domain), the largest rate
one instance serves with ``attainment_level`` of its requests within the targets is
found by bisection on discrete-event runs (:func:`max_rate`), bracketed first by the
closed forms. A colocated deployment takes ``ceil(R / r)`` instances of the plan with the
fewest devices in all. A disaggregated one matches rates (TensorRT-LLM's rate matching,
:data:`snlab.walls.queueing.goodput_per_device`): prefill plans meet the TTFT target,
decode plans the TPOT target (each at half the missed share, so that both together meet
``attainment_level``), and the pair of plans and the split ``n_P : n_D`` with the fewest
devices wins. Each winner is then run at the full rate, and a pool that misses is grown
until the run meets the targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SnlabError
from ..hardware import hardware
from ..presets import model as load_model
from ..presets import system as load_system
from ..result import Result
from ..units import fmt_seconds
from ..walls import queueing as qw
from . import approx
from .disaggregation import transfer_times
from .disaggregation import kv_link, run_disaggregated
from .load import MAX_INSTANCES, check_targets, read_target, serve_load, share, split_kwargs
from .load_result import LoadResult
from .queueing import run_instance
from .service import instance
from .workload import Requests, workload

#: bisection steps on an instance's rate, and the requests of each search run
STEPS, SEARCH_REQUESTS = 7, 400
#: runs that grow a pool which misses the targets at the full rate
GROW = 4


def plans(model, system, max_context: float, **deployment) -> list[int]:
    """Tensor-parallel degrees worth planning: the smallest power of two that divides
    the heads and holds the weights with room for at least one request's KV cache, and
    the next two doublings, within the scale-up domain."""
    m, s = load_model(model), load_system(system)
    top = int(min(hardware(s).scale_up_domain_size, 64))
    out = []
    tp = 1
    while tp <= top and len(out) < 3:
        if m.heads % tp == 0 and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0):
            try:
                svc = instance(model, system, max_context=max_context, tp=tp, **deployment)
            except SnlabError:
                svc = None
            if svc is not None and svc.kv_tokens >= max_context:
                out.append(tp)
        tp *= 2
    return out


def _meets(ttft, tpot, run, requests, ttft_target, tpot_target) -> float:
    first = run.first - run.arrival
    many = requests.output > 1
    per = np.where(many, (run.last - run.first) / np.maximum(requests.output - 1, 1), 0.0)
    ok = np.ones(len(requests), dtype=bool)
    if ttft and ttft_target is not None:
        ok &= first <= ttft_target
    if tpot and tpot_target is not None:
        ok &= per <= tpot_target
    return float(ok.mean())


def max_rate(attained, guess: float, level: float, steps: int = STEPS) -> float:
    """The largest rate whose ``attained(rate)`` share is at least ``level``: a bracket
    found by doubling or halving ``guess``, then ``steps`` bisections (0 when even a
    rate 4,096 times below the guess misses)."""
    low, high, rate = 0.0, None, guess
    for _ in range(12):
        if attained(rate) >= level:
            low = rate
            if high is not None:
                break
            rate *= 2
        else:
            high = rate
            if low > 0:
                break
            rate /= 2
    if low == 0 or high is None:
        return low
    for _ in range(steps):
        mid = (low + high) / 2
        if attained(mid) >= level:
            low = mid
        else:
            high = mid
    return low


def _streams(w, rate: float):
    return share(workload(rate=rate, **_lengths(w), requests=SEARCH_REQUESTS, seed=w.seed), 1).sample()


def _lengths(w) -> dict:
    if w.lengths == "fixed" and not w.prompts:
        return {"prompt_len": w.prompt_len, "output_len": w.output_len}
    return {"lengths": w.lengths}


def instance_rate(svc, w, mode: str, policy: str, targets: tuple, level: float, link=None, system=None) -> float:
    """The largest rate one instance serves at ``level`` within ``targets``: a colocated
    instance both, a prefill instance the TTFT target, a decode instance the TPOT target
    (its requests arriving with their KV caches to take over ``link``)."""
    ttft_target, tpot_target = targets
    base = _streams(w, 1.0)
    # a first guess: half of what the prompts' passes allow, or a decode batch of 16
    guess = 0.5 / max(approx.moments(svc, base)["service_mean"], 1e-9) if mode != "decode" else \
        16 / max(float(np.mean(base.output)) * svc.decode_time(16.0, float(np.mean(base.prompt))), 1e-9)

    def attained(rate: float) -> float:
        reqs = Requests(base.arrival_s / rate, base.prompt, base.output)
        cached = np.floor(w.cache_hit_rate * reqs.prompt)
        if mode == "colocated":
            run = run_instance(svc, reqs, policy, cached=cached)
            return _meets(True, True, run, reqs, ttft_target, tpot_target)
        if mode == "prefill":
            return _meets(True, False, run_instance(svc, reqs, "prefill-only", cached=cached), reqs, ttft_target,
                          None)
        transfer = transfer_times(system, link, reqs.prompt * svc.kv_bytes_per_token)
        run = run_instance(svc, reqs, "decode-only", first_token=reqs.arrival_s, transfer_s=transfer)
        return _meets(False, True, run, reqs, None, tpot_target)

    return max_rate(attained, guess, level)


@dataclass(frozen=True)
class Plan:
    """One way to serve the rate: the mode, the instance plans and counts, the devices,
    the rates one instance serves within the targets, and the check at the full rate."""

    mode: str
    devices: int
    instances: tuple
    tp: tuple
    instance_rates_rps: tuple
    goodput_per_device_rps: float
    check: LoadResult


@dataclass(frozen=True)
class CapacityPlan(Result):
    """The devices a system needs for ``rate_rps`` within the targets: the colocated and
    the disaggregated plan with the fewest devices (None where no plan meets them)."""

    model: str
    system: str
    rate_rps: float
    ttft_target_s: float
    tpot_target_s: float
    attainment_level: float
    workload: str
    colocated: Plan | None
    disaggregated: Plan | None
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dictionary; each plan with its check at the full rate."""
        out = super().to_dict()
        for key in ("colocated", "disaggregated"):
            plan = getattr(self, key)
            out[key] = None if plan is None else {**{f: getattr(plan, f) for f in ("mode", "devices")},
                                                  "instances": list(plan.instances), "tp": list(plan.tp),
                                                  "instance_rates_rps": list(plan.instance_rates_rps),
                                                  "goodput_per_device_rps": plan.goodput_per_device_rps,
                                                  "check": plan.check.to_dict()}
        return out

    @property
    def best(self) -> Plan | None:
        found = [p for p in (self.colocated, self.disaggregated) if p is not None]
        return min(found, key=lambda p: p.devices) if found else None

    def headline(self) -> str:
        return (f"{self.model} on {self.system}: {self.rate_rps:.4g} requests/s with {self.attainment_level:.0%} "
                f"of requests within TTFT {self.ttft_target_s * 1e3:.4g} ms and TPOT {self.tpot_target_s * 1e3:.4g} ms")

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = []
        for plan in (self.colocated, self.disaggregated):
            if plan is None:
                continue
            c = plan.check
            if plan.mode == "colocated":
                what = f"{plan.instances[0]} x tp={plan.tp[0]}"
            else:
                what = f"{plan.instances[0]} prefill x tp={plan.tp[0]} + {plan.instances[1]} decode x tp={plan.tp[1]}"
            rows.append((f"{plan.mode}", f"{plan.devices:,} devices: {what}"))
            rows.append(("  TTFT p50 / p90 / p99", " / ".join(fmt_seconds(c.ttft_s[k]) for k in ("p50", "p90", "p99"))))
            rows.append(("  TPOT p50 / p90 / p99", " / ".join(fmt_seconds(c.tpot_s[k]) for k in ("p50", "p90", "p99"))))
            rows.append(("  within targets", f"{c.attainment:.1%}; goodput {c.goodput_rps:.4g} requests/s "
                                             f"({c.goodput_per_device_rps:.4g} per device)"))
            if c.kv_transfer:
                rows.append(("  KV transfer", f"{fmt_seconds(c.kv_transfer['mean_s'])} mean per request over the "
                                              f"{c.kv_transfer['level']} level"))
        rows += [("note", n) for n in self.notes]
        return rows or [("plan", "no plan meets the targets")]


def serve_capacity(model, system, *, rate, ttft_target, tpot_target, attainment_level: float = 0.9,
                   kv_link_level: str = "auto", policy: str = "chunked", modes=("colocated", "disaggregated"),
                   **kwargs) -> CapacityPlan:
    """The fewest devices of ``system`` that serve ``rate`` requests per second with
    ``attainment_level`` of them within ``ttft_target`` and ``tpot_target`` [s], for a
    colocated and a disaggregated deployment (see the module docstring). Other keywords:
    the workload's lengths and arrivals (:func:`snlab.serving.workload.workload`) and the
    deployment fields every instance shares (weight_dtype, kv_dtype, engine limits)."""
    work_kw, dep = split_kwargs(dict(kwargs))
    dep.pop("tp", None)                         # the plan's to choose
    w = workload(rate=rate, **work_kw)
    ttft, tpot = read_target("ttft_target", ttft_target), read_target("tpot_target", tpot_target)
    if ttft is None or tpot is None:
        raise SnlabError("ttft_target" if ttft is None else "tpot_target", "missing", "a time > 0, e.g. 0.2")
    probe = w.sample()
    top = float(np.max(probe.prompt + probe.output))
    tps = plans(model, system, top, **dep)
    if not tps:
        raise SnlabError("system", f"no instance of {load_system(system).name}'s scale-up domain holds "
                         f"{load_model(model).name} with room for a request's KV cache",
                         "a larger system, lower-precision weights or shorter requests")
    notes = []
    colocated = _colocated(model, system, w, tps, (ttft, tpot), attainment_level, policy, dep, top) \
        if "colocated" in modes else None
    disaggregated = _disaggregated(model, system, w, tps, (ttft, tpot), attainment_level, kv_link_level, dep, top) \
        if "disaggregated" in modes else None
    return CapacityPlan(model=load_model(model).name, system=load_system(system).name, rate_rps=w.rate,
                        ttft_target_s=ttft, tpot_target_s=tpot, attainment_level=attainment_level,
                        workload=w.describe(), colocated=colocated, disaggregated=disaggregated, notes=notes)


def _colocated(model, system, w, tps, targets, level, policy, dep, top) -> Plan | None:
    best = None
    for tp in tps:
        svc = instance(model, system, max_context=top, tp=tp, **dep)
        check_targets(*targets, svc.one_token_pass_s, svc.fastest_decode_s)
        r = instance_rate(svc, w, "colocated", policy, targets, level)
        if r <= 0:
            continue
        n = math.ceil(w.rate / r)
        if best is None or n * svc.devices < best[0]:
            best = (n * svc.devices, n, tp, r)
    if best is None:
        return None
    _, n, tp, r = best
    _check_instances(w.rate, {f"tp={tp}": (n, r)})
    for _ in range(GROW):
        check = serve_load(model, system, rate=w.rate, **_lengths(w), instances=n, tp=tp, policy=policy,
                           ttft_target=targets[0], tpot_target=targets[1], seed=w.seed, **dep)
        if check.attainment >= level:
            break
        n += max(1, n // 10)
    return Plan("colocated", n * check.devices // max(n, 1), (n,), (tp,), (r,), check.goodput_per_device_rps, check)


def _check_instances(rate: float, pools: dict) -> None:
    """A rate that needs more instances of a pool than a queue simulation runs is refused by
    its own name, with the instances it would take."""
    for what, (n, r) in pools.items():
        if n > MAX_INSTANCES:
            raise SnlabError("rate", f"{rate:.6g} requests/s needs {n:,} instances of {what} ({r:.3g} requests/s "
                             f"each within the targets), more than the {MAX_INSTANCES:,} a simulated queue runs",
                             f"a rate that {MAX_INSTANCES:,} instances serve, or a size per instance (tp) that "
                             "serves more")


def _disaggregated(model, system, w, tps, targets, level, link_level, dep, top) -> Plan | None:
    half = 1 - (1 - level) / 2
    pre, dec = {}, {}
    for tp in tps:
        p = instance(model, system, max_context=top, tp=tp, **dep)
        pre[tp] = (p, instance_rate(p, w, "prefill", "", targets, half))
    for tp in tps:
        d = instance(model, system, max_context=top, tp=tp, **dep)
        dec[tp] = d
    best = None
    for tp_p, (p, r_p) in pre.items():
        for tp_d, d in dec.items():
            try:
                pair = kv_link(system, p.devices, d.devices, link_level)
            except SnlabError:
                continue
            r_d = instance_rate(d, w, "decode", "", targets, half, pair, system)
            if r_p <= 0 or r_d <= 0:
                continue
            x, y = math.ceil(w.rate / r_p), math.ceil(w.rate / r_d)
            g = math.gcd(x, y)
            unit = kv_link(system, p.devices, d.devices, link_level, x // g * p.devices + y // g * d.devices)
            if unit.level != pair.level:          # the pools spill out of the domain: price that
                r_d = instance_rate(d, w, "decode", "", targets, half, unit, system)
                y = math.ceil(w.rate / r_d) if r_d > 0 else y
            devices = x * p.devices + y * d.devices
            if best is None or devices < best[0]:
                best = (devices, x, y, tp_p, tp_d, r_p, r_d)
    if best is None:
        return None
    _, x, y, tp_p, tp_d, r_p, r_d = best
    _check_instances(w.rate, {f"prefill tp={tp_p}": (x, r_p), f"decode tp={tp_d}": (y, r_d)})
    for _ in range(GROW):
        check = serve_load(model, system, rate=w.rate, **_lengths(w), prefill=dict(tp=tp_p), decode=dict(tp=tp_d),
                           prefill_instances=x, decode_instances=y, kv_link_level=link_level,
                           ttft_target=targets[0], tpot_target=targets[1], seed=w.seed, **dep)
        if check.attainment >= level:
            break
        ttft_miss = np.mean(check.ttft_s["p90"] > targets[0])
        x, y = (x + max(1, x // 10), y) if ttft_miss else (x, y + max(1, y // 10))
    per_device = float(qw.goodput_per_device(prefill_instances=x, prefill_rate=r_p, decode_instances=y,
                                             decode_rate=r_d, prefill_devices=tp_p, decode_devices=tp_d))
    return Plan("disaggregated", check.devices, (x, y), (tp_p, tp_d), (r_p, r_d), per_device, check)
