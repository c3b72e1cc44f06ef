"""The serving claims: C9, C10, C13, C14. Each takes the system and model that decide it,
defaulting to the article's setting."""

from __future__ import annotations

import math

from .. import uncertainty
from .verdict import CONDITIONAL, FAILS, HOLDS, Decision, Verdict, verdict_of

LONG = dict(tp=8, prompt_len=1_000_000, output_len=1000, context=1_000_000)


def _decode_band(system):
    return uncertainty.band("serving decode", system.device.family)


def c9(system="cloudmatrix384") -> Verdict:
    """C9: every device addresses the memory of all devices as one large memory, as if local."""
    from ..presets import system as load
    from ..serving import serve
    cm = load(system)
    r = serve("llama3-70b", cm, batch=4, **LONG)
    ratio = cm.device.hbm_bandwidth / cm.pool.bandwidth if cm.pool else math.inf
    pool = cm.pool.capacity if cm.pool else 0.0
    decisions = (Decision("pool over one device's HBM", pool / cm.device.hbm_capacity, 10.0, True),
                 Decision("KV time against all in HBM, 70B at 1M context", r.kv["spill_slowdown"], 1.5, False,
                          _decode_band(cm)))
    return Verdict("C9", "In a supernode every device can address the memory of all devices as one large virtual "
                         "memory, as if it were local.", verdict_of(decisions),
                   "'as if local' means addressable: the pool is reachable, but at the bus's bandwidth and "
                   "latency, not HBM's",
                   {"pool per domain [TB]": pool / 1e12, "HBM / pool bandwidth per device": ratio,
                    "pool latency [us]": (cm.pool.latency if cm.pool else 0.0) * 1e6,
                    "70B decode at 1M context, batch 4: KV time vs all in HBM": r.kv["spill_slowdown"],
                    "devices lending HBM for it": r.lender_devices},
                   f"{cm.name}: {cm.pool.bandwidth / 1e9 if cm.pool else 0:.0f} GB/s per device over the bus "
                   f"against {cm.device.hbm_bandwidth / 1e12:.1f} TB/s of local HBM.", decisions)


def c10(model="llama3-70b", system="dgx-a100") -> Verdict:
    """C10: serving a ~100B model conventionally takes dozens of A800-class cards, with
    about 30% of memory left for KV cache and activations."""
    from ..presets import model as load_model
    from ..presets import system as load_system
    from ..sizing import kv_cache_bytes_per_token
    m, s = load_model(model), load_system(system)
    weights = m.params * 2
    cards_weights = math.ceil(weights / (0.7 * s.device.hbm_capacity))
    per_token = float(kv_cache_bytes_per_token(m, 2.0))
    cards = {ctx: math.ceil((weights + 32 * ctx * per_token) / s.device.hbm_capacity) for ctx in (32_768, 131_072)}
    decisions = (Decision("cards for 32 concurrent 128K-token contexts", cards[131_072], 12, True),
                 Decision("cards for the weights with 30% headroom", cards_weights, 12, True))
    return Verdict("C10", "Serving a model of about 100B parameters conventionally takes dozens of A800-class cards, "
                          "keeping about 30% of memory free for KV cache and activations.", verdict_of(decisions),
                   "many long contexts are served at once (dozens of cards at 32 x 128K tokens); the weights with "
                   "30% headroom need only a few cards",
                   {"weights in bf16 [GB]": weights / 1e9, "cards for weights + 30% headroom": cards_weights,
                    "KV bytes per token": per_token, "cards for 32 concurrent 32K-token contexts": cards[32_768],
                    "cards for 32 concurrent 128K-token contexts": cards[131_072]},
                   f"{m.name} on {s.device.name} ({s.device.hbm_capacity / 2**30:.0f} GiB; an A800 has the same "
                   "memory). Exact arithmetic on the model's shape.", decisions)


QUEUE = dict(tp=8, kv_offload="auto", prompt_len=131_072, output_len=1000, warmup=0.3)


def c13(system="cloudmatrix384", users=32) -> Verdict:
    """C13: KV cache of million-token contexts in the supernode's pool, with continuous
    batching, raises serving throughput several-fold. Decided at a fixed batch, and again
    with a request queue: ``users`` in a closed loop of 128K-token requests, the engine
    admitting as many as its memory holds (:func:`snlab.serving.load.serve_load`)."""
    from ..presets import system as load
    from ..serving import serve
    from ..serving.load import serve_load
    cm = load(system)
    no_pool = cm.replace(pool=None)
    runs = {(b, pool): serve("llama3-70b", cm if pool else no_pool, batch=b, **LONG) for b in (1, 4) for pool in (1, 0)}
    gain = {b: runs[b, 1].decode_tokens_per_s_per_device / runs[b, 0].decode_tokens_per_s_per_device for b in (1, 4)}
    queued = {pool: serve_load("llama3-70b", cm if pool else no_pool, concurrency=users, requests=3 * users, **QUEUE)
              for pool in (1, 0)}
    queue_gain = queued[1].output_tokens_per_s_per_device / queued[0].output_tokens_per_s_per_device
    band = _decode_band(cm)
    decisions = (Decision("pool over host memory, batch 4 (KV cache spilled)", gain[4], 3.0, True, band),
                 Decision("pool over host memory, batch 1 (KV cache fits in HBM)", gain[1], 3.0, True, band),
                 Decision(f"pool over host memory with a request queue ({users} users of 128K-token contexts)",
                          queue_gain, 3.0, True, band))
    return Verdict("C13", "Keeping the KV cache of million-token contexts in the supernode's memory pool, with "
                          "continuous batching, raises serving throughput several-fold.", verdict_of(decisions),
                   "the KV cache outgrows HBM; the gain comes from the pool's bandwidth against PCIe to the host, "
                   "even with the lending devices counted; continuous batching adds only a little",
                   {"pool vs host memory, batch 4 (spilled)": gain[4], "pool vs host memory, batch 1": gain[1],
                    "devices lending HBM, batch 4": runs[4, 1].lender_devices,
                    "continuous over static batching": runs[4, 1].batching["continuous_over_static"],
                    "KV location, batch 4": runs[4, 1].kv_location, "KV location without the pool": runs[4, 0].kv_location,
                    "pool vs host memory with a request queue": queue_gain,
                    "decode batch with a queue, pool / host": f"{queued[1].decode_batch:.0f} / {queued[0].decode_batch:.0f}",
                    "time per output token with a queue, pool / host [s]":
                        f"{queued[1].tpot_s['p50']:.3g} / {queued[0].tpot_s['p50']:.3g}",
                    "devices lending HBM with a queue": queued[1].lender_devices},
                   f"llama3-70b, tp 8, 1M-token context on {cm.name} with and without its pool (the same devices "
                   "spilling to host memory instead); throughput per device counts the devices that lend HBM. With a "
                   "request queue the engine admits every context its memory holds, so both systems run the same "
                   "batch once the pool and host memory both hold it, and each step reads it over the bus or PCIe.",
                   decisions)


