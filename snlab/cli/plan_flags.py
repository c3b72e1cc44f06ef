"""The training-plan flags that ``snlab train``, ``compare`` and ``search`` share."""

from __future__ import annotations

from ..training import plan as pl
from ..training.planner import MAX_DEGREE, MAX_GLOBAL_BATCH, MAX_SEQ_LEN, MAX_STAGE_LAYERS
from .common import integer_flag, number

PLAN_KEYS = ["micro_batch", "global_batch", "zero", "recompute", "sequence_parallel", "interleave", "overlap",
             "offload", "grad_dtype", "seq_len", "flash_attention", "first_stage_layers", "last_stage_layers",
             "ep_dispatcher", "capacity_factor", "expert_imbalance", "chunk_overhead_s", "fp8_activations",
             "expert_tp", "optimizer_bytes", "logit_bytes", "slice", "offload_layers", "fp8_params"]


def add(p, *, degrees: bool = True) -> None:
    """Add the plan flags to a subcommand's parser."""
    p.add_argument("--model", required=True, help="model preset name or .toml path")
    if degrees:
        for flag, help_ in (("--tp", "tensor-parallel degree"), ("--pp", "pipeline stages"),
                            ("--dp", "data-parallel degree"), ("--ep", "expert-parallel degree"),
                            ("--cp", "context-parallel degree")):
            p.add_argument(flag, type=integer_flag(flag[2:], high=MAX_DEGREE), default=1, help=help_ + " (default 1)")
    p.add_argument("--micro-batch", type=integer_flag("micro_batch", high=MAX_DEGREE), default=None,
                   help="sequences per micro-batch")
    p.add_argument("--global-batch", type=integer_flag("global_batch", high=MAX_GLOBAL_BATCH), required=True,
                   help="sequences per step")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None, help="ZeRO stage (default 1)")
    p.add_argument("--recompute", default=None, metavar="WHAT",
                   help="none, selective, full, or modules to recompute, comma-separated ("
                        + ", ".join(pl.RECOMPUTE_MODULES) + ")")
    p.add_argument("--fp8-activations", choices=list(pl.FP8_ACTIVATIONS), default=None,
                   help="activations kept in FP8: none, linear (the default with --precision fp8), all")
    p.add_argument("--expert-tp", type=integer_flag("expert_tp", high=MAX_DEGREE), default=None,
                   help="tensor-parallel degree of the routed experts (default: --tp)")
    p.add_argument("--optimizer-bytes", default=None, metavar="B",
                   help="optimizer bytes per parameter (default 12: Adam with an fp32 master; 6 for bf16 moments "
                        "and a 16-bit master remainder)")
    p.add_argument("--logit-bytes", default=None, metavar="B",
                   help="bytes per output logit the loss keeps (default 4: fused; 10: an unfused fp32 loss)")
    p.add_argument("--sequence-parallel", action="store_true", default=None)
    p.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false")
    p.add_argument("--interleave", type=integer_flag("interleave", high=MAX_DEGREE), default=None,
                   help="virtual stages per pipeline stage")
    p.add_argument("--first-stage-layers", type=integer_flag("first_stage_layers", low=0, high=MAX_STAGE_LAYERS), default=None,
                   help="transformer layers of the first pipeline stage (default: split automatically)")
    p.add_argument("--last-stage-layers", type=integer_flag("last_stage_layers", low=0, high=MAX_STAGE_LAYERS), default=None,
                   help="transformer layers of the last pipeline stage (default: split automatically)")
    p.add_argument("--ep-dispatcher", choices=list(pl.EP_DISPATCHERS), default=None,
                   help="expert all-to-all: deepep (default: once per node, FP8 dispatch in FP8) or alltoall")
    p.add_argument("--capacity-factor", default=None, metavar="F",
                   help="expert capacity factor (default 0: no token dropping)")
    p.add_argument("--expert-imbalance", default=None, metavar="F",
                   help="load of the busiest expert device over the mean (default: the model preset's)")
    p.add_argument("--chunk-overhead", dest="chunk_overhead_s", default=None, metavar="S",
                   help="seconds each extra pass through a virtual stage waits beyond its compute and sends "
                        "(default 0.00078, measured by Qi et al. 2024)")
    p.add_argument("--slice", default=None, metavar="AxBxC",
                   help="on a torus pod, the job's slice, e.g. 4x4x8 (default: the scheduler's shape for its devices)")
    p.add_argument("--overlap", default=None, help="none, gradients, standard, all, or dp=1,tp=0.5,...")
    p.add_argument("--offload", choices=list(pl.OFFLOAD), default=None)
    p.add_argument("--offload-layers", type=integer_flag("offload_layers", low=0, high=MAX_STAGE_LAYERS), default=None,
                   help="with --offload activations: the layers of a stage whose activations leave "
                        "(default 0: all but two)")
    p.add_argument("--fp8-params", action="store_true", default=None,
                   help="with --precision fp8: the weights kept in FP8, with no 16-bit copy")
    p.add_argument("--precision", default="bf16", help="matmul precision (bf16, fp8, ...)")
    p.add_argument("--grad-dtype", choices=list(pl.GRAD_DTYPE_BYTES), default=None)
    p.add_argument("--seq-len", type=integer_flag("seq_len", high=MAX_SEQ_LEN), default=None,
                   help="sequence length (default: the model's)")
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_false", default=None,
                   help="attention scores materialised (as in Megatron-LM 2021-2022)")
    p.add_argument("--tokens", default=None, help="also report the time to train this many tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def plan(args, *, degrees: bool = True) -> dict:
    """The plan keywords of :func:`snlab.train` from parsed flags."""
    keys = (["tp", "pp", "dp", "ep", "cp"] if degrees else []) + PLAN_KEYS
    out = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    if "capacity_factor" in out:
        out["capacity_factor"] = number("capacity_factor", out["capacity_factor"], 0.0, 64.0, pl.ALLOWED["capacity_factor"])
    if "expert_imbalance" in out:
        out["expert_imbalance"] = number("expert_imbalance", out["expert_imbalance"], 1.0, 64.0,
                                         pl.ALLOWED["expert_imbalance"])
    if "recompute" in out:
        pl.recompute_code(out["recompute"])          # a one-line error for an unknown module
    for key in ("optimizer_bytes", "logit_bytes"):
        if key in out:
            out[key] = number(key, out[key], 0.0, 64.0 if key == "optimizer_bytes" else 32.0, pl.ALLOWED[key])
    if "chunk_overhead_s" in out:
        out["chunk_overhead_s"] = number("chunk_overhead_s", out["chunk_overhead_s"], 0.0, 0.1,
                                         pl.ALLOWED["chunk_overhead_s"])
    return out


def tokens(args) -> float | None:
    """The ``--tokens`` flag: training tokens > 0 (at most 1e18), or None."""
    if args.tokens is None:
        return None
    return number("tokens", args.tokens, 1.0, 1e18, "a number of training tokens from 1 to 1e18")
