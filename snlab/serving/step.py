"""The serving model as named parts: weights, KV placement, one forward pass, the
pipeline stage with two-batch overlap, decode, prefill, batching, limits and walls.

Every part is vectorised over a grid of deployments
(:class:`~snlab.serving.deployment.Deployment`) on one model and one
:class:`~snlab.hardware.Hardware`; :func:`serve_columns` runs the chain and lays out
the output columns. A deployment has ``dp`` model replicas ("data-parallel
attention"), each of ``tp x pp`` devices; the experts of a MoE model are spread over
``ep`` devices of each pipeline stage (DeepSeek-style: ``ep = tp x dp`` puts whole
experts on every device of the deployment), tensor-split by ``max(1, tp / ep)``.

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
  kernels at ``ep_bulk_efficiency``; each falls back to the level's ``efficiency``
  (:func:`snlab.network.expert_calls`).
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
  does not use), host memory, SSD; a tier without bandwidth holds nothing. A decode
  step streams the spilled part concurrently with the HBM part (``tiered_read_time``),
  so spilling costs time only once the far stream is the slower one.
* **Batching**: static batches wait for their longest output; continuous batching
  refills slots at once (``batching_throughput``), both with their prefills on the
  same replica.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import network as net
from ..grid import maximum, minimum, spread, where
from ..hardware import ACTIVATION_BYTES, Hardware
from ..sizing import ModelSizes, forward_flops_per_token, kv_cache_bytes_per_token, model_sizes
from ..walls import communication as cm
from ..walls import compute as cw
from ..walls import serving as sv
from . import engine
from . import offline as off
from . import deployment as dp_
from .deployment import Deployment
from .. import kernel as _kernel

_kernel.loaded(__name__)

#: KV tiers, nearest first; a deployment's ``kv_location`` is the farthest one it uses
KV_TIERS = ("hbm", "pool", "host", "ssd")
KV_LOCATIONS = KV_TIERS + ("does not fit",)
MTP_LAYERS = 1.0       # DeepSeek-V3 Sec. 2.2: one transformer block per predicted token
#: bytes per element of the embedding and the output head, which quantised checkpoints
#: keep in 16 bits (NVIDIA ModelOpt's FP8 and NVFP4 exports list lm_head in
#: exclude_modules; DeepSeek-V3's FP8 release keeps embedding and head in BF16)
HEAD_BYTES = 2.0


@dataclass(frozen=True)
class ServingSizes:
    """What serving needs beyond :class:`~snlab.sizing.ModelSizes`: KV-cache elements per
    token of context, attention FLOPs per query per key at prefill (uncompressed) and at
    decode (MLA absorbed), the most ways tensor parallelism splits the KV cache, and the
    kernels a layer launches (:func:`snlab.serving.engine.kernels`), and the model as
    trtllm-bench reads it (:class:`snlab.serving.offline.Checkpoint`)."""

    base: ModelSizes
    kv_elements_per_token: float
    prefill_attention_per_key: float
    decode_attention_per_key: float
    kv_shard_max: float
    kernels: engine.Kernels
    gemm_k_col: float
    gemm_k_row: float
    expert_ffn: float
    checkpoint: off.Checkpoint


@lru_cache(maxsize=256)
def serving_sizes(model) -> ServingSizes:
    prefill = float(forward_flops_per_token(model, 1) - forward_flops_per_token(model, 0))
    if model.mla:
        decode = float(sv.mla_absorbed_attention_flops(layers=model.layers, heads=model.heads,
                                                       kv_lora_rank=model.mla.kv_lora_rank,
                                                       qk_rope_head_dim=model.mla.qk_rope_head_dim, context_len=1.0))
        shard = 1.0        # the latent is shared by all heads: tensor parallelism replicates it
    else:
        decode, shard = prefill, float(model.kv_heads)
    base = model_sizes(model)
    k_col, k_row = gemm_inner_dims(model)
    return ServingSizes(base=base, kv_elements_per_token=float(kv_cache_bytes_per_token(model, 1.0)),
                        prefill_attention_per_key=prefill, decode_attention_per_key=decode, kv_shard_max=shard,
                        kernels=engine.kernels(model), gemm_k_col=k_col, gemm_k_row=k_row,
                        expert_ffn=float(model.moe.expert_ffn_hidden_size if model.moe else 0),
                        checkpoint=off.Checkpoint(quantised=float(base.layer_params + base.expert_params),
                                                  kept=float(base.embedding_params * base.embedding_copies),
                                                  layers=float(model.layers), kv_heads=float(model.kv_heads),
                                                  head_size=float(model.head_dim)))


def gemm_inner_dims(model) -> tuple[float, float]:
    """Inner dimensions K of an average layer's dense GEMMs, summed: those whose output
    tensor parallelism splits (QKV, gate/up, router; latent attention's projections into
    and out of the latent) and those whose input it splits (the output projection, the
    down projection of the dense MLP or of the shared experts). With the layer's dense
    weights P they give the N that a GEMM's occupancy sees on average,
    P / t over (K_col + K_row / t): the FLOP-weighted harmonic mean of the GEMMs' N."""
    h = model.hidden_size
    if model.mla:
        m = model.mla
        attention_col = (m.q_lora_rank or h) + m.kv_lora_rank + 2 * h      # q, kv up; q and kv down
        attention_row = model.heads * m.v_head_dim
    else:
        attention_col, attention_row = h, model.heads * model.head_dim
    dense_col, dense_row = h, model.ffn_hidden_size
    if model.moe:
        moe_col = h + (h if model.moe.shared_experts else 0)                   # router, shared gate/up
        moe_row = model.moe.shared_experts * model.moe.expert_ffn_hidden_size
        d = model.moe.dense_layers
        mlp_col = (d * dense_col + (model.layers - d) * moe_col) / model.layers
        mlp_row = (d * dense_row + (model.layers - d) * moe_row) / model.layers
    else:
        mlp_col, mlp_row = dense_col, dense_row
    return float(attention_col + mlp_col), float(attention_row + mlp_row)


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


