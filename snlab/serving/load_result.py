"""What a run under load reports: percentiles, throughput, attainment and goodput, as
a result (:class:`LoadResult`) with a text, HTML and JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..result import Result
from ..units import fmt_bytes, fmt_seconds
from ..walls import queueing as qw
from .approx import LEVELS

PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}


def _summary(values: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """Mean and p50/p90/p99 of ``values`` [s] (weighted: each value counts ``weights``
    times), zeros for no values."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return {"mean": 0.0, **dict.fromkeys(PERCENTILES, 0.0)}
    if weights is None:
        return {"mean": float(values.mean()), **{k: float(np.percentile(values, q)) for k, q in PERCENTILES.items()}}
    order = np.argsort(values)
    v, c = values[order], np.cumsum(np.asarray(weights, dtype=float)[order])
    total = c[-1] if c[-1] > 0 else 1.0
    return {"mean": float(np.sum(v * np.asarray(weights, float)[order]) / total),
            **{k: float(v[min(np.searchsorted(c, q / 100 * total), len(v) - 1)]) for k, q in PERCENTILES.items()}}


def statistics(run, requests, warmup: float, ttft_target, tpot_target, level: float) -> dict:
    """A run's statistics over the requests after the first ``warmup`` share: latencies'
    summaries [s], rates [requests/s, tokens/s], the decode batch, the share meeting both
    targets (a request of one output token has no TPOT and meets that target)."""
    n = len(requests)
    keep = np.arange(n) >= int(np.floor(warmup * n))
    arrival, first, last = run.arrival[keep], run.first[keep], run.last[keep]
    out = requests.output[keep]
    ttft = first - arrival
    many = out > 1
    tpot = np.where(many, (last - first) / np.maximum(out - 1, 1), 0.0)
    span = float(np.max(last) - np.min(arrival)) if keep.any() else 1.0
    arrivals = float(np.max(arrival) - np.min(arrival)) if keep.sum() > 1 else span
    offered = (keep.sum() - 1) / arrivals if arrivals > 0 else keep.sum() / max(span, 1e-12)
    meets = np.ones(keep.sum(), dtype=bool)
    if ttft_target is not None:
        meets &= ttft <= ttft_target
    if tpot_target is not None:
        meets &= tpot <= tpot_target
    attainment = float(meets.mean()) if (ttft_target is not None or tpot_target is not None) else None
    return {
        "requests": int(keep.sum()), "offered_rps": float(offered), "throughput_rps": float(keep.sum() / span),
        "output_tokens_per_s": float(out.sum() / span), "ttft": _summary(ttft), "tpot": _summary(tpot[many]),
        "itl": _summary(run.gaps, run.batches), "queue": _summary(run.admitted[keep] - arrival),
        "e2e": _summary(last - arrival), "decode_batch": float(np.average(run.batches)) if run.batches.size else 0.0,
        "peak_kv_tokens": float(run.peak_kv_tokens), "attainment": attainment, "attainment_level": level,
        "goodput_rps": None if attainment is None else float(qw.measured_goodput(completion_rate=keep.sum() / span,
                                                                                  arrival_rate=offered,
                                                                                  attainment=attainment)),
    }


def _closed(approximation) -> dict:
    if approximation is None:
        return {}
    a = approximation
    clean = {"applies": bool(a.applies), "ttft_applies": bool(a.applies and a.ttft_applies),
             "ttft_mean_s": a.ttft_mean_s, "tpot_mean_s": a.tpot_mean_s,
             "decode_batch": a.decode_batch, "utilization": a.utilization,
             **{f"ttft_p{int(q * 100)}_s": a.ttft_s[q] for q in LEVELS}}
    # a result never holds NaN or infinity: what the closed forms cannot say is None
    return {k: (v if isinstance(v, bool) or np.isfinite(v) else None) for k, v in clean.items()}


