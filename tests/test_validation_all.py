"""Every shipped published run (training, memory, serving) within its tolerance, and
the summary the README quotes."""

from pathlib import Path

import pytest
from conftest import assert_within, published_rows

from snlab import charts, validation

TABLE = validation.table()


@pytest.mark.parametrize("row", published_rows(TABLE[TABLE.kind == "memory"].fillna({"outside": ""})
                                              .to_dict("records")))
def test_memory_figures_within_tolerance(row):
    assert_within(row, "memory regime's")


def test_one_tolerance_per_kind_of_run():
    """Every row of a kind of run (and of a regime within it) is held to one tolerance."""
    for _, part in TABLE.groupby(["kind", "regime"]):
        assert part["tolerance"].nunique() == 1
    memory = TABLE[TABLE.kind == "memory"]
    assert set(memory["tolerance"]) == {0.10}
    measured = memory[memory["id"].str.contains("peak")]
    assert len(measured) >= 12 and measured["within"].sum() >= 8


def test_every_run_has_a_known_source():
    from snlab.presets import bibliography
    assert set(TABLE["source"]) <= set(bibliography())


def test_parity_chart_has_every_run():
    spec = charts.parity(TABLE).to_dict()
    values = next(iter(spec["datasets"].values()))
    assert {v["id"] for v in values} == set(TABLE["id"])


def test_readme_summary_matches_the_table():
    """The README's accuracy summary quotes the numbers this table computes."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    summary = validation.summary(TABLE)
    for row in summary.itertuples():
        line = next((l for l in readme.splitlines() if l.startswith(f"| {row.kind} | {row.source} |")), None)
        assert line is not None, f"README lacks the summary row for {row.kind} / {row.source}"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == str(row.runs)
        assert cells[3] == f"{row.median_abs_error:.1%}" and cells[4] == f"{row.median_error:+.1%}"
        assert cells[5] == f"{row.worst_abs_error:.1%}" and cells[6] == f"{row.within}/{row.runs}"


def test_the_error_bands_are_the_published_runs_spread():
    """snlab/presets/data/error_bands.toml is what the runs give (python -m snlab.docs
    rewrites it), and each band holds every run of its regime."""
    from snlab import uncertainty
    from snlab.docs import bands_path
    from snlab.validation.bands import bands_toml, residuals
    assert bands_path().read_text(encoding="utf-8") == bands_toml(), "stale: run python -m snlab.docs"
    frame = residuals()
    for (regime, family), part in frame.groupby(["regime", "family"]):
        band = uncertainty.band(regime, family)
        assert band.runs == len(part)
        assert band.low <= part["ratio"].min() + 1e-4 and part["ratio"].max() <= band.high + 1e-4
    assert uncertainty.band("training", "Ascend 910C").runs == 0