@dataclass(frozen=True)
class Weights:
    """Weight bytes per device (the stage with the LM head, plus the input embedding
    when pp = 1) and how many dies run as ranks with their own copy."""

    per_device: np.ndarray
    rank_dies: np.ndarray


def weights(sizes: ModelSizes, dep: Deployment, hw: Hardware) -> Weights:
    t, p = dep.tp, dep.pp
    h, V = sizes.hidden_size, sizes.vocab_size
    extra_output = (sizes.embedding_copies - 1) * V * h
    emb_stage = where(p > 1, V * h, sizes.embedding_params + extra_output)
    if sizes.experts:
        expert_tp = maximum(t / dep.ep, 1.0)
        expert = np.ceil(sizes.experts / dep.ep) * sizes.expert_params_one * sizes.moe_layers / p / expert_tp
    else:
        expert = 0.0
    # a die that runs as its own rank (tp = 1 on a multi-die package) holds its own copy;
    # the embedding and the output head stay in 16 bits in quantised checkpoints
    rank_dies = where(t > 1, 1.0, hw.dies)
    per_device = package_weight_bytes(rank_dies, (sizes.layer_params / p * dep.weight_bytes
                                                  + emb_stage * HEAD_BYTES) / t, expert * dep.weight_bytes)
    return Weights(per_device=per_device, rank_dies=rank_dies)


@dataclass(frozen=True)
class Placement:
    """The KV cache per device [bytes] and where it lives: each tier's capacity left for
    it, what each tier holds, each tier's share, the farthest tier used (an index of
    :data:`KV_LOCATIONS`) and what finds no room."""

    kv_per_device: np.ndarray
    kv_per_token: np.ndarray
    shard: np.ndarray
    capacity: dict
    placed: dict
    share: dict
    location: np.ndarray
    unplaced: np.ndarray
    weights_fit: np.ndarray
    lenders: np.ndarray


def lender_devices(pool_bytes_per_device, dep: Deployment, hw: Hardware):
    """Devices whose HBM the deployment borrows through the pool [count]: the pooled KV
    cache of all its devices over what one peer can lend (its usable HBM). They serve
    nothing while they lend, so per-device throughputs count them."""
    lendable = dep.hbm_utilization * hw.hbm_capacity
    return np.ceil(np.round(pool_bytes_per_device * dep.devices / lendable, 9))


