"""Every term of the step models is pinned by a fast test: the mutation check
(``tests/mutate.py``) finds no surviving mutant. It runs in a process of its own, as
``make mutate`` does, and takes a minute or two."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_mutant_of_the_step_models_survives():
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "mutate.py")], capture_output=True, text=True,
                         cwd=ROOT, timeout=1800)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "0 survived" in out.stdout and "killed" in out.stdout
