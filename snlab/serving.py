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
  transformer layer and one pass of the shared output head per draft token
  (DeepSeek-V3's MTP module, its report Sec. 2.2).
* **Expert all-to-all kernels**: dispatch and combine at decode sizes run at the
  bandwidth fraction their own microbenchmarks reach (a level's ``ep_dispatch_efficiency``
  and ``ep_combine_efficiency``: on CloudMatrix384 0.26 and 0.54 of the bus, Zuo et al.
  2025 Sec. 5; DeepEP on H800 0.77 and 0.81 of the NIC), prefill's high-throughput
  kernels at ``ep_bulk_efficiency``; each falls back to the level's ``efficiency``.
  :func:`expert_all_to_all_time` prices one call in the microbenchmarks' setting.
* **Multi-die packages** (``Device.dies``, the Ascend 910C's two): without tensor
  parallelism each die runs as its own data-parallel rank, so it holds and reads its
  own copy of the replicated weights (:func:`package_weight_bytes`), and bytes to the
  sibling die stay on the package.
* **Decode attention** runs at the device's measured decode-attention efficiency
  (FlashMLA 0.667 on H800, the 910C's MLA kernel 0.654) where the preset has one.
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
                                 "storage_capacity", "pool_domain_capacity", "dies", "decode_attention_efficiency",
                                 "scale_up_ep_dispatch_efficiency", "scale_up_ep_combine_efficiency",
                                 "scale_up_ep_bulk_efficiency", "scale_out_ep_dispatch_efficiency",
                                 "scale_out_ep_combine_efficiency", "scale_out_ep_bulk_efficiency")
#: expert-parallel kernels -> the level field of their achieved bandwidth fraction: the
#: low-latency dispatch and combine of decode, the high-throughput ("bulk") ones of prefill
EP_KERNELS = {"dispatch": "ep_dispatch_efficiency", "combine": "ep_combine_efficiency", "bulk": "ep_bulk_efficiency"}
ACT_BYTES = 2.0        # activations, TP all-reduces, combine: 16-bit
MTP_LAYERS = 1.0       # DeepSeek-V3 Sec. 2.2: one transformer block per predicted token


def serving_hardware(system: System) -> dict:
    """The system's numbers under :data:`SYSTEM_FIELDS` (SI units), plus the dense peak
    of each precision relative to bf16 (``ratio_<dtype>``; 1 where the device has no
    faster path for it: weight-only quantisation multiplies in bf16).

    The expert-parallel kernel efficiencies and the decode attention efficiency keep
    their preset value, 0 where the preset leaves them unset: :func:`_pass` then falls
    back to the level's ``efficiency`` and the device's ``gemm_efficiency``, so that a
    sweep of those also moves the fallbacks."""
    hw = hardware(system, "bf16")
    dev, pool, store = system.device, system.pool, system.storage
    for level in ("scale_up", "scale_out"):
        for field in EP_KERNELS.values():
            hw[f"{level}_{field}"] = getattr(getattr(system, level), field)
    hw.update(
        dies=float(dev.dies), decode_attention_efficiency=dev.decode_attention_efficiency,
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


def package_weight_bytes(dies, replicated_bytes, sharded_bytes):
    """Weight bytes a package holds, and reads once per forward pass, when its ``dies``
    run as separate data-parallel ranks: n_die x W_rep + W_sh.

    Each die keeps its own copy of what data parallelism replicates (attention, dense
    layers, shared experts, embeddings and output head); the experts are split among
    all ranks. Zuo et al. 2025 (arXiv 2506.12708) Sec. 3-4: a 910C package is two dies,
    each its own device with its own HBM, and EP320 runs 320 ranks (DP attention, one
    expert per die) on 160 packages; on such a package DP attention doubles the weight
    stream of a decode step against a one-device package of the same HBM bandwidth.
    """
    return dies * replicated_bytes + sharded_bytes


def expert_all_to_all_time(system, *, ranks: int, tokens_per_rank: float = 128, hidden: int = 7168,
                           experts_per_token: int = 8, collective: str = "dispatch", prefill: bool = False,
                           dispatch_bytes: float = 1.0) -> float:
    """Seconds of one expert dispatch or combine as the serving model prices it, in the
    setting of the published microbenchmarks: ``ranks`` ranks (dies of a multi-die
    package count one each) sending ``tokens_per_rank`` tokens of ``hidden`` elements to
    ``experts_per_token`` experts; dispatch in ``dispatch_bytes`` bytes per element
    (8-bit by default), combine in 16-bit. ``prefill`` picks the high-throughput kernels.

    DeepEP's tables (128 tokens, 7168 hidden, top-8) and Zuo et al.'s Sec. 5 comparison
    use exactly this setting, so this is how the presets' kernel efficiencies are checked
    against them (tests/test_serving_microbench.py).
    """
    from .presets import system as load_system
    hw = serving_hardware(load_system(system))
    if collective not in ("dispatch", "combine"):
        raise ValueError(f"collective must be 'dispatch' or 'combine', got {collective!r}")
    dies = hw["dies"]
    devices = ranks / dies
    disp, comb = _ep_calls(tokens_per_rank * dies, experts_per_token, hidden, np.asarray(float(devices)),
                           np.asarray(float(dispatch_bytes)), hw, prefill)
    return float(disp if collective == "dispatch" else comb)


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


def _a2a(S_in, S_out, n1, n2, hw, kernel=None):
    """One-shot all-to-all; ``kernel`` (a key of :data:`EP_KERNELS`) picks the achieved
    bandwidth fraction of that expert-parallel kernel on each level where the preset
    measures it, the level's ``efficiency`` elsewhere."""
    lv = _levels(n1, n2, hw)
    lv.pop("inner_size")
    lv.pop("outer_size")
    if kernel is not None:
        field = EP_KERNELS[kernel]
        for level, key in (("scale_up", "inner_efficiency"), ("scale_out", "outer_efficiency")):
            own = hw.get(f"{level}_{field}", 0.0)
            lv[key] = np.where(np.asarray(own) > 0, own, lv[key])
    return sv.direct_all_to_all_time(inner_bytes=S_in, outer_bytes=S_out, **lv)


def _ep_calls(tok_dev, k, h, e, qw, hw, prefill):
    """Seconds of one expert dispatch and one combine (one MoE layer, one micro-batch)
    when each of ``e`` devices sends ``tok_dev`` tokens to its tokens' ``k`` experts.

    Decode uses the low-latency kernels (every (token, expert) copy written straight to
    the expert's device), prefill the high-throughput ones (one copy per remote domain,
    forwarded inside it: DeepEP normal kernels). Dispatch moves 8-bit activations when
    the weights are 8-bit or narrower (DeepEP FP8, CloudMatrix INT8), combine 16-bit.
    Bytes to a device's sibling dies stay on the package, so the remote share is
    counted in devices (packages), not ranks."""
    n1, n2 = _split(e, 1.0, hw)
    sent = tok_dev * k * h                    # (token, expert) copies per device, in elements
    inner = sent * (n1 - 1) / np.where(prefill, n1, n1 * n2)
    if prefill:
        outer = tok_dev * h * sv.domains_per_token(outer_size=n2, experts_per_token=k) * (n2 - 1) / n2
    else:
        outer = sent * (n2 - 1) / n2
    q_disp = np.where(qw <= 1, 1.0, ACT_BYTES)
    disp = _a2a(inner * q_disp, outer * q_disp, n1, n2, hw, "bulk" if prefill else "dispatch")
    comb = _a2a(inner * ACT_BYTES, outer * ACT_BYTES, n1, n2, hw, "bulk" if prefill else "combine")
    return disp, comb


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

    # layers' own weights (attention, dense MLPs, shared experts, router) and the LM head,
    # read once by each die that runs as its own data-parallel rank (package_weight_bytes)
    dense_read = g["rank_dies"] * (k["layer_params"] / p + V * h) / t * qw
    dense_flops = (2 * tok * k["dense_mm"] * layers + 2 * logits * V * h) / t
    act_bytes = ACT_BYTES * tok * h * layers * 4 / t     # read and write of q, attention out, MLP in/out
    t_dense = cw.roofline_time(flops=dense_flops, bytes_moved=dense_read + act_bytes, **gemm)
    # the output head alone: what each draft token's pass adds (MTP shares the head)
    head_flops, head_bytes = 2 * logits * V * h / t, g["rank_dies"] * V * h / t * qw
    t_head = cw.roofline_time(flops=head_flops, bytes_moved=head_bytes, **gemm)

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
    attn_roof = _roof(hw, hw["peak_flops"])
    if not prefill:   # the decode attention kernel's own measured efficiency (FlashMLA-style)
        own = hw.get("decode_attention_efficiency", 0.0)
        attn_roof["gemm_efficiency"] = np.where(np.asarray(own) > 0, own, hw["gemm_efficiency"])
    t_attn_c = cw.roofline_time(flops=attn_flops, bytes_moved=0.0, **attn_roof)
    local = kv_bytes * share["hbm"]
    far = _far_time(kv_bytes, share, hw, layers)
    t_kv = sv.tiered_read_time(local_bytes=local, far_time=far, memory_bandwidth=hw["hbm_bandwidth"],
                               memory_efficiency=hw["memory_efficiency"])
    t_attn = np.maximum(t_attn_c, t_kv)

    # tensor parallelism: two all-reduces per layer of the replica's tokens
    tp_comm = 2 * layers * all_reduce(tok * h * ACT_BYTES, t, 1.0, hw)

    # expert parallelism: dispatch (8-bit when the weights are) and combine (16-bit)
    if k["experts"]:
        disp, comb = _ep_calls(tok / t, k["k"], h, e, qw, hw, prefill)
        ep_comm = np.where(e > 1, k["moe_layers"] / p * (disp + comb), 0.0)
    else:
        ep_comm = 0.0 * tok

    return dict(
        dense=t_dense, expert=t_exp, attention=t_attn, kv=t_kv, head=t_head, head_flops=head_flops,
        head_bytes=head_bytes,
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
    p, d = g["pp"], g["dp"]
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
    # a die that runs as its own rank (tp = 1 on a multi-die package) holds its own copy
    g = dict(g, rank_dies=np.where(t > 1, 1.0, hw["dies"]))
    weights = package_weight_bytes(g["rank_dies"], (k["layer_params"] / p + emb_stage) / t * qw, expert_w * qw)
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
    # drafting: per draft token one more transformer block and the shared output head
    # (DeepSeek-V3 report Sec. 2.2: the MTP module shares embedding and output head)
    draft = 1 + kd * MTP_LAYERS / k["L"]
    step = p * (dec["stage"] + hop) * draft + kd * dec["head"]
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
    byte_rate = hw["memory_efficiency"] * hw["hbm_bandwidth"]
    flop_rate = hw["gemm_efficiency"] * hw["sustained_clock"] * hw["peak_flops"] * g["gemm_ratio"]
    wall_c = rounds * dec["compute_wall"] + kd * dec["head_flops"] / flop_rate
    wall_m = rounds * dec["memory_wall"] + kd * dec["head_bytes"] / byte_rate
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
        "time_weights_s": (rounds * dec["weights_read"] + kd * dec["head_bytes"]) / byte_rate,
        "time_dense_s": rounds * dec["dense"] + kd * dec["head"], "time_draft_head_s": kd * dec["head"],
        "time_experts_s": rounds * dec["expert"],
        "time_attention_s": rounds * dec["attention"], "time_tp_s": rounds * dec["tp"],
        "time_ep_s": rounds * dec["ep"], "exposed_ep_s": rounds * dec["ep_exposed"], "time_pp_s": rounds * hop,
        "prefill_time_tp_s": p * pre["tp"], "prefill_time_ep_s": p * pre["ep"],
        "prefill_exposed_ep_s": p * pre["ep_exposed"],
        "wall_compute_s": wall_c, "wall_memory_s": wall_m, "wall_communication_s": wall_x,
        "max_batch_hbm": limits["max_batch_hbm"], "max_batch": limits["max_batch_all"],
        "max_context_hbm": limits["max_context_hbm"], "max_context": limits["max_context_all"],
        "fits": fits, "fits_weights": place["fits_weights"],
    }
