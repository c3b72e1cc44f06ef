"""The ``snlab serve`` subcommand (registered by :mod:`snlab.cli`).

Flags are read as text and converted here, so that a bad value ends in one
``snlab: error: FIELD: ...`` line naming the field and what it accepts.
"""

from __future__ import annotations

import json
import re

from .cli import side_by_side
from .errors import SnlabError
from .units import fmt_bytes, fmt_seconds, parse_quantity

# flag -> (deployment field, kind): int = whole number (k/M suffixes allowed), float, str
_FLAGS = {
    "tp": ("tp", "int"), "pp": ("pp", "int"), "dp": ("dp", "int"), "ep": ("ep", "int"),
    "batch": ("batch", "int"), "prompt_len": ("prompt_len", "int"), "output_len": ("output_len", "int"),
    "context": ("context", "int"), "weight_dtype": ("weight_dtype", "str"), "kv_dtype": ("kv_dtype", "str"),
    "draft_tokens": ("draft_tokens", "int"), "acceptance": ("acceptance", "float"),
    "microbatches": ("microbatches", "int"), "ep_overlap": ("ep_overlap", "float"),
    "prefill_batch": ("prefill_batch", "int"), "hbm_utilization": ("hbm_utilization", "float"),
    "pool_share": ("pool_share", "float"), "kv_offload": ("kv_offload", "str"),
    "output_dist": ("output_dist", "str"),
}
_SUFFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


def _count(field: str, text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKMG]?)\s*", text)
    value = float(m.group(1)) * _SUFFIX[m.group(2)] if m else None
    if value is None or value != int(value):
        raise SnlabError(field, f"got {text!r}", "a whole number, e.g. 4096, 128k or 1M")
    return int(value)


