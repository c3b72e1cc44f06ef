"""The lessons' "predict, then check" questions, each computed from the model.

A question is asked before anything that shows its answer, and its answer is decided with
margin: the quantity that decides it, together with its error band, lies at least
:data:`EDGE_MARGIN` away from every edge between two answers. Where the band would
straddle an edge the question says "about the same" instead of picking a winner
(:func:`binned`). The notebooks build their quiz with :func:`snlab.widgets.quiz`, so that
neither the answer nor the explanation is written in a cell above the question;
``tests/test_lessons.py`` checks every question's margin.

Bands: a quantity compared on one system (the same plan with one setting changed) shares
the model's bias on both sides, so only :data:`EDGE_MARGIN` applies; a ratio of two
systems takes both systems' bands (:func:`ratio_band`), and a family without published runs
takes the widest band any family of that regime shows. A regime without bands of published
runs (collectives, power, latency under load) holds each prediction to the one tolerance its
validation holds every published row to (:func:`tolerance_band`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from . import uncertainty
from .errors import SnlabError

#: how far (relative) a question's deciding value must sit from any edge between answers
EDGE_MARGIN = 0.10
#: the two systems the lessons compare
CLUSTER, SUPERNODE = "pcie-ethernet-a100", "cloudmatrix384"


@dataclass(frozen=True)
class Question:
    """One question: its text, options and answer, the explanation shown after Check, and
    what decides it (``value`` with its band ``low`` to ``high`` against ``edges``)."""

    key: str
    question: str
    options: tuple
    answer: str
    explanation: str
    value: float
    low: float
    high: float
    edges: tuple

    def margin(self) -> float:
        """The smallest relative distance from the value's band to an edge (negative when
        the band straddles one); infinite without edges."""
        gaps = []
        for e in self.edges:
            if self.low <= e <= self.high:
                return -min(e / self.low - 1, self.high / e - 1) if e > 0 else -1.0
            gaps.append(min(abs(self.low / e - 1), abs(self.high / e - 1)))
        return min(gaps) if gaps else float("inf")

    def decided(self) -> bool:
        """True when the answer is clear of every edge by :data:`EDGE_MARGIN`."""
        return self.margin() >= EDGE_MARGIN


def binned(value: float, low: float, high: float, edges, labels, same: str | None = None):
    """The label of ``value`` among bins split at ``edges`` (ascending; ``labels`` has one
    more), or ``same`` when the band [low, high] lies within :data:`EDGE_MARGIN` of an
    edge and a ``same`` label is given."""
    index = sum(value >= e for e in edges)
    if same is not None and any(low / (1 + EDGE_MARGIN) <= e <= high * (1 + EDGE_MARGIN) for e in edges):
        return same
    return labels[index]


def answered(key: str, question: str, options: tuple, explanation: str, value: float, low: float | None = None,
             high: float | None = None, edges: tuple = ()) -> Question:
    """A question whose answer is the option ``value`` falls in (:func:`binned`), decided
    by the band ``low`` to ``high`` (``value`` itself when the band is not given)."""
    low = value if low is None else low
    high = value if high is None else high
    return Question(key, question, options, binned(value, low, high, edges, options), explanation, value, low, high,
                    edges)


def widest_band(regime: str) -> uncertainty.Band:
    """The widest band any chip family of ``regime`` shows: what a family without
    published runs is given."""
    bands = [b for b in (uncertainty.band(regime, f) for f in uncertainty.families(regime)) if b.runs]
    if not bands:
        return uncertainty.Band(regime=regime, family="any", runs=0, low=1.0, high=1.0)
    return uncertainty.Band(regime=regime, family="any", runs=sum(b.runs for b in bands),
                            low=min(b.low for b in bands), high=max(b.high for b in bands))


def speed_band(regime: str, family: str, value: float) -> tuple[float, float]:
    """The band of a predicted speed on a family (the widest of the regime without runs)."""
    band = uncertainty.band(regime, family)
    band = band if band.runs else widest_band(regime)
    return value / band.high, value / band.low


def time_band(regime: str, family: str, value: float) -> tuple[float, float]:
    """The band of a predicted time, or of a cost per token (a rate over a predicted speed),
    on a family (the widest of the regime without runs)."""
    band = uncertainty.band(regime, family)
    band = band if band.runs else widest_band(regime)
    return value * band.low, value * band.high


def tolerance_band(value: float, tolerance: float) -> tuple[float, float]:
    """The band of a prediction held to a relative ``tolerance``: what a regime without a band
    of published runs is given (the tolerance every published row of it is held to)."""
    return value * (1 - tolerance), value * (1 + tolerance)


def ratio_band(a: tuple, b: tuple, value: float) -> tuple[float, float]:
    """The band of the ratio ``value`` = A / B of two predicted speeds with bands ``a`` and ``b``."""
    return min(value, a[0] / b[1]), max(value, a[1] / b[0])


# --- the questions ----------------------------------------------------------------------------

def _mfu_ratio(model: str) -> tuple[float, float, float, float, float]:
    """The supernode's and the cluster's MFU for ``model`` on 384 devices, each at its best
    plan, their ratio, and the ratio's band from both systems' training bands."""
    from . import compare
    from .presets import system
    best = compare.best_plans([model], [CLUSTER, SUPERNODE], devices=384, global_batch=768).set_index("system")
    cm, cl = float(best.loc[SUPERNODE, "mfu"]), float(best.loc[CLUSTER, "mfu"])
    ratio = cm / cl
    low, high = ratio_band(speed_band("training", system(SUPERNODE).device.family, cm),
                           speed_band("training", system(CLUSTER).device.family, cl), ratio)
    return cm, cl, ratio, low, high


def supernode_mfu() -> Question:
    """Lesson 00: how much higher the supernode's MFU is for the 1T model on 384 devices."""
    cm, cl, ratio, low, high = _mfu_ratio("megatron-1t")
    edges = (1 / 1.1, 1.1)
    options = ("clearly lower (by more than 10%, errors included)", "about the same (within 10%)",
               "clearly higher (by more than 10%, errors included)")
    return answered("supernode-mfu", "For the 1T model on 384 devices, each system with its best plan: is the "
                    "supernode's MFU higher than the cluster's, by more than the model's error?", options,
                    f"MFU {cm:.0%} against {cl:.0%}, {ratio:.2f} times; with the model's error bands the ratio lies "
                    f"between {low:.2f} and {high:.2f}. The cluster loses more of its step to exposed communication, "
                    "the pipeline bubble and the compute slowed by the communication it hides, and more to "
                    "recomputing activations it has no room to keep.", ratio, low, high, edges)


