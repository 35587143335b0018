"""The interactive latency & speedup simulator: ipywidgets controls wired to plotly FigureWidgets.

The only module of the package that imports ipywidgets / plotly widgets.  Every control and figure is
an attribute, so tests can move a control and read the figures headlessly::

    sim = build_simulator()
    sim.k_slider.value = 6
    sim.fig_speedup.data[2].x      # (6,): the current-K marker
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from .model import simulate_generation, spec_timing, speedup_curve
from .presets import HARDWARE, MODELS, PRECISION_BYTES, Hardware, ModelSpec, get_hardware, get_model

__all__ = ["Simulator", "build_simulator"]

_COLORS = {"draft": "#f58518", "verify": "#4c78a8", "overhead": "#bab0ac", "plain": "#54a24b"}


class Simulator:
    """Controls: ``hardware``, ``gpus_slider``, ``target``, ``draft``, ``precision``, ``k_slider``,
    ``alpha_slider``, ``batch_slider``, ``context_slider``.  Figures: ``fig_speedup`` (S(K), best K marked),
    ``fig_breakdown`` (draft / target forward / overhead per step), ``fig_timeline`` (Gantt of a seeded
    Monte Carlo generation), ``fig_tokens`` (tokens/s).  ``summary`` is an HTML line; ``ui`` the whole box."""

    def __init__(self, hardware: str = "H100 SXM", n_gpus: int = 1, target: str = "Llama-3-8B",
                 draft: str = "Llama-3.2-1B", precision: str = "bf16", k: int = 4, alpha: float = 0.8,
                 batch: int = 1, context: int = 1024, *, k_max: int = 16, timeline_steps: int = 10, seed: int = 0,
                 extra_hardware: list[Hardware] | None = None, extra_models: list[ModelSpec] | None = None):
        self.hardware_presets = dict(HARDWARE)
        self.hardware_presets.update({h.name: h for h in extra_hardware or []})
        self.model_presets = dict(MODELS)
        self.model_presets.update({m.name: m for m in extra_models or []})
        self.k_max, self.timeline_steps, self.seed = k_max, timeline_steps, seed
        style = {"description_width": "110px"}
        layout = widgets.Layout(width="420px")

        def dd(desc, options, value):
            return widgets.Dropdown(description=desc, options=list(options), value=value, style=style, layout=layout)

        def islider(desc, value, lo, hi, step=1):
            return widgets.IntSlider(description=desc, value=value, min=lo, max=hi, step=step, style=style, layout=layout,
                                     continuous_update=False)

        self.hardware = dd("hardware", self.hardware_presets, hardware)
        self.gpus_slider = islider("GPUs (TP)", n_gpus, 1, 8)
        self.target = dd("target", self.model_presets, target)
        self.draft = dd("draft", self.model_presets, draft)
        self.precision = dd("precision", [p for p in PRECISION_BYTES if p != "fp32"] + ["fp32"], precision)
        self.k_slider = islider("K (drafts)", k, 1, k_max)
        self.alpha_slider = widgets.FloatSlider(description="alpha", value=alpha, min=0.0, max=0.99, step=0.01,
                                                style=style, layout=layout, continuous_update=False)
        self.batch_slider = islider("batch size", batch, 1, 128)
        self.context_slider = islider("context", context, 128, 32768, 128)
        self.summary = widgets.HTML()
        self.controls = [self.hardware, self.gpus_slider, self.target, self.draft, self.precision, self.k_slider,
                         self.alpha_slider, self.batch_slider, self.context_slider]

        fig_kw = {"height": 300, "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}
        self.fig_speedup = go.FigureWidget(
            data=[go.Scatter(name="S(K)", mode="lines+markers"),
                  go.Scatter(name="best K", mode="markers", marker={"symbol": "star", "size": 16, "color": "#e45756"}),
                  go.Scatter(name="current K", mode="markers", marker={"size": 12, "color": "black", "symbol": "circle-open"})],
            layout={"title": "speedup vs K", "xaxis": {"title": "K"}, "yaxis": {"title": "speedup", "rangemode": "tozero"},
                    **fig_kw})
        self.fig_breakdown = go.FigureWidget(
            data=[go.Bar(name=part, orientation="h", marker_color=_COLORS[key])
                  for part, key in (("draft", "draft"), ("target forward", "verify"), ("overhead", "overhead"))],
            layout={"title": "time for one step's tokens (ms)", "barmode": "stack", "xaxis": {"title": "ms"}, **fig_kw})
        self.fig_timeline = go.FigureWidget(
            data=[go.Bar(name=lane, orientation="h", marker_color=_COLORS[lane], textposition="inside")
                  for lane in ("draft", "verify", "plain")],
            layout={"title": "timeline of a simulated generation", "barmode": "overlay", "xaxis": {"title": "ms"},
                    "showlegend": False, **fig_kw})
        self.fig_tokens = go.FigureWidget(
            data=[go.Bar(marker_color=[_COLORS["plain"], _COLORS["verify"]])],
            layout={"title": "throughput (tokens/s, all rows)", **fig_kw})
        for fig in (self.fig_speedup, self.fig_breakdown, self.fig_timeline, self.fig_tokens):
            fig.layout.uirevision = "keep"

        for c in self.controls:
            c.observe(self.update, names="value")
        self.ui = widgets.VBox([
            widgets.HBox([widgets.VBox(self.controls), self.summary]),
            widgets.HBox([self.fig_speedup, self.fig_tokens]),
            widgets.HBox([self.fig_breakdown, self.fig_timeline]),
        ])
        self.update()

    # ----------------------------------------------------------------------------------------- model
    def settings(self) -> dict:
        hw = get_hardware(self.hardware_presets[self.hardware.value])
        return {"hardware": hw, "target": get_model(self.model_presets[self.target.value]),
                "draft": get_model(self.model_presets[self.draft.value]), "precision": self.precision.value,
                "batch": self.batch_slider.value, "context": self.context_slider.value,
                "n_devices": min(self.gpus_slider.value, hw.max_devices if hw.link_bandwidth > 0 else 1)}

    def timing(self, k: int | None = None):
        s = self.settings()
        return spec_timing(s.pop("hardware"), s.pop("target"), s.pop("draft"), k or self.k_slider.value,
                           self.alpha_slider.value, **s)

    def update(self, *_) -> None:
        s = self.settings()
        hw, tgt = s["hardware"], s["target"]
        alpha, k = self.alpha_slider.value, self.k_slider.value
        curve, kbest = speedup_curve(hw, tgt, s["draft"], alpha, self.k_max, precision=s["precision"], batch=s["batch"],
                                     context=s["context"], n_devices=s["n_devices"])
        t = self.timing()
        ks = list(range(1, self.k_max + 1))
        with self.fig_speedup.batch_update():
            self.fig_speedup.data[0].update(x=ks, y=curve)
            self.fig_speedup.data[1].update(x=[kbest], y=[curve[kbest - 1]])
            self.fig_speedup.data[2].update(x=[k], y=[curve[k - 1]])
            self.fig_speedup.layout.shapes = [{"type": "line", "x0": 1, "x1": self.k_max, "y0": 1, "y1": 1,
                                               "line": {"dash": "dot", "color": "grey"}}]

        ms = 1e3
        b = t.breakdown()
        plain_ovh = hw.step_overhead
        e = t.tokens_per_step
        rows = ["speculative step", f"plain, {e:.2f} tokens"]
        with self.fig_breakdown.batch_update():
            self.fig_breakdown.data[0].update(y=rows, x=[b["draft"] * ms, 0.0])
            self.fig_breakdown.data[1].update(y=rows, x=[b["verify"] * ms, e * (t.t_target - plain_ovh) * ms])
            self.fig_breakdown.data[2].update(y=rows, x=[b["overhead"] * ms, e * plain_ovh * ms])

        run = simulate_generation(alpha, k, self.timeline_steps, t.t_draft, t.t_verify, seed=self.seed)
        ev = run.events()
        n_plain = max(1, int(run.time / t.t_target))
        with self.fig_timeline.batch_update():
            self.fig_timeline.data[0].update(y=["draft"] * len(ev), base=[x["start"] * ms for x in ev],
                                             x=[x["draft"] * ms for x in ev], text=[f"{k}" for _ in ev])
            self.fig_timeline.data[1].update(y=["verify"] * len(ev), base=[(x["start"] + x["draft"]) * ms for x in ev],
                                             x=[x["verify"] * ms for x in ev], text=[f"+{x['emitted']}" for x in ev])
            self.fig_timeline.data[2].update(y=["plain"] * n_plain, base=[i * t.t_target * ms for i in range(n_plain)],
                                             x=[t.t_target * ms] * n_plain, text=["+1"] * n_plain)

        with self.fig_tokens.batch_update():
            self.fig_tokens.data[0].update(x=["plain decoding", f"speculative (K={k})"],
                                           y=[t.baseline_tokens_per_s, t.tokens_per_s])

        need = (tgt.weight_bytes(s["precision"]) + s["batch"] * s["context"] * tgt.kv_bytes_per_token(2.0)) / s["n_devices"]
        fits = need <= hw.memory
        warn = "" if fits else (f"<br><b style='color:#e45756'>does not fit: {need / 1e9:.0f} GB per device"
                                f" &gt; {hw.memory / 1e9:.0f} GB</b>")
        self.summary.value = (
            f"<b>{hw.name}</b> x{s['n_devices']}, {tgt.name} ({s['precision']})<br>"
            f"plain step T(1) = {t.t_target * ms:.2f} ms; draft {t.t_draft * ms:.2f} ms (c = {t.c:.3f}); "
            f"T(K+1)/T(1) = {t.t_verify / t.t_target:.2f}<br>"
            f"E[tokens/step] = {e:.2f}; speedup at K={k}: <b>{t.speedup:.2f}x</b>; best K = {kbest} "
            f"({curve[kbest - 1]:.2f}x)<br>ridge point {hw.ridge_point:.0f} FLOP/byte" + warn)

    def static_figure(self) -> go.Figure:
        """The four figures of the current state as one plain plotly figure (2 x 2 panels, the summary as
        its title): what :func:`specdec_lesson.figures.show_static` renders to a PNG for readers without a
        kernel.  The stacked time breakdown is drawn with explicit bar bases, so one ``barmode`` serves all."""
        import re

        from plotly.subplots import make_subplots

        titles = [f.layout.title.text for f in (self.fig_speedup, self.fig_tokens, self.fig_breakdown, self.fig_timeline)]
        fig = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.1, vertical_spacing=0.16)
        for tr in self.fig_speedup.data:
            fig.add_trace(go.Scatter(tr), row=1, col=1)
        fig.add_trace(go.Bar(self.fig_tokens.data[0], showlegend=False), row=1, col=2)
        base = [0.0] * len(self.fig_breakdown.data[0].x)
        for tr in self.fig_breakdown.data:
            fig.add_trace(go.Bar(tr, base=list(base)), row=2, col=1)
            base = [b + x for b, x in zip(base, tr.x)]
        for tr in self.fig_timeline.data:
            fig.add_trace(go.Bar(tr, showlegend=False), row=2, col=2)
        for shape in self.fig_speedup.layout.shapes:
            fig.add_shape(shape, row=1, col=1)
        summary = re.sub(r"<(?!br>|/?b>)[^>]*>", "", self.summary.value).replace("&gt;", ">")
        fig.update_layout(barmode="overlay", height=640, width=1000, margin={"l": 60, "r": 20, "t": 150, "b": 40},
                          title={"text": summary, "font": {"size": 12}, "x": 0.01, "y": 0.98, "yanchor": "top"},
                          legend={"orientation": "h", "y": -0.08})
        fig.update_xaxes(title_text="K", row=1, col=1)
        fig.update_yaxes(title_text="speedup", rangemode="tozero", row=1, col=1)
        fig.update_xaxes(title_text="ms", row=2, col=1)
        fig.update_xaxes(title_text="ms", row=2, col=2)
        return fig

    def _ipython_display_(self) -> None:  # pragma: no cover - needs a frontend
        from IPython.display import display

        display(self.ui)


def build_simulator(**kwargs) -> Simulator:
    """The simulator with its controls and figures; display it with ``display(sim.ui)`` (or just ``sim``)."""
    return Simulator(**kwargs)