def placement(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights) -> Placement:
    t, p, d = dep.tp, dep.pp, dep.dp
    kv_tok = ss.kv_elements_per_token * dep.kv_bytes
    shard = minimum(t, ss.kv_shard_max)
    kv_dev = dep.batch / d * dep.capacity_context * kv_tok / (p * shard)
    offload = dep.kv_offload > 0
    in_domain = minimum(dep.devices, hw.scale_up_domain_size)
    pool_free = hw.free_pool(in_domain)
    caps = {
        "hbm": maximum(dep.hbm_utilization * hw.hbm_capacity - w.per_device, 0.0),
        "pool": where(offload & (hw.pool_bandwidth > 0), pool_free * dep.pool_share / in_domain, 0.0),
        "host": where(offload & (hw.host_bandwidth > 0), hw.host_capacity, 0.0),
        "ssd": where(offload & (hw.storage_bandwidth > 0), hw.storage_capacity, 0.0),
    }
    left = kv_dev
    placed = {}
    for tier in KV_TIERS:
        placed[tier] = minimum(left, caps[tier])
        left = left - placed[tier]
    location = np.zeros(np.shape(kv_dev))
    for i, tier in enumerate(KV_TIERS):
        location = where(placed[tier] > 0, i, location)
    location = where(left > 0, len(KV_TIERS), location)
    # for timing a row that does not fit, charge the excess to the farthest tier it has
    last = where(caps["ssd"] > 0, 3, where(caps["host"] > 0, 2, where(caps["pool"] > 0, 1, 0)))
    for i, tier in enumerate(KV_TIERS):
        placed[tier] = placed[tier] + where(last == i, left, 0.0)
    total = where(kv_dev > 0, kv_dev, 1.0)
    share = {tier: where(kv_dev > 0, placed[tier] / total, 1.0 if tier == "hbm" else 0.0) for tier in KV_TIERS}
    return Placement(kv_per_device=kv_dev, kv_per_token=kv_tok, shard=shard, capacity=caps, placed=placed,
                     share=share, location=location, unplaced=left,
                     weights_fit=w.per_device <= dep.hbm_utilization * hw.hbm_capacity,
                     lenders=lender_devices(placed["pool"], dep, hw))


def far_read_time(kv_bytes, share: dict, hw: Hardware, reads):
    """Seconds to read ``kv_bytes`` whose tier shares are ``share`` from the far tiers,
    one bulk read per layer from each tier used; the tiers share the device's off-chip
    path, so their times add."""
    total = 0.0
    for tier, bw, lat in (("pool", hw.pool_bandwidth, hw.pool_latency), ("host", hw.host_bandwidth, hw.host_latency),
                          ("ssd", hw.storage_bandwidth, hw.storage_latency)):
        used = share[tier] > 0
        t = sv.far_read_time(far_bytes=kv_bytes * share[tier], far_bandwidth=where(used, bw, 1.0),
                             far_latency=lat, far_reads=reads)
        total = total + where(used, t, 0.0)
    return total


@dataclass(frozen=True)
class Pass:
    """One micro-batch through one pipeline stage (the last: it holds the LM head) [s],
    with the FLOPs and bytes of the output head alone (what each draft token adds)."""

    dense: np.ndarray
    expert: np.ndarray
    attention: np.ndarray
    fixed: np.ndarray
    elementwise: np.ndarray
    kv: np.ndarray
    head: np.ndarray
    head_flops: np.ndarray
    head_bytes: np.ndarray
    kv_hbm_only: np.ndarray
    tp: np.ndarray
    ep: np.ndarray
    compute_wall: np.ndarray
    memory_wall: np.ndarray
    weights_read: np.ndarray

    def scaled(self, factor) -> "Pass":
        return Pass(**{k: factor * v for k, v in vars(self).items()})


