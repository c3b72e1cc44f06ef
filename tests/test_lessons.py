"""The lessons' "predict, then check" questions: each decided with margin, asked before
anything shows its answer, and the conclusions the lessons' words rest on."""

import json
import re
from pathlib import Path

import pytest

from snlab import lessons, widgets

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.parametrize("key", list(lessons.QUESTIONS))
def test_every_question_is_decided_outside_the_model_s_error(key):
    q = lessons.question(key)
    assert q.answer in q.options
    assert q.decided(), f"{key}: {q.value:.4g} (band {q.low:.4g} to {q.high:.4g}) sits within " \
                        f"{lessons.EDGE_MARGIN:.0%} of an edge {q.edges}: ask another question or say 'about the same'"
    assert q.explanation and q.answer not in q.question


def test_the_lessons_conclusions():
    """What the lessons' words say, pinned here rather than in the lessons' cells."""
    assert lessons.question("supernode-mfu").answer.startswith("clearly higher")
    assert lessons.question("throttled-step").answer == "10% to 23% slower"
    assert lessons.question("zero-stage-that-fits").answer == "ZeRO 1"
    assert lessons.question("quarter-micro-batch").answer.startswith("clearly slower")
    assert lessons.question("deep-pipeline").answer == "optimistic, and further off than for 39.1B"
    # 03: a small all-reduce pays tens of microseconds on the supernode too (C6's latency half fails)
    assert lessons.question("small-all-reduce").answer == "tens of microseconds (10 µs or more)"
    assert lessons.question("four-device-all-reduce").answer == "dgx-b200, by more than 2x"
    assert lessons.question("torus-axes").answer == "about 3x"
    # 04: at 1B parameters the bus buys nothing the model can tell apart (C14)
    assert lessons.question("small-model-mfu").answer.startswith("about the same")
    assert lessons.question("million-token-decode").answer == "more than 3 times"
    assert lessons.question("bus-worth-small-model").answer == "almost nothing (under 10%)"
    assert lessons.question("air-cooled-supernode").answer == "more than 25%"
    assert lessons.question("least-energy-per-token").answer.startswith("gb200-nvl72")
    assert lessons.question("cluster-cost-ratio").answer == "more than 3 times"
    assert lessons.question("queue-ttft").answer == "above 10 requests/s"
    assert lessons.question("kv-transfer-ratio").answer == "more than 3 times longer"
    # C13 with a request queue: the pool buys capacity, not speed
    assert lessons.question("queue-pool-gain").answer == "less than twice"


def test_an_edge_inside_the_band_is_about_the_same():
    assert lessons.binned(1.05, 1.0, 1.12, (1.1,), ["lower", "higher"], same="about the same") == "about the same"
    assert lessons.binned(1.5, 1.3, 1.6, (1.1,), ["lower", "higher"], same="about the same") == "higher"
    q = lessons.Question("k", "?", ("a", "b"), "b", "", 1.05, 1.0, 1.12, (1.1,))
    assert not q.decided() and q.margin() < 0
    assert lessons.Question("k", "?", ("a", "b"), "b", "", 1.5, 1.4, 1.6, (1.1,)).decided()
    band = lessons.widest_band("training")
    assert band.low <= 1 <= band.high or band.low > 0
    with pytest.raises(Exception, match="question"):
        lessons.question("nope")


def test_an_answered_question_takes_the_option_its_value_falls_in():
    point = lessons.answered("k", "?", ("low", "mid", "high"), "", 1.3, edges=(1.1, 2.0))
    assert (point.answer, point.low, point.high) == ("mid", 1.3, 1.3) and point.decided()
    band = lessons.answered("k", "?", ("low", "high"), "", 1.05, 1.0, 1.12, (1.1,))
    assert band.answer == "low" and not band.decided()


def _cells(name):
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")))
def test_no_cell_above_a_question_holds_its_answer(name):
    """The source above a question neither writes its answer nor asserts it, and the
    question cell itself holds no explanation: the library computes both."""
    cells = _cells(name)
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        for key in re.findall(r'widgets\.quiz\("([\w-]+)"\)', source):
            q = lessons.question(key)
            above = "".join("".join(c["source"]) for c in cells[:i])
            assert q.answer not in above, f"{name}: the answer of {key} is written above its question"
            assert source.strip().endswith(f'widgets.quiz("{key}")')


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")))
def test_every_lesson_asks_through_the_library(name):
    """No lesson builds a quiz in a cell: every question is :func:`snlab.widgets.quiz` of a
    key of :data:`snlab.lessons.QUESTIONS`, its answer and explanation computed there."""
    code = ["".join(c["source"]) for c in _cells(name) if c["cell_type"] == "code"]
    assert not any("widgets.Quiz(" in c or "Quiz(" in c for c in code), f"{name}: builds a quiz in a cell"
    assert not any(re.search(r"^\s*guess\s*=", c, flags=re.M) for c in code), f"{name}: a pre-filled guess"
    keys = [k for c in code for k in re.findall(r'widgets\.quiz\("([\w-]+)"\)', c)]
    assert keys and set(keys) <= set(lessons.QUESTIONS), name


def test_every_question_is_asked_by_one_lesson():
    keys = [k for p in NOTEBOOKS.glob("[0-9][0-9]-*.ipynb") for c in _cells(p.stem)
            for k in re.findall(r'widgets\.quiz\("([\w-]+)"\)', "".join(c["source"]))]
    assert sorted(keys) == sorted(lessons.QUESTIONS)


def test_a_quiz_reads_without_a_kernel():
    html = widgets.quiz("throttled-step").html()
    assert "<details>" in html and "Check your answer" in html and "The model says" in html
    bundle = widgets.quiz("throttled-step")._repr_mimebundle_()
    assert "text/html" in bundle and bundle["text/plain"].startswith("Predict:")
