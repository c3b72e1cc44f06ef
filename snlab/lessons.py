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
takes the widest band any family of that regime shows.
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


def ratio_band(a: tuple, b: tuple, value: float) -> tuple[float, float]:
    """The band of the ratio ``value`` = A / B of two predicted speeds with bands ``a`` and ``b``."""
    return min(value, a[0] / b[1]), max(value, a[1] / b[0])


# --- the questions ----------------------------------------------------------------------------

def supernode_mfu() -> Question:
    """Lesson 00: how much higher the supernode's MFU is for the 1T model on 384 devices."""
    from . import compare
    from .presets import system
    best = compare.best_plans(["megatron-1t"], ["pcie-ethernet-a100", "cloudmatrix384"], devices=384,
                              global_batch=768).set_index("system")
    cm, cl = float(best.loc["cloudmatrix384", "mfu"]), float(best.loc["pcie-ethernet-a100", "mfu"])
    ratio = cm / cl
    low, high = ratio_band(speed_band("training", system("cloudmatrix384").device.family, cm),
                           speed_band("training", system("pcie-ethernet-a100").device.family, cl), ratio)
    edges = (1 / 1.1, 1.1)
    options = ("clearly lower (by more than 10%, errors included)", "about the same (within 10%)",
               "clearly higher (by more than 10%, errors included)")
    return Question("supernode-mfu", "For the 1T model on 384 devices, each system with its best plan: is the "
                    "supernode's MFU higher than the cluster's, by more than the model's error?", options,
                    binned(ratio, low, high, edges, options),
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
    return Question("throttled-step", "The clock sustains 80% of its peak. How much slower is a training step of "
                    "Llama-3 70B on 256 H100s?", options, binned(slowdown, slowdown, slowdown, edges, options),
                    f"The model says {slowdown:.0%}: only the compute-bound part of the step stretches by 1 / 0.8; "
                    "communication, memory-bound kernels and the waiting they cause do not.",
                    slowdown, slowdown, slowdown, edges)


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
    near = sorted(int(m) for m, t in steps[SUPERNODE].items() if t <= steps[SUPERNODE].min() * (1 + EDGE_MARGIN))
    return Question("quarter-micro-batch", "The article advises micro-batches a quarter the size on a supernode "
                    f"(claim C12). With 256-token sequences the cluster runs best at micro-batch {cluster_best}. On the "
                    f"supernode, how does micro-batch {quarter} compare with its best?", options,
                    binned(ratio, ratio, ratio, edges, options),
                    f"Micro-batch {quarter} takes {ratio:.2f} times the supernode's best step; micro-batches "
                    f"{', '.join(map(str, near))} are all within 10% of it. The supernode's cheap bandwidth leaves the "
                    "fixed per-micro-batch costs (weights read, message latency) as what larger micro-batches save: no "
                    "quarter-size rule.", ratio, ratio, ratio, edges)


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


QUESTIONS = {"supernode-mfu": supernode_mfu, "throttled-step": throttled_step, "zero-stage-that-fits": zero_stage_that_fits,
             "quarter-micro-batch": quarter_micro_batch, "deep-pipeline": deep_pipeline}


@lru_cache(maxsize=64)
def question(key: str) -> Question:
    """A lesson's question by key (:data:`QUESTIONS`), computed once per session."""
    if key not in QUESTIONS:
        raise SnlabError("question", f"got {key!r}", ", ".join(QUESTIONS))
    return QUESTIONS[key]()


__all__ = ["Question", "QUESTIONS", "question", "binned", "ratio_band", "speed_band", "widest_band", "EDGE_MARGIN"]
