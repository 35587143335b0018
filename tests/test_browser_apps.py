"""An app of the course in a real browser: JupyterLab + headless Chromium (Playwright) run notebook 01's S(K)
explorer cell (with the notebook's setup cell, copied into a scratch notebook), press ArrowLeft twice on the alpha
slider, and read the plotly figures back from the page (``gd.data``): the S(K) curve must become the one
:func:`specdec_lesson.theory.speedup` gives at the new alpha.

Same requirements and helpers as ``test_browser.py`` (Chromium at /usr/bin/chromium or $SPECDEC_CHROMIUM, Python
``playwright``, ``jupyterlab``; skipped with the reason when one is missing).  The screenshot's path is printed
(run with ``-s``) and kept under pytest's tmp_path.
"""

from __future__ import annotations

import json
import time

import pytest
from test_browser import BUDGET_S, CHROMIUM, DONE, FLAGS, REPO, _jupyter_lab, _kernel_ready, _wait

from specdec_lesson import theory

SOURCE = REPO / "notebooks" / "01_rejection_sampling.ipynb"
APP_CELL = "app-01-speedup"  # the cell id of the S(K) explorer in notebook 01
SCRATCH = "01_speedup_app.ipynb"

FIGURES = """() => {
  const find = t => [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout && g.layout.title && g.layout.title.text === t);
  const sk = find('speedup S(K)'), al = find('best speedup against alpha (c fixed)');
  if (!sk || !al || !sk.data[0].y) return null;
  const rect = (al.layout.shapes || []).find(s => s.type === 'rect');
  return {curve: Array.from(sk.data[0].y), k: sk.data[2].x[0], best: sk.data[1].x[0], alpha: al.data[1].x[0],
          shaded_to: rect ? rect.x1 : null};
}"""


def _scratch_notebook() -> dict:
    """Notebook 01's first code cell (the seeded setup) and its S(K) explorer cell, outputs cleared."""
    nb = json.loads(SOURCE.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    cells = [code[0], next(c for c in code if c.get("id") == APP_CELL)]
    for c in cells:
        c["outputs"], c["execution_count"] = [], None
    return {**nb, "cells": cells}


@pytest.fixture
def lab(tmp_path):
    with _jupyter_lab(tmp_path, course_settings=True) as server:
        yield server


def _curve(alpha: float) -> list[float]:
    return [theory.speedup(alpha, k, 0.1) for k in range(1, 13)]


def test_notebook_01_speedup_slider_updates_figure_in_browser(lab):
    from playwright.sync_api import sync_playwright

    url, tmp = lab
    (tmp / "root" / SCRATCH).write_text(json.dumps(_scratch_notebook()))
    t0, shot = time.monotonic(), tmp / "notebook01_speedup.png"
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=CHROMIUM, headless=True,
                                                    args=FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.set_default_timeout(BUDGET_S * 1000)
            page.goto(f"{url}/lab/tree/{SCRATCH}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            _wait(lambda: _kernel_ready(page), 120, "the notebook's kernel")
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator("li[data-command='runmenu:run-all']").click()
            _wait(lambda: page.evaluate(DONE), BUDGET_S, "all cells to finish")
            page.locator(".jp-OutputArea-output .widget-vbox").first.scroll_into_view_if_needed()  # plotly draws when seen
            before = _wait(lambda: page.evaluate(FIGURES), 120, "the explorer's two figures")
            assert before["k"] == 4 and before["alpha"] == pytest.approx(0.8) and before["best"] == 6, before
            assert before["curve"] == pytest.approx(_curve(0.8), rel=1e-12)
            assert before["shaded_to"] == pytest.approx(0.1)  # alpha <= c shaded

            slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="alpha (acceptance)"))
            handle = slider.locator(".noUi-handle").first
            handle.scroll_into_view_if_needed()
            handle.focus()
            page.keyboard.press("ArrowLeft")
            page.keyboard.press("ArrowLeft")
            after = _wait(lambda: (lambda d: d if d and d["alpha"] == pytest.approx(0.78) else None)(page.evaluate(FIGURES)),
                          60, "the figures to follow the alpha slider to 0.78")
            # the S(K) curve the library computes at the new alpha, read back from the browser's plotly state
            assert after["curve"] == pytest.approx(_curve(after["alpha"]), rel=1e-12)
            assert after["curve"] != pytest.approx(before["curve"])
            assert after["best"] == theory.best_k(after["alpha"], 0.1, k_max=12)
            slider.scroll_into_view_if_needed()
            page.mouse.wheel(0, 150)
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
        except Exception:
            page.screenshot(path=str(tmp / "failure.png"))
            print(f"\nbrowser test failed; screenshot {tmp / 'failure.png'}, server log {tmp / 'jupyter.log'}")
            raise
        finally:
            ctx.close()
    print(f"\nbrowser test: {time.monotonic() - t0:.1f} s; screenshot {shot}")


