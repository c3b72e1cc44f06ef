"""The training step: compute, communication, pipeline bubble and memory, vectorised.

One function, :func:`step_columns`, evaluates a whole grid of plans for one model on
one system in a single pass of numpy calls; :func:`snlab.train` is the same function
on a grid of one. It composes the three walls:

* compute per micro-batch from the roofline of each layer's matrix multiplies (the
  layer's weights as one equivalent GEMM of M = tokens, K = h; each local expert as
  its own GEMM of the tokens routed to it), the attention scores, and memory-bound
  element-wise work estimated as writing and reading every activation byte that
  Korthikanti et al. 2022 (Sec. 4.1) count;
* communication of each parallelism per layer and micro-batch, placed on the
  system's levels in Megatron-LM's rank order (tensor innermost, then context, data
  with expert inside it, pipeline outermost): a group within a scale-up domain uses
  it, a group spanning domains pays a two-level collective;
* the 1F1B / interleaved pipeline bubble (Narayanan et al. 2021 Sec. 2.2);
* overlap: per class of communication a level in [0, 1], combined through
  ``overlapped_time``; the exposed part is reported per class;
* memory per device (ZeRO, Korthikanti activations, the first and last pipeline
  stages) and offload of optimizer state or activations to host memory over the host
  link, or to a supernode's memory pool over the scale-up bus.
"""

from __future__ import annotations

import numpy as np

from . import sizing
from .specs import Model, System
from .walls import communication as cm
from .walls import compute as cw
from .walls import memory as mw

#: system fields a sweep may vary, and where they live
SYSTEM_FIELDS = (
    "scale_up_domain_size", "scale_up_bandwidth", "scale_up_latency", "scale_up_efficiency",
    "scale_up_call_latency", "scale_out_bandwidth", "scale_out_latency", "scale_out_efficiency",
    "scale_out_call_latency", "host_bandwidth", "host_capacity", "pool_bandwidth", "pool_capacity",
    "peak_flops", "hbm_bandwidth", "hbm_capacity", "gemm_efficiency", "memory_efficiency",
    "sustained_clock",
)

ACT_BYTES = 2.0  # 16-bit activations and messages


def hardware(system: System, precision: str = "bf16") -> dict[str, float]:
    """The system's numbers under the names :data:`SYSTEM_FIELDS` (SI units)."""
    dev, up, out = system.device, system.scale_up, system.scale_out
    pool = system.pool
    return dict(
        scale_up_domain_size=float(up.domain_size), scale_up_bandwidth=up.bandwidth,
        scale_up_latency=up.latency, scale_up_efficiency=up.efficiency,
        scale_up_call_latency=up.call_latency, scale_out_bandwidth=out.bandwidth,
        scale_out_latency=out.latency, scale_out_efficiency=out.efficiency,
        scale_out_call_latency=out.call_latency, host_bandwidth=system.host.bandwidth,
        host_capacity=system.host.capacity,
        pool_bandwidth=pool.bandwidth if pool else 0.0,
        pool_capacity=(pool.capacity / up.domain_size) if pool else 0.0,
        peak_flops=dev.peak(precision), hbm_bandwidth=dev.hbm_bandwidth,
        hbm_capacity=dev.hbm_capacity, gemm_efficiency=dev.gemm_efficiency,
        memory_efficiency=dev.memory_efficiency, sustained_clock=dev.sustained_clock,
    )


# --- placing collectives on the levels ----------------------------------------------------

def _split(n, stride, hw):
    """Members of a group per scale-up domain (n1) and domains spanned (n2).

    Members sit ``stride`` ranks apart; a domain holds ``domain_size`` ranks.
    """
    per_domain = np.maximum(np.floor(hw["scale_up_domain_size"] / stride), 1.0)
    n1 = np.minimum(n, per_domain)
    n2 = np.ceil(n / n1)
    return n1, n2


def _levels(n1, n2, hw):
    spans = n2 > 1
    return dict(
        inner_size=n1, outer_size=n2,
        inner_latency=hw["scale_up_latency"], inner_bandwidth=hw["scale_up_bandwidth"],
        inner_efficiency=hw["scale_up_efficiency"],
        outer_latency=hw["scale_out_latency"], outer_bandwidth=hw["scale_out_bandwidth"],
        outer_efficiency=hw["scale_out_efficiency"],
        call_latency=np.where(spans, np.maximum(hw["scale_up_call_latency"], hw["scale_out_call_latency"]),
                              hw["scale_up_call_latency"]),
    )


