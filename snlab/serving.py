"""The serving model: prefill, decode, KV-cache placement and batching, vectorised.

One function, :func:`serve_columns`, evaluates a whole grid of deployments of one model
on one system in a single pass of numpy calls; :func:`snlab.serve` is the same function
on a grid of one. A deployment has ``dp`` model replicas ("data-parallel attention"),
each of ``tp x pp`` devices; the experts of a MoE model are spread over ``ep`` devices
of each pipeline stage (DeepSeek-style: ``ep = tp x dp`` puts whole experts on every
device of the deployment), tensor-split by ``max(1, tp / ep)``.

* **Prefill** (time to first token): one forward pass over ``prefill_batch`` prompts per
  replica; each part is a roofline (Williams et al. 2009): the layers' weights as one
  GEMM, the routed experts, causal attention (compute-bound), then the tensor-parallel
  all-reduces and the expert dispatch/combine, sent once per destination domain
  (DeepEP normal kernels).
* **Decode** (time per output token): one step reads every weight once (only the experts
  some token was routed to), reads the KV cache of every sequence, computes the
  attention (MLA in its absorbed form), and pays two all-reduces per layer for tensor
  parallelism and two one-shot all-to-alls per MoE layer for expert parallelism.
  Speculative decoding / multi-token prediction verifies ``draft_tokens + 1`` tokens per
  sequence per step and emits Leviathan et al.'s expected count; drafting costs one
  transformer layer per draft token (DeepSeek-V3's MTP module, its report Sec. 2.2).
* **Two-batch overlap** (``microbatches = 2``): two half batches alternate so that one's
  expert all-to-all hides behind the other's compute; weights are read twice.
* **Pipeline parallelism**: ``pp`` micro-batches of ``b / pp`` sequences keep the stages
  busy; a token waits for all stages, so a step takes ``pp`` stage passes.
* **KV cache placement**: HBM first (after weights, within ``hbm_utilization`` of
  capacity), then the supernode's memory pool (memory of domain peers the deployment
  does not use), host memory, SSD. A decode step streams the spilled part concurrently
  with the HBM part (``tiered_read_time``), so spilling costs time only once the far
  stream is the slower one.
* **Batching**: static batches wait for their longest output; continuous batching
  refills slots at once (``batching_throughput``), both with their prefills on the
  same replica.
"""

from __future__ import annotations

import numpy as np

from . import sizing
from .specs import Model, System
from .training import SYSTEM_FIELDS as _TRAIN_FIELDS
from .training import _levels, _split, all_reduce, hardware, model_constants, point_to_point
from .walls import communication as cm
from .walls import compute as cw
from .walls import serving as sv

#: precision name -> bytes per element (weights and KV cache)
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}
#: output-length distributions for the static-batching comparison
OUTPUT_DISTS = ("fixed", "uniform", "exponential")
#: KV tiers, nearest first; a deployment's ``kv_location`` is the farthest one it uses
KV_TIERS = ("hbm", "pool", "host", "ssd")
KV_LOCATIONS = KV_TIERS + ("does not fit",)
#: system fields a serving sweep may vary (SI units)
SYSTEM_FIELDS = _TRAIN_FIELDS + ("pool_latency", "host_latency", "storage_bandwidth", "storage_latency",
                                 "storage_capacity", "pool_domain_capacity")
ACT_BYTES = 2.0        # activations, TP all-reduces, combine: 16-bit
MTP_LAYERS = 1.0       # DeepSeek-V3 Sec. 2.2: one transformer block per predicted token


def serving_hardware(system: System) -> dict:
    """The system's numbers under :data:`SYSTEM_FIELDS` (SI units), plus the dense peak
    of each precision relative to bf16 (``ratio_<dtype>``; 1 where the device has no
    faster path for it: weight-only quantisation multiplies in bf16)."""
    hw = hardware(system, "bf16")
    dev, pool, store = system.device, system.pool, system.storage
    hw.update(
        pool_latency=pool.latency if pool else 0.0,
        pool_domain_capacity=pool.capacity if pool else 0.0,
        host_latency=system.host.latency,
        storage_bandwidth=store.bandwidth if store else 0.0,
        storage_latency=store.latency if store else 0.0,
        storage_capacity=store.capacity if store else 0.0,
    )
    bf16 = dev.peak("bf16")
    for name in DTYPE_BYTES:
        hw[f"ratio_{name}"] = dev.peak_flops.get(name, bf16) / bf16
    return hw