APP02 = """# the notebook-02 app on the default pair, 16 new tokens (as a learner runs it)
from specdec_lesson.drafters.pair import load_default_pair
from specdec_lesson.lab.app import build_app

fast = load_default_pair(verbose=False)
lab = build_app(fast.target, fast.tokenizer, fast.draft, max_new_tokens=16)
lab
"""
PROMPT02 = "Write a Python function that returns the squares of a list of numbers."
TRACE = """() => {
  const spans = [...document.querySelectorAll('.jp-OutputArea-output span[data-kind]')];
  const kinds = {};
  spans.forEach(s => { kinds[s.dataset.kind] = (kinds[s.dataset.kind] || 0) + 1; });
  const speed = [...document.querySelectorAll('.jp-OutputArea-output .widget-html')].map(e => e.innerText).join(' ');
  const box = document.querySelector('.jp-OutputArea-output textarea');
  return spans.length ? {kinds, speed, prompt: box ? box.value : null,
                         colours: [...new Set(spans.map(s => getComputedStyle(s).backgroundColor))]} : null;
}"""


def test_notebook_02_app_decodes_a_typed_prompt_in_browser(lab):
    """Type a prompt into notebook 02's app, press Run: the coloured trace (accepted drafts green, the target's tokens
    blue) and the plain-against-speculative tokens/s appear in the page."""
    from playwright.sync_api import sync_playwright

    url, tmp = lab
    nb = json.loads(SOURCE.read_text())
    setup = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cells = [{**setup, "outputs": [], "execution_count": None},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": APP02}]
    (tmp / "root" / "02_app.ipynb").write_text(json.dumps({**nb, "cells": cells}))
    t0, shot = time.monotonic(), tmp / "notebook02_app.png"
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=CHROMIUM, headless=True,
                                                    args=FLAGS, viewport={"width": 1400, "height": 1100})
        try:
            page = ctx.new_page()
            page.set_default_timeout(BUDGET_S * 1000)
            page.goto(f"{url}/lab/tree/02_app.ipynb")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            _wait(lambda: _kernel_ready(page), 120, "the notebook's kernel")
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator("li[data-command='runmenu:run-all']").click()
            _wait(lambda: page.evaluate(DONE), BUDGET_S, "all cells to finish")
            box = page.locator(".jp-OutputArea-output textarea").first
            box.scroll_into_view_if_needed()
            box.fill(PROMPT02)  # the learner types their own prompt
            page.locator(".jp-OutputArea-output button", has_text="Run").first.click()
            got = _wait(lambda: (lambda d: d if d and "speedup" in d["speed"] else None)(page.evaluate(TRACE)),
                        BUDGET_S, "the trace and the speed panel")
            assert got["prompt"] == PROMPT02
            assert got["kinds"].get("target", 0) >= 1 and got["kinds"].get("accepted", 0) >= 1, got["kinds"]
            assert "rgb(201, 242, 201)" in got["colours"] and "rgb(207, 224, 252)" in got["colours"]  # green, blue
            assert "tokens/s" in got["speed"] and "plain decoding" in got["speed"]
            assert "steps: " in got["speed"], got["speed"]  # the status line: what the adaptive default did
            page.locator(".jp-OutputArea-output span[data-kind]").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
        except Exception:
            page.screenshot(path=str(tmp / "failure.png"))
            print(f"\nbrowser test failed; screenshot {tmp / 'failure.png'}, server log {tmp / 'jupyter.log'}")
            raise
        finally:
            ctx.close()
    print(f"\nbrowser test (notebook 02 app): {time.monotonic() - t0:.1f} s; screenshot {shot}")
