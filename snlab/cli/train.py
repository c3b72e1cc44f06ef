"""``snlab train``: step time, MFU and memory of one training plan."""

from __future__ import annotations

from ..units import fmt_joules, fmt_seconds
from . import plan_flags, power_flags
from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("train", help="step time, MFU and memory of one training plan")
    p.add_argument("--system", required=True, help="system preset name or .toml path")
    plan_flags.add(p)
    power_flags.add(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import train
    tokens = plan_flags.tokens(args)
    result = train(args.model, args.system, precision=args.precision, **plan_flags.plan(args),
                   **power_flags.options(args))
    energy, cost = (result.energy_to_train_j(tokens), result.cost_to_train_usd(tokens)) if tokens else (None, None)
    if args.json:
        out = result.to_dict()
        if tokens:
            out["time_to_train_s"] = result.time_to_train_s(tokens)
            out["energy_to_train_j"] = energy
            out["cost_to_train_usd"] = cost
        print_json(out)
    else:
        print(result)
        if tokens:
            print(f"  time to train {tokens:.3g} tokens: {fmt_seconds(result.time_to_train_s(tokens))}")
            if energy is not None:
                print(f"  energy to train them: {fmt_joules(energy)} at the facility"
                      + (f", costing ${cost:,.0f}" if cost is not None else ""))
    return 0
