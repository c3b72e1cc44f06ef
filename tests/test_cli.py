"""The snlab command: listing, showing, TOML round trip, one-line errors."""

import json
import subprocess
import sys

import pytest

from test_presets import REQUIRED


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "snlab", *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_presets_lists_every_required_name():
    out = run("presets").stdout
    for names in REQUIRED.values():
        for name in names:
            assert name in out


def test_show_toml_copy_behaves_like_the_preset(tmp_path):
    text = run("presets", "show", "dgx-a100", "--toml").stdout
    path = tmp_path / "x.toml"
    path.write_text(text)
    original = json.loads(run("presets", "show", "dgx-a100", "--json").stdout)
    copy = json.loads(run("presets", "show", str(path), "--json").stdout)
    assert copy == original


def test_show_human_readable_lists_sources():
    out = run("presets", "show", "cloudmatrix384").stdout
    assert "scale_up.bandwidth" in out and "per direction" in out


@pytest.mark.parametrize("args, needle", [
    (["presets", "show", "nope"], "unknown preset 'nope'"),
    (["presets", "show", "/does/not/exist.toml"], "cannot read file"),
])
def test_errors_are_one_line_without_traceback(args, needle):
    proc = run(*args, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snlab: error:") and needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_malformed_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("kind = 'system'\n[scale_up\n")
    proc = run("presets", "show", str(bad), check=False)
    assert proc.returncode == 2 and "malformed TOML" in proc.stderr and "Traceback" not in proc.stderr


def test_symbols_markdown_is_the_readme_table():
    from pathlib import Path
    table = run("symbols", "--markdown").stdout.strip()
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert table in readme, "README's nomenclature table is out of date: run snlab symbols --markdown"


def test_import_stays_light():
    """import snlab must not pull in the heavy stack (sympy is loaded on first formula use)."""
    code = "import sys, snlab; print(sorted(m for m in ('pandas','altair','ipywidgets','sympy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_search_reports_each_plan_s_time_to_train_its_tokens():
    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch", "64",
            "--top", "2", "--tokens", "1e12"]
    plans = json.loads(run(*args, "--json").stdout)
    for plan in plans:
        assert plan["time_to_train_s"] == pytest.approx(1e12 / plan["tokens_per_s"])
        assert plan["energy_to_train_j"] == pytest.approx(1e12 * plan["energy_per_token_j"])
    out = run(*args).stdout
    assert "time, 1e+12 tokens" in out and " days " in out
    assert "time_to_train_s" not in json.loads(run(*args[:-2], "--json").stdout)[0]


def test_a_name_given_to_list_points_to_show():
    proc = run("presets", "list", "dgx-h100", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("snlab: error: name: ") and "snlab presets show dgx-h100" in proc.stderr
