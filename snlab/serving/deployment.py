"""Serving deployments: parallel degrees, batch, lengths, precisions, as arrays.

Names people type (``weight_dtype="fp8"``, ``kv_offload="hbm"``) become numbers here, in
one place; the rules a deployment must obey are checked row by row, so that
:func:`snlab.serve` raises the first broken one and :func:`snlab.serve_sweep` flags each
row with its reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SnlabError
from .. import grid
from ..grid import first_broken, maximum, nearest, whole
from ..hardware import DTYPE_BYTES
from ..units import GIB
from .. import kernel as _kernel

_kernel.loaded(__name__)

#: output-length distributions for the static-batching comparison
OUTPUT_DISTS = ("fixed", "uniform", "exponential")
KV_OFFLOAD = {"hbm": 0, "auto": 1}
#: what a call models: a fixed batch of sequences in flight, or an offline benchmark that
#: queues every request at once and lets the engine schedule them (snlab.serving.offline)
SCENARIOS = ("fixed", "offline")
#: load of the busiest expert-parallel device over the mean with EPLB's redundant experts,
#: as large-EP engines run: 1.11 (TensorRT-LLM tech blog 4, 'Scaling expert parallelism',
#: Table 1: DeepSeek-R1 on 32 GB200, EP32, 9 expert slots per rank, imbalance ratio 0.109
#: averaged over layers and iterations; 2.56 with the default placement, 1.12 at EP36)
EPLB_IMBALANCE = 1.11
#: the fraction of the expert all-to-all two micro-batches hide behind each other's compute
#: (two-batch overlap), by phase: what makes the model's step with two micro-batches as much
#: faster than with one as SGLang's ablation measured on H100 (LMSYS large-EP blog, 'Ablation
#: study: two-batch overlap': decode +25.5% at 256 tokens per device and +35% with simulated
#: MTP at 128 sequences, which 0.8 gives within 2 points; prefill +27% to +35% at 8,192
#: tokens per device, which 0.6 gives); compute slowed by the overlap_contention of what hides
TBO_OVERLAP = {"decode": 0.8, "prefill": 0.6}
#: device memory [bytes] the engine keeps besides the weights and the KV cache, beyond the
#: device's ``memory_reserve``: the activations of its memory-profiling pass (a step of
#: max_num_tokens), its CUDA graphs and their pool, workspaces. TensorRT-LLM sizes the KV
#: cache as kv_fraction x (device total - the profiled peak), and a trtllm-bench run of
#: Llama 3.1 8B FP8 on one H100 (TensorRT-LLM 0.20.0, max_num_tokens 23,552, 4,096
#: sequences, 24 graphs; NVIDIA/TensorRT-LLM issue 6294) allocated 52.51 GiB of KV cache
#: (860,320 tokens of 64 KiB) at fraction 0.8 beside 8.46 GiB of weights: of the
#: 79.19 GiB an H100 reports to CUDA (81,089 MiB), 79.19 - 52.51 / 0.8 - 8.46 = 5.09 GiB
#: was the engine's. The device preset's 1 GiB reserve counts from nvidia-smi's 79.65 GiB
#: and holds the 0.46 GiB the device does not report, so the engine adds
#: 5.09 - 0.54 = 4.55 GiB. Measured on one model and one GPU; the default for every model
#: and device (engine_memory_bytes)
ENGINE_MEMORY = 4.55 * GIB
#: the largest engine_memory_bytes a deployment takes
MAX_ENGINE_MEMORY = 1e13
#: deployment fields and their defaults (None: required, or derived). hbm_utilization 0.9 is
#: vLLM's default gpu_memory_utilization: the rest of HBM is left to activations, CUDA
#: graphs and the allocator. ep_overlap None: TBO_OVERLAP with two micro-batches.
#: expert_imbalance: EPLB_IMBALANCE; graphs true: the step replayed from a captured graph
#: (CUDA graphs, the NPU's graph mode), as every engine benchmarked here runs by default;
#: host_step_s 0: the host's scheduling hidden behind the previous step. The offline
#: scenario's engine limits follow trtllm-bench (TensorRT-LLM tensorrt_llm/bench/build/
#: tuning.py): max_sequences 0 and max_step_tokens 0 take pp x its max_batch_size and its
#: max_num_tokens, which it derives from its own estimate of the requests the KV cache holds
#: (snlab.serving.offline.bench_settings; the run keeps at most what the cache does hold in
#: flight, and its largest captured graph is the smaller of the two limits); kv_fraction
#: 0.95 of the memory left after the weights and the engine's own working memory (the
#: fraction trtllm-bench also sizes its estimate with, and the KV fraction
#: NVIDIA's published runs use; TensorRT-LLM's own default is 0.90), in blocks of 32 tokens
#: (its tokens_per_block); engine_memory_bytes ENGINE_MEMORY, which the offline run and a
#: request queue's instance leave aside before they size the KV cache.
DEFAULTS = dict(tp=1, pp=1, dp=1, ep=1, batch=1, prompt_len=None, output_len=None, context=None,
                weight_dtype="bf16", kv_dtype="bf16", draft_tokens=0, acceptance=0.7, microbatches=1, ep_overlap=None,
                prefill_batch=1, hbm_utilization=0.9, pool_share=1.0, kv_offload="auto",
                output_dist="exponential", expert_imbalance=EPLB_IMBALANCE, graphs=True, host_step_s=0.0,
                scenario="fixed", requests=None, max_sequences=0, max_step_tokens=0, kv_fraction=0.95,
                kv_block_tokens=32, engine_memory_bytes=ENGINE_MEMORY)
NUMERIC = ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context", "draft_tokens", "acceptance",
           "microbatches", "ep_overlap", "prefill_batch", "hbm_utilization", "pool_share", "expert_imbalance",
           "host_step_s", "requests", "max_sequences", "max_step_tokens", "kv_fraction", "kv_block_tokens",
           "engine_memory_bytes")
#: the largest offline benchmark (requests) and engine limits a call takes
MAX_REQUESTS, MAX_STEP_TOKENS = 1e9, 1e8
ALLOWED = dict(
    tp="a whole number >= 1 dividing the attention heads", pp="a whole number from 1 to the number of layers",
    dp="a whole number >= 1 (model replicas; data-parallel attention)",
    ep="a whole number dividing tp x dp that divides tp or is a multiple of it (1 for dense models)",
    batch="a multiple of dp (sequences in flight across the deployment)",
    prompt_len="a whole number of tokens >= 1", output_len="a whole number of tokens >= 1",
    context="a whole number of tokens from prompt_len up (KV length per sequence while decoding)",
    weight_dtype=", ".join(DTYPE_BYTES), kv_dtype=", ".join(DTYPE_BYTES),
    draft_tokens="a whole number >= 0", acceptance="a probability in [0, 1]",
    microbatches="1, or 2 for two-batch overlap",
    ep_overlap="a fraction in [0, 1] of the expert all-to-all hidden behind compute with microbatches = 2 "
               "(default 0.8 in decode, 0.6 in prefill: SGLang's two-batch-overlap ablation)",
    prefill_batch="a whole number of prompts >= 1",
    hbm_utilization="a fraction in (0, 1] (vLLM's gpu_memory_utilization)",
    pool_share="a fraction in [0, 1] of the free pool this deployment may use",
    kv_offload="auto (spill to pool, host, SSD) or hbm", output_dist=", ".join(OUTPUT_DISTS),
    expert_imbalance="a factor from 1 to 64 (load of the busiest expert device over the mean; 1.11 with EPLB)",
    graphs="true or false (the step replayed from a captured graph)",
    host_step_s="a time in seconds from 0 to 1 (host work per step not hidden behind the previous one)",
    scenario=", ".join(SCENARIOS), requests="a whole number of requests from 1 to 1,000,000,000 (offline scenario)",
    max_sequences="0 (trtllm-bench's choice) or a whole number of sequences in flight per replica (pp x the "
                  "engine's max_batch_size)",
    max_step_tokens="0 (trtllm-bench's choice) or a whole number of tokens a step may process per replica, at "
                    "least the decode tokens of a step",
    kv_fraction="a fraction in (0, 1] of the memory left after the weights and the engine's working memory given to "
                "the KV cache",
    kv_block_tokens="a whole number of tokens per KV-cache block from 1 to 1,024",
    engine_memory_bytes="a size in bytes from 0 to 10 TB per device (memory the engine keeps besides weights and KV "
                        "cache; default 4.55 GiB, TensorRT-LLM's)",
)


#: the fields only the offline scenario reads (its requests and the engine's limits)
OFFLINE_ONLY = ("requests", "max_sequences", "max_step_tokens", "kv_fraction", "kv_block_tokens",
                "engine_memory_bytes")
#: the fields the offline scenario does not read, and what it reads instead
FIXED_ONLY = dict(hbm_utilization="kv_fraction sizes the offline run's KV cache",
                  pool_share="the offline run keeps its KV cache in HBM, as the engines do",
                  kv_offload="the offline run keeps its KV cache in HBM, as the engines do")


def check_scenario(deployment: dict) -> None:
    """Raise :class:`SnlabError` for a field the deployment's scenario does not read, so
    that it is not silently ignored: an offline field (:data:`OFFLINE_ONLY`) set away from
    its default in the fixed scenario; in the offline one ``batch`` (its engine picks the
    sequences in flight, ``max_sequences`` bounds them), ``context`` (its sequences grow
    from prompt to prompt + output) or a field of :data:`FIXED_ONLY` away from its default.
    A field or the scenario may be an axis of a sweep: the error is raised when no point of
    the grid reads the field."""
    dep = {k: v for k, v in deployment.items() if v is not None}
    scenarios = grid.axis_items(dep.get("scenario", DEFAULTS["scenario"])) or [DEFAULTS["scenario"]]
    if not all(isinstance(v, str) and v in SCENARIOS for v in scenarios):
        return                          # a scenario that is neither: its own rule reports it
    if set(scenarios) == {"offline"}:
        for name, instead in (("batch", "no batch; max_sequences bounds the sequences in flight per replica"),
                              ("context", "no context; prompt_len and output_len")):
            if grid.axis_items(dep.get(name)):
                why = ("which keeps as many sequences in flight as its engine limits and KV cache allow"
                       if name == "batch" else "whose sequences grow from their prompt to prompt + output")
                raise SnlabError(name, f"got {dep[name]!r} with scenario 'offline', {why}", instead)
        for name, instead in FIXED_ONLY.items():
            if grid.moved(dep, name, DEFAULTS[name]):
                raise SnlabError(name, f"got {dep[name]!r} with scenario 'offline', which does not read it",
                                 f"leave it out; {instead}")
    if set(scenarios) == {"fixed"}:
        for name in OFFLINE_ONLY:
            if grid.moved(dep, name, DEFAULTS[name]):
                raise SnlabError(name, f"got {dep[name]!r} with scenario 'fixed', which does not read it",
                                 "scenario='offline' for a run of requests queued at once, or leave it out")


def check_read(model, system, deployment: dict) -> None:
    """Raise :class:`SnlabError` for a field set away from its default that this
    deployment never reads, so that it is not silently ignored: ``expert_imbalance``
    without expert parallelism (a dense model, or ``ep`` 1, where every device computes
    its share of every expert), ``acceptance`` with no draft tokens, ``ep_overlap``
    without an expert all-to-all to hide behind a second micro-batch, ``pool_share`` on
    a system with no memory pool or with the KV cache kept in HBM. A field or its
    condition may be an axis of a sweep: the error is raised when no point of the grid
    reads the field."""
    dep = {k: v for k, v in deployment.items() if v is not None}

    def moved(name):
        return grid.moved(dep, name, DEFAULTS[name])

    def always(name, test):
        return grid.everywhere(dep, name, DEFAULTS[name], test)

    if moved("expert_imbalance"):
        if model.moe is None:
            raise SnlabError("expert_imbalance", f"got {dep['expert_imbalance']!r} for {model.name}, which has "
                             "no routed experts", "leave it out; it weighs the busiest device of a MoE model's "
                             "expert parallelism")
        if always("ep", lambda v: v == 1):
            raise SnlabError("expert_imbalance", f"got {dep['expert_imbalance']!r} with ep 1, where every device "
                             "computes its share of every expert", "ep > 1 with it, or leave it out")
    if moved("acceptance") and always("draft_tokens", lambda v: v == 0):
        raise SnlabError("acceptance", f"got {dep['acceptance']!r} with draft_tokens 0, which drafts nothing to "
                         "accept", "draft_tokens >= 1 with it, or leave it out")
    if grid.axis_items(dep.get("ep_overlap")):
        if always("microbatches", lambda v: v == 1):
            raise SnlabError("ep_overlap", f"got {dep['ep_overlap']!r} with microbatches 1: the expert all-to-all "
                             "hides only behind a second micro-batch", "microbatches=2 with it, or leave it out")
        if always("ep", lambda v: v == 1):
            raise SnlabError("ep_overlap", f"got {dep['ep_overlap']!r} with ep 1, which has no expert all-to-all "
                             "to hide", "ep > 1 with it, or leave it out")
    if moved("pool_share"):
        if system.pool is None:
            raise SnlabError("pool_share", f"got {dep['pool_share']!r} on {system.name}, which has no memory pool",
                             "leave it out, or a system with one (cloudmatrix384, gb200-nvl72, ...)")
        if always("kv_offload", lambda v: v == "hbm"):
            raise SnlabError("pool_share", f"got {dep['pool_share']!r} with kv_offload 'hbm', which keeps the KV "
                             "cache out of the pool", "kv_offload='auto' with it, or leave it out")


@dataclass(frozen=True)
class Deployment:
    """A grid of serving deployments: each field a number or an array. Choices are
    codes (``weight_dtype`` and ``kv_dtype`` index :data:`DTYPE_BYTES`, ``kv_offload``
    0 hbm / 1 auto, ``output_dist`` indexes :data:`OUTPUT_DISTS`); ``weight_bytes`` and
    ``kv_bytes`` are bytes per element; ``context`` the KV length a decode step reads,
    ``capacity_context`` the one the KV cache must hold; ``gemm_ratio`` the dense peak
    at the weight precision over the bf16 peak."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    batch: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    context: np.ndarray
    capacity_context: np.ndarray
    weight_dtype: np.ndarray
    kv_dtype: np.ndarray
    weight_bytes: np.ndarray
    kv_bytes: np.ndarray
    gemm_ratio: np.ndarray
    draft_tokens: np.ndarray
    acceptance: np.ndarray
    microbatches: np.ndarray
    ep_overlap: np.ndarray
    prefill_batch: np.ndarray
    hbm_utilization: np.ndarray
    pool_share: np.ndarray
    kv_offload: np.ndarray
    output_dist: np.ndarray
    expert_imbalance: np.ndarray
    graphs: np.ndarray
    host_step_s: np.ndarray
    efficiency_ratio: np.ndarray
    gemm_half: np.ndarray
    scenario: np.ndarray
    requests: np.ndarray
    max_sequences: np.ndarray
    max_step_tokens: np.ndarray
    kv_fraction: np.ndarray
    kv_block_tokens: np.ndarray
    engine_memory_bytes: np.ndarray

    @property
    def devices(self):
        return self.tp * self.pp * self.dp


