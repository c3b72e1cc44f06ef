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
from ..hardware import ACTIVATION_BYTES, Hardware
from ..sizing import ModelSizes
from ..walls import communication as cm
from ..walls import compute as cw
from ..walls import memory as mw
from .plan import Plan

#: the classes of communication, in the order the outputs list them
COMM_CLASSES = ("tp", "ep", "cp", "pp", "dp", "offload")


@dataclass(frozen=True)
class Layout:
    """How a plan lays the model out: devices, micro-batches per step ``m``, tokens per
    micro-batch on one device before sequence parallelism, the layers of the most
    loaded stage and their share of the model, and the keys each query attends to."""

    devices: np.ndarray
    micro_batches: np.ndarray
    tokens: np.ndarray
    stage_layers: np.ndarray
    stage_share: np.ndarray
    context: np.ndarray


def layout(sizes: ModelSizes, plan: Plan) -> Layout:
    """Stages may be uneven: the heaviest holds ceil(L / (p v)) layers per chunk. Causal
    FlashAttention skips the masked half of the scores (Dao 2023, FlashAttention-2,
    Sec. 3.1); materialised scores are computed in full."""
    stage_layers = np.ceil(sizes.layers / (plan.pp * plan.interleave)) * plan.interleave
    return Layout(devices=plan.devices, micro_batches=plan.micro_batches,
                  tokens=plan.micro_batch * plan.seq_len / plan.cp, stage_layers=stage_layers,
                  stage_share=stage_layers / sizes.layers,
                  context=np.where(plan.flash_attention > 0, 0.5, 1.0) * plan.seq_len)


@dataclass(frozen=True)
class Activations:
    """Activation bytes one layer keeps for one micro-batch [bytes]: everything (scores
    included), without the scores (selective), the layer input only (full), and what a
    layer really keeps without recomputation (FlashAttention never stores the scores)."""

    everything: np.ndarray
    selective: np.ndarray
    full: np.ndarray
    kept: np.ndarray


def activation_inputs(sizes: ModelSizes, plan: Plan) -> dict:
    """The inputs of the memory wall's activation formula for this plan."""
    return dict(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch, hidden_size=sizes.hidden_size,
                heads=sizes.heads, tp=plan.tp, kv_heads=sizes.activation_kv_heads,
                head_dim=sizes.activation_head_dim, ffn_activation_width=sizes.ffn_activation_width,
                mlp_matrices=sizes.mlp_matrices, sequence_parallel=plan.sequence_parallel,
                activation_bytes=ACTIVATION_BYTES)


def activations(sizes: ModelSizes, plan: Plan) -> Activations:
    """Korthikanti et al. 2022 Table 2, one branch per recomputation choice."""
    inputs = activation_inputs(sizes, plan)
    per_layer = mw.activation_memory_per_layer
    everything = per_layer.partial(recompute=0).evaluate(inputs)
    selective = per_layer.partial(recompute=1).evaluate(inputs)
    full = per_layer.partial(recompute=2).evaluate(inputs)
    return Activations(everything=everything, selective=selective, full=full,
                       kept=np.where(plan.flash_attention > 0, selective, everything))


@dataclass(frozen=True)
class Compute:
    """Compute per micro-batch on the slowest (last) stage [s]: one layer's forward
    parts, the stage's forward (layers, logits), the recomputation, and the total
    (forward + a backward twice as long + recomputation)."""

    dense_gemm: np.ndarray
    expert_gemm: np.ndarray
    attention: np.ndarray
    elementwise: np.ndarray
    layer_forward: np.ndarray
    logits: np.ndarray
    stage_forward: np.ndarray
    recompute: np.ndarray
    per_microbatch: np.ndarray


