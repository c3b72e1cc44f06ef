"""``snlab compare``: one training plan on several systems, side by side."""

from __future__ import annotations

from ..units import fmt_bytes, fmt_joules, fmt_seconds, fmt_watts
from . import plan_flags, power_flags
from .common import names, print_json, side_by_side

ROWS = [
    ("devices", lambda r: f"{r.devices}"),
    ("step time", lambda r: fmt_seconds(r.step_time_s)),
    ("MFU", lambda r: f"{r.mfu:.1%}"),
    ("  published runs: from", lambda r: "-" if not r.band_runs else f"{r.mfu_low:.1%}"),
    ("  to", lambda r: "-" if not r.band_runs else f"{r.mfu_high:.1%}"),
    ("HFU", lambda r: f"{r.hfu:.1%}"),
    ("tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
    ("compute", lambda r: fmt_seconds(r.time_s["compute"])),
    ("exposed TP comm", lambda r: fmt_seconds(r.time_s["exposed"]["tp"])),
    ("exposed EP comm", lambda r: fmt_seconds(r.time_s["exposed"]["ep"])),
    ("exposed PP sends", lambda r: fmt_seconds(r.time_s["exposed"]["pp"])),
    ("exposed DP grads", lambda r: fmt_seconds(r.time_s["exposed"]["dp"])),
    ("exposed ZeRO/FSDP", lambda r: fmt_seconds(r.time_s["exposed"]["zero"])),
    ("overlap contention", lambda r: fmt_seconds(r.time_s["contention"])),
    ("pipeline bubble", lambda r: fmt_seconds(r.time_s["bubble"])),
    ("offload", lambda r: fmt_seconds(r.time_s["offload"])),
    ("memory/device", lambda r: fmt_bytes(r.memory_bytes_per_device["total"])),
    ("fits", lambda r: "yes" if r.fits else "NO"),
    ("limited by", lambda r: r.limited_by),
    ("power per device", lambda r: "-" if r.device_power_w is None else fmt_watts(r.device_power_w)),
    ("facility power", lambda r: "-" if r.facility_power_w is None else fmt_watts(r.facility_power_w)),
    ("racks", lambda r: "-" if not r.power else f"{r.power['racks']:,}"),
    ("energy per token", lambda r: "-" if r.energy_per_token_j is None else fmt_joules(r.energy_per_token_j)),
    ("$ per million tokens", lambda r: "-" if r.cost_per_million_tokens_usd is None
                                       else f"{r.cost_per_million_tokens_usd:,.4g}"),
]


def register(sub) -> None:
    p = sub.add_parser("compare", help="one training plan on several systems, side by side")
    p.add_argument("--systems", required=True, help="comma-separated system names or .toml paths")
    plan_flags.add(p)
    power_flags.add(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import train
    systems = names("systems", args.systems, "comma-separated system names or .toml paths")
    power = power_flags.options(args)
    results = [train(args.model, s, precision=args.precision, **plan_flags.plan(args), **power) for s in systems]
    if args.json:
        print_json([r.to_dict() for r in results])
        return 0
    p = results[0].plan
    print(f"{results[0].model}: tp={p['tp']} pp={p['pp']} dp={p['dp']} ep={p['ep']} cp={p['cp']}, "
          f"micro-batch {p['micro_batch']}, global batch {p['global_batch']}, recompute {p['recompute']}")
    side_by_side(results, ROWS)
    return 0