def serving_constants(model: Model) -> dict[str, float]:
    """Per-model numbers the serving model needs, on top of the training ones."""
    k = dict(model_constants(model))
    k["kv_elems_per_token"] = float(sizing.kv_cache_bytes_per_token(model, kv_bytes=1.0))
    # prefill attention in the uncompressed form: 4 a d_h L FLOPs per query per key
    k["prefill_attn_per_ctx"] = float(sizing.forward_flops_per_token(model, 1)
                                      - sizing.forward_flops_per_token(model, 0))
    if model.mla:
        k["decode_attn_per_ctx"] = float(sv.mla_absorbed_attention_flops(
            layers=model.layers, heads=model.heads, kv_lora_rank=model.mla.kv_lora_rank,
            qk_rope_head_dim=model.mla.qk_rope_head_dim, context_len=1.0))
        k["kv_shard_max"] = 1.0        # the latent is shared by all heads: TP replicates it
    else:
        k["decode_attn_per_ctx"] = k["prefill_attn_per_ctx"]
        k["kv_shard_max"] = float(model.kv_heads)
    return k


# --- the parts of one pass ---------------------------------------------------------------

def _roof(hw, peak):
    return dict(peak_flops=peak, gemm_efficiency=hw["gemm_efficiency"], sustained_clock=hw["sustained_clock"],
                memory_bandwidth=hw["hbm_bandwidth"], memory_efficiency=hw["memory_efficiency"])


def _far_time(kv_bytes, share, hw, reads):
    """Seconds to read ``kv_bytes`` whose tier shares are ``share`` (dict) from the far
    tiers, one bulk read per layer from each tier used; the tiers share the device's
    off-chip path, so their times add."""
    total = 0.0
    for tier, bw, lat in (("pool", "pool_bandwidth", "pool_latency"), ("host", "host_bandwidth", "host_latency"),
                          ("ssd", "storage_bandwidth", "storage_latency")):
        used = share[tier] > 0
        q = kv_bytes * share[tier]
        t = sv.far_read_time(far_bytes=q, far_bandwidth=np.where(used, hw[bw], 1.0),
                             far_latency=hw[lat], far_reads=reads)
        total = total + np.where(used, t, 0.0)
    return total


def _a2a(S_in, S_out, n1, n2, hw):
    lv = _levels(n1, n2, hw)
    lv.pop("inner_size")
    lv.pop("outer_size")
    return sv.direct_all_to_all_time(inner_bytes=S_in, outer_bytes=S_out, **lv)


