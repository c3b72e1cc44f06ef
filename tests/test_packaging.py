"""snlab as a library: the wheel built from the repository carries its data, installs
into a bare virtual environment without JupyterLab, and plans and draws there.

The wheel is built with the setuptools of the project's environment (no download); the
bare environment gets it with pip, constrained to the lock's versions, so that this test
installs what users get. It needs the package index (or a local wheel cache), as
``make test`` does anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "binder" / "requirements.txt"
#: what a library install must not bring: a Jupyter server, the lab, test tools
NOT_IN_A_LIBRARY_INSTALL = {"jupyterlab", "jupyter-server", "notebook", "voila", "nbval", "pytest", "playwright",
                            "hypothesis"}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)])
    wheels = list(out.glob("snlab-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_carries_the_presets_validation_data_and_error_bands(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "snlab").rglob("*.toml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    for must in ("snlab/presets/data/sources.toml", "snlab/presets/data/error_bands.toml",
                 "snlab/validation/training_runs.toml"):
        assert must in names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "binder/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    core = [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [r for r in core if r.split(">")[0].split("=")[0].strip().lower() in NOT_IN_A_LIBRARY_INSTALL], core


def test_the_wheel_installs_into_a_bare_venv_and_plans_and_draws(wheel, tmp_path):
    # the bare environment sees none of the caller's PYTHONPATH: neither the repository's
    # snlab/ nor its build metadata (which pip would take for snlab installed already)
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    # the bare environment sees no PYTHONPATH: a checkout on it (with the egg-info the wheel's
    # build leaves there) would pass for an installed snlab, and pip would install nothing
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "venv", str(venv)], env=bare)
    py = venv / "bin" / "python"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(line for line in LOCK.read_text().splitlines()
                                     if not line.startswith("-e")))
    _run([str(py), "-m", "pip", "install", "-q", str(wheel), "-c", str(constraints)], timeout=1200, env=bare)
    installed = _run([str(py), "-m", "pip", "list", "--format=freeze"], env=bare).stdout.lower()
    names = {line.split("==")[0].replace("_", "-") for line in installed.splitlines()}
    assert "snlab" in names and "vl-convert-python" in names
    assert not names & NOT_IN_A_LIBRARY_INSTALL, sorted(names & NOT_IN_A_LIBRARY_INSTALL)
    code = (
        "import snlab, snlab.charts as charts, pathlib, sys\n"
        "r = snlab.train('llama3-8b', 'dgx-h100', tp=8, global_batch=8)\n"
        "assert 0 < r.mfu <= 1 and r.fits, r\n"
        "frame = snlab.sweep('llama3-8b', ['dgx-h100', 'cloudmatrix384'], tp=8, global_batch=[8, 16])\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "charts.save(charts.mfu_chart(frame, x='global_batch'), out)\n"
        "print(round(r.mfu, 3), out.stat().st_size)\n"
    )
    svg = tmp_path / "chart.svg"
    # run from an empty folder, so that the repository's snlab/ cannot be imported instead
    result = _run([str(py), "-c", code, str(svg)], cwd=tmp_path, env=bare)
    assert "<svg" in svg.read_text()[:500]
    mfu = float(result.stdout.split()[0])
    import snlab
    assert mfu == round(snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8).mfu, 3)
    cli = _run([str(venv / "bin" / "snlab"), "train", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "8",
                "--global-batch", "8"],
               cwd=tmp_path, env=bare)
    assert "MFU" in cli.stdout
