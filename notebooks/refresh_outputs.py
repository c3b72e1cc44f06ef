"""Keep the notebooks clean for git: outputs only where nbval checks them.

Runs each notebook on a fresh kernel, then keeps the outputs (and execution count) of
the cells marked ``# NBVAL_CHECK_OUTPUT`` (nbval compares those against what the test
run prints, so they need a stored reference) and strips every other output, execution
count and widget state.

    .venv/bin/python notebooks/refresh_outputs.py            # all notebooks
    .venv/bin/python notebooks/refresh_outputs.py notebooks/02-memory-wall.ipynb
    .venv/bin/python notebooks/refresh_outputs.py --check    # exit 1 if any notebook is not clean

``make notebooks`` runs the first form. Run it after editing a checked cell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

MARK = "# NBVAL_CHECK_OUTPUT"
HERE = Path(__file__).resolve().parent


def checked(cell) -> bool:
    return cell.cell_type == "code" and MARK in cell.source


def is_clean(nb) -> bool:
    """Outputs only in checked cells, no widget state in the metadata."""
    if "widgets" in nb.metadata:
        return False
    for cell in nb.cells:
        if cell.cell_type != "code" or checked(cell):
            continue
        if cell.outputs or cell.execution_count is not None:
            return False
    return True


def strip(nb, executed=None):
    """Strip outputs, keeping (from ``executed`` when given) those of checked cells."""
    nb.metadata.pop("widgets", None)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if checked(cell) and executed is not None:
            ran = executed.cells[i]
            cell.outputs = [o for o in ran.outputs if o.output_type in ("stream", "execute_result")]
            for o in cell.outputs:
                if o.output_type == "execute_result":
                    o.execution_count = 1
            cell.execution_count = 1
        elif not checked(cell):
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    return nb


def refresh(path: Path) -> None:
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    run = nbformat.read(path, as_version=4)
    os.environ.setdefault("SNLAB_OFFLINE", "1")
    NotebookClient(run, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(strip(nb, run), path)
    print(f"refreshed {path}")


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if not a.startswith("--")] or sorted(HERE.glob("*.ipynb"))
    if check:
        dirty = [p for p in paths if not is_clean(nbformat.read(p, as_version=4))]
        for p in dirty:
            print(f"not clean: {p} (run: .venv/bin/python notebooks/refresh_outputs.py {p})")
        return 1 if dirty else 0
    for p in paths:
        refresh(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