def _pass(k, g, hw, tok, ctx, kv_bytes, share, logits, prefill):
    """One micro-batch through one pipeline stage (the last: it holds the LM head).

    tok: query tokens of one replica; ctx: keys each query attends to; kv_bytes: KV
    bytes each device reads (decode) or writes (prefill); share: KV tier shares;
    logits: tokens that need the output layer. Returns times [s] by part.
    """
    t, p, e, qw = g["tp"], g["pp"], g["ep"], g["weight_bytes"]
    layers = k["L"] / p
    gemm = _roof(hw, hw["peak_flops"] * g["gemm_ratio"])
    h, V = k["h"], k["V"]
    flop_rate = hw["gemm_efficiency"] * hw["sustained_clock"] * hw["peak_flops"]
    byte_rate = hw["memory_efficiency"] * hw["hbm_bandwidth"]

    # layers' own weights (attention, dense MLPs, shared experts, router) and the LM head
    dense_read = (k["layer_params"] / p + V * h) / t * qw
    dense_flops = (2 * tok * k["dense_mm"] * layers + 2 * logits * V * h) / t
    act_bytes = ACT_BYTES * tok * h * layers * 4 / t     # read and write of q, attention out, MLP in/out
    t_dense = cw.roofline_time(flops=dense_flops, bytes_moved=dense_read + act_bytes, **gemm)

    # routed experts: only the slots some token reached are read
    if k["experts"]:
        etp = np.maximum(t / e, 1.0)
        slots = np.ceil(k["experts"] / e)
        group_tokens = tok * np.maximum(e, t) / t
        rho = sv.expert_activation(experts=slots * e, experts_per_token=k["k"], tokens=group_tokens)
        exp_read = slots * rho * k["expert_one"] / etp * qw * k["moe_layers"] / p
        exp_flops = 2 * tok * k["k"] * k["expert_one"] / t * k["moe_layers"] / p
        t_exp = cw.roofline_time(flops=exp_flops, bytes_moved=exp_read, **gemm)
    else:
        exp_read = exp_flops = t_exp = 0.0 * tok

    # attention: scores in bf16, KV cache from its tiers
    per_ctx = k["prefill_attn_per_ctx"] if prefill else k["decode_attn_per_ctx"]
    attn_flops = tok * ctx * per_ctx / (p * t)
    t_attn_c = cw.roofline_time(flops=attn_flops, bytes_moved=0.0, **_roof(hw, hw["peak_flops"]))
    local = kv_bytes * share["hbm"]
    far = _far_time(kv_bytes, share, hw, layers)
    t_kv = sv.tiered_read_time(local_bytes=local, far_time=far, memory_bandwidth=hw["hbm_bandwidth"],
                               memory_efficiency=hw["memory_efficiency"])
    t_attn = np.maximum(t_attn_c, t_kv)

    # tensor parallelism: two all-reduces per layer of the replica's tokens
    tp_comm = 2 * layers * all_reduce(tok * h * ACT_BYTES, t, 1.0, hw)

    # expert parallelism: dispatch (8-bit when the weights are) and combine (16-bit)
    if k["experts"]:
        n1, n2 = _split(e, 1.0, hw)
        sent = tok / t * k["k"] * h          # (token, expert) copies per device, in elements
        inner = sent * (n1 - 1) / np.where(prefill, n1, n1 * n2)
        if prefill:   # one copy per remote domain, forwarded inside it (DeepEP normal kernels)
            outer = tok / t * h * sv.domains_per_token(outer_size=n2, experts_per_token=k["k"]) * (n2 - 1) / n2
        else:         # one copy per expert, written straight to its device (low-latency kernels)
            outer = sent * (n2 - 1) / n2
        q_disp = np.where(qw <= 1, 1.0, ACT_BYTES)   # 8-bit dispatch is the floor (DeepEP FP8, CloudMatrix INT8)
        one = _a2a(inner * q_disp, outer * q_disp, n1, n2, hw) + _a2a(inner * ACT_BYTES, outer * ACT_BYTES, n1, n2, hw)
        ep_comm = np.where(e > 1, k["moe_layers"] / p * one, 0.0)
    else:
        ep_comm = 0.0 * tok

    return dict(
        dense=t_dense, expert=t_exp, attention=t_attn, kv=t_kv,
        kv_hbm_only=kv_bytes / byte_rate, tp=tp_comm, ep=ep_comm,
        compute_wall=(dense_flops + exp_flops) / (flop_rate * g["gemm_ratio"])
        + attn_flops / flop_rate,
        memory_wall=(dense_read + act_bytes + exp_read) / byte_rate + t_kv,
        weights_read=dense_read + exp_read,
    )


def _stage(k, g, hw, tok, ctx, kv_bytes, share, logits, prefill):
    """A stage pass of ``tok`` tokens split into ``microbatches``; with two, a fraction
    ``ep_overlap`` of the expert all-to-all hides behind the other half's compute
    (two-batch overlap), while every weight is read once per half."""
    mb = g["microbatches"]
    part = _pass(k, g, hw, tok / mb, ctx, kv_bytes / mb, share, logits / mb, prefill)
    compute = mb * (part["dense"] + part["expert"] + part["attention"])
    ep = mb * part["ep"]
    overlap = np.where(mb > 1, g["ep_overlap"], 0.0)   # one batch has nothing to hide behind
    body = cm.overlapped_time(compute_time=compute, comm_time=ep, overlap=overlap)
    total = body + mb * part["tp"]
    scaled = {key: mb * v for key, v in part.items()}
    scaled["ep_exposed"] = body - compute
    scaled["stage"] = total
    return scaled


# --- KV placement -------------------------------------------------------------------------

