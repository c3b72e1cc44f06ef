"""What an inference engine adds to a step's rooflines: the fixed time of each kernel,
the decode-attention call's fixed time, sampling, and its own all-reduce.

A decode step of a large model at a small batch moves little data per kernel, so each
kernel's fixed time (its launch inside a captured graph, prologue and tail) is a large
part of the step: at batch 1 on eight GPUs a 70B model's step takes nearly five times
its weight-streaming time (AMD's vLLM latency table, amd-rocm-performance-results, image
rocm/vllm:rocm7.0.0_vllm_0.10.2_20251006, Llama 3.1 70B FP8, 8x MI300X: 15.882 s for 2,048
tokens, 7.75 ms a step, against 1.7 ms). The terms here are each calibrated from a
kernel-level measurement, named in the device and system presets:

* ``kernel_floor``: DeepGEMM's FP8 GEMMs at decode shapes (M = 64 and 128, H800) take
  their bytes at the device's measured HBM bandwidth plus 3.3 us (the median over the
  twelve shapes of its README table): 3.3 us is a kernel's fixed time in a captured graph;
* ``decode_attention_floor``: FlashInfer's batch decode over a paged KV cache (H100, FP16 KV,
  MHA and GQA) takes KV bytes / (0.92 x 3.35 TB/s) + 18 us per call (a fit over 21
  points of its blog's Figures 6 and 9): 18 us is the attention call's fixed time;
* ``direct_call_latency``: the engines' one-shot all-reduce (SGLang PR 2904's table on
  H100, TP 8) takes 5.9 us at 1 kB and 16.7 us at 512 kB, which the one-shot formula
  reproduces with a fixed 5.3 us;
* sampling reads the step's fp32 logits twice (FlashInfer's sorting-free top-k/top-p
  kernels; their blog measures 3.3% of a Llama 3.1 8B step on an H100).

Without a captured graph each kernel waits for the host to launch it
(``launch_overhead``). The host's own work for a step (scheduling, batch assembly) runs
while the previous step executes on today's engines (SGLang's zero-overhead batch
scheduler, TensorRT-LLM's overlap scheduler; vLLM's async scheduling only where it is
switched on, --async-scheduling), so it costs the step nothing unless the deployment says
otherwise (``host_step_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import network as net
from ..grid import where
from ..hardware import ACTIVATION_BYTES, Hardware
from ..walls import compute as cw
from .. import kernel as _kernel

_kernel.loaded(__name__)

#: bytes of one logit the sampler reads (fp32)
LOGIT_BYTES = 4.0
#: passes a sorting-free top-k / top-p sampler makes over the logits
SAMPLER_PASSES = 2.0


#: batch sizes a decode step is captured at, as NVIDIA's published runs capture them
#: (TensorRT-LLM perf-overview, llm_options.yml: cuda_graph_config.batch_sizes with
#: enable_padding); a batch in between runs the next captured graph, padded
CAPTURED_BATCHES = np.asarray([1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192], dtype=float)


def max_batch(sequences):
    """The engine's largest batch for ``sequences`` in flight, as trtllm-bench rounds it
    up (tensorrt_llm/bench/build/tuning.py, finetune_setting): to 32 (at least 64) below
    256, to 128 below 1,024, else to 256. No graph is captured above it."""
    return where(sequences < 256, np.maximum(64.0, 32 * np.ceil(sequences / 32)),
                 where(sequences < 1024, 128 * np.ceil(sequences / 128), 256 * np.ceil(sequences / 256)))


def padded(sequences, graphs, largest=None):
    """Sequences a decode step computes: the next captured batch size, or the largest
    graph the engine captures if that comes first (the padded slots run through the GEMMs,
    the element-wise kernels, the all-reduces and the expert exchange like the others, as
    the dummy requests TensorRT-LLM pads a graph's batch with do; their attention does not,
    having no context); beyond the largest captured size, or without
    graphs, the batch itself.

    ``largest`` is that largest graph: TensorRT-LLM keeps the captured sizes up to
    min(max_batch_size, max_num_tokens / (1 + draft tokens)) and, with padding on, adds
    that bound itself when a listed size exceeds it (tensorrt_llm/_torch/pyexecutor/
    model_engine.py, ``_filter_cuda_graph_batch_sizes``). By default the engine's
    max_batch_size is the batch itself as trtllm-bench rounds it (:func:`max_batch`)."""
    i = np.minimum(np.searchsorted(CAPTURED_BATCHES, sequences - 1e-9), len(CAPTURED_BATCHES) - 1)
    # CAPTURED_BATCHES[i]; a scalar kernel looks it up by the traced index itself
    captured = np.choose(i, CAPTURED_BATCHES) if _kernel.is_traced(i) else CAPTURED_BATCHES[i]
    largest = max_batch(sequences) if largest is None else largest
    size = np.maximum(np.minimum(captured, largest), sequences)
    return where((graphs > 0) & (sequences <= CAPTURED_BATCHES[-1]), size, sequences)


@dataclass(frozen=True)
class Kernels:
    """Kernels one layer of a model launches in a decode step, averaged over its layers
    (attention with its norm and rotary embedding, the MLP or MoE block), the attention
    call apart; and the kernels of the output head (norm, GEMM)."""

    per_layer: float
    head: float


@lru_cache(maxsize=256)
def kernels(model) -> Kernels:
    """Kernels per layer as the engines' model code launches them (vLLM
    model_executor/models/llama.py and deepseek_v2.py; SGLang and TensorRT-LLM fuse about
    as much):

    * every layer: two fused residual-add + RMSNorm, the rotary embedding;
    * attention GEMMs: QKV and output projection (GQA/MHA); with latent attention the
      query down- and up-projection, the key/value down-projection, the absorbed key
      and value up-projections and the output projection, plus two latent norms;
    * a dense MLP: the fused gate/up GEMM, the activation, the down GEMM;
    * a MoE block: the router GEMM, top-k, the grouped up and down GEMMs, their
      activation, and the shared experts' up, activation and down.
    """
    if model.mla:
        attention = 5 + (1 if model.mla.q_lora_rank else 0) + 2
    else:
        attention = 2
    common = 2 + 1 + attention
    dense = 3
    if model.moe:
        block = 2 + 3 + (3 if model.moe.shared_experts else 0)
        d = model.moe.dense_layers
        mlp = (d * dense + (model.layers - d) * block) / model.layers
    else:
        mlp = dense
    return Kernels(per_layer=float(common + mlp), head=2.0)


def kernel_time(hw: Hardware, graphs):
    """Fixed seconds of one kernel: its floor inside a captured graph, or, launched one by
    one from the host, the longer of that and the host's launch time."""
    return where(graphs > 0, hw.kernel_floor, np.maximum(hw.kernel_floor, hw.launch_overhead))


