"""``snlab serve``: time to first token, time per output token, throughput and KV-cache
placement of one serving deployment (or the best batch under a latency target); with
``--rate``, the deployment under a stream of requests (:mod:`snlab.cli.load`).

Flags are read as text and converted here, so that a bad value ends in one
``snlab: error: FIELD: ...`` line naming the field and what it accepts.
"""

from __future__ import annotations

import math

from ..errors import SnlabError
from ..units import fmt_bytes, fmt_joules, fmt_rate, fmt_seconds, fmt_watts, parse_quantity
from ..serving.deployment import MAX_ENGINE_MEMORY, MAX_REQUESTS
from ..serving.planner import MAX_COUNT, MAX_DEGREE, MAX_DRAFT_TOKENS
from . import power_flags
from . import load
from .common import count, names, number, print_json, seconds, side_by_side, target

#: flag -> (kind, help); kinds: "int" (whole number >= 1, k/M suffixes), "int0" (>= 0),
#: "fraction" (in [0, 1]), "bytes" (a size, e.g. 4.5GiB), "str"
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
    "ep_overlap": ("fraction", "fraction of the expert all-to-all hidden, with --microbatches 2 (default 0.8 in decode, 0.6 in prefill)"),
    "prefill_batch": ("int", "prompts per prefill pass per replica (default 1)"),
    "hbm_utilization": ("open_fraction", "fraction of HBM for weights and KV cache (default 0.9)"),
    "pool_share": ("fraction", "fraction of the supernode pool's free memory usable (default 1)"),
    "kv_offload": ("str", "auto (spill to pool, host, SSD) or hbm (default auto)"),
    "output_dist": ("str", "output lengths for static batching: fixed, uniform, exponential"),
    "scenario": ("str", "fixed (a batch of --batch sequences in flight) or offline (--requests queued at once, "
                        "scheduled by the engine; default fixed)"),
    "requests": ("requests", "requests of the offline scenario, e.g. 3000"),
    "max_sequences": ("limit", "offline: sequences in flight per replica at most, pp x the engine's "
                               "max_batch_size (default 0: trtllm-bench's, from its estimate of the KV cache); "
                               "no more run at once than the KV cache holds"),
    "max_step_tokens": ("limit", "offline: tokens a step may process per replica, chunked prefill included "
                                 "(default 0: as trtllm-bench sets it)"),
    "kv_fraction": ("open_fraction", "offline: fraction of the memory left after the weights and the engine's "
                                     "working memory given to the KV cache (default 0.95)"),
    "kv_block_tokens": ("block", "offline: tokens per KV-cache block (default 32)"),
    "engine_memory_bytes": ("bytes", "offline and --rate: memory per device the engine keeps besides weights and KV "
                                     "cache, e.g. 4.55GiB (default 4.55 GiB, TensorRT-LLM's)"),
    "expert_imbalance": ("imbalance", "load of the busiest expert device over the mean (default 1.11, EPLB)"),
    "graphs": ("bool", "on or off: the step replayed from a captured graph (default on)"),
    "host_step_s": ("seconds", "host time per step not hidden behind the previous step, e.g. 2ms (default 0)"),
}
#: the largest per-replica limits the offline flags take
MAX_LIMIT = 10**8
_BOOL = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


