"""Notebook 01's speedup explorer: S(K) = E[tokens](alpha, K) / (K c + T(K+1)/T(1)) for K = 1..k_max, with the best
K, and the best speedup over K as a function of alpha at the chosen c, where the region alpha <= c is shaded: there
E[tokens] = 1 + alpha + ... + alpha^K <= 1 + K c, so no K pays as long as verifying costs at least a plain step.

The verify cost T(K+1)/T(1) is the paper's 1, a constant, or a measured curve (a mapping n -> T(n)/T(1), such as
``benchmarks/results/verify_curve.json`` normalised).  :func:`speedup_view` computes what the app draws with
:mod:`specdec_lesson.theory` (``speedup``, ``expected_tokens``, ``best_k``); :func:`build_speedup_explorer` wires it::

    app = build_speedup_explorer(alpha=0.8, c=0.1)
    app.alpha_slider.value = 0.6
    app.fig_sk.data[0].y          # S(1..k_max) at alpha = 0.6
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..theory import best_k, expected_tokens, speedup
from ..validate import as_int, as_prob, as_real
from .controls import MARGIN, App, dropdown, figure_widget, float_slider, int_slider, ui_modules

__all__ = ["SpeedupView", "speedup_view", "ratio_function", "SpeedupExplorer", "build_speedup_explorer"]

IDEAL, CONSTANT = "ideal: T(K+1) = T(1)", "constant T(K+1)/T(1) (slider)"


def ratio_function(verify_ratio, k_max: int) -> Callable[[int], float]:
    """``n -> T(n)/T(1)`` from a number (the same for every n), a mapping ``{n: T(n)/T(1)}`` that covers
    n = 2..k_max+1, or a callable (returned as is)."""
    if callable(verify_ratio):
        return verify_ratio
    if isinstance(verify_ratio, Mapping):
        curve = {as_int(n, "verify_ratio key", lo=1): as_real(r, f"verify_ratio[{n}]", lo=0.0, lo_open=True)
                 for n, r in verify_ratio.items()}
        missing = [n for n in range(2, k_max + 2) if n not in curve]
        if missing:
            raise ValueError(f"the measured verify curve has no T(n)/T(1) for n = {missing}: "
                             f"lower k_max to {min(missing) - 2} or measure those n")
        return curve.__getitem__
    r = as_real(verify_ratio, "verify_ratio", lo=0.0, lo_open=True)
    return lambda n: r


@dataclass(frozen=True)
class SpeedupView:
    """``speedups[K-1]`` = S(K), ``expected[K-1]`` = E[tokens](alpha, K), ``ratios[K-1]`` = T(K+1)/T(1);
    ``best_by_alpha[i]`` = max over K of S at alpha = ``alphas[i]`` (same c and verify cost); ``break_even``: the
    smallest alpha of that grid where it exceeds 1 (None when none does)."""

    alpha: float
    c: float
    k: int
    ks: list[int]
    speedups: list[float]
    expected: list[float]
    ratios: list[float]
    k_best: int
    alphas: list[float]
    best_by_alpha: list[float]
    break_even: float | None

    @property
    def s_best(self) -> float:
        return self.speedups[self.k_best - 1]

    @property
    def cannot_pay(self) -> bool:
        """alpha <= c: no K gives S > 1 when T(K+1) >= T(1)."""
        return self.alpha <= self.c


def speedup_view(alpha: float, c: float, verify_ratio=1.0, k: int = 4, k_max: int = 12,
                 alpha_steps: int = 100) -> SpeedupView:
    """What the explorer draws for one setting (see :class:`SpeedupView`); ``verify_ratio`` as in
    :func:`ratio_function`, ``alpha_steps`` + 1 alphas from 0 to 1 for the best-speedup curve."""
    alpha, c = as_prob(alpha, "alpha"), as_real(c, "c", lo=0.0)
    k_max = as_int(k_max, "k_max", lo=1)
    k, alpha_steps = as_int(k, "k", lo=1, hi=k_max), as_int(alpha_steps, "alpha_steps", lo=1)
    ratio = ratio_function(verify_ratio, k_max)
    ks = list(range(1, k_max + 1))
    ratios = [as_real(ratio(kk + 1), f"verify_ratio({kk + 1})", lo=0.0, lo_open=True) for kk in ks]
    alphas = [i / alpha_steps for i in range(alpha_steps + 1)]
    best = []
    for a in alphas:
        kb = best_k(a, c, k_max=k_max, verify_ratio=ratio)
        best.append(speedup(a, kb, c, ratios[kb - 1]))
    return SpeedupView(
        alpha=alpha, c=c, k=k, ks=ks, speedups=[speedup(alpha, kk, c, r) for kk, r in zip(ks, ratios)],
        expected=[expected_tokens(alpha, kk) for kk in ks], ratios=ratios,
        k_best=best_k(alpha, c, k_max=k_max, verify_ratio=ratio), alphas=alphas, best_by_alpha=best,
        break_even=next((a for a, s in zip(alphas, best) if s > 1.0 + 1e-12), None))  # 1e-12: rounding at alpha = c


class SpeedupExplorer(App):
    """Controls: ``alpha_slider``, ``c_slider``, ``k_slider``, ``verify`` (the verify-cost source: ideal, constant,
    or one of ``curves``), ``ratio_slider`` (the constant).  Figures: ``fig_sk`` (S(K), best K, current K) and
    ``fig_alpha`` (best S over K against alpha, current alpha; alpha <= c shaded, break-even marked)."""

    def __init__(self, alpha: float = 0.8, c: float = 0.1, k: int = 4, *, k_max: int = 12, verify: str = IDEAL,
                 ratio: float = 1.0, curves: Mapping[str, Mapping[int, float]] | None = None):
        widgets, _ = ui_modules()
        self.k_max = as_int(k_max, "k_max", lo=1)
        self.curves = {name: ratio_function(curve, self.k_max) for name, curve in (curves or {}).items()}
        self.alpha_slider = float_slider("alpha (acceptance)", alpha, 0.0, 1.0)
        self.c_slider = float_slider("c (draft / target cost)", c, 0.0, 1.0)
        self.k_slider = int_slider("K (drafts per step)", k, 1, self.k_max)
        self.verify = dropdown("verify cost", [IDEAL, CONSTANT, *self.curves], verify)
        self.ratio_slider = float_slider("T(K+1)/T(1) constant", ratio, 0.5, 3.0, 0.05)
        self.controls = [self.alpha_slider, self.c_slider, self.k_slider, self.verify, self.ratio_slider]
        self.summary = widgets.HTML(layout=widgets.Layout(width="520px"))
        self.fig_sk = figure_widget(
            [{"type": "scatter", "name": "S(K)", "mode": "lines+markers", "line": {"color": "#4c78a8"}},
             {"type": "scatter", "name": "best K", "mode": "markers",
              "marker": {"symbol": "star", "size": 16, "color": "#e45756"}},
             {"type": "scatter", "name": "current K", "mode": "markers",
              "marker": {"size": 13, "color": "black", "symbol": "circle-open"}}],
            "speedup S(K)", xaxis={"title": {"text": "K (drafts per step)"}, "dtick": 1},
            yaxis={"title": {"text": "speedup"}, "rangemode": "tozero"})
        self.fig_alpha = figure_widget(
            [{"type": "scatter", "name": "best S over K", "mode": "lines", "line": {"color": "#4c78a8", "width": 3}},
             {"type": "scatter", "name": "current alpha", "mode": "markers",
              "marker": {"size": 13, "color": "black", "symbol": "circle-open"}}],
            "best speedup against alpha (c fixed)", xaxis={"title": {"text": "alpha"}, "range": [0, 1]},
            yaxis={"title": {"text": "max over K of S(K)"}, "rangemode": "tozero"}, showlegend=False,
            margin={**MARGIN, "b": 50})
        self.figures = [self.fig_sk, self.fig_alpha]
        self._finish()

    def verify_ratio(self):
        """What the verify-cost control says: 1, the slider's constant, or the chosen measured curve."""
        choice = self.verify.value
        return 1.0 if choice == IDEAL else self.ratio_slider.value if choice == CONSTANT else self.curves[choice]

    def update(self) -> None:
        self.ratio_slider.disabled = self.verify.value != CONSTANT
        v = self.view = speedup_view(self.alpha_slider.value, self.c_slider.value, self.verify_ratio(),
                                     self.k_slider.value, self.k_max)
        line = {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "y0": 1, "y1": 1, "line": {"dash": "dot", "color": "grey"}}
        with self.fig_sk.batch_update():
            self.fig_sk.data[0].update(x=v.ks, y=v.speedups)
            self.fig_sk.data[1].update(x=[v.k_best], y=[v.s_best])
            self.fig_sk.data[2].update(x=[v.k], y=[v.speedups[v.k - 1]])
            self.fig_sk.layout.shapes = [line]
        with self.fig_alpha.batch_update():
            self.fig_alpha.data[0].update(x=v.alphas, y=v.best_by_alpha)
            i = min(range(len(v.alphas)), key=lambda j: abs(v.alphas[j] - v.alpha))
            self.fig_alpha.data[1].update(x=[v.alpha], y=[v.best_by_alpha[i]])
            shapes = [line, {"type": "rect", "xref": "x", "yref": "y domain", "x0": 0, "x1": min(v.c, 1.0), "y0": 0, "y1": 1,
                             "fillcolor": "#e45756", "opacity": 0.15, "line": {"width": 0}}]
            if v.break_even is not None:
                shapes.append({"type": "line", "xref": "x", "yref": "y domain", "x0": v.break_even, "x1": v.break_even,
                               "y0": 0, "y1": 1, "line": {"dash": "dash", "color": "#e45756"}})
            self.fig_alpha.layout.shapes = shapes
        s_k = v.speedups[v.k - 1]
        verdict = ("<b style='color:#e45756'>alpha &le; c: speculation cannot pay here</b> (shaded; exact when "
                   "T(K+1) &ge; T(1))" if v.cannot_pay else f"alpha &gt; c: K = 1 already gives {v.speedups[0]:.2f}x")
        even = "never, on this grid" if v.break_even is None else f"alpha = {v.break_even:.2f} (dashed)"
        self.summary.value = (
            f"alpha = {v.alpha:.2f}, c = {v.c:.2f}, verify cost: {self.verify.value}<br>"
            f"K = {v.k}: E[tokens] = {v.expected[v.k - 1]:.3f}, T(K+1)/T(1) = {v.ratios[v.k - 1]:.3f}, "
            f"<b>S = {s_k:.3f}x</b><br>best K = {v.k_best}: S = {v.s_best:.3f}x<br>{verdict}<br>"
            f"break-even (best K beats plain decoding): {even}")


def build_speedup_explorer(**kwargs) -> SpeedupExplorer:
    """The S(K) explorer; display it with ``display(app.ui)``.  ``curves={"name": {n: T(n)/T(1)}}`` adds measured
    verify curves to the verify-cost menu (they must cover n = 2..k_max+1)."""
    return SpeedupExplorer(**kwargs)