def throttled_step() -> Question:
    """Lesson 01: how much slower a step is at 80% of the clock."""
    from . import sweep
    df = sweep("llama3-70b", "dgx-h100", tp=8, pp=4, dp=8, micro_batch=1, global_batch=512,
               sustained_clock=[0.8, 1.0])
    slowdown = float(df["step_time_s"].iloc[0] / df["step_time_s"].iloc[1] - 1)
    edges = (0.10, 0.235)
    options = ("less than 10% slower", "10% to 23% slower", "about 25% slower or more (1 / 0.8 = 1.25)")
    return answered("throttled-step", "The clock sustains 80% of its peak. How much slower is a training step of "
                    "Llama-3 70B on 256 H100s?", options,
                    f"The model says {slowdown:.0%}: only the compute-bound part of the step stretches by 1 / 0.8; "
                    "communication, memory-bound kernels and the waiting they cause do not.",
                    slowdown, edges=edges)


def zero_stage_that_fits() -> Question:
    """Lesson 02: the lowest ZeRO stage at which Llama-3 70B fits on 256 H100s (tp 8, dp 32)."""
    from . import sweep
    states = sweep("llama3-70b", "dgx-h100", tp=8, pp=1, dp=32, micro_batch=1, global_batch=256,
                   zero=[0, 1, 2, 3]).set_index("zero")
    need = states["memory_total_bytes"] / states["memory_usable_bytes"]
    options = ("ZeRO 1", "ZeRO 2", "ZeRO 3", "none of them: it needs more devices")
    fitting = [z for z in (1, 2, 3) if need.loc[z] <= 1]
    answer = options[fitting[0] - 1] if fitting and need.loc[0] > 1 else options[3]
    stage = fitting[0] if fitting else 3
    # decided by the nearer of the two to the memory there is: the first stage that fits
    # (below it) and the one before (above it), as a factor
    before = float(need.loc[stage - 1])
    value = min(before, 1 / float(need.loc[stage]))
    states_gb = (states.loc[0, ["memory_weights_bytes", "memory_grads_bytes", "memory_optimizer_bytes"]]
                 .sum() / 1e9)
    return Question("zero-stage-that-fits", "Llama-3 70B on 256 H100s (tp 8, dp 32): without ZeRO its model states "
                    f"alone take {states_gb:.0f} GB per device, more than the 80 GB there is. What is the lowest ZeRO "
                    "stage at which the job fits?", options, answer,
                    f"At ZeRO {stage} it needs {states.loc[stage, 'memory_total_bytes'] / 1e9:.0f} GB of the "
                    f"{states.loc[stage, 'memory_usable_bytes'] / 1e9:.0f} GB usable, against "
                    f"{states.loc[stage - 1, 'memory_total_bytes'] / 1e9:.0f} GB at ZeRO {stage - 1}: the optimizer "
                    f"state (fp32 master weights, momentum and variance, 12 bytes a parameter) is "
                    f"{states.loc[0, 'memory_optimizer_bytes'] / 1e9:.0f} GB of the {states_gb:.0f}, and stage 1 "
                    "shards it over the 32 replicas.", value, value, value, (1.0,))