def c14(model="llama3.2-1b", cluster="pcie-ethernet-a100", supernode="cloudmatrix384", tp=1, tpot_target=0.05,
        cluster_prices="example-purchase", supernode_prices="example-purchase") -> Verdict:
    """C14: a model of a few billion parameters wastes a supernode; a small cluster with
    dynamic batching is more cost-effective. Decided on the cost per million output tokens
    at the best batch under a time-per-token target (continuous batching, prefills
    included), cluster against supernode with and without its pool, each at its own
    prices (by default the dated example purchase prices with the electricity of the
    region each typically runs in: :func:`snlab.energy.example_prices`)."""
    from ..presets import system as load
    from ..serving import serve_best
    cm, cl = load(supernode), load(cluster)
    kw = dict(tpot_target=tpot_target, prompt_len=1000, output_len=500, tp=tp)
    small = serve_best(model, cl, prices=cluster_prices, **kw)
    with_pool = serve_best(model, cm, prices=supernode_prices, **kw)
    alone = serve_best(model, cm.replace(pool=None), prices=supernode_prices, **kw)
    cost = {"cluster": small.cost_per_million_tokens_usd, "supernode with its pool": with_pool.cost_per_million_tokens_usd,
            "supernode without its pool": alone.cost_per_million_tokens_usd}
    ratio = min(cost["supernode with its pool"], cost["supernode without its pool"]) / cost["cluster"]
    gain = with_pool.decode_tokens_per_s_per_device / alone.decode_tokens_per_s_per_device
    bus = with_pool.time_s["tp"] + with_pool.time_s["ep"]
    even = _break_even_capex(with_pool, cost["cluster"])
    decisions = (Decision("cost per token, supernode over cluster", ratio, 1.0, True, _decode_band(cm)),
                 Decision("throughput per device, with the pool over without", gain, 1.5, False, _decode_band(cm)))
    numbers = {f"cost per million output tokens, {k} [$]": v for k, v in cost.items()}
    numbers.update({"facility energy per output token, cluster [J]": small.energy_per_token_j,
                    "facility energy per output token, supernode [J]": with_pool.energy_per_token_j,
                    "best batch, cluster": small.deployment["batch"], "best batch, supernode": with_pool.deployment["batch"],
                    "bus traffic per decode step, supernode [s]": bus,
                    "throughput per device, with the pool over without": gain})
    return Verdict("C14", "A model of a few billion parameters wastes a supernode; a small cluster with dynamic "
                          "batching is more cost-effective.", verdict_of(decisions),
                   "a supernode device costs more per token than a cluster device: its price over its rate",
                   numbers,
                   f"{model} (tp {tp}) under a {tpot_target * 1e3:.0f} ms time-per-token target, continuous batching "
                   f"with prefills: {cl.name} against {cm.name}, each at its prices ({_price_text(small)}; "
                   f"{_price_text(with_pool)}). The model never crosses the bus, and the pool adds a factor "
                   f"{gain:.2f}; what decides the cost is each device's price over its decode rate. At these "
                   f"prices the supernode's device would have to cost about ${even:,.0f} for the two to cost "
                   "the same per token. The prices are dated examples, not quotes: pass your own.", decisions)


def _break_even_capex(result, target_per_million: float) -> float:
    """The purchase price per device at which ``result`` would cost ``target_per_million``
    dollars per million tokens, its electricity and rate unchanged [$] (NaN when it is rented)."""
    p, pw = result.power["prices"], result.power
    if not p["capex"]:
        return float("nan")
    tokens_per_s = pw["cost_per_hour_usd"] / 3600.0 / (pw["cost_per_million_tokens_usd"] / 1e6)
    devices = result.devices + result.lender_devices
    energy_rate = pw["facility_power_w"] * p["kwh"] / 3.6e6
    lifetime = p["years"] * 365.25 * 86400.0
    return (target_per_million / 1e6 * tokens_per_s - energy_rate) * lifetime * p["utilisation"] / devices


def _price_text(result) -> str:
    p = result.power["prices"]
    if p["device_hour"]:
        return f"{result.system} rented at ${p['device_hour']:.2f} per device-hour"
    return (f"{result.system} bought at ${p['capex']:,.0f} per device over {p['years']:g} years, "
            f"electricity at ${p['kwh']:.3f} per kWh")


__all__ = ["c9", "c10", "c13", "c14", "CONDITIONAL", "FAILS", "HOLDS"]