def compute(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout, act: Activations) -> Compute:
    roof = hw.roofline()
    h, t, tok = sizes.hidden_size, plan.tp, lay.tokens
    dense = cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=sizes.dense_matmul_params / (h * t),
                         element_bytes=ACTIVATION_BYTES, **roof)
    if sizes.experts:
        per_expert = tok * sizes.experts_per_token * plan.ep / sizes.experts     # tokens each local expert gets
        experts = (sizes.experts / plan.ep) * cw.gemm_time(
            gemm_m=per_expert, gemm_k=h, gemm_n=sizes.expert_params_one / (h * t),
            element_bytes=ACTIVATION_BYTES, **roof) * sizes.moe_layers / sizes.layers    # average layer
    else:
        experts = 0.0
    score_flops = cw.attention_score_flops(layers=1.0, heads=sizes.heads, head_dim=sizes.attention_head_dim,
                                           context_len=lay.context) * tok / t
    attention = cw.roofline_time(flops=score_flops, bytes_moved=0.0, **roof)
    elementwise = cw.roofline_time(flops=0.0, bytes_moved=2 * act.kept, **roof)   # written, then read
    layer_forward = dense + experts + attention + elementwise
    logits_bytes = mw.logits_memory(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                                    vocab_size=sizes.vocab_size, tp=t, logit_bytes=4.0)
    logits = (cw.gemm_time(gemm_m=tok, gemm_k=h, gemm_n=sizes.vocab_size / t, element_bytes=ACTIVATION_BYTES,
                           **roof)
              + cw.roofline_time(flops=0.0, bytes_moved=2 * logits_bytes, **roof))
    stage_forward = lay.stage_layers * layer_forward + logits
    scores = cw.roofline_time(flops=0.0, bytes_moved=np.where(plan.flash_attention > 0, 0.0,
                                                               2 * (act.everything - act.selective)), **roof)
    # full: the layers' forward again; selective: the attention scores again; FlashAttention
    # recomputes the scores in its backward pass whatever the setting (Dao et al. 2022)
    recompute = np.where(plan.recompute == 2, lay.stage_layers * layer_forward,
                         np.where((plan.recompute == 1) | (plan.flash_attention > 0),
                                  lay.stage_layers * (attention + scores), 0.0))
    return Compute(dense_gemm=dense, expert_gemm=experts, attention=attention, elementwise=elementwise,
                   layer_forward=layer_forward, logits=logits, stage_forward=stage_forward, recompute=recompute,
                   per_microbatch=3 * stage_forward + recompute)


def tensor_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Tensor-parallel all-reduces per micro-batch [s]: 2 forward and 2 backward per
    layer of b s h activations (Narayanan et al. 2021 Sec. 2.3), 2 more with full
    recomputation."""
    per_layer = 4 + 2 * (plan.recompute == 2)
    return lay.stage_layers * per_layer * net.all_reduce(lay.tokens * sizes.hidden_size * ACTIVATION_BYTES,
                                                         plan.tp, 1.0, hw)


def expert_comm(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout):
    """Expert-parallel all-to-alls per micro-batch [s]: dispatch and combine forward,
    their mirror images backward (and again when recomputing), of every token's k
    copies over the expert group (ranks t x c apart)."""
    if not sizes.experts:
        return np.zeros_like(lay.tokens)
    calls = 4 + 2 * (plan.recompute == 2)
    tokens = lay.tokens / np.where(plan.sequence_parallel > 0, plan.tp, 1.0)
    S = tokens * sizes.experts_per_token * sizes.hidden_size * ACTIVATION_BYTES
    return sizes.moe_layers * lay.stage_share * calls * net.all_to_all(S, plan.ep, plan.tp * plan.cp, hw)


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
    scatter/gather optimisation, Narayanan et al. 2021 Sec. 4.1)."""
    S = lay.tokens * sizes.hidden_size * ACTIVATION_BYTES / plan.tp
    inside = plan.tp * plan.cp * plan.dp * plan.pp <= hw.scale_up_domain_size
    return np.where(plan.pp > 1, 2 * plan.interleave * net.point_to_point(S, inside, hw), 0.0)


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
    """Dense weights are reduced over d x c ranks t apart; expert weights, already split
    e ways, over the d x c / e replicas of each expert (ranks t x c x e apart), as in
    Megatron-Core's expert-data-parallel group."""
    extra_output = (sizes.embedding_copies - 1) * sizes.vocab_size * sizes.hidden_size
    embeddings = np.where(plan.pp > 1, sizes.embedding_params, sizes.embedding_params + extra_output)
    dense = (sizes.layer_params * lay.stage_share + embeddings) / plan.tp
    experts = sizes.expert_params * lay.stage_share / (plan.ep * plan.tp)
    groups = ((dense, plan.dp * plan.cp, plan.tp),)
    if sizes.experts:
        groups += ((experts, plan.dp * plan.cp / plan.ep, plan.tp * plan.cp * plan.ep),)
    return Parameters(dense=dense, experts=experts, groups=groups)


