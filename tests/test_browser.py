"""A real browser: JupyterLab, Voila and the static lessons, driven by Playwright with
Debian's Chromium, with no network beyond the local server.

* ``jupyter lab`` started the plain way (nothing set, HOME in a temporary folder, copies
  of the notebooks so that autosave cannot touch the repository): every lesson runs from
  the Run menu, every chart renders, no error and no pop-up appears, and on the central
  notebook the micro-batch slider redraws its chart;
* ``make lab`` on the repository (autosave off): the landing notebook runs and draws;
* Voila renders the central dashboard and its slider works;
* ``make site``'s pages (built here by ``notebooks/build_site.py``) show every chart.

The browser refuses every request that does not go to the local server, so a chart that
needs a CDN fails here. The system browser is ``/usr/bin/chromium`` (``make browser-deps``
installs it with apt); Playwright never downloads one. Without Chromium (or Playwright)
the tests are skipped, unless ``SNLAB_REQUIRE_BROWSER=1`` (set by ``make test``), which
turns that into a failure. Set ``SNLAB_SCREENSHOTS=/some/dir`` to keep the screenshots.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK = NOTEBOOKS / "04-cluster-vs-supernode.ipynb"
LESSONS = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
CHROMIUM = os.environ.get("SNLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
ERRORS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], .snlab-error"
#: JupyterLab's notifications (the news prompt is one) and dialogs
POPUPS = ".Toastify__toast, .jp-Dialog"


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
    # nothing of the caller's Jupyter or snlab settings: a plain start
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "XDG_", "SNLAB_"))}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    return env


def _no_autosave(env: dict) -> None:
    """JupyterLab user settings in the temporary HOME: documents are never saved."""
    path = Path(env["HOME"]) / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    path.mkdir(parents=True)
    (path / "plugin.jupyterlab-settings").write_text('{"autosave": false}')


#: the screens the lessons must work on: a laptop with the sidebar open, and a larger one
LAPTOP, DESKTOP = {"width": 1280, "height": 720}, {"width": 1366, "height": 1000}


@contextmanager
def _browser(tmp_path: Path, viewport: dict = DESKTOP):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=viewport)
        # no network: only the local server (and pages on disk) answer
        page.route("**/*", lambda route: route.continue_()
                   if route.request.url.startswith(("http://127.0.0.1", "file://", "data:", "blob:"))
                   else route.abort())
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


class DialogBlocked(Exception):
    """A JupyterLab dialog covers the page; its text is the message."""


def _no_dialog(page) -> None:
    texts = page.locator(".jp-Dialog").all_inner_texts()
    if texts:
        raise DialogBlocked(" | ".join(t.replace("\n", " ") for t in texts))


def _run_all_cells(page, attempts: int = 3) -> None:
    """Run > Run All Cells, as a user would; retried when the menu click did not start
    the run (the first prompt still empty), which happens on a loaded machine. A dialog
    over the page raises :class:`DialogBlocked` with its text."""
    first_prompt = page.locator(".jp-CodeCell .jp-InputPrompt").first
    for _ in range(attempts):
        _no_dialog(page)
        try:
            page.locator(".lm-MenuBar-item", has_text="Run").first.click(timeout=15_000)
        except Exception:
            _no_dialog(page)
            raise
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


def _wait_idle(page, timeout: float = 300_000) -> bool:
    """Until the kernel is idle and every code cell shows an execution count (True), or
    until the run is lost (False): the kernel idle, no cell queued or running, and cells
    left without a count, for five seconds. A run is lost when the kernel behind the page
    is replaced as the run starts (JupyterLab can start a second kernel for a notebook
    on a loaded machine and drop the first, with the cells queued on it); a cell that
    fails also stops the run, and its error output says so."""
    script = """() => {
        const busy = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='busy']");
        const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
        if (!prompts.length || busy) return false;
        if (prompts.every(p => /\\[\\d+\\]/.test(p.textContent))) return 'done';
        return prompts.some(p => /\\[\\*\\]/.test(p.textContent)) ? false : 'lost';
    }"""
    deadline = time.monotonic() + timeout / 1000
    while True:
        left = max(deadline - time.monotonic(), 1.0) * 1000
        if page.wait_for_function(script, timeout=left).json_value() == "done":
            return True
        page.wait_for_timeout(5_000)
        if page.evaluate(script) == "lost":
            return False


def _run_to_the_end(page, where: str, attempts: int = 3) -> None:
    """Run All Cells until every cell has run; a lost run (see :func:`_wait_idle`) is
    reported and started again, unless a cell's error output stopped it."""
    for attempt in range(1, attempts + 1):
        _run_all_cells(page)
        if _wait_idle(page):
            return
        errors = page.locator(ERRORS).all_inner_texts()
        assert not errors, (where, errors)
        warnings.warn(f"{where}: the run stopped with cells left unrun (run {attempt}); Run All again")
    raise AssertionError(f"{where}: {attempts} runs stopped with cells left unrun")