def forward_pass(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights, tok, ctx, kv_bytes, share,
                 logits, prefill: bool, computed=None) -> Pass:
    """``tok``: query tokens of one replica; ``ctx``: keys each query attends to;
    ``kv_bytes``: KV bytes each device reads (decode) or writes (prefill); ``logits``:
    tokens that need the output layer; ``computed``: the tokens the GEMMs, the element-wise
    kernels and the collectives run on (a decode step's captured batch, padded:
    :func:`snlab.serving.engine.padded`; default ``tok``). Each part is a roofline at the
    weights' precision: its dense peak, and its
    large-GEMM efficiency times the GEMMs' occupancy at that many tokens
    (:data:`snlab.walls.compute.gemm_occupancy`); ``fixed`` the kernels' fixed time
    (:func:`snlab.serving.engine.fixed_time`)."""
    k = ss.base
    t, p, qw = dep.tp, dep.pp, dep.weight_bytes
    layers = k.layers / p
    computed = tok if computed is None else computed
    # the N a dense GEMM sees on average (gemm_inner_dims), and its occupancy
    n_dense = k.dense_matmul_params / t / (ss.gemm_k_col + ss.gemm_k_row / t)
    occupancy = cw.gemm_occupancy(gemm_m=computed, gemm_n=n_dense, gemm_half_elements=dep.gemm_half)
    efficiency = hw.gemm_efficiency * dep.efficiency_ratio
    gemm = hw.roofline(peak_flops=hw.peak_flops * dep.gemm_ratio, gemm_efficiency=efficiency * occupancy)
    h, V = k.hidden_size, k.vocab_size
    flop_rate = hw.gemm_efficiency * hw.sustained_clock * hw.peak_flops
    byte_rate = hw.memory_efficiency * hw.hbm_bandwidth
    # layers' own weights (attention, dense MLPs, shared experts, router) and the 16-bit
    # LM head, read once by each die that runs as its own data-parallel rank
    # (package_weight_bytes)
    dense_read = w.rank_dies * (k.layer_params / p * qw + V * h * HEAD_BYTES) / t
    dense_flops = (2 * computed * k.dense_matmul_params * layers + 2 * logits * V * h) / t
    act_bytes = ACTIVATION_BYTES * computed * h * layers * 4 / t     # read and write of q, attention out, MLP in/out
    t_dense = cw.roofline_time(flops=dense_flops, bytes_moved=dense_read + act_bytes, **gemm)
    head_flops, head_bytes = 2 * logits * V * h / t, w.rank_dies * V * h / t * HEAD_BYTES
    t_head = cw.roofline_time(flops=head_flops, bytes_moved=head_bytes, **hw.roofline())
    exp_read, exp_flops, t_exp = routed_experts(ss, dep, hw, computed, efficiency)
    per_key = ss.prefill_attention_per_key if prefill else ss.decode_attention_per_key
    attn_flops = tok * ctx * per_key / (p * t)
    attn_eff = None
    if not prefill:   # the decode attention kernel's own measured efficiency (FlashMLA-style)
        own = np.asarray(hw.decode_attention_efficiency)
        attn_eff = where(own > 0, own, hw.gemm_efficiency)
    t_attn_c = cw.roofline_time(flops=attn_flops, bytes_moved=0.0, **hw.roofline(gemm_efficiency=attn_eff))
    far = far_read_time(kv_bytes, share, hw, layers)
    t_kv = sv.tiered_read_time(local_bytes=kv_bytes, far_time=far,
                               memory_bandwidth=hw.hbm_bandwidth, memory_efficiency=hw.memory_efficiency)
    # a captured graph's collectives move its padded batch, as its GEMMs compute it
    tp_comm = 2 * layers * engine.tensor_all_reduce(engine.all_reduce_bytes(computed, h), t, hw)
    if k.experts:
        q_dispatch = where(qw <= 1, 1.0, ACTIVATION_BYTES)   # 8-bit dispatch when the weights are
        disp, comb = net.expert_calls(computed / t, k.experts_per_token, h, dep.ep, q_dispatch, hw, prefill)
        # the exchange waits for the busiest device, which receives its share times the imbalance
        ep_comm = where(dep.ep > 1, k.moe_layers / p * (disp + comb) * dep.expert_imbalance, 0.0)
    else:
        ep_comm = 0.0 * tok
    fixed = engine.fixed_time(ss.kernels, layers, hw, dep.graphs)
    elementwise = cw.roofline_time(flops=0.0, bytes_moved=layers * engine.elementwise_bytes(computed, k, t),
                                   **hw.roofline())
    return Pass(dense=t_dense, expert=t_exp, attention=maximum(t_attn_c, t_kv), fixed=fixed,
                elementwise=elementwise, kv=t_kv,
                head=t_head, head_flops=head_flops, head_bytes=head_bytes, kv_hbm_only=kv_bytes / byte_rate,
                tp=tp_comm, ep=ep_comm,
                compute_wall=(dense_flops + exp_flops) / (flop_rate * dep.gemm_ratio * dep.efficiency_ratio)
                + attn_flops / flop_rate,
                memory_wall=(dense_read + act_bytes + exp_read) / byte_rate + t_kv,
                weights_read=dense_read + exp_read)


