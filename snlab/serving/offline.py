"""An offline benchmark: every request queued at once, scheduled by the engine.

This is what the engines' throughput benchmarks run (``trtllm-bench throughput``,
vLLM's ``benchmark_throughput.py``, MLPerf's Offline scenario): N requests of the same
prompt and output length arrive together. The engine keeps as many sequences in
flight per replica as its limit and its KV cache allow (the KV cache holds what
``kv_fraction`` of the memory left after the weights and the engine's own working
memory (``engine_memory_bytes``) takes, in blocks of ``kv_block_tokens``; the limit is
``max_sequences``, by default trtllm-bench's max_batch_size, :func:`bench_settings`),
prefills a wave of them in chunks of its per-step token budget (``max_step_tokens``; by
default trtllm-bench's max_num_tokens), and decodes them together, replayed from the
captured graph the batch pads to; identical
requests finish together, so the next wave enters then
(:data:`snlab.walls.serving.wave_time`). The run takes its waves one after another
(``offline_makespan``); its output tokens per second and its mean time to first token
(``offline_mean_ttft``, a prompt's first token ``offline_first_token_chunks`` chunks into
its wave) follow, and its time per output token is the decode step's
over the tokens it emits per sequence (more than one with draft tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..grid import where
from ..hardware import DTYPE_BYTES, Hardware
from ..walls import serving as sv
from .deployment import Deployment
from .. import kernel as _kernel
from . import engine as _engine

_kernel.loaded(__name__)

#: trtllm-bench's caps: the requests its estimate of the KV cache may give the engine, and
#: the tokens one step may take (tensorrt_llm/bench/build/tuning.py, finetune_setting)
MAX_IN_FLIGHT, MAX_STEP_TOKENS = 4096.0, 32768.0
#: TensorRT-LLM's default max_batch_size and max_num_tokens (tensorrt_llm BuildConfig): what
#: trtllm-bench leaves them at for a quantisation it has no heuristic for (build.py,
#: TUNED_QUANTS: NVFP4, FP8 and unquantised only; INT8 weights are not among them), and a
#: request queue's instance's limits unless its deployment says (snlab.serving.service)
BUILD_BATCH, BUILD_TOKENS = 2048.0, 8192.0
#: the code of INT8 in the deployment's weight_dtype and kv_dtype (snlab.hardware.DTYPE_BYTES order)
INT8 = float(list(DTYPE_BYTES).index("int8"))


@dataclass(frozen=True)
class Offline:
    """An offline run on one replica: sequences in flight ``batch`` (the last wave's
    ``last_batch``), what the KV cache holds (``kv_sequences``) in the bytes the engine
    allocates for it on each device (``kv_pool``, :func:`kv_memory`), the engine's
    max_batch_size (``max_batch``, per pipeline stage: a replica keeps pp x that), the waves,
    the step's token budget, the chunked-prefill steps of a wave, the run's time [s], its
    output tokens per second for the whole deployment, the mean TTFT and TPOT [s]."""

    batch: np.ndarray
    last_batch: np.ndarray
    kv_sequences: np.ndarray
    kv_pool: np.ndarray
    max_batch: np.ndarray
    waves: np.ndarray
    step_tokens: np.ndarray
    chunks: np.ndarray
    makespan: np.ndarray
    tokens_per_s: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    fits: np.ndarray


def kv_memory(dep: Deployment, hw: Hardware, weights_per_device):
    """Bytes of KV cache the engine allocates on each device: ``kv_fraction`` of what is
    left after the runtime's reserve, the weights and the engine's own working memory
    (``engine_memory_bytes``, :data:`snlab.serving.deployment.ENGINE_MEMORY` by default)."""
    free = hw.hbm_capacity - hw.memory_reserve - dep.engine_memory_bytes - weights_per_device
    return dep.kv_fraction * np.maximum(free, 0.0)


def kv_sequences(dep: Deployment, hw: Hardware, weights_per_device, kv_per_token, shard):
    """Sequences of ``prompt_len + output_len`` tokens whose KV cache one replica holds:
    :func:`kv_memory` over the bytes of one sequence's blocks on each device [1]."""
    tokens = np.ceil((dep.prompt_len + dep.output_len) / dep.kv_block_tokens) * dep.kv_block_tokens
    per_sequence = tokens * kv_per_token / (dep.pp * shard)
    return np.floor(kv_memory(dep, hw, weights_per_device) / per_sequence)


