"""A real browser: JupyterLab and Voila driven by Playwright with Debian's Chromium.

The test starts JupyterLab on localhost (a token, HOME in a temporary folder, a copy of
the central notebook so that autosave cannot touch the repository), runs every cell from
the Run menu, moves the dashboard's micro-batch slider with the keyboard, and checks that
the chart was redrawn and that no error appeared. A second test renders the same
notebook in Voila. Both use the system browser at ``/usr/bin/chromium`` (``make
browser-deps`` installs it with apt); Playwright never downloads one.

Without Chromium (or the ``browser`` extra) the tests are skipped, unless
``SNLAB_REQUIRE_BROWSER=1`` (set by ``make test``), which turns that into a failure.
Set ``SNLAB_SCREENSHOTS=/some/dir`` to keep the screenshots.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "04-cluster-vs-supernode.ipynb"
CHROMIUM = os.environ.get("SNLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
ERRORS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], .snlab-error"


def _require_browser():
    missing = None
    if not os.path.exists(CHROMIUM):
        missing = f"{CHROMIUM} not found (make browser-deps installs Debian's chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is missing (the 'browser' extra)"
    if missing:
        if os.environ.get("SNLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(missing)
        pytest.skip(missing)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _server(cmd: list[str], url: str, env: dict, log: Path, timeout: float = 120):
    """Start a server in its own process group, wait until ``url`` answers, stop it by PID."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"server did not answer {url} in {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        # the server's process group: the server and the kernels it started, nothing else
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def _env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "XDG_"))}
    env.update(HOME=str(home), SNLAB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


@contextmanager
def _browser(tmp_path: Path):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        console = []
        page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: console.append(f"pageerror: {err}"))
        try:
            yield page, console
        finally:
            browser.close()


def _screenshot(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=False)
    keep = os.environ.get("SNLAB_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)


def _move_slider_and_check_redraw(page, dashboard) -> None:
    chart = dashboard.locator(".vega-embed").first
    chart.locator("svg").first.wait_for(timeout=60_000)
    before = chart.inner_html()
    readout = dashboard.locator(".snlab-micro-batch .widget-readout")
    assert readout.inner_text().strip() == "1"
    handle = dashboard.locator(".snlab-micro-batch .noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function("el => el.textContent.trim() === '2'", arg=readout.element_handle(), timeout=30_000)
    # the kernel recomputes both systems' plans and sends the new spec back
    page.wait_for_function("([el, before]) => el.innerHTML !== before", arg=[chart.element_handle(), before],
                           timeout=120_000)
    assert dashboard.locator(".snlab-error").count() == 0


def _run_all_cells(page, attempts: int = 3) -> None:
    """Run > Run All Cells, as a user would; retried when the menu click did not start
    the run (the first prompt still empty), which happens on a loaded machine."""
    first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    for _ in range(attempts):
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        item = page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first
        item.wait_for(state="visible", timeout=10_000)
        item.click()
        try:
            page.wait_for_function("el => /\\[(\\*|\\d+)\\]/.test(el.textContent)",
                                   arg=first_prompt.element_handle(), timeout=20_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells did not start the notebook")


def test_jupyterlab_runs_the_central_notebook_and_a_slider_redraws_its_chart(tmp_path):
    _require_browser()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port, token = _free_port(), "snlab-test-token"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={work}",
           "--allow-root", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    base = f"http://127.0.0.1:{port}"
    with _server(cmd, f"{base}/api/status?token={token}", _env(tmp_path), tmp_path / "lab.log"), \
            _browser(tmp_path) as (page, console):
        page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}&reset")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        _run_all_cells(page)
        dashboard = page.locator(".snlab-dashboard").first
        dashboard.wait_for(timeout=180_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180_000)
        dashboard.scroll_into_view_if_needed()
        try:
            _move_slider_and_check_redraw(page, dashboard)
        finally:
            _screenshot(page, tmp_path, "jupyterlab-04.png")
        # every code cell ran, and none printed an error or a warning
        cells = page.locator(".jp-CodeCell .jp-InputPrompt")
        assert cells.count() > 5
        assert page.locator(".jp-CodeCell .jp-InputPrompt", has_text="[*]").count() == 0
        assert page.locator(ERRORS).count() == 0, page.locator(ERRORS).all_inner_texts()
        assert page.locator(".vega-embed").count() >= 6
        assert not [c for c in console if "Error loading script" in c or "pageerror" in c], console


def test_voila_renders_the_central_dashboard(tmp_path):
    _require_browser()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port = _free_port()
    cmd = [sys.executable, "-m", "voila", str(work / NOTEBOOK.name), "--no-browser", f"--port={port}",
           "--Voila.ip=127.0.0.1", "--Voila.root_dir=" + str(work)]
    base = f"http://127.0.0.1:{port}"
    # readiness: a static file (a GET of "/" would run the whole notebook in a kernel of its own)
    ready = f"{base}/voila/static/voila.js"
    with _server(cmd, ready, _env(tmp_path), tmp_path / "voila.log"), _browser(tmp_path) as (page, console):
        page.goto(f"{base}/", timeout=180_000)
        dashboard = page.locator(".snlab-dashboard").first
        dashboard.wait_for(timeout=180_000)
        # Voila streams cells as they run: let the notebook finish before moving a control
        page.locator(".snlab-quiz").first.wait_for(timeout=180_000)
        dashboard.scroll_into_view_if_needed()
        try:
            _move_slider_and_check_redraw(page, dashboard)
        finally:
            _screenshot(page, tmp_path, "voila-04.png")
        assert page.locator(ERRORS).count() == 0, page.locator(ERRORS).all_inner_texts()
        assert "There was an error when executing cell" not in page.content()