# Rules, in the order they are reported; violations() returns the first broken one per row.
RULES = (
    ("tp", "tensor-parallel degree tp must be a whole number >= 1 that divides the attention heads"),
    ("tp", "tensor-parallel degree tp must divide the key/value heads, or be a multiple of them"),
    ("pp", "pipeline degree pp must be a whole number from 1 to the number of layers"),
    ("dp", "data-parallel degree dp must be a whole number >= 1"),
    ("batch", "batch (sequences in flight) must be a whole multiple of dp"),
    ("ep", "expert-parallel degree ep must divide tp x dp and divide tp or be a multiple of it (1 for dense models)"),
    ("draft_tokens", "draft_tokens must be a whole number >= 0"),
    ("acceptance", "acceptance must be a probability in [0, 1]"),
    ("prompt_len", "prompt_len must be a whole number of tokens >= 1"),
    ("output_len", "output_len must be a whole number of tokens >= 1"),
    ("context", "context (the KV length while decoding) must be a whole number of tokens, at least prompt_len"),
    ("microbatches", "microbatches must be 1 or 2"),
    ("prefill_batch", "prefill_batch must be a whole number of prompts >= 1"),
    ("hbm_utilization", "hbm_utilization must be a fraction in (0, 1]"),
    ("pool_share", "pool_share must be a fraction in [0, 1]"),
    ("ep_overlap", "ep_overlap must be a fraction in [0, 1]"),
    ("devices", "tp x pp x dp must be at most the system's devices"),
    ("expert_imbalance", "expert_imbalance must be a factor from 1 to 64"),
    ("requests", "the offline scenario needs requests, a whole number from 1 to 1,000,000,000"),
    ("kv_fraction", "kv_fraction must be a fraction in (0, 1]"),
    ("kv_block_tokens", "kv_block_tokens must be a whole number from 1 to 1,024"),
    ("max_sequences", "max_sequences must be 0 (pp x trtllm-bench's max_batch_size) or a whole number >= 1"),
    ("max_step_tokens", "max_step_tokens must be 0 (automatic) or a whole number of tokens that holds a step's "
                        "decode tokens (max_sequences / pp, rounded up, x (draft_tokens + 1))"),
    ("engine_memory_bytes", "engine_memory_bytes must be a size in bytes from 0 to 10 TB"),
)
REASONS = ("ok",) + tuple(m for _, m in RULES) + ("weights do not fit in HBM",
                                                   "KV cache does not fit in any memory tier")


