"""The lessons' shape: clean in git, one formula from the library, a self-check, asserts.

nbval executes the notebooks (``make test`` runs ``pytest notebooks --nbval-lax``); these
checks make sure that what it executes can fail: a checked cell without a stored
reference would be skipped silently, and a lesson without asserts pins nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import re

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = ["00-start-here", "01-compute-wall", "02-memory-wall", "03-communication-wall",
           "04-cluster-vs-supernode", "05-pipelines-and-micro-batches", "06-long-context-serving",
           "07-planner", "10-power-and-cost", "11-serving-at-scale", "12-co-design"]


def _refresh_module():
    spec = importlib.util.spec_from_file_location("refresh_outputs", NOTEBOOKS / "refresh_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_every_lesson_exists():
    found = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert set(LESSONS) <= found, sorted(set(LESSONS) - found)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_is_clean_and_checked_cells_have_a_reference(path):
    """Every notebook is stripped for git except its checked cells; and nbval skips the
    comparison of a cell that was never run, so a checked cell must carry its stored
    output, or the check silently checks nothing."""
    nb = nbformat.read(path, as_version=4)
    assert _refresh_module().is_clean(nb), f"{path.name}: run `make notebooks` (outputs only in checked cells)"
    for cell in nb.cells:
        if cell.cell_type == "code" and "# NBVAL_CHECK_OUTPUT" in cell.source:
            assert cell.execution_count is not None and cell.outputs, f"{path.name}: {cell.source[:60]!r}"


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = _code(nb)
    assert any("display(snlab.walls." in c for c in code), f"{name}: shows no formula from the library"
    quizzes = [k for c in code for k in re.findall(r'widgets\.quiz\("([\w-]+)"\)', c)]
    assert quizzes, f"{name}: no predict-then-check exercise (widgets.quiz of a key of snlab.lessons)"
    from snlab.lessons import QUESTIONS
    assert set(quizzes) <= set(QUESTIONS), f"{name}: unknown question"
    # headline numbers are pinned by the lesson's asserts or by its question's test (tests/test_lessons.py)
    assert sum(c.count("assert ") for c in code) + 2 * len(quizzes) >= 2, f"{name}: headline numbers are not pinned"
    assert not any("import pandas" in c or "def " in c for c in code), f"{name}: logic belongs in snlab/"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