def _wait_charts(page, expected: int, timeout: float = 180_000) -> int:
    """Until at least ``expected`` charts are drawn and every chart on the page is drawn
    (an SVG or canvas inside its vega-embed); returns how many there are."""
    page.wait_for_function(
        """(expected) => {
            const charts = [...document.querySelectorAll('.vega-embed')];
            return charts.length >= expected && charts.every(c => c.querySelector('svg, canvas'));
        }""", arg=expected, timeout=timeout)
    return page.locator(".vega-embed").count()


def _check_clean(page, console: list[str], where: str) -> None:
    """No error output, no failed script, no pop-up."""
    assert page.locator(ERRORS).count() == 0, (where, page.locator(ERRORS).all_inner_texts())
    failed = [c for c in console if "Error loading script" in c or "pageerror" in c]
    assert not failed, (where, failed)
    assert page.locator(POPUPS).count() == 0, (where, page.locator(POPUPS).all_inner_texts())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The static lessons, built as ``make site`` builds them: {page name: charts drawn}."""
    _require_browser()
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import build_site
    finally:
        sys.path.remove(str(NOTEBOOKS))
    out = tmp_path_factory.mktemp("site")
    pages = build_site.build(LESSONS, out)
    charts = {page.stem: len(re.findall(r"""class=["']snlab-chart["']""", page.read_text(encoding="utf-8")))
              for page in pages}
    return out, charts


def _check_questions_come_first(page, name: str) -> None:
    """No output above a question holds its answer, and no readout is cut off."""
    from snlab import lessons
    keys = page.evaluate("""() => [...document.querySelectorAll('.snlab-quiz')].map(q =>
        [...q.classList].filter(c => c.startsWith('snlab-quiz-')).map(c => c.slice(11))[0] || '')""")
    for index, key in enumerate(keys):
        if not key:
            continue
        answer = lessons.question(key).answer
        above = page.evaluate("""(i) => { const q = document.querySelectorAll('.snlab-quiz')[i];
            const cell = q.closest('.jp-Cell'); let text = ''; let c = cell && cell.previousElementSibling;
            while (c) { const out = c.querySelector('.jp-OutputArea'); if (out) text += out.innerText;
                        c = c.previousElementSibling; }
            return text; }""", index)
        assert answer not in above, f"{name}: the answer of {key} ({answer!r}) shows above its question"
    clipped = page.evaluate("""() => [...document.querySelectorAll('.widget-readout, .widget-label')]
        .filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)""")
    assert not clipped, f"{name}: readouts cut off: {clipped}"


