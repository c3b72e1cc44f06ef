"""The ``snlab train``, ``snlab compare`` and ``snlab search`` subcommands."""

from __future__ import annotations

import json

from . import plan as pl
from .cli import side_by_side
from .errors import SnlabError
from .units import fmt_bytes, fmt_seconds


def _positive_int(text: str) -> int:
    import argparse
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def _add_plan_args(p, *, degrees: bool = True) -> None:
    p.add_argument("--model", required=True, help="model preset name or .toml path")
    if degrees:
        for flag, help_ in (("--tp", "tensor-parallel degree"), ("--pp", "pipeline stages"),
                            ("--dp", "data-parallel degree"), ("--ep", "expert-parallel degree"),
                            ("--cp", "context-parallel degree")):
            p.add_argument(flag, type=_positive_int, default=1, help=help_ + " (default 1)")
    p.add_argument("--micro-batch", type=_positive_int, default=None, help="sequences per micro-batch")
    p.add_argument("--global-batch", type=_positive_int, required=True, help="sequences per step")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None, help="ZeRO stage (default 1)")
    p.add_argument("--recompute", choices=list(pl.RECOMPUTE), default=None)
    p.add_argument("--sequence-parallel", action="store_true", default=None)
    p.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false")
    p.add_argument("--interleave", type=_positive_int, default=None, help="virtual stages per pipeline stage")
    p.add_argument("--overlap", default=None, help="none, gradients, standard, all, or dp=1,tp=0.5,...")
    p.add_argument("--offload", choices=list(pl.OFFLOAD), default=None)
    p.add_argument("--precision", default="bf16", help="matmul precision (bf16, fp8, ...)")
    p.add_argument("--grad-dtype", choices=list(pl.GRAD_DTYPE_BYTES), default=None)
    p.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_false", default=None,
                   help="attention scores materialised (as in Megatron-LM 2021-2022)")
    p.add_argument("--tokens", type=float, default=None, help="also report the time to train this many tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _plan(args, *, degrees: bool = True) -> dict:
    keys = ["micro_batch", "global_batch", "zero", "recompute", "sequence_parallel", "interleave", "overlap",
            "offload", "grad_dtype", "seq_len", "flash_attention"]
    if degrees:
        keys = ["tp", "pp", "dp", "ep", "cp"] + keys
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _cmd_train(args) -> int:
    from .planner import train
    result = train(args.model, args.system, precision=args.precision, **_plan(args))
    if args.json:
        out = result.to_dict()
        if args.tokens:
            out["time_to_train_s"] = result.time_to_train_s(args.tokens)
        print(json.dumps(out, indent=2))
    else:
        print(result)
        if args.tokens:
            print(f"  time to train {args.tokens:.3g} tokens: {fmt_seconds(result.time_to_train_s(args.tokens))}")
    return 0


_COMPARE_ROWS = [
    ("devices", lambda r: f"{r.devices}"),
    ("step time", lambda r: fmt_seconds(r.step_time_s)),
    ("MFU", lambda r: f"{r.mfu:.1%}"),
    ("HFU", lambda r: f"{r.hfu:.1%}"),
    ("tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
    ("compute", lambda r: fmt_seconds(r.time_s["compute"])),
    ("exposed TP comm", lambda r: fmt_seconds(r.time_s["exposed"]["tp"])),
    ("exposed EP comm", lambda r: fmt_seconds(r.time_s["exposed"]["ep"])),
    ("exposed PP sends", lambda r: fmt_seconds(r.time_s["exposed"]["pp"])),
    ("exposed DP grads", lambda r: fmt_seconds(r.time_s["exposed"]["dp"])),
    ("pipeline bubble", lambda r: fmt_seconds(r.time_s["bubble"])),
    ("offload", lambda r: fmt_seconds(r.time_s["offload"])),
    ("memory/device", lambda r: fmt_bytes(r.memory_bytes_per_device["total"])),
    ("fits", lambda r: "yes" if r.fits else "NO"),
    ("limited by", lambda r: r.limited_by),
]


def _cmd_compare(args) -> int:
    from .planner import train
    systems = [s for s in args.systems.split(",") if s]
    if not systems:
        raise SnlabError("systems", "empty", "comma-separated system names or .toml paths")
    results = [train(args.model, s, precision=args.precision, **_plan(args)) for s in systems]
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
        return 0
    first = results[0]
    p = first.plan
    print(f"{first.model}: tp={p['tp']} pp={p['pp']} dp={p['dp']} ep={p['ep']} cp={p['cp']}, "
          f"micro-batch {p['micro_batch']}, global batch {p['global_batch']}, recompute {p['recompute']}")
    side_by_side(results, _COMPARE_ROWS)
    return 0


def _cmd_search(args) -> int:
    from .planner import search
    fixed = _plan(args, degrees=False)
    fixed.pop("global_batch")
    df = search(args.model, args.system, devices=args.devices, global_batch=args.global_batch,
                precision=args.precision, top=args.top, **fixed)
    cols = ["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "zero", "recompute", "sequence_parallel",
            "step_time_s", "mfu", "tokens_per_s", "memory_total_bytes", "limited_by"]
    if args.json:
        print(df[cols].to_json(orient="records", indent=2, double_precision=15))
        return 0
    if df.empty:
        print(f"no plan fits {args.model} on {args.devices} devices of {args.system}")
        return 0
    print(f"{args.model} on {args.devices} devices of {args.system}, global batch {args.global_batch}: "
          f"best {len(df)} of {df.attrs.get('evaluated', 0):,} plans evaluated")
    shown = df[cols].copy()
    shown["memory_total_bytes"] = shown["memory_total_bytes"].map(fmt_bytes)
    shown["mfu"] = shown["mfu"].map(lambda x: f"{x:.1%}")
    shown["step_time_s"] = shown["step_time_s"].map(lambda x: f"{x:.3g}")
    shown["tokens_per_s"] = shown["tokens_per_s"].map(lambda x: f"{x:,.0f}")
    print(shown.rename(columns={"memory_total_bytes": "memory", "sequence_parallel": "sp",
                                "micro_batch": "mb", "interleave": "v"}).to_string(index=False))
    return 0


def register(sub) -> None:
    """Add ``train``, ``compare`` and ``search`` to the ``snlab`` parser."""
    p = sub.add_parser("train", help="step time, MFU and memory of one training plan")
    p.add_argument("--system", required=True, help="system preset name or .toml path")
    _add_plan_args(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("compare", help="one training plan on several systems, side by side")
    p.add_argument("--systems", required=True, help="comma-separated system names or .toml paths")
    _add_plan_args(p)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("search", help="the fastest training plans that fit")
    p.add_argument("--system", required=True)
    p.add_argument("--devices", type=_positive_int, required=True)
    p.add_argument("--top", type=_positive_int, default=10)
    _add_plan_args(p, degrees=False)
    p.set_defaults(func=_cmd_search)