def small_all_reduce() -> Question:
    """Lesson 03: how long a small all-reduce takes inside the supernode's bus (claim C6 says
    under a microsecond). Decided by the supernode's time against 1 and 10 µs, held to the
    collectives' tolerance (20%, :data:`snlab.validation.collectives.TOLERANCE`: collectives
    have no band of published runs, and every published benchmark is held to it). Which of
    the two systems finishes first is not asked: 1.6 times apart, the two times within that
    tolerance leave the ratio between 1.08 and 2.4, within 10% of a tie."""
    from . import charts
    from .validation.collectives import TOLERANCE
    frame = charts.collective_frame([CLUSTER, SUPERNODE], "all-reduce", 16, sizes=[64e3, 105e6], levels=False)
    us = frame.pivot(index="message_bytes", columns="system", values="time_us")
    small, big = us.loc[64e3], us.loc[105e6]
    t = float(small[SUPERNODE])
    low, high = tolerance_band(t, TOLERANCE["collective"])
    edges = (1.0, 10.0)
    options = ("under a microsecond (almost free)", "a few microseconds (1 to 10 µs)",
               "tens of microseconds (10 µs or more)")
    return answered("small-all-reduce", "How long does a 64 kB all-reduce over 16 devices take on CloudMatrix384, "
                    "inside its bus?", options,
                    f"{t:.0f} µs on the supernode, {small[CLUSTER]:.0f} µs on the cluster "
                    f"({small[CLUSTER] / t:.1f} times as long); within the collectives' "
                    f"{TOLERANCE['collective']:.0%} tolerance the supernode's time lies between {low:.0f} and "
                    f"{high:.0f} µs. Every collective call and each step of the ring pays a fixed software latency "
                    "(launch, synchronisation), on any fabric. The bus wins on bandwidth: a 105 MB all-reduce takes "
                    f"{big[CLUSTER] / 1e3:.1f} ms on the cluster and {big[SUPERNODE] / 1e3:.2f} ms on the supernode.",
                    t, low, high, edges)


#: the three wirings lesson 03 compares over four devices: a switch, a full mesh, a torus
WIRINGS = ("dgx-b200", "mi300x-platform", "tpu-v5p-pod")


def four_device_all_reduce() -> Question:
    """Lesson 03: which wiring (switch, full mesh, torus) finishes a tensor-parallel size
    all-reduce over four devices first, and whether by more than 2x over the next. Decided by
    the first one's lead over the second (1: a tie, 2: the options' edge), each time held to
    the collectives' tolerance (20%, no band of published runs), so the lead's band is the
    ratio of the two."""
    from . import network
    from .validation.collectives import TOLERANCE
    four = network.collective_frame(list(WIRINGS), "all-reduce", [4], 256e6).set_index("system")
    first, second = four["time_s"].nsmallest(2).index
    lead = float(four.loc[second, "time_s"] / four.loc[first, "time_s"])
    tol = TOLERANCE["collective"]
    low, high = ratio_band(tolerance_band(float(four.loc[second, "time_s"]), tol),
                           tolerance_band(float(four.loc[first, "time_s"]), tol), lead)
    options = tuple(f"{s}, by {w} 2x" for s in WIRINGS for w in ("more than", "less than"))
    answer = f"{first}, by more than 2x" if lead > 2 else f"{first}, by less than 2x"
    ms = {s: float(four.loc[s, "time_s"]) * 1e3 for s in WIRINGS}
    gbs = {s: float(four.loc[s, "bus_bandwidth_gbs"]) for s in WIRINGS}
    return Question("four-device-all-reduce", "A 256 MB all-reduce over 4 devices of each: which system finishes "
                    "first, and is it more than twice as fast as the next?", options, answer,
                    f"DGX B200 {ms['dgx-b200']:.2f} ms ({gbs['dgx-b200']:.0f} GB/s of bus bandwidth), MI300X platform "
                    f"{ms['mi300x-platform']:.2f} ms ({gbs['mi300x-platform']:.0f} GB/s), TPU v5p "
                    f"{ms['tpu-v5p-pod']:.2f} ms ({gbs['tpu-v5p-pod']:.0f} GB/s): {first} leads by {lead:.1f} times, "
                    f"between {low:.1f} and {high:.1f} within the collectives' {tol:.0%} tolerance. Through a switch "
                    "four GPUs keep all their bandwidth; on the full mesh they have only 3 of their 7 links; on the "
                    "torus four chips are a 2x2 square without wrap-around: 2 of their 6 links, each used as a line.",
                    lead, low, high, (1.0, 2.0))


def torus_axes() -> Question:
    """Lesson 03: how much more bus bandwidth 64 TPU v5p chips get as a 4x4x4 slice than as
    one ring. The same chips and links wired two ways share the link model's bias, so only
    :data:`EDGE_MARGIN` applies; the edges lie halfway between the options."""
    from . import network, topology
    from .presets import system
    cube = network.collective("tpu-v5p-pod", "all-reduce", 1e9, 64, slice="4x4x4")
    ring = network.collective(topology.one_ring(system("tpu-v5p-pod"), 64), "all-reduce", 1e9, 64)
    gain = cube.bus_bandwidth / ring.bus_bandwidth
    edges = (1.5, 2.5, 4.5)
    options = ("about the same", "about 2x", "about 3x", "about 6x")
    return answered("torus-axes", "A 1 GB all-reduce over 64 TPU v5p chips: how much more bus bandwidth does a "
                    "4x4x4 slice get than one ring of the same chips?", options,
                    f"{gain:.2f} times ({cube.bus_bandwidth / 1e9:.0f} against {ring.bus_bandwidth / 1e9:.0f} GB/s). "
                    "Not 6x: three times the links, but the three chunks pass each other's axes too. Each axis "
                    "carries its own third of the buffer plus the others already reduced 4 and 16 times: 21/64 of "
                    "the buffer against 63/64 on the ring, a factor 3, the number of axes.",
                    gain, edges=edges)