def routed_experts(ss: ServingSizes, dep: Deployment, hw: Hardware, tok, efficiency):
    """Routed experts of one pass on the busiest device: bytes read (only the slots some
    token reached), FLOPs (the mean device's times ``expert_imbalance``), and their
    roofline time, each expert's GEMMs at the occupancy of the tokens it gets. Without
    expert parallelism (``ep`` 1) every device holds a tensor slice of every expert and
    computes its share of every token: no device is busier than another, whatever the
    routing, so ``expert_imbalance`` weighs only an expert-parallel deployment."""
    k = ss.base
    if not k.experts:
        zero = 0.0 * tok
        return zero, zero, zero
    t, p, e = dep.tp, dep.pp, dep.ep
    imbalance = where(e > 1, dep.expert_imbalance, 1.0)
    slots = np.ceil(k.experts / e)
    reaching = tok * maximum(e, t) / t
    rho = sv.expert_activation(experts=slots * e, experts_per_token=k.experts_per_token, tokens=reaching)
    split = maximum(t / e, 1.0)
    read = slots * rho * k.expert_params_one / split * dep.weight_bytes * k.moe_layers / p
    flops = 2 * tok * k.experts_per_token * k.expert_params_one / t * k.moe_layers / p * imbalance
    per_expert = reaching * k.experts_per_token / k.experts * imbalance
    n_expert = k.expert_params_one / split / (k.hidden_size + ss.expert_ffn / split)
    occupancy = cw.gemm_occupancy(gemm_m=per_expert, gemm_n=n_expert, gemm_half_elements=dep.gemm_half)
    roof = hw.roofline(peak_flops=hw.peak_flops * dep.gemm_ratio, gemm_efficiency=efficiency * occupancy)
    return read, flops, cw.roofline_time(flops=flops, bytes_moved=read, **roof)


@dataclass(frozen=True)
class Stage:
    """A stage pass of the tokens split into ``microbatches`` (the parts summed over
    them), the expert all-to-all left exposed, and the stage's time."""

    parts: Pass
    ep_exposed: np.ndarray
    time: np.ndarray


def stage(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights, tok, ctx, kv_bytes, share, logits,
          prefill: bool, computed=None) -> Stage:
    """With two micro-batches a fraction ``ep_overlap`` of the expert all-to-all hides
    behind the other half's compute (two-batch overlap; by default the phase's
    :data:`~snlab.serving.deployment.TBO_OVERLAP`), slowing that compute by
    ``overlap_contention`` per second hidden; every weight is read once per half."""
    mb = dep.microbatches
    computed = tok if computed is None else computed
    part = forward_pass(ss, dep, hw, w, tok / mb, ctx, kv_bytes / mb, share, logits / mb, prefill, computed / mb)
    compute = mb * (part.dense + part.expert + part.attention + part.elementwise + part.fixed)
    ep = mb * part.ep
    given = np.isfinite(dep.ep_overlap)
    level = where(given, dep.ep_overlap, dp_.TBO_OVERLAP["prefill" if prefill else "decode"])
    overlap = where(mb > 1, level, 0.0)   # one batch has nothing to hide behind
    body = cm.overlapped_time(compute_time=compute, comm_time=ep, overlap=overlap,
                              overlap_contention=hw.overlap_contention)
    return Stage(parts=part.scaled(mb), ep_exposed=body - compute, time=body + mb * part.tp)


@dataclass(frozen=True)
class Decode:
    """One decode step [s] of every sequence in flight: the stage's parts, the
    pipeline hop, the drafting factor, tokens per step, the step and its rates."""

    stage: Stage
    hop: np.ndarray
    draft: np.ndarray
    tokens_per_step: np.ndarray
    kv_read: np.ndarray
    sampling: np.ndarray
    step: np.ndarray
    tpot: np.ndarray
    rate: np.ndarray


