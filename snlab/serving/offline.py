"""An offline benchmark: every request queued at once, scheduled by the engine.

This is what the engines' throughput benchmarks run (``trtllm-bench throughput``,
vLLM's ``benchmark_throughput.py``, MLPerf's Offline scenario): N requests of the same
prompt and output length arrive together. The engine keeps as many sequences in
flight per replica as its limit and its KV cache allow (``max_sequences``; by default
what ``kv_fraction`` of the memory left after the weights and the engine's own
working memory (``engine_memory_bytes``) holds, in blocks of
``kv_block_tokens``, at most 4,096 per pipeline), prefills a wave of them in chunks of
its per-step token budget (``max_step_tokens``; by default as trtllm-bench sets it,
:func:`step_budget`), and decodes them together; identical
requests finish together, so the next wave enters then
(:data:`snlab.walls.serving.wave_time`). The run takes its waves one after another
(``offline_makespan``); its output tokens per second and its mean time to first token
(``offline_mean_ttft``) follow, and its time per output token is the decode step's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..grid import where
from ..hardware import Hardware
from ..walls import serving as sv
from .deployment import Deployment
from .. import kernel as _kernel

_kernel.loaded(__name__)

#: trtllm-bench's caps: sequences a replica keeps in flight (over its pipeline stages) and
#: tokens one step may take (tensorrt_llm/bench/build/tuning.py, finetune_setting)
MAX_IN_FLIGHT, MAX_STEP_TOKENS = 4096.0, 32768.0


@dataclass(frozen=True)
class Offline:
    """An offline run on one replica: sequences in flight ``batch`` (the last wave's
    ``last_batch``), what the KV cache holds (``kv_sequences``), the waves, the step's
    token budget, the chunked-prefill steps of a wave, the run's time [s], its output
    tokens per second for the whole deployment, the mean TTFT and TPOT [s]."""

    batch: np.ndarray
    last_batch: np.ndarray
    kv_sequences: np.ndarray
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
    trtllm-bench sets max_num_tokens: b (1 + prompt / output) tokens, at most 32,768,
    rounded up to 256 (at least 2,048) below 4,096, to 512 below 8,192, else to 1,024."""
    raw = np.minimum(batch * (1 + dep.prompt_len / dep.output_len), MAX_STEP_TOKENS)
    return where(raw < 4096, np.maximum(2048.0, 256 * np.ceil(raw / 256)),
                 where(raw < 8192, 512 * np.ceil(raw / 512), 1024 * np.ceil(raw / 1024)))


def offline(dep: Deployment, hw: Hardware, weights_per_device, kv_per_token, shard, prefill_pass, decode_step,
            sequences_per_step) -> Offline:
    """The offline run of ``dep.requests`` requests over ``dep.dp`` replicas.

    ``prefill_pass(d)`` gives the time of one stage pass of deployment ``d``'s prefill
    (its ``prefill_batch`` prompts at once), ``decode_step(d)`` the decode step of ``d``'s
    ``batch`` sequences; ``sequences_per_step`` the tokens a decode step adds per
    sequence (1 + draft tokens)."""
    per_replica = np.ceil(dep.requests / dep.dp)
    held = kv_sequences(dep, hw, weights_per_device, kv_per_token, shard)
    cap = where(dep.max_sequences > 0, dep.max_sequences, np.floor(MAX_IN_FLIGHT / dep.pp))
    b = np.maximum(np.minimum(np.minimum(held, cap), per_replica), 1.0)
    waves = np.ceil(per_replica / b)
    last = per_replica - (waves - 1) * b
    budget = np.maximum(where(dep.max_step_tokens > 0, dep.max_step_tokens, step_budget(b, dep)),
                        b * sequences_per_step)

    def wave(n):
        chunks = np.ceil(n * dep.prompt_len / budget)
        stage = prefill_pass(dataclasses.replace(dep, prefill_batch=n / chunks))
        step = decode_step(dataclasses.replace(dep, batch=n * dep.dp))
        # a wave's chunks flow through the pipeline's stages one behind the other; a prompt's
        # first token comes when its chunk leaves the last stage, half-way through on average
        time = sv.wave_time(prefill_chunks=chunks + dep.pp - 1, chunk_time=stage, mean_output_len=dep.output_len,
                            step_time=step)
        return chunks, time, ((chunks + 1) / 2 + dep.pp - 1) * stage, step

    chunks, full, first, step = wave(b)
    _, partial, last_first, last_step = wave(last)
    makespan = sv.offline_makespan(waves=waves, wave_time=full, last_wave_time=partial)
    ttft = sv.offline_mean_ttft(batch_sequences=b, waves=waves, wave_time=full, first_token_time=first,
                                last_wave_sequences=last, last_first_token_time=last_first, requests=per_replica)
    return Offline(batch=b, last_batch=last, kv_sequences=held, waves=waves, step_tokens=budget, chunks=chunks,
                   makespan=makespan,
                   tokens_per_s=sv.offline_throughput(requests=dep.requests, mean_output_len=dep.output_len,
                                                      time=makespan),
                   ttft=ttft, tpot=((waves - 1) * b * step + last * last_step) / per_replica, fits=held >= 1)