@dataclass(frozen=True)
class DataParallel:
    """Data-parallel and ZeRO traffic [s]: per micro-batch (ZeRO-2's gradient
    reduce-scatter after each backward; ZeRO-3's weight gathers for forward and
    backward and its reduce-scatter) and once per step (ZeRO-0's all-reduce; ZeRO-1's
    reduce-scatter; ZeRO-1 and 2's gather of the updated weights)."""

    per_microbatch: np.ndarray
    per_step: np.ndarray


def data_parallel(plan: Plan, hw: Hardware, params: Parameters) -> DataParallel:
    gather_weights = sum(net.reduce_scatter(P * 2.0, n, stride, hw) for P, n, stride in params.groups)
    scatter_grads = sum(net.reduce_scatter(P * plan.grad_bytes, n, stride, hw) for P, n, stride in params.groups)
    reduce_grads = sum(net.all_reduce(P * plan.grad_bytes, n, stride, hw) for P, n, stride in params.groups)
    z = plan.zero_stage
    per_mb = np.where(z == 3, 2 * gather_weights + scatter_grads, np.where(z == 2, scatter_grads, 0.0))
    per_step = np.where(z == 0, reduce_grads,
                        np.where(z == 3, 0.0, np.where(z == 1, scatter_grads, 0.0) + gather_weights))
    return DataParallel(per_microbatch=per_mb, per_step=per_step)


@dataclass(frozen=True)
class Memory:
    """Memory per device before offload [bytes]: model states (ZeRO, Rajbhandari et
    al. 2019), the activations of the most loaded stage (Korthikanti et al. 2022
    Sec. 4.2.3) and one layer's activations per micro-batch as recomputation keeps them."""

    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    per_layer: np.ndarray