def violations(model, system, dep: Deployment) -> np.ndarray:
    """Index into :data:`RULES` of the first rule each row breaks, or -1."""
    t, p, d, e = dep.tp, dep.pp, dep.dp, dep.ep
    experts = model.moe.experts if model.moe else 0
    safe_t = maximum(nearest(t), 1)
    safe_e = maximum(nearest(e), 1)
    return first_broken([
        ~whole(t) | (model.heads % safe_t != 0),
        (model.kv_heads % safe_t != 0) & (safe_t % model.kv_heads != 0),
        ~whole(p) | (p > model.layers),
        ~whole(d),
        (dep.scenario == 0) & (((dep.batch % maximum(d, 1)) != 0) | (dep.batch < d)),
        ~whole(e) | (((safe_t * d) % safe_e) != 0) | ((safe_e % safe_t != 0) & (safe_t % safe_e != 0))
        | ((experts == 0) & (e != 1)),
        (dep.draft_tokens != nearest(dep.draft_tokens)) | (dep.draft_tokens < 0),
        (dep.acceptance < 0) | (dep.acceptance > 1),
        ~whole(dep.prompt_len), ~whole(dep.output_len), ~whole(dep.context) | (dep.context < dep.prompt_len),
        (dep.microbatches != 1) & (dep.microbatches != 2),
        ~whole(dep.prefill_batch),
        (dep.hbm_utilization <= 0) | (dep.hbm_utilization > 1),
        (dep.pool_share < 0) | (dep.pool_share > 1),
        (dep.ep_overlap < 0) | (dep.ep_overlap > 1),
        (t * p * d > system.max_devices) if system.max_devices else np.zeros(np.shape(t), dtype=bool)[()],
        (dep.expert_imbalance < 1) | (dep.expert_imbalance > 64),
        (dep.scenario == 1) & ~(whole(dep.requests) & (dep.requests <= MAX_REQUESTS)),
        (dep.kv_fraction <= 0) | (dep.kv_fraction > 1),
        ~whole(dep.kv_block_tokens) | (dep.kv_block_tokens > 1024),
        (dep.max_sequences != 0) & ~whole(dep.max_sequences),
        (dep.max_step_tokens != 0) & (~whole(dep.max_step_tokens)
                                      | (dep.max_step_tokens < np.ceil(maximum(dep.max_sequences, 1) / maximum(p, 1))
                                         * (dep.draft_tokens + 1))),
        (dep.engine_memory_bytes < 0) | (dep.engine_memory_bytes > MAX_ENGINE_MEMORY),
    ])
