"""``snlab serve --rate R``: a deployment under a stream of requests.

With both latency targets and no plan (``--tp``, ``--prefill-tp``, ``--decode-tp``,
``--instances``), it plans capacity: how many devices of each system serve the rate,
colocated and disaggregated, and in which split (:func:`snlab.serving.capacity.serve_capacity`).
Otherwise it runs the given plan, colocated and disaggregated (one prefill and one
decode instance of the plan unless the flags say), and reports TTFT, TPOT and
inter-token latency at p50/p90/p99, queueing delay, throughput and goodput
(:func:`snlab.serving.load.serve_load`).
"""

from __future__ import annotations

from ..errors import SnlabError
from ..serving.workload import CACHE_TIERS, LENGTHS, MAX_REQUESTS, MAX_TOKENS
from ..units import fmt_seconds
from .common import count, names, number, print_json, target

#: the --rate family: flag -> (kind, help)
LOAD_FLAGS = {
    "rate": ("rate", "requests per second arriving (Poisson); with --ttft-target and --tpot-target and no plan, "
                     "plan the devices that serve it"),
    "ttft_target": ("seconds", "time-to-first-token target, e.g. 500ms"),
    "lengths": ("choice", "prompt and output lengths: fixed (--prompt-len, --output-len) or a trace: "
                          + ", ".join(LENGTHS[1:])),
    "arrival_scv": ("scv", "squared coefficient of variation of the gaps between arrivals (1: Poisson; above: "
                           "bursts, gamma gaps)"),
    "seed": ("seed", "random seed of the workload (default 0)"),
    "cache_hit_rate": ("fraction", "share of prompt tokens found in the prefix cache (default 0)"),
    "cache_tier": ("choice", "where the prefix cache lives: " + ", ".join(CACHE_TIERS)),
    "policy": ("choice", "colocated scheduler: chunked (default), mixed, prefill-first"),
    "instances": ("int", "colocated instances, requests dealt in turn (default 1)"),
    "prefill_tp": ("int", "disaggregated: tensor-parallel degree of a prefill instance (default --tp)"),
    "decode_tp": ("int", "disaggregated: tensor-parallel degree of a decode instance (default --tp)"),
    "prefill_instances": ("int", "disaggregated: prefill instances (default 1)"),
    "decode_instances": ("int", "disaggregated: decode instances (default 1)"),
    "kv_link": ("choice", "disaggregated: the level the KV cache crosses: auto, scale-up, scale-out"),
}
_PLAN = ("tp", "prefill_tp", "decode_tp", "instances", "prefill_instances", "decode_instances")


def register(p) -> None:
    """Add the --rate family to the serve parser (``--tpot-target`` and ``--requests``
    are shared: with --rate, the TPOT target and the requests to run, default 1,000)."""
    for flag, (_, help_) in LOAD_FLAGS.items():
        p.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None, metavar="X", help=help_)


def _workload(args) -> dict:
    """The workload keywords from the flags, each checked against its own range."""
    rate = number("rate", args.rate, 0.0, 1e6, "a rate > 0 requests per second, at most 1,000,000")
    if rate <= 0:
        raise SnlabError("rate", f"got {args.rate!r}", "a rate > 0 requests per second, at most 1,000,000")
    out = {"rate": rate, "lengths": args.lengths or "fixed"}
    if out["lengths"] not in LENGTHS:
        raise SnlabError("lengths", f"got {args.lengths!r}", ", ".join(LENGTHS))
    if out["lengths"] == "fixed":
        for field in ("prompt_len", "output_len"):
            text = getattr(args, field)
            if text is None:
                raise SnlabError(field, "missing", f"--{field.replace('_', '-')} N (tokens), or --lengths TRACE")
            out[field] = count(field, text, high=MAX_TOKENS)
    if args.arrival_scv is not None:
        out["arrival_scv"] = number("arrival_scv", args.arrival_scv, 1e-6, 1e3, "a number > 0 and at most 1,000")
    if args.requests is not None:
        out["requests"] = count("requests", args.requests, high=MAX_REQUESTS)
    if args.seed is not None:
        out["seed"] = count("seed", args.seed, low=0, high=2**32 - 1)
    if args.cache_hit_rate is not None:
        out["cache_hit_rate"] = number("cache_hit_rate", args.cache_hit_rate, 0.0, 0.999, "a fraction in [0, 1)")
    if args.cache_tier is not None:
        out["cache_tier"] = args.cache_tier
    return out


