"""``snlab search``: the fastest training plans that fit."""

from __future__ import annotations

import json

from ..errors import SnlabError
from ..training.planner import OBJECTIVES
from ..units import fmt_bytes, fmt_joules, fmt_seconds, fmt_watts, parse_quantity
from . import plan_flags, power_flags
from ..training.planner import MAX_DEVICES, MAX_TOP
from .common import integer_flag, print_json

COLUMNS = ["tp", "pp", "dp", "ep", "cp", "micro_batch", "interleave", "zero", "recompute", "sequence_parallel",
           "step_time_s", "mfu", "mfu_low", "mfu_high", "tokens_per_s", "memory_total_bytes", "limited_by",
           "validated"]
#: the power columns shown when the system has a power model (and prices were given)
POWER_COLUMNS = ["facility_power_w", "energy_per_token_j", "cost_per_million_tokens_usd"]


def _budget(text):
    """A power budget [W] from text: a bare number is watts, or a quantity such as 2MW."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        try:
            return parse_quantity(text, "W", "power_budget")[0]
        except SnlabError:
            raise SnlabError("power_budget", f"got {text!r}", "a power from 1 W to 10 GW, e.g. 2MW or 500kW") from None


def register(sub) -> None:
    p = sub.add_parser("search", help="the fastest training plans that fit")
    p.add_argument("--system", required=True)
    p.add_argument("--devices", type=integer_flag("devices", high=MAX_DEVICES), required=True)
    p.add_argument("--top", type=integer_flag("top", high=MAX_TOP), default=10)
    p.add_argument("--validated-only", action="store_true",
                   help="only plans inside what the system's published runs cover (degrees, ZeRO, recomputation)")
    plan_flags.add(p, degrees=False)
    power_flags.add(p)
    p.add_argument("--objective", choices=list(OBJECTIVES), default="tokens_per_s",
                   help="what the best plan maximises (tokens_per_dollar needs prices)")
    p.add_argument("--power-budget", default=None, metavar="P",
                   help="keep plans whose facility power is within P, e.g. 2MW or '500 kW'")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import search
    fixed = plan_flags.plan(args, degrees=False)
    fixed.pop("global_batch")
    df = search(args.model, args.system, devices=args.devices, global_batch=args.global_batch,
                precision=args.precision, top=args.top, validated_only=args.validated_only,
                objective=args.objective, power_budget=_budget(args.power_budget), **fixed,
                **power_flags.options(args))
    columns = COLUMNS + [c for c in POWER_COLUMNS if c in df.columns]
    tokens = plan_flags.tokens(args)
    if tokens:                       # each plan's time (and energy) to train on them
        df = df.assign(time_to_train_s=tokens / df["tokens_per_s"])
        columns.append("time_to_train_s")
        if "energy_per_token_j" in df:
            df = df.assign(energy_to_train_j=tokens * df["energy_per_token_j"])
            columns.append("energy_to_train_j")
    if args.json:
        print_json(json.loads(df[columns + (["slice"] if "slice" in df else [])]
                              .to_json(orient="records", double_precision=15)))
        return 0
    if df.empty:
        print(_why_none(args, df.attrs))
        return 0
    print(f"{args.model} on {args.devices} devices of {args.system}, global batch {args.global_batch}: "
          f"best {len(df)} of {df.attrs.get('evaluated', 0):,} plans evaluated")
    if "slice" in df and df["slice"].astype(str).str.len().gt(0).any():
        columns = columns + ["slice"]
    shown = df[columns].copy()
    for col in ("facility_power_w",):
        if col in shown:
            shown[col] = shown[col].map(fmt_watts)
    for col in ("energy_per_token_j",):
        if col in shown:
            shown[col] = shown[col].map(fmt_joules)
    if tokens:
        shown["time_to_train_s"] = shown["time_to_train_s"].map(fmt_seconds)
        if "energy_to_train_j" in shown:
            shown["energy_to_train_j"] = shown["energy_to_train_j"].map(fmt_joules)
    shown["memory_total_bytes"] = shown["memory_total_bytes"].map(fmt_bytes)
    shown["mfu"] = [f"{x:.1%}" + (f" ({lo:.0%}-{hi:.0%})" if lo is not None and lo == lo else "")
                    for x, lo, hi in zip(df["mfu"], df["mfu_low"].astype(object).where(df["mfu_low"].notna(), None),
                                         df["mfu_high"].astype(object).where(df["mfu_high"].notna(), None))]
    shown = shown.drop(columns=["mfu_low", "mfu_high", "validated"])
    shown["validated"] = df["validated"].map({True: "", False: "*"}).to_numpy()     # the mark, last
    shown["step_time_s"] = shown["step_time_s"].map(lambda x: f"{x:.3g}")
    shown["tokens_per_s"] = shown["tokens_per_s"].map(lambda x: f"{x:,.0f}")
    print(shown.rename(columns={"memory_total_bytes": "memory", "sequence_parallel": "sp", "micro_batch": "mb",
                                "interleave": "v", "mfu": "mfu (published runs)", "validated": "",
                                "facility_power_w": "facility", "energy_per_token_j": "J/token",
                                "cost_per_million_tokens_usd": "$/Mtok", "time_to_train_s": f"time, {tokens or 0:.3g} tokens",
                                "energy_to_train_j": "energy"}).to_string(index=False))
    if not df["validated"].all():
        print("* outside what the published runs of this chip family cover: a degree, ZeRO stage, recomputation "
              "or precision none of them used (--validated-only leaves these out)")
    return 0


def _why_none(args, attrs: dict) -> str:
    """Why a search printed no plan: none fits, or a filter removed those that do."""
    where = f"{args.model} on {args.devices} devices of {args.system}"
    fitting, validated = attrs.get("fitting", 0), attrs.get("validated", 0)   # plans each filter left
    if not fitting:
        return f"no plan fits {where}"
    if args.validated_only and not validated:
        return (f"plans fit {where}, but none is validated (--validated-only): no published run covers this "
                "device family and plan shape")
    return f"plans fit {where}, but none is within the power budget {args.power_budget}"
