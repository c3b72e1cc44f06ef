"""Does it fit: every published training run and recipe that ran is reported as fitting,
and the memory of a plan stage by stage adds up to what the planner reports."""

import pytest

import snlab
from snlab.training import stage_memory
from snlab.validation.training import recipe_runs, recipe_table

RECIPES = recipe_table()


@pytest.mark.parametrize("row", RECIPES.to_dict("records"), ids=list(RECIPES["id"]))
def test_every_published_run_fits(row):
    assert row["fits"], (f"{row['id']} ({row['where']}) ran on {row['system']}, but snlab needs "
                         f"{row['memory_bytes'] / 1e9:.1f} GB of {row['usable_bytes'] / 1e9:.1f} GB")


def test_the_recipes_cover_today_s_dense_and_moe_training():
    runs = recipe_runs()
    assert {r["model"] for r in runs} >= {"llama3-405b", "llama3-70b", "deepseek-v3", "qwen3-30b-a3b"}
    assert {r["system"] for r in runs} >= {"dgx-h100", "gb200-nvl72", "hgx-h800"}
    assert {r["id"] for r in runs} >= {"dubey2024-405b-8k-gpus", "deepseek2024v3-h800"}
    assert sum(r.get("precision") == "fp8" for r in runs) >= 4


def test_the_planner_reports_the_most_loaded_stage():
    plan = dict(tp=4, pp=4, interleave=5, dp=2, micro_batch=1, global_batch=64, recompute="none")
    stages = stage_memory("llama3-70b", "dgx-h100", **plan)
    result = snlab.train("llama3-70b", "dgx-h100", **plan)
    assert len(stages) == 4 and stages["layers"].sum() == 80
    # the first stage holds the most micro-batches; with the embedding it is the largest
    assert stages["total_bytes"].idxmax() == 0
    # the planner takes the largest stage's weights with the largest stage's activations:
    # never less than the most loaded stage, and close to it
    planned = result.memory_bytes_per_device["total"]
    assert stages["total_bytes"].max() <= planned <= 1.05 * stages["total_bytes"].max()
    assert list(stages["in_flight"]) == sorted(stages["in_flight"], reverse=True)


def test_stage_memory_takes_one_plan():
    with pytest.raises(snlab.SnlabError, match="one plan"):
        stage_memory("llama3-8b", "dgx-h100", tp=[1, 2], global_batch=8)
    with pytest.raises(snlab.SnlabError, match="interleave"):
        stage_memory("llama3.2-1b", "dgx-h100", pp=16, interleave=4, global_batch=64)
