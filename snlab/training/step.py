"""The training step as a chain of named parts, vectorised over a grid of plans.

Each part is a small function of the model's sizes (:class:`~snlab.sizing.ModelSizes`),
the plan grid (:class:`~snlab.training.plan.Plan`), the hardware
(:class:`~snlab.hardware.Hardware`) and the parts before it, built from the walls'
formulas, and returns a frozen record of named arrays. :func:`step_columns` runs the
chain and lays out the output columns; each part can be called, tested and cited on
its own:

1. :func:`layout`: devices, micro-batches, tokens per micro-batch, the heaviest stage;
2. :func:`activations`: Korthikanti et al.'s activation bytes per layer;
3. :func:`compute`: per micro-batch on the slowest stage, from the roofline of each
   layer's matrix multiplies (the layer's weights as one equivalent GEMM of M = tokens,
   K = h; each local expert as its own GEMM), the attention scores, and memory-bound
   element-wise work (every stored activation byte written and read once);
4. :func:`tensor_comm`, :func:`context_comm`, :func:`expert_comm`,
   :func:`pipeline_comm`: each parallelism's traffic per micro-batch, placed on the
   system's levels by :mod:`snlab.network`;
5. :func:`parameters`, :func:`data_parallel`: parameters per device and the
   data-parallel and ZeRO collectives;
6. :func:`memory`, :func:`offload`: memory per device, and what goes to host memory or
   a supernode's pool and what moving it costs;
7. :func:`schedule`: overlap per class of communication, the 1F1B / interleaved
   bubble (Narayanan et al. 2021 Sec. 2.2) and the step;
8. :func:`utilisation`, :func:`walls`: MFU and HFU, and the step's time by wall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import network as net
from ..grid import at_largest, broadcast_shape, maximum, minimum, rounded, spread, where
from ..hardware import ACTIVATION_BYTES, Hardware
from ..sizing import ModelSizes, activation_widths
from ..walls import communication as cm
from ..walls import compute as cw
from ..walls import memory as mw
from . import stages
from . import plan as pl
from .plan import Plan
from .. import kernel as _kernel

_kernel.loaded(__name__)

#: the classes of communication, in the order the outputs list them
COMM_CLASSES = ("tp", "ep", "cp", "pp", "dp", "zero", "offload")
#: the classes that are network communication (offload moves memory)
EXPOSED_COMM = ("tp", "ep", "cp", "pp", "dp", "zero")


@dataclass(frozen=True)
class Layout:
    """How a plan lays the model out: devices, micro-batches per step ``m``, tokens per
    micro-batch on one device before sequence parallelism, the transformer layers of the
    first, most loaded middle and last pipeline stage (:mod:`snlab.training.stages`; the
    last also runs any multi-token-prediction modules), the layers of the most loaded
    stage and their share of the model, and the keys each query attends to."""

    devices: np.ndarray
    micro_batches: np.ndarray
    tokens: np.ndarray
    first_layers: np.ndarray
    middle_layers: np.ndarray
    last_layers: np.ndarray
    stage_layers: np.ndarray
    stage_share: np.ndarray
    context: np.ndarray


def layout(sizes: ModelSizes, plan: Plan) -> Layout:
    """Causal FlashAttention skips the masked half of the scores (Dao 2023,
    FlashAttention-2, Sec. 3.1); materialised scores are computed in full."""
    split = stages.split(sizes.layers, rounded(plan.pp), rounded(plan.first_stage_layers),
                         rounded(plan.last_stage_layers), stages.sizes_tail(sizes))
    first, middle, last = (x.astype(float) for x in (split.first, split.middle, split.last))
    most = maximum(maximum(first, middle), last + sizes.mtp_modules)
    return Layout(devices=plan.devices, micro_batches=plan.micro_batches,
                  tokens=plan.micro_batch * plan.seq_len / plan.cp, first_layers=first, middle_layers=middle,
                  last_layers=last, stage_layers=most, stage_share=most / sizes.layers,
                  context=where(plan.flash_attention > 0, 0.5, 1.0) * plan.seq_len)


@dataclass(frozen=True)
class Activations:
    """Activation bytes one layer keeps for one micro-batch [bytes]: everything (scores
    included), without the scores (selective), the layer input only (full), what a layer
    keeps without recomputation (FlashAttention never stores the scores), and what it
    keeps under the plan's recomputation and storage precision (``stored``), of which
    ``rebuilt`` is what recomputation rebuilds in the backward pass (the scores, when
    they are recomputed, and ``modules``: what the recomputed modules drop)."""

    everything: np.ndarray
    selective: np.ndarray
    full: np.ndarray
    kept: np.ndarray
    stored: np.ndarray
    rebuilt: np.ndarray
    modules: np.ndarray


def activation_inputs(sizes: ModelSizes, plan: Plan) -> dict:
    """The inputs of the memory wall's activation formula for this plan."""
    return dict(activation_widths(sizes), seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                tp=plan.tp, sequence_parallel=plan.sequence_parallel, activation_bytes=ACTIVATION_BYTES)


def module_bits(plan: Plan) -> dict:
    """Each recomputable module (:data:`~snlab.training.plan.RECOMPUTE_MODULES`): 1 where
    the plan recomputes it, else 0."""
    mask = pl.recompute_mask(plan.recompute)
    return {m: np.floor(mask / 2 ** i) % 2 for i, m in enumerate(pl.RECOMPUTE_MODULES)}