def small_model_mfu() -> Question:
    """Lesson 04: whether the supernode's MFU beats the cluster's for Llama 3.2 1B on 384
    devices, each system with its best plan. Decided by the ratio of the two MFUs with both
    systems' training bands (:func:`ratio_band`); the Ascend 910C has no published training
    runs, so it takes the widest band of the regime, and the ratio's band spans about -17% to
    +24%: edges at 10%, as lesson 00 asks for the 1T model, would sit inside it, so the
    question asks for a factor of 1.5 (about the supernode's lead at 1T)."""
    cm, cl, ratio, low, high = _mfu_ratio("llama3.2-1b")
    edges = (1 / 1.5, 1.5)
    options = ("clearly lower (the cluster's over 1.5 times the supernode's, errors included)",
               "about the same (within a factor of 1.5, errors included)",
               "clearly higher (over 1.5 times the cluster's, errors included)")
    return answered("small-model-mfu", "For Llama 3.2 1B on 384 devices, each system with its best plan: how does "
                    "the supernode's MFU compare with the cluster's?", options,
                    f"MFU {cm:.0%} against {cl:.0%}, {ratio:.2f} times; with the model's error bands the ratio lies "
                    f"between {low:.2f} and {high:.2f}. A small model trains data-parallel: one gradient all-reduce "
                    "per step, hidden behind compute on either network. The supernode's bus has almost nothing to do "
                    "(claim C14).", ratio, low, high, edges)