@dataclass(frozen=True)
class LoadResult(Result):
    """A deployment under load. Times in seconds (``ttft_s``, ``tpot_s``, ``itl_s``,
    ``queue_s``, ``e2e_s``: mean, p50, p90, p99), rates per second. ``mode`` colocated or
    disaggregated; ``instances`` (colocated) or ``prefill_instances`` and
    ``decode_instances``; ``devices`` of the whole deployment, and ``lender_devices``, the
    peers whose HBM its KV cache borrows through the pool at its peak (they serve nothing,
    so every per-device rate counts them). ``attainment``: the share
    of requests meeting both targets; ``goodput_rps``: requests per second meeting them
    (None without targets). ``kv_transfer``: the disaggregated deployment's link and the
    transfers' times; ``closed_form``: the closed-form approximations at the same rate
    (:mod:`snlab.serving.approx`) with whether they apply."""

    model: str
    system: str
    mode: str
    policy: str
    deployment: dict
    workload: str
    devices: int
    instances: int
    prefill_instances: int
    decode_instances: int
    requests: int
    offered_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    output_tokens_per_s_per_device: float
    ttft_s: dict
    tpot_s: dict
    itl_s: dict
    queue_s: dict
    e2e_s: dict
    decode_batch: float
    kv_capacity_tokens: float
    peak_kv_tokens: float
    ttft_target_s: float | None
    tpot_target_s: float | None
    attainment: float | None
    goodput_rps: float | None
    goodput_per_device_rps: float | None
    lender_devices: int = 0
    kv_transfer: dict = field(default_factory=dict)
    closed_form: dict = field(default_factory=dict, repr=False)

    @classmethod
    def colocated(cls, svc, w, n: int, policy: str, stats: dict, approximation, ttft, tpot) -> "LoadResult":
        devices = svc.devices * n
        lenders = svc.lender_devices(stats["peak_kv_tokens"]) * n
        return cls(model=svc.model, system=svc.system, mode="colocated", policy=policy,
                   deployment=dict(svc.deployment), workload=w.describe(), devices=devices, instances=n,
                   prefill_instances=0, decode_instances=0, **_common(stats, n, devices + lenders),
                   lender_devices=lenders,
                   kv_capacity_tokens=svc.kv_tokens, ttft_target_s=ttft, tpot_target_s=tpot,
                   closed_form=_closed(approximation))

    @classmethod
    def disaggregated(cls, p, d, w, pools, stats: dict, approximation, ttft, tpot, out) -> "LoadResult":
        x, y = pools
        g = int(np.gcd(x, y))
        devices = x * p.devices + y * d.devices
        started = np.isfinite(out.run.transfer_start)
        waited = out.run.transfer_start[started] - out.run.first[started]
        link = out.link
        transfer = {"level": link.level, "links": link.links, "link_bandwidth_bytes_per_s": link.bandwidth,
                    "link_efficiency": link.efficiency, "effective_bandwidth_bytes_per_s": link.effective_bandwidth,
                    "latency_s": link.latency, "mean_bytes": float(out.kv_bytes.mean()),
                    "mean_s": float(out.transfer_s.mean()), "p90_s": float(np.percentile(out.transfer_s, 90)),
                    "wait_mean_s": float(waited.mean()) if waited.size else 0.0,
                    "wait_p90_s": float(np.percentile(waited, 90)) if waited.size else 0.0}
        lenders = y * max(d.lender_devices(r.peak_kv_tokens) for r in out.decode_runs)
        return cls(model=p.model, system=p.system, mode="disaggregated", policy="prefill-only / decode-only",
                   deployment={"prefill": dict(p.deployment), "decode": dict(d.deployment)}, workload=w.describe(),
                   devices=devices, instances=0, prefill_instances=x, decode_instances=y,
                   **_common(stats, g, devices + lenders), lender_devices=lenders, kv_capacity_tokens=d.kv_tokens * y, ttft_target_s=ttft,
                   tpot_target_s=tpot, kv_transfer=transfer, closed_form=_closed(approximation))

    def headline(self) -> str:
        if self.mode == "colocated":
            plan = f"{self.instances} x " + _plan(self.deployment) + f", {self.policy} batching"
        else:
            plan = (f"{self.prefill_instances} prefill x {_plan(self.deployment['prefill'])} + "
                    f"{self.decode_instances} decode x {_plan(self.deployment['decode'])}")
        return f"{self.model} on {self.system}, {self.devices} devices, {self.mode}: {plan}; {self.workload}"

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = [(label, _dist(getattr(self, key))) for label, key in (
            ("time to first token", "ttft_s"), ("time per output token", "tpot_s"),
            ("inter-token latency", "itl_s"), ("queueing delay", "queue_s"), ("end to end", "e2e_s"))]
        rows += [
            ("requests (measured)", f"{self.requests:,} at {self.offered_rps:.4g}/s offered"),
            ("throughput", f"{self.throughput_rps:.4g} requests/s, {self.output_tokens_per_s:,.0f} output tokens/s "
                           f"({self.output_tokens_per_s_per_device:,.1f} per device"
                           + (f", the {self.lender_devices} lending HBM to the pool counted" if self.lender_devices
                              else "") + ")"),
            ("decode batch (mean)", f"{self.decode_batch:.1f} sequences per instance"),
            ("KV cache held (peak)", f"{self.peak_kv_tokens:,.0f} of {self.kv_capacity_tokens:,.0f} tokens"),
        ]
        if self.attainment is not None:
            targets = " and ".join(f"{n} <= {fmt_seconds(v)}" for n, v in (("TTFT", self.ttft_target_s),
                                                                             ("TPOT", self.tpot_target_s)) if v)
            rows += [("within targets", f"{self.attainment:.1%} ({targets})"),
                     ("goodput", f"{self.goodput_rps:.4g} requests/s ({self.goodput_per_device_rps:.4g} per device)")]
        if self.kv_transfer:
            t = self.kv_transfer
            rows.append(("KV transfer", f"{fmt_bytes(t['mean_bytes'])} per request over the {t['level']} level "
                                        f"({t['links']} x {t['link_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s at "
                                        f"{t['link_efficiency']:.0%}): {fmt_seconds(t['mean_s'])} mean, "
                                        f"{fmt_seconds(t['p90_s'])} p90; waiting for memory "
                                        f"{fmt_seconds(t['wait_mean_s'])} mean"))
        c = self.closed_form
        if c:
            shown = (f"TTFT {fmt_seconds(c['ttft_mean_s'])} mean, {fmt_seconds(c['ttft_p90_s'])} p90; TPOT "
                     f"{fmt_seconds(c['tpot_mean_s'])}" if c["ttft_mean_s"] is not None and c["tpot_mean_s"]
                     is not None else "the queue does not settle")
            rows.append(("closed form", shown + ("" if c["applies"] else " (outside where it applies)")
                         + ("" if c["ttft_applies"] or not c["applies"] else " (TTFT an estimate only)")))
        return rows


