"""``snlab search``: the fastest training plans that fit."""

from __future__ import annotations

import json

from ..units import fmt_bytes
from . import plan_flags
from ..training.planner import MAX_DEVICES, MAX_TOP
from .common import integer_flag, print_json

COLUMNS = ["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "zero", "recompute", "sequence_parallel",
           "step_time_s", "mfu", "tokens_per_s", "memory_total_bytes", "limited_by"]


def register(sub) -> None:
    p = sub.add_parser("search", help="the fastest training plans that fit")
    p.add_argument("--system", required=True)
    p.add_argument("--devices", type=integer_flag("devices", high=MAX_DEVICES), required=True)
    p.add_argument("--top", type=integer_flag("top", high=MAX_TOP), default=10)
    plan_flags.add(p, degrees=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import search
    fixed = plan_flags.plan(args, degrees=False)
    fixed.pop("global_batch")
    df = search(args.model, args.system, devices=args.devices, global_batch=args.global_batch,
                precision=args.precision, top=args.top, **fixed)
    if args.json:
        print_json(json.loads(df[COLUMNS + ["slice"]].to_json(orient="records", double_precision=15)))
        return 0
    if df.empty:
        print(f"no plan fits {args.model} on {args.devices} devices of {args.system}")
        return 0
    print(f"{args.model} on {args.devices} devices of {args.system}, global batch {args.global_batch}: "
          f"best {len(df)} of {df.attrs.get('evaluated', 0):,} plans evaluated")
    columns = COLUMNS[:-1] + (["slice"] if df["slice"].astype(str).str.len().gt(0).any() else []) + COLUMNS[-1:]
    shown = df[columns].copy()
    shown["memory_total_bytes"] = shown["memory_total_bytes"].map(fmt_bytes)
    shown["mfu"] = shown["mfu"].map(lambda x: f"{x:.1%}")
    shown["step_time_s"] = shown["step_time_s"].map(lambda x: f"{x:.3g}")
    shown["tokens_per_s"] = shown["tokens_per_s"].map(lambda x: f"{x:,.0f}")
    print(shown.rename(columns={"memory_total_bytes": "memory", "sequence_parallel": "sp",
                                "micro_batch": "mb", "interleave": "v"}).to_string(index=False))
    return 0
