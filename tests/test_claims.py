"""The seed article's claims: every verdict comes from computed numbers.

Each test pins the verdict the model gives today and the numbers behind it, so that
a change to the model that flips a verdict fails here (and in the claims notebook).
"""

import pytest

from snlab import claims
from snlab.claims import CONDITIONAL, FAILS, HOLDS

EXPECTED = {
    "C1": HOLDS, "C2": CONDITIONAL, "C3": FAILS, "C4/C5": CONDITIONAL, "C6": CONDITIONAL, "C7": FAILS,
    "C8": FAILS, "C9": CONDITIONAL, "C10": CONDITIONAL, "C11": HOLDS, "C12": FAILS, "C13": CONDITIONAL,
    "C14": HOLDS, "C15": CONDITIONAL, "C16": HOLDS,
}


@pytest.fixture(scope="module")
def verdicts():
    return {v.claim_id: v for v in claims.all_claims()}


def test_every_claim_has_a_verdict(verdicts):
    assert set(verdicts) == set(EXPECTED)


@pytest.mark.parametrize("claim_id", list(EXPECTED))
def test_verdict(verdicts, claim_id):
    v = verdicts[claim_id]
    assert v.verdict == EXPECTED[claim_id], str(v)
    assert v.numbers, "a verdict needs numbers"
    if v.verdict == CONDITIONAL:
        assert v.condition


def test_numbers_behind_the_memory_claims(verdicts):
    assert verdicts["C1"].numbers["BF16 weights [TB]"] == pytest.approx(2.016, rel=1e-3)
    c2 = verdicts["C2"].numbers
    assert c2["moments in fp32 [TB]"] == pytest.approx(2 * c2["moments in bf16 [TB]"])
    assert c2["fp32 master + moments [TB]"] == pytest.approx(3 * c2["moments in bf16 [TB]"])
    c3 = verdicts["C3"].numbers
    assert c3["optimizer state ratio"] == c3["parameters ratio"]        # linear, not exponential


def test_numbers_behind_the_communication_claims(verdicts):
    c6 = verdicts["C6"].numbers
    assert 10 < c6["64 kB over 16, PCIe/Ethernet [us]"] < 100                      # tens of microseconds
    assert c6["64 kB over 16, CloudMatrix384 [us]"] > 1                            # not sub-microsecond
    assert c6["105 MB over 16, PCIe/Ethernet [ms]"] > 10 * c6["105 MB over 16, CloudMatrix384 [ms]"]
    assert verdicts["C11"].numbers["reduction"] >= 0.4
    c45 = verdicts["C4/C5"].numbers
    assert 0.25 <= c45["paper's plan: MFU"] <= 0.45 and c45["paper's plan: share lost"] >= 0.3
    assert c45["best plan: MFU"] > 0.45 > c45["paper's plan: MFU"]
    assert c45["CloudMatrix384 best plan: share lost"] < c45["best plan: share lost"] / 4


def test_markdown_and_table_render(verdicts):
    text = verdicts["C13"]._repr_markdown_()
    assert "C13" in text and "|" in text
    df = claims.table(list(verdicts.values()))
    assert list(df.columns) == ["claim", "statement", "verdict", "condition"] and len(df) == len(EXPECTED)


def test_readme_claims_table_matches(verdicts):
    from pathlib import Path
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert claims.table_markdown(list(verdicts.values())) in readme, "refresh README: snlab evidence claims"
