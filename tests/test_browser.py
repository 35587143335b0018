"""End to end in a real browser: JupyterLab + headless Chromium (Playwright) run notebook 06, move the
K slider with the keyboard, and read the simulator's plotly figure back from the page (``gd.data``);
and JupyterLab started with the README's command shows no "official Jupyter news" pop-up (while the
same JupyterLab without the course's settings folder does: the check is not vacuous).

Needs the Debian ``chromium`` package (/usr/bin/chromium, or $SPECDEC_CHROMIUM), Python ``playwright`` and
``jupyterlab``; skipped with the reason when one is missing.  The screenshot's path is printed
(run with ``-s`` to see it) and kept under pytest's tmp_path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "06_latency_simulator.ipynb"
LAB_SETTINGS = REPO / "jupyterlab-settings"  # the README: jupyter lab --LabApp.app_settings_dir=jupyterlab-settings notebooks/
NEWS = "official Jupyter news"  # JupyterLab's consent toast: "Would you like to get notified about official Jupyter news?"
CHROMIUM = os.environ.get("SPECDEC_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BUDGET_S = 300  # generous upper bound for a loaded machine; the run's time is printed

SPEEDUP_FIG = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && g.layout.title && g.layout.title.text === 'speedup vs K');
  return gd ? {k: gd.data[2].x[0], s: gd.data[2].y[0], n: gd.data[0].x.length} : null;
}"""
DONE = """() => {
  const ps = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
  return ps.length > 0 && ps.every(t => /^\\[\\d+\\]:$/.test(t));
}"""


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set SPECDEC_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python playwright is not installed"
    if shutil.which("jupyter-lab", path=os.path.dirname(sys.executable)) is None and shutil.which("jupyter-lab") is None:
        return "jupyterlab is not installed"
    return None


def _kernel_ready(page) -> bool:
    """Accept a "Select Kernel" dialog if JupyterLab shows one; True once a kernel is attached and idle."""
    dialog = page.locator(".jp-Dialog .jp-mod-accept")
    if dialog.count():
        dialog.first.click()
        return False
    name = page.locator(".jp-KernelName")
    return bool(name.count() and "No Kernel" not in name.first.inner_text()
                and page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout: float, what: str, poll: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def _jupyter_lab(tmp_path, course_settings: bool):
    """A JupyterLab server on a free port, started as the README starts it (``course_settings``: with
    ``--LabApp.app_settings_dir`` pointing at the repository's settings folder) or without that flag."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)  # the browser may autosave: never touch the repo's copy
    port = _free_port()
    # render every cell (JupyterLab 4 otherwise detaches off-screen cells, and their figures, from the DOM)
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    env = dict(os.environ, CI="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"))
    log = open(tmp_path / "jupyter.log", "w")
    # the README's flag, relative to the repository root as there (the server runs in REPO, its files in root)
    flags = [f"--LabApp.app_settings_dir={LAB_SETTINGS.relative_to(REPO)}"] if course_settings else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--IdentityProvider.token=", "--ServerApp.password=", "--allow-root", f"--ServerApp.root_dir={root}", *flags],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2).status == 200
        except OSError:
            return False

    try:
        _wait(up, 60, "the JupyterLab server")
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def lab(tmp_path):
    with _jupyter_lab(tmp_path, course_settings=True) as server:
        yield server


@pytest.fixture
def lab_without_course_settings(tmp_path):
    with _jupyter_lab(tmp_path, course_settings=False) as server:
        yield server


def _news_popup_seen(url: str, tmp: Path, wait_s: float) -> bool:
    """Open JupyterLab's main page and report whether the news-consent toast shows within ``wait_s`` seconds
    after the application shell is up."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=CHROMIUM, headless=True,
                                                    args=FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.goto(f"{url}/lab")
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                if page.get_by_text(NEWS).count():
                    return True
                time.sleep(0.5)
            return False
        finally:
            ctx.close()


def test_readme_command_starts_lab_without_news_popup(lab):
    """`jupyter lab --LabApp.app_settings_dir=jupyterlab-settings notebooks/`: no news pop-up in 20 s."""
    url, tmp = lab
    assert (LAB_SETTINGS / "overrides.json").exists()
    assert not _news_popup_seen(url, tmp, wait_s=20), "JupyterLab asked about Jupyter news despite the course's settings"


def test_news_popup_appears_without_the_course_settings(lab_without_course_settings):
    """The control: the same JupyterLab without the settings folder does ask (so the check above can fail)."""
    url, tmp = lab_without_course_settings
    assert _news_popup_seen(url, tmp, wait_s=60), "the news pop-up never appeared: the check above would be vacuous"


def test_notebook_06_slider_updates_figure_in_browser(lab):
    from playwright.sync_api import sync_playwright

    url, tmp = lab
    t0 = time.monotonic()
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=CHROMIUM, headless=True,
                                                    args=FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.set_default_timeout(BUDGET_S * 1000)
            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            _wait(lambda: _kernel_ready(page), 120, "the notebook's kernel")
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator("li[data-command='runmenu:run-all']").click()
            _wait(lambda: page.evaluate(DONE), BUDGET_S, "all cells to finish")
            _wait(lambda: page.evaluate(SPEEDUP_FIG), 60, "the simulator's speedup figure")
            before = page.evaluate(SPEEDUP_FIG)
            assert before["k"] == 4 and before["n"] == 16, before

            slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="K (drafts)"))
            handle = slider.locator(".noUi-handle").first
            handle.scroll_into_view_if_needed()
            handle.focus()
            page.keyboard.press("ArrowRight")
            page.keyboard.press("ArrowRight")
            after = _wait(lambda: (lambda d: d if d and d["k"] == 6 else None)(page.evaluate(SPEEDUP_FIG)), 60,
                          "the figure to follow the slider to K = 6")
            # the same S(K) curve the Python model gives, read back from the browser's plotly state
            from specdec_lesson.sim import spec_timing

            want = spec_timing("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", k=6, alpha=0.8).speedup
            assert after["s"] == pytest.approx(want, rel=1e-9)
            shot = tmp / "notebook06.png"
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
        except Exception:
            page.screenshot(path=str(tmp / "failure.png"))
            print(f"\nbrowser test failed; screenshot {tmp / 'failure.png'}, server log {tmp / 'jupyter.log'}")
            raise
        finally:
            ctx.close()
    print(f"\nbrowser test: {time.monotonic() - t0:.1f} s; screenshot {shot}")
