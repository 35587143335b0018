"""Notebook 01's p / q editor: the target's law p and the draft's law q over three tokens, set by sliders (weights,
normalised), and what one speculative-sampling step makes of them:

* the accepted mass min(p, q) (draft x, then keep it), which sums to beta = 1 - TV(p, q);
* the residual max(0, p - q) normalised, the law a rejection resamples from (its normaliser is 1 - beta);
* the emitted law min(p, q) + (1 - beta) * residual, computed exactly with Fractions
  (:func:`specdec_lesson.theory.exact_emit_law`): it equals p, whatever q is.

:func:`residual_view` is the pure part (exact Fractions); :func:`build_residual_editor` the widget::

    app = build_residual_editor()
    app.q_sliders[2].value = 0.1
    app.fig_emit.data[0].y        # min(p, q) per token, as floats
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..theory import exact_emit_law
from ..validate import as_int, as_real
from .controls import App, figure_widget, float_slider, ui_modules

__all__ = ["ResidualView", "residual_view", "ResidualEditor", "build_residual_editor"]

TOKENS = ["token 0", "token 1", "token 2"]


def _law(weights, name: str, max_denominator: int) -> list[Fraction]:
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
        raise ValueError(f"{name} must be a sequence of non-negative weights, got {weights!r}")
    ws = [Fraction(as_real(w, f"{name}[{i}]", lo=0.0)).limit_denominator(max_denominator) for i, w in enumerate(weights)]
    total = sum(ws)
    if not ws or total == 0:
        raise ValueError(f"{name} has no positive weight: raise at least one of its sliders above 0")
    return [w / total for w in ws]


@dataclass(frozen=True)
class ResidualView:
    """Exact laws of one step: ``p``, ``q``, ``accepted`` = min(p, q), ``residual`` = max(0, p - q) / (1 - beta)
    (all zero when p == q: no rejection ever happens), ``emitted`` = the law of the emitted token."""

    p: list[Fraction]
    q: list[Fraction]
    accepted: list[Fraction]
    residual: list[Fraction]
    emitted: list[Fraction]

    @property
    def beta(self) -> Fraction:
        """P(the draft is accepted) = sum_x min(p(x), q(x))."""
        return sum(self.accepted, Fraction(0))

    @property
    def rejected_share(self) -> list[Fraction]:
        """(1 - beta) * residual: the mass each token gets through a rejection."""
        return [(1 - self.beta) * r for r in self.residual]


def residual_view(target_weights, draft_weights, max_denominator: int = 1000) -> ResidualView:
    """Normalise the two weight vectors into exact laws (each weight first rounded to a fraction with denominator
    at most ``max_denominator``, so a slider's 0.3 is 3/10) and compute the step's laws (see :class:`ResidualView`)."""
    max_denominator = as_int(max_denominator, "max_denominator", lo=1)
    p, q = _law(target_weights, "target_weights", max_denominator), _law(draft_weights, "draft_weights", max_denominator)
    if len(p) != len(q):
        raise ValueError(f"target_weights and draft_weights differ in length: {len(p)} vs {len(q)}")
    accepted = [min(a, b) for a, b in zip(p, q)]
    excess = [max(Fraction(0), a - b) for a, b in zip(p, q)]
    z = sum(excess, Fraction(0))  # = 1 - beta
    residual = [e / z if z else Fraction(0) for e in excess]
    return ResidualView(p, q, accepted, residual, exact_emit_law(p, q))


def _fmt(x: Fraction) -> str:
    return str(x) if x.denominator <= 100 else f"{float(x):.4f}"


class ResidualEditor(App):
    """Controls: ``p_sliders`` and ``q_sliders`` (one weight per token, normalised).  Figures: ``fig_laws`` (p, q
    and the normalised residual, grouped) and ``fig_emit`` (the emitted law stacked as accepted min(p, q) plus the
    rejection's share (1 - beta) * residual, with p marked on top)."""

    def __init__(self, target_weights=(0.5, 0.3, 0.2), draft_weights=(0.2, 0.2, 0.6)):
        widgets, _ = ui_modules()
        if len(target_weights) != len(TOKENS) or len(draft_weights) != len(TOKENS):
            raise ValueError(f"the editor has {len(TOKENS)} tokens: give {len(TOKENS)} target and draft weights")
        self.p_sliders = [float_slider(f"p weight, {t}", w, 0.0, 1.0) for t, w in zip(TOKENS, target_weights)]
        self.q_sliders = [float_slider(f"q weight, {t}", w, 0.0, 1.0) for t, w in zip(TOKENS, draft_weights)]
        self.controls = [*self.p_sliders, *self.q_sliders]
        self.summary = widgets.HTML(layout=widgets.Layout(width="520px"))
        self.fig_laws = figure_widget(
            [{"type": "bar", "name": "p (target)", "marker": {"color": "#4c78a8"}},
             {"type": "bar", "name": "q (draft)", "marker": {"color": "#f58518"}},
             {"type": "bar", "name": "residual max(0, p - q) / (1 - beta)", "marker": {"color": "#b279a2"}}],
            "the two laws and the residual", yaxis={"title": {"text": "probability"}, "range": [0, 1]}, barmode="group")
        self.fig_emit = figure_widget(
            [{"type": "bar", "name": "accepted: min(p, q)", "marker": {"color": "#54a24b"}, "offsetgroup": "emit"},
             {"type": "bar", "name": "via rejection: (1 - beta) residual", "marker": {"color": "#b279a2"},
              "offsetgroup": "emit"},
             {"type": "scatter", "name": "p", "mode": "markers",
              "marker": {"symbol": "line-ew-open", "size": 40, "color": "black", "line": {"width": 3}}}],
            "emitted law = accepted + rejected share", yaxis={"title": {"text": "probability"}, "range": [0, 1]},
            barmode="group")
        self.figures = [self.fig_laws, self.fig_emit]
        self._finish()

    def weights(self) -> tuple[list[float], list[float]]:
        return [s.value for s in self.p_sliders], [s.value for s in self.q_sliders]

    def update(self) -> None:
        v = self.view = residual_view(*self.weights())
        f = lambda xs: [float(x) for x in xs]  # noqa: E731 - plotly takes floats
        with self.fig_laws.batch_update():
            for trace, ys in zip(self.fig_laws.data, (v.p, v.q, v.residual)):
                trace.update(x=TOKENS, y=f(ys))
        with self.fig_emit.batch_update():
            self.fig_emit.data[0].update(x=TOKENS, y=f(v.accepted), base=[0.0] * len(TOKENS))
            self.fig_emit.data[1].update(x=TOKENS, y=f(v.rejected_share), base=f(v.accepted))
            self.fig_emit.data[2].update(x=TOKENS, y=f(v.p))
        same = v.emitted == v.p
        law = lambda xs: "(" + ", ".join(_fmt(x) for x in xs) + ")"  # noqa: E731
        never = "; p = q, so no draft is ever rejected" if v.beta == 1 else ""
        self.summary.value = (
            f"p = {law(v.p)}, q = {law(v.q)}<br>"
            f"accepted mass beta = sum min(p, q) = <b>{_fmt(v.beta)}</b>; TV(p, q) = 1 - beta = {_fmt(1 - v.beta)}{never}<br>"
            f"residual (normalised) = {law(v.residual)}<br>"
            f"emitted law, exact: {law(v.emitted)}: "
            + ("<b style='color:#54a24b'>equal to p</b>" if same else "<b style='color:#e45756'>NOT p</b>"))


def build_residual_editor(**kwargs) -> ResidualEditor:
    """The 3-token p / q editor; display it with ``display(app.ui)``."""
    return ResidualEditor(**kwargs)
