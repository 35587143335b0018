"""What the course's interactive apps share: sliders and drop-downs in one style, plotly FigureWidgets that keep
the learner's zoom, and :class:`App`, the base that wires every control to ``update`` and turns the current state
into one static figure (for readers without a kernel, :func:`specdec_lesson.figures.show_static`).

ipywidgets and plotly (the course extra) are imported when an app is built, not when this module is imported: the
pure functions next to each app (``roofline_view``, ``speedup_view``, ...) work without them.
"""

from __future__ import annotations

import re

__all__ = ["App", "MARGIN", "ui_modules", "int_slider", "float_slider", "dropdown", "figure_widget", "plain_summary"]

STYLE = {"description_width": "150px"}
WIDTH = "430px"
MARGIN = {"l": 60, "r": 20, "t": 50, "b": 100}
FIG_WIDTH = 450  # two side by side fit a notebook next to JupyterLab's file browser
LEGEND = {"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0}  # below the plot: the width stays the plot's


def ui_modules():
    """``(ipywidgets, plotly.graph_objects)``, or one ImportError saying how to install them."""
    try:
        import ipywidgets
        import plotly.graph_objects as go
    except ImportError as exc:
        raise ImportError(f"the interactive apps need ipywidgets and plotly, the course extra: "
                          f"pip install -e '.[course]' ({exc})") from None
    return ipywidgets, go


def int_slider(description: str, value: int, lo: int, hi: int, step: int = 1):
    widgets, _ = ui_modules()
    return widgets.IntSlider(description=description, value=value, min=lo, max=hi, step=step, style=STYLE,
                             layout=widgets.Layout(width=WIDTH), continuous_update=False)


def float_slider(description: str, value: float, lo: float, hi: float, step: float = 0.01, fmt: str = ".2f"):
    widgets, _ = ui_modules()
    return widgets.FloatSlider(description=description, value=value, min=lo, max=hi, step=step, style=STYLE,
                               layout=widgets.Layout(width=WIDTH), continuous_update=False, readout_format=fmt)


def dropdown(description: str, options, value):
    widgets, _ = ui_modules()
    options = list(options)
    if value not in options:
        raise ValueError(f"{description}: {value!r} is not one of the choices {options}")
    return widgets.Dropdown(description=description, options=options, value=value, style=STYLE,
                            layout=widgets.Layout(width=WIDTH))


def figure_widget(traces, title: str, *, xaxis: dict | None = None, yaxis: dict | None = None, height: int = 400,
                  width: int = FIG_WIDTH, **layout):
    """A FigureWidget with ``traces`` (plotly trace objects or dicts), its title and axes, the legend below the plot;
    ``uirevision`` keeps the learner's zoom across updates."""
    _, go = ui_modules()
    fig = go.FigureWidget(data=traces, layout={"title": {"text": title}, "xaxis": xaxis or {}, "yaxis": yaxis or {},
                                               "height": height, "width": width, "margin": MARGIN, "legend": LEGEND,
                                               **layout})
    fig.layout.uirevision = "keep"
    return fig


def plain_summary(html: str) -> str:
    """The summary's HTML as a plotly title: line breaks and bold kept, other tags dropped, entities decoded."""
    text = re.sub(r"<(?!br>|/?b>)[^>]*>", "", html)
    return text.replace("&gt;", ">").replace("&lt;", "<").replace("&le;", "<=").replace("&amp;", "&")


class App:
    """Base of an app: a subclass sets ``controls`` (widgets), ``figures`` (FigureWidgets) and ``summary`` (an
    HTML widget) and defines ``update()``; :meth:`_finish` wires each control to ``update``, lays the box out as
    ``ui`` and draws the first state.  ``message`` holds the last input problem (empty when the inputs are fine)."""

    controls: list
    figures: list
    summary = None
    message = ""

    def _finish(self, figure_rows: list[list] | None = None) -> None:
        widgets, _ = ui_modules()
        for control in self.controls:
            control.observe(self._on_change, names="value")
        rows = figure_rows or [self.figures[i:i + 2] for i in range(0, len(self.figures), 2)]
        self.ui = widgets.VBox([widgets.HBox([widgets.VBox(self.controls), self.summary]),
                                *[widgets.HBox(list(row)) for row in rows]])
        self._on_change()

    def _on_change(self, *_) -> None:
        try:
            self.message = ""
            self.update()
        except ValueError as exc:  # an impossible setting (e.g. every weight of a law at 0): say so, keep the figures
            self.message = str(exc)
            self.summary.value = f"<b style='color:#e45756'>{exc}</b>"

    def update(self) -> None:  # pragma: no cover - every app defines it
        raise NotImplementedError

    def static_figure(self, cols: int = 2):
        """The app's figures as one plain plotly figure (panels side by side, the summary as its title; bars are
        grouped, so an app that stacks bars gives them explicit bases and one ``offsetgroup``)."""
        from plotly.subplots import make_subplots

        n = len(self.figures)
        rows = (n + cols - 1) // cols
        titles = [f.layout.title.text or "" for f in self.figures]
        fig = make_subplots(rows=rows, cols=min(cols, n), subplot_titles=titles, horizontal_spacing=0.1,
                            vertical_spacing=0.22)
        drop = {"domain", "anchor", "overlaying", "position"}
        for i, src in enumerate(self.figures):
            row, col = i // cols + 1, i % cols + 1
            for trace in src.data:
                fig.add_trace(type(trace)(trace.to_plotly_json()), row=row, col=col)
            for shape in src.layout.shapes:
                fig.add_shape(shape.to_plotly_json(), row=row, col=col)
            fig.update_xaxes({k: v for k, v in src.layout.xaxis.to_plotly_json().items() if k not in drop}, row=row, col=col)
            fig.update_yaxes({k: v for k, v in src.layout.yaxis.to_plotly_json().items() if k not in drop}, row=row, col=col)
        fig.update_layout(height=380 * rows + 170, width=520 * min(cols, n), barmode="group",
                          margin={"l": 60, "r": 20, "t": 150, "b": 80}, legend={"orientation": "h", "y": -0.22},
                          title={"text": plain_summary(self.summary.value), "font": {"size": 12}, "x": 0.01, "y": 0.97,
                                 "yanchor": "top"})
        return fig

    def _ipython_display_(self) -> None:  # pragma: no cover - needs a frontend
        from IPython.display import display

        display(self.ui)
