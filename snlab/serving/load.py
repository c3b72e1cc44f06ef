"""Serving under load: ``serve_load`` runs a workload of arriving requests through a
colocated or a disaggregated deployment and reports its latencies, throughput and
goodput; ``load_sweep`` does it for several rates and systems.

A colocated deployment is ``instances`` copies of one instance (the keywords of
:func:`snlab.serve`), requests dealt to them in turn; a disaggregated one is
``prefill_instances`` instances of the ``prefill`` plan and ``decode_instances`` of the
``decode`` plan (:mod:`snlab.serving.disaggregation`). Identical instances fed in turn
see identical streams, so one instance (one unit of the xPyD pools) is run at its
share of the rate, with the gaps of every n-th arrival (:func:`share`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import SnlabError
from ..grid import finite, show, whole_number
from ..units import parse_quantity
from . import approx
from .disaggregation import kv_link, run_disaggregated
from .load_result import LoadResult, statistics
from .queueing import run_instance
from .service import POLICIES, instance
from .workload import Workload, workload

#: schedulers a colocated deployment may run
SCHEDULERS = tuple(p for p in POLICIES if p not in ("prefill-only", "decode-only"))
WORKLOAD_FIELDS = ("rate", "prompt_len", "output_len", "lengths", "arrival", "arrival_scv", "concurrency", "times_s",
                   "prompts", "outputs", "requests", "seed", "warmup", "cache_hit_rate", "cache_tier")
#: the most instances one call plans (a deployment larger than any of 2026)
MAX_INSTANCES = 100_000


def share(w: Workload, n: int) -> Workload:
    """The stream one of ``n`` identical instances sees when requests are dealt to them
    in turn: every n-th arrival, so gaps that are sums of n gaps (for Poisson arrivals
    Erlang-n: the rate over n, the squared coefficient of variation over n); a closed
    loop's users split evenly; a trace's every n-th request."""
    if n == 1:
        return w
    if w.arrival == "closed":
        return dataclasses.replace(w, concurrency=max(1, math.ceil(w.concurrency / n)))
    if w.arrival == "trace":
        times = w.times_s[::n]
        return dataclasses.replace(w, times_s=times, requests=len(times), prompts=w.prompts[::n],
                                   outputs=w.outputs[::n])
    return dataclasses.replace(w, arrival="gamma", rate=w.rate / n, arrival_scv=w.arrival_scv / n)


def read_target(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_quantity(value, "s", name)[0]
    if not finite(value) or not 0 < value <= 3600:
        raise SnlabError(name, f"got {show(value)}", "a time > 0 and at most an hour, e.g. 0.2 or '200 ms'")
    return float(value)


def check_targets(ttft, tpot, first_pass: float, fastest_step: float) -> None:
    """A target that not even an empty engine meets is an error, not a goodput of zero."""
    if ttft is not None and ttft < first_pass:
        raise SnlabError("ttft_target", f"{ttft * 1e3:.4g} ms is below one prefill pass of a one-token prompt "
                         f"({first_pass * 1e3:.4g} ms)", f"a target above {first_pass * 1e3:.4g} ms")
    if tpot is not None and tpot < fastest_step:
        raise SnlabError("tpot_target", f"{tpot * 1e3:.4g} ms is below one decode step of a single sequence "
                         f"({fastest_step * 1e3:.4g} ms)", f"a target above {fastest_step * 1e3:.4g} ms")


def split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    work = {k: kwargs.pop(k) for k in WORKLOAD_FIELDS if k in kwargs}
    return work, kwargs


def serve_load(model, system, *, ttft_target=None, tpot_target=None, policy: str = "chunked", instances: int = 1,
               prefill: dict | None = None, decode: dict | None = None, prefill_instances: int = 1,
               decode_instances: int = 1, kv_link_level: str = "auto", attainment_level: float = 0.9,
               **kwargs) -> LoadResult:
    """Latencies (TTFT, TPOT, inter-token latency at p50/p90/p99, queueing delay),
    throughput and goodput of a deployment serving a workload of arriving requests.

    Parameters
    ----------
    model, system : preset names, TOML paths or preset objects.
    rate, prompt_len, output_len, lengths, arrival, arrival_scv, concurrency, times_s,
    prompts, outputs, requests, seed, warmup, cache_hit_rate, cache_tier :
        the workload (:func:`snlab.serving.workload.workload`).
    ttft_target, tpot_target : latency targets [s] (or strings such as ``"200 ms"``) for
        the attainment and goodput; a target below one step of the engine is an error.
    policy : the colocated scheduler, one of :data:`SCHEDULERS` (default ``chunked``:
        continuous batching with chunked prefill, as vLLM V1 and SGLang run by default; the
        limits an instance's deployment leaves at 0 are TensorRT-LLM's defaults,
        :data:`snlab.serving.service.MAX_IN_FLIGHT` and :data:`~snlab.serving.service.STEP_TOKENS`).
    instances : colocated instances, requests dealt to them in turn.
    prefill, decode : the two plans of a disaggregated deployment (deployment keywords
        each; the others apply to both), ``prefill_instances`` and ``decode_instances``
        of them, the KV cache over ``kv_link_level`` (auto, scale-up, scale-out).
    **kwargs : the colocated instance's deployment (tp, pp, dp, ep, dtypes, engine
        limits max_sequences, max_step_tokens, kv_fraction, kv_block_tokens,
        engine_memory_bytes, ...).
    """
    work_kw, dep = split_kwargs(dict(kwargs))
    w = workload(**work_kw)
    ttft, tpot = read_target("ttft_target", ttft_target), read_target("tpot_target", tpot_target)
    if not finite(attainment_level) or not 0 < attainment_level <= 1:
        raise SnlabError("attainment_level", f"got {show(attainment_level)}", "a fraction in (0, 1]")
    if prefill is not None or decode is not None:
        return _disaggregated(model, system, w, ttft, tpot, dep, prefill or {}, decode or {}, prefill_instances,
                              decode_instances, kv_link_level, attainment_level)
    if policy not in SCHEDULERS:
        raise SnlabError("policy", f"got {policy!r}", ", ".join(SCHEDULERS))
    n = whole_number("instances", instances, 1, MAX_INSTANCES, f"a whole number from 1 to {MAX_INSTANCES:,}")
    one = share(w, n)
    requests = one.sample()
    svc = instance(model, system, max_context=float(np.max(requests.prompt + requests.output)),
                   cache_tier=w.cache_tier, **dep)
    check_targets(ttft, tpot, svc.one_token_pass_s, svc.fastest_decode_s)
    cached = np.floor(w.cache_hit_rate * requests.prompt)
    run = run_instance(svc, requests, policy, cached=cached, closed=one.concurrency if one.arrival == "closed" else 0)
    stats = statistics(run, requests, w.warmup, ttft, tpot, attainment_level)
    closed = None
    if one.arrival in ("poisson", "gamma"):
        closed = approx.colocated(svc, one.rate, approx.moments(svc, requests, cached), policy, one.arrival_scv)
    return LoadResult.colocated(svc, w, n, policy, stats, closed, ttft, tpot)


def _role_instance(role: str, own: dict, model, system, **kwargs):
    """:func:`instance` of the prefill or the decode pool: an error in a field the pool's
    own plan set names it as that pool's (``prefill_tp``), as the command line does."""
    try:
        return instance(model, system, **kwargs)
    except SnlabError as error:
        if error.field not in own:
            raise
        raise SnlabError(f"{role}_{error.field}", error.problem, error.allowed) from None