def _float(field: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SnlabError(field, f"got {text!r}", "a number") from None


def _seconds(field: str, text: str) -> float:
    try:
        return float(text)                       # a bare number is seconds
    except ValueError:
        return parse_quantity(text, "s", field)[0]


def deployment(args) -> dict:
    """The deployment keywords of :func:`snlab.serve` from parsed flags."""
    out = {}
    for flag, (field, kind) in _FLAGS.items():
        text = getattr(args, flag)
        if text is None:
            continue
        out[field] = {"int": _count, "float": _float, "str": lambda f, x: x}[kind](field, text)
    for field in ("prompt_len", "output_len"):
        if field not in out:
            raise SnlabError(field, "missing", f"--{field.replace('_', '-')} N (tokens)")
    return out


def _evaluate(args, system: str, dep: dict):
    from .serve_planner import serve, serve_best
    if args.tpot_target is not None:
        return serve_best(args.model, system, tpot_target=_seconds("tpot_target", args.tpot_target), **dep)
    return serve(args.model, system, **dep)


_COMPARE_ROWS = [
    ("devices", lambda r: f"{r.devices}"),
    ("batch (sequences)", lambda r: f"{r.deployment['batch']:,}"),
    ("time to first token", lambda r: fmt_seconds(r.ttft_s)),
    ("time per output token", lambda r: fmt_seconds(r.tpot_s)),
    ("decode tokens/s per device", lambda r: _rate(r.decode_tokens_per_s_per_device)),
    ("prefill tokens/s per device", lambda r: _rate(r.prefill_tokens_per_s_per_device)),
    ("weights per device", lambda r: fmt_bytes(r.weights_bytes_per_device)),
    ("KV cache per device", lambda r: fmt_bytes(r.kv_cache_bytes_per_device)),
    ("  in HBM", lambda r: fmt_bytes(r.kv_bytes_per_device["hbm"])),
    ("  in pool", lambda r: fmt_bytes(r.kv_bytes_per_device["pool"])),
    ("  in host memory", lambda r: fmt_bytes(r.kv_bytes_per_device["host"])),
    ("  on SSD", lambda r: fmt_bytes(r.kv_bytes_per_device["ssd"])),
    ("KV cache lives in", lambda r: r.kv_location),
    ("KV read time per step", lambda r: fmt_seconds(r.time_s["kv"])),
    ("KV time per output token", lambda r: fmt_seconds(r.kv["time_per_output_token_s"])),
    ("KV time vs all in HBM", lambda r: f"{r.kv['spill_slowdown']:.3g}x"),
    ("largest batch, HBM only", lambda r: f"{r.limits['max_batch_hbm']:,}"),
    ("largest batch, any tier", lambda r: f"{r.limits['max_batch']:,}"),
    ("largest context at batch", lambda r: f"{r.limits['max_context']:,}"),
    ("fits", lambda r: "yes" if r.fits else "NO"),
    ("limited by", lambda r: r.limited_by),
]


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _cmd_serve(args) -> int:
    dep = deployment(args)
    systems = [s for s in args.system.split(",") if s] if args.system else []
    if not systems:
        raise SnlabError("system", "missing", "--system NAME (or NAME,NAME to compare; a .toml path works too)")
    results = [_evaluate(args, s, dep) for s in systems]
    if args.json:
        out = [r.to_dict() for r in results]
        if args.tpot_target is not None:
            for o in out:
                o["tpot_target_s"] = _seconds("tpot_target", args.tpot_target)
        print(json.dumps(out[0] if len(out) == 1 else {"systems": out}, indent=2))
        return 0
    if len(results) == 1:
        if args.tpot_target is not None:
            print(f"best batch with time per output token <= {args.tpot_target}: {results[0].deployment['batch']:,}")
        print(results[0])
        return 0
    print(f"{results[0].model}: {results[0].deployment_text()}")
    side_by_side(results, _COMPARE_ROWS, min_width=14)
    return 0


def register(sub) -> None:
    """Add the ``serve`` subcommand to the ``snlab`` parser."""
    p = sub.add_parser("serve", help="time to first token, time per output token, throughput and KV-cache "
                                     "placement of one serving deployment")
    p.add_argument("--model", required=True, help="model preset name or .toml path")
    p.add_argument("--system", help="system preset name or .toml path; NAME,NAME compares side by side")
    for flag, help_ in (("tp", "tensor-parallel degree (default 1)"), ("pp", "pipeline stages (default 1)"),
                        ("dp", "model replicas, data-parallel attention (default 1)"),
                        ("ep", "expert-parallel degree; must divide tp x dp (default 1)"),
                        ("batch", "sequences in flight across the deployment (default 1)"),
                        ("prompt_len", "prompt tokens per request (required)"),
                        ("output_len", "output tokens per request (required)"),
                        ("context", "KV length per sequence while decoding, e.g. 1M "
                                    "(default prompt + output/2, capacity at prompt + output)"),
                        ("weight_dtype", "bf16, fp16, fp8, int8, fp4 (default bf16)"),
                        ("kv_dtype", "bf16, fp16, fp8, int8, fp4 (default bf16)"),
                        ("draft_tokens", "speculative / MTP draft tokens per step (default 0)"),
                        ("acceptance", "acceptance rate of a draft token (default 0.7)"),
                        ("microbatches", "2 for two-batch overlap (default 1)"),
                        ("ep_overlap", "fraction of the expert all-to-all hidden, with --microbatches 2 (default 0)"),
                        ("prefill_batch", "prompts per prefill pass per replica (default 1)"),
                        ("hbm_utilization", "fraction of HBM for weights and KV cache (default 0.9)"),
                        ("pool_share", "fraction of the supernode pool's free memory usable (default 1)"),
                        ("kv_offload", "auto (spill to pool, host, SSD) or hbm (default auto)"),
                        ("output_dist", "output lengths for static batching: fixed, uniform, exponential")):
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None, metavar="X", help=help_)
    p.add_argument("--tpot-target", dest="tpot_target", default=None, metavar="T",
                   help="pick the batch with the best throughput whose time per output token is within T "
                        "(e.g. 50ms); --batch is then ignored")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_serve)