def all_reduce(S, n, stride, hw):
    """Time of an all-reduce of S bytes over n devices ``stride`` ranks apart [s]."""
    n1, n2 = _split(n, stride, hw)
    return np.where(n > 1, cm.hierarchical_all_reduce_time(message_bytes=S, **_levels(n1, n2, hw)), 0.0)


def reduce_scatter(S, n, stride, hw):
    """Time of a reduce-scatter (or all-gather) of an S-byte buffer [s]."""
    n1, n2 = _split(n, stride, hw)
    return np.where(n > 1, cm.hierarchical_reduce_scatter_time(message_bytes=S, **_levels(n1, n2, hw)), 0.0)


def all_to_all(S, n, stride, hw):
    """Time of an all-to-all of an S-byte send buffer [s]."""
    n1, n2 = _split(n, stride, hw)
    return np.where(n > 1, cm.hierarchical_all_to_all_time(message_bytes=S, **_levels(n1, n2, hw)), 0.0)


def point_to_point(S, inside, hw):
    """One message of S bytes, inside a scale-up domain or across domains [s]."""
    up = cm.point_to_point_time(message_bytes=S, latency=hw["scale_up_latency"],
                                link_bandwidth=hw["scale_up_bandwidth"],
                                link_efficiency=hw["scale_up_efficiency"],
                                call_latency=hw["scale_up_call_latency"])
    out = cm.point_to_point_time(message_bytes=S, latency=hw["scale_out_latency"],
                                 link_bandwidth=hw["scale_out_bandwidth"],
                                 link_efficiency=hw["scale_out_efficiency"],
                                 call_latency=hw["scale_out_call_latency"])
    return np.where(inside, up, out)


# --- the model's fixed numbers -------------------------------------------------------------

def model_constants(model: Model) -> dict[str, float]:
    """Per-layer sizes of ``model`` that the step needs (parameters, FLOP shapes)."""
    v = model.symbol_values()
    zero_b = dict(bias=0, norm_params=0)
    attn = (cw.attention_params_mla if model.mla else cw.attention_params_gqa).evaluate({**v, **zero_b})
    mlp = cw.mlp_params.evaluate({**v, **zero_b})
    moe = model.moe
    L = model.layers
    Ld = v["dense_layers"]
    n_mlp = v["mlp_matrices"]
    if moe:
        shared = moe.shared_experts * n_mlp * model.hidden_size * moe.expert_ffn_hidden_size
        router = model.hidden_size * moe.experts
        expert_one = n_mlp * model.hidden_size * moe.expert_ffn_hidden_size
    else:
        shared = router = expert_one = 0.0
    moe_layers = L - Ld
    total = float(sizing.params(model))
    expert_total = float(sizing.expert_params(model))
    emb = model.vocab_size * model.hidden_size + (model.seq_len * model.hidden_size if model.learned_positions else 0)
    f_act = (Ld * model.ffn_hidden_size
             + moe_layers * ((moe.experts_per_token + moe.shared_experts) * moe.expert_ffn_hidden_size if moe else 0)) / L
    return dict(
        L=float(L), h=float(model.hidden_size), a=float(model.heads), akv=float(model.kv_heads),
        dh_flops=float(sizing.attention_head_dim(model)),
        # K and V tensors a layer keeps: with latent attention every head has its own
        # up-projected key (d_nope + d_rope) and value (d_v)
        akv_act=float(model.heads if model.mla else model.kv_heads),
        dh_act=float(sizing.attention_head_dim(model)),
        V=float(model.vocab_size), n_mlp=float(n_mlp), f_act=float(f_act),
        # per-layer matmul weights a token uses outside the routed experts (average layer)
        dense_mm=float(attn + (Ld * mlp + moe_layers * (shared + router)) / L),
        expert_one=float(expert_one), experts=float(moe.experts if moe else 0),
        k=float(moe.experts_per_token if moe else 0), moe_layers=float(moe_layers),
        matmul_params=float(sizing.matmul_params(model)),
        params=total, expert_params=expert_total,
        # non-expert parameters of the transformer layers (embeddings excluded)
        layer_params=total - expert_total - emb - (model.vocab_size * model.hidden_size if not model.tied_embeddings else 0),
        emb_params=float(emb), embedding_copies=float(1 if model.tied_embeddings else 2),
    )