def _disaggregated(model, system, w: Workload, ttft, tpot, dep: dict, prefill: dict, decode: dict, n_p, n_d,
                   level: str, attainment_level: float) -> LoadResult:
    x = whole_number("prefill_instances", n_p, 1, MAX_INSTANCES, f"a whole number from 1 to {MAX_INSTANCES:,}")
    y = whole_number("decode_instances", n_d, 1, MAX_INSTANCES, f"a whole number from 1 to {MAX_INSTANCES:,}")
    g = math.gcd(x, y)
    one = share(w, g)                     # one unit of x/g prefill and y/g decode instances
    requests = one.sample()
    top = float(np.max(requests.prompt + requests.output))
    p = _role_instance("prefill", prefill, model, system, max_context=top, cache_tier=w.cache_tier, **{**dep, **prefill})
    d = _role_instance("decode", decode, model, system, max_context=top, **{**dep, **decode})
    check_targets(ttft, tpot, p.one_token_pass_s, d.fastest_decode_s)
    link = kv_link(system, p.devices, d.devices, level, (x // g) * p.devices + (y // g) * d.devices)
    cached = np.floor(w.cache_hit_rate * requests.prompt)
    out = run_disaggregated(p, d, requests, x // g, y // g, link, cached)
    stats = statistics(out.run, requests, w.warmup, ttft, tpot, attainment_level)
    closed = None
    if one.arrival in ("poisson", "gamma"):
        m = approx.moments(p, requests, cached)
        pre = approx.prefill_pool(p, one.rate / (x // g), m, one.arrival_scv / (x // g))
        dec = approx.decode_pool(d, one.rate / (y // g), approx.moments(d, requests, cached))
        closed = approx.Approximation(one.rate, pre.ttft_mean_s, pre.ttft_s, dec.tpot_mean_s, dec.decode_batch,
                                      pre.utilization, pre.wait_s, pre.applies and dec.applies,
                                      pre.applies and dec.applies)
    return LoadResult.disaggregated(p, d, w, (x, y), stats, closed, ttft, tpot, out)


def load_sweep(model, systems, rates, *, modes=("colocated", "disaggregated"), **kwargs):
    """:func:`serve_load` at each of ``rates`` [requests/s] on each system (a name or a
    list) and mode, one row each: a pandas DataFrame of latencies' p50/p90/p99 [s],
    attainment, goodput, the KV transfer and its link, and the closed forms' answers
    beside the run's. ``kwargs`` as for :func:`serve_load`; the disaggregated mode needs
    ``prefill`` and ``decode`` plans (default: the colocated plan for both)."""
    import pandas as pd
    names = [systems] if isinstance(systems, str) else list(systems)
    rates = [rates] if isinstance(rates, (int, float)) else list(rates)
    if not rates or not names:
        raise SnlabError("rates" if not rates else "systems", "empty", "at least one value")
    plan = {k: kwargs.pop(k) for k in ("prefill", "decode", "prefill_instances", "decode_instances", "kv_link_level")
            if k in kwargs}
    rows = []
    for system in names:
        for mode in modes:
            if mode not in ("colocated", "disaggregated"):
                raise SnlabError("modes", f"got {mode!r}", "colocated, disaggregated")
            for rate in rates:
                extra = {} if mode == "colocated" else {"prefill": plan.get("prefill", {}),
                                                        "decode": plan.get("decode", {}),
                                                        **{k: v for k, v in plan.items() if k not in ("prefill", "decode")}}
                r = serve_load(model, system, rate=rate, **kwargs, **extra)
                rows.append(_row(r, rate))
    return pd.DataFrame(rows)


def _row(r: LoadResult, rate: float) -> dict:
    t = r.kv_transfer
    c = r.closed_form
    row = {"system": r.system, "mode": r.mode, "rate_rps": rate, "devices": r.devices,
           "rate_per_device_rps": rate / r.devices, "throughput_rps": r.throughput_rps,
           "attainment": r.attainment, "goodput_rps": r.goodput_rps, "goodput_per_device_rps": r.goodput_per_device_rps,
           "decode_batch": r.decode_batch, "kv_transfer_s": t.get("mean_s", 0.0), "kv_link_level": t.get("level", ""),
           "kv_link_bandwidth_bytes_per_s": t.get("effective_bandwidth_bytes_per_s", 0.0),
           "closed_form_applies": bool(c.get("applies", False)),
           "closed_form_ttft_applies": bool(c.get("ttft_applies", False)), "closed_form_ttft_mean_s": c.get("ttft_mean_s"),
           "closed_form_tpot_mean_s": c.get("tpot_mean_s")}
    for name, summary in (("ttft", r.ttft_s), ("tpot", r.tpot_s), ("itl", r.itl_s), ("queue", r.queue_s)):
        row[f"{name}_mean_s"] = summary["mean"]
        for k in ("p50", "p90", "p99"):
            row[f"{name}_{k}_s"] = summary[k]
    return row
