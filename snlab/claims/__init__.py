"""The source article's claims (C1-C16) put to the model.

Each ``c*`` function computes the numbers that test one claim with the library's
formulas and planners, and derives the verdict from them: ``holds``, ``holds only if
...`` or ``does not hold``. Each names the quantities that decide it (``Verdict.decisions``),
how far each is from flipping, and whether the model's error band of that regime could
move it across (then the verdict reads "within the model's uncertainty"). Every function
takes the inputs that decide it, defaulting to the article's setting, so that another
system, model or plan can flip it. The claims are paraphrased; the article's wording is
not reproduced.
"""

from __future__ import annotations

from .memory import c1, c2, c3
from .serving import c9, c10, c13, c14
from .training import c4_c5, c6, c7, c8, c11, c12, c15, c16
from .verdict import CONDITIONAL, FAILS, HOLDS, Decision, Verdict

TRAINING_CLAIMS = (c1, c2, c3, c4_c5, c6, c7, c8, c11, c12, c15, c16)
SERVING_CLAIMS = (c9, c10, c13, c14)

__all__ = ["HOLDS", "CONDITIONAL", "FAILS", "Verdict", "Decision", "all_claims", "table", "table_markdown",
           "c1", "c2", "c3", "c4_c5", "c6", "c7", "c8", "c9", "c10", "c11", "c12", "c13", "c14", "c15", "c16"]


def all_claims() -> list[Verdict]:
    """Every claim's verdict, in the article's order."""
    order = {"C1": 1, "C2": 2, "C3": 3, "C4/C5": 4, "C6": 6, "C7": 7, "C8": 8, "C9": 9, "C10": 10, "C11": 11,
             "C12": 12, "C13": 13, "C14": 14, "C15": 15, "C16": 16}
    verdicts = [f() for f in TRAINING_CLAIMS + SERVING_CLAIMS]
    return sorted(verdicts, key=lambda v: order[v.claim_id])


def table(verdicts=None):
    """The verdicts as a pandas DataFrame: claim, statement, verdict, condition, and
    whether the model's uncertainty covers the decision."""
    import pandas as pd
    verdicts = verdicts if verdicts is not None else all_claims()
    return pd.DataFrame([{"claim": v.claim_id, "statement": v.claim, "verdict": v.verdict,
                          "condition": v.condition if v.verdict == CONDITIONAL else "",
                          "within_uncertainty": v.within_uncertainty} for v in verdicts])


def table_markdown(verdicts=None) -> str:
    """The verdicts as the Markdown table the README shows."""
    verdicts = verdicts if verdicts is not None else all_claims()
    rows = ["| claim | statement | verdict |", "|---|---|---|"]
    for v in verdicts:
        rows.append(f"| {v.claim_id} | {v.claim} | {v.label} |")
    return "\n".join(rows)
