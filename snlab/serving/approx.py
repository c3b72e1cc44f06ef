"""Closed-form queueing approximations of an engine under load, for sweeps.

The discrete-event run (:mod:`snlab.serving.queueing`) is the reference; these answer
in microseconds per rate, vectorised over a sweep, from the same service times
(:class:`~snlab.serving.service.Service`) and the formulas of
:mod:`snlab.walls.queueing`:

* **decode pool**: the batch is the fixed point of Little's law (``decode_in_flight``)
  and the step time at that batch; the time per output token is that step;
* **prefill pool**: one first-come-first-served server per instance, each prompt its own
  pass (no batching), Kingman's wait (Pollaczek-Khinchine for Poisson arrivals; round
  robin over ``n`` instances makes the gaps Erlang, c_a^2 / n), its tail from
  ``wait_quantile``; the time to first token is wait plus pass;
* **colocated, prefill-first**: prefill steps pre-empt decode steps: the time per output
  token is the decode step stretched by the share of time spent prefilling;
* **colocated, mixed or chunked**: every step carries the decodes and the prompt tokens
  that arrived meanwhile; the step is the fixed point of ``mixed_step_time``.

Where they apply (:attr:`Approximation.applies`): Poisson or renewal arrivals (not a
closed loop), a stable server (utilization below 0.9), and a decode batch inside the KV
cache. Beyond that they say only that the queue grows; the run says how.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..walls import queueing as qw
from .service import Service
from .workload import Requests

#: utilization above which the approximations are not trusted
MAX_UTILIZATION = 0.9
#: quantile levels reported
LEVELS = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Approximation:
    """Closed-form answers for one rate [s]: mean and p50/p90/p99 time to first token,
    mean time per output token, the decode batch, the prefill server's utilization and
    mean wait, and whether the approximations apply (see the module docstring; the time
    to first token where ``ttft_applies``)."""

    rate: float
    ttft_mean_s: float
    ttft_s: dict
    tpot_mean_s: float
    decode_batch: float
    utilization: float
    wait_s: float
    applies: bool
    ttft_applies: bool = True


def moments(svc: Service, requests: Requests, cached=None) -> dict:
    """The workload's moments as the formulas take them: mean prompt, output and
    context of a decoding sequence [tokens], each prompt's own prefill pass [s] with its
    mean and squared coefficient of variation."""
    L, O = requests.prompt, requests.output
    cached = np.zeros(len(L)) if cached is None else np.minimum(cached, L - 1)
    fresh = L - cached
    service = np.asarray([svc.prefill_time(f, f * (c + f / 2)) for f, c in zip(fresh, cached)])
    service = service + np.where(cached > 0, cached * svc.cache_read_s_per_token + svc.cache_read_fixed_s, 0.0)
    decoding = np.maximum(O - 1, 0)
    weight = np.maximum(decoding.sum(), 1.0)
    # a sequence decodes O - 1 steps at contexts L + 1 ... L + O - 1: time-weighted mean
    context = float(np.sum(decoding * (L + 1 + decoding / 2)) / weight)
    mean_s = float(service.mean())
    return {"prompt": float(L.mean()), "fresh": float(fresh.mean()), "lengths": fresh, "output": float(O.mean()),
            "decoding": float(decoding.mean()), "context": context, "service": service, "service_mean": mean_s,
            "service_scv": float(service.var() / mean_s**2) if mean_s > 0 else 0.0,
            "kv_tokens": float(np.mean([svc.reserve(x) for x in L + O]))}


def decode_fixed_point(svc: Service, rate: float, m: dict, stretch: float = 1.0,
                       iterations: int = 200) -> tuple[float, float]:
    """The decode batch and time per output token [s] at ``rate``: B = lambda (mu_o - 1)
    tau_tok (``decode_in_flight``), tau_tok = the step at B stretched by ``stretch`` for
    the time prompts add to the steps.
    Iterated from an empty batch: the first fixed point above it (NaN if the batch
    outgrows the instance)."""
    tpot = svc.decode_time(1.0, m["context"])
    cap = min(svc.max_sequences, svc.kv_tokens / max(m["kv_tokens"], 1.0))
    batch = 1.0
    for _ in range(iterations):
        batch = float(qw.decode_in_flight(arrival_rate=rate, mean_output_len=m["decoding"] / svc.tokens_per_step,
                                          time_per_token=tpot * svc.tokens_per_step))
        if batch > cap:
            return np.nan, np.nan
        step = svc.decode_time(max(batch, 1.0), m["context"])
        new = step * stretch / svc.tokens_per_step
        if abs(new - tpot) <= 1e-9 * new:
            break
        tpot = new
    return batch, tpot


def prefill_queue(rate: float, service: np.ndarray, mean: float, scv: float, arrival_scv: float, step_s: float = 0.0):
    """Utilization, mean wait and the TTFT quantiles [s] of a first-come-first-served
    prefill server: Kingman's wait, its exponential tail (``wait_quantile``), plus each
    prompt's own pass (and ``step_s``: half a step already running on average)."""
    rho = float(qw.utilization(arrival_rate=rate, service_time=mean))
    if rho >= 1:
        return rho, np.inf, {q: np.inf for q in LEVELS}, np.inf
    wait = float(qw.kingman_wait(arrival_rate=rate, service_time=mean, arrival_scv=arrival_scv, service_scv=scv))
    total = service + step_s / 2
    if rho <= 0 or wait <= 0:
        return rho, wait, {q: float(np.quantile(total, q)) for q in LEVELS}, float(total.mean())
    theta = wait / rho
    grid = np.linspace(0.0, float(total.max()) + 12 * theta, 4000)
    # P(TTFT <= t): no wait with probability 1 - rho, else an exponential wait of mean theta
    gap = np.maximum(grid[:, None] - total[None, :], 0.0)
    cdf = np.mean(np.where(grid[:, None] >= total[None, :], 1 - rho * np.exp(-gap / theta), 0.0), axis=1)
    quantiles = {q: float(np.interp(q, cdf, grid)) for q in LEVELS}
    return rho, wait, quantiles, float(total.mean() + wait)


