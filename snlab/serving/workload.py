"""A workload of arriving requests: when they come and how long their prompts and
answers are.

Arrivals are a Poisson stream at ``rate`` requests per second (the serving benchmarks'
default: vLLM's ``benchmark_serving.py``, DistServe, Sarathi-Serve), a renewal stream with
burstier gaps (``arrival_scv`` > 1: gamma-distributed gaps with that squared coefficient of
variation, as BurstGPT models its traces), a closed loop of ``concurrency`` users each
sending its next request when the last is answered (genai-perf, NIM's tables), or the
times of a given trace. Lengths are ``fixed`` or drawn from a named public trace's
statistics (:data:`TRACES`): a log-normal fit to each length, cut where the trace's own
filter cuts it, with its source.

A workload is a frozen value; :meth:`Workload.sample` draws its requests reproducibly
from ``seed``. Bad values raise :class:`~snlab.errors.SnlabError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SnlabError
from ..grid import finite, show, whole_number

ARRIVALS = ("poisson", "gamma", "closed", "trace")
#: the most requests one run draws, and the longest prompt or answer it takes
MAX_REQUESTS, MAX_TOKENS = 1_000_000, 10_000_000
#: KV-cache tiers a prefix cache may live in (snlab.serving.step.KV_TIERS)
CACHE_TIERS = ("hbm", "pool", "host", "ssd")


#: quantile levels of the traces' length tables
QUANTILES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9,
             0.95, 0.99, 0.999, 1.0)


@dataclass(frozen=True)
class Trace:
    """A public trace's statistics: its prompt and output lengths at the
    :data:`QUANTILES` [tokens] (lengths are drawn between them, linearly: the inverse of
    the trace's own distribution function, up to its longest request), the number of
    requests they were computed from, its mean lengths, the squared
    coefficient of variation of its gaps between arrivals, the share of prompt tokens
    whose KV cache an unbounded prefix cache already holds, and its source."""

    name: str
    prompt: tuple
    output: tuple
    mean_prompt: float
    mean_output: float
    requests: int
    arrival_scv: float
    cache_hit_rate: float
    source: str
    where: str


#: named traces, computed from the per-request lengths and times each source publishes
TRACES = {
    "sharegpt-distserve": Trace(
        "sharegpt-distserve",
        (2, 25, 89, 166, 244, 316, 379, 454, 518, 603, 685, 772, 858, 954, 1044, 1149, 1277, 1421, 1546, 1723, 1922,
         2005, 2031),
        (1, 6, 9, 12, 15, 18, 22, 28, 36, 53, 78, 115, 159, 212, 258, 304, 350, 407, 512, 648, 969, 1191, 1809),
        761.0, 186.8, 1593, 1.0, 0.0, "zhong2024distserve",
        "ShareGPT as DistServe prepares it (evaluation/2-benchmark-serving/0-prepare-dataset.py: conversations of at "
        "least 3 turns, a prompt of earlier turns, the next turn as output, prompt + output under 2,048 OPT tokens): "
        "the 1,593 distinct requests of its alignment runs (simdistserve/benchmarks/alignment/data-ground-truth/"
        "opt-13b-sharegpt, commit 20a1633); arrivals Poisson"),
    "azure-conv-2023": Trace(
        "azure-conv-2023",
        (2, 181, 207, 372, 387, 396, 403, 414, 703, 984, 1020, 1045, 1071, 1097, 1130, 1189, 1315, 1876, 2734, 4083,
         4142, 6179, 14050),
        (7, 41, 54, 67, 77, 85, 91, 96, 103, 113, 129, 151, 177, 217, 384, 395, 400, 411, 424, 451, 601, 954, 1000),
        1154.7, 211.1, 19366, 1.094**2, 0.0, "azure-llm-trace-2023",
        "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv (Splitwise's conversation trace): 19,366 "
        "requests over 58 minutes, gaps with a coefficient of variation of 1.09"),
    "azure-code-2023": Trace(
        "azure-code-2023",
        (3, 75, 147, 232, 386, 578, 770, 939, 1075, 1261, 1469, 1690, 1909, 2164, 2433, 2744, 3192, 3920, 5188, 7303,
         7436, 7437, 7437),
        (6, 6, 7, 7, 8, 9, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 29, 39, 55, 90, 251, 825, 1899),
        2047.8, 27.9, 8819, 13.15**2, 0.0, "azure-llm-trace-2023",
        "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_code.csv (Splitwise's coding trace): 8,819 requests "
        "over 57 minutes, gaps with a coefficient of variation of 13.2 (bursts)"),
    "mooncake-conversation": Trace(
        "mooncake-conversation",
        (891, 901, 964, 1261, 1662, 2306, 3263, 4251, 4993, 5870, 6909, 8187, 9570, 11238, 13196, 15367, 17869, 21464,
         27367, 39550, 85400, 121301, 126195),
        (1, 10, 24, 46, 100, 156, 213, 256, 291, 322, 350, 375, 399, 423, 447, 472, 504, 543, 597, 698, 1119, 2000, 2000),
        12035.1, 342.6, 12031, 3.034**2, 0.374, "qin2025mooncake",
        "kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl (Kimi's conversation trace): 12,031 "
        "requests over 59 minutes, gaps with a coefficient of variation of 3.03; 37.4% of prompt tokens sit in "
        "512-token blocks an unbounded cache already holds (the paper's Table 2 gives 40%)"),
}
LENGTHS = ("fixed",) + tuple(TRACES)


def _positive(name: str, value, allowed: str, top: float = np.inf) -> float:
    if not finite(value) or not 0 < value <= top:
        raise SnlabError(name, f"got {show(value)}", allowed)
    return float(value)


@dataclass(frozen=True)
class Workload:
    """Requests arriving at an engine (see the module's docstring): ``arrival`` one of
    :data:`ARRIVALS`, ``rate`` [requests/s], ``arrival_scv`` (gamma gaps), ``concurrency``
    (closed loop), ``times_s`` (a trace's arrival times), ``lengths`` one of
    :data:`LENGTHS` (``fixed``: every request ``prompt_len`` + ``output_len`` tokens; a
    trace name: drawn from its statistics, or given per request in ``prompts`` and
    ``outputs``), ``requests`` to draw, ``seed``, ``warmup`` (the share of requests, first
    to arrive, left out of the statistics), and a prefix cache (``cache_hit_rate`` of the
    prompt tokens found in ``cache_tier``)."""

    arrival: str = "poisson"
    rate: float = 1.0
    arrival_scv: float = 1.0
    concurrency: int = 0
    lengths: str = "fixed"
    prompt_len: int = 1000
    output_len: int = 100
    requests: int = 1000
    seed: int = 0
    warmup: float = 0.0
    cache_hit_rate: float = 0.0
    cache_tier: str = "hbm"
    times_s: tuple = field(default=(), repr=False)
    prompts: tuple = field(default=(), repr=False)
    outputs: tuple = field(default=(), repr=False)

    @property
    def trace(self) -> Trace | None:
        return TRACES.get(self.lengths)

    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output tokens [tokens]: the given ones, the trace's, or fixed."""
        if self.prompts:
            return float(np.mean(self.prompts)), float(np.mean(self.outputs))
        if self.trace:
            return self.trace.mean_prompt, self.trace.mean_output
        return float(self.prompt_len), float(self.output_len)

    def describe(self) -> str:
        """The workload in one line."""
        if self.arrival == "closed":
            when = f"{self.concurrency:,} users in a closed loop"
        elif self.arrival == "trace":
            when = f"a trace of {len(self.times_s):,} arrivals"
        else:
            burst = "" if self.arrival == "poisson" else f", gaps with squared CV {self.arrival_scv:.3g}"
            when = f"{self.rate:.4g} requests/s ({self.arrival}{burst})"
        sizes = (f"{self.prompt_len:,} + {self.output_len:,} tokens" if self.lengths == "fixed" and not self.prompts
                 else f"{self.lengths} lengths (mean {self.mean_lengths()[0]:,.0f} + {self.mean_lengths()[1]:,.0f})")
        cache = f", {self.cache_hit_rate:.0%} of prompt tokens cached in {self.cache_tier}" if self.cache_hit_rate else ""
        return f"{when}, {sizes}{cache}"

    def sample(self) -> "Requests":
        """The requests of this workload: arrival times (for a closed loop, zeros: the
        engine's run sends each user's next request as the last finishes), prompt and
        output lengths, drawn from ``seed``."""
        rng = np.random.default_rng(self.seed)
        n = len(self.times_s) if self.arrival == "trace" else self.requests
        if self.prompts:
            prompts, outputs = np.asarray(self.prompts, float), np.asarray(self.outputs, float)
        elif self.trace:
            prompts, outputs = draw_lengths(self.trace, n, rng)
        else:
            prompts, outputs = np.full(n, float(self.prompt_len)), np.full(n, float(self.output_len))
        if self.arrival == "trace":
            times = np.asarray(self.times_s, float) - float(np.min(self.times_s))
        elif self.arrival == "closed":
            times = np.zeros(n)
        elif self.arrival == "gamma":
            shape = 1.0 / self.arrival_scv
            times = np.cumsum(rng.gamma(shape, 1.0 / (shape * self.rate), n))
        else:
            times = np.cumsum(rng.exponential(1.0 / self.rate, n))
        order = np.argsort(times, kind="stable")
        return Requests(times[order], prompts[order], outputs[order])


@dataclass(frozen=True)
class Requests:
    """Drawn requests, in order of arrival: arrival times [s], prompt and output
    lengths [tokens]."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)


def draw_lengths(trace: Trace, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` prompt and output lengths drawn from a trace's quantile tables (inverse
    transform sampling, linear between the tabulated quantiles), each a whole number of
    tokens >= 1, prompt and output independently (their logarithms correlate by 0.00 and
    0.09 in the Azure traces, -0.16 in DistServe's ShareGPT, whose filter caps their sum)."""
    prompts = np.round(np.interp(rng.random(n), QUANTILES, trace.prompt))
    outputs = np.round(np.interp(rng.random(n), QUANTILES, trace.output))
    return np.maximum(prompts, 1.0), np.maximum(outputs, 1.0)


def workload(rate=None, *, prompt_len=None, output_len=None, lengths: str = "fixed", arrival: str | None = None,
             arrival_scv: float | None = None, concurrency=None, times_s=None, prompts=None, outputs=None,
             requests: int = 1000, seed: int = 0, warmup: float = 0.0, cache_hit_rate: float = 0.0,
             cache_tier: str | None = None) -> Workload:
    """A checked :class:`Workload`. ``rate`` [requests/s] for Poisson (or, with
    ``arrival_scv`` > 1, gamma) arrivals; ``concurrency`` for a closed loop; ``times_s``
    for a trace's arrival times (with ``prompts`` and ``outputs`` per request, or lengths
    as for the others). ``lengths`` a trace name of :data:`TRACES` draws lengths from its
    statistics; ``fixed`` needs ``prompt_len`` and ``output_len`` [tokens]. ``cache_tier``
    (``hbm`` when not given) is read only with a ``cache_hit_rate`` above 0."""
    if arrival is None:
        arrival = "trace" if times_s is not None else "closed" if concurrency is not None else \
            "gamma" if arrival_scv not in (None, 1, 1.0) else "poisson"
    if arrival not in ARRIVALS:
        raise SnlabError("arrival", f"got {arrival!r}", ", ".join(ARRIVALS))
    if lengths not in LENGTHS:
        raise SnlabError("lengths", f"got {lengths!r}", ", ".join(LENGTHS))
    kw = dict(arrival=arrival, lengths=lengths, seed=whole_number("seed", seed, 0, 2**32 - 1))
    trace = TRACES.get(lengths)
    if arrival in ("poisson", "gamma"):
        if rate is None:
            raise SnlabError("rate", "missing", "a rate > 0 requests per second")
        kw["rate"] = _positive("rate", rate, "a rate > 0 requests per second, at most 1,000,000", 1e6)
        scv = arrival_scv if arrival_scv is not None else (trace.arrival_scv if trace and arrival == "gamma" else 1.0)
        kw["arrival_scv"] = _positive("arrival_scv", scv, "a squared coefficient of variation > 0 and at most 1,000 "
                                                          "(1 for Poisson arrivals)", 1e3)
    if arrival == "closed":
        kw["concurrency"] = whole_number("concurrency", concurrency, 1, 100_000,
                                         "a whole number of users from 1 to 100,000")
    if arrival == "trace":
        kw["times_s"] = _times(times_s)
    n = len(kw["times_s"]) if arrival == "trace" else whole_number(
        "requests", requests, 1, MAX_REQUESTS, f"a whole number of requests from 1 to {MAX_REQUESTS:,}")
    kw["requests"] = n
    if prompts is not None or outputs is not None:
        kw["prompts"], kw["outputs"] = _per_request("prompts", prompts, n), _per_request("outputs", outputs, n)
    elif lengths == "fixed":
        for name, value in (("prompt_len", prompt_len), ("output_len", output_len)):
            if value is None:
                raise SnlabError(name, "missing", "a whole number of tokens >= 1 (or a named trace's lengths)")
            kw[name] = whole_number(name, value, 1, MAX_TOKENS, f"a whole number of tokens from 1 to {MAX_TOKENS:,}")
    if not finite(warmup) or not 0 <= warmup < 1:
        raise SnlabError("warmup", f"got {show(warmup)}", "a fraction in [0, 1) of the requests left out")
    if not finite(cache_hit_rate) or not 0 <= cache_hit_rate < 1:
        raise SnlabError("cache_hit_rate", f"got {show(cache_hit_rate)}", "a fraction in [0, 1) of prompt tokens")
    if cache_tier is not None and cache_tier not in CACHE_TIERS:
        raise SnlabError("cache_tier", f"got {cache_tier!r}", ", ".join(CACHE_TIERS))
    if cache_tier is not None and not cache_hit_rate:
        raise SnlabError("cache_tier", f"{cache_tier!r} given without a cache_hit_rate, so nothing reads it",
                         "a cache_tier together with a cache_hit_rate above 0, or neither")
    cache_tier = "hbm" if cache_tier is None else cache_tier
    return Workload(**kw, warmup=float(warmup), cache_hit_rate=float(cache_hit_rate), cache_tier=cache_tier)


def _times(times_s) -> tuple:
    allowed = f"a list of 1 to {MAX_REQUESTS:,} arrival times >= 0 [s]"
    if times_s is None:
        raise SnlabError("times_s", "missing for arrival 'trace'", allowed)
    values = _listed("times_s", times_s, allowed)
    if not 1 <= values.size <= MAX_REQUESTS:
        raise SnlabError("times_s", f"got {values.size:,} values", allowed)
    _first_bad("times_s", values, np.isfinite(values) & (values >= 0), allowed)
    return tuple(np.sort(values).tolist())


def _per_request(name: str, values, n: int) -> tuple:
    allowed = f"one whole number of tokens from 1 to {MAX_TOKENS:,} per request ({n:,})"
    if values is None:
        raise SnlabError(name, "missing beside " + ("outputs" if name == "prompts" else "prompts"), allowed)
    out = _listed(name, values, allowed)
    if out.size != n:
        raise SnlabError(name, f"got {out.size:,} values for {n:,} requests", allowed)
    _first_bad(name, out, np.isfinite(out) & (out >= 1) & (out == np.round(out)) & (out <= MAX_TOKENS), allowed)
    return tuple(out.tolist())


def _listed(name: str, values, allowed: str) -> np.ndarray:
    """``values`` as a one-dimensional float array, or an error naming ``name``."""
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise SnlabError(name, "not a list of numbers", allowed) from None
    if out.ndim != 1:
        raise SnlabError(name, "not a list", allowed)
    return out


def _first_bad(name: str, values: np.ndarray, good: np.ndarray, allowed: str) -> None:
    """An error naming the first of ``values`` that is not ``good``, and where it is."""
    if not good.all():
        i = int(np.argmin(good))
        raise SnlabError(name, f"got {show(values[i])} at position {i:,}", allowed)


def trace_table():
    """The named traces' statistics, one row each: requests, mean and median prompt and
    output lengths [tokens], the inter-arrival coefficient of variation and the
    prefix-cache hit rate with an unbounded cache, with the source (a pandas DataFrame)."""
    import pandas as pd
    rows = []
    for t in TRACES.values():
        median = QUANTILES.index(0.5)
        rows.append({"trace": t.name, "requests": t.requests, "mean prompt [tokens]": t.mean_prompt,
                     "median prompt [tokens]": t.prompt[median], "mean output [tokens]": t.mean_output,
                     "median output [tokens]": t.output[median],
                     "inter-arrival CV [1]": round(t.arrival_scv ** 0.5, 2),
                     "prefix cache hit rate [1]": t.cache_hit_rate, "source": t.source})
    return pd.DataFrame(rows)