def activations(sizes: ModelSizes, plan: Plan) -> Activations:
    """Korthikanti et al. 2022 Table 2, one branch per recomputation choice, then what
    selective recomputation by module drops and what FP8 storage saves
    (:data:`~snlab.walls.memory.recomputed_activation_memory`,
    :data:`~snlab.walls.memory.fp8_activation_saving`)."""
    inputs = activation_inputs(sizes, plan)
    per_layer = mw.activation_memory_per_layer
    everything = per_layer.partial(recompute=0).evaluate(inputs)
    selective = per_layer.partial(recompute=1).evaluate(inputs)
    full = per_layer.partial(recompute=2).evaluate(inputs)
    flash = plan.flash_attention > 0
    kept = where(flash, selective, everything)
    mode, bit = pl.recompute_mode(plan.recompute), module_bits(plan)
    moe = bit["moe"]
    routed = sizes.routed_copies * sizes.hidden_size
    removed_split = (bit["mla_up_proj"] * sizes.mla_up_width + bit["mlp"] * sizes.dense_mlp_width
                     + where(moe > 0, sizes.routed_mlp_width + sizes.shared_mlp_width + routed,
                             bit["moe_act"] * sizes.routed_act_width + bit["shared_experts"] * sizes.shared_mlp_width))
    shape = dict(seq_len=inputs["seq_len"], micro_batch=plan.micro_batch, tp=plan.tp,
                 sequence_parallel=plan.sequence_parallel, activation_bytes=ACTIVATION_BYTES)
    removed = mw.recomputed_activation_memory(recomputed_replicated_width=bit["layernorm"] * sizes.norm_output_width,
                                              recomputed_split_width=removed_split, **shape)
    modular = where((bit["core_attn"] > 0) | flash, selective, everything) - removed
    # in FP8 the linear layers' inputs that are still kept are kept in FP8, and with "all"
    # the MLP activation's inputs too (gate and up, or the GeLU input)
    fp8 = plan.fp8_activations > 0
    act_inputs = (sizes.mlp_matrices - 1) / sizes.mlp_matrices
    split8 = ((1 - bit["mlp"]) * sizes.dense_down_width - sizes.attention_output_width
              + (1 - moe) * ((1 - bit["moe_act"]) * sizes.routed_act_width
                             + (1 - bit["shared_experts"]) * sizes.shared_down_width + routed)
              + (plan.fp8_activations > 1) * act_inputs * ((1 - bit["mlp"]) * sizes.dense_mlp_width + (1 - moe) * (
                  sizes.routed_mlp_width + (1 - bit["shared_experts"]) * sizes.shared_mlp_width)))
    saved = mw.fp8_activation_saving(fp8_replicated_width=(1 - bit["layernorm"]) * 2 * sizes.hidden_size,
                                     fp8_split_width=split8, **shape)
    stored = where(mode == 2, full, where(mode == 1, modular, kept) - where(fp8, saved, 0.0))
    return Activations(everything=everything, selective=selective, full=full, kept=kept, stored=stored,
                       rebuilt=where(mode == 1, kept - modular, 0.0), modules=where(mode == 1, removed, 0.0))


@dataclass(frozen=True)
class Compute:
    """Compute per micro-batch on the slowest stage [s]: one average layer's forward
    parts (the routed experts at the busiest device's load), the output layer, the
    multi-token-prediction modules' forward, the slowest stage's forward and its
    recomputation, and the total (forward + a backward twice as long + recomputation)."""

    dense_gemm: np.ndarray
    expert_gemm: np.ndarray
    attention: np.ndarray
    elementwise: np.ndarray
    layer_forward: np.ndarray
    logits: np.ndarray
    mtp: np.ndarray
    stage_forward: np.ndarray
    recompute: np.ndarray
    per_microbatch: np.ndarray


def expert_load(plan: Plan):
    """Tokens the busiest expert device computes, over the mean [1]: the routing's
    imbalance, cut to the capacity factor when tokens beyond it are dropped. Without
    expert parallelism (``ep`` 1) every device holds every expert, or a tensor slice of
    each, and computes its share of every token: 1, whatever the routing."""
    load = where(plan.capacity_factor > 0, minimum(plan.expert_imbalance, plan.capacity_factor),
                 plan.expert_imbalance)
    return where(plan.ep > 1, load, 1.0)