def decode(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights, place: Placement) -> Decode:
    """Drafting costs, per draft token, one more transformer block and the shared output
    head (DeepSeek-V3 report Sec. 2.2: the MTP module shares embedding and output head)."""
    kd, p, t = dep.draft_tokens, dep.pp, dep.tp
    tau = sv.speculative_tokens_per_step(draft_tokens=kd, acceptance_rate=dep.acceptance)
    seqs = dep.batch / dep.dp / p               # sequences per pipeline micro-batch
    tok = seqs * (kd + 1)
    kv_read = seqs * dep.context * place.kv_per_token / (p * place.shard)
    # an engine captures graphs up to its max_batch_size (per micro-batch; without one, the
    # batch as trtllm-bench rounds it) and the decode batches its token budget takes
    batch_cap = where(dep.max_sequences > 0, np.ceil(dep.max_sequences / p), engine.max_batch(seqs))
    largest = where(dep.max_step_tokens > 0, np.minimum(batch_cap, np.floor(dep.max_step_tokens / (kd + 1))),
                    batch_cap)
    computed = engine.padded(seqs, dep.graphs, largest) * (kd + 1)
    # the captured graph's output head and its hop between stages take the padded rows too
    st = stage(ss, dep, hw, w, tok, dep.context, kv_read, place.share, computed, prefill=False, computed=computed)
    hop = where(p > 1, net.point_to_point(computed * ss.base.hidden_size * ACTIVATION_BYTES / t,
                                             dep.devices <= hw.scale_up_domain_size, hw), 0.0)
    draft = 1 + kd * MTP_LAYERS / ss.base.layers
    # the sampler runs once a step on the replica's last stage, over every verified token;
    # the host's own work is hidden behind the previous step unless host_step_s says not
    sampling = engine.sampling_time(tok * p, ss.base.vocab_size, hw, dep.graphs)
    step = p * (st.time + hop) * draft + kd * st.parts.head + sampling + dep.host_step_s
    return Decode(stage=st, hop=hop, draft=draft, tokens_per_step=tau, kv_read=kv_read, step=step,
                  sampling=sampling,
                  tpot=sv.time_per_output_token(step_time=step, tokens_per_step=tau),
                  rate=dep.batch * tau / step)


@dataclass(frozen=True)
class Prefill:
    """Prefill of ``prefill_batch`` prompts per replica: the stage, time to first token
    [s] and prompt tokens per second per device."""

    stage: Stage
    ttft: np.ndarray
    rate: np.ndarray


def prefill(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights, place: Placement) -> Prefill:
    """Causal attention: each prompt token attends to half the prompt on average."""
    p, t = dep.pp, dep.tp
    tok = dep.prefill_batch * dep.prompt_len
    kv = tok * place.kv_per_token / (p * place.shard)
    st = stage(ss, dep, hw, w, tok, dep.prompt_len / 2, kv, place.share, dep.prefill_batch, prefill=True)
    hop = where(p > 1, net.point_to_point(tok * ss.base.hidden_size * ACTIVATION_BYTES / t,
                                             dep.devices <= hw.scale_up_domain_size, hw), 0.0)
    return Prefill(stage=st, ttft=p * st.time + (p - 1) * hop, rate=tok / (st.time * t * p))


def batching(dep: Deployment, dec: Decode, pre: Prefill) -> tuple:
    """Output tokens per second of one replica with continuous and with static batching
    (prefills on the same replica): Orca/vLLM refill a finished slot at once, a static
    batch waits for its longest output (fixed, uniform or exponential lengths)."""
    mu = dep.output_len
    b = dep.batch / dep.dp
    per_request = pre.ttft / dep.prefill_batch
    longest = where(dep.output_dist == 1, sv.static_steps_uniform(batch_sequences=b, mean_output_len=mu),
                       where(dep.output_dist == 2,
                                sv.static_steps_exponential(batch_sequences=b, mean_output_len=mu), mu))
    longest = maximum(longest, mu)
    tau = dec.tokens_per_step
    common = dict(batch_sequences=b, mean_output_len=mu, prefill_time=per_request, step_time=dec.step)
    return (sv.batching_throughput(decode_steps=mu / tau, **common),
            sv.batching_throughput(decode_steps=longest / tau, **common))


def limits(ss: ServingSizes, dep: Deployment, place: Placement) -> dict:
    """Largest batch (whole deployment) and context (per sequence) that fit, in HBM
    alone and with every tier."""
    per_replica = dep.pp * place.shard        # devices a replica's KV is spread over, in effect
    out = {}
    for key, cap in (("hbm", place.capacity["hbm"]), ("all", sum(place.capacity.values()))):
        capacity = maximum(cap * per_replica, 1e-30)
        seqs = sv.max_sequences(capacity=capacity, context_len=dep.capacity_context,
                                kv_cache_memory=place.kv_per_token)
        out[f"max_batch_{key}"] = dep.dp * np.floor(seqs)
        ctx = sv.max_sequences(capacity=capacity, context_len=dep.batch / dep.dp, kv_cache_memory=place.kv_per_token)
        out[f"max_context_{key}"] = np.floor(ctx)
    return out


