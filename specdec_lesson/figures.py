"""Figures a reader sees with or without a kernel: the interactive plotly chart and a static PNG of it.

A committed notebook viewed on a repository page, or exported to HTML offline, shows no plotly chart
(that needs plotly.js and, for a widget, a running kernel).  :func:`show` therefore displays ONE output
with two representations of the same figure: plotly's JSON (what JupyterLab renders, interactive) and a
PNG rendered offline (what a static viewer renders).  The PNG comes from kaleido (v1), which drives a
local Chromium: Debian's ``chromium`` (``apt-get install chromium``), or the browser named by
``$SPECDEC_CHROMIUM`` / ``$BROWSER_PATH``; nothing is downloaded.  Without kaleido or a browser the
chart is still shown and one line says why there is no static image.  ``SPECDEC_STATIC_FIGURES=0``
turns the PNG off.

Usage, as the last line of a figure cell::

    from specdec_lesson.figures import show
    show(fig)                      # instead of ending the cell with `fig`
"""

from __future__ import annotations

import atexit
import base64
import os

__all__ = ["PNG_SIZE", "render_png", "show", "show_static", "static_renderer"]

PNG_SIZE = (700, 400)  # default width, height in pixels: small files, readable text

_state: dict = {"server": None, "reason": None}  # server: None (not tried), True (running), False (unavailable)


def static_renderer() -> str | None:
    """``None`` when PNGs can be rendered here, else the reason (one short sentence)."""
    if os.environ.get("SPECDEC_STATIC_FIGURES", "1") == "0":
        return "static figures are turned off (SPECDEC_STATIC_FIGURES=0)"
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install kaleido)"
    if os.environ.get("SPECDEC_CHROMIUM"):
        os.environ.setdefault("BROWSER_PATH", os.environ["SPECDEC_CHROMIUM"])
    try:
        from choreographer.browsers.chromium import Chromium

        path = os.environ.get("BROWSER_PATH") or Chromium.find_browser(skip_local=False)
    except Exception as exc:  # noqa: BLE001 - any failure means "no browser"
        return f"no Chromium found for kaleido ({type(exc).__name__})"
    if not path or not os.path.isfile(path):
        return "no Chromium found for kaleido (apt-get install chromium, or set SPECDEC_CHROMIUM)"
    return None


def _start() -> bool:
    if _state["server"] is None:
        _state["reason"] = static_renderer()
        if _state["reason"] is None:
            try:
                import kaleido

                # one browser for the whole kernel (about 3 s to start, then ~0.3 s per image); no MathJax:
                # its default is a CDN, and the course's figures need none
                kaleido.start_sync_server(n=1, timeout=60, mathjax=False, silence_warnings=True)
                atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            except Exception as exc:  # noqa: BLE001
                _state["reason"] = f"kaleido could not start Chromium ({type(exc).__name__}: {exc})"
        _state["server"] = _state["reason"] is None
    return bool(_state["server"])


def _size(fig, width: int | None, height: int | None) -> tuple[int, int]:
    w = width or fig.layout.width or PNG_SIZE[0]
    h = height or fig.layout.height or PNG_SIZE[1]
    return int(w), int(h)


def render_png(fig, width: int | None = None, height: int | None = None) -> bytes | None:
    """PNG bytes of a plotly figure (``width`` x ``height``, default the figure's own size or
    :data:`PNG_SIZE`), or ``None`` when no renderer is available (:func:`static_renderer` says why)."""
    if not _start():
        return None
    import kaleido
    import plotly.graph_objects as go

    fig = go.Figure(fig)  # a FigureWidget too
    w, h = _size(fig, width, height)
    try:
        return kaleido.calc_fig_sync(fig.to_dict(), opts={"format": "png", "width": w, "height": h, "scale": 1})
    except Exception as exc:  # noqa: BLE001 - a failed render must not fail the lesson
        _state["reason"] = f"kaleido failed to render ({type(exc).__name__}: {exc})"
        return None


def show(fig, width: int | None = None, height: int | None = None) -> None:
    """Display ``fig`` as one output carrying plotly's JSON (interactive in JupyterLab) and a PNG
    (seen where there is no plotly.js: a repository page, an offline HTML export).  Without a
    renderer the chart alone is shown, with one line saying why."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from IPython.display import display

    fig = go.Figure(fig)
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    png = render_png(fig, width, height)
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode("ascii")
    display(bundle, raw=True)
    if png is None:
        print(f"(no static image of this figure: {_state['reason'] or static_renderer()})")


def show_static(fig, caption: str, width: int | None = None, height: int | None = None) -> None:
    """Display only a PNG of ``fig`` with a one-line ``caption`` (e.g. the default state of a widget shown
    live just above it: a widget's own output is empty without a kernel, and an HTML export picks the widget
    over any image in the same output, so the picture must be an output of its own)."""
    from IPython.display import display

    png = render_png(fig, width, height)
    if png is None:
        print(f"(no static image: {_state['reason'] or static_renderer()})")
        return
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"<image: {caption}>"}, raw=True)
    print(caption)