def compute(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout, act: Activations) -> Compute:
    roof = hw.roofline()
    h, t, tok = sizes.hidden_size, plan.tp, lay.tokens
    dense = cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=sizes.dense_matmul_params / (h * t),
                         element_bytes=ACTIVATION_BYTES, **roof)
    if sizes.experts:
        # tokens each local expert gets on the busiest device
        # tokens each local expert gets on the busiest device: its share of the tokens of
        # the t / etp tensor-parallel ranks that hold whole experts together
        etp = plan.etp
        per_expert = tok * etp / t * sizes.experts_per_token * plan.ep / sizes.experts * expert_load(plan)
        experts = (sizes.experts / plan.ep) * cw.gemm_time(
            gemm_m=per_expert, gemm_k=h, gemm_n=sizes.expert_params_one / (h * etp),
            element_bytes=ACTIVATION_BYTES, **roof) * sizes.moe_layers / sizes.layers    # average layer
    else:
        experts = 0.0
    score_flops = cw.attention_score_flops(layers=1.0, heads=sizes.heads, head_dim=sizes.attention_head_dim,
                                           context_len=lay.context) * tok / t
    attention = cw.roofline_time(flops=score_flops, bytes_moved=0.0, **hw.attention_roofline(plan.flash_attention))
    # every stored activation written, then read; in FP8 each matrix multiply's input and
    # output gradient is also cast (and transposed) on its way in, a third of it forward
    elementwise = cw.roofline_time(flops=0.0, bytes_moved=2 * act.kept + hw.cast_bytes * gemm_elements(sizes, plan)
                                   / 3 * lay.tokens, **roof)
    layer_forward = dense + experts + attention + elementwise
    logits_bytes = mw.logits_memory(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                                    vocab_size=sizes.vocab_size, tp=t, logit_bytes=4.0)
    logits = (cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=sizes.vocab_size / t, element_bytes=ACTIVATION_BYTES,
                           **roof)
              + cw.roofline_time(flops=0.0, bytes_moved=2 * logits_bytes, **roof))
    # an MTP module: one more layer, the 2h -> h projection and the output head again
    mtp = sizes.mtp_modules * (layer_forward + logits + cw.gemm_time(
        gemm_m=tok, gemm_k=2 * h, gemm_n=h / t, element_bytes=ACTIVATION_BYTES, **roof))
    scores = cw.roofline_time(flops=0.0, bytes_moved=where(plan.flash_attention > 0, 0.0,
                                                               2 * (act.everything - act.selective)), **roof)
    # full: the layers' forward again; selective: the attention scores again; FlashAttention
    # recomputes the scores in its backward pass whatever the setting (Dao et al. 2022)
    # selective by module: the modules' matrix multiplies forward again, and every byte they
    # rebuild written once more (the latent up-projections, the dense MLP, the shared
    # experts, the routed experts)
    mode, bit = pl.recompute_mode(plan.recompute), module_bits(plan)
    dense_share = (bit["mlp"] * sizes.mlp_params_avg + where(bit["moe"] > 0, sizes.shared_params_avg,
                                                              bit["shared_experts"] * sizes.shared_params_avg)
                   + bit["mla_up_proj"] * sizes.mla_up_params) / sizes.dense_matmul_params
    modules = (dense * dense_share + experts * bit["moe"]
               + cw.roofline_time(flops=0.0, bytes_moved=act.modules, **roof))
    layer_recompute = where(mode == 2, layer_forward,
                            where((mode == 1) | (plan.flash_attention > 0), attention + scores, 0.0)
                            + where(mode == 1, modules, 0.0))
    # each stage: its layers, the embedding (first: negligible), the output layer and any
    # MTP modules (last); the slowest sets the pipeline's pace
    single = plan.pp <= 1
    last_forward = lay.last_layers * layer_forward + logits + mtp
    candidates = [(where(single, last_forward, lay.first_layers * layer_forward), lay.first_layers),
                  (lay.middle_layers * layer_forward, lay.middle_layers),
                  (last_forward, lay.last_layers + sizes.mtp_modules)]
    totals = [3 * f + n * layer_recompute for f, n in candidates]
    stage_forward, per_microbatch = at_largest(totals, [f for f, _ in candidates], totals)
    return Compute(dense_gemm=dense, expert_gemm=experts, attention=attention, elementwise=elementwise,
                   layer_forward=layer_forward, logits=logits, mtp=mtp, stage_forward=stage_forward,
                   recompute=per_microbatch - 3 * stage_forward, per_microbatch=per_microbatch)


def gemm_elements(sizes: ModelSizes, plan: Plan):
    """Elements per token and layer that enter a layer's matrix multiplies in training
    and would be cast to FP8: forward, the inputs of the QKV, output-projection, MLP-in
    and MLP-out GEMMs (3 h + a d_h + f_act); backward, the gradients of their outputs
    (a d_h + 2 a_kv d_h, h, (n_mlp - 1) f_act, h), split by tensor parallelism."""
    h, f = sizes.hidden_size, sizes.ffn_activation_width
    q = sizes.heads * sizes.activation_head_dim
    kv = 2 * sizes.activation_kv_heads * sizes.activation_head_dim
    return (3 * h + q + f + q + kv + 2 * h + (sizes.mlp_matrices - 1) * f) / plan.tp


def tensor_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Tensor-parallel all-reduces per micro-batch [s]: 2 forward and 2 backward per
    layer of b s h activations (Narayanan et al. 2021 Sec. 2.3), 2 more with full
    recomputation."""
    per_layer = 4 + 2 * (plan.recompute == 2)
    return lay.stage_layers * per_layer * net.all_reduce(lay.tokens * sizes.hidden_size * ACTIVATION_BYTES,
                                                         plan.tp, 1.0, hw)


def expert_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Expert-parallel all-to-alls per micro-batch [s] on the slowest stage's MoE layers:
    dispatch and combine forward, their mirror images backward (and again when
    recomputing), over the expert group (ranks expert_tp apart), waiting for the busiest
    device. ``alltoall`` sends every (token, expert) copy in 16 bits; ``deepep`` sends a
    token once per remote node (at most as many as the group-limited routing allows) and
    forwards it inside the node, dispatching in FP8 when the matrix multiplies run in FP8
    (DeepSeek-V3 report Sec. 3.2.2 and 3.3.3: dispatch and the gradient before the
    down-projection in FP8, combine in BF16)."""
    if not sizes.experts:
        return np.zeros_like(lay.tokens) if np.ndim(lay.tokens) else np.float64(0.0)
    # dispatch + combine, forward, backward, and again when the MoE block is recomputed
    calls = 2 + ((plan.recompute == 2) | (module_bits(plan)["moe"] > 0))
    # each rank dispatches its share of the tokens when sequence parallelism splits them or
    # the experts are split fewer ways than the dense layers; the expert group's ranks are
    # expert_tp apart: Megatron-Core builds the expert groups with a rank generator of their
    # own (tp = expert_tp, ep, dp = expert data parallel, pp, cp = 1; parallel_state.
    # initialize_model_parallel), which folds the context-parallel ranks into ep and the
    # expert data-parallel group
    etp = plan.etp
    tokens = lay.tokens / where((plan.sequence_parallel > 0) | (etp < plan.tp), plan.tp, 1.0)
    S = tokens * sizes.experts_per_token * sizes.hidden_size * ACTIVATION_BYTES
    plain = 2 * net.all_to_all(S, plan.ep, etp, hw)
    cap = None
    if sizes.expert_groups:
        # a token reaches at most groups_per_token groups of experts; a domain holds
        # experts / n2 of them
        def cap(n2):
            return minimum(n2, maximum(sizes.groups_per_token * n2 / sizes.expert_groups,
                                             sizes.groups_per_token))
    dispatch_bytes = where(hw.cast_bytes > 0, 1.0, ACTIVATION_BYTES)
    disp, comb = net.expert_calls(tokens, sizes.experts_per_token, sizes.hidden_size, plan.ep, dispatch_bytes, hw,
                                  True, stride=etp, domain_cap=cap)
    deep = disp + comb
    per_layer = where(plan.ep_dispatcher == 1, deep, plain) * expert_load(plan)
    moe_layers = sizes.moe_layers * lay.stage_share
    return where(plan.ep > 1, moe_layers * calls * per_layer, 0.0)