def walls(dep: Deployment, hw: Hardware, dec: Decode) -> dict:
    """The decode step's time by wall [s]: compute, memory (weights and KV reads) and
    the communication left exposed."""
    rounds = dep.pp * dec.draft
    parts = dec.stage.parts
    byte_rate = hw.memory_efficiency * hw.hbm_bandwidth
    flop_rate = hw.gemm_efficiency * hw.sustained_clock * hw.peak_flops * dep.gemm_ratio
    kd = dep.draft_tokens
    return {"compute": rounds * parts.compute_wall + kd * parts.head_flops / flop_rate,
            "memory": rounds * parts.memory_wall + kd * parts.head_bytes / byte_rate,
            "communication": rounds * (parts.tp + dec.stage.ep_exposed + dec.hop)}


def serve_columns(model, dep: Deployment, hw: Hardware) -> dict[str, np.ndarray]:
    """Evaluate every deployment of the grid: the chain of parts, laid out as output
    columns named with their units (``ttft_s``, ``tpot_s``, ...). On rows of the offline
    scenario the engine chooses the batch (:mod:`snlab.serving.offline`), and every
    fixed-batch column describes a step with that batch in flight."""
    ss = serving_sizes(model)
    w = weights(ss.base, dep, hw)
    place = placement(ss, dep, hw, w)
    offline_rows = dep.scenario == 1
    run = None
    if np.any(offline_rows):
        # the memory the offline run gives the KV cache in HBM, where the engines keep it
        # (the batch is sized to it, so nothing spills)
        kv_memory = off.kv_memory(dep, hw, w.per_device)
        # weights that leave no room beside the runtime's reserve and the engine's own memory
        # do not fit, whatever the KV cache
        room = hw.hbm_capacity - hw.memory_reserve - dep.engine_memory_bytes
        # (a byte at least: engine memory beyond the device leaves it none, and no fraction of zero)
        used = where(w.per_device <= room, kv_memory + w.per_device, maximum(room, 1.0))
        utilization = used / maximum(hw.hbm_capacity, 1.0)
        dep = dataclasses.replace(dep, hbm_utilization=where(offline_rows, utilization, dep.hbm_utilization))
        run = offline_run(ss, dep, hw, w, placement(ss, dep, hw, w))
        # every fixed-batch column then describes a step of the engine's batch, whose KV
        # cache the engine keeps in HBM only
        dep = dataclasses.replace(dep, batch=where(offline_rows, run.batch * dep.dp, dep.batch),
                                  kv_offload=where(offline_rows, 0.0, dep.kv_offload))
        place = placement(ss, dep, hw, w)
    dec = decode(ss, dep, hw, w, place)
    pre = prefill(ss, dep, hw, w, place)
    cont, static = batching(dep, dec, pre)
    out = columns(dep, hw, w, place, dec, pre, cont, static, limits(ss, dep, place), walls(dep, hw, dec))
    return {**out, **offline_columns(dep, place, run, out["fits"])}


#: the offline scenario's output columns
OFFLINE_COLUMNS = ("offline_tokens_per_s", "offline_tokens_per_s_per_device", "offline_ttft_s", "offline_tpot_s",
                   "offline_sequences", "offline_kv_sequences", "offline_waves", "offline_step_tokens",
                   "offline_prefill_chunks", "offline_makespan_s", "offline_max_batch_size",
                   "offline_kv_pool_bytes_per_device", "batch_in_flight")


def offline_run(ss: ServingSizes, dep: Deployment, hw: Hardware, w: Weights, place: Placement) -> off.Offline:
    """The offline scenario of every row (:func:`snlab.serving.offline.offline`)."""

    def prefill_pass(d):
        return prefill(ss, d, hw, w, placement(ss, d, hw, w)).stage.time

    def output_token_time(d):
        return decode(ss, d, hw, w, placement(ss, d, hw, w)).tpot

    return off.offline(dep, hw, w.per_device, place.kv_per_token, place.shard, prefill_pass, output_token_time,
                       dep.draft_tokens + 1, ss.checkpoint)


