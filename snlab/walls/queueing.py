"""Request queues: waiting, Little's law, the step of continuous batching with chunked
prefill, goodput, and the split of a disaggregated deployment.

These are the closed forms that :mod:`snlab.serving.approx` evaluates for sweeps; the
discrete-event run of :mod:`snlab.serving.queueing` uses :data:`mixed_step_time` for every
step that carries prefill chunks beside decodes and checks the others where both apply
(tests/test_queue_formulas.py).

References
----------
* Little 1961, "A proof for the queuing formula L = lambda W", Operations Research 9(3).
* Kingman 1961, "The single server queue in heavy traffic", Proc. Cambridge Phil. Soc.
  57(4): the G/G/1 wait; with Poisson arrivals it is the Pollaczek-Khinchine mean
  (Kleinrock 1975, Queueing Systems Vol. 1, Eq. 5.105).
* Tijms 2003, "A First Course in Stochastic Models", Wiley, Sec. 2.5 and 9.2: the wait
  of M/M/1 exceeds t with probability rho exp(-t rho / W_q); used as the tail of the others.
* Agrawal et al. 2024, "Taming Throughput-Latency Tradeoff in LLM Inference with
  Sarathi-Serve", OSDI (arXiv 2403.02310) Sec. 4: decodes ride with a prefill chunk in one
  step ("piggybacking"), costing the chunk little while the step is memory-bound.
* Li, Dai, Peng 2025, "Throughput-Optimal Scheduling Algorithms for LLM Inference and AI
  Agents" (arXiv 2504.07347): a work-conserving batched engine is stable while its
  requests' tokens arrive slower than its steps process them.
* Zhong et al. 2024, "DistServe", OSDI (arXiv 2401.09670) Sec. 3: goodput, the rate
  served within both latency targets, per GPU; TensorRT-LLM tech blog 5
  ("Disaggregated Serving in TensorRT-LLM"): context and generation instances matched by
  their request rates.
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

lam, S, cs2, ca2 = sym.arrival_rate, sym.service_time, sym.service_scv, sym.arrival_scv
rho, Wq, q, W = sym.utilization, sym.queue_wait, sym.quantile_level, sym.residence_time

# --- one server ----------------------------------------------------------------------

utilization = Formula(
    "utilization", "utilization",
    lam * S,
    "definition (offered load of one server)",
    "Fraction of time a server is busy when requests arrive at lambda per second and each "
    "takes S on average; the queue is stable only below 1.",
)

kingman_wait = Formula(
    "kingman_wait", "queue_wait",
    lam * S**2 * (ca2 + cs2) / (2 * (1 - lam * S)),
    "Kingman 1961 (G/G/1 in heavy traffic); with Poisson arrivals (c_a^2 = 1) the exact "
    "Pollaczek-Khinchine mean lambda E[S^2] / (2 (1 - rho)) (Kleinrock 1975 Eq. 5.105)",
    "Mean wait before service at one first-come-first-served server: rho / (1 - rho) times "
    "the mean service time times the mean of the two squared coefficients of variation. It "
    "grows without bound as the utilization approaches 1; bursty arrivals (c_a^2 > 1: the "
    "Azure code trace's 13^2, Kimi's 3^2) multiply it.",
)

wait_quantile = Formula(
    "wait_quantile", "queue_wait",
    sp.Piecewise((0, rho <= 1 - q), (Wq / rho * sp.log(rho / (1 - q)), True)),
    "Tijms 2003 Sec. 2.5: an M/M/1 wait exceeds t with probability rho exp(-t rho / W_q), "
    "exact there, taken as the tail of the other servers",
    "The q-quantile of the wait before service: no wait for the share 1 - rho of requests "
    "that find the server idle, then an exponential tail with the mean wait W_q. The p99 "
    "wait is ln(100 rho) W_q / rho: about 4 W_q at rho = 0.8.",
)

little_in_flight = Formula(
    "little_in_flight", "requests_in_flight",
    lam * W,
    "Little 1961",
    "Requests in a part of the system (waiting, prefilling, decoding) on average: the rate "
    "they enter it times the time each spends there. Needs no assumption on arrivals or "
    "service, only a steady state.",
)

decode_in_flight = Formula(
    "decode_in_flight", "requests_in_flight",
    lam * sym.mean_output_len * sym.time_per_token,
    "Little 1961 applied to the decode phase (DistServe Sec. 3.2 reasons the same way)",
    "Sequences a decode server runs at once: each request stays mu_o tokens of tau_tok "
    "each. A slower step means a larger batch, and a larger batch a slower step: the batch "
    "of a loaded server is the fixed point of the two.",
)

kv_in_flight = Formula(
    "kv_in_flight", "kv_held_bytes",
    lam * W * sym.request_kv_bytes,
    "Little 1961 applied to bytes",
    "KV-cache bytes a server holds on average for requests that stay W each and bring "
    "Q_req bytes: the decode pool of a disaggregated deployment holds the KV cache of the "
    "transfers in flight as well as of its running sequences.",
)

# --- the engine's step -----------------------------------------------------------------

mixed_step_time = Formula(
    "mixed_step_time", "time",
    sym.step_time + sp.Max(0, sym.chunk_time - sym.one_token_pass_time),
    "Agrawal et al. 2024 (Sarathi-Serve) Sec. 4: decodes piggybacked on a prefill chunk in one step",
    "Time of an engine step that runs tau_step's decodes and a prefill chunk together: the "
    "decode step plus what the chunk adds over a pass of one token. While the pass is "
    "memory-bound the chunk's tokens ride with the weights the decodes read anyway; once it "
    "is compute-bound each prefill token costs its FLOPs.",
)

max_stable_rate = Formula(
    "max_stable_rate", "arrival_rate",
    sym.step_tokens / (sym.step_time * (sym.mean_prompt_len + sym.mean_output_len)),
    "Li, Dai, Peng 2025 (arXiv 2504.07347): lambda (m_p + m_d) < b / t_b for a work-conserving batched engine",
    "Largest request rate an engine that runs full steps of b_tok tokens in tau_step each "
    "can keep up with, when a request brings mu_p prompt and mu_o output tokens: beyond it "
    "the queue grows without bound, whatever the scheduler.",
)

# --- targets and goodput ---------------------------------------------------------------

measured_goodput = Formula(
    "measured_goodput", "goodput",
    sp.Min(sym.completion_rate, lam) * sym.attainment,
    "vLLM benchmarks/serve.py (--goodput): request goodput = requests completed within every target "
    "over the benchmark's duration; no more than arrive (DistServe's goodput, as above)",
    "Requests per second a measured run serves within both latency targets: the requests it "
    "completes per second, at most the offered rate lambda, times the fraction of them "
    "meeting both. A stable deployment completes what arrives; an overloaded one only what "
    "it can, so goodput never exceeds throughput.",
)

goodput = Formula(
    "goodput", "goodput",
    lam * sym.attainment,
    "Zhong et al. 2024 (DistServe) Sec. 2",
    "Requests per second served within both latency targets: the rate times the fraction "
    "of requests whose time to first token and time per output token both meet them.",
)

disaggregated_rate = Formula(
    "disaggregated_rate", "goodput",
    sp.Min(sym.prefill_instances * sym.prefill_rate, sym.decode_instances * sym.decode_rate),
    "TensorRT-LLM tech blog 5 (rate matching of context and generation instances)",
    "Requests per second a deployment of n_P prefill and n_D decode instances serves within "
    "the targets: the slower of the two pools sets it.",
)

goodput_per_device = Formula(
    "goodput_per_device", "goodput",
    sp.Min(sym.prefill_instances * sym.prefill_rate, sym.decode_instances * sym.decode_rate)
    / (sym.prefill_instances * sym.prefill_devices + sym.decode_instances * sym.decode_devices),
    "Zhong et al. 2024 (DistServe) Sec. 3: goodput per GPU; TensorRT-LLM tech blog 5 (rate matching)",
    "Goodput of a disaggregated deployment over the devices of both pools: the split that "
    "maximises it gives each pool just the devices its share of the work needs.",
)

# --- prefix caching ----------------------------------------------------------------------

prefix_hit_bytes = Formula(
    "prefix_hit_bytes", "far_bytes",
    sym.cache_hit_rate * sym.mean_prompt_len * sym.kv_cache_memory,
    "Qin et al. 2025 (Mooncake, FAST) Sec. 2.2: reuse trades the prefix's compute for loading its KV cache",
    "KV-cache bytes a request with mu_p prompt tokens reads from its cache tier when a "
    "share h of them hits: read at the tier's bandwidth (far_read_time), it replaces the "
    "prefill of those tokens.",
)

__all__ = ["utilization", "kingman_wait", "wait_quantile", "little_in_flight", "decode_in_flight", "kv_in_flight",
           "mixed_step_time", "max_stable_rate", "measured_goodput", "goodput", "disaggregated_rate", "goodput_per_device",
           "prefix_hit_bytes"]