def context_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Context-parallel ring passes of K and V per micro-batch [s]: c - 1 passes per
    layer forward, 2 backward (K, V and their gradients), once more when recomputing."""
    S = lay.tokens * 2 * sizes.activation_kv_heads * sizes.activation_head_dim * ACTIVATION_BYTES / plan.tp
    inside = plan.cp * plan.tp <= hw.scale_up_domain_size
    passes = 3 + (plan.recompute == 2)
    return lay.stage_layers * passes * (plan.cp - 1) * net.point_to_point(S, inside, hw)


def pipeline_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Pipeline sends per micro-batch [s]: activations forward and gradients backward
    at each of the stage's v chunk boundaries, split over the tensor group (the
    scatter/gather optimisation, Narayanan et al. 2021 Sec. 4.1), and the handshakes of
    the v - 1 extra chunks (:func:`handshakes`)."""
    S = lay.tokens * sizes.hidden_size * ACTIVATION_BYTES / plan.tp
    inside = plan.tp * plan.cp * plan.dp * plan.pp <= hw.scale_up_domain_size
    return where(plan.pp > 1, 2 * plan.interleave * net.point_to_point(S, inside, hw) + handshakes(plan), 0.0)


def handshakes(plan: Plan):
    """What the interleaved schedule's extra chunks cost per micro-batch beyond their
    compute and sends [s], shown whatever the overlap."""
    return cm.interleave_handshakes(interleave=plan.interleave, chunk_overhead=plan.chunk_overhead_s)


@dataclass(frozen=True)
class Parameters:
    """Parameters per device before ZeRO sharding [count]: the dense ones (layers of
    the heaviest stage and its embeddings, split by tensor parallelism) and the routed
    experts' (split by expert and tensor parallelism), with the data-parallel group
    each is reduced over: ``groups`` holds (parameters, group size, rank stride)."""

    dense: np.ndarray
    experts: np.ndarray
    groups: tuple

    @property
    def total(self):
        return self.dense + self.experts


def parameters(sizes: ModelSizes, plan: Plan, lay: Layout) -> Parameters:
    """Dense weights are reduced over d x c ranks t apart; expert weights, split e ways
    and over ``expert_tp`` ranks, over the t d c / (e etp) replicas of each expert (ranks
    etp x e apart), as in Megatron-Core's expert-data-parallel group (see
    :func:`expert_comm` for how it folds the context-parallel ranks in)."""
    extra_output = (sizes.embedding_copies - 1) * sizes.vocab_size * sizes.hidden_size
    embeddings = where(plan.pp > 1, sizes.embedding_params, sizes.embedding_params + extra_output)
    dense = (sizes.layer_params * lay.stage_share + embeddings) / plan.tp
    etp = plan.etp
    experts = sizes.expert_params * lay.stage_share / (plan.ep * etp)
    groups = ((dense, plan.dp * plan.cp, plan.tp),)
    if sizes.experts:
        groups += ((experts, plan.tp * plan.dp * plan.cp / (plan.ep * etp), etp * plan.ep),)
    return Parameters(dense=dense, experts=experts, groups=groups)


@dataclass(frozen=True)
class DataParallel:
    """Data-parallel and ZeRO traffic [s]. Per micro-batch, of sharded states (class
    ``zero``): ZeRO-2's gradient reduce-scatter after each backward pass; ZeRO-3 / FSDP's
    two weight gathers (before the forward and before the backward, which also serves
    the recomputation) and its gradient reduce-scatter, layer by layer. Once per step
    (class ``dp``): ZeRO-0's all-reduce, or ZeRO-1's reduce-scatter, of the gradients
    (``reduce``); ZeRO-1 and 2's all-gather of the updated weights (``gather``). Each
    collective is issued per layer (per model chunk with pipeline parallelism, as
    Megatron-Core buckets them), paying its call latency on its own group."""

    per_microbatch: np.ndarray
    reduce: np.ndarray
    gather: np.ndarray
    chunks: np.ndarray


def data_parallel(plan: Plan, hw: Hardware, lay: Layout, params: Parameters) -> DataParallel:
    # per-step collectives go in one call per model chunk (pp > 1) or per layer (pp = 1)
    # (nemo-comm-overlap); ZeRO's per-micro-batch ones layer by layer
    chunks = where(plan.pp > 1, plan.interleave, lay.stage_layers)

    def calls(op, bytes_per_param, n_calls):
        return sum(n_calls * op(P * bytes_per_param / n_calls, n, stride, hw) for P, n, stride in params.groups)

    layers = lay.stage_layers
    z = plan.zero_stage

    def when(stage, op, bytes_per_param, n_calls):
        # priced only where some plan of the grid runs it (a single plan runs one branch)
        return calls(op, bytes_per_param, n_calls) if (stage if type(stage) is np.bool_ else np.any(stage)) else 0.0

    grads = when(z >= 2, net.reduce_scatter, plan.grad_bytes, layers)
    zero = where(z == 3, 2 * when(z == 3, net.reduce_scatter, 2.0, layers) + grads, where(z == 2, grads, 0.0))
    reduce = where(z == 0, when(z == 0, net.all_reduce, plan.grad_bytes, chunks),
                   where(z == 1, when(z == 1, net.reduce_scatter, plan.grad_bytes, chunks), 0.0))
    gather = where((z == 1) | (z == 2), when((z == 1) | (z == 2), net.reduce_scatter, 2.0, chunks), 0.0)
    return DataParallel(per_microbatch=zero, reduce=reduce, gather=gather, chunks=chunks)