def memory(sizes: ModelSizes, plan: Plan, lay: Layout, act: Activations, params: Parameters) -> Memory:
    def states(formula):
        return sum(formula.evaluate(dict(params_per_device=P, weight_bytes=2.0, grad_bytes=plan.grad_bytes,
                                         optimizer_bytes=plan.optimizer_bytes, zero_stage=plan.zero_stage,
                                         zero_shards=n))
                   for P, n, _ in params.groups)

    r = plan.recompute
    per_layer = np.where(r == 2, act.full, np.where(r == 1, act.selective, act.kept))
    # the layer being recomputed holds its full activations (full), or its attention
    # scores again (selective without FlashAttention) while its backward runs
    working = np.where(r == 2, act.kept, np.where(r == 1, act.kept - act.selective, 0.0))
    first = mw.activation_memory_first_stage(activation_memory=per_layer, layers=lay.stage_layers * plan.pp,
                                             pp=plan.pp, in_flight=np.minimum(plan.pp, lay.micro_batches),
                                             interleave=plan.interleave)
    logits = mw.logits_memory(seq_len=plan.seq_len / plan.cp, micro_batch=plan.micro_batch,
                              vocab_size=sizes.vocab_size, tp=plan.tp, logit_bytes=4.0)
    last = per_layer * lay.stage_layers + logits
    acts = np.maximum(np.where(plan.pp > 1, first, first + logits), last) + working
    return Memory(weights=states(mw.weight_memory), grads=states(mw.grad_memory),
                  optimizer=states(mw.optimizer_memory), activations=acts, per_layer=per_layer)


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
    """A supernode's pool is its peers' memory: what the job's own devices in the domain
    do not hold themselves is free for offload; anything else goes to host memory.
    Optimizer state on the host is updated by the CPU, so the gradients go out and the
    weights come back once per step (ZeRO-Offload); in the pool the device updates it
    in place, reading and writing the states over the bus. Each micro-batch's
    activations beyond the two layers kept go out and come back."""
    off_opt = (plan.offload == 1) | (plan.offload == 3)
    off_act = (plan.offload == 2) | (plan.offload == 3)
    o_far = np.where(off_opt, mem.optimizer, 0.0)
    a_far = np.where(off_act, np.maximum(mem.activations - 2 * mem.per_layer, 0.0), 0.0)
    domain = hw.scale_up_domain_size
    in_domain = np.minimum(lay.devices, domain)
    pool_free = np.maximum(hw.pool_capacity * domain - (in_domain - 1) * hw.hbm_capacity, 0.0) / in_domain
    in_pool = (hw.pool_bandwidth > 0) & (o_far + a_far <= pool_free)
    bandwidth = np.where(in_pool, hw.pool_bandwidth, hw.host_bandwidth)
    opt_params = sum(P / np.where(plan.zero_stage >= 1, n, 1.0) for P, n, _ in params.groups)
    moved = np.where(in_pool, opt_params * plan.optimizer_bytes, opt_params * (plan.grad_bytes + 2.0))
    traffic = mw.optimizer_step_traffic(params_per_device=opt_params, grad_bytes=plan.grad_bytes,
                                        optimizer_bytes=plan.optimizer_bytes, weight_bytes=2.0)
    step = np.where(off_opt & ~in_pool, 0.0, cw.roofline_time(flops=0.0, bytes_moved=traffic, **hw.roofline()))
    out_mb = np.maximum(mem.per_layer * lay.stage_layers - 2 * mem.per_layer, 0.0)
    return Offload(optimizer_far=o_far, activations_far=a_far, in_pool=in_pool, bandwidth=bandwidth,
                   capacity=np.where(in_pool, pool_free, hw.host_capacity),
                   optimizer_transfer=np.where(off_opt, moved / bandwidth, 0.0),
                   activation_transfer=np.where(off_act, 2 * out_mb / bandwidth, 0.0), optimizer_step=step)


@dataclass(frozen=True)
class Schedule:
    """The step [s]: one micro-batch with its overlapped communication, the bubble, the
    exposed once-per-step data-parallel traffic, the optimizer and its offload; with
    what each class of communication leaves exposed over the step."""

    microbatch: np.ndarray
    bubble_fraction: np.ndarray
    bubble: np.ndarray
    dp_exposed: np.ndarray
    step: np.ndarray
    exposed: dict