# --- the step ------------------------------------------------------------------------------

def _act(recompute: int):
    """Korthikanti's activation bytes per layer with the recomputation choice fixed."""
    return mw.activation_memory_per_layer.partial(recompute=recompute)


def step_columns(model: Model, g: dict, hw: dict) -> dict[str, np.ndarray]:
    """Evaluate training steps for every row of the plan grid ``g``.

    ``g`` maps plan fields to equal-length float arrays (codes for named choices, see
    :mod:`snlab.plan`); ``hw`` maps :data:`SYSTEM_FIELDS` to floats or arrays.
    Returns output columns named with their units (``step_time_s``, ``mfu``, ...).
    """
    k = model_constants(model)
    t, p, d, e, c = g["tp"], g["pp"], g["dp"], g["ep"], g["cp"]
    b, B, v, z, r = g["micro_batch"], g["global_batch"], g["interleave"], g["zero"], g["recompute"]
    sp_, s, off = g["sequence_parallel"], g["seq_len"], g["offload"]
    flash, q_g, q_o = g["flash_attention"], g["grad_bytes"], g["optimizer_bytes"]
    L, h = k["L"], k["h"]
    devices = t * p * d * c
    m = B / (b * d)                     # micro-batches per pipeline per step
    tok = b * s / c                     # tokens per micro-batch on one device (before SP)
    layers = np.ceil(L / (p * v)) * v   # layers on the most loaded stage (stages may be uneven)
    share = layers / L                  # fraction of the layers on that stage
    peak = hw["peak_flops"]
    roof = dict(peak_flops=peak, gemm_efficiency=hw["gemm_efficiency"],
                sustained_clock=hw["sustained_clock"], memory_bandwidth=hw["hbm_bandwidth"],
                memory_efficiency=hw["memory_efficiency"])

    # ---- compute per micro-batch on the last (slowest) stage ----
    gemm_dense = cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=k["dense_mm"] / (h * t), element_bytes=ACT_BYTES, **roof)
    if k["experts"]:
        local = k["experts"] / e                                  # experts per device
        per_expert = tok * k["k"] * e / k["experts"]              # tokens each receives
        gemm_exp = local * cw.gemm_time(gemm_m=per_expert, gemm_k=h, gemm_n=k["expert_one"] / (h * t),
                                        element_bytes=ACT_BYTES, **roof)
        gemm_exp = gemm_exp * k["moe_layers"] / L                 # average layer
    else:
        gemm_exp = 0.0
    # causal FlashAttention kernels skip the masked half of the scores (Dao 2023,
    # FlashAttention-2, Sec. 3.1); materialised scores are computed in full, which is also
    # how the Megatron-LM papers count them. Time and FLOPs (MFU, HFU) use the same count.
    ctx_run = np.where(flash > 0, 0.5, 1.0) * s
    attn_flops = 4 * k["a"] * k["dh_flops"] * ctx_run * tok / t
    attn_time = cw.roofline_time(flops=attn_flops, bytes_moved=0.0, **roof)
    act = dict(seq_len=s / c, micro_batch=b, hidden_size=h, heads=k["a"], tp=t, kv_heads=k["akv_act"],
               head_dim=k["dh_act"], ffn_activation_width=k["f_act"], mlp_matrices=k["n_mlp"],
               sequence_parallel=sp_)
    # element-wise traffic: every stored activation byte written and read once forward
    act_all = _act(0).evaluate(act)          # everything kept, attention scores included
    act_sel = _act(1).evaluate(act)          # selective: the scores dropped
    act_run = np.where(flash > 0, act_sel, act_all)   # flash attention never stores the scores
    elem_bytes = 2 * act_run
    score_bytes = 2 * (act_all - act_sel)
    elem_time = cw.roofline_time(flops=0.0, bytes_moved=elem_bytes, **roof)
    layer_fwd = gemm_dense + gemm_exp + attn_time + elem_time
    logits_gemm = cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=k["V"] / t, element_bytes=ACT_BYTES, **roof)
    logits_elem = cw.roofline_time(flops=0.0, bytes_moved=2 * mw.logits_memory(seq_len=s / c, micro_batch=b,
                                   vocab_size=k["V"], tp=t), **roof)
    stage_fwd = layers * layer_fwd + logits_gemm + logits_elem
    score_time = cw.roofline_time(flops=0.0, bytes_moved=np.where(flash > 0, 0.0, score_bytes), **roof)
    # full: the layers' forward again; selective: the attention scores again; FlashAttention
    # recomputes the scores in its backward pass whatever the setting (Dao et al. 2022)
    recompute_time = np.where(r == 2, layers * layer_fwd,
                              np.where((r == 1) | (flash > 0), layers * (attn_time + score_time), 0.0))
    compute_mb = 3 * stage_fwd + recompute_time

    # ---- communication per micro-batch ----
    S_tp = tok * h * ACT_BYTES
    n_tp = 4 + 2 * (r == 2)
    tp_mb = layers * n_tp * all_reduce(S_tp, t, 1.0, hw)
    if k["experts"]:
        S_ep = tok / np.where(sp_ > 0, t, 1.0) * k["k"] * h * ACT_BYTES
        ep_mb = k["moe_layers"] * share * n_tp * all_to_all(S_ep, e, t * c, hw)
    else:
        ep_mb = np.zeros_like(tp_mb)
    S_cp = tok * 2 * k["akv_act"] * k["dh_act"] * ACT_BYTES / t
    cp_mb = layers * (3 + (r == 2)) * (c - 1) * point_to_point(S_cp, c * t <= hw["scale_up_domain_size"], hw)
    S_pp = tok * h * ACT_BYTES / t     # scatter/gather optimisation (Narayanan 2021 Sec. 4.1)
    pp_inside = t * c * d * p <= hw["scale_up_domain_size"]
    pp_mb = np.where(p > 1, 2 * v * point_to_point(S_pp, pp_inside, hw), 0.0)

    # ---- parameters and ZeRO ----
    emb_stage = np.where(p > 1, k["emb_params"], k["emb_params"] + (k["embedding_copies"] - 1) * k["V"] * h)
    dense_dev = (k["layer_params"] * share + emb_stage) / t
    expert_dev = k["expert_params"] * share / (e * t)
    params_dev = dense_dev + expert_dev
    # data-parallel groups: dense weights over d x c (stride t); expert weights, already
    # split e ways, over the d x c / e replicas of each expert (stride t x c x e), as in
    # Megatron-Core's expert-data-parallel group
    groups = ((dense_dev, d * c, t),) + (((expert_dev, d * c / e, t * c * e),) if k["experts"] else ())
    # each group's three collectives, computed once: gather the bf16 weights, reduce-
    # scatter or all-reduce the gradients
    rs_w = sum(reduce_scatter(P * 2.0, n, stride, hw) for P, n, stride in groups)
    rs_g = sum(reduce_scatter(P * q_g, n, stride, hw) for P, n, stride in groups)
    ar_g = sum(all_reduce(P * q_g, n, stride, hw) for P, n, stride in groups)
    # ZeRO-3 gathers the weights for the forward and the backward pass and reduce-scatters
    # the gradients every micro-batch; ZeRO-2 keeps only a shard of the gradients, so it
    # reduce-scatters after every backward pass (DeepSpeed's stage 2 with accumulation)
    zero_mb = np.where(z == 3, 2 * rs_w + rs_g, np.where(z == 2, rs_g, 0.0))
    dp_step = np.where(z == 0, ar_g, np.where(z == 3, 0.0, np.where(z == 1, rs_g, 0.0) + rs_w))

    # ---- memory ----
    def states(formula):
        return sum(formula.evaluate(dict(params_per_device=P, weight_bytes=2.0, grad_bytes=q_g,
                                         optimizer_bytes=q_o, zero_stage=z, zero_shards=n))
                   for P, n, _ in groups)

    w_mem, g_mem, o_mem = states(mw.weight_memory), states(mw.grad_memory), states(mw.optimizer_memory)
    per_layer = np.where(r == 2, _act(2).evaluate(act),
                         np.where(r == 1, act_sel, act_run))
    # the layer being recomputed holds its full activations (full), or its attention
    # scores again (selective without FlashAttention) while its backward runs
    working = np.where(r == 2, act_run, np.where(r == 1, act_run - act_sel, 0.0))
    in_flight = np.minimum(p, m)
    first = mw.activation_memory_first_stage(activation_memory=per_layer, layers=layers * p, pp=p, in_flight=in_flight,
                                             interleave=v)
    logits = mw.logits_memory(seq_len=s / c, micro_batch=b, vocab_size=k["V"], tp=t)
    last = per_layer * layers + logits
    a_mem = np.maximum(np.where(p > 1, first, first + logits), last) + working

    # ---- offload ----
    off_opt = (off == 1) | (off == 3)
    off_act = (off == 2) | (off == 3)
    o_far = np.where(off_opt, o_mem, 0.0)
    a_far = np.where(off_act, np.maximum(a_mem - 2 * per_layer, 0.0), 0.0)
    far = o_far + a_far
    # a supernode's pool is its peers' memory: what the job's own devices in the domain
    # do not hold themselves is free for offload; anything else goes to host memory
    domain = hw["scale_up_domain_size"]
    in_domain = np.minimum(devices, domain)
    pool_free = np.maximum(hw["pool_capacity"] * domain - (in_domain - 1) * hw["hbm_capacity"], 0.0) / in_domain
    use_pool = (hw["pool_bandwidth"] > 0) & (far <= pool_free)
    link_bw = np.where(use_pool, hw["pool_bandwidth"], hw["host_bandwidth"])
    far_capacity = np.where(use_pool, pool_free, hw["host_capacity"])
    o_mem_dev = o_mem - o_far
    a_mem_dev = a_mem - a_far
    # optimizer state on the far side: on the host, the CPU updates it, so the gradients
    # go out and the weights come back once per step (ZeRO-Offload); in the pool, the
    # device updates it in place, reading and writing the states over the bus
    opt_params = sum(P / np.where(z >= 1, n, 1.0) for P, n, _ in groups)
    offload_opt = np.where(off_opt, np.where(use_pool, opt_params * q_o, opt_params * (q_g + 2.0)) / link_bw, 0.0)
    # each micro-batch's activations beyond the two layers kept go out and come back
    act_out_mb = np.maximum(per_layer * layers - 2 * per_layer, 0.0)
    offload_act_mb = np.where(off_act, 2 * act_out_mb / link_bw, 0.0)
    optimizer = np.where(off_opt & ~use_pool, 0.0,
                         cw.roofline_time(flops=0.0, bytes_moved=opt_params * (q_g + 2 * q_o + 2.0), **roof))

    # ---- overlap and the step ----
    ov = {x: g[f"overlap_{x}"] for x in ("tp", "ep", "cp", "pp", "dp", "offload")}
    parts = {"tp": tp_mb, "ep": ep_mb, "cp": cp_mb, "pp": pp_mb, "dp": zero_mb, "offload": offload_act_mb}
    # what each class can hide behind: ring attention overlaps its K/V passes with the
    # attention blocks only; the other classes with any of the micro-batch's compute
    attn_window = layers * (3 + (r == 2)) * attn_time
    window_x = {x: (attn_window if x == "cp" else compute_mb) for x in parts}
    hideable = {x: ov[x] * np.minimum(parts[x], window_x[x]) for x in parts}
    comm_mb = sum(parts.values())
    total_hideable = sum(hideable.values())
    # one effective overlap level: hides min(hideable, compute), never more than either
    shorter = np.minimum(compute_mb, comm_mb)
    level = np.where(shorter > 0, np.minimum(total_hideable, compute_mb) / np.where(shorter > 0, shorter, 1.0), 0.0)
    mb_time = cm.overlapped_time(compute_time=compute_mb, comm_time=comm_mb, overlap=level)
    hidden = compute_mb + comm_mb - mb_time     # shared out in proportion to what is hideable
    share_hidden = {x: np.where(total_hideable > 0, hideable[x] / np.where(total_hideable > 0, total_hideable, 1.0), 0.0)
                    for x in parts}
    bubble_frac = cw.pipeline_bubble_fraction(pp=p, interleave=v, micro_batches=m)
    bubble = bubble_frac * m * mb_time
    window = mb_time * 2 / 3                     # the backward pass of the last micro-batch
    dp_total = cm.overlapped_time(compute_time=window, comm_time=dp_step, overlap=ov["dp"])
    dp_exposed = dp_total - window
    dp_exposed = np.where(dp_exposed > 1e-12 * window, dp_exposed, 0.0)   # drop rounding residue
    step = m * mb_time + bubble + dp_exposed + optimizer + offload_opt

    # ---- utilisation ----
    tokens = B * s
    f_fwd = sizing.forward_flops_per_token(model, context_len=ctx_run)
    model_flops = cw.model_step_flops(tokens=tokens, forward_flops_per_token=f_fwd)
    r_hw = np.where((flash > 0) & (r == 0), 1.0, r)
    hw_flops = cw.hardware_step_flops(tokens=tokens, forward_flops_per_token=f_fwd, recompute=r_hw,
                                      matmul_params=k["matmul_params"], layers=L, heads=k["a"],
                                      head_dim=k["dh_flops"], context_len=ctx_run)
    mfu = cw.flops_utilisation(step_flops=model_flops, time=step, group_size=devices, peak_flops=peak)
    hfu = cw.flops_utilisation(step_flops=hw_flops, time=step, group_size=devices, peak_flops=peak)

    exposed = {x: m * np.maximum(parts[x] - hidden * share_hidden[x], 0.0) for x in parts}
    exposed["dp"] = exposed["dp"] + dp_exposed
    mem_total = w_mem + g_mem + o_mem_dev + a_mem_dev
    # the bubble is idle micro-batch slots: it is shared out like a micro-batch's time
    mb_safe = np.where(mb_time > 0, mb_time, 1.0)
    bubble_compute = bubble * np.minimum(compute_mb / mb_safe, 1.0)
    compute_s = m * 3 * stage_fwd + optimizer + bubble_compute * 3 * stage_fwd / np.where(compute_mb > 0, compute_mb, 1.0)
    memory_s = m * recompute_time + offload_opt + exposed["offload"] + bubble_compute * recompute_time / np.where(compute_mb > 0, compute_mb, 1.0)
    comm_s = (exposed["tp"] + exposed["ep"] + exposed["cp"] + exposed["pp"] + exposed["dp"]
              + bubble - bubble_compute)
    return {
        "devices": devices, "micro_batches": m,
        "step_time_s": step, "mfu": mfu, "hfu": hfu,
        "model_tflops_per_device": model_flops / step / devices / 1e12,
        "hardware_tflops_per_device": hw_flops / step / devices / 1e12,
        "tokens_per_s": tokens / step,
        "time_compute_s": m * compute_mb, "time_recompute_s": m * recompute_time,
        "time_tp_s": m * tp_mb, "time_ep_s": m * ep_mb, "time_cp_s": m * cp_mb, "time_pp_s": m * pp_mb,
        "time_dp_s": m * zero_mb + dp_step, "time_bubble_s": bubble, "time_optimizer_s": optimizer,
        "time_offload_s": offload_opt + m * offload_act_mb,
        "exposed_tp_s": exposed["tp"], "exposed_ep_s": exposed["ep"], "exposed_cp_s": exposed["cp"],
        "exposed_pp_s": exposed["pp"], "exposed_dp_s": exposed["dp"], "exposed_offload_s": exposed["offload"],
        "exposed_comm_s": exposed["tp"] + exposed["ep"] + exposed["cp"] + exposed["pp"] + exposed["dp"],
        "bubble_fraction": bubble_frac,
        "memory_weights_bytes": w_mem, "memory_grads_bytes": g_mem, "memory_optimizer_bytes": o_mem_dev,
        "memory_activations_bytes": a_mem_dev, "memory_total_bytes": mem_total,
        "memory_capacity_bytes": np.broadcast_to(hw["hbm_capacity"], np.shape(step)),
        "memory_offloaded_bytes": o_far + a_far, "offload_capacity_bytes": far_capacity,
        "fits": (mem_total <= hw["hbm_capacity"]) & (o_far + a_far <= far_capacity),
        "wall_compute_s": compute_s, "wall_communication_s": comm_s, "wall_memory_s": memory_s,
        "params_per_device": params_dev,
    }