@dataclass(frozen=True)
class Memory:
    """Memory per device before offload [bytes]: model states (ZeRO, Rajbhandari et
    al. 2019), the activations of the most loaded stage (Korthikanti et al. 2022
    Sec. 4.2.3), the buffers of gathered weights and unreduced gradients that ZeRO-2/3 and
    FSDP work with, and one layer's activations per micro-batch as recomputation keeps them."""

    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    buffers: np.ndarray
    per_layer: np.ndarray
    layered: np.ndarray = 0.0


def memory(sizes: ModelSizes, plan: Plan, lay: Layout, act: Activations, params: Parameters,
           weight_copy_bytes=0.0) -> Memory:
    """``weight_copy_bytes``: bytes per weight of the FP8 copies FP8 training keeps beside
    the 16-bit weights (:data:`snlab.hardware.FP8_WEIGHT_COPY_BYTES`; 0 in 16-bit training).
    With ``fp8_params`` the weights themselves are kept in FP8 (Megatron-Core's fp8_param):
    one byte each, and no copy beside them."""
    weight_bytes = where(plan.fp8_params > 0, 1.0, 2.0)
    weight_copy_bytes = where(plan.fp8_params > 0, 0.0, weight_copy_bytes)

    def states(formula):
        return sum(formula.evaluate(dict(params_per_device=P, weight_bytes=weight_bytes, grad_bytes=plan.grad_bytes,
                                         optimizer_bytes=plan.optimizer_bytes, zero_stage=plan.zero_stage,
                                         zero_shards=n))
                   for P, n, _ in params.groups)

    r = pl.recompute_mode(plan.recompute)
    per_layer = act.stored
    # ZeRO-3 / FSDP hold the current and the prefetched layer's gathered weights and
    # one layer's full gradients before their reduce-scatter (PyTorch FSDP's
    # limit_all_gathers: two units at a time); ZeRO-2 one layer's gradient bucket
    layer_params = params.total / lay.stage_layers
    buffers = where(plan.zero_stage == 3, layer_params * (2 * weight_bytes + plan.grad_bytes),
                       where(plan.zero_stage == 2, layer_params * plan.grad_bytes, 0.0))
    # FP8 copies of the weights a device holds whole (the two gathered layers under ZeRO-3)
    buffers = buffers + weight_copy_bytes * where(plan.zero_stage == 3, 2 * layer_params, params.total)
    # the layer being recomputed holds its full activations (full), or its attention
    # scores again (selective without FlashAttention) while its backward runs
    working = where(r == 2, act.kept, act.rebuilt)
    logits = mw.logits_memory(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                              vocab_size=sizes.vocab_size, tp=plan.tp, logit_bytes=plan.logit_bytes) \
        * (1 + sizes.mtp_modules)

    def stage(layers, rank):
        in_flight = mw.stage_in_flight(pp=plan.pp, interleave=plan.interleave, micro_batches=lay.micro_batches,
                                       stage_rank=rank)
        return mw.activation_memory_stage(activation_memory=per_layer, stage_layers=layers, in_flight=in_flight)

    # the first stage holds the most micro-batches; the second the most among the middle
    # ones; the last also keeps the output logits and the MTP modules' layers
    last_layers = stage(lay.last_layers + sizes.mtp_modules, plan.pp - 1)
    last = last_layers + logits
    heavier = maximum(stage(lay.first_layers, 0.0), stage(lay.middle_layers, 1.0))
    acts = where(plan.pp > 1, maximum(heavier, last), last) + working
    # what the layers themselves keep (what offload can move): neither the logits the loss
    # is computed from nor the layer being recomputed
    layered = where(plan.pp > 1, maximum(heavier, last_layers), last_layers)
    return Memory(weights=states(mw.weight_memory), grads=states(mw.grad_memory),
                  optimizer=states(mw.optimizer_memory), activations=acts, buffers=buffers, per_layer=per_layer,
                  layered=layered)


def stage_memory(sizes: ModelSizes, plan: Plan, hw: Hardware) -> list[dict]:
    """Memory of each pipeline stage of one plan [bytes], before offload: its weights,
    gradients and optimizer state (its own layers; the embedding on the first stage, the
    output layer on the last), the activations of the micro-batches it holds in flight
    (:data:`~snlab.walls.memory.stage_in_flight`; the last also keeps the logits and the
    MTP modules), and the buffers of :func:`memory`. The planner's memory is the largest
    of these."""
    lay, act = layout(sizes, plan), activations(sizes, plan)
    pp = int(plan.pp)
    per_stage = stages.stage_layers(int(sizes.layers), pp, int(plan.first_stage_layers), int(plan.last_stage_layers),
                                    int(stages.sizes_tail(sizes)))
    output = sizes.vocab_size * sizes.hidden_size
    rows = []
    weight_bytes = 1.0 if plan.fp8_params > 0 else 2.0
    copy_bytes = 0.0 if plan.fp8_params > 0 else hw.weight_copy_bytes
    for rank, n in enumerate(per_stage):
        last = rank == pp - 1
        layers = n + (sizes.mtp_modules if last else 0.0)
        emb = (sizes.embedding_params if rank == 0 else 0.0) + (output if last else 0.0)
        if pp == 1:
            emb = sizes.embedding_params + (sizes.embedding_copies - 1) * output
        dense = (sizes.layer_params * layers / sizes.layers + emb) / plan.tp
        experts = sizes.expert_params * layers / sizes.layers / (plan.ep * plan.etp)
        groups = ((dense, plan.dp * plan.cp), (experts, plan.tp * plan.dp * plan.cp / (plan.ep * plan.etp)))

        def states(formula):
            return sum(float(formula.evaluate(dict(params_per_device=P, weight_bytes=float(weight_bytes),
                                                   grad_bytes=plan.grad_bytes,
                                                   optimizer_bytes=plan.optimizer_bytes, zero_stage=plan.zero_stage,
                                                   zero_shards=d))) for P, d in groups)
        in_flight = float(mw.stage_in_flight(pp=plan.pp, interleave=plan.interleave, micro_batches=lay.micro_batches,
                                             stage_rank=rank))
        logits = float(mw.logits_memory(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                                        vocab_size=sizes.vocab_size, tp=plan.tp, logit_bytes=plan.logit_bytes)
                       * (1 + sizes.mtp_modules)) if last else 0.0
        working = float(where(pl.recompute_mode(plan.recompute) == 2, act.kept, act.rebuilt))
        acts = float(act.stored) * layers * in_flight + logits + working
        local = dense + experts
        per_layer = local / max(layers, 1.0)
        buffers = float(where(plan.zero_stage == 3, per_layer * (2 * weight_bytes + plan.grad_bytes),
                              where(plan.zero_stage == 2, per_layer * plan.grad_bytes, 0.0))
                        + copy_bytes * where(plan.zero_stage == 3, 2 * per_layer, local))
        weights, grads, optimizer = (states(f) for f in (mw.weight_memory, mw.grad_memory, mw.optimizer_memory))
        rows.append(dict(stage=rank, layers=n, in_flight=in_flight, weights=weights, grads=grads, optimizer=optimizer,
                         activations=acts, buffers=buffers, total=weights + grads + optimizer + acts + buffers))
    return rows


