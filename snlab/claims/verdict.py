"""A claim's verdict: the quantity that decides it, how close it is to flipping, and
how far the model's own error could move it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import uncertainty

HOLDS, CONDITIONAL, FAILS = "holds", "holds only if", "does not hold"


@dataclass(frozen=True)
class Decision:
    """The quantity that decides a verdict: its ``value``, the ``threshold`` it is
    compared with (``above``: the claim needs value >= threshold; ``strict``: value >
    threshold), and the error band
    of the regime that computed it (``band``; None when no band applies, and ``basis``
    then says why: exact arithmetic, or a model checked elsewhere)."""

    quantity: str
    value: float
    threshold: float
    above: bool
    band: uncertainty.Band | None = None
    basis: str = "exact arithmetic"
    #: the claim needs the value strictly beyond the threshold (a difference that must be positive)
    strict: bool = False

    @property
    def passes(self) -> bool:
        if self.strict:
            return self.value > self.threshold if self.above else self.value < self.threshold
        return self.value >= self.threshold if self.above else self.value <= self.threshold

    @property
    def margin(self) -> float:
        """How far the value is from the threshold, relative to it (> 0: on the claim's
        side): the change that would flip the verdict."""
        gap = (self.value - self.threshold) / abs(self.threshold) if self.threshold else self.value
        return float(gap if self.above else -gap)

    @property
    def validated(self) -> bool:
        return self.band is None or self.band.runs > 0

    @property
    def within_uncertainty(self) -> bool:
        """True when the regime's band (the spread of its published runs, high / low)
        could move the value across the threshold."""
        if self.band is None or not self.band.runs:
            return False
        spread = self.band.high / self.band.low
        lo, hi = self.value / spread, self.value * spread
        return bool(min(lo, hi) <= self.threshold <= max(lo, hi))

    def describe(self) -> str:
        """The decision as a sentence: the quantity, what the claim needs, which side of
        that line the value falls and by how much, and whether the model's error could
        move it across."""
        need = ("more than" if self.above else "less than") if self.strict else ("at least" if self.above else "at most")
        side = "on the claim's side" if self.passes else "on the other side"
        by = f", by {abs(self.margin):.0%}" if self.threshold else ""
        text = f"{self.quantity[:1].upper()}{self.quantity[1:]}: {_fmt(self.value)}, where the claim needs {need} " \
               f"{_fmt(self.threshold)}; {side}{by}"
        if self.band is None:
            return text + f" ({self.basis})."
        if not self.band.runs:
            return text + f". No published runs check this ({self.band.regime} on {self.band.family}): the " \
                          "verdict rests on the model alone."
        if self.within_uncertainty:
            return text + f", which the model's error could undo ({self.band.describe()})."
        return text + f", more than the model's error could undo ({self.band.describe()})."


@dataclass(frozen=True)
class Verdict:
    """A claim, the numbers the model computes for it, the decisions behind the verdict
    and the verdict they give."""

    claim_id: str
    claim: str
    verdict: str
    condition: str
    numbers: dict = field(default_factory=dict)
    explanation: str = ""
    decisions: tuple = ()

    @property
    def within_uncertainty(self) -> bool:
        """True when a decision's margin lies inside the model's error band."""
        return any(d.within_uncertainty for d in self.decisions)

    @property
    def label(self) -> str:
        """The verdict with its condition and, if it applies, "within the model's uncertainty"."""
        text = self.verdict + (f" {self.condition}" if self.verdict == CONDITIONAL else "")
        return text + (" (within the model's uncertainty)" if self.within_uncertainty else "")

    def __str__(self) -> str:
        nums = ", ".join(f"{k} = {_fmt(v)}" for k, v in self.numbers.items())
        why = "\n".join(f"  {d.describe()}" for d in self.decisions)
        return f"{self.claim_id}: {self.label}\n  {self.claim}\n  {nums}\n{why}\n  {self.explanation}"

    def _repr_markdown_(self) -> str:
        rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in self.numbers.items())
        why = "\n".join(f"- {d.describe()}" for d in self.decisions)
        return (f"**{self.claim_id}: {self.label}**\n\n> {self.claim}\n\n"
                f"| quantity | value |\n|---|---|\n{rows}\n\n**What decides it.**\n\n{why}\n\n{self.explanation}")


def verdict_of(decisions, condition_if_first: bool = True) -> str:
    """HOLDS if every decision passes; CONDITIONAL if only the first does (the claim
    holds in the case it names), FAILS otherwise."""
    passes = [d.passes for d in decisions]
    if all(passes):
        return HOLDS
    if condition_if_first and passes[0]:
        return CONDITIONAL
    return FAILS


def _fmt(v) -> str:
    """A number for reading: thousands separated, three significant digits below 1,000."""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{v:,}"
    if isinstance(v, (float, np.floating)):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}"
    return str(v)