def schedule(plan: Plan, lay: Layout, comp: Compute, comm: dict, dp: DataParallel, off: Offload) -> Schedule:
    """Per micro-batch, each class of communication hides behind compute up to its
    overlap level (ring attention only behind the attention blocks); the classes share
    one overlapped time (``overlapped_time``). The once-per-step data-parallel traffic
    hides behind the last micro-batch's backward pass."""
    m = lay.micro_batches
    parts = dict(comm, dp=dp.per_microbatch, offload=off.activation_transfer)
    attention_window = lay.stage_layers * (3 + (plan.recompute == 2)) * comp.attention
    hideable = {x: plan.overlap(x) * np.minimum(parts[x], attention_window if x == "cp" else comp.per_microbatch)
                for x in parts}
    comm_mb = sum(parts.values())
    total_hideable = sum(hideable.values())
    # one effective overlap level: hides min(hideable, compute), never more than either
    shorter = np.minimum(comp.per_microbatch, comm_mb)
    level = np.where(shorter > 0, np.minimum(total_hideable, comp.per_microbatch) / np.where(shorter > 0, shorter, 1.0),
                     0.0)
    mb_time = cm.overlapped_time(compute_time=comp.per_microbatch, comm_time=comm_mb, overlap=level)
    hidden = comp.per_microbatch + comm_mb - mb_time     # shared out in proportion to what is hideable
    bubble_fraction = cw.pipeline_bubble_fraction(pp=plan.pp, interleave=plan.interleave, micro_batches=m)
    window = mb_time * 2 / 3                             # the backward pass of the last micro-batch
    dp_exposed = cm.overlapped_time(compute_time=window, comm_time=dp.per_step, overlap=plan.overlap_dp) - window
    dp_exposed = np.where(dp_exposed > 1e-12 * window, dp_exposed, 0.0)   # drop rounding residue
    exposed = {}
    for x in parts:
        share = np.where(total_hideable > 0, hideable[x] / np.where(total_hideable > 0, total_hideable, 1.0), 0.0)
        exposed[x] = m * np.maximum(parts[x] - hidden * share, 0.0)
    exposed["dp"] = exposed["dp"] + dp_exposed
    bubble = bubble_fraction * m * mb_time
    return Schedule(microbatch=mb_time, bubble_fraction=bubble_fraction, bubble=bubble, dp_exposed=dp_exposed,
                    step=m * mb_time + bubble + dp_exposed + off.optimizer_step + off.optimizer_transfer,
                    exposed=exposed)


@dataclass(frozen=True)
class Utilisation:
    """Model and hardware FLOPs of the step [FLOP] and their utilisation [1]."""

    model_flops: np.ndarray
    hardware_flops: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray


def utilisation(sizes: ModelSizes, plan: Plan, hw: Hardware, lay: Layout, sched: Schedule) -> Utilisation:
    """MFU over model FLOPs, HFU over the FLOPs executed (Korthikanti et al. 2022 Eq. 7-8),
    both from the compute wall's step formulas."""
    tokens = plan.global_batch * plan.seq_len
    forward = cw.forward_flops_per_token(matmul_params=sizes.matmul_params, vocab_size=sizes.vocab_size,
                                         hidden_size=sizes.hidden_size, layers=sizes.layers, heads=sizes.heads,
                                         head_dim=sizes.attention_head_dim, context_len=lay.context)
    model_flops = cw.model_step_flops(tokens=tokens, forward_flops_per_token=forward)
    recompute = np.where((plan.flash_attention > 0) & (plan.recompute == 0), 1.0, plan.recompute)
    hardware_flops = cw.hardware_step_flops(tokens=tokens, forward_flops_per_token=forward, recompute=recompute,
                                            matmul_params=sizes.matmul_params, layers=sizes.layers,
                                            heads=sizes.heads, head_dim=sizes.attention_head_dim,
                                            context_len=lay.context)
    def util(flops):
        return cw.flops_utilisation(step_flops=flops, time=sched.step, group_size=lay.devices,
                                    peak_flops=hw.peak_flops)
    return Utilisation(model_flops=model_flops, hardware_flops=hardware_flops, mfu=util(model_flops),
                       hfu=util(hardware_flops))


@dataclass(frozen=True)
class Walls:
    """The step's time by wall [s]: compute (forward, backward, optimizer), memory
    (recomputation, offload) and communication (what is exposed), with the bubble
    shared out like a micro-batch's time."""

    compute: np.ndarray
    memory: np.ndarray
    communication: np.ndarray