def offline_columns(dep: Deployment, place: Placement, run, fits) -> dict:
    """The offline scenario's columns, zero on rows of the fixed-batch scenario (and the
    batch in flight of every row)."""
    if run is None:
        zero = np.zeros(np.shape(fits))
        return {**dict.fromkeys(OFFLINE_COLUMNS, zero), "batch_in_flight": spread(dep.batch, np.shape(fits)),
                "fits": fits}
    offline_rows = dep.scenario == 1
    values = (run.tokens_per_s, run.tokens_per_s / dep.devices, run.ttft, run.tpot, run.batch, run.kv_sequences,
              run.waves, run.step_tokens, run.chunks, run.makespan, run.max_batch,
              spread(run.kv_pool, np.shape(fits)))
    return {**{n: where(offline_rows, v, 0.0) for n, v in zip(OFFLINE_COLUMNS, values)},
            "batch_in_flight": spread(dep.batch, np.shape(fits)),
            "fits": where(offline_rows, place.weights_fit & run.fits, fits)}


def columns(dep, hw, w, place, dec, pre, cont, static, fit, wall) -> dict[str, np.ndarray]:
    """The parts laid out as the serving output columns."""
    rounds = dep.pp * dec.draft
    parts, kd, step = dec.stage.parts, dep.draft_tokens, dec.step
    byte_rate = hw.memory_efficiency * hw.hbm_bandwidth
    kv_step = rounds * parts.kv
    # devices lending HBM through the pool serve nothing: every per-device rate counts them
    charged = (dep.devices + place.lenders) / dep.devices
    per_replica = dep.tp * dep.pp * charged
    return {
        "devices": dep.devices, "lender_devices": place.lenders,
        "ttft_s": pre.ttft, "tpot_s": dec.tpot, "decode_step_s": step,
        "tokens_per_step": dec.tokens_per_step * np.ones_like(step),
        "decode_tokens_per_s": dec.rate, "decode_tokens_per_s_per_device": dec.rate / (dep.devices + place.lenders),
        "prefill_tokens_per_s_per_device": pre.rate / charged,
        "continuous_tokens_per_s_per_device": cont / per_replica, "static_tokens_per_s_per_device": static / per_replica,
        "continuous_over_static": cont / static,
        "weights_bytes_per_device": w.per_device, "kv_cache_bytes_per_device": place.kv_per_device,
        **{f"kv_{tier}_bytes_per_device": place.placed[tier] for tier in KV_TIERS},
        "kv_unplaced_bytes_per_device": place.unplaced,
        "kv_bytes_per_token": place.kv_per_token * np.ones_like(step), "kv_location": place.location,
        "kv_read_bytes_per_step_per_device": rounds * dec.kv_read,
        "time_kv_s": kv_step, "kv_time_per_output_token_s": kv_step / dec.tokens_per_step,
        "kv_spill_slowdown": parts.kv / maximum(parts.kv_hbm_only, 1e-30),
        "time_weights_s": (rounds * parts.weights_read + kd * parts.head_bytes) / byte_rate,
        "time_dense_s": rounds * parts.dense + kd * parts.head, "time_draft_head_s": kd * parts.head,
        "time_experts_s": rounds * parts.expert, "time_attention_s": rounds * parts.attention,
        "time_fixed_s": rounds * parts.fixed, "time_elementwise_s": rounds * parts.elementwise,
        "time_sampling_s": spread(dec.sampling, np.shape(step)),
        "time_tp_s": rounds * parts.tp, "time_ep_s": rounds * parts.ep,
        "exposed_ep_s": rounds * dec.stage.ep_exposed, "time_pp_s": rounds * dec.hop,
        "prefill_time_tp_s": dep.pp * pre.stage.parts.tp, "prefill_time_ep_s": dep.pp * pre.stage.parts.ep,
        "prefill_exposed_ep_s": dep.pp * pre.stage.ep_exposed,
        "wall_compute_s": wall["compute"], "wall_memory_s": wall["memory"],
        "wall_communication_s": wall["communication"],
        "max_batch_hbm": fit["max_batch_hbm"], "max_batch": fit["max_batch_all"],
        "max_context_hbm": fit["max_context_hbm"], "max_context": fit["max_context_all"],
        "fits": place.weights_fit & (place.unplaced <= 0), "fits_weights": place.weights_fit,
    }
