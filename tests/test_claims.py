"""The seed article's claims: every verdict comes from computed numbers, and can flip.

Each claim is tested twice: its verdict in the article's setting (a model change that
flips it fails here and in the claims notebook), and a setting where the same logic gives
another verdict (so no test passes whatever the model computes).
"""

import pytest

from snlab import claims
from snlab.claims import CONDITIONAL, FAILS, HOLDS

EXPECTED = {
    "C1": HOLDS, "C2": CONDITIONAL, "C3": FAILS, "C4/C5": CONDITIONAL, "C6": CONDITIONAL, "C7": FAILS,
    "C8": FAILS, "C9": CONDITIONAL, "C10": CONDITIONAL, "C11": CONDITIONAL, "C12": FAILS, "C13": CONDITIONAL,
    "C14": FAILS, "C15": CONDITIONAL, "C16": HOLDS,
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
    assert v.decisions, "a verdict needs the quantities that decide it"
    if v.verdict == CONDITIONAL:
        assert v.condition


def _system(name, **changes):
    import snlab
    return snlab.system(name).replace(**changes)


# each claim, in another setting where its logic gives another verdict
FLIPS = [
    ("C1", lambda: claims.c1(model="llama3-405b"), FAILS),
    ("C2", lambda: claims.c2(model="llama3-405b"), FAILS),
    ("C3", lambda: claims.c3(seq_len_big=65536), CONDITIONAL),
    ("C4/C5", lambda: claims.c4_c5(cluster="dgx-a100"), FAILS),
    ("C6", lambda: claims.c6(supernode=_system("cloudmatrix384", scale_up_call_latency=1e-7,
                                               scale_up_node_latency=1e-9, scale_up_latency=1e-9)), HOLDS),
    ("C7", lambda: claims.c7(parallelism="ep"), HOLDS),
    ("C8", lambda: claims.c8(system=_system("dgx-a100", host_memory_bandwidth=5e9)), CONDITIONAL),
    ("C9", lambda: claims.c9(system=_system("cloudmatrix384", pool_bandwidth=2.0e12)), HOLDS),
    ("C10", lambda: claims.c10(model="megatron-1t"), HOLDS),
    ("C11", lambda: claims.c11(supernode="pcie-ethernet-a100"), FAILS),
    # a cluster whose every collective call costs 3 ms wants micro-batches of 32
    ("C12", lambda: claims.c12(cluster=_system("pcie-ethernet-a100", scale_up_call_latency=3e-3,
                                               scale_out_call_latency=3e-3),
                               cases={"8B at s=256": ("llama3-8b", 256, dict(tp=8, pp=8, dp=1, global_batch=512,
                                                                            recompute="selective"))}), HOLDS),
    ("C13", lambda: claims.c13(system=_system("cloudmatrix384", pool_bandwidth=40e9)), FAILS),
    # a supernode device bought at 60 k$ costs more per token than the cluster's
    ("C14", lambda: claims.c14(supernode_prices={"capex": 60000, "kwh": 0.056}), HOLDS),
    # an air room that removes 45 kW per rack takes the supernode's racks at full clock
    ("C15", lambda: claims.c15(air_rack_limit="45 kW"), FAILS),
    # the hand sizing asks for 161 devices where a plan fits 128
    ("C16", lambda: claims.c16(seq_len=262144, global_batch=384, devices=128), FAILS),
    # one supernode's plan draws more than a 500 kW building can give it
    ("C16", lambda: claims.c16(power_budget="500 kW"), FAILS),
]


@pytest.mark.parametrize("claim_id, compute, flipped", FLIPS, ids=[f[0] for f in FLIPS])
def test_each_claim_can_flip(claim_id, compute, flipped):
    v = compute()
    assert v.claim_id == claim_id
    assert EXPECTED[claim_id] != flipped
    assert v.verdict == flipped, str(v)


def test_every_claim_has_a_flip_case():
    assert {f[0] for f in FLIPS} == set(EXPECTED)


def test_numbers_behind_the_memory_claims(verdicts):
    assert verdicts["C1"].numbers["BF16 weights [TB]"] == pytest.approx(2.016, rel=1e-3)
    c2 = verdicts["C2"].numbers
    assert c2["moments in fp32 [TB]"] == pytest.approx(2 * c2["moments in bf16 [TB]"])
    assert c2["fp32 master + moments [TB]"] == pytest.approx(3 * c2["moments in bf16 [TB]"])
    c3 = verdicts["C3"].numbers
    assert c3["optimizer state ratio"] == c3["parameters ratio"]        # linear, not exponential


def test_numbers_behind_the_communication_claims(verdicts):
    c6 = verdicts["C6"].numbers
    assert 10 < c6["64 kB over 16, cluster [us]"] < 100                          # tens of microseconds
    assert c6["64 kB over 16, supernode [us]"] > 1                               # not sub-microsecond
    assert c6["105 MB over 16, cluster [ms]"] > 10 * c6["105 MB over 16, supernode [ms]"]
    # inside the supernode each ring step pays its own level: mostly in-node hops
    assert c6["supernode: mean ring step [us]"] < 1.0
    c11 = verdicts["C11"].numbers
    assert c11["exposed communication per step, cluster [s]"] > 1.0             # seconds, not tens of ms
    assert c11["communication hidden, supernode"] > 1.4 * c11["communication hidden, cluster"]
    # the overlap half reads as a share, whatever the cluster hides (here nothing)
    overlap = verdicts["C11"].decisions[1]
    assert 0 < overlap.value <= 1 and "where the claim needs more than 0; on the claim's side" in overlap.describe()
    c45 = verdicts["C4/C5"].numbers
    assert 0.25 <= c45["paper's plan: MFU"] <= 0.45 and c45["paper's plan: share lost"] >= 0.3
    assert c45["best plan: MFU"] > 0.45 > c45["paper's plan: MFU"]


def test_c8_charges_the_host_adam_step(verdicts):
    """The CPU's Adam update streams the optimizer state through host DRAM once per step."""
    c8 = verdicts["C8"].numbers
    assert c8["CPU Adam step [s]"] > 0.5
    assert c8["CPU Adam step [s]"] > c8["gradients out and weights back over PCIe [s]"]


def test_pooled_memory_is_charged_to_its_lenders(verdicts):
    assert verdicts["C13"].numbers["devices lending HBM, batch 4"] >= 1
    assert verdicts["C9"].numbers["devices lending HBM for it"] >= 1


def test_uncertainty_is_reported(verdicts):
    """A decision whose margin lies inside its regime's band says so; one without
    published runs says the verdict rests on the model alone."""
    for v in verdicts.values():
        for d in v.decisions:
            text = d.describe()
            if d.band is not None and d.band.runs == 0:
                assert "rests on the model alone" in text
            if d.within_uncertainty:
                assert "the model's error could undo" in text and "more than" not in text \
                    and "within the model's uncertainty" in v.label
    assert any(v.within_uncertainty for v in verdicts.values())


def test_markdown_and_table_render(verdicts):
    text = verdicts["C13"]._repr_markdown_()
    assert "C13" in text and "|" in text and "What decides it" in text
    df = claims.table(list(verdicts.values()))
    assert list(df.columns) == ["claim", "statement", "verdict", "condition", "within_uncertainty"]
    assert len(df) == len(EXPECTED)


def test_readme_claims_table_matches(verdicts):
    from pathlib import Path
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert claims.table_markdown(list(verdicts.values())) in readme, "refresh README: python -m snlab.docs"
