"""``snlab serve``: time to first token, time per output token, throughput and KV-cache
placement of one serving deployment (or the best batch under a latency target).

Flags are read as text and converted here, so that a bad value ends in one
``snlab: error: FIELD: ...`` line naming the field and what it accepts.
"""

from __future__ import annotations

from ..errors import SnlabError
from ..units import fmt_bytes, fmt_seconds
from ..serving.planner import MAX_COUNT, MAX_DEGREE, MAX_DRAFT_TOKENS
from .common import count, number, print_json, seconds, side_by_side

#: flag -> (kind, help); kinds: "int" (whole number >= 1, k/M suffixes), "int0" (>= 0),
#: "fraction" (in [0, 1]), "str"
FLAGS = {
    "tp": ("int", "tensor-parallel degree (default 1)"), "pp": ("int", "pipeline stages (default 1)"),
    "dp": ("int", "model replicas, data-parallel attention (default 1)"),
    "ep": ("int", "expert-parallel degree; must divide tp x dp (default 1)"),
    "batch": ("int", "sequences in flight across the deployment (default 1)"),
    "prompt_len": ("int", "prompt tokens per request (required)"),
    "output_len": ("int", "output tokens per request (required)"),
    "context": ("int", "KV length per sequence while decoding, e.g. 1M (default prompt + output/2, capacity at "
                       "prompt + output)"),
    "weight_dtype": ("str", "bf16, fp16, fp8, int8, fp4 (default bf16)"),
    "kv_dtype": ("str", "bf16, fp16, fp8, int8, fp4 (default bf16)"),
    "draft_tokens": ("int0", "speculative / MTP draft tokens per step (default 0)"),
    "acceptance": ("fraction", "acceptance rate of a draft token (default 0.7)"),
    "microbatches": ("int", "2 for two-batch overlap (default 1)"),
    "ep_overlap": ("fraction", "fraction of the expert all-to-all hidden, with --microbatches 2 (default 0)"),
    "prefill_batch": ("int", "prompts per prefill pass per replica (default 1)"),
    "hbm_utilization": ("fraction", "fraction of HBM for weights and KV cache (default 0.9)"),
    "pool_share": ("fraction", "fraction of the supernode pool's free memory usable (default 1)"),
    "kv_offload": ("str", "auto (spill to pool, host, SSD) or hbm (default auto)"),
    "output_dist": ("str", "output lengths for static batching: fixed, uniform, exponential"),
}


def register(sub) -> None:
    p = sub.add_parser("serve", help="time to first token, time per output token, throughput and KV-cache "
                                     "placement of one serving deployment")
    p.add_argument("--model", required=True, help="model preset name or .toml path")
    p.add_argument("--system", help="system preset name or .toml path; NAME,NAME compares side by side")
    for flag, (_, help_) in FLAGS.items():
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None, metavar="X", help=help_)
    p.add_argument("--tpot-target", dest="tpot_target", default=None, metavar="T",
                   help="pick the batch with the best throughput whose time per output token is within T "
                        "(e.g. 50ms); --batch is then ignored")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def deployment(args) -> dict:
    """The deployment keywords of :func:`snlab.serve` from parsed flags, each checked
    against its own range."""
    out = {}
    for flag, (kind, _) in FLAGS.items():
        text = getattr(args, flag)
        if text is None:
            continue
        if kind == "int":
            out[flag] = count(flag, text, high=MAX_DEGREE if flag in ("tp", "pp", "dp", "ep") else MAX_COUNT)
        elif kind == "int0":
            out[flag] = count(flag, text, low=0, high=MAX_DRAFT_TOKENS)
        elif kind == "fraction":
            out[flag] = number(flag, text, 0.0, 1.0, "a fraction in [0, 1]")
        else:
            out[flag] = text
    for field in ("prompt_len", "output_len"):
        if field not in out:
            raise SnlabError(field, "missing", f"--{field.replace('_', '-')} N (tokens)")
    return out


def _evaluate(args, system: str, dep: dict):
    from ..serving import serve, serve_best
    if args.tpot_target is not None:
        return serve_best(args.model, system, tpot_target=seconds("tpot_target", args.tpot_target), **dep)
    return serve(args.model, system, **dep)


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


ROWS = [
    ("devices", lambda r: f"{r.devices}"),
    ("devices lending HBM to the pool", lambda r: f"{r.lender_devices}"),
    ("batch (sequences)", lambda r: f"{r.deployment['batch']:,}"),
    ("time to first token", lambda r: fmt_seconds(r.ttft_s)),
    ("time per output token", lambda r: fmt_seconds(r.tpot_s)),
    ("decode tokens/s per device", lambda r: _rate(r.decode_tokens_per_s_per_device)),
    ("  published runs: from", lambda r: "-" if not r.band_runs else _rate(r.decode_tokens_per_s_per_device_low)),
    ("  to", lambda r: "-" if not r.band_runs else _rate(r.decode_tokens_per_s_per_device_high)),
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


def run(args) -> int:
    dep = deployment(args)
    systems = [s for s in args.system.split(",") if s] if args.system else []
    if not systems:
        raise SnlabError("system", "missing", "--system NAME (or NAME,NAME to compare; a .toml path works too)")
    results = [_evaluate(args, s, dep) for s in systems]
    if args.json:
        out = [r.to_dict() for r in results]
        if args.tpot_target is not None:
            for o in out:
                o["tpot_target_s"] = seconds("tpot_target", args.tpot_target)
        print_json(out[0] if len(out) == 1 else {"systems": out})
        return 0
    if len(results) == 1:
        if args.tpot_target is not None:
            print(f"best batch with time per output token <= {args.tpot_target}: {results[0].deployment['batch']:,}")
        print(results[0])
        return 0
    print(f"{results[0].model}: {results[0].deployment_text()}")
    side_by_side(results, ROWS, min_width=14)
    return 0