def quarter_micro_batch() -> Question:
    """Lesson 05: whether the supernode wants a micro-batch a quarter of the cluster's."""
    from . import sweep
    micro = [1, 2, 4, 8, 16, 32]
    short = sweep("llama3-8b", [CLUSTER, SUPERNODE], micro_batch=micro, tp=8, pp=8, dp=1, global_batch=512,
                  recompute="selective", seq_len=256)
    steps = {s: part.set_index("micro_batch")["step_time_s"] for s, part in short.groupby("system", observed=True)}
    cluster_best = int(steps[CLUSTER].idxmin())
    quarter = max(1, cluster_best // 4)
    # the supernode's step at a quarter of the cluster's best micro-batch against its own best
    ratio = float(steps[SUPERNODE].loc[quarter] / steps[SUPERNODE].min())
    edges = (1 / (1 + EDGE_MARGIN), 1 + EDGE_MARGIN)
    options = ("clearly faster (by more than 10%)", "about the same (within 10%)", "clearly slower (by more than 10%)")
    near, near_cluster = (sorted(int(m) for m, t in steps[s].items() if t <= steps[s].min() * (1 + EDGE_MARGIN))
                          for s in (SUPERNODE, CLUSTER))
    return answered("quarter-micro-batch", "The article advises micro-batches a quarter the size on a supernode "
                    f"(claim C12). With 256-token sequences the cluster's fastest step is at micro-batch "
                    f"{cluster_best} (micro-batches {', '.join(map(str, near_cluster))} within 10% of it, which the "
                    f"model cannot rank). On the supernode, how does micro-batch {quarter} compare with its best?",
                    options,
                    f"Micro-batch {quarter} takes {ratio:.2f} times the supernode's best step; micro-batches "
                    f"{', '.join(map(str, near))} are all within 10% of it. The supernode's cheap bandwidth leaves the "
                    "fixed per-micro-batch costs (weights read, message latency) as what larger micro-batches save: no "
                    "quarter-size rule.", ratio, edges=edges)


def million_token_decode() -> Question:
    """Lesson 06: how much more decode throughput per device CloudMatrix384 gets than a DGX
    H100 with eight million-token contexts of Llama-3 70B (claim C13 at a fixed batch).
    Decided by the ratio of the two rates with both systems' serving decode bands
    (:func:`ratio_band`: the H100's and the Ascend 910C's published runs)."""
    from . import serving
    from .presets import system
    long = serving.serve_sweep("llama3-70b", ["dgx-h100", SUPERNODE], tp=8, batch=8, prompt_len=1048576,
                               output_len=1000).set_index("system")
    cm, dgx = long.loc[SUPERNODE], long.loc["dgx-h100"]
    rate = "decode_tokens_per_s_per_device"
    speedup = float(cm[rate] / dgx[rate])
    low, high = ratio_band(speed_band("serving decode", system(SUPERNODE).device.family, float(cm[rate])),
                           speed_band("serving decode", system("dgx-h100").device.family, float(dgx[rate])), speedup)
    edges = (2.0, 3.0)
    options = ("less than twice", "2 to 3 times", "more than 3 times")
    spilled = " and ".join(t for t, col in (("host DRAM", "kv_host_bytes_per_device"), ("SSD", "kv_ssd_bytes_per_device"))
                           if dgx[col] > 0) or "nothing"
    return answered("million-token-decode", "Eight sequences of a million tokens each, Llama-3 70B on 8 devices: how "
                    "much more decode throughput per device does CloudMatrix384 get than a DGX H100?", options,
                    f"{speedup:.1f} times ({cm[rate]:.2f} against {dgx[rate]:.2f} tokens/s per device); with both "
                    f"systems' decode error bands, between {low:.1f} and {high:.1f}. Of the "
                    f"{dgx.kv_cache_bytes_per_device / 1e9:.0f} GB of KV cache per device, the DGX keeps "
                    f"{dgx.kv_hbm_bytes_per_device / 1e9:.0f} GB in HBM and spills the rest to {spilled} over PCIe; "
                    f"the supernode reads {cm.kv_pool_bytes_per_device / 1e9:.0f} GB of it from its peers' HBM over "
                    f"the bus, and the {cm.lender_devices:.0f} devices that lend it are counted in its per-device rate.",
                    speedup, low, high, edges)


def bus_worth_small_model() -> Question:
    """Lesson 07: what the supernode's bus is worth, as a premium per device-hour, for Llama
    3.2 1B on 384 devices: the throughput of the cluster's A100s on the supernode's bus (a
    what-if system) over the cluster's, less one. The same chips on two networks share the
    model's bias, so only :data:`EDGE_MARGIN` applies to the premium."""
    from . import compare
    fabric = compare.with_scale_up_of(CLUSTER, SUPERNODE)
    scale = compare.job_table(["llama3.2-1b", "megatron-1t"], [CLUSTER, fabric], devices=384, global_batch=768,
                              tokens=1e12)
    worth = scale.pivot(index="model", columns="system", values="tokens_per_device_s")
    worth = worth[fabric.name] / worth[CLUSTER] - 1
    small, big = float(worth["llama3.2-1b"]), float(worth["megatron-1t"])
    edges = (0.10,)
    options = ("almost nothing (under 10%)", "10% or more")
    return answered("bus-worth-small-model", "For Llama 3.2 1B on 384 devices, how much more per device-hour is the "
                    "supernode's bus worth?", options,
                    f"{small:.0%} for 1B, {big:.0%} for 1T: the cluster's A100s on the supernode's bus against the "
                    "same A100s on PCIe and Ethernet. A small model trains data-parallel with one hidden gradient "
                    "all-reduce per step: nothing for the bus to speed up (claim C14). Buy the cheaper cluster, and "
                    "dynamic batching for serving.", small, edges=edges)


def deep_pipeline() -> Question:
    """Lesson 08: is the model optimistic about the deepest pipeline, and more so?"""
    from .validation import training_table
    table = training_table().set_index("id")
    big, small = float(table.loc["narayanan2021-table1-529.6b", "error"]), \
        float(table.loc["narayanan2021-table1-39.1b", "error"])
    options = ("optimistic, and further off than for 39.1B", "optimistic, but closer than for 39.1B",
               "pessimistic, and further off than for 39.1B", "pessimistic, but closer than for 39.1B")
    answer = options[(0 if big > 0 else 2) + (0 if abs(big) > abs(small) else 1)]
    gap = abs(big) - abs(small)
    return Question("deep-pipeline", "The 529.6B row of Narayanan et al. runs 35 pipeline stages with micro-batch 1. "
                    "Is snlab optimistic or pessimistic about it, and is it further off than for the 39.1B row "
                    "(2 stages)?", options, answer,
                    f"529.6B: {big:+.1%}; 39.1B: {small:+.1%}. The deep pipeline is where costs the model leaves out "
                    "(stragglers, the interleaved schedule's handshakes between many stages) gather.",
                    abs(big), abs(big), abs(big), (abs(small),) if gap > 0 else ())


def air_cooled_supernode() -> Question:
    """Lesson 09: how much training throughput CloudMatrix384, built for liquid, loses in an
    air-cooled room (claim C15 says about 20%). Decided by the loss of
    :func:`snlab.claims.c15`: the same system and plan at two clocks share the model's bias,
    so only :data:`EDGE_MARGIN` applies."""
    from . import claims
    numbers = claims.c15().numbers
    lost = float(numbers[f"throughput lost under air, {SUPERNODE}"])
    limit = numbers[f"rack limit of the air room, {SUPERNODE} [kW]"]
    edges = (0.15, 0.25)
    options = ("less than 15%", "about 20% (15% to 25%)", "more than 25%")
    return answered("air-cooled-supernode", f"CloudMatrix384, built for liquid, stands in an air-cooled room whose "
                    f"racks may draw {limit:.0f} kW. How much of its throughput does a Llama-3 70B training run "
                    "lose?", options,
                    f"{lost:.0%}: its racks would draw {numbers[f'rack power at full clock, {SUPERNODE} [kW]']:.0f} kW "
                    f"at full clock and the room removes {limit:.0f}, so the clock falls to "
                    f"{numbers[f'sustained clock under air, {SUPERNODE}']:.2f}. A DGX H100, built for air, loses "
                    f"{numbers['throughput lost under air, dgx-h100']:.0%}. The loss is the room's, not the air's; "
                    "the clock law holds the voltage fixed, an upper bound on the loss.", lost, edges=edges)


def least_energy_per_token() -> Question:
    """Lesson 10: which system spends the least facility energy per output token serving
    Llama 3 8B under 50 ms per token. Decided by how many times less than the next system's
    it is (1: a tie). Power has no band of published runs (error_bands.toml holds training
    and serving speeds only), so each energy per token is held to the tolerance the power
    validation holds every serving energy row to (25%,
    :data:`snlab.validation.power.TOLERANCE`), and the ratio takes both."""
    from . import serving
    from .presets import system
    from .validation.power import TOLERANCE
    from .compare import POWER_SYSTEMS, POWER_WORKLOAD
    served = {s: serving.serve_best("llama3-8b", s, tp=1, **POWER_WORKLOAD) for s in POWER_SYSTEMS}
    joules = {s: r.energy_per_token_j for s, r in served.items()}
    least, runner = sorted(joules, key=joules.get)[:2]
    ratio = joules[runner] / joules[least]
    tol = TOLERANCE["serving energy per token"]
    low, high = ratio_band(tolerance_band(joules[runner], tol), tolerance_band(joules[least], tol), ratio)
    label = {s: f"{s} ({system(s).device.family}, {system(s).cooling_kind}-cooled)" for s in POWER_SYSTEMS}
    r = served[least]
    others = ", ".join(f"{joules[s]:.2g} J on {s}" for s in sorted(joules, key=joules.get)[1:])
    return Question("least-energy-per-token", "Llama 3 8B under 50 ms per output token: which system spends the "
                    "least facility energy per output token?", tuple(label.values()), label[least],
                    f"{least}: {joules[least]:.2g} J per output token at the facility ({others}), {ratio:.1f} times "
                    f"less than the next; within the power model's {tol:.0%} tolerance on each, between {low:.1f} "
                    f"and {high:.1f} times. Its devices spend {r.power['device_energy_per_token_j']:.2g} J of it, and "
                    f"{system(least).cooling_kind} cooling's PUE of {r.power['pue']:.2f} adds "
                    f"{joules[least] * (1 - 1 / r.power['pue']):.2g} J.", ratio, low, high, (1.0,))


def cluster_cost_ratio() -> Question:
    """Lesson 10: how many times what CloudMatrix384 costs per million output tokens of Llama
    3 70B the PCIe/Ethernet cluster costs, at the dated example purchase prices. A cost per
    token is a cost rate (the purchase written off, exact at given prices, plus electricity)
    over the throughput, so it carries the serving decode band of each system's chip as a
    time does (:func:`time_band`); the cluster's A100 has no published decode runs and takes
    the widest band of the regime."""
    from . import serving
    from .presets import system
    from .compare import POWER_WORKLOAD, power_tp
    cost = {s: serving.serve_best("llama3-70b", s, tp=power_tp("llama3-70b", s), prices="example-purchase",
                                  **POWER_WORKLOAD).cost_per_million_tokens_usd for s in (CLUSTER, SUPERNODE)}
    ratio = cost[CLUSTER] / cost[SUPERNODE]
    low, high = ratio_band(time_band("serving decode", system(CLUSTER).device.family, cost[CLUSTER]),
                           time_band("serving decode", system(SUPERNODE).device.family, cost[SUPERNODE]), ratio)
    edges = (1.25, 3.0)
    options = ("about the same", "1.25 to 3 times", "more than 3 times")
    return answered("cluster-cost-ratio", "Per million output tokens of Llama 3 70B, how many times what "
                    "CloudMatrix384 costs does the PCIe/Ethernet cluster cost?", options,
                    f"{ratio:.1f} times: ${cost[CLUSTER]:.3g} against ${cost[SUPERNODE]:.3g}; with both systems' "
                    f"decode error bands, between {low:.1f} and {high:.1f} times. The cluster's eight A100 PCIe cards "
                    "per replica spend most of each decode step on tensor-parallel all-reduces over PCIe, drawing "
                    "little power but serving few tokens; the supernode's eight NPUs exchange them over the unified "
                    "bus.", ratio, low, high, edges)


#: lesson 11's cluster and supernode, and the request rates it sweeps [requests/s]
QUEUE_SYSTEMS = ("dgx-h100", SUPERNODE)
QUEUE_RATES = (1, 2, 4, 6, 8, 10, 12, 16)


@lru_cache(maxsize=1)
def _queue_load():
    """Lesson 11's load sweep: Llama 3 70B, one TP8 instance or one of each pool, Azure
    conversation requests at each of :data:`QUEUE_RATES`."""
    from .serving import load_sweep
    return load_sweep("llama3-70b", list(QUEUE_SYSTEMS), list(QUEUE_RATES), lengths="azure-conv-2023",
                      requests=600, tp=8, prefill=dict(tp=8), decode=dict(tp=8), ttft_target=1.0,
                      tpot_target=0.05)


def _crossing(x, y, level: float) -> float:
    """Where ``y`` (sampled at ascending ``x``) first exceeds ``level``, on straight lines
    between the samples (the last two extended beyond them)."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    i = next((k for k, v in enumerate(y) if v > level), None)
    if i == 0:
        return x[0]
    i = len(y) - 1 if i is None else i
    return x[i - 1] + (level - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1])


def queue_ttft() -> Question:
    """Lesson 11: from which request rate the p90 time to first token of Llama 3 70B on one
    DGX H100 server exceeds 1 s. Decided by the rate at which it crosses 1 s (between the
    rates swept, on straight lines: a queue's wait is convex in the rate, so the line crosses
    no later than the curve); its band by where a time to first token a quarter longer or
    shorter would cross, the tolerance of published runs under load (25%,
    :data:`snlab.validation.queue.TOLERANCE`: latency under load has no band of its own)."""
    from .validation.queue import TOLERANCE
    load = _queue_load()
    cluster = load[(load.system == "dgx-h100") & (load["mode"] == "colocated")].set_index("rate_rps")
    p90 = cluster["ttft_p90_s"]
    tol = TOLERANCE["queue ttft"]
    rate = _crossing(p90.index, p90, 1.0)
    low, high = _crossing(p90.index, p90 * (1 + tol), 1.0), _crossing(p90.index, p90 * (1 - tol), 1.0)
    over = p90[p90 > 1.0].index.min()
    below = p90.index[p90.index < over].max()
    edges = (5.0, 10.0)
    options = ("below 5 requests/s", "5 to 10 requests/s", "above 10 requests/s")
    return answered("queue-ttft", "Llama 3 70B on one DGX H100 server, Azure conversation requests: from which rate "
                    "does the p90 time to first token exceed 1 s?", options,
                    f"Between {below} and {over} requests/s ({p90[below]:.2f} s and {p90[over]:.2f} s), at about "
                    f"{rate:.0f}; with times to first token a quarter longer, the tolerance of published runs under "
                    f"load, at about {low:.0f}. At low rates a prompt rarely waits; near the server's capacity every "
                    "step carries decodes and prompts, and the wait grows without bound.", rate, low, high, edges)


def kv_transfer_ratio() -> Question:
    """Lesson 11: how much longer a request's KV cache takes to move from the prefill to
    the decode instance on the DGX H100 cluster (RDMA between two servers) than on
    CloudMatrix384 (the bus). A transfer over the links is held to the collectives'
    tolerance (20%, no band of published runs) on each system, and the ratio takes both:
    the options' edges at 1.5 and 3 times (4, the edge once asked, would sit inside it)."""
    from .validation.collectives import TOLERANCE
    load = _queue_load()
    first = load[(load["mode"] == "disaggregated") & (load.rate_rps == 1)].set_index("system")
    t = {s: float(first.loc[s, "kv_transfer_s"]) for s in QUEUE_SYSTEMS}
    bw = {s: float(first.loc[s, "kv_link_bandwidth_bytes_per_s"]) for s in QUEUE_SYSTEMS}
    ratio = t["dgx-h100"] / t[SUPERNODE]
    tol = TOLERANCE["collective"]
    low, high = ratio_band(tolerance_band(t["dgx-h100"], tol), tolerance_band(t[SUPERNODE], tol), ratio)
    edges = (1.5, 3.0)
    options = ("about the same (less than 1.5 times)", "1.5 to 3 times longer", "more than 3 times longer")
    return answered("kv-transfer-ratio", "How much longer is a request's KV transfer, prefill to decode, on the DGX "
                    "H100 cluster than on CloudMatrix384?", options,
                    f"{ratio:.1f} times ({t['dgx-h100'] * 1e3:.2f} ms against {t[SUPERNODE] * 1e3:.2f} ms a request); "
                    f"within the collectives' {tol:.0%} tolerance on each, between {low:.1f} and {high:.1f}. It is the "
                    f"ratio of the links, {bw[SUPERNODE] / 1e9:,.0f} GB/s over the bus against "
                    f"{bw['dgx-h100'] / 1e9:,.0f} GB/s over RDMA for all device pairs ({bw[SUPERNODE] / bw['dgx-h100']:.1f} "
                    "times), less a little for the per-message latency.", ratio, low, high, edges)


def queue_pool_gain() -> Question:
    """Lesson 11: claim C13 with a request queue: how much more output per device the
    supernode's pool gives than spilling to host memory, 32 users of 128K-token contexts.
    Decided by :func:`snlab.claims.c13`'s gain. The same system with and without its pool
    reads the KV cache over different paths (the bus, PCIe), so the model's bias need not
    cancel: the gain takes the Ascend 910C's serving decode band on both sides
    (:func:`ratio_band`)."""
    from . import claims
    from .presets import system
    c13 = claims.c13()
    gain = float(c13.numbers["pool vs host memory with a request queue"])
    family = system(SUPERNODE).device.family
    low, high = ratio_band(speed_band("serving decode", family, gain), speed_band("serving decode", family, 1.0), gain)
    edges = (2.0, 3.0)
    options = ("less than twice", "2 to 3 times", "several-fold (3 times or more)")
    return answered("queue-pool-gain", "32 users of 128K-token contexts: output per device with the pool over "
                    "spilling to host memory?", options,
                    f"{gain:.2f} times; with the decode error band on both, between {low:.2f} and {high:.2f}. Both "
                    f"hold the whole queue (a batch of {c13.numbers['decode batch with a queue, pool / host']}): every "
                    "step reads it over the bus or over PCIe; the pool reads faster, but its "
                    f"{c13.numbers['devices lending HBM with a queue']} lending devices serve nothing.",
                    gain, low, high, edges)


def _plan(row) -> str:
    recompute = "no" if row["recompute"] == "none" else row["recompute"]
    return f"tp {row['tp']} pp {row['pp']} dp {row['dp']} with {recompute} recomputation"


def _codesign(model: str):
    from . import codesign
    table = codesign.designs(model)
    return table, codesign.alone(table)


def codesign_domain_alone() -> Question:
    """Lesson 12: what a 384-device scale-up domain buys the 1T model at PCIe's bandwidth.
    The same devices under two fabrics share the model's bias, so only
    :data:`EDGE_MARGIN` applies."""
    table, parts = _codesign("megatron-1t")
    gain = float(parts["scale_up_domain_size"])
    edges = (1.15, 1.5)
    options = ("less than 15% (almost nothing)", "15% to 50%", "more than 50%")
    base = table[table["base"]].iloc[0]
    wide = table[(table["scale_up_domain_size"] == table["scale_up_domain_size"].max())
                 & (table["scale_up_bandwidth"] == base["scale_up_bandwidth"])
                 & (table["hbm_capacity"] == base["hbm_capacity"])].iloc[0]
    return answered("codesign-domain-alone", "The 1T model on 384 A100s: put all 384 on one scale-up bus, but keep "
                    f"the bus at PCIe's {base['scale_up_bandwidth'] / 1e9:.1f} GB/s per direction. How much faster "
                    "does it train than in servers of 8?", options,
                    f"{gain - 1:.0%}: the best plan goes from {_plan(base)} to {_plan(wide)}. Memory, not the "
                    "network, shapes the plan at 80 GiB a device, and the tensor-parallel all-reduces it sends run at "
                    "the same PCIe speed in a big domain as in a server: devices on one bus buy little without the "
                    "bandwidth to go with them.", gain, edges=edges)


def codesign_best_gain() -> Question:
    """Lesson 12: how much the best design of the grid gains over the cluster for the 1T model."""
    table, parts = _codesign("megatron-1t")
    gain = float(parts["all three"])
    best = table.loc[table["gain"].idxmax()]
    product = float(parts["scale_up_domain_size"] * parts["scale_up_bandwidth"] * parts["hbm_capacity"])
    together = (f"Together they do more than the product of each alone ({product:.2f}): memory frees the plan "
                "from recomputation and deep pipelines, and the bus carries what the larger tensor groups send."
                if gain > product else f"Together they do less than the product of each alone ({product:.2f}).")
    edges = (1.25, 2.0)
    options = ("less than 25%", "25% to 2x", "more than 2x")
    return answered("codesign-best-gain", "The same job: now each of the three may change at once (up to 384 devices "
                    "on a bus, up to 400 GB/s per direction, twice the HBM). How much faster than the cluster is "
                    "the best design?", options,
                    f"{gain:.2f} times, with {int(best['scale_up_domain_size'])} devices on a "
                    f"{best['scale_up_bandwidth'] / 1e9:.0f} GB/s bus and {best['hbm_capacity'] / 1e9:.0f} GB of HBM "
                    f"(each alone: domain {parts['scale_up_domain_size']:.2f}, bandwidth "
                    f"{parts['scale_up_bandwidth']:.2f}, HBM {parts['hbm_capacity']:.2f}; best plan "
                    f"{_plan(best)}). {together}", gain, edges=edges)


def codesign_small_model() -> Question:
    """Lesson 12: whether the best design is worth a premium of a fifth for Llama 3 8B."""
    table, parts = _codesign("llama3-8b")
    gain = float(parts["all three"])
    edges = (1.2,)
    options = ("less than 20%: the cluster stays the better buy at any larger premium",
               "20% or more")
    return answered("codesign-small-model", "Llama 3 8B on the same 384 A100s: how much faster is the best design "
                    "of the grid than the cluster?", options,
                    f"{gain - 1:.0%}: the most any fabric of the grid is worth per device for this model. Its best "
                    f"plan is {_plan(table[table['base']].iloc[0])} on the cluster: one gradient all-reduce a step, "
                    "mostly behind compute. A supernode whose devices cost more than that over the cluster's is the "
                    "worse buy (claim C14).", gain, edges=edges)


QUESTIONS = {"supernode-mfu": supernode_mfu, "throttled-step": throttled_step, "zero-stage-that-fits": zero_stage_that_fits,
             "small-all-reduce": small_all_reduce, "four-device-all-reduce": four_device_all_reduce,
             "torus-axes": torus_axes, "small-model-mfu": small_model_mfu, "quarter-micro-batch": quarter_micro_batch,
             "million-token-decode": million_token_decode, "bus-worth-small-model": bus_worth_small_model,
             "deep-pipeline": deep_pipeline, "air-cooled-supernode": air_cooled_supernode,
             "least-energy-per-token": least_energy_per_token, "cluster-cost-ratio": cluster_cost_ratio,
             "queue-ttft": queue_ttft, "kv-transfer-ratio": kv_transfer_ratio, "queue-pool-gain": queue_pool_gain,
             "codesign-domain-alone": codesign_domain_alone, "codesign-best-gain": codesign_best_gain,
             "codesign-small-model": codesign_small_model}


@lru_cache(maxsize=64)
def question(key: str) -> Question:
    """A lesson's question by key (:data:`QUESTIONS`), computed once per session."""
    if key not in QUESTIONS:
        raise SnlabError("question", f"got {key!r}", ", ".join(QUESTIONS))
    return QUESTIONS[key]()


__all__ = ["Question", "QUESTIONS", "question", "answered", "binned", "ratio_band", "speed_band", "time_band",
           "tolerance_band", "widest_band", "EDGE_MARGIN"]