@dataclass(frozen=True)
class Offload:
    """What leaves the device and what moving it costs. ``optimizer_far`` and
    ``activations_far`` [bytes] go to the far tier (a supernode's pool when it has
    room, else host memory), whose free ``capacity`` [bytes] and link ``bandwidth``
    [bytes/s] apply; ``optimizer_transfer`` [s per step], ``activation_transfer`` [s
    per micro-batch], and the ``optimizer_step`` [s] where it runs."""

    optimizer_far: np.ndarray
    activations_far: np.ndarray
    in_pool: np.ndarray
    bandwidth: np.ndarray
    capacity: np.ndarray
    optimizer_transfer: np.ndarray
    activation_transfer: np.ndarray
    optimizer_step: np.ndarray


def offload(plan: Plan, hw: Hardware, lay: Layout, mem: Memory, params: Parameters) -> Offload:
    """A supernode's pool is its peers' memory: what the devices outside the job lend
    (:meth:`~snlab.hardware.Hardware.free_pool`) is free for offload; anything else goes
    to host memory.
    Optimizer state on the host is updated by the CPU, so the gradients go out and the
    weights come back once per step (ZeRO-Offload), and the step itself streams the
    states through host DRAM; in the pool the device updates it in place, reading and
    writing the states over the bus. Each micro-batch's
    activations beyond the two layers kept go out and come back."""
    off_opt = (plan.offload == 1) | (plan.offload == 3)
    off_act = (plan.offload == 2) | (plan.offload == 3)
    o_far = where(off_opt, mem.optimizer, 0.0)
    # the layers' activations beyond the two kept, or those of offload_layers of them
    # (Megatron-Core's cpu_offloading_num_layers): that share of the stage's layers
    share = where(plan.offload_layers > 0, minimum(plan.offload_layers / lay.stage_layers, 1.0), 1.0)
    a_far = where(off_act, share * maximum(mem.layered - 2 * mem.per_layer, 0.0), 0.0)
    domain = hw.scale_up_domain_size
    in_domain = minimum(lay.devices, domain)
    pool_free = hw.free_pool(in_domain) / in_domain
    in_pool = (hw.pool_bandwidth > 0) & (o_far + a_far <= pool_free)
    bandwidth = where(in_pool, hw.pool_bandwidth, hw.host_bandwidth)
    opt_params = sum(P / where(plan.zero_stage >= 1, n, 1.0) for P, n, _ in params.groups)
    moved = where(in_pool, opt_params * plan.optimizer_bytes, opt_params * (plan.grad_bytes + 2.0))
    traffic = mw.optimizer_step_traffic(params_per_device=opt_params, grad_bytes=plan.grad_bytes,
                                        optimizer_bytes=plan.optimizer_bytes, weight_bytes=2.0)
    # on the host the CPU's Adam streams the same bytes through host DRAM, at its peak
    # bandwidth per device at best (ZeRO-Offload's CPU-Adam is memory-bound too)
    host_step = cw.roofline_time(flops=0.0, bytes_moved=traffic, **hw.host_roofline())
    step = where(off_opt & ~in_pool, host_step, cw.roofline_time(flops=0.0, bytes_moved=traffic, **hw.roofline()))
    out_mb = share * maximum(mem.per_layer * lay.stage_layers - 2 * mem.per_layer, 0.0)
    return Offload(optimizer_far=o_far, activations_far=a_far, in_pool=in_pool, bandwidth=bandwidth,
                   capacity=where(in_pool, pool_free, hw.host_capacity),
                   optimizer_transfer=where(off_opt, moved / bandwidth, 0.0),
                   activation_transfer=where(off_act, 2 * out_mb / bandwidth, 0.0), optimizer_step=step)


@dataclass(frozen=True)
class Schedule:
    """The step [s]: one micro-batch with its overlapped communication, the bubble, the
    exposed once-per-step data-parallel traffic, the optimizer and its offload; with
    what each class of communication leaves exposed over the step, and the compute time
    lost to contention with what was hidden."""

    microbatch: np.ndarray
    bubble_fraction: np.ndarray
    bubble: np.ndarray
    dp_exposed: np.ndarray
    step: np.ndarray
    exposed: dict
    contention: np.ndarray


def hideable(plan: Plan, hw: Hardware, lay: Layout, comp: Compute, comm: dict) -> dict:
    """What each per-micro-batch class could hide at its overlap level [s]: behind the
    micro-batch's compute (ring attention behind the attention blocks only), never the
    part that must show. One layer's ZeRO/FSDP collectives show (the first gather, the
    last reduce-scatter), and so do the interleaved schedule's handshakes. Tensor-parallel
    collectives overlap only with sequence parallelism and inside one scale-up domain
    (Transformer Engine's userbuffers work over NVLink only: te-userbuffers-domain);
    pipeline sends only with virtual stages (Megatron-Core's overlap_p2p_comm)."""
    attention_window = lay.stage_layers * (3 + (plan.recompute == 2)) * comp.attention
    can = {"tp": (plan.sequence_parallel > 0) & (plan.tp <= hw.scale_up_domain_size), "pp": plan.interleave > 1}
    shows = {"zero": comm["zero"] / lay.stage_layers, "pp": handshakes(plan)}
    out = {}
    for x, time in comm.items():
        window = attention_window if x == "cp" else comp.per_microbatch
        level = plan.overlap(x) * can.get(x, True)
        out[x] = level * minimum(maximum(time - shows.get(x, 0.0), 0.0), window)
    return out


