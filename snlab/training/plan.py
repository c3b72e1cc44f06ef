"""Training plans: parallel degrees, batch, memory savers, overlap, as arrays.

A plan's fields are plain numbers (or numpy arrays of them, for sweeps); names that
people type (``recompute="full"``, ``overlap="all"``) are turned into codes here, in
one place. The rules a plan must obey are checked row by row, vectorised, so that
:func:`snlab.train` can raise the first broken rule and :func:`snlab.sweep` can flag
each row with its reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SnlabError
from .. import grid
from ..grid import finite, first_broken, maximum, minimum, rounded, show
from . import stages
from .. import kernel as _kernel

_kernel.loaded(__name__)

RECOMPUTE = {"none": 0, "selective": 1, "full": 2}
#: what selective recomputation may recompute, as Megatron-Core's recompute_modules names
#: them (megatron/core/transformer/transformer_config.py): the attention scores
#: (core_attn, "selective" alone), the norms' outputs, latent attention's up-projections
#: and rotary embedding, the routed experts' activation, the dense MLP, the shared
#: experts, the whole MoE block. Each module's stored tensors are dropped and rebuilt in
#: the backward pass (snlab.walls.memory.recomputed_activation_memory).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "shared_experts", "moe")
#: codes of every recomputation choice: none, selective (core_attn), full, then each set of
#: modules by its bit mask (code 3 + mask), named by its modules in the order above
RECOMPUTE_NAMES = (["none", "selective", "full"]
                   + [",".join(m for i, m in enumerate(RECOMPUTE_MODULES) if mask >> i & 1) or "no modules"
                      for mask in range(2 ** len(RECOMPUTE_MODULES))])
OFFLOAD = {"none": 0, "optimizer": 1, "activations": 2, "both": 3}
GRAD_DTYPE_BYTES = {"bf16": 2, "fp32": 4}
#: which activations FP8 training keeps in FP8 for the backward pass: none; the linear
#: layers' inputs (Transformer Engine's default in FP8 training); those and the MLP
#: activation function's input (Megatron-Core's activation_func_fp8_input_store; DeepSeek-V3
#: report Sec. 3.3.3 caches its MoE SwiGLU inputs in FP8)
FP8_ACTIVATIONS = {"none": 0, "linear": 1, "all": 2}
#: how expert-parallel all-to-alls move tokens: Megatron-Core's "alltoall" dispatcher
#: sends every (token, expert) copy in 16 bits; "deepep" (DeepEP's normal kernels, the
#: "flex" dispatcher Megatron-Core uses for DeepSeek-V3 and fine-grained MoE) sends a
#: token once per destination node and forwards it inside the node, dispatching in FP8
#: when the matrix multiplies run in FP8 (DeepSeek-V3 report Sec. 3.2.2 and 3.3.3)
EP_DISPATCHERS = {"alltoall": 0, "deepep": 1}
#: classes of communication, each with its own overlap level: the once-per-step
#: data-parallel gradient reduction and weight gather (dp), the per-micro-batch traffic
#: of sharded states under ZeRO-2/3 and FSDP (zero), tensor, pipeline, expert and context
#: parallelism, and activation offload
OVERLAP_CLASSES = ("dp", "zero", "tp", "pp", "ep", "cp", "offload")
#: named overlap levels: the fraction of each class's hideable time hidden behind compute.
#: What a class can hide at all is structural (snlab.training.step.schedule): one chunk of
#: data-parallel and ZeRO traffic always shows, pipeline sends overlap only with virtual
#: stages (the interleaved schedule's handshakes always show), tensor-parallel collectives
#: only with sequence parallelism and inside one scale-up domain. "standard" is how
#: Megatron-Core and NeMo run today (nemo-comm-overlap): --overlap-grad-reduce and
#: --overlap-param-gather, FSDP/ZeRO-3 prefetching the next layer, --tp-comm-overlap
#: whose pipelined reduce-scatter splits the GEMM into 4 chunks (the last one shows:
#: 3/4), p2p overlap with virtual stages, ring attention behind the attention blocks,
#: offload streams beside compute. Expert all-to-all: half.
OVERLAP_PRESETS = {
    "none": dict.fromkeys(OVERLAP_CLASSES, 0.0),
    "gradients": {**dict.fromkeys(OVERLAP_CLASSES, 0.0), "dp": 1.0, "zero": 1.0},
    "standard": {"dp": 1.0, "zero": 1.0, "tp": 0.75, "pp": 1.0, "ep": 0.5, "cp": 1.0, "offload": 1.0},
    "all": dict.fromkeys(OVERLAP_CLASSES, 1.0),
}

#: plan fields, their defaults, and what they accept (for errors and the CLI)
DEFAULTS = dict(tp=1, pp=1, dp=1, ep=1, cp=1, micro_batch=1, global_batch=None, zero=1,
                recompute="selective", sequence_parallel=None, interleave=1, overlap="standard",
                offload="none", grad_dtype="bf16", seq_len=None, flash_attention=True, optimizer_bytes=12,
                first_stage_layers=0, last_stage_layers=0, ep_dispatcher="deepep", capacity_factor=0,
                expert_imbalance=None, chunk_overhead_s=0.78e-3, fp8_activations=None, expert_tp=None,
                logit_bytes=4, slice=None, offload_layers=0, fp8_params=False)
#: first/last_stage_layers 0: the automatic split (snlab.training.stages); ep_dispatcher
#: "deepep": what DeepSeek-V3 trains with and Megatron-Core's MoE recipes for fine-grained
#: experts use; capacity_factor 0: no token dropping (Megatron-Core's default, None);
#: expert_imbalance None: the model preset's measured load of the busiest expert over the mean
#: slice None: on a torus pod the slice the scheduler gives the job's devices
#: (snlab.topology.auto_slice), each parallel group spanning the axes the rank layout gives it;
#: chunk_overhead_s 0.78 ms: the median of what each extra pass through a one-layer model
#: chunk cost Megatron-LM's interleaved schedule on 8-32 A100s beyond its modelled bubble and
#: sends (Qi et al. 2024, Zero Bubble Pipeline Parallelism: measured throughput, Table 4,
#: against the bubble rates computed from profiled pass and send times, Tables 5 and 9;
#: 12 configurations, 0.61-1.20 ms, about 1.5-3 times the profiled send)
#: fp8_params False: 16-bit weights (with FP8 training, Transformer Engine's FP8 copies beside
#: them); True keeps the weights themselves in FP8 (Megatron-Core's fp8_param)
#: offload_layers 0: with activation offload, every layer's activations but two leave the
#: device; N > 0 moves those of N of a stage's layers (Megatron-Core's cpu_offloading_num_layers)
#: logit_bytes 4: the loss keeps the output logits in fp32, as Megatron-Core's fused
#: vocabulary-parallel cross-entropy does (Korthikanti et al. 2022 Sec. 4.3); an unfused loss
#: that upcasts the bf16 logits keeps 10 (torchtitan's cross_entropy(pred.float()): the bf16
#: logits, their fp32 copy and the fp32 softmax for the backward pass)
#: expert_tp None: the routed experts split as the dense layers are (Megatron-Core's default,
#: expert_tensor_parallel_size = tp); 1 keeps each expert whole and lets the expert group
#: span the tensor-parallel ranks, as DeepSeek-V3 and Moonlight's recipes run
#: fp8_activations None: "linear" in FP8 training, as Transformer Engine runs it (each linear
#: layer saves its quantised input: transformer_engine/pytorch/module/linear.py; NeMo's FP8
#: recipes), "none" in 16-bit training
#: grad_dtype "bf16": Megatron-Core reduces and keeps gradients in bf16 unless told otherwise
#: (DistributedDataParallelConfig.grad_reduce_in_fp32 = False; NeMo's performance recipes);
#: the Megatron-LM runs of 2021-2022 kept fp32 gradients and say so in their plans
ALLOWED = dict(tp="a whole number >= 1 dividing the attention heads",
               pp="a whole number from 1 to the number of layers",
               dp="a whole number >= 1",
               ep="a whole number >= 1 dividing the experts, with ep x expert_tp dividing tp x dp x cp",
               expert_tp="0 (as tp) or a whole number >= 1 dividing tp",
               logit_bytes="bytes per output logit the loss keeps, from 0 to 32 (4: fused fp32; 10: unfused)",
               fp8_params="true or false (the weights kept in FP8, with precision fp8)",
               offload_layers="0 (every layer's activations but two) or the layers of a stage whose activations "
                              "go to the far tier, a whole number",
               cp="a whole number >= 1 dividing the sequence length",
               micro_batch="a whole number >= 1", global_batch="a multiple of micro_batch x dp",
               zero="0, 1, 2 or 3",
               recompute="none, selective, full, or modules to recompute, comma-separated: "
                         + ", ".join(RECOMPUTE_MODULES),
               fp8_activations="none, linear (the linear layers' inputs kept in FP8 for the backward pass, the "
                               "default with precision fp8) or all (also the MLP activation's input)",
               sequence_parallel="true or false", interleave="a whole number >= 1",
               overlap="none, gradients, standard, all, or class=level pairs (dp, zero, tp, pp, ep, cp, offload) in [0, 1]",
               offload="none, optimizer, activations, both", precision="a precision the device supports",
               grad_dtype="bf16, fp32", seq_len="a whole number >= 1",
               flash_attention="true or false", optimizer_bytes="bytes per parameter from 0 to 64 (12 for Adam)",
               first_stage_layers="0 (automatic) or the transformer layers of the first pipeline stage",
               last_stage_layers="0 (automatic) or the transformer layers of the last pipeline stage",
               ep_dispatcher="alltoall, deepep", capacity_factor="0 (no token dropping) or a factor from 0.1 to 64",
               expert_imbalance="a factor from 1 to 64 (load of the busiest expert device over the mean)",
               chunk_overhead_s="a time in seconds from 0 to 0.1 (0.00078: Qi et al. 2024)",
               slice="on a torus, the job's slice, e.g. '4x4x8' (default: the scheduler's shape for its devices)")



def check_read(model, plan: dict) -> None:
    """Raise :class:`SnlabError` for a field given away from its default that this plan
    never reads, so that it is not silently ignored: the experts' settings
    (``expert_imbalance``, ``capacity_factor``, ``ep_dispatcher``) for a dense model or
    without expert parallelism (``ep`` 1: every device computes its share of every
    expert and there is no all-to-all), ``expert_tp`` for a dense model,
    ``offload_layers`` without activation offload,
    ``chunk_overhead_s`` without interleaved stages, a recomputed module the model does not
    have (``mla_up_proj`` without MLA). A field or its condition may be an
    axis of a sweep: the error is raised when no point of the grid reads the field."""
    given = {k: v for k, v in plan.items() if v is not None}

    def moved(name):
        return grid.moved(given, name, DEFAULTS[name])

    def always(name, test):
        return grid.everywhere(given, name, DEFAULTS[name], test)

    for name in ("expert_imbalance", "capacity_factor", "ep_dispatcher"):
        if not moved(name):
            continue
        if model.moe is None:
            raise SnlabError(name, f"got {given[name]!r} for {model.name}, which has no routed experts",
                             "leave it out; it sets a MoE model's expert parallelism")
        if always("ep", lambda v: v == 1):
            raise SnlabError(name, f"got {given[name]!r} with ep 1, where every device computes its share of every "
                             "expert and no token crosses to another", "ep > 1 with it, or leave it out")
    if moved("expert_tp") and model.moe is None:
        raise SnlabError("expert_tp", f"got {given['expert_tp']!r} for {model.name}, which has no routed experts",
                         "leave it out; it splits a MoE model's experts by tensor parallelism")
    if moved("offload_layers") and always("offload", lambda v: v not in ("activations", "both")):
        raise SnlabError("offload_layers", f"got {given['offload_layers']!r} with offload "
                         f"{given.get('offload', DEFAULTS['offload'])!r}, which keeps every activation on the device",
                         "offload='activations' or 'both' with it, or leave it out")
    if moved("chunk_overhead_s") and always("interleave", lambda v: v == 1):
        raise SnlabError("chunk_overhead_s", f"got {given['chunk_overhead_s']!r} with interleave 1, which has no "
                         "extra pass through a virtual stage", "interleave > 1 with it, or leave it out")
    _check_recompute_modules(model, given.get("recompute"))


def _check_recompute_modules(model, value) -> None:
    """A recomputed module the model does not have (``mla_up_proj`` without MLA, the
    experts' modules without routed or shared experts) is an error, not a no-op."""
    has = {"mla_up_proj": model.mla is not None, "moe_act": model.moe is not None, "moe": model.moe is not None,
           "shared_experts": bool(model.moe and model.moe.shared_experts)}
    # one choice (a name, a code, modules as a list) or a sweep's axis of them
    values = value if isinstance(value, (list, tuple)) and not all(
        str(v).strip() in RECOMPUTE_MODULES for v in value) else [value]
    for v in values:
        code = RECOMPUTE["none"] if v is None else recompute_code(v)
        modules = RECOMPUTE_NAMES[code].split(",") if code >= len(RECOMPUTE) else []
        for name in modules:
            if not has.get(name, True):
                raise SnlabError("recompute", f"module {name!r} for {model.name}, which has none",
                                 "the modules the model has: " + ", ".join(m for m in RECOMPUTE_MODULES
                                                                          if has.get(m, True)))


@dataclass(frozen=True)
class Plan:
    """A grid of training plans: each field a number or an array (an axis of an open
    grid). Choices are codes: ``recompute`` 0 none, 1 selective, 2 full, 3 + a bit mask
    of :data:`RECOMPUTE_MODULES` (:func:`recompute_code`); ``offload`` 0
    none, 1 optimizer, 2 activations, 3 both; flags 0 or 1; ``overlap_<class>`` the
    fraction of that class of communication hidden behind compute [0, 1]."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    cp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    interleave: np.ndarray
    offload: np.ndarray
    grad_bytes: np.ndarray
    seq_len: np.ndarray
    flash_attention: np.ndarray
    optimizer_bytes: np.ndarray
    first_stage_layers: np.ndarray
    last_stage_layers: np.ndarray
    ep_dispatcher: np.ndarray
    capacity_factor: np.ndarray
    expert_imbalance: np.ndarray
    chunk_overhead_s: np.ndarray
    fp8_activations: np.ndarray
    expert_tp: np.ndarray
    logit_bytes: np.ndarray
    offload_layers: np.ndarray
    fp8_params: np.ndarray
    overlap_dp: np.ndarray
    overlap_zero: np.ndarray
    overlap_tp: np.ndarray
    overlap_pp: np.ndarray
    overlap_ep: np.ndarray
    overlap_cp: np.ndarray
    overlap_offload: np.ndarray

    def overlap(self, cls: str) -> np.ndarray:
        """The overlap level of one class of communication."""
        return getattr(self, f"overlap_{cls}")

    @property
    def devices(self):
        return self.tp * self.pp * self.dp * self.cp

    @property
    def etp(self):
        """Tensor-parallel degree of the routed experts (``expert_tp``; 0: as ``tp``)."""
        return np.where(self.expert_tp > 0, self.expert_tp, self.tp) if np.ndim(self.expert_tp) or np.ndim(
            self.tp) else (self.expert_tp if self.expert_tp > 0 else self.tp)

    @property
    def micro_batches(self):
        """Micro-batches per pipeline per step, B / (b d)."""
        return self.global_batch / (self.micro_batch * self.dp)


def overlap_levels(spec) -> dict[str, float]:
    """Overlap levels per class from a preset name, a number, a dict, or ``"dp=1,tp=0.5"``."""
    if isinstance(spec, str) and spec in OVERLAP_PRESETS:
        return dict(OVERLAP_PRESETS[spec])
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        levels = dict.fromkeys(OVERLAP_CLASSES, spec)
    elif isinstance(spec, dict):
        levels = {**OVERLAP_PRESETS["none"], **spec}
    elif isinstance(spec, str):
        levels = dict(OVERLAP_PRESETS["none"])
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            try:
                levels[key.strip()] = float(value) if sep else None
            except ValueError:
                levels[key.strip()] = None
    else:
        raise SnlabError("overlap", f"got {spec!r}", ALLOWED["overlap"])
    for key, value in levels.items():
        if key not in OVERLAP_CLASSES:
            raise SnlabError("overlap", f"unknown class {key!r}", ALLOWED["overlap"])
        if not finite(value) or not 0.0 <= value <= 1.0:
            raise SnlabError(f"overlap.{key}", f"got {show(value)}", "a level in [0, 1]")
    return {k: float(v) for k, v in levels.items()}


def recompute_code(value) -> int:
    """The code of a recomputation choice: ``"none"``, ``"selective"``, ``"full"``, or
    modules as Megatron-Core names them (``"mla_up_proj,moe_act"`` or a list); a set
    of modules equal to a named choice takes that choice's code."""
    if isinstance(value, str) and value in RECOMPUTE:
        return RECOMPUTE[value]
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if finite(value) and value == int(value) and 0 <= value < len(RECOMPUTE_NAMES) and value != 3:
            return int(value)
        raise SnlabError("recompute", f"got {show(value)}", ALLOWED["recompute"])
    parts = value if isinstance(value, (list, tuple)) else value.split(",") if isinstance(value, str) else None
    if parts is None:
        raise SnlabError("recompute", f"got {show(value)}", ALLOWED["recompute"])
    mask = 0
    for part in parts:
        name = str(part).strip()
        if name not in RECOMPUTE_MODULES:
            raise SnlabError("recompute", f"unknown module {name!r}", ALLOWED["recompute"])
        mask |= 1 << RECOMPUTE_MODULES.index(name)
    if mask == 0:
        return RECOMPUTE["none"]
    if mask == 1:
        return RECOMPUTE["selective"]
    return 3 + mask


def recompute_mode(code):
    """0 none, 1 selective (any modules), 2 full, of a recomputation code."""
    return np.where(code >= 3, 1.0, code) if np.ndim(code) else (1.0 if code >= 3 else code)


def recompute_mask(code):
    """The modules a recomputation code recomputes, as a bit mask of
    :data:`RECOMPUTE_MODULES` (selective alone: the attention scores)."""
    if np.ndim(code):
        return np.where(code >= 3, code - 3, np.where(code == 1, 1.0, 0.0))
    return code - 3 if code >= 3 else (1.0 if code == 1 else 0.0)


@dataclass(frozen=True)
class Rule:
    """A rule a plan must satisfy; ``message`` names the fields it concerns."""

    field: str
    message: str


# The rules, in the order they are reported; ``violations`` returns the index of the
# first broken one per row (-1 when all hold).
RULES = (
    Rule("tp", "tensor-parallel degree tp must be a whole number >= 1 that divides the attention heads"),
    Rule("tp", "tensor-parallel degree tp must divide the key/value heads, or be a multiple of them"),
    Rule("pp", "pipeline degree pp must be from 1 to the number of layers"),
    Rule("interleave", "interleaving (interleave > 1) needs pp > 1 and micro-batches per step (global_batch / "
                       "(micro_batch x dp)) a multiple of pp, as Megatron-Core's interleaved schedule runs them "
                       "in groups of pp"),
    Rule("interleave", "every model chunk needs a layer, but the first stage's first chunk may hold only the "
                       "embedding and the last stage's last only the output layer: pp x interleave at most "
                       "about the number of layers + 2"),
    Rule("first_stage_layers", "first_stage_layers and last_stage_layers need pp > 1, at least interleave layers "
                               "each, and must leave at least interleave layers to every other stage"),
    Rule("cp", "context-parallel degree cp must divide the sequence length"),
    Rule("ep", "expert-parallel degree ep must divide the number of experts (1 for dense models), and ep x "
               "expert_tp must divide tp x dp x cp, expert_tp dividing tp"),
    Rule("global_batch", "global batch must be a multiple of micro_batch x dp"),
    Rule("zero", "ZeRO stage 3 cannot be combined with pipeline parallelism (pp > 1)"),
    Rule("devices", "tp x pp x dp x cp must equal the number of devices"),
    Rule("degrees", "every degree and the micro-batch must be a whole number >= 1"),
)


def violations(model, plan: Plan, devices=None) -> np.ndarray:
    """Index into :data:`RULES` of the first rule each row breaks, or -1."""
    # whole numbers are compared as integers: exact, and faster than float modulo
    names = ("tp", "pp", "dp", "ep", "cp", "expert_tp", "micro_batch", "global_batch", "interleave", "seq_len")
    ints = {k: rounded(getattr(plan, k)) for k in names}
    whole = True
    for k in names[:-1]:
        whole = whole & (ints[k] == getattr(plan, k))
    t, p, d, e, c = ints["tp"], ints["pp"], ints["dp"], ints["ep"], ints["cp"]
    et = np.where(ints["expert_tp"] == 0, t, ints["expert_tp"]) if np.ndim(t) or np.ndim(ints["expert_tp"]) \
        else (t if ints["expert_tp"] == 0 else ints["expert_tp"])
    b, B, v, s = ints["micro_batch"], ints["global_batch"], ints["interleave"], ints["seq_len"]
    experts = model.moe.experts if model.moe else 1
    first, last = plan.first_stage_layers, plan.last_stage_layers
    ends_unset = (first == 0) & (last == 0)
    split_broken = stages.broken(model.layers, maximum(p, 1), maximum(v, 1),
                                 rounded(first), rounded(last), stages.model_tail(model)) \
        | (rounded(first) != first) | (rounded(last) != last)
    return first_broken([
        (t < 1) | (model.heads % maximum(t, 1) != 0),
        (model.kv_heads % maximum(t, 1) != 0) & (t % model.kv_heads != 0),
        (p < 1) | (p > model.layers),
        ((v > 1) & ((p == 1) | ((B // maximum(b * d, 1)) % maximum(p, 1) != 0))) | (v < 1),
        ends_unset & split_broken,
        ~ends_unset & split_broken,
        (c < 1) | (s % maximum(c, 1) != 0),
        (e < 1) | ((t * d * c) % maximum(e * et, 1) != 0) | (experts % maximum(e, 1) != 0)
        | (et < 1) | (t % maximum(et, 1) != 0) | ((experts == 1) & (et != t)),
        (B % maximum(b * d, 1) != 0) | (B < b * d),
        (plan.zero_stage == 3) & (p > 1),
        (t * p * d * c != devices) if devices is not None else np.False_,
        (d < 1) | (b < 1) | ~whole,
    ])