def step_budget(batch, dep: Deployment):
    """The tokens a step may take when the deployment leaves it to the engine, as
    trtllm-bench sets max_num_tokens from its estimate of the batch: b (1 + prompt / output)
    tokens, at most 32,768, rounded up to 256 (at least 2,048) below 4,096, to 512 below
    8,192, else to 1,024."""
    raw = np.minimum(batch * (1 + dep.prompt_len / dep.output_len), MAX_STEP_TOKENS)
    return where(raw < 4096, np.maximum(2048.0, 256 * np.ceil(raw / 256)),
                 where(raw < 8192, 512 * np.ceil(raw / 512), 1024 * np.ceil(raw / 1024)))


@dataclass(frozen=True)
class Checkpoint:
    """What trtllm-bench reads of a model before it runs it: the parameters its checkpoint
    stores quantised (the transformer layers' and experts' matrices) and those it keeps in
    16 bits (embeddings and output head), and the layers, KV heads and head size of the
    model's configuration (a latent-attention model's as its Hugging Face configuration
    states them: every attention head, and hidden size / heads)."""

    quantised: float
    kept: float
    layers: float
    kv_heads: float
    head_size: float


def bench_bytes(stored_bytes, code):
    """Bytes per element trtllm-bench's heuristic takes for a precision stored at
    ``stored_bytes`` (:data:`snlab.hardware.DTYPE_BYTES`) with dtype ``code``: NVFP4 0.5,
    FP8 1, anything else 2, INT8 included (tensorrt_llm/bench/build/tuning.py,
    ``BYTES_PER_ELEM.get(..., 2)``)."""
    return where(code == INT8, 2.0, where(stored_bytes < 1, 0.5, stored_bytes))


def engine_group(dep: Deployment):
    """The tensor-parallel size trtllm-bench is run with for one engine: the replica's
    ``tp``, or, where experts spread over more devices than that (attention data-parallel
    across the expert group, ``ep`` > ``tp``), the expert group's ``ep``."""
    return np.maximum(dep.tp, dep.ep)


def bench_requests(dep: Deployment, hw: Hardware, ck: Checkpoint):
    """Requests trtllm-bench expects the KV cache of one engine to hold (a replica, or the
    expert group a replica's attention is data-parallel over), from which it sets the
    engine's limits (tensorrt_llm/bench/build/tuning.py, ``calc_engine_setting``):
    ``kv_fraction`` of the group's total device memory (as nvidia-smi reports it) less its
    estimate of the weights, over each request's prompt + output tokens at its estimate
    of the KV bytes per token. The weights it estimates as the parameter count of the
    checkpoint's tensors (``dataclasses.py``, ``get_param_count``: an NVFP4 tensor stores
    two weights per byte and an FP8 scale per 16 weights, so counts 0.5625 elements per
    weight) at its bytes per element (:func:`bench_bytes`), the 16-bit embeddings and head
    included; the KV cache at 2 x layers x max(tp, KV heads) x head size elements per token,
    over the devices of one engine (:func:`engine_group` x ``pp``). It counts neither the
    runtime's reserve nor the engine's working memory, so for grouped-query and multi-head
    attention it expects at least what the cache holds; for latent attention it counts
    every head's keys and values instead of the shared latent, and expects far fewer."""
    elements = np.minimum(dep.weight_bytes, 1.0)      # per weight: 0.5625 for NVFP4, else one
    weights = (ck.quantised * elements + ck.kept) * bench_bytes(dep.weight_bytes, dep.weight_dtype)
    group = engine_group(dep)
    per_token = 2 * ck.layers * np.maximum(group, ck.kv_heads) * ck.head_size * bench_bytes(dep.kv_bytes,
                                                                                           dep.kv_dtype)
    free = hw.hbm_capacity * group * dep.pp - weights
    return dep.kv_fraction * free / (per_token * (dep.prompt_len + dep.output_len))


def bench_settings(dep: Deployment, hw: Hardware, ck: Checkpoint, held):
    """trtllm-bench's max_batch_size and max_num_tokens for a run left to its heuristic
    (tensorrt_llm/bench/build/tuning.py, ``finetune_setting``): the batch it expects
    (:func:`bench_requests`, at most 4,096, per pipeline stage) rounded up as
    :func:`snlab.serving.engine.max_batch` rounds it, and that batch's step budget
    (:func:`step_budget`); TensorRT-LLM's defaults for INT8 weights, which it has no
    heuristic for. Where its estimate leaves no request at all (trtllm-bench stops there),
    the ``held`` sequences the KV cache holds stand in for it."""
    estimate = bench_requests(dep, hw, ck)
    raw = np.minimum(where(estimate >= 1, estimate, held), MAX_IN_FLIGHT) / dep.pp
    untuned = dep.weight_dtype == INT8
    return (where(untuned, BUILD_BATCH, _engine.max_batch(raw)),
            where(untuned, BUILD_TOKENS, step_budget(raw, dep)))


