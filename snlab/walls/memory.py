"""The memory wall: model states under ZeRO, activations, KV cache, capacity.

Model-state bytes follow Rajbhandari et al. 2019, ZeRO (arXiv 1910.02054), Sec. 3.1
and Sec. 5 (stages P_os, P_os+g, P_os+g+p). Activation bytes per layer follow
Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4 and Table 2, generalised to
grouped-query attention and gated MLPs from the paper's own per-tensor breakdown
(Sec. 4.1). KV-cache bytes: 2 L a_kv d_h per token for MHA/GQA; L (r_kv + d_rope) for
DeepSeek's latent attention (DeepSeek-V2 report, arXiv 2405.04434, Table 1).
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

Pdev, qw, qg, qo, z, dz = (sym.params_per_device, sym.weight_bytes, sym.grad_bytes,
                           sym.optimizer_bytes, sym.zero_stage, sym.zero_shards)


def _shard(stage: int) -> sp.Expr:
    """Divisor of a state that ZeRO shards from ``stage`` on."""
    return sp.Piecewise((dz, z >= stage), (1, True))


weight_memory = Formula(
    "weight_memory", "weight_memory", Pdev * qw / _shard(3),
    "ZeRO (Rajbhandari et al. 2019) Sec. 5.3: stage 3 partitions the parameters",
    "Weight bytes per device; sharded over d_z from ZeRO stage 3.",
)
grad_memory = Formula(
    "grad_memory", "grad_memory", Pdev * qg / _shard(2),
    "ZeRO Sec. 5.2: stage 2 partitions the gradients",
    "Gradient bytes per device; sharded over d_z from ZeRO stage 2. Megatron-LM keeps "
    "fp32 gradients (q_g = 4) unless told otherwise.",
)
optimizer_memory = Formula(
    "optimizer_memory", "optimizer_memory", Pdev * qo / _shard(1),
    "ZeRO Sec. 3.1 (K = 12 for mixed-precision Adam) and Sec. 5.1 (stage 1)",
    "Optimizer-state bytes per device; sharded over d_z from ZeRO stage 1.",
)
model_state_memory = Formula(
    "model_state_memory", "model_state_memory",
    weight_memory.expr + grad_memory.expr + optimizer_memory.expr,
    "ZeRO Figure 1: (2 + 2 + K) Psi, K Psi / N_d, (2 + K) Psi / N_d, (2 + 2 + K) Psi / N_d",
    "Weights + gradients + optimizer state per device.",
)

optimizer_step_traffic = Formula(
    "optimizer_step_traffic", "bytes_moved",
    Pdev * (4 * qg + 2 * qo + qw),
    "Rajbhandari et al. 2019 (ZeRO) Sec. 3.1 (Adam's K = 12 bytes of fp32 state); Megatron-LM "
    "megatron/core/optimizer (clip_grads.py: the gradient norm; optimizer.py: the inf/NaN check "
    "with unscaling, the fused Adam, zero_grad)",
    "Bytes one optimizer step moves through the memory that holds the state, for P_dev "
    "parameters: the gradients read for their norm, for the inf/NaN check and by Adam, and "
    "zeroed for the next step (4 q_g); Adam's states read and written (2 q_o); the new "
    "16-bit weights written (q_w).",
)

# --- activations (Korthikanti 2022) -----------------------------------------------

s, b, h, a, t = sym.seq_len, sym.micro_batch, sym.hidden_size, sym.heads, sym.tp
akv, dh, fact = sym.kv_heads, sym.head_dim, sym.ffn_activation_width
nmlp, r, sigma = sym.mlp_matrices, sym.recompute, sym.sequence_parallel
L, p, v, nf = sym.layers, sym.pp, sym.interleave, sym.in_flight
V = sym.vocab_size

qa, ql = sym.activation_bytes, sym.logit_bytes

wq, wo, wc = sym.query_width, sym.attention_output_width, sym.latent_width
kr, Er, rp, Ls, m = sym.routed_copies, sym.router_width, sym.stage_rank, sym.stage_layers, sym.micro_batches
dr = sym.dropout

# Korthikanti Sec. 4.1, per layer, with q_a bytes per activation element (2: 16-bit) and
# q_a / 2 per dropout-mask element (1 byte), generalised to the real tensor widths.
# Kept whole under plain tensor parallelism: two LayerNorm inputs, the attention and MLP
# inputs (4 elements per token and hidden unit) and, when the model trains with dropout
# (delta = 1), the masks of the attention and MLP output dropouts (2 half elements):
# 10 s b h bytes at q_a = 2; latent attention's compressed query and key/value and their
# normalised copies (w_c); the router's fp32 logits (E_r);
_replicated = qa * s * b * ((4 + dr) * h + wc) + ql * s * b * Er
# split by tensor parallelism: Q (w_q), K and V (2 a_kv d_h), the output-projection input
# (w_o), the MLP's hidden tensors n_mlp f (GeLU input and output for f = 4h; gate, up and
# product for SwiGLU), and on MoE layers the k dispatched copies of the token (k_r h; the
# routing weights are applied inside the experts' activation, so the combine keeps no
# expert outputs: Megatron-Core moe_permute_fusion and its MoE README, 'memory efficient
# token permutation'): 24 s b h bytes for GPT at q_a = 2;
_split = qa * s * b * (wq + wo + 2 * akv * dh + nmlp * fact + kr * h)
# attention scores: the softmax output a s^2 b (its own backward and, without dropout, the
# product with V need it); with dropout also the mask (half) and the dropout output, which
# the product with V keeps in addition.
_scores = (1 + sp.Rational(3, 2) * dr) * qa * a * s**2 * b

activation_memory_per_layer = Formula(
    "activation_memory_per_layer", "activation_memory",
    sp.Piecewise(
        (qa * s * b * h / t**sigma, sp.Eq(r, 2)),
        (_replicated / t**sigma + _split / t, sp.Eq(r, 1)),
        (_replicated / t**sigma + (_split + _scores) / t, True),
    ),
    "Korthikanti 2022 Table 2 and Sec. 4.1: s b h (34 + 5 a s / h) without parallelism, at q_a = 2 "
    "(w_q = w_o = h, no latents, no experts, dropout); the tensors each term counts, at the model's "
    "real widths",
    "Activation bytes one layer keeps for one micro-batch. r = 0: everything "
    "(s b h (10 + 24/t + 5 a s/(h t)) for GPT, or s b h (34 + 5 a s/h)/t with sequence "
    "parallelism); r = 1 (selective): without the attention-score term; "
    "r = 2 (full): only the layer input 2 s b h (/t with sequence parallelism). A model "
    "trained without dropout (delta = 0: Llama, Mixtral, Qwen3, DeepSeek-V3, MPT) keeps "
    "no masks: 2 s b h fewer bytes, and 2 a s^2 b instead of 5 a s^2 b for the scores. "
    "Latent attention keeps its wider queries (a 192 for DeepSeek-V3), keys, values and "
    "output (a 128), and its latents; a MoE layer keeps its k dispatched token copies and k "
    "expert outputs.",
)

wrr, wrs, w8r, w8s = (sym.recomputed_replicated_width, sym.recomputed_split_width, sym.fp8_replicated_width,
                      sym.fp8_split_width)

recomputed_activation_memory = Formula(
    "recomputed_activation_memory", "activation_memory",
    qa * s * b * (wrr / t**sigma + wrs / t),
    "Megatron-Core TransformerConfig.recompute_modules (megatron/core/transformer/transformer_config.py): "
    "layernorm, mla_up_proj and moe_act discard their outputs and rebuild them in the backward pass; "
    "mlp, shared_experts and moe checkpoint their submodule and keep only its input",
    "Activation bytes one layer no longer keeps for one micro-batch when selective "
    "recomputation names modules: the norms' outputs (w_r, replicated without sequence "
    "parallelism), latent attention's queries, keys and values after their up-projection, "
    "the routed experts' activation output, or the tensors inside the dense MLP, the shared "
    "experts or the whole MoE block (w_r').",
)

fp8_activation_saving = Formula(
    "fp8_activation_saving", "activation_memory",
    qa / 2 * s * b * (w8r / t**sigma + w8s / t),
    "Transformer Engine transformer_engine/pytorch/module/linear.py and layernorm_linear.py: in FP8 a "
    "linear layer saves its quantised input (1 byte) for the backward pass; the output projection keeps "
    "an FP8 copy of its input beside the 16-bit attention output the attention backward needs",
    "Activation bytes FP8 training saves per layer and micro-batch: half of each 16-bit "
    "linear-layer input it keeps in FP8 instead (QKV and MLP inputs w_8; the MLP's second "
    "input and the experts' dispatched tokens in w_8'), less the FP8 copy of the output "
    "projection's input.",
)

stage_in_flight = Formula(
    "stage_in_flight", "in_flight",
    sp.Piecewise((sp.Min(m, p - rp), sp.Eq(v, 1)),
                 (sp.Min(m, (2 * (p - rp - 1) + (v - 1) * p + 1) / v), True)),
    "Narayanan 2021 Sec. 2.2 (1F1B: stage r runs p - r forward passes before its first "
    "backward); Megatron-Core pipeline_parallel/schedules.py (interleaved warm-up: "
    "2 (p - r - 1) + (v - 1) p micro-batch chunks on rank r, micro-batches in groups of p); "
    "Korthikanti 2022 Sec. 4.2.3 (the first stage: p (1 + (p - 1)/(p v)))",
    "Micro-batches whose activations pipeline stage r holds at once, in whole-stage "
    "equivalents: p - r under 1F1B; under the interleaved schedule the warm-up chunks "
    "plus the one in flight, over v chunks per stage; never more than the micro-batches.",
)

activation_memory_stage = Formula(
    "activation_memory_stage", "activation_memory",
    sym.activation_memory * Ls * nf,
    "Korthikanti 2022 Sec. 4.2.3 (Eq. 5), for a stage of L_s layers",
    "Activation bytes of a pipeline stage: per-layer bytes, times its L_s layers, times "
    "the micro-batches it holds in flight.",
)

logits_memory = Formula(
    "logits_memory", "activation_memory",
    ql * s * b * V / t,
    "Korthikanti 2022 Sec. 4.3 (fp32 logits 4 s b V / t on the last stage)",
    "Bytes of the fp32 output logits of one micro-batch on the last pipeline stage.",
)

# --- KV cache -----------------------------------------------------------------------

qkv, rkv, drope = sym.kv_bytes, sym.kv_lora_rank, sym.qk_rope_head_dim

kv_cache_per_token_gqa = Formula(
    "kv_cache_per_token_gqa", "kv_cache_memory",
    2 * L * akv * dh * qkv,
    "Pope et al. 2022, Efficiently Scaling Transformer Inference (arXiv 2211.05102) Sec. 2",
    "KV-cache bytes per token of context per sequence, MHA or GQA.",
)
kv_cache_per_token_mla = Formula(
    "kv_cache_per_token_mla", "kv_cache_memory",
    L * (rkv + drope) * qkv,
    "DeepSeek-V2 report (arXiv 2405.04434) Table 1: (d_c + d_h^R) l elements per token",
    "KV-cache bytes per token per sequence with latent attention: the compressed latent "
    "and the shared rotary key.",
)

# --- capacity -----------------------------------------------------------------------

usable_memory = Formula(
    "usable_memory", "capacity",
    sp.Max(sym.capacity - sym.memory_reserve, 0) * sym.allocator_efficiency,
    "PyTorch issue #107667 (CUDA context about 300 MB with lazy loading); NCCL src/init.cc (about "
    "9 MiB of buffers per channel and peer); HCCL_BUFFSIZE (2 x 200 MB per communicator on Ascend); "
    "the caching allocator's reserved-over-allocated overhead in Megatron-LM training logs",
    "Memory a training job can actually use: the capacity the driver reports, less what the "
    "runtime holds before the job allocates, times the fraction the caching allocator can "
    "hand out without fragmenting; nothing when the reserve takes it all.",
)

memory_headroom = Formula(
    "memory_headroom", "capacity",
    sym.capacity - sym.used_memory,
    "definition",
    "Bytes left over; negative means the job does not fit.",
)