def fixed_time(k: Kernels, layers, hw: Hardware, graphs):
    """Fixed seconds of a pass through ``layers`` layers and the output head: every
    kernel's fixed time and each layer's decode-attention call's (FlashInfer's fit:
    its intercept)."""
    per = kernel_time(hw, graphs)
    return layers * (k.per_layer * per + np.maximum(hw.decode_attention_floor, per)) + k.head * per


def sampling_time(tokens, vocab_size, hw: Hardware, graphs):
    """Seconds to sample the step's ``tokens`` (every sequence, draft tokens included)
    from their fp32 logits: one kernel reading them ``SAMPLER_PASSES`` times."""
    bytes_moved = SAMPLER_PASSES * tokens * vocab_size * LOGIT_BYTES
    return kernel_time(hw, graphs) + cw.roofline_time(flops=0.0, bytes_moved=bytes_moved, **hw.roofline())


def elementwise_bytes(tokens, sizes, tp):
    """Bytes the element-wise kernels of a pass move, per layer [bytes]: two fused
    residual-add + RMSNorm (each reads the hidden state and the residual and writes both,
    replicated on every tensor-parallel rank), the rotary embedding (reads and writes the
    queries and keys) and the MLP's activation (a gated MLP reads gate and up and writes
    their product, a plain one reads its input and writes its output: ``mlp_matrices``
    widths), the last two split by tensor parallelism; 16-bit. They run between the GEMMs,
    so their traffic adds to the step instead of hiding behind the GEMMs' compute."""
    queries_keys = sizes.query_width + sizes.activation_kv_heads * sizes.activation_head_dim
    return ACTIVATION_BYTES * tokens * (2 * 4 * sizes.hidden_size
                                        + (2 * queries_keys + sizes.mlp_matrices * sizes.ffn_activation_width) / tp)


def tensor_all_reduce(S, n, hw: Hardware):
    """Seconds of one tensor-parallel all-reduce of S bytes over n devices in a serving
    step: the engine's one-shot kernel where the group sits inside one scale-up domain
    and the system has one (``direct_call_latency`` > 0; :func:`snlab.network.one_shot_all_reduce`,
    at the group's bandwidth: on a full mesh its members' mutual links), else the collective
    library's (:func:`snlab.network.all_reduce`), whichever is faster for the message."""
    library = net.all_reduce(S, n, 1.0, hw)
    direct = net.one_shot_all_reduce(S, n, hw)
    usable = (hw.scale_up_direct_call_latency > 0) & (n <= hw.scale_up_domain_size) & (n > 1)
    return where(usable, np.minimum(library, direct), library)


def all_reduce_bytes(tokens, hidden_size):
    """Bytes of one tensor-parallel all-reduce: the tokens' 16-bit activations."""
    return tokens * hidden_size * ACTIVATION_BYTES
