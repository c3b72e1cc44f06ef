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


def test_a_quiz_reads_without_a_kernel():
    html = widgets.quiz("throttled-step").html()
    assert "<details>" in html and "Check your answer" in html and "The model says" in html
    bundle = widgets.quiz("throttled-step")._repr_mimebundle_()
    assert "text/html" in bundle and bundle["text/plain"].startswith("Predict:")
