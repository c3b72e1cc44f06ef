"""The compute wall: parameters, FLOPs and roofline time.

Parameter counts generalise Narayanan et al. 2021 (arXiv 2104.04473) Eq. 2,
``N = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))``, to grouped-query and latent
attention, gated MLPs and mixtures of experts. FLOP counts follow Narayanan 2021 Eq. 3
and Korthikanti et al. 2022 (arXiv 2205.05198) Eq. 7: a forward pass costs 2 FLOPs per
weight per token plus the attention scores, the backward pass twice the forward.
Roofline time follows Williams, Waterman and Patterson 2009 ("Roofline", CACM 52(4)).
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

L, h, a, akv, dh = sym.layers, sym.hidden_size, sym.heads, sym.kv_heads, sym.head_dim
f, V, s = sym.ffn_hidden_size, sym.vocab_size, sym.seq_len
nmlp, bias, nnorm, nemb, lpos = (sym.mlp_matrices, sym.bias, sym.norm_params,
                                 sym.embedding_copies, sym.learned_positions)
Ld, E, k, Es, fe = (sym.dense_layers, sym.experts, sym.experts_per_token,
                    sym.shared_experts, sym.expert_ffn_hidden_size)
rq, rkv, dnope, drope, dv = (sym.q_lora_rank, sym.kv_lora_rank, sym.qk_nope_head_dim,
                             sym.qk_rope_head_dim, sym.v_head_dim)
Patt, Pmlp, Pmoe, Pmoe_act = (sym.attention_params, sym.mlp_params, sym.moe_params,
                              sym.moe_active_params)

# --- parameters -------------------------------------------------------------------

attention_params_gqa = Formula(
    "attention_params_gqa", "attention_params",
    h * a * dh + 2 * h * akv * dh + a * dh * h + bias * (a * dh + 2 * akv * dh + h),
    "Narayanan 2021 Eq. 2 (4h^2 + 4h for MHA with biases), generalised to GQA",
    "Query, key, value and output projections; K and V have a_kv heads (GQA/MQA).",
)

attention_params_mla = Formula(
    "attention_params_mla", "attention_params",
    sp.Piecewise(
        (h * rq + rq + rq * a * (dnope + drope), rq > 0),
        (h * a * (dnope + drope), True),
    )
    + h * (rkv + drope) + rkv + rkv * a * (dnope + dv)
    + a * dv * h,
    "DeepSeek-AI 2024, DeepSeek-V3 technical report (arXiv 2412.19437) Sec. 2.1.1, Eqs. 1-11",
    "Multi-head latent attention: down-projections to the query rank r_q and the "
    "key/value latent r_kv (each with an RMSNorm), up-projections per head, a shared "
    "rotary key, and the output projection.",
)

mlp_params = Formula(
    "mlp_params", "mlp_params",
    nmlp * h * f + bias * ((nmlp - 1) * f + h),
    "Narayanan 2021 Eq. 2 (8h^2 + 5h for f = 4h with biases); gated MLPs have 3 matrices",
    "Dense MLP: up (and gate) projections to f and the down projection back to h.",
)

moe_params = Formula(
    "moe_params", "moe_params",
    (E + Es) * nmlp * h * fe + h * E,
    "DeepSeek-V3 report Sec. 2.1.2 (routed and shared experts, router of h x E)",
    "All routed and shared experts of one MoE layer plus the router.",
)

moe_active_params = Formula(
    "moe_active_params", "moe_active_params",
    (k + Es) * nmlp * h * fe + h * E,
    "DeepSeek-V3 report Sec. 2.1.2",
    "The experts one token passes through (top-k routed plus shared) and the router.",
)

_embeddings = nemb * V * h + lpos * s * h + nnorm * h  # final norm included

total_params = Formula(
    "total_params", "params",
    Ld * (Patt + Pmlp) + (L - Ld) * (Patt + Pmoe) + 2 * L * nnorm * h + _embeddings,
    "Narayanan 2021 Eq. 2, generalised (per-layer blocks, untied embeddings, MoE layers)",
    "All parameters: L_d dense layers, L - L_d MoE layers, two norms per layer, "
    "embeddings (and the output layer when untied), learned positions, final norm.",
)

active_params = Formula(
    "active_params", "active_params",
    Ld * (Patt + Pmlp) + (L - Ld) * (Patt + Pmoe_act) + 2 * L * nnorm * h + _embeddings,
    "as total_params with only the experts a token uses",
    "Parameters a token touches: what the forward FLOPs scale with.",
)

# --- FLOPs --------------------------------------------------------------------------

Nmm, nctx, gam = sym.matmul_params, sym.context_len, sym.causal_fraction
T, r = sym.tokens, sym.recompute
Ffwd = sym.forward_flops_per_token

attention_score_flops = Formula(
    "attention_score_flops", "flops",
    2 * L * a * (dh + dh) * nctx,
    "Narayanan 2021 Sec. 5.1 (4 L h s per token forward for the scores and their product with V)",
    "Forward FLOPs of one query token's attention over n_ctx keys: Q K^T and the scores "
    "times V, 2 d_h each per head and key, 2 FLOPs per multiply-add.",
)
_attention_scores = attention_score_flops.expr

forward_flops_per_token = Formula(
    "forward_flops_per_token", "forward_flops_per_token",
    2 * Nmm + 2 * V * h + _attention_scores,
    "Narayanan 2021 Sec. 5.1 / Eq. 3 (24 L h^2 + 4 L h s + 2 V h per token forward)",
    "Forward FLOPs of one token: 2 per weight of the layers' matrices (N_mm, active "
    "experts only), 2 V h for the output logits, and 4 d_h a per layer per attended "
    "token (n_ctx = s for full training attention, gamma_c s with causal skipping, "
    "the current context when decoding). For MLA use d_h = (d_qk + d_v)/2.",
)

_recompute_extra = sp.Piecewise(
    (2 * Nmm + _attention_scores, sp.Eq(r, 2)),  # full: the layers' forward again
    (_attention_scores, sp.Eq(r, 1)),            # selective: attention scores again
    (0, True),
)

model_step_flops = Formula(
    "model_step_flops", "step_flops",
    3 * T * Ffwd,
    "Korthikanti 2022 Eq. 7 (72 B s L h^2 (1 + s/(6h) + V/(12 h L)) for GPT)",
    "Model FLOPs of a training step over T tokens: forward plus a backward twice as "
    "costly; recomputation is not counted. snlab's MFU takes n_ctx = s/2 in F_fwd (a "
    "causal model needs half the scores); Eq. 7 and PaLM take n_ctx = s.",
)

hardware_step_flops = Formula(
    "hardware_step_flops", "step_flops",
    T * (3 * Ffwd + _recompute_extra),
    "Narayanan 2021 Eq. 3 (96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with full recomputation)",
    "FLOPs the hardware executes: model FLOPs plus the recomputed forward (full: the "
    "layers' matmuls and attention scores, not the logits; selective: the attention "
    "scores). Korthikanti 2022 Eq. 8 counts selective recomputation as twice the "
    "attention-score term; snlab counts the forward once, as executed.",
)

# --- roofline -----------------------------------------------------------------------

W, Q = sym.flops, sym.bytes_moved
Fpk, etac, Bm, etam, kap = (sym.peak_flops, sym.gemm_efficiency, sym.memory_bandwidth,
                            sym.memory_efficiency, sym.sustained_clock)
M, K, Ng, q = sym.gemm_m, sym.gemm_k, sym.gemm_n, sym.element_bytes

sustained_peak_flops = Formula(
    "sustained_peak_flops", "peak_flops",
    kap * Fpk,
    "seed article Sec. 4.3 (about 20% lost to throttling on air cooling)",
    "Peak compute derated by the sustained clock (thermal or power throttling).",
)

roofline_time = Formula(
    "roofline_time", "time",
    sp.Max(W / (etac * kap * Fpk), Q / (etam * Bm)),
    "Williams, Waterman, Patterson 2009, Roofline model",
    "A kernel takes the longer of its compute time at the achievable fraction of the "
    "(derated) peak and its memory time at the achievable fraction of memory bandwidth.",
)

gemm_flops = Formula(
    "gemm_flops", "flops", 2 * M * K * Ng,
    "standard count: one multiply and one add per term",
    "FLOPs of an (M x K) by (K x N) matrix multiply.",
)

gemm_bytes = Formula(
    "gemm_bytes", "bytes_moved", q * (M * K + K * Ng + M * Ng),
    "Austin et al. 2025, How to Scale Your Model (jax-ml/scaling-book), Part 1",
    "Bytes a matrix multiply reads and writes at least once: both operands and the result.",
)

gemm_occupancy = Formula(
    "gemm_occupancy", "gemm_occupancy",
    M / (M + sym.gemm_half_elements / Ng),
    "a saturating fit of GEMM rate against the tokens M: vLLM's kernel benchmarks (benchmarks/kernels/"
    "bench_fp8_gemm.py and bench_nvfp4_gemm.py, Llama-3.1-8B's N = 6144, K = 4096: pull requests 17126 on "
    "H100, 18778 and 20646 on B200) and aiter's tuned 8-bit GEMM table on MI300X, fitted with the roofline, "
    "one c_g per device and precision",
    "Fraction of the large-GEMM rate an (M x K) by (K x N) GEMM reaches: with few tokens its "
    "M x N output fills too few tiles to keep every SM busy, so it runs at M / (M + c_g / N) "
    "of the rate large GEMMs reach (half at M N = c_g); lower precisions, with more work per "
    "tile and cycle, need larger outputs (on B200 c_g grows from BF16 to FP8 to FP4).",
)

gemm_time = Formula(
    "gemm_time", "time",
    roofline_time.expr.subs({W: gemm_flops.expr, Q: gemm_bytes.expr}),
    "roofline_time with gemm_flops and gemm_bytes",
    "Roofline time of one matrix multiply: small M (few tokens) makes it memory-bound.",
)

# --- pipeline and utilisation -----------------------------------------------------------

p_, v_, m_ = sym.pp, sym.interleave, sym.micro_batches

pipeline_bubble_fraction = Formula(
    "pipeline_bubble_fraction", "bubble_fraction",
    (p_ - 1) / (v_ * m_),
    "Narayanan 2021 Sec. 2.2.1-2.2.2: (p - 1)/m for 1F1B, (p - 1)/(v m) interleaved",
    "Idle pipeline time as a fraction of the ideal m micro-batch times (dimensionless).",
)

Wstep, tau, ndev = sym.step_flops, sym.time, sym.group_size

flops_utilisation = Formula(
    "flops_utilisation", "utilisation",
    Wstep / (tau * ndev * Fpk),
    "Chowdhery et al. 2022 (PaLM, arXiv 2204.02311) App. B: MFU; Korthikanti 2022 Sec. 6.3: HFU",
    "Fraction of the devices' peak used: with model FLOPs (no recomputation, causal "
    "attention) this is MFU, with the FLOPs the hardware executes it is HFU.",
)