def offline(dep: Deployment, hw: Hardware, weights_per_device, kv_per_token, shard, prefill_pass, output_token_time,
            sequences_per_step, ck: Checkpoint) -> Offline:
    """The offline run of ``dep.requests`` requests over ``dep.dp`` replicas; ``ck`` the
    model as trtllm-bench reads it, for the limits the deployment leaves to it.

    ``prefill_pass(d)`` gives the time of one stage pass of deployment ``d``'s prefill
    (its ``prefill_batch`` prompts at once), ``output_token_time(d)`` the time per output
    token of ``d``'s ``batch`` sequences decoding (a decode step over the tokens it
    accepts per sequence, :data:`snlab.walls.serving.time_per_output_token`: with draft
    tokens a step emits more than one); ``sequences_per_step`` the tokens a decode step
    verifies per sequence (1 + draft tokens), which its token budget must hold."""
    per_replica = np.ceil(dep.requests / dep.dp)
    held = kv_sequences(dep, hw, weights_per_device, kv_per_token, shard)
    bench_batch, bench_tokens = bench_settings(dep, hw, ck, held)
    # max_batch_size bounds each pipeline stage's micro-batch: a replica keeps pp of them
    cap = where(dep.max_sequences > 0, dep.max_sequences, bench_batch * dep.pp)
    # a token budget of its own caps the sequences a step decodes: TensorRT-LLM's micro-batch
    # scheduler stops adding requests once a step's tokens (1 + draft tokens for each
    # decoding sequence) would pass max_num_tokens (batch_manager/microBatchScheduler.cpp);
    # a max_sequences of its own is held to the budget by the deployment's rules instead
    own_budget = (dep.max_sequences == 0) & (dep.max_step_tokens > 0)
    cap = where(own_budget, np.minimum(cap, np.floor(dep.max_step_tokens / sequences_per_step) * dep.pp), cap)
    b = np.maximum(np.minimum(np.minimum(held, cap), per_replica), 1.0)
    waves = np.ceil(per_replica / b)
    last = per_replica - (waves - 1) * b
    # a step (of one micro-batch) holds at least its sequences' decode tokens
    budget = np.maximum(where(dep.max_step_tokens > 0, dep.max_step_tokens, bench_tokens),
                        np.ceil(b / dep.pp) * sequences_per_step)
    limits = dict(max_sequences=cap, max_step_tokens=budget)

    def wave(n):
        chunks = np.ceil(n * dep.prompt_len / budget)
        stage = prefill_pass(dataclasses.replace(dep, prefill_batch=n / chunks, **limits))
        step = output_token_time(dataclasses.replace(dep, batch=n * dep.dp, **limits))
        # a wave's chunks flow through the pipeline's stages one behind the other; a prompt's
        # first token comes when its last chunk leaves the last stage
        time = sv.wave_time(prefill_chunks=chunks + dep.pp - 1, chunk_time=stage, mean_output_len=dep.output_len,
                            step_time=step)
        first = sv.offline_first_token_chunks(prefill_chunks=chunks, batch_sequences=n)
        return chunks, time, (first + dep.pp - 1) * stage, step

    chunks, full, first, step = wave(b)
    _, partial, last_first, last_step = wave(last)
    makespan = sv.offline_makespan(waves=waves, wave_time=full, last_wave_time=partial)
    ttft = sv.offline_mean_ttft(batch_sequences=b, waves=waves, wave_time=full, first_token_time=first,
                                last_wave_sequences=last, last_first_token_time=last_first, requests=per_replica)
    return Offline(batch=b, last_batch=last, kv_sequences=held, kv_pool=kv_memory(dep, hw, weights_per_device),
                   max_batch=np.ceil(cap / dep.pp), waves=waves,
                   step_tokens=budget, chunks=chunks,
                   makespan=makespan,
                   tokens_per_s=sv.offline_throughput(requests=dep.requests, mean_output_len=dep.output_len,
                                                      time=makespan),
                   ttft=ttft, tpot=((waves - 1) * b * step + last * last_step) / per_replica, fits=held >= 1)
