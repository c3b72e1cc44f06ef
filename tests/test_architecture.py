"""How snlab is built: layers and imports, small functions, no private names across
modules, reloadable modules, and dimensions checked when a formula is built."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sympy as sp

import snlab
from snlab import architecture
from snlab.formula import DimensionError, Formula
from snlab.symbols import sym

PACKAGE = Path(snlab.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_import_goes_down_the_layers_and_no_room_imports_in_a_circle():
    assert architecture.violations() == []


def test_the_checker_sees_an_upward_import():
    """A wall importing the training planner would be an import from layer 4 into 1."""
    edges = architecture.room_edges() | {("walls", "training")}
    ups = [(a, b) for a, b in edges if architecture.ROOM_LAYER[b] > architecture.ROOM_LAYER[a]]
    assert ("walls", "training") in ups


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_80_lines(path):
    tree = ast.parse(path.read_text())
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in _functions(tree) if f.end_lineno - f.lineno + 1 > 80]
    assert not long


def _snlab_names(tree) -> set[str]:
    """Local names bound to snlab modules or objects by imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("snlab")):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("snlab")}
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_a_private_name_of_another_snlab_module(path):
    tree = ast.parse(path.read_text())
    bad = [f"import {a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
           and (n.level or (n.module or "").startswith("snlab"))
           for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
    local = _snlab_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in local:
                bad.append(ast.unparse(node))
    assert not bad


def test_every_module_reloads():
    """importlib.reload of every module, in a fresh interpreter (reloading the formula
    module here would give later tests new classes under old names)."""
    script = textwrap.dedent("""
        import importlib, pkgutil, sys
        import snlab
        names = sorted(m.name for m in pkgutil.walk_packages(snlab.__path__, "snlab.")
                       if not m.name.endswith("__main__"))
        for name in names:
            importlib.reload(importlib.import_module(name))
        snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8)
        print("RELOADED", len(names))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert "RELOADED" in out.stdout, out.stderr
    assert int(out.stdout.split()[-1]) >= 40


def test_a_reloaded_wall_replaces_its_formulas():
    from snlab import walls
    before = walls.formulas()["ring_all_reduce_time"]
    importlib.reload(walls.communication)
    after = walls.formulas()["ring_all_reduce_time"]
    assert after is not before and after.expr == before.expr


def test_autoreload_picks_up_an_edited_wall(tmp_path):
    """%autoreload 2 in IPython, as in a notebook: edit the compute wall's roofline in a
    copy of the package, run the next cell, and the planner computes with the edit."""
    import shutil
    shutil.copytree(PACKAGE, tmp_path / "snlab", ignore=shutil.ignore_patterns("__pycache__"))
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "autoreload")
        ip.run_line_magic("autoreload", "2")
        ip.run_cell("import snlab; assert snlab.__file__.startswith({str(tmp_path)!r})")
        # enough calls that the plan runs its scalar kernel (snlab.kernel) before the edit and after
        ip.run_cell("for _ in range(20): t0 = snlab.train('llama3-8b', 'dgx-h100', tp=8, global_batch=8).step_time_s")
        path = {str(tmp_path / 'snlab' / 'walls' / 'compute.py')!r}
        text = open(path).read()
        edited = text.replace("sp.Max(W / (etac * kap * Fpk), Q / (etam * Bm))",
                              "2 * sp.Max(W / (etac * kap * Fpk), Q / (etam * Bm))")
        assert edited != text
        time.sleep(1.1)
        open(path, "w").write(edited)
        ip.run_cell("for _ in range(20): t1 = snlab.train('llama3-8b', 'dgx-h100', tp=8, global_batch=8).step_time_s")
        ip.run_cell("from snlab.training import planner; print('KERNELS', len(planner._KERNELS))")
        ip.run_cell("print('RATIO', t1 / t0)")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    ratio = [line for line in out.stdout.splitlines() if line.startswith("RATIO")]
    assert ratio, out.stdout + out.stderr
    assert float(ratio[0].split()[1]) > 1.3      # the compute part of the step doubled
    assert "KERNELS 1" in out.stdout              # ... in the kernel traced from the edited wall


def test_a_formula_must_have_the_dimension_of_what_it_defines():
    with pytest.raises(DimensionError, match=r"defines time \[s\] but its expression is in 1"):
        Formula("bubble_as_time", "time", (sym.pp - 1) / (sym.interleave * sym.micro_batches), "test")
    with pytest.raises(DimensionError, match="unlike dimensions"):
        Formula("bytes_plus_seconds", "time", sym.message_bytes + sym.latency, "test")
    with pytest.raises(DimensionError, match="log"):
        Formula("log_of_bytes", "flops", sp.log(sym.message_bytes), "test")
    ok = Formula("alpha_beta", "time", sym.latency + sym.message_bytes / sym.link_bandwidth, "test")
    assert ok.unit == "s"


def test_every_shipped_formula_has_a_consistent_dimension():
    from snlab.formula import expression_dimension
    from snlab.symbols import dimension
    for f in snlab.formulas().values():
        got = expression_dimension(f.expr)
        assert got is None or got == dimension(f.unit), f.name