def _placement(k, g, hw, weights):
    """KV bytes per device by tier (nearest first), capacities, location code."""
    t, p, d = g["tp"], g["pp"], g["dp"]
    devices = t * p * d
    kv_tok = k["kv_elems_per_token"] * g["kv_bytes"]
    shard = np.minimum(t, k["kv_shard_max"])
    b = g["batch"] / d
    kv_dev = b * g["capacity_context"] * kv_tok / (p * shard)
    offload = g["kv_offload"] > 0
    in_domain = np.minimum(devices, hw["scale_up_domain_size"])
    pool_free = np.maximum(hw["pool_domain_capacity"] - (in_domain - 1) * hw["hbm_capacity"], 0.0)
    caps = {
        "hbm": np.maximum(g["hbm_utilization"] * hw["hbm_capacity"] - weights, 0.0),
        "pool": np.where(offload, pool_free * g["pool_share"] / in_domain, 0.0),
        "host": np.where(offload, hw["host_capacity"], 0.0),
        "ssd": np.where(offload, hw["storage_capacity"], 0.0),
    }
    left = kv_dev
    placed = {}
    for tier in KV_TIERS:
        placed[tier] = np.minimum(left, caps[tier])
        left = left - placed[tier]
    location = np.zeros(np.shape(kv_dev))
    for i, tier in enumerate(KV_TIERS):
        location = np.where(placed[tier] > 0, i, location)
    location = np.where(left > 0, len(KV_TIERS), location)
    # for timing a row that does not fit, charge the excess to the farthest tier it has
    last = np.where(caps["ssd"] > 0, 3, np.where(caps["host"] > 0, 2, np.where(caps["pool"] > 0, 1, 0)))
    for i, tier in enumerate(KV_TIERS):
        placed[tier] = placed[tier] + np.where(last == i, left, 0.0)
    total = np.where(kv_dev > 0, kv_dev, 1.0)
    share = {tier: np.where(kv_dev > 0, placed[tier] / total, 1.0 if tier == "hbm" else 0.0) for tier in KV_TIERS}
    return dict(kv_dev=kv_dev, kv_tok=kv_tok, shard=shard, caps=caps, placed=placed, share=share,
                location=location, unplaced=left, fits_weights=weights <= g["hbm_utilization"] * hw["hbm_capacity"])


def _fit_limits(k, g, place):
    """Largest batch (whole deployment) and context (per sequence) that fit, in HBM
    alone and with every tier."""
    t, p, d = g["tp"], g["pp"], g["dp"]
    caps = place["caps"]
    per_replica = p * place["shard"]        # devices a replica's KV is spread over, in effect
    hbm, every = caps["hbm"], sum(caps.values())
    out = {}
    for key, cap in (("hbm", hbm), ("all", every)):
        seqs = sv.max_sequences(capacity=np.maximum(cap * per_replica, 1e-30), context_len=g["capacity_context"],
                                kv_cache_memory=place["kv_tok"])
        out[f"max_batch_{key}"] = d * np.floor(seqs)
        ctx = sv.max_sequences(capacity=np.maximum(cap * per_replica, 1e-30), context_len=g["batch"] / d,
                               kv_cache_memory=place["kv_tok"])
        out[f"max_context_{key}"] = np.floor(ctx)
    return out


# --- the whole deployment -------------------------------------------------------------------

