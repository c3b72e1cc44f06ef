"""``snlab search``: the fastest training plans that fit."""

from __future__ import annotations

import json

from ..units import fmt_bytes
from . import plan_flags
from ..training.planner import MAX_DEVICES, MAX_TOP
from .common import integer_flag, print_json

COLUMNS = ["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "zero", "recompute", "sequence_parallel",
           "step_time_s", "mfu", "mfu_low", "mfu_high", "tokens_per_s", "memory_total_bytes", "limited_by",
           "validated"]


def register(sub) -> None:
    p = sub.add_parser("search", help="the fastest training plans that fit")
    p.add_argument("--system", required=True)
    p.add_argument("--devices", type=integer_flag("devices", high=MAX_DEVICES), required=True)
    p.add_argument("--top", type=integer_flag("top", high=MAX_TOP), default=10)
    p.add_argument("--validated-only", action="store_true",
                   help="only plans inside what the system's published runs cover (degrees, ZeRO, recomputation)")
    plan_flags.add(p, degrees=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import search
    fixed = plan_flags.plan(args, degrees=False)
    fixed.pop("global_batch")
    df = search(args.model, args.system, devices=args.devices, global_batch=args.global_batch,
                precision=args.precision, top=args.top, validated_only=args.validated_only, **fixed)
    if args.json:
        print_json(json.loads(df[COLUMNS].to_json(orient="records", double_precision=15)))
        return 0
    if df.empty:
        print(f"no plan fits {args.model} on {args.devices} devices of {args.system}")
        return 0
    print(f"{args.model} on {args.devices} devices of {args.system}, global batch {args.global_batch}: "
          f"best {len(df)} of {df.attrs.get('evaluated', 0):,} plans evaluated")
    shown = df[COLUMNS].copy()
    shown["memory_total_bytes"] = shown["memory_total_bytes"].map(fmt_bytes)
    shown["mfu"] = [f"{x:.1%}" + (f" ({lo:.0%}-{hi:.0%})" if lo is not None and lo == lo else "")
                    for x, lo, hi in zip(df["mfu"], df["mfu_low"].astype(object).where(df["mfu_low"].notna(), None),
                                         df["mfu_high"].astype(object).where(df["mfu_high"].notna(), None))]
    shown["validated"] = df["validated"].map({True: "", False: "*"})
    shown = shown.drop(columns=["mfu_low", "mfu_high"])
    shown["step_time_s"] = shown["step_time_s"].map(lambda x: f"{x:.3g}")
    shown["tokens_per_s"] = shown["tokens_per_s"].map(lambda x: f"{x:,.0f}")
    print(shown.rename(columns={"memory_total_bytes": "memory", "sequence_parallel": "sp", "micro_batch": "mb",
                                "interleave": "v", "mfu": "mfu (published runs)", "validated": ""})
          .to_string(index=False))
    if not df["validated"].all():
        print("* outside what the published runs of this chip family cover: a degree, ZeRO stage, recomputation "
              "or precision none of them used (--validated-only leaves these out)")
    return 0