def test_static_lessons_show_every_chart_without_a_kernel_or_network(site, tmp_path):
    out, charts = site
    assert set(charts) == {p.stem for p in LESSONS}
    assert sum(charts.values()) >= 20 and all(charts[p] > 0 for p in charts if not p.startswith("08"))
    with _browser(tmp_path) as (page, console):
        page.goto((out / "index.html").as_uri())
        links = page.locator("a")
        assert links.count() == len(LESSONS)
        for name, expected in charts.items():
            page.goto((out / f"{name}.html").as_uri())
            drawn = page.locator(".snlab-chart svg")
            assert drawn.count() == expected, name
            for i in range(expected):
                box = drawn.nth(i).bounding_box()
                assert box and box["width"] > 100 and box["height"] > 50, (name, i, box)
            assert "Traceback" not in page.inner_text("body"), name
            # questions as questions, the answer behind a click; lessons link to their pages
            body = page.content()
            assert "snlab-quiz-static" in body and "None</pre>" not in body, name
            assert not page.locator("a[href$='.ipynb']").count(), name
        _screenshot(page, tmp_path, "site-last.png")
        assert not [c for c in console if "pageerror" in c], console


def test_plain_jupyterlab_runs_every_lesson_and_draws_every_chart(site, tmp_path):
    """``jupyter lab`` with nothing set and no network: every lesson runs, every chart
    draws (as many as the static build drew), nothing pops up; on the central lesson a
    slider redraws its chart."""
    _, charts = site
    work = tmp_path / "work"
    shutil.copytree(NOTEBOOKS, work / "notebooks", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    port, token = _free_port(), "snlab-test-token"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={work}",
           "--allow-root"]
    base = f"http://127.0.0.1:{port}"
    with _server(cmd, f"{base}/api/status?token={token}", _env(tmp_path), tmp_path / "lab.log"), \
            _browser(tmp_path, LAPTOP) as (page, console):
        for lesson in LESSONS:
            # a dialog that blocks a lesson once (a loaded machine can lose the server's
            # connection for a moment) is reported and the lesson reopened; twice fails
            for attempt in (1, 2):
                page.goto(f"{base}/lab/tree/notebooks/{lesson.name}?token={token}&reset")
                try:
                    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
                    _run_to_the_end(page, lesson.name)
                    drawn = _wait_charts(page, charts[lesson.stem])
                    if lesson == NOTEBOOK:
                        dashboard = page.locator(".snlab-dashboard").first
                        dashboard.scroll_into_view_if_needed()
                        _move_slider_and_check_redraw(page, dashboard)
                    break
                except DialogBlocked as blocked:
                    if attempt == 2:
                        raise AssertionError(f"{lesson.name}: a dialog blocked the lesson twice: {blocked}")
                    warnings.warn(f"{lesson.name}: a dialog blocked Run All, lesson reopened: {blocked}")
                finally:
                    _screenshot(page, tmp_path, f"jupyterlab-{lesson.stem}-{attempt}.png")
            assert drawn >= charts[lesson.stem], lesson.name
            _check_clean(page, console, lesson.name)
            _check_questions_come_first(page, lesson.name)


def test_a_blocking_dialog_is_named(tmp_path):
    _require_browser()
    with _browser(tmp_path) as (page, _):
        page.set_content("<div class='jp-Dialog'>Server Connection Error<br>Check your network</div>")
        with pytest.raises(DialogBlocked, match="Server Connection Error"):
            _no_dialog(page)
        page.set_content("<div>no dialog</div>")
        _no_dialog(page)


def _notebook(status: str, *prompts: str) -> str:
    cells = "".join(f"<div class='jp-CodeCell'><div class='jp-InputPrompt'>{p}</div></div>" for p in prompts)
    return f"<div class='jp-Notebook-ExecutionIndicator' data-status='{status}'></div>{cells}"


