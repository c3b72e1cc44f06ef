"""Serving formulas: speculative decoding, expert routing, tiered KV-cache reads,
one-shot all-to-all, KV capacity and batching.

These complete the three walls for inference; :mod:`snlab.serving` composes them with
the compute wall's roofline and FLOP counts, the memory wall's KV-cache bytes and the
communication wall's collectives.

References
----------
* Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
  Decoding", ICML (arXiv 2211.17192), Eq. 1 and Sec. 3.1.
* DeepSeek-AI 2024, DeepSeek-V2 report (arXiv 2405.04434) Sec. 2.1.3 (absorbing the
  key and value up-projections into the query and output projections at inference).
* DeepSeek-AI 2025, DeepEP (github.com/deepseek-ai/DeepEP): normal kernels send a
  token once per destination node and forward it over NVLink; low-latency kernels
  write every (token, expert) copy straight to the expert's device.
* Sheng et al. 2023, "FlexGen", ICML (arXiv 2303.06865) Sec. 4.2: a cost model in which
  loads from slower tiers run concurrently with the work on the device.
* Yu et al. 2022, "Orca", OSDI, Sec. 3 (iteration-level scheduling, i.e. continuous
  batching); Kwon et al. 2023, vLLM, SOSP (arXiv 2309.06180).
* David and Nagaraja 2003, "Order Statistics", 3rd ed., Wiley: the expected maximum
  of n uniform draws is n/(n+1) of the range; of n exponential draws H_n times the
  mean (Renyi's representation, their Sec. 2.5).
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

# --- speculative decoding and multi-token prediction ---------------------------------

kd, acc, tau_s, tstep = sym.draft_tokens, sym.acceptance_rate, sym.tokens_per_step, sym.step_time

speculative_tokens_per_step = Formula(
    "speculative_tokens_per_step", "tokens_per_step",
    sp.Piecewise((kd + 1, sp.Eq(acc, 1)), ((1 - acc**(kd + 1)) / (1 - acc), True)),
    "Leviathan, Kalman, Matias 2023 (arXiv 2211.17192) Eq. 1",
    "Expected tokens a sequence gains per verification step when k_d draft tokens are "
    "proposed and each is accepted with probability alpha_a independently: the accepted "
    "prefix plus the one token the target model adds. k_d = 0 gives 1; DeepSeek-V3's "
    "multi-token prediction with one draft at 70% acceptance gives 1.7.",
)

time_per_output_token = Formula(
    "time_per_output_token", "time",
    tstep / tau_s,
    "definition (TPOT): step time over the tokens each sequence emits per step",
    "Time per output token seen by one sequence.",
)

# --- attention at decode time -------------------------------------------------------

L, a, nctx = sym.layers, sym.heads, sym.context_len
rkv, drope = sym.kv_lora_rank, sym.qk_rope_head_dim

mla_absorbed_attention_flops = Formula(
    "mla_absorbed_attention_flops", "flops",
    2 * L * a * (2 * rkv + drope) * nctx,
    "DeepSeek-V2 report (arXiv 2405.04434) Sec. 2.1.3; FlashMLA decode kernel",
    "Attention FLOPs of one query token with latent attention computed in the latent "
    "space (up-projections absorbed): per head and attended token, a (r_kv + d_rope)-long "
    "score product and an r_kv-long weighted sum of latents, 2 FLOPs per term. Larger "
    "than the 4 a d_h of the uncompressed form, which is why MLA decode can be "
    "compute-bound while it reads little KV cache.",
)

# --- expert routing -----------------------------------------------------------------

E, k, T = sym.experts, sym.experts_per_token, sym.tokens
n2 = sym.outer_size

expert_activation = Formula(
    "expert_activation", "expert_activation",
    1 - (1 - k / E)**T,
    "occupancy of E bins by T tokens each choosing k of them uniformly (balanced router)",
    "Expected fraction of expert slots that receive at least one of T tokens routed to "
    "top-k of E slots: the fraction whose weights a decode step must read. Near 1 at "
    "large batch, about T k / E for a handful of tokens.",
)

domains_per_token = Formula(
    "domains_per_token", "domains_per_token",
    n2 * (1 - (1 - 1 / n2)**k),
    "occupancy of n_2 domains by a token's k experts (uniform placement, drawn with replacement)",
    "Expected number of scale-up domains that host at least one of a token's k experts; "
    "DeepEP's normal (prefill) kernels send a token across the scale-out network once "
    "per such remote domain and forward it inside the domain over the scale-up bus.",
)

# --- one-shot (direct) all-to-all ----------------------------------------------------

a0, a1, b1, e1 = sym.call_latency, sym.inner_latency, sym.inner_bandwidth, sym.inner_efficiency
a2, b2, e2 = sym.outer_latency, sym.outer_bandwidth, sym.outer_efficiency
S1, S2 = sym.inner_bytes, sym.outer_bytes

direct_all_to_all_time = Formula(
    "direct_all_to_all_time", "time",
    a0 + sp.Max(a1 + S1 / (e1 * b1),
                sp.Piecewise((a2 + S2 / (e2 * b2), S2 > 0), (0, True))),
    "DeepEP low-latency kernels; Zuo et al. 2025 (arXiv 2506.12708) Sec. 4 (FusedDispatch, "
    "AIV-direct writes); alpha-beta model with all peers written at once",
    "MoE dispatch or combine as one-shot writes to every peer: every message is in "
    "flight at once, so each level pays its latency once (not n - 1 times as a "
    "pairwise exchange does) plus its bytes at its bandwidth; the two levels run "
    "concurrently. The achieved bandwidth fraction eta is the kernel's own: on CloudMatrix384 "
    "FusedDispatch reaches 0.26 of the unified bus and FusedCombine 0.54 (Zuo et al. Sec. 5, "
    "128 tokens per die: 116-152 us and 118-149 us from EP8 to EP256), DeepEP's low-latency "
    "kernels on H800 0.77 and 0.81 of the 400 Gb/s NIC (194 us and 360 us at EP256). Taking "
    "the remote share of the bytes per package (a die's sibling is on the package, not the "
    "bus) reproduces the CloudMatrix table within 3% (EP8, EP256) and DeepEP's within 6% "
    "from EP32 to EP256 (12% at EP16, half the peers on NVLink) with one eta per kernel: "
    "the time grows with n only through that share.",
)

# --- tiered memory reads (KV cache spilled beyond HBM) -----------------------------------

Qloc, Qfar, Bfar, afar, nr, tfar = (sym.local_bytes, sym.far_bytes, sym.far_bandwidth,
                                    sym.far_latency, sym.far_reads, sym.far_time)
Bm, etam = sym.memory_bandwidth, sym.memory_efficiency

far_read_time = Formula(
    "far_read_time", "far_time",
    Qfar / Bfar + nr * afar,
    "Hockney 1994 alpha-beta model for each bulk read from a far tier",
    "Time to read Q_far bytes from a far tier (the supernode's pool, host memory over "
    "PCIe or C2C, SSD) in n_r bulk reads, one per layer.",
)

tiered_read_time = Formula(
    "tiered_read_time", "time",
    sp.Max(Qloc / (etam * Bm), tfar),
    "FlexGen (Sheng et al. 2023) Sec. 4.2: loads from slower tiers overlap the device's work",
    "Time to read a step's bytes when part live in far tiers: the kernels read every byte "
    "from HBM, the far part staged in by a copy that runs concurrently (layer-by-layer "
    "prefetch), so the slower of the two streams sets the pace. Spilling costs nothing "
    "until the far stream outlasts the HBM stream, and never saves anything.",
)

# --- KV capacity ---------------------------------------------------------------------

C, Mkv = sym.capacity, sym.kv_cache_memory

max_sequences = Formula(
    "max_sequences", "max_sequences",
    C / (nctx * Mkv),
    "definition: capacity over KV bytes per sequence (Kwon et al. 2023 Sec. 2.3)",
    "Sequences of n_ctx tokens whose KV cache (M_kv bytes per token) fits in C bytes; "
    "round down for whole sequences.",
)

# --- batching -----------------------------------------------------------------------

nb, mu, nsteps, tpf, X = (sym.batch_sequences, sym.mean_output_len, sym.decode_steps,
                          sym.prefill_time, sym.throughput)

static_steps_uniform = Formula(
    "static_steps_uniform", "decode_steps",
    2 * mu * nb / (nb + 1),
    "David and Nagaraja 2003, expected maximum of n uniform order statistics: n/(n+1)",
    "Output tokens' worth of steps a static batch of n_b sequences runs when output "
    "lengths are uniform on [0, 2 mu_o]: the batch waits for its longest sequence.",
)

static_steps_exponential = Formula(
    "static_steps_exponential", "decode_steps",
    mu * (sp.log(nb) + sp.EulerGamma + 1 / (2 * nb) - 1 / (12 * nb**2)),
    "David and Nagaraja 2003 Sec. 2.5 (Renyi): E[max of n exponentials] = H_n mu; "
    "H_n by its asymptotic series, error below 1/(120 n^4)",
    "Steps a static batch of n_b sequences runs when output lengths are exponential "
    "(memoryless stopping) with mean mu_o: H_n mu_o, 4.7 mu_o for 64 sequences.",
)

batching_throughput = Formula(
    "batching_throughput", "throughput",
    nb * mu / (nb * tpf + nsteps * tstep),
    "Yu et al. 2022 (Orca) Sec. 3; Kwon et al. 2023 (vLLM); Agrawal et al. 2024 "
    "(Sarathi-Serve, arXiv 2403.02310) for prefills sharing the replica with decodes",
    "Output tokens per second of one replica that prefills its n_b requests (tau_pf "
    "each) and decodes them in n_steps steps. Static batching runs n_steps = the "
    "longest output of the batch (static_steps_*); continuous batching refills a "
    "finished slot at the next step, so n_steps = mu_o.",
)

# --- an offline benchmark: every request queued at once ---------------------------------

Nreq, W, nb2, sp_, tch, tw, tw2, tf, tf2 = (sym.requests, sym.waves, sym.last_wave_sequences, sym.prefill_chunks,
                                           sym.chunk_time, sym.wave_time, sym.last_wave_time, sym.first_token_time,
                                           sym.last_first_token_time)

wave_time = Formula(
    "wave_time", "wave_time",
    sp_ * tch + (mu - 1) * tstep,
    "in-flight batching with chunked prefill as trtllm-bench's offline runs schedule identical requests "
    "(TensorRT-LLM perf-overview: uniform lengths, every request queued at once): a wave of n_b sequences "
    "enters together, is prefilled in chunks of the step's token budget, then decodes together",
    "Time of one wave of requests on a replica: s_pf chunked-prefill steps (the last of "
    "them emits each sequence's first token), then its mu_o - 1 other output tokens at "
    "t_step each: a decode step's time per output token (the step over the tokens it "
    "emits per sequence, tau_s with draft tokens, 1 without).",
)

offline_first_token_chunks = Formula(
    "offline_first_token_chunks", "first_token_chunks",
    sp.Max((sp_ + 1) / 2, sp_ * (nb + 1) / (2 * nb)),
    "in-flight batching with chunked prefill (as wave_time): a prompt's first token is sampled in the step "
    "that prefills its last chunk, and a wave's n_b prompts are chunked one after another",
    "Chunked-prefill steps from a wave's start to a prompt's first token, on average over its n_b "
    "prompts: (s_pf + 1)/2 when a chunk holds several prompts (each ends in one of the s_pf "
    "steps), s_pf (n_b + 1)/(2 n_b) when a prompt spans several chunks (the k-th prompt ends "
    "after k s_pf / n_b of them); the later of the two, so that a lone prompt waits for all "
    "s_pf chunks.",
)

offline_makespan = Formula(
    "offline_makespan", "time",
    (W - 1) * tw + tw2,
    "definition: waves run one after another, the last with the requests left over",
    "Time for a replica to finish its N_req requests in W waves of n_b sequences, the last "
    "of n_b' = N_req - (W - 1) n_b.",
)

offline_throughput = Formula(
    "offline_throughput", "throughput",
    Nreq * mu / sym.time,
    "definition (trtllm-bench's Total Output Throughput: output tokens over the run's time)",
    "Output tokens per second of an offline run of N_req requests that took tau.",
)

offline_mean_ttft = Formula(
    "offline_mean_ttft", "time",
    (nb * ((W - 1) * (W - 2) / 2 * tw + (W - 1) * tf) + nb2 * ((W - 1) * tw + tf2)) / Nreq,
    "every request arrives at time 0: a request of wave w waits w waves, then for its prompt's chunk",
    "Mean time to first token of an offline run: the full waves' requests wait (W - 1)(W - 2)/2 "
    "waves on average in all, the last wave's W - 1, plus the time from their wave's start "
    "to their first token.",
)

__all__ = [
    "speculative_tokens_per_step", "time_per_output_token", "mla_absorbed_attention_flops",
    "expert_activation", "domains_per_token", "direct_all_to_all_time", "far_read_time",
    "tiered_read_time", "max_sequences", "static_steps_uniform", "static_steps_exponential",
    "batching_throughput", "wave_time", "offline_first_token_chunks", "offline_makespan", "offline_throughput", "offline_mean_ttft",
]
