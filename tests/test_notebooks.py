"""Course conventions: every notebook is executed by the test command, committed executed,
seeded in its first cell, without widget state, and with small outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


def test_test_command_runs_every_notebook():
    """`pytest` (the README's test command) collects every notebook under nbval."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "notebooks" in cfg["testpaths"] and "--nbval-lax" in cfg["addopts"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "notebooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout
    collected = {line.split("::")[0] for line in out.splitlines() if "::" in line}
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.name}" in collected, f"{nb.name} is not collected by the test command"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(nb_path: Path):
    nb = json.loads(nb_path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "no code cells"
    first = "".join(code[0]["source"])
    assert 'FAST = "CI" in os.environ' in first and "setup(" in first, "first code cell must seed via setup() and set FAST"
    assert all(c.get("execution_count") for c in code if "".join(c["source"]).strip()), "commit the notebook executed"
    assert "widgets" not in nb.get("metadata", {}), "widget state must not be committed"
    assert nb_path.stat().st_size < 2_000_000, "outputs too large: keep committed notebooks small"


PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_figures_carry_a_static_image(nb_path: Path):
    """A reader without a kernel (a repository page, an offline HTML export) sees no plotly chart and no
    widget: every committed plotly output also carries a PNG (``specdec_lesson.figures.show``), and a cell
    that displays a widget also displays a PNG of its state (``figures.show_static``)."""
    nb = json.loads(nb_path.read_text())
    for i, cell in enumerate(nb["cells"]):
        outputs = [o for o in cell.get("outputs", []) if "data" in o]
        for out in outputs:
            if PLOTLY in out["data"]:
                assert "image/png" in out["data"], f"cell {i} ({cell.get('id')}): a plotly output without a PNG"
        if "build_simulator(" in "".join(cell["source"]) and any(WIDGET in o["data"] for o in outputs):
            assert any("image/png" in o["data"] for o in outputs), f"cell {i}: the simulator widget without a static image"


def test_show_without_renderer_says_so_in_one_line(monkeypatch, capsys):
    """No renderer: the chart is still displayed (plotly JSON), and one printed line says why there is no PNG."""
    pytest.importorskip("plotly")
    import plotly.graph_objects as go

    from specdec_lesson import figures

    shown = []
    monkeypatch.setenv("SPECDEC_STATIC_FIGURES", "0")
    monkeypatch.setattr(figures, "_state", {"server": None, "reason": None})
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    figures.show(go.Figure(go.Bar(y=[1, 2])))
    assert len(shown) == 1 and PLOTLY in shown[0] and "image/png" not in shown[0]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "no static image" in lines[0] and "SPECDEC_STATIC_FIGURES" in lines[0]


def test_show_renders_a_png_when_a_renderer_is_there(monkeypatch):
    """With kaleido and a Chromium: one output with both the plotly JSON and a PNG of the requested size."""
    pytest.importorskip("plotly")
    import base64
    import struct

    import plotly.graph_objects as go

    from specdec_lesson import figures

    reason = figures.static_renderer()
    if reason:
        pytest.skip(reason)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    figures.show(go.Figure(go.Scatter(y=[3, 1, 2])), width=320, height=200)
    png = base64.b64decode(shown[0]["image/png"])
    assert PLOTLY in shown[0] and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (320, 200)


def test_simulator_static_figure_is_its_current_state():
    """The PNG notebook 06 commits is drawn from the widget's own figures: same S(K) curve, same bars, the
    summary line as title, the stacked breakdown redrawn with explicit bases (one barmode for all panels)."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from specdec_lesson.sim.widget import build_simulator

    sim = build_simulator(k=5, alpha=0.7)
    fig = sim.static_figure()
    assert list(fig.data[0].y) == list(sim.fig_speedup.data[0].y) and fig.data[2].x == (5,)
    bars = [t for t in fig.data if t.type == "bar" and t.xaxis == "x3"]  # row 2, column 1: the time breakdown
    assert [list(t.x) for t in bars] == [list(t.x) for t in sim.fig_breakdown.data]
    assert list(bars[2].base) == [a + b for a, b in zip(bars[1].base, bars[1].x)]
    assert "speedup at K=5" in fig.layout.title.text and "<b>" in fig.layout.title.text
    assert fig.layout.barmode == "overlay" and len(fig.layout.annotations) == 4  # the four panel titles