def test_a_lost_run_is_told_from_a_finished_one(tmp_path):
    """Every cell counted: done; cells left unrun with none queued and the kernel idle: lost."""
    _require_browser()
    with _browser(tmp_path) as (page, _):
        page.set_content(_notebook("idle", "[1]:", "[2]:"))
        assert _wait_idle(page, timeout=10_000)
        page.set_content(_notebook("idle", "[ ]:", "[ ]:"))
        assert not _wait_idle(page, timeout=30_000)
        # still queued: neither, until the last cell has run
        page.set_content(_notebook("busy", "[1]:", "[*]:"))
        page.evaluate("""() => setTimeout(() => {
            document.querySelectorAll('.jp-InputPrompt')[1].textContent = '[2]:';
            document.querySelector('.jp-Notebook-ExecutionIndicator').dataset.status = 'idle';
        }, 2000)""")
        assert _wait_idle(page, timeout=30_000)


def test_make_lab_opens_the_landing_lesson_without_popups(tmp_path):
    """The README's command: ``make lab`` prints the landing lesson's URL, and the lesson
    runs and draws in a browser with no network. Autosave is off, and the repository's
    notebook is unchanged afterwards."""
    _require_browser()
    landing = NOTEBOOKS / "00-start-here.ipynb"
    before = landing.read_bytes()
    port, token = _free_port(), "snlab-make-lab"
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("MAKE")}
    _no_autosave(env)
    cmd = ["make", "-C", str(ROOT), "lab", "OPEN_BROWSER=no", "IP=127.0.0.1", f"PORT={port}",
           f"LAB_ARGS=--ServerApp.token={token} --ServerApp.port_retries=0"]
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "make-lab.log"
    try:
        with _server(cmd, f"{base}/api/status?token={token}", env, log, timeout=600), \
                _browser(tmp_path) as (page, console):
            assert f"/lab/tree/notebooks/{landing.name}" in log.read_text()
            page.goto(f"{base}/?token={token}")          # the server's landing page is the lesson
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            assert page.url.split("?")[0].endswith(f"/lab/tree/notebooks/{landing.name}")
            assert landing.name in page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current").inner_text()
            _run_to_the_end(page, landing.name)
            try:
                assert _wait_charts(page, 1) >= 1
            finally:
                _screenshot(page, tmp_path, "make-lab-00.png")
            _check_clean(page, console, landing.name)
    finally:
        assert landing.read_bytes() == before


DASHBOARD = NOTEBOOKS / "dashboard.ipynb"


def test_voila_renders_the_central_dashboard(tmp_path):
    """Voila serves the dashboard alone (notebooks/dashboard.ipynb, the README's link):
    its title and controls, no lesson text, no code."""
    _require_browser()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(DASHBOARD, work / DASHBOARD.name)
    port = _free_port()
    cmd = [sys.executable, "-m", "voila", str(work / DASHBOARD.name), "--no-browser", f"--port={port}",
           "--Voila.ip=127.0.0.1", "--Voila.root_dir=" + str(work)]
    base = f"http://127.0.0.1:{port}"
    # readiness: a static file (a GET of "/" would run the whole notebook in a kernel of its own)
    ready = f"{base}/voila/static/voila.js"
    with _server(cmd, ready, _env(tmp_path), tmp_path / "voila.log"), _browser(tmp_path) as (page, console):
        page.goto(f"{base}/", timeout=180_000)
        dashboard = page.locator(".snlab-dashboard").first
        dashboard.wait_for(timeout=180_000)
        dashboard.scroll_into_view_if_needed()
        try:
            _wait_charts(page, 2)                 # where the step goes, and MFU
            _move_slider_and_check_redraw(page, dashboard)
        finally:
            _screenshot(page, tmp_path, "voila-04.png")
        assert page.locator(ERRORS).count() == 0, page.locator(ERRORS).all_inner_texts()
        assert "There was an error when executing cell" not in page.content()
        assert not [c for c in console if "Error loading script" in c], console
        # the dashboard alone: no lesson's predict-then-check, no formula, no code
        assert page.locator(".snlab-quiz").count() == 0 and "Predict" not in page.inner_text("body")
        assert "widgets.training_dashboard" not in page.inner_text("body")