def _common(stats: dict, units: int, devices: int) -> dict:
    """The result fields every mode shares; rates of one simulated unit times ``units``."""
    good = None if stats["goodput_rps"] is None else stats["goodput_rps"] * units
    return dict(requests=stats["requests"], offered_rps=stats["offered_rps"] * units,
                throughput_rps=stats["throughput_rps"] * units,
                output_tokens_per_s=stats["output_tokens_per_s"] * units,
                output_tokens_per_s_per_device=stats["output_tokens_per_s"] * units / devices,
                ttft_s=stats["ttft"], tpot_s=stats["tpot"], itl_s=stats["itl"], queue_s=stats["queue"],
                e2e_s=stats["e2e"], decode_batch=stats["decode_batch"], peak_kv_tokens=stats["peak_kv_tokens"],
                attainment=stats["attainment"], goodput_rps=good,
                goodput_per_device_rps=None if good is None else good / devices)


def _plan(d: dict) -> str:
    return "tp={} pp={} dp={} ep={}".format(*(d.get(k, 1) for k in ("tp", "pp", "dp", "ep")))


def _dist(s: dict) -> str:
    return (f"{fmt_seconds(s['p50'])} p50, {fmt_seconds(s['p90'])} p90, {fmt_seconds(s['p99'])} p99 "
            f"(mean {fmt_seconds(s['mean'])})")
