"""An engine instance's service times: what one step of it takes, and what it holds.

A request queue needs the time of every step the engine runs: decode steps of ``b``
sequences at some mean context, prefill steps (or chunks) of ``T`` tokens whose queries
attend to ``a`` keys on average, and steps that mix the two. They come from the serving
step model (:mod:`snlab.serving.step`), unchanged, evaluated once per instance over a
grid of batches, contexts and token counts (one vectorised call each), and read back
by interpolation while a run steps through its requests. A mixed step takes
:data:`snlab.walls.queueing.mixed_step_time`.

An instance is one deployment of :func:`snlab.serve` (``tp x pp x dp`` devices) with
the engine's limits: ``max_sequences`` in flight per replica (0: what the KV cache holds,
at most :data:`MAX_IN_FLIGHT`), ``max_step_tokens`` per step and replica (0:
:data:`STEP_TOKENS`), and a KV cache of ``kv_fraction`` of each device's memory after
the weights and the engine's own working memory
(``engine_memory_bytes``; in HBM; with ``kv_offload="auto"`` also
the far tiers, the supernode's pool first), in blocks of ``kv_block_tokens``.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import SnlabError
from ..hardware import hardware
from ..presets import model as load_model
from ..presets import system as load_system
from ..units import fmt_bytes
from ..walls import queueing as qw
from ..walls import serving as sv
from . import deployment as dp_
from . import offline as off
from . import step
from .planner import evaluate, serve_unchecked

#: tokens a step may take per replica unless the deployment says: TensorRT-LLM's default
#: max_num_tokens (tensorrt_llm BuildConfig), the token budget of its in-flight batching
STEP_TOKENS = int(off.BUILD_TOKENS)
#: sequences a replica keeps in flight at most unless the deployment says: TensorRT-LLM's
#: default max_batch_size (BuildConfig); the KV cache usually binds first
MAX_IN_FLIGHT = int(off.BUILD_BATCH)
#: how an instance schedules its steps
POLICIES = ("chunked", "mixed", "prefill-first", "prefill-only", "decode-only")
#: per-replica sequences tabulated exactly (one captured-graph size after another), then
#: geometrically up to the largest batch
_EXACT_BATCHES = 256
#: the smallest top of an axis (two points to interpolate between), and the lengths a
#: deployment is checked with before its tables are built (any whole number works)
_TWO = 2.0
_PROBE = {"prompt_len": 1, "output_len": 1}


@dataclass(frozen=True)
class Service:
    """One instance: its devices and replicas, the engine's limits (KV capacity in
    tokens for the whole instance, sequences in flight, step token budget, block),
    tokens a decode step adds per sequence on average and verifies (draft tokens + 1),
    KV bytes of one token of one sequence (whole
    model), the tables of decode and prefill times [s] with their axes, a one-token
    pass [s], and the far-tier read of a cached prefix per token [s] with its fixed part."""

    model: str
    system: str
    deployment: dict
    devices: int
    dp: int
    kv_tokens: float
    max_sequences: float
    step_tokens: float
    block: float
    tokens_per_step: float
    decode_tokens: float
    kv_bytes_per_token: float
    batch_axis: tuple
    context_axis: tuple
    decode_table: tuple
    token_axis: tuple
    attention_axis: tuple
    prefill_table: tuple
    one_token_pass_s: float
    cache_read_s_per_token: float
    cache_read_fixed_s: float
    fastest_decode_s: float
    hbm_tokens: float
    pool_tokens: float = 0.0
    lender_rule: tuple = field(default=(), repr=False)

    def decode_time(self, batch: float, context: float) -> float:
        """Seconds of a decode step of ``batch`` sequences (the whole instance) with a
        mean KV length of ``context`` tokens."""
        return _bilinear(self.batch_axis, self.context_axis, self.decode_table, batch / self.dp, context)

    def prefill_time(self, tokens: float, key_queries: float) -> float:
        """Seconds of a prefill pass (or chunk) of ``tokens`` prompt tokens over the
        instance whose queries attend to ``key_queries`` keys in all."""
        per = tokens / self.dp
        return _bilinear(self.token_axis, self.attention_axis, self.prefill_table, per,
                         max(key_queries / tokens, 0.5))

    def step_time(self, batch: float, context: float, tokens: float, key_queries: float) -> float:
        """Seconds of one step: decodes, a prefill chunk, or both (:data:`mixed_step_time`)."""
        if tokens <= 0:
            return self.decode_time(batch, context)
        chunk = self.prefill_time(tokens, key_queries)
        if batch <= 0:
            return chunk
        return float(qw.mixed_step_time(step_time=self.decode_time(batch, context), chunk_time=chunk,
                                        one_token_pass_time=self.one_token_pass_s))

    def lender_devices(self, peak_tokens: float) -> int:
        """Devices whose HBM the instance borrows through the supernode's pool when it
        holds ``peak_tokens`` of KV cache at most (what HBM does not hold spills to the
        pool first): :func:`snlab.serving.step.lender_devices`, which serve nothing."""
        if not self.lender_rule or not self.pool_tokens:
            return 0
        dep, hw, per_token = self.lender_rule
        pooled = min(max(peak_tokens - self.hbm_tokens, 0.0), self.pool_tokens) / self.dp
        return int(step.lender_devices(pooled * per_token, dep, hw))

    def reserve(self, tokens: float) -> float:
        """KV tokens a request of ``tokens`` (prompt + output) reserves: whole blocks."""
        return -(-tokens // self.block) * self.block


def _bilinear(xs: tuple, ys: tuple, table: tuple, x: float, y: float) -> float:
    """Linear interpolation in a table ``table[i][j]`` over axes ``xs`` and ``ys``,
    held at the edges."""
    i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    j = min(max(bisect_right(ys, y) - 1, 0), len(ys) - 2)
    fx = min(max((x - xs[i]) / (xs[i + 1] - xs[i]), 0.0), 1.0)
    fy = min(max((y - ys[j]) / (ys[j + 1] - ys[j]), 0.0), 1.0)
    row, nxt = table[i], table[i + 1]
    low = row[j] + (row[j + 1] - row[j]) * fy
    high = nxt[j] + (nxt[j + 1] - nxt[j]) * fy
    return low + (high - low) * fx


def _axis(top: float, exact: int, points: int, start: float = 1.0) -> np.ndarray:
    """1, 2, ... ``exact``, then ``points`` geometric steps up to ``top``."""
    low = np.arange(start, min(exact, top) + 1.0)
    if top <= exact:
        return low
    return np.unique(np.concatenate([low, np.geomspace(exact, top, points)]))


def instance(model, system, *, max_context: float, cache_tier: str = "hbm", **deployment) -> Service:
    """The :class:`Service` of one instance of ``deployment`` (the keywords of
    :func:`snlab.serve`, without batch and lengths) for requests up to ``max_context``
    tokens, its prefix cache in ``cache_tier``. The KV cache stays in HBM, as the engines
    keep it, unless ``kv_offload="auto"`` lets it spill to the far tiers. Bad deployments
    raise as :func:`snlab.serve` does."""
    deployment.setdefault("kv_offload", "hbm")
    key = tuple(sorted((k, v) for k, v in deployment.items()))
    return _instance(model if isinstance(model, str) else load_model(model),
                     system if isinstance(system, str) else load_system(system), float(max_context), cache_tier, key)


@lru_cache(maxsize=64)
def _instance(model, system, max_context: float, cache_tier: str, key: tuple) -> Service:
    deployment = dict(key)
    m, s = load_model(model), load_system(system)
    for name in ("batch", "prompt_len", "output_len", "context", "scenario", "requests"):
        if name in deployment:
            raise SnlabError(name, "set by the workload, not the deployment", "tp, pp, dp, ep and engine settings")
    probe = {**deployment, "batch": deployment.get("dp", dp_.DEFAULTS["dp"]), **_PROBE}
    serve_unchecked(m, s, **probe)          # the deployment's rules, as serve checks them
    cols, _, _, _ = evaluate(m, s, probe)
    dep = dp_.Deployment(**{k: np.ravel(v)[0] for k, v in cols.items()})
    hw = hardware(s)
    ss = step.serving_sizes(m)
    w = step.weights(ss.base, dep, hw)
    place = step.placement(ss, dep, hw, w)
    kv_tokens, hbm_tokens = capacity_tokens(dep, hw, w, place)
    room = float(hw.hbm_capacity - hw.memory_reserve - dep.engine_memory_bytes)
    if float(w.per_device) > room:          # no KV cache at all: the plan, not the workload, is at fault
        raise SnlabError("tp", f"weights need {fmt_bytes(float(w.per_device))} per device at tp={int(dep.tp)}, "
                         f"pp={int(dep.pp)}, ep={int(dep.ep)}; {s.device.name} has {fmt_bytes(max(room, 0.0))} after "
                         "the runtime's reserve and the engine's own memory",
                         "a tp (or pp, or ep for experts) that splits the weights to fit, or a narrower weight_dtype")
    kv_per_device = float(place.kv_per_token / (dep.pp * place.shard))
    pool_tokens = float(np.floor(place.capacity["pool"] / kv_per_device) * dep.dp) if dep.kv_offload else 0.0
    limit = float(dep.max_sequences) if dep.max_sequences else MAX_IN_FLIGHT
    budget = float(dep.max_step_tokens) if dep.max_step_tokens else float(STEP_TOKENS)
    # axes of at least two points: sequences up to what one block each fills, contexts up to the longest request
    top_batch = max(min(limit, kv_tokens / dep.dp / dep.kv_block_tokens), _TWO)
    longest = max(max_context, _TWO)
    batches = _axis(top_batch, _EXACT_BATCHES, 48)
    contexts = np.geomspace(1.0, longest, 14)
    decode = decode_table(ss, dep, hw, w, batches, contexts)
    # a prompt longer than the budget may run alone in a step of its own (prefill-first, mixed)
    tokens = _axis(max(budget, longest), 16, 40)
    attention = np.geomspace(0.5, longest, 14)
    prefill = prefill_table(ss, dep, hw, w, tokens, attention)
    one = float(prefill.min())              # one token attending to half a key: the pass's fixed part
    per_token, fixed = cache_read(ss, dep, hw, place, cache_tier)
    tau = float(sv.speculative_tokens_per_step(draft_tokens=float(dep.draft_tokens),
                                               acceptance_rate=float(dep.acceptance)))
    return Service(
        model=m.name, system=s.name, deployment=deployment, devices=int(dep.devices), dp=int(dep.dp),
        kv_tokens=kv_tokens, max_sequences=float(np.floor(limit * dep.dp)), step_tokens=budget * float(dep.dp),
        block=float(dep.kv_block_tokens), tokens_per_step=tau, decode_tokens=float(dep.draft_tokens + 1),
        kv_bytes_per_token=float(ss.kv_elements_per_token * dep.kv_bytes), batch_axis=tuple(batches.tolist()),
        context_axis=tuple(contexts.tolist()), decode_table=tuple(map(tuple, decode.tolist())),
        token_axis=tuple(tokens.tolist()), attention_axis=tuple(attention.tolist()),
        prefill_table=tuple(map(tuple, prefill.tolist())), one_token_pass_s=one, cache_read_s_per_token=per_token,
        cache_read_fixed_s=fixed, fastest_decode_s=float(decode[0, 0]), hbm_tokens=hbm_tokens,
        pool_tokens=pool_tokens, lender_rule=(dep, hw, kv_per_device))


def capacity_tokens(dep, hw, w, place) -> tuple[float, float]:
    """Tokens of KV cache the whole instance holds, in all and in HBM: ``kv_fraction`` of
    each device's memory after the runtime's reserve, the weights and the engine's own
    working memory, counted in blocks as the offline scenario counts them
    (:func:`snlab.serving.offline.kv_sequences` for one-block sequences), plus, with
    ``kv_offload="auto"``, what the far tiers lend each device."""
    one_block = dataclasses.replace(dep, prompt_len=dep.kv_block_tokens, output_len=0.0)
    blocks = off.kv_sequences(one_block, hw, w.per_device, place.kv_per_token, place.shard)
    far = sum(place.capacity[t] for t in (("pool", "host", "ssd") if dep.kv_offload else ()))
    far_tokens = np.floor(far * dep.pp * place.shard / place.kv_per_token / dep.kv_block_tokens) * dep.kv_block_tokens
    hbm = float(blocks * dep.kv_block_tokens * dep.dp)
    return hbm + float(far_tokens * dep.dp), hbm


def decode_table(ss, dep, hw, w, batches: np.ndarray, contexts: np.ndarray) -> np.ndarray:
    """Decode step [s] for each per-replica batch (rows) and KV length (columns), the
    KV cache placed as :func:`snlab.serving.step.placement` places it for that batch."""
    b, c = np.meshgrid(batches, contexts, indexing="ij")
    grid = dataclasses.replace(dep, batch=b.ravel() * dep.dp, context=c.ravel(), capacity_context=c.ravel())
    place = step.placement(ss, grid, hw, w)
    with np.errstate(all="ignore"):
        times = step.decode(ss, grid, hw, w, place).step
    return np.broadcast_to(times, b.ravel().shape).reshape(b.shape)


def prefill_table(ss, dep, hw, w, tokens: np.ndarray, attention: np.ndarray) -> np.ndarray:
    """Prefill pass [s] of each per-replica token count (rows) whose queries attend to
    the column's keys on average: :func:`snlab.serving.step.prefill` of
    ``tokens / (2 a)`` prompts of ``2 a`` tokens (causal attention attends to half a
    prompt), its KV cache written to HBM."""
    t, a = np.meshgrid(tokens, attention, indexing="ij")
    grid = dataclasses.replace(dep, prefill_batch=t.ravel() / (2 * a.ravel()), prompt_len=2 * a.ravel(),
                               batch=np.full(t.size, dep.batch), capacity_context=np.ones(t.size),
                               kv_offload=dp_.KV_OFFLOAD["hbm"])
    place = step.placement(ss, grid, hw, w)
    with np.errstate(all="ignore"):
        times = step.prefill(ss, grid, hw, w, place).ttft
    return np.broadcast_to(times, t.ravel().shape).reshape(t.shape)


def cache_read(ss, dep, hw, place, tier: str) -> tuple[float, float]:
    """Seconds per cached prompt token, and the fixed seconds per request, of reading a
    cached prefix from ``tier`` into HBM: each device reads its share of the KV bytes, one
    bulk read per layer (:data:`snlab.walls.serving.far_read_time`). A prefix in HBM
    costs nothing to reuse; a tier the system lacks is an error."""
    if tier == "hbm":
        return 0.0, 0.0
    bandwidth, latency = {"pool": (hw.pool_bandwidth, hw.pool_latency), "host": (hw.host_bandwidth, hw.host_latency),
                          "ssd": (hw.storage_bandwidth, hw.storage_latency)}[tier]
    if not bandwidth:
        raise SnlabError("cache_tier", f"the system has no {tier} tier", "hbm, or a tier the system has")
    per_device = float(place.kv_per_token / (dep.pp * place.shard))
    reads = float(ss.base.layers / dep.pp)
    fixed = float(sv.far_read_time(far_bytes=0.0, far_bandwidth=float(bandwidth), far_latency=float(latency),
                                   far_reads=reads))
    per_token = float(qw.prefix_hit_bytes(cache_hit_rate=1.0, mean_prompt_len=1.0, kv_cache_memory=per_device)
                      / bandwidth)
    return per_token, fixed
