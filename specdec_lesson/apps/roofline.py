"""Notebook 00's roofline and verify-cost explorer: how long one forward over n new tokens takes, per token, against
the memory roof (bytes / bandwidth, shared by the n tokens) and the compute roof (FLOPs / peak, paid per token), and
what verifying n tokens costs relative to decoding one, T(n)/T(1).

:func:`roofline_view` computes everything the app draws from :func:`specdec_lesson.sim.forward_cost` and
:func:`specdec_lesson.sim.arithmetic_intensity` (no widgets); :func:`build_roofline_explorer` wires it to sliders::

    app = build_roofline_explorer(hardware="H100 SXM", model="Llama-3-8B")
    app.n_slider.value = 64
    app.fig_ratio.data[1].x      # (64,): the current-n marker on the T(n)/T(1) curve
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sim.model import arithmetic_intensity, forward_cost
from ..sim.presets import HARDWARE, MODELS, PRECISION_BYTES, Hardware, ModelSpec, get_hardware, get_model
from ..validate import as_int
from .controls import MARGIN, App, dropdown, figure_widget, int_slider, ui_modules

__all__ = ["RooflineView", "roofline_view", "RooflineExplorer", "build_roofline_explorer"]

_MS = 1e3


@dataclass(frozen=True)
class RooflineView:
    """One setting's roofline, for n = 1..n_max new tokens per row in one forward (all times in ms, per device).

    ``per_token_ms[i]`` = T(n)/n with n = ``ns[i]``; ``memory_ms`` / ``compute_ms``: the two roofs per token
    (bytes / bandwidth / n and FLOPs / peak / n); ``ratio[i]`` = T(n)/T(1).  ``crossover``: the first n at which the
    compute roof is above the memory roof (None when memory bound over the whole range)."""

    hardware: str
    model: str
    precision: str
    batch: int
    context: int
    n: int
    ns: list[int]
    per_token_ms: list[float]
    memory_ms: list[float]
    compute_ms: list[float]
    ratio: list[float]
    t1_ms: float
    tn_ms: float
    bound: str
    intensity: float
    ridge: float
    crossover: int | None
    need_gb: float
    memory_gb: float

    @property
    def fits(self) -> bool:
        return self.need_gb <= self.memory_gb


def roofline_view(hardware: str | Hardware, model: str | ModelSpec, precision: str = "bf16", batch: int = 1,
                  context: int = 1024, n: int = 5, n_max: int = 512) -> RooflineView:
    """The numbers of the explorer for one setting (see :class:`RooflineView`)."""
    hw, m = get_hardware(hardware), get_model(model)
    n_max = as_int(n_max, "n_max", lo=1)
    n = as_int(n, "n", lo=1, hi=n_max)
    ns = list(range(1, n_max + 1))
    costs = [forward_cost(hw, m, precision, k, batch, context) for k in ns]
    t1 = costs[0].total
    cross = next((k for k, c in zip(ns, costs) if c.compute_s > c.memory_s), None)
    need = m.weight_bytes(precision) + batch * (context + n) * m.kv_bytes_per_token(4.0 if precision == "fp32" else 2.0)
    return RooflineView(
        hardware=hw.name, model=m.name, precision=precision, batch=batch, context=context, n=n, ns=ns,
        per_token_ms=[c.total / k * _MS for k, c in zip(ns, costs)],
        memory_ms=[c.memory_s / k * _MS for k, c in zip(ns, costs)],
        compute_ms=[c.compute_s / k * _MS for k, c in zip(ns, costs)],
        ratio=[c.total / t1 for c in costs], t1_ms=t1 * _MS, tn_ms=costs[n - 1].total * _MS, bound=costs[n - 1].bound,
        intensity=arithmetic_intensity(m, precision, batch=batch, context=context, n_tokens=n), ridge=hw.ridge_point,
        crossover=cross, need_gb=need / 1e9, memory_gb=hw.memory / 1e9)


class RooflineExplorer(App):
    """Controls: ``hardware``, ``model``, ``precision``, ``batch_slider``, ``context_slider``, ``n_slider``.
    Figures: ``fig_time`` (per-token time vs n: total, memory roof, compute roof, current n) and ``fig_ratio``
    (T(n)/T(1), current n, the compute-bound range shaded).  ``view`` is the last :class:`RooflineView` drawn."""

    def __init__(self, hardware: str = "H100 SXM", model: str = "Llama-3-8B", precision: str = "bf16", batch: int = 1,
                 context: int = 1024, n: int = 5, *, n_max: int = 512, extra_hardware: list[Hardware] | None = None,
                 extra_models: list[ModelSpec] | None = None):
        widgets, _ = ui_modules()
        self.hardware_presets = {**HARDWARE, **{h.name: h for h in extra_hardware or []}}
        self.model_presets = {**MODELS, **{m.name: m for m in extra_models or []}}
        self.n_max = as_int(n_max, "n_max", lo=2)
        self.hardware = dropdown("hardware", self.hardware_presets, hardware)
        self.model = dropdown("model", self.model_presets, model)
        self.precision = dropdown("precision", PRECISION_BYTES, precision)
        self.batch_slider = int_slider("batch (rows)", batch, 1, 256)
        self.context_slider = int_slider("context (tokens)", context, 0, 32768, 256)
        self.n_slider = int_slider("n verified at once", n, 1, self.n_max)
        self.controls = [self.hardware, self.model, self.precision, self.batch_slider, self.context_slider, self.n_slider]
        self.summary = widgets.HTML(layout=widgets.Layout(width="520px"))
        log_x = {"title": {"text": "n new tokens per row in one forward"}, "type": "log"}
        self.fig_time = figure_widget(
            [{"type": "scatter", "name": "T(n) / n", "mode": "lines", "line": {"color": "#4c78a8", "width": 3}},
             {"type": "scatter", "name": "memory roof / n", "mode": "lines", "line": {"color": "#54a24b", "dash": "dash"}},
             {"type": "scatter", "name": "compute roof / n", "mode": "lines", "line": {"color": "#e45756", "dash": "dash"}},
             {"type": "scatter", "name": "current n", "mode": "markers",
              "marker": {"size": 12, "color": "black", "symbol": "circle-open"}}],
            "time per token (ms)", xaxis=log_x, yaxis={"title": {"text": "ms per token"}, "type": "log"})
        self.fig_ratio = figure_widget(
            [{"type": "scatter", "name": "T(n) / T(1)", "mode": "lines", "line": {"color": "#4c78a8", "width": 3}},
             {"type": "scatter", "name": "current n", "mode": "markers",
              "marker": {"size": 12, "color": "black", "symbol": "circle-open"}}],
            "verify cost T(n) / T(1)", xaxis=dict(log_x), yaxis={"title": {"text": "T(n) / T(1)"}, "rangemode": "tozero"},
            showlegend=False, margin={**MARGIN, "b": 50})
        self.figures = [self.fig_time, self.fig_ratio]
        self._finish()

    def settings(self) -> dict:
        return {"hardware": self.hardware_presets[self.hardware.value], "model": self.model_presets[self.model.value],
                "precision": self.precision.value, "batch": self.batch_slider.value,
                "context": self.context_slider.value, "n": self.n_slider.value}

    def update(self) -> None:
        v = self.view = roofline_view(**self.settings(), n_max=self.n_max)
        i = v.n - 1
        with self.fig_time.batch_update():
            for trace, ys in zip(self.fig_time.data, (v.per_token_ms, v.memory_ms, v.compute_ms)):
                trace.update(x=v.ns, y=ys)
            self.fig_time.data[3].update(x=[v.n], y=[v.per_token_ms[i]])
        shade = [] if v.crossover is None else [
            {"type": "rect", "xref": "x", "yref": "y domain", "x0": v.crossover, "x1": v.ns[-1], "y0": 0, "y1": 1,
             "fillcolor": "#e45756", "opacity": 0.12, "line": {"width": 0}}]
        with self.fig_ratio.batch_update():
            self.fig_ratio.data[0].update(x=v.ns, y=v.ratio)
            self.fig_ratio.data[1].update(x=[v.n], y=[v.ratio[i]])
            self.fig_ratio.layout.shapes = [
                {"type": "line", "xref": "x", "x0": 1, "x1": v.ns[-1], "y0": 1, "y1": 1,
                 "line": {"dash": "dot", "color": "grey"}}, *shade]
        where = (f"compute bound from n = {v.crossover} (shaded)" if v.crossover is not None
                 else f"memory bound for every n up to {v.ns[-1]}")
        warn = "" if v.fits else (f"<br><b style='color:#e45756'>does not fit: {v.need_gb:.0f} GB of weights and cache "
                                  f"&gt; {v.memory_gb:.0f} GB on one device</b>")
        self.summary.value = (
            f"<b>{v.hardware}</b>, {v.model} ({v.precision}), batch {v.batch}, context {v.context}<br>"
            f"T(1) = {v.t1_ms:.3f} ms per decode step; T({v.n}) = {v.tn_ms:.3f} ms ({v.bound} bound)<br>"
            f"<b>T({v.n}) / T(1) = {v.ratio[i]:.2f}</b>: verifying {v.n} tokens costs {v.ratio[i]:.2f} decode steps, "
            f"{v.per_token_ms[i]:.3f} ms per token<br>"
            f"arithmetic intensity {v.intensity:.1f} FLOP/byte against the ridge point {v.ridge:.0f} FLOP/byte; "
            f"{where}" + warn)


def build_roofline_explorer(**kwargs) -> RooflineExplorer:
    """The roofline explorer; display it with ``display(app.ui)``.  Keyword arguments: see :class:`RooflineExplorer`
    (``extra_hardware=[sim.this_machine(bandwidth, flops)]`` adds the learner's measured machine)."""
    return RooflineExplorer(**kwargs)