def walls(lay: Layout, comp: Compute, sched: Schedule, off: Offload) -> Walls:
    m, mb = lay.micro_batches, sched.microbatch
    bubble_compute = sched.bubble * np.minimum(comp.per_microbatch / np.where(mb > 0, mb, 1.0), 1.0)
    per = np.where(comp.per_microbatch > 0, comp.per_microbatch, 1.0)
    compute_s = m * 3 * comp.stage_forward + off.optimizer_step + bubble_compute * 3 * comp.stage_forward / per
    memory_s = (m * comp.recompute + off.optimizer_transfer + sched.exposed["offload"]
                + bubble_compute * comp.recompute / per)
    comm_s = sum(sched.exposed[x] for x in ("tp", "ep", "cp", "pp", "dp")) + sched.bubble - bubble_compute
    return Walls(compute=compute_s, memory=memory_s, communication=comm_s)


def step_columns(sizes: ModelSizes, plan: Plan, hw: Hardware) -> dict[str, np.ndarray]:
    """Evaluate the training step for every plan of the grid: the chain of parts, laid
    out as output columns named with their units (``step_time_s``, ``mfu``, ...)."""
    lay = layout(sizes, plan)
    act = activations(sizes, plan)
    comp = compute(sizes, plan, hw, lay, act)
    comm = {"tp": tensor_comm(sizes, plan, hw, lay), "ep": expert_comm(sizes, plan, hw, lay),
            "cp": context_comm(sizes, plan, hw, lay), "pp": pipeline_comm(sizes, plan, hw, lay)}
    params = parameters(sizes, plan, lay)
    dp = data_parallel(plan, hw, params)
    mem = memory(sizes, plan, lay, act, params)
    off = offload(plan, hw, lay, mem, params)
    sched = schedule(plan, lay, comp, comm, dp, off)
    return columns(plan, hw, lay, comp, comm, dp, mem, off, sched, utilisation(sizes, plan, hw, lay, sched),
                   walls(lay, comp, sched, off), params)


def columns(plan, hw, lay, comp, comm, dp, mem, off, sched, util, wall, params) -> dict[str, np.ndarray]:
    """The parts laid out as the step's output columns."""
    m, step, ex = lay.micro_batches, sched.step, sched.exposed
    optimizer = mem.optimizer - off.optimizer_far
    activations = mem.activations - off.activations_far
    total = mem.weights + mem.grads + optimizer + activations
    far = off.optimizer_far + off.activations_far
    return {
        "devices": lay.devices, "micro_batches": m,
        "step_time_s": step, "mfu": util.mfu, "hfu": util.hfu,
        "model_tflops_per_device": util.model_flops / step / lay.devices / 1e12,
        "hardware_tflops_per_device": util.hardware_flops / step / lay.devices / 1e12,
        "tokens_per_s": plan.global_batch * plan.seq_len / step,
        "time_compute_s": m * comp.per_microbatch, "time_recompute_s": m * comp.recompute,
        **{f"time_{x}_s": m * comm[x] for x in ("tp", "ep", "cp", "pp")},
        "time_dp_s": m * dp.per_microbatch + dp.per_step, "time_bubble_s": sched.bubble,
        "time_optimizer_s": off.optimizer_step,
        "time_offload_s": off.optimizer_transfer + m * off.activation_transfer,
        **{f"exposed_{x}_s": ex[x] for x in COMM_CLASSES},
        "exposed_comm_s": ex["tp"] + ex["ep"] + ex["cp"] + ex["pp"] + ex["dp"],
        "bubble_fraction": sched.bubble_fraction,
        "memory_weights_bytes": mem.weights, "memory_grads_bytes": mem.grads, "memory_optimizer_bytes": optimizer,
        "memory_activations_bytes": activations, "memory_total_bytes": total,
        "memory_capacity_bytes": np.broadcast_to(hw.hbm_capacity, np.shape(step)),
        "memory_offloaded_bytes": far, "offload_capacity_bytes": off.capacity,
        "fits": (total <= hw.hbm_capacity) & (far <= off.capacity),
        "wall_compute_s": wall.compute, "wall_communication_s": wall.communication, "wall_memory_s": wall.memory,
        "params_per_device": params.total,
    }