def schedule(plan: Plan, hw: Hardware, lay: Layout, comp: Compute, comm: dict, dp: DataParallel,
             off: Offload) -> Schedule:
    """Per micro-batch, each class hides what :func:`hideable` allows, together never more
    than the compute; every second hidden costs the compute ``overlap_contention``
    (``overlapped_time``). The once-per-step gradient reduction hides behind the last
    micro-batch's backward pass and the weight gather behind the first one's forward,
    each but one chunk (nemo-comm-overlap: 'exposes only one DP communication chunk')."""
    m, kappa = lay.micro_batches, hw.overlap_contention
    parts = dict(comm, offload=off.activation_transfer)
    can = hideable(plan, hw, lay, comp, parts)
    comm_mb = sum(parts.values())
    hidden = minimum(sum(can.values()), comp.per_microbatch)
    shorter = minimum(comp.per_microbatch, comm_mb)
    level = where(shorter > 0, hidden / where(shorter > 0, shorter, 1.0), 0.0)
    mb_time = cm.overlapped_time(compute_time=comp.per_microbatch, comm_time=comm_mb, overlap=level,
                                 overlap_contention=kappa)
    total_can = sum(can.values())
    share = {x: where(total_can > 0, can[x] / where(total_can > 0, total_can, 1.0), 0.0) for x in parts}
    # what each class shows: its time less its share of what was hidden, never below zero
    # (the shares add up to the hidden time only to rounding)
    exposed = {x: m * maximum(parts[x] - hidden * share[x], 0.0) for x in parts}
    dp_time, dp_hidden = _dp_step(plan, comp, dp, hidden)
    # the hidden part of the step's data-parallel traffic runs beside compute as long as itself
    dp_exposed = cm.overlapped_time(compute_time=dp_hidden, comm_time=dp_time, overlap=1.0,
                                    overlap_contention=kappa) - dp_hidden
    exposed["dp"] = maximum(dp_time - dp_hidden, 0.0)
    bubble_fraction = cw.pipeline_bubble_fraction(pp=plan.pp, interleave=plan.interleave, micro_batches=m)
    bubble = bubble_fraction * m * mb_time
    contention = kappa * (m * hidden + dp_hidden)
    return Schedule(microbatch=mb_time, bubble_fraction=bubble_fraction, bubble=bubble, dp_exposed=dp_exposed,
                    step=m * mb_time + bubble + dp_exposed + off.optimizer_step + off.optimizer_transfer,
                    exposed=exposed, contention=contention)


def _dp_step(plan: Plan, comp: Compute, dp: DataParallel, busy=0.0):
    """The once-per-step data-parallel time [s] and how much of it hides: the reduction
    behind the last micro-batch's backward (recomputation included), the gather behind
    the first one's forward, each but one chunk, at the dp overlap level. ``busy`` is the
    compute of a micro-batch that its own communication already hides behind; the
    data-parallel traffic hides only behind the rest, spread evenly over the pass (the
    same seconds of compute cannot hide two transfers)."""
    level = plan.overlap_dp
    free = maximum(1 - busy / where(comp.per_microbatch > 0, comp.per_microbatch, 1.0), 0.0)
    backward = (comp.per_microbatch - comp.stage_forward) * free
    hidden = level * (minimum(dp.reduce * (1 - 1 / dp.chunks), backward)
                      + minimum(dp.gather * (1 - 1 / dp.chunks), comp.stage_forward * free))
    return dp.reduce + dp.gather, hidden


@dataclass(frozen=True)
class Utilisation:
    """Model and hardware FLOPs of the step [FLOP] and their utilisation [1].

    MFU counts the FLOPs a causal model needs, whatever kernel runs it: the matrix
    products and half the attention scores (each token attends to those before it), the
    convention of Megatron-Bridge's performance tables. PaLM (Chowdhery et al. 2022
    App. B) and the Megatron-LM papers (Narayanan et al. 2021 Eq. 3, Korthikanti et al.
    2022 Eq. 7) count the scores in full; that count is kept as ``palm_flops`` and shown
    as TFLOP/s only, since over sequences longer than about twelve times the hidden size
    it exceeds what the hardware executes and its "utilisation" could pass 1. HFU counts
    what the hardware executes: the recomputed forward, and half the scores with causal
    FlashAttention (the full square when the scores are materialised)."""

    model_flops: np.ndarray
    palm_flops: np.ndarray
    hardware_flops: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray


def utilisation(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout, sched: Schedule) -> Utilisation:
    tokens = plan.global_batch * plan.seq_len
    # multi-token-prediction modules are trained with the model: their layer, projection
    # and output head count as model FLOPs
    matmul, layers = sizes.matmul_params + sizes.mtp_matmul_params, sizes.layers + sizes.mtp_modules

    def forward(context):
        return cw.forward_flops_per_token(matmul_params=matmul, vocab_size=sizes.vocab_size,
                                          hidden_size=sizes.hidden_size, layers=layers, heads=sizes.heads,
                                          head_dim=sizes.attention_head_dim, context_len=context)

    def util(flops):
        return cw.flops_utilisation(step_flops=flops, time=sched.step, group_size=lay.devices,
                                    peak_flops=hw.peak_flops)

    model_flops = cw.model_step_flops(tokens=tokens, forward_flops_per_token=forward(plan.seq_len / 2))
    palm_flops = cw.model_step_flops(tokens=tokens, forward_flops_per_token=forward(plan.seq_len))
    # FlashAttention recomputes the scores in its backward pass even without recomputation
    mode = pl.recompute_mode(plan.recompute)
    recompute = where((plan.flash_attention > 0) & (mode == 0), 1.0, mode)
    hardware_flops = cw.hardware_step_flops(tokens=tokens, forward_flops_per_token=forward(lay.context),
                                            recompute=recompute, matmul_params=matmul,
                                            layers=layers, heads=sizes.heads, head_dim=sizes.attention_head_dim,
                                            context_len=lay.context)
    return Utilisation(model_flops=model_flops, palm_flops=palm_flops, hardware_flops=hardware_flops,
                       mfu=util(model_flops), hfu=util(hardware_flops))