def _targets(args) -> dict:
    return {name: target(name, getattr(args, name)) for name in ("ttft_target", "tpot_target")
            if getattr(args, name) is not None}


def run(args, deployment: dict) -> int:
    """Plan capacity, or run the plan colocated and disaggregated, on every system named."""
    from ..serving.capacity import serve_capacity
    work, targets = _workload(args), _targets(args)
    systems = names("system", args.system, "--system NAME (or NAME,NAME to compare)")
    planned = len(targets) == 2 and all(getattr(args, k, None) is None for k in _PLAN)
    if planned:
        plans = [serve_capacity(args.model, s, **work, **targets, **deployment) for s in systems]
        if args.json:
            print_json(plans[0].to_dict() if len(plans) == 1 else {"systems": [p.to_dict() for p in plans]})
        else:
            print("\n\n".join(str(p) for p in plans))
        return 0
    results = []
    for s in systems:
        results += _runs(args, s, work, targets, deployment)
    if args.json:
        print_json({"runs": [r.to_dict() for r in results]})
        return 0
    print(f"{results[0].model}: {results[0].workload}")
    _table(results)
    return 0


def _runs(args, system: str, work: dict, targets: dict, deployment: dict) -> list:
    from ..serving.load import MAX_INSTANCES, serve_load
    policy = args.policy or "chunked"
    n = count("instances", args.instances, high=MAX_INSTANCES) if args.instances else 1
    colocated = serve_load(args.model, system, **work, **targets, **deployment, policy=policy, instances=n)
    tp = deployment.get("tp", 1)
    plan = {k: v for k, v in deployment.items() if k != "tp"}
    p_tp = count("prefill_tp", args.prefill_tp) if args.prefill_tp else tp
    d_tp = count("decode_tp", args.decode_tp) if args.decode_tp else tp
    x = count("prefill_instances", args.prefill_instances, high=MAX_INSTANCES) if args.prefill_instances else 1
    y = count("decode_instances", args.decode_instances, high=MAX_INSTANCES) if args.decode_instances else 1
    try:
        split = serve_load(args.model, system, **work, **targets, **plan, prefill=dict(tp=p_tp), decode=dict(tp=d_tp),
                           prefill_instances=x, decode_instances=y, kv_link_level=args.kv_link or "auto")
    except SnlabError as error:         # the API's kv_link_level is this command's --kv-link
        if error.field != "kv_link_level":
            raise
        raise SnlabError("kv_link", error.problem, error.allowed) from None
    return [colocated, split]


def _ms(x) -> str:
    return "-" if x is None else fmt_seconds(x)


ROWS = [
    ("devices", lambda r: f"{r.devices:,}"),
    ("TTFT p50 / p90 / p99", lambda r: " / ".join(_ms(r.ttft_s[k]) for k in ("p50", "p90", "p99"))),
    ("TPOT p50 / p90 / p99", lambda r: " / ".join(_ms(r.tpot_s[k]) for k in ("p50", "p90", "p99"))),
    ("inter-token p99", lambda r: _ms(r.itl_s["p99"])),
    ("queueing delay p90", lambda r: _ms(r.queue_s["p90"])),
    ("throughput [req/s]", lambda r: f"{r.throughput_rps:.4g}"),
    ("output tokens/s per device", lambda r: f"{r.output_tokens_per_s_per_device:,.1f}"),
    ("within targets", lambda r: "-" if r.attainment is None else f"{r.attainment:.1%}"),
    ("goodput [req/s]", lambda r: "-" if r.goodput_rps is None else f"{r.goodput_rps:.4g}"),
    ("goodput per device", lambda r: "-" if r.goodput_per_device_rps is None else f"{r.goodput_per_device_rps:.4g}"),
    ("KV transfer (mean)", lambda r: f"{_ms(r.kv_transfer['mean_s'])} {r.kv_transfer['level']}"
                                     if r.kv_transfer else "-"),
]


def _table(results) -> None:
    heads = [f"{r.system} {r.mode[:6]}." if r.mode == "disaggregated" else f"{r.system} {r.mode}" for r in results]
    width = max(len(label) for label, _ in ROWS)
    cells = [[fn(r) for r in results] for _, fn in ROWS]
    cols = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    print(" " * (width + 2) + "  ".join(f"{h:>{w}}" for h, w in zip(heads, cols)))
    for (label, _), row in zip(ROWS, cells):
        print(f"{label:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(row, cols)))