#: flags a run under --rate does not read, and what it reads instead
_NOT_WITH_RATE = {
    "batch": "no --batch with --rate: an instance keeps as many sequences in flight as its limits and KV cache "
             "allow (--max-sequences bounds them)",
    "context": "no --context with --rate: each request's KV length follows its prompt and output",
    "scenario": "no --scenario with --rate: requests arrive at the rate, neither a fixed batch nor all at once",
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
                        "(e.g. 50ms); --batch is then ignored. Offline: the --max-sequences whose mean TPOT "
                        "is. With --rate: the TPOT target")
    load.register(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    power_flags.add(p)
    p.set_defaults(func=run)


def deployment(args, lengths: bool = True) -> dict:
    """The deployment keywords of :func:`snlab.serve` from parsed flags, each checked
    against its own range (``lengths``: prompt and output lengths required)."""
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
        elif kind == "open_fraction":
            out[flag] = number(flag, text, 0.0, 1.0, "a fraction in (0, 1]")
            if out[flag] == 0:
                raise SnlabError(flag, f"got {text!r}", "a fraction in (0, 1]")
        elif kind == "requests":
            out[flag] = count(flag, text, high=MAX_REQUESTS)
        elif kind == "limit":
            out[flag] = count(flag, text, low=0, high=MAX_LIMIT)
        elif kind == "block":
            out[flag] = count(flag, text, high=1024)
        elif kind == "imbalance":
            out[flag] = number(flag, text, 1.0, 64.0, "a factor from 1 to 64")
        elif kind == "bool":
            if text.lower() not in _BOOL:
                raise SnlabError(flag, f"got {text!r}", "on or off")
            out[flag] = _BOOL[text.lower()]
        elif kind == "bytes":
            out[flag] = size(flag, text)
        elif kind == "seconds":
            try:
                out[flag] = seconds(flag, text, zero=True)
            except SnlabError:
                out[flag] = math.inf
            if not 0 <= out[flag] <= 1:
                raise SnlabError(flag, f"got {text!r}", "a time from 0 to 1 s, e.g. 2ms")
        else:
            out[flag] = text
    for field in ("prompt_len", "output_len"):
        if lengths and field not in out:
            raise SnlabError(field, "missing", f"--{field.replace('_', '-')} N (tokens)")
    return out


def size(field: str, text: str) -> float:
    """A size in bytes from text: a bare number is bytes, or a quantity such as ``4.5GiB``;
    from 0 to 10 TB."""
    try:
        value = float(text)
    except ValueError:
        value = parse_quantity(text, "bytes", field)[0]
    if not 0 <= value <= MAX_ENGINE_MEMORY:       # NaN fails too
        raise SnlabError(field, f"got {text!r}", "a size from 0 to 10 TB, e.g. 4.5GiB or 0")
    return value


def _evaluate(args, system: str, dep: dict):
    from ..serving import serve, serve_best
    power = power_flags.options(args)
    if args.tpot_target is not None:
        return serve_best(args.model, system, tpot_target=target("tpot_target", args.tpot_target), **dep, **power)
    return serve(args.model, system, **dep, **power)


ROWS = [
    ("devices", lambda r: f"{r.devices}"),
    ("devices lending HBM to the pool", lambda r: f"{r.lender_devices}"),
    ("batch (sequences)", lambda r: f"{r.deployment['batch']:,}"),
    ("time to first token", lambda r: fmt_seconds(r.ttft_s)),
    ("time per output token", lambda r: fmt_seconds(r.tpot_s)),
    ("decode tokens/s per device", lambda r: fmt_rate(r.decode_tokens_per_s_per_device)),
    ("  published runs: from", lambda r: "-" if not r.band_runs else fmt_rate(r.decode_tokens_per_s_per_device_low)),
    ("  to", lambda r: "-" if not r.band_runs else fmt_rate(r.decode_tokens_per_s_per_device_high)),
    ("prefill tokens/s per device", lambda r: fmt_rate(r.prefill_tokens_per_s_per_device)),
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
    ("power per device", lambda r: "-" if r.device_power_w is None else fmt_watts(r.device_power_w)),
    ("facility power", lambda r: "-" if r.facility_power_w is None else fmt_watts(r.facility_power_w)),
    ("energy per output token", lambda r: "-" if r.energy_per_token_j is None else fmt_joules(r.energy_per_token_j)),
    ("$ per million output tokens", lambda r: "-" if r.cost_per_million_tokens_usd is None
                                              else f"{r.cost_per_million_tokens_usd:,.4g}"),
]
#: the offline scenario's rows, shown before the fixed batch's when the scenario is offline
OFFLINE_ROWS = [
    ("offline: output tokens/s", lambda r: fmt_rate(r.offline["tokens_per_s"])),
    ("  per device", lambda r: fmt_rate(r.offline["tokens_per_s_per_device"])),
    ("  published runs: from", lambda r: "-" if r.offline["tokens_per_s_per_device_low"] is None
                              else fmt_rate(r.offline["tokens_per_s_per_device_low"])),
    ("  to", lambda r: "-" if r.offline["tokens_per_s_per_device_high"] is None
             else fmt_rate(r.offline["tokens_per_s_per_device_high"])),
    ("offline: mean TTFT", lambda r: fmt_seconds(r.offline["ttft_s"])),
    ("offline: mean TPOT", lambda r: fmt_seconds(r.offline["tpot_s"])),
    ("sequences in flight per replica", lambda r: f"{r.offline['sequences']:,}"),
    ("  the KV cache holds", lambda r: f"{r.offline['kv_sequences']:,}"),
    ("  in a KV cache of", lambda r: fmt_bytes(r.offline["kv_pool_bytes_per_device"])),
    ("waves", lambda r: f"{r.offline['waves']:,}"),
    ("tokens per step", lambda r: f"{r.offline['step_tokens']:,}"),
    ("run time", lambda r: fmt_seconds(r.offline["makespan_s"])),
]


def run(args) -> int:
    if args.rate is not None:
        dep = deployment(args, lengths=False)
        for name, allowed in _NOT_WITH_RATE.items():
            if name in dep:
                raise SnlabError(name, f"got {getattr(args, name)!r} with --rate, which does not read it", allowed)
        for name in ("prompt_len", "output_len", "requests"):
            dep.pop(name, None)          # the workload's, read by the --rate family
        return load.run(args, dep)
    for name in load.LOAD_FLAGS:
        if name != "rate" and getattr(args, name) is not None:
            raise SnlabError(name, f"got {getattr(args, name)!r} without --rate, the stream of requests it belongs to",
                             "--rate R (requests per second), or leave it out")
    dep = deployment(args)
    systems = names("system", args.system, "--system NAME (or NAME,NAME to compare; a .toml path works too)")
    results = [_evaluate(args, s, dep) for s in systems]
    if args.json:
        out = [r.to_dict() for r in results]
        if args.tpot_target is not None:
            for o in out:
                o["tpot_target_s"] = target("tpot_target", args.tpot_target)
        print_json(out[0] if len(out) == 1 else {"systems": out})
        return 0
    if len(results) == 1:
        if args.tpot_target is not None and results[0].deployment["scenario"] == "offline":
            print(f"best max_sequences with mean time per output token <= {args.tpot_target}: "
                  f"{results[0].deployment['max_sequences']:,}")
        elif args.tpot_target is not None:
            print(f"best batch with time per output token <= {args.tpot_target}: {results[0].deployment['batch']:,}")
        print(results[0])
        return 0
    print(f"{results[0].model}: {results[0].deployment_text()}")
    offline = results[0].deployment["scenario"] == "offline"
    side_by_side(results, (OFFLINE_ROWS + ROWS) if offline else ROWS, min_width=14)
    return 0