@dataclass(frozen=True)
class Walls:
    """The step's time by wall [s]: compute (forward, backward, optimizer), memory
    (recomputation, offload) and communication (what is exposed, and the compute lost to
    contention with what is hidden), with the bubble shared out like a micro-batch's time."""

    compute: np.ndarray
    memory: np.ndarray
    communication: np.ndarray


def walls(lay: Layout, comp: Compute, sched: Schedule, off: Offload) -> Walls:
    m, mb = lay.micro_batches, sched.microbatch
    bubble_compute = sched.bubble * minimum(comp.per_microbatch / where(mb > 0, mb, 1.0), 1.0)
    per = where(comp.per_microbatch > 0, comp.per_microbatch, 1.0)
    compute_s = m * 3 * comp.stage_forward + off.optimizer_step + bubble_compute * 3 * comp.stage_forward / per
    memory_s = (m * comp.recompute + off.optimizer_transfer + sched.exposed["offload"]
                + bubble_compute * comp.recompute / per)
    comm_s = (sum(sched.exposed[x] for x in EXPOSED_COMM) + sched.contention + sched.bubble - bubble_compute)
    return Walls(compute=compute_s, memory=memory_s, communication=comm_s)


def step_columns(sizes: ModelSizes, plan: Plan, hw: Hardware) -> dict[str, np.ndarray]:
    """Evaluate the training step for every plan of the grid: the chain of parts, laid
    out as output columns named with their units (``step_time_s``, ``mfu``, ...)."""
    lay = layout(sizes, plan)
    act = activations(sizes, plan)
    comp = compute(sizes, plan, hw, lay, act)
    params = parameters(sizes, plan, lay)
    dp = data_parallel(plan, hw, lay, params)
    comm = {"tp": tensor_comm(sizes, plan, hw, lay), "ep": expert_comm(sizes, plan, hw, lay),
            "cp": context_comm(sizes, plan, hw, lay), "pp": pipeline_comm(sizes, plan, hw, lay),
            "zero": dp.per_microbatch}
    mem = memory(sizes, plan, lay, act, params, hw.weight_copy_bytes)
    off = offload(plan, hw, lay, mem, params)
    sched = schedule(plan, hw, lay, comp, comm, dp, off)
    return columns(plan, hw, lay, comp, comm, dp, mem, off, sched, utilisation(sizes, plan, hw, lay, sched),
                   walls(lay, comp, sched, off), params)


def columns(plan, hw, lay, comp, comm, dp, mem, off, sched, util, wall, params) -> dict[str, np.ndarray]:
    """The parts laid out as the step's output columns."""
    m, step, ex = lay.micro_batches, sched.step, sched.exposed
    optimizer = mem.optimizer - off.optimizer_far
    activations = mem.activations - off.activations_far
    total = mem.weights + mem.grads + optimizer + activations + mem.buffers
    far = off.optimizer_far + off.activations_far
    # the step's shape and the memory's (a sweep of HBM changes fits, not always the step)
    usable, capacity = hw.usable_memory, hw.hbm_capacity
    shape = () if type(step) is type(usable) is type(capacity) is np.float64 else \
        broadcast_shape(np.shape(step), np.shape(usable), np.shape(capacity))
    usable, capacity = spread(usable, shape), spread(capacity, shape)
    return {
        "devices": lay.devices, "micro_batches": m,
        "step_time_s": step, "mfu": util.mfu, "hfu": util.hfu,
        "model_tflops_per_device": util.model_flops / step / lay.devices / 1e12,
        "palm_tflops_per_device": util.palm_flops / step / lay.devices / 1e12,
        "hardware_tflops_per_device": util.hardware_flops / step / lay.devices / 1e12,
        "tokens_per_s": plan.global_batch * plan.seq_len / step,
        "tokens_per_s_per_device": plan.global_batch * plan.seq_len / step / lay.devices,
        "time_compute_s": m * comp.per_microbatch, "time_recompute_s": m * comp.recompute,
        **{f"time_{x}_s": m * comm[x] for x in ("tp", "ep", "cp", "pp", "zero")},
        "time_dp_s": dp.reduce + dp.gather, "time_bubble_s": sched.bubble,
        "time_optimizer_s": off.optimizer_step,
        "time_offload_s": off.optimizer_transfer + m * off.activation_transfer,
        "time_contention_s": sched.contention,
        **{f"exposed_{x}_s": ex[x] for x in COMM_CLASSES},
        "exposed_comm_s": sum(ex[x] for x in EXPOSED_COMM),
        "bubble_fraction": sched.bubble_fraction,
        "memory_weights_bytes": mem.weights, "memory_grads_bytes": mem.grads, "memory_optimizer_bytes": optimizer,
        "memory_activations_bytes": activations, "memory_buffers_bytes": mem.buffers, "memory_total_bytes": total,
        "memory_capacity_bytes": capacity, "memory_usable_bytes": usable,
        "memory_headroom_bytes": usable - total,
        "memory_offloaded_bytes": far, "offload_capacity_bytes": off.capacity,
        "fits": (total <= usable) & (far <= off.capacity),
        "wall_compute_s": wall.compute, "wall_communication_s": wall.communication, "wall_memory_s": wall.memory,
        "params_per_device": params.total,
    }