def serve_columns(model: Model, g: dict, hw: dict) -> dict[str, np.ndarray]:
    """Evaluate every deployment of the grid ``g`` (equal-length float arrays, see
    :mod:`snlab.serve_planner`) on hardware ``hw`` (:data:`SYSTEM_FIELDS`, floats or arrays).

    Returns output columns named with their units (``ttft_s``, ``tpot_s``, ...).
    """
    k = serving_constants(model)
    t, p, d, e = g["tp"], g["pp"], g["dp"], g["ep"]
    devices = t * p * d
    qw = g["weight_bytes"]

    # ---- weights per device (the stage with the LM head, plus the input embedding if pp = 1) ----
    emb_stage = np.where(p > 1, k["V"] * k["h"], k["emb_params"] + (k["embedding_copies"] - 1) * k["V"] * k["h"])
    if k["experts"]:
        etp = np.maximum(t / e, 1.0)
        expert_w = np.ceil(k["experts"] / e) * k["expert_one"] * k["moe_layers"] / p / etp
    else:
        expert_w = 0.0
    weights = ((k["layer_params"] / p + emb_stage) / t + expert_w) * qw
    place = _placement(k, g, hw, weights)
    share = place["share"]

    # ---- decode ----
    kd = g["draft_tokens"]
    tau = sv.speculative_tokens_per_step(draft_tokens=kd, acceptance_rate=g["acceptance"])
    b = g["batch"] / d                        # sequences per replica
    seqs = b / p                              # per pipeline micro-batch
    tok = seqs * (kd + 1)
    kv_read = seqs * g["context"] * place["kv_tok"] / (p * place["shard"])
    dec = _stage(k, g, hw, tok, g["context"], kv_read, share, tok, prefill=False)
    hop = np.where(p > 1, point_to_point(tok * k["h"] * ACT_BYTES / t,
                                         devices <= hw["scale_up_domain_size"], hw), 0.0)
    draft = 1 + kd * MTP_LAYERS / k["L"]
    step = p * (dec["stage"] + hop) * draft
    tpot = sv.time_per_output_token(step_time=step, tokens_per_step=tau)
    decode_rate = g["batch"] * tau / step

    # ---- prefill ----
    pf_tok = g["prefill_batch"] * g["prompt_len"]
    pf_kv = pf_tok * place["kv_tok"] / (p * place["shard"])
    pre = _stage(k, g, hw, pf_tok, g["prompt_len"] / 2, pf_kv, share, g["prefill_batch"], prefill=True)
    pf_hop = np.where(p > 1, point_to_point(pf_tok * k["h"] * ACT_BYTES / t,
                                            devices <= hw["scale_up_domain_size"], hw), 0.0)
    ttft = p * pre["stage"] + (p - 1) * pf_hop
    prefill_rate = pf_tok / (pre["stage"] * t * p)

    # ---- batching on a replica that prefills its own requests ----
    mu = g["output_len"]
    per_request = ttft / g["prefill_batch"]
    longest = np.where(g["output_dist"] == 1, sv.static_steps_uniform(batch_sequences=b, mean_output_len=mu),
                       np.where(g["output_dist"] == 2,
                                sv.static_steps_exponential(batch_sequences=b, mean_output_len=mu), mu))
    longest = np.maximum(longest, mu)
    cont = sv.batching_throughput(batch_sequences=b, mean_output_len=mu, prefill_time=per_request,
                                  decode_steps=mu / tau, step_time=step)
    static = sv.batching_throughput(batch_sequences=b, mean_output_len=mu, prefill_time=per_request,
                                    decode_steps=longest / tau, step_time=step)

    # ---- walls of the decode step ----
    rounds = p * draft
    wall_c = rounds * dec["compute_wall"]
    wall_m = rounds * dec["memory_wall"]
    wall_x = rounds * (dec["tp"] + dec["ep_exposed"] + hop)
    limits = _fit_limits(k, g, place)
    fits = place["fits_weights"] & (place["unplaced"] <= 0)
    kv_step = rounds * dec["kv"]
    return {
        "devices": devices,
        "ttft_s": ttft, "tpot_s": tpot, "decode_step_s": step, "tokens_per_step": tau * np.ones_like(step),
        "decode_tokens_per_s": decode_rate, "decode_tokens_per_s_per_device": decode_rate / devices,
        "prefill_tokens_per_s_per_device": prefill_rate,
        "continuous_tokens_per_s_per_device": cont / (t * p), "static_tokens_per_s_per_device": static / (t * p),
        "continuous_over_static": cont / static,
        "weights_bytes_per_device": weights, "kv_cache_bytes_per_device": place["kv_dev"],
        "kv_hbm_bytes_per_device": place["placed"]["hbm"],
        "kv_pool_bytes_per_device": place["placed"]["pool"], "kv_host_bytes_per_device": place["placed"]["host"],
        "kv_ssd_bytes_per_device": place["placed"]["ssd"], "kv_unplaced_bytes_per_device": place["unplaced"],
        "kv_bytes_per_token": place["kv_tok"] * np.ones_like(step), "kv_location": place["location"],
        "kv_read_bytes_per_step_per_device": rounds * kv_read,
        "time_kv_s": kv_step, "kv_time_per_output_token_s": kv_step / tau,
        "kv_spill_slowdown": dec["kv"] / np.maximum(dec["kv_hbm_only"], 1e-30),
        "time_weights_s": rounds * dec["weights_read"] / (hw["memory_efficiency"] * hw["hbm_bandwidth"]),
        "time_dense_s": rounds * dec["dense"], "time_experts_s": rounds * dec["expert"],
        "time_attention_s": rounds * dec["attention"], "time_tp_s": rounds * dec["tp"],
        "time_ep_s": rounds * dec["ep"], "exposed_ep_s": rounds * dec["ep_exposed"], "time_pp_s": rounds * hop,
        "prefill_time_tp_s": p * pre["tp"], "prefill_time_ep_s": p * pre["ep"],
        "prefill_exposed_ep_s": p * pre["ep_exposed"],
        "wall_compute_s": wall_c, "wall_memory_s": wall_m, "wall_communication_s": wall_x,
        "max_batch_hbm": limits["max_batch_hbm"], "max_batch": limits["max_batch_all"],
        "max_context_hbm": limits["max_context_hbm"], "max_context": limits["max_context_all"],
        "fits": fits, "fits_weights": place["fits_weights"],
    }
