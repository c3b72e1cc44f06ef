"""The source article's claims (C1-C16) put to the model.

Each ``c*`` function computes the numbers that test one claim with the library's
formulas and planners, and derives the verdict from them: ``holds``, ``holds only if
...`` or ``does not hold``. Nothing here states a verdict without computing it; if the
model changes so that a verdict flips, the claims notebook and its tests fail.
The claims are paraphrased; the article's wording is not reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HOLDS, CONDITIONAL, FAILS = "holds", "holds only if", "does not hold"


@dataclass(frozen=True)
class Verdict:
    """A claim, the numbers the model computes for it, and the verdict they give."""

    claim_id: str
    claim: str
    verdict: str
    condition: str
    numbers: dict = field(default_factory=dict)
    explanation: str = ""

    def __str__(self) -> str:
        head = f"{self.claim_id}: {self.verdict}" + (f" {self.condition}" if self.verdict == CONDITIONAL else "")
        nums = ", ".join(f"{k} = {_fmt(v)}" for k, v in self.numbers.items())
        return f"{head}\n  {self.claim}\n  {nums}\n  {self.explanation}"

    def _repr_markdown_(self) -> str:
        rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in self.numbers.items())
        cond = f" *{self.condition}*" if self.verdict == CONDITIONAL else ""
        return (f"**{self.claim_id}: {self.verdict}**{cond}\n\n> {self.claim}\n\n"
                f"| quantity | value |\n|---|---|\n{rows}\n\n{self.explanation}")


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


# --- the memory wall ------------------------------------------------------------------------

def c1() -> Verdict:
    """C1: a dense 1T-parameter model needs about 2 TB for its BF16 weights."""
    from .presets import model
    from .walls import memory as mw
    n = model("megatron-1t").params
    weights = float(mw.weight_memory(params_per_device=n, weight_bytes=2, zero_stage=0, zero_shards=1))
    ok = abs(weights / 2e12 - 1) < 0.05
    return Verdict("C1", "A dense 1T-parameter model needs about 2 TB just for its BF16 weights.",
                   HOLDS if ok else FAILS, "",
                   {"parameters": n, "BF16 weights [TB]": weights / 1e12},
                   "Two bytes per parameter: megatron-1t (Narayanan et al. 2021 Table 1) has 1.008e12.")


def c2() -> Verdict:
    """C2: Adam adds about 4 TB for its moment and variance at 1T parameters."""
    from .presets import model
    from .walls import memory as mw
    n = model("megatron-1t").params
    states = {q: float(mw.optimizer_memory(params_per_device=n, optimizer_bytes=q, zero_stage=0, zero_shards=1))
              for q in (4, 8, 12)}
    verdict = CONDITIONAL if abs(states[4] / 4e12 - 1) < 0.05 else FAILS
    return Verdict("C2", "Adam adds about 4 TB more for its moment and variance at that scale.", verdict,
                   "the two moments are kept in 16-bit; standard mixed-precision Adam keeps them in fp32 "
                   "(8 TB) plus an fp32 master copy of the weights: 12 TB of optimizer state",
                   {"moments in bf16 [TB]": states[4] / 1e12, "moments in fp32 [TB]": states[8] / 1e12,
                    "fp32 master + moments [TB]": states[12] / 1e12},
                   "Rajbhandari et al. 2019 (ZeRO) Sec. 3.1: K = 12 bytes per parameter of optimizer state.")


def c3() -> Verdict:
    """C3: from 10B to 1T, activations, optimizer state and gradient traffic grow
    'exponentially' and model scale 'cubically'."""
    from .presets import model
    from .sizing import activation_bytes_per_layer, forward_flops_per_token
    small, big = model("megatron-7.5b"), model("megatron-1t")
    def per_layer_act(m):
        return float(activation_bytes_per_layer(m, seq_len=2048, recompute=1)) * m.layers
    ratios = {
        "parameters": big.params / small.params,
        "optimizer state": big.params / small.params,
        "gradient all-reduce bytes": big.params / small.params,
        "FLOPs per token": float(forward_flops_per_token(big, 2048) / forward_flops_per_token(small, 2048)),
        "activations per sequence": per_layer_act(big) / per_layer_act(small),
    }
    n = ratios["parameters"]
    linear_or_less = all(r <= n * 1.1 for r in ratios.values())
    return Verdict("C3", "From 10B to 1T parameters, activations, optimizer state and gradient traffic grow "
                         "exponentially, and model scale cubically.",
                   FAILS if linear_or_less else CONDITIONAL, "",
                   {f"{k} ratio": v for k, v in ratios.items()},
                   "Every quantity grows at most in proportion to the parameters (activations per sequence "
                   "grow with L x h, slower still): growth is linear, not exponential or cubic.")


# --- training ---------------------------------------------------------------------------------

_TRILLION = dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072, recompute="full")


def _lost(row) -> float:
    """Share of a step lost to synchronisation: exposed communication, the pipeline
    bubble, and the compute slowed by the communication hidden beside it."""
    return float((row.exposed_comm_s + row.time_bubble_s + row.time_contention_s) / row.step_time_s)


def c4_c5() -> Verdict:
    """C4/C5: on PCIe/Ethernet clusters, synchronisation eats 30-40% of utilisation at
    trillion scale; such clusters reach 30-40% MFU. Tested twice: with the plan of the
    published trillion-parameter run (Narayanan et al. 2021) and with the best plan
    ``search`` finds for the same cluster."""
    from .training import search, sweep
    band = (0.25, 0.45)
    paper = sweep("megatron-1t", "pcie-ethernet-a100", **_TRILLION).iloc[0]
    best = {name: search("megatron-1t", name, devices=3072, global_batch=3072, top=1).iloc[0]
            for name in ("pcie-ethernet-a100", "cloudmatrix384")}
    p, c = best["pcie-ethernet-a100"], best["cloudmatrix384"]

    def in_claim(row):
        return _lost(row) >= 0.25 and band[0] <= row.mfu <= band[1]

    verdict = HOLDS if in_claim(paper) and in_claim(p) else (CONDITIONAL if in_claim(paper) else FAILS)
    return Verdict("C4/C5", "On PCIe-in-server, Ethernet-between-servers clusters, synchronisation and link "
                            "bandwidth eat 30-40% of utilisation at trillion scale; MFU stays at 30-40%.",
                   verdict, "the plan is the one built for NVLink servers (tp 8 across PCIe, 64 pipeline "
                            "stages); the best plan for the cluster keeps tensor parallelism small and loses less",
                   {"paper's plan: MFU": float(paper.mfu), "paper's plan: share lost": _lost(paper),
                    "best plan: MFU": float(p.mfu), "best plan: share lost": _lost(p),
                    "CloudMatrix384 best plan: MFU": float(c.mfu), "CloudMatrix384 best plan: share lost": _lost(c)},
                   "megatron-1t on 3,072 devices, global batch 3,072; the paper's plan is tp 8, pp 64, dp 6 "
                   "with full recomputation, the best plans are snlab.search's. 'Share lost' is exposed "
                   "communication, the pipeline bubble and the compute slowed by overlapped communication, "
                   "as a share of the step.")


def c6() -> Verdict:
    """C6: a cross-node all-reduce costs tens of microseconds conventionally and is
    sub-microsecond inside a supernode."""
    from .presets import system
    from .hardware import hardware
    from .network import all_reduce
    S_small, S_big, n = np.array(64e3), np.array(2048 * 25600 * 2.0), np.array(16.0)
    hw_p, hw_c = hardware(system("pcie-ethernet-a100")), hardware(system("cloudmatrix384"))
    small_p, small_c = float(all_reduce(S_small, n, 1.0, hw_p)), float(all_reduce(S_small, n, 1.0, hw_c))
    big_p, big_c = float(all_reduce(S_big, n, 1.0, hw_p)), float(all_reduce(S_big, n, 1.0, hw_c))
    latency_ok = small_c < 1e-6
    bandwidth_ok = big_p > 10 * big_c
    verdict = HOLDS if latency_ok and bandwidth_ok else (CONDITIONAL if bandwidth_ok else FAILS)
    return Verdict("C6", "A cross-node all-reduce costs tens of microseconds on a conventional network; "
                         "inside a supernode it is sub-microsecond and almost negligible.", verdict,
                   "" if verdict == HOLDS else "the messages are large: bandwidth-bound all-reduces are >10x "
                   "faster on the supernode, but a small all-reduce still pays tens of microseconds of "
                   "per-call and per-step latency there too",
                   {"64 kB over 16, PCIe/Ethernet [us]": small_p * 1e6, "64 kB over 16, CloudMatrix384 [us]": small_c * 1e6,
                    "105 MB over 16, PCIe/Ethernet [ms]": big_p * 1e3, "105 MB over 16, CloudMatrix384 [ms]": big_c * 1e3},
                   "Two-level alpha-beta all-reduce with each system's measured or documented per-step and "
                   "per-call latency; 105 MB is one layer's activations of the 1T model.")


def c7() -> Verdict:
    """C7: tensor parallelism depends on high-bandwidth all-to-all."""
    from .training import train
    r = train("deepseek-v3", "cloudmatrix384", tp=4, pp=16, dp=8, ep=8, micro_batch=1, global_batch=256,
              recompute="full")
    return Verdict("C7", "Tensor parallelism depends on high-bandwidth all-to-all communication.",
                   FAILS if r.time_s["tp"] > 0 and r.time_s["ep"] > 0 else CONDITIONAL, "",
                   {"tensor-parallel all-reduce time per step [s]": r.time_s["tp"],
                    "expert-parallel all-to-all time per step [s]": r.time_s["ep"]},
                   "Tensor parallelism exchanges partial sums with all-reduce (or reduce-scatter and "
                   "all-gather with sequence parallelism), 4 per layer per micro-batch (Narayanan et al. 2021); "
                   "all-to-all is the collective of expert parallelism (dispatch and combine).")


def c8() -> Verdict:
    """C8: offloading optimizer state to CPU memory roughly halves training efficiency."""
    from .training import train
    base = dict(tp=8, pp=4, dp=2, recompute="full", zero=1)
    rows = {}
    for batch in (2, 1024):
        kw = dict(base, micro_batch=1, global_batch=batch)
        on = train("llama3-70b", "dgx-a100", offload="optimizer", **kw)
        off = train("llama3-70b", "dgx-a100", offload="none", **kw)
        rows[batch] = on.tokens_per_s / off.tokens_per_s
    halves_short, halves_long = rows[2] < 0.6, rows[1024] < 0.6
    verdict = HOLDS if halves_long else (CONDITIONAL if halves_short else FAILS)
    return Verdict("C8", "Offloading optimizer state or weights to CPU memory roughly halves training efficiency.",
                   verdict, "the step is short next to moving the optimizer's gradients and weights over PCIe",
                   {"throughput kept, one micro-batch per step": rows[2],
                    "throughput kept, 512 micro-batches per step": rows[1024]},
                   "llama3-70b on 64 A100s (tp 8, pp 4, dp 2), ZeRO-1, optimizer state on the host. The "
                   "gradients out and the weights back cross PCIe once per step, so many micro-batches per "
                   "step amortise them. snlab counts those transfers, not the CPU's own Adam update, which "
                   "would add to the cost.")


def c11() -> Verdict:
    """C11: the supernode improves overlap of communication with computation by >= 40%."""
    from .training import train
    plan = dict(tp=16, pp=4, dp=8, micro_batch=1, global_batch=512, recompute="selective", overlap="standard")
    p = train("llama3-70b", "pcie-ethernet-a100", **plan)
    c = train("llama3-70b", "cloudmatrix384", **plan)
    cut = 1 - c.time_s["exposed_communication"] / p.time_s["exposed_communication"]
    return Verdict("C11", "Synchronisation takes tens of milliseconds per iteration on a conventional cluster; on "
                          "the supernode communication overlaps computation 40% better or more.",
                   HOLDS if cut >= 0.4 else FAILS, "",
                   {"exposed communication, PCIe/Ethernet [s]": p.time_s["exposed_communication"],
                    "exposed communication, CloudMatrix384 [s]": c.time_s["exposed_communication"],
                    "reduction": cut},
                   "llama3-70b with 16-way tensor parallelism (two servers on the cluster).")


def c12() -> Verdict:
    """C12: on a supernode, use about a quarter of the micro-batch a conventional network wants."""
    from .training import sweep
    def best(model, system, seq, **plan):
        df = sweep(model, system, micro_batch=[1, 2, 4, 8, 16, 32], seq_len=seq, **plan)
        df = df[df.fits]
        return int(df.loc[df.step_time_s.idxmin(), "micro_batch"])
    short = dict(tp=8, pp=8, dp=1, global_batch=512, recompute="selective")
    p, c = best("llama3-8b", "pcie-ethernet-a100", 256, **short), best("llama3-8b", "cloudmatrix384", 256, **short)
    long = dict(tp=8, pp=32, dp=4, global_batch=512, recompute="full")
    pl, cl = best("megatron-1t", "pcie-ethernet-a100", 2048, **long), best("megatron-1t", "cloudmatrix384", 2048, **long)
    smaller = c * 4 <= p * 1.01 and cl * 4 <= pl * 1.01
    return Verdict("C12", "On a supernode, maximise overlap and cut the micro-batch to about a quarter of what a "
                          "conventional network wants.", HOLDS if smaller else FAILS, "",
                   {"best micro-batch, 8B at s=256, PCIe/Ethernet": p, "best micro-batch, 8B at s=256, CloudMatrix384": c,
                    "best micro-batch, 1T at s=2048, PCIe/Ethernet": pl, "best micro-batch, 1T at s=2048, CloudMatrix384": cl},
                   "Long sequences: both prefer micro-batch 1 (the bubble dominates). Short sequences: once "
                   "bandwidth-bound traffic is cheap, per-micro-batch fixed costs (weights read, latency) "
                   "dominate, so the supernode prefers larger micro-batches, not smaller.")


def c15() -> Verdict:
    """C15: air cooling throttled the chips and cost about 20% of compute."""
    from .training import train
    plan = dict(tp=8, pp=16, dp=2, micro_batch=1, global_batch=512, recompute="full")
    rows = {}
    for name in ("dgx-a100", "pcie-ethernet-a100"):
        cool = train("llama3-70b", name, **plan)
        hot = train("llama3-70b", name, sustained_clock=0.8, **plan)
        rows[name] = 1 - hot.tokens_per_s / cool.tokens_per_s
    cond = rows["dgx-a100"] > rows["pcie-ethernet-a100"]
    return Verdict("C15", "Air cooling let the chips throttle and cost about 20% of compute.",
                   CONDITIONAL if cond else FAILS,
                   "the job is compute-bound: a 20% lower sustained clock costs a compute-bound job nearly 20% "
                   "of throughput, a communication-bound one much less",
                   {"throughput lost at 0.8 clock, DGX A100": rows["dgx-a100"],
                    "throughput lost at 0.8 clock, PCIe/Ethernet": rows["pcie-ethernet-a100"]},
                   "sustained_clock derates peak FLOPs (compute wall) and leaves links and HBM alone.")


def c16() -> Verdict:
    """C16: size the job first from parameters, batch and context, then choose one
    supernode or several."""
    from .training import search
    from .presets import model, system
    m, s = model("llama3-405b"), system("cloudmatrix384")
    df = search(m, s, devices=384, global_batch=1024, top=1)
    fits_one = not df.empty
    return Verdict("C16", "Size the job first: estimate memory and compute from parameters, batch and context, "
                          "then choose one supernode or several.", HOLDS if fits_one else CONDITIONAL, "",
                   {"405B on one CloudMatrix384: best MFU": float(df.iloc[0].mfu) if fits_one else float("nan"),
                    "memory per device [GB]": float(df.iloc[0].memory_total_bytes) / 1e9 if fits_one else float("nan")},
                   "snlab.search does exactly this sizing: the fastest plan that fits a device count.")


# --- serving ----------------------------------------------------------------------------------

_LONG = dict(tp=8, prompt_len=1_000_000, output_len=1000, context=1_000_000)


def c9() -> Verdict:
    """C9: every device addresses the memory of all devices as one large memory, as if local."""
    from .presets import system
    from .serving import serve
    cm = system("cloudmatrix384")
    r = serve("llama3-70b", cm, batch=4, **_LONG)
    ratio = cm.device.hbm_bandwidth / cm.pool.bandwidth
    addressable = cm.pool.capacity > 10 * cm.device.hbm_capacity
    as_if_local = ratio < 1.5 and r.kv["spill_slowdown"] < 1.5
    verdict = HOLDS if addressable and as_if_local else (CONDITIONAL if addressable else FAILS)
    return Verdict("C9", "In a supernode every device can address the memory of all devices as one large virtual "
                         "memory, as if it were local.", verdict,
                   "'as if local' means addressable: the pool is reachable, but at the bus's bandwidth and "
                   "latency, not HBM's",
                   {"pool per domain [TB]": cm.pool.capacity / 1e12,
                    "HBM / pool bandwidth per device": ratio,
                    "pool latency [us]": cm.pool.latency * 1e6,
                    "70B decode at 1M context, batch 4: KV time vs all in HBM": r.kv["spill_slowdown"]},
                   "CloudMatrix384: 392 GB/s per NPU over the unified bus against 3.2 TB/s of local HBM.")


def c10() -> Verdict:
    """C10: serving a ~100B model conventionally takes dozens of A800-class cards, with
    about 30% of memory left for KV cache and activations."""
    import math

    from .presets import model, system
    from .sizing import kv_cache_bytes_per_token
    m, s = model("llama3-70b"), system("dgx-a100")
    weights = m.params * 2
    cards_weights = math.ceil(weights / (0.7 * s.device.hbm_capacity))
    per_token = float(kv_cache_bytes_per_token(m, 2.0))
    cards = {ctx: math.ceil((weights + 32 * ctx * per_token) / s.device.hbm_capacity) for ctx in (32_768, 131_072)}
    cards_long = cards[32_768]
    verdict = CONDITIONAL if cards_weights < 12 <= cards[131_072] else (HOLDS if cards_weights >= 12 else FAILS)
    return Verdict("C10", "Serving a model of about 100B parameters conventionally takes dozens of A800-class cards, "
                          "keeping about 30% of memory free for KV cache and activations.", verdict,
                   "many long contexts are served at once (dozens of cards at 32 x 128K tokens); the weights with "
                   "30% headroom need only a few cards",
                   {"weights, 70B in bf16 [GB]": weights / 1e9, "cards for weights + 30% headroom": cards_weights,
                    "KV bytes per token": per_token,
                    "cards for 32 concurrent 32K-token contexts": cards_long,
                    "cards for 32 concurrent 128K-token contexts": cards[131_072]},
                   "Llama 3 70B (GQA, 8 key/value heads) on 80 GB A100s; an A800 has the same memory.")


def c13() -> Verdict:
    """C13: KV cache of million-token contexts in the supernode's pool, with continuous
    batching, raises serving throughput several-fold."""
    from .presets import system
    from .serving import serve
    cm = system("cloudmatrix384")
    no_pool = cm.replace(pool=None)
    big = serve("llama3-70b", cm, batch=4, **_LONG)
    big_host = serve("llama3-70b", no_pool, batch=4, **_LONG)
    one = serve("llama3-70b", cm, batch=1, **_LONG)
    one_host = serve("llama3-70b", no_pool, batch=1, **_LONG)
    gain_spilled = big.decode_tokens_per_s_per_device / big_host.decode_tokens_per_s_per_device
    gain_fits = one.decode_tokens_per_s_per_device / one_host.decode_tokens_per_s_per_device
    continuous = big.batching["continuous_over_static"]
    verdict = CONDITIONAL if gain_spilled >= 3 and gain_fits < 1.2 else (HOLDS if gain_spilled >= 3 else FAILS)
    return Verdict("C13", "Keeping the KV cache of million-token contexts in the supernode's memory pool, with "
                          "continuous batching, raises serving throughput several-fold.", verdict,
                   "the KV cache outgrows HBM; the gain comes from the pool's bandwidth against PCIe to the "
                   "host, while continuous batching adds only a little",
                   {"pool vs host memory, batch 4 (spilled)": gain_spilled,
                    "pool vs host memory, batch 1 (fits in HBM)": gain_fits,
                    "continuous over static batching": continuous,
                    "KV location, batch 4": big.kv_location, "KV location without the pool": big_host.kv_location},
                   "llama3-70b, tp 8, 1M-token context on CloudMatrix384 with and without its pool (the same "
                   "NPUs spilling to host memory instead).")


def c14() -> Verdict:
    """C14: a model of a few billion parameters wastes a supernode."""
    from .presets import system
    from .serving import serve_best
    cm = system("cloudmatrix384")
    kw = dict(tpot_target=0.05, prompt_len=1000, output_len=500)
    with_pool = serve_best("llama3.2-1b", cm, **kw)
    alone = serve_best("llama3.2-1b", cm.replace(pool=None), **kw)
    share = with_pool.time_s["tp"] + with_pool.time_s["ep"]
    gain = with_pool.decode_tokens_per_s_per_device / alone.decode_tokens_per_s_per_device
    verdict = HOLDS if with_pool.devices == 1 and share == 0 and gain < 1.5 else (
        CONDITIONAL if with_pool.devices == 1 and share == 0 else FAILS)
    return Verdict("C14", "A model of a few billion parameters wastes a supernode; a small cluster with dynamic "
                          "batching is more cost-effective.", verdict,
                   "the pool is used to hold a far larger batch: the bus carries no model traffic, but the pool "
                   "raises throughput per device by the factor shown",
                   {"devices per replica": with_pool.devices, "bus traffic per step [s]": share,
                    "best batch with the pool": with_pool.deployment["batch"],
                    "best batch in HBM alone": alone.deployment["batch"],
                    "throughput per device, pool vs HBM alone": gain},
                   "llama3.2-1b under a 50 ms time-per-token target on one 910C, with and without the supernode's "
                   "pool. snlab has no prices: cost-effectiveness is the throughput gain against the price of "
                   "a supernode device over a stand-alone one.")


TRAINING_CLAIMS = (c1, c2, c3, c4_c5, c6, c7, c8, c11, c12, c15, c16)
SERVING_CLAIMS = (c9, c10, c13, c14)


def all_claims() -> list[Verdict]:
    """Every claim's verdict, in the article's order."""
    order = {"C1": 1, "C2": 2, "C3": 3, "C4/C5": 4, "C6": 6, "C7": 7, "C8": 8, "C9": 9, "C10": 10, "C11": 11,
             "C12": 12, "C13": 13, "C14": 14, "C15": 15, "C16": 16}
    verdicts = [f() for f in TRAINING_CLAIMS + SERVING_CLAIMS]
    return sorted(verdicts, key=lambda v: order[v.claim_id])


def table(verdicts=None):
    """The verdicts as a pandas DataFrame: claim, verdict, condition."""
    import pandas as pd
    verdicts = verdicts if verdicts is not None else all_claims()
    return pd.DataFrame([{"claim": v.claim_id, "statement": v.claim, "verdict": v.verdict,
                          "condition": v.condition if v.verdict == CONDITIONAL else ""} for v in verdicts])


def table_markdown(verdicts=None) -> str:
    """The verdicts as the Markdown table the README shows."""
    frame = table(verdicts)
    rows = ["| claim | statement | verdict |", "|---|---|---|"]
    for r in frame.itertuples():
        verdict = r.verdict + (f" {r.condition}" if r.condition else "")
        rows.append(f"| {r.claim} | {r.statement} | {verdict} |")
    return "\n".join(rows)