def decode_pool(svc: Service, rate: float, m: dict) -> Approximation:
    """A decode instance at ``rate`` requests per second (its KV transfers aside)."""
    batch, tpot = decode_fixed_point(svc, rate, m)
    ok = bool(np.isfinite(tpot))
    return Approximation(rate, 0.0, {q: 0.0 for q in LEVELS}, tpot, batch, np.nan, 0.0, ok)


def prefill_pool(svc: Service, rate: float, m: dict, arrival_scv: float = 1.0) -> Approximation:
    """A prefill instance, each prompt its own pass, at ``rate`` requests per second."""
    rho, wait, quantiles, mean = prefill_queue(rate, m["service"], m["service_mean"], m["service_scv"], arrival_scv)
    return Approximation(rate, mean, quantiles, 0.0, 0.0, rho, wait, rho < MAX_UTILIZATION)


def colocated(svc: Service, rate: float, m: dict, policy: str, arrival_scv: float = 1.0) -> Approximation:
    """A colocated instance at ``rate``. Prefill-first: decode steps stretched by
    1 / (1 - rho_prefill), each prompt queueing for a prefill server of utilization
    rho_prefill. Mixed and chunked: each prompt adds its pass's marginal time to the step
    it rides (``mixed_step_time``), so the decode steps stretch by 1 / (1 - lambda
    E[marginal]); a prompt waits for the step in progress and the prompts before it. That
    time to first token leaves out how a long prompt's chunks and short prompts share
    steps, so only its time per output token is held to the run (``ttft_applies`` False)."""
    if policy == "prefill-first":
        rho = float(qw.utilization(arrival_rate=rate, service_time=m["service_mean"]))
        stretch = 1 / (1 - rho) if rho < 1 else np.inf
        batch, tpot = decode_fixed_point(svc, rate, m, stretch=stretch) if rho < 1 else (np.nan, np.nan)
        step = svc.decode_time(max(batch, 1.0), m["context"]) if np.isfinite(batch) else np.nan
        rho, wait, quantiles, mean = prefill_queue(rate, m["service"], m["service_mean"], m["service_scv"],
                                                   arrival_scv, step)
    else:
        # each prompt adds what its pass costs beyond a one-token pass to the step it rides
        marginal = np.maximum(m["service"] - svc.one_token_pass_s, 0.0)
        rho = float(qw.utilization(arrival_rate=rate, service_time=float(marginal.mean())))
        batch, tpot = decode_fixed_point(svc, rate, m, stretch=1 / (1 - rho)) if rho < 1 else (np.nan, np.nan)
        quantiles, mean, wait = _ride(svc, rate, m, batch, marginal, arrival_scv)
    ok = bool(np.isfinite(tpot)) and rho < MAX_UTILIZATION
    return Approximation(rate, mean, quantiles, tpot, batch, rho, wait, ok, ok and policy == "prefill-first")


def _ride(svc: Service, rate: float, m: dict, batch: float, marginal: np.ndarray, arrival_scv: float):
    """TTFT quantiles, mean and wait [s] of a prompt in a mixed step: it waits for the
    step in progress (an arrival falls into a long step more often: the mean residual of
    the steps' length-biased mix), queues behind the prompts before it (Kingman's wait
    with each prompt's marginal time as its service), then rides its own step, the
    decode step plus its pass's marginal time (``mixed_step_time``)."""
    if not np.isfinite(batch):
        return {q: np.inf for q in LEVELS}, np.inf, np.inf
    a = svc.decode_time(max(batch, 1.0), m["context"])
    own = a + marginal
    share_prompt = rate * own / len(marginal)                  # time share of each prompt's step
    share_decode = max(1.0 - share_prompt.sum(), 0.0)
    residual = float((share_decode * a**2 + np.sum(share_prompt * own**2)) / (2 * (share_decode * a
                                                                                  + np.sum(share_prompt * own))))
    mean_m = float(marginal.mean())
    scv = float(marginal.var() / mean_m**2) if mean_m > 0 else 0.0
    _, wait, quantiles, mean = prefill_queue(rate, own, mean_m, scv, arrival_scv, 2 * residual)
    return quantiles, mean, wait + residual
