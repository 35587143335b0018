"""The course's apps (specdec_lesson.apps), headless: the pure views against the library's own formulas, and each
widget moved programmatically, its figures checked against the view (and a planted wrong value caught)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from specdec_lesson import theory
from specdec_lesson.apps import rank_law, residual_view, roofline_view, speedup_view, tree_shape_view
from specdec_lesson.sim import forward_cost, this_machine, tree_expected_tokens

ROOT = Path(__file__).resolve().parents[1]


def _widgets():
    pytest.importorskip("ipywidgets", reason="the apps need ipywidgets (course extra)")
    pytest.importorskip("anywidget", reason="plotly 7's FigureWidget needs anywidget (course extra)")
    from specdec_lesson import apps

    return apps


# ------------------------------------------------------------------------------------------- pure views
def test_roofline_view_is_forward_cost():
    v = roofline_view("H100 SXM", "Llama-3-8B", "bf16", batch=1, context=1024, n=5, n_max=400)
    t1 = forward_cost("H100 SXM", "Llama-3-8B", "bf16", 1, 1, 1024).total
    for n in (1, 5, 64, 400):
        c = forward_cost("H100 SXM", "Llama-3-8B", "bf16", n, 1, 1024)
        assert v.per_token_ms[n - 1] == pytest.approx(c.total / n * 1e3)
        assert v.memory_ms[n - 1] == pytest.approx(c.memory_s / n * 1e3)
        assert v.compute_ms[n - 1] == pytest.approx(c.compute_s / n * 1e3)
        assert v.ratio[n - 1] == pytest.approx(c.total / t1)
    assert v.ratio[4] == pytest.approx(1.0, abs=0.01) and v.bound == "memory"  # verifying 5 costs one decode step
    assert v.crossover is not None and 250 < v.crossover < 320  # near the 295 FLOP/byte ridge at batch 1
    c = forward_cost("H100 SXM", "Llama-3-8B", "bf16", v.crossover, 1, 1024)
    assert c.compute_s > c.memory_s
    assert roofline_view("H100 SXM", "Llama-3-8B", batch=64).crossover < v.crossover / 20  # batching spends the slack


def test_roofline_view_bad_n():
    with pytest.raises(ValueError, match="n must be an integer in 1..16"):
        roofline_view("H100 SXM", "Llama-3-8B", n=17, n_max=16)


def test_speedup_view_is_theory():
    v = speedup_view(alpha=0.8, c=0.1, k=4, k_max=12)
    assert v.speedups == [theory.speedup(0.8, k, 0.1) for k in range(1, 13)]
    assert v.expected == [theory.expected_tokens(0.8, k) for k in range(1, 13)]
    assert v.k_best == theory.best_k(0.8, 0.1, k_max=12) and v.s_best == max(v.speedups)
    assert v.break_even == pytest.approx(0.11)  # with T(K+1) = T(1): the first grid alpha above c


@pytest.mark.parametrize("ratio", [1.0, 1.3])
def test_alpha_at_most_c_never_pays(ratio):
    """The shaded claim: alpha <= c gives S(K) <= 1 for every K when T(K+1) >= T(1)."""
    for c in (0.05, 0.2, 0.5):
        v = speedup_view(alpha=0.5, c=c, verify_ratio=ratio, k_max=16)
        assert all(s <= 1 + 1e-12 for a, s in zip(v.alphas, v.best_by_alpha) if a <= c)
        assert v.break_even is not None and v.break_even > c


def test_speedup_view_measured_curve():
    curve = {n: 1 + 0.05 * (n - 1) for n in range(1, 9)}
    v = speedup_view(alpha=0.7, c=0.05, verify_ratio=curve, k=3, k_max=7)
    assert v.ratios == [curve[k + 1] for k in range(1, 8)]
    assert v.speedups[2] == theory.speedup(0.7, 3, 0.05, curve[4])
    assert v.k_best == theory.best_k(0.7, 0.05, k_max=7, verify_ratio=curve.__getitem__)
    with pytest.raises(ValueError, match="no T\\(n\\)/T\\(1\\) for n = \\[9\\]: lower k_max to 7"):
        speedup_view(alpha=0.7, c=0.05, verify_ratio=curve, k_max=8)


def test_residual_view_exact():
    v = residual_view([0.5, 0.3, 0.2], [0.2, 0.2, 0.6])
    assert v.p == [Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)] and v.q == [Fraction(1, 5), Fraction(1, 5), Fraction(3, 5)]
    assert v.accepted == [Fraction(1, 5), Fraction(1, 5), Fraction(1, 5)] and v.beta == Fraction(3, 5)
    assert v.residual == [Fraction(3, 4), Fraction(1, 4), 0]
    assert v.emitted == v.p == theory.exact_emit_law(v.p, v.q)
    w = residual_view([2, 1, 1], [1, 1, 2])  # weights are normalised
    assert w.p == [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)] and w.emitted == w.p
    same = residual_view([1, 2, 3], [1, 2, 3])
    assert same.beta == 1 and same.residual == [0, 0, 0] and same.emitted == same.p
    with pytest.raises(ValueError, match="draft_weights has no positive weight"):
        residual_view([1, 0, 0], [0, 0, 0])


def test_residual_view_emits_p_on_a_grid():
    grid = [0.0, 0.1, 0.35, 1.0]
    for a in grid:
        for b in grid:
            for d in grid:
                v = residual_view([0.2, 0.5, 0.3], [a, b, d]) if a + b + d else None
                if v is not None:
                    assert v.emitted == v.p and sum(v.accepted) + sum(v.rejected_share) == 1


def test_tree_with_topk_1_is_the_chain():
    for depth in (1, 3, 6):
        v = tree_shape_view(topk=1, depth=depth, num_nodes=depth, alpha=0.7, beta=0.4)
        assert v.accept_by_depth == pytest.approx([0.7] * depth)
        assert v.expected_tokens == pytest.approx(theory.expected_tokens(0.7, depth))
        assert v.speedup == pytest.approx(v.chain_speedup)


def test_tree_view_numbers():
    v = tree_shape_view(topk=2, depth=4, num_nodes=12, alpha=0.7, beta=0.3, c=0.1, growth=0.02)
    law = rank_law(0.7, 0.3)
    assert law[:3] == pytest.approx([0.7, 0.09, 0.063]) and sum(law) == pytest.approx(1.0)
    assert v.n_nodes == 12 and v.tree.depth == 4
    assert v.accept_by_depth[0] == pytest.approx(0.79)  # the two children of the root: rank 0 or rank 1
    reach_d = [sum(r for r, d in zip(v.reach, v.tree.depths) if d == k) for k in range(5)]
    assert v.expected_tokens == pytest.approx(sum(reach_d)) == pytest.approx(tree_expected_tokens(v.accept_by_depth))
    assert v.ratio == pytest.approx(1 + 0.02 * 12)
    assert v.speedup == pytest.approx(v.expected_tokens / (4 * 0.1 + v.ratio))
    assert v.expected_tokens > v.chain_expected  # the same depth, more guesses


def test_tree_sampled_paths_follow_the_reach_model():
    """Sampled accepted paths (one seed each) average to E[tokens] - 1 drafts: the drawing and the maths agree."""
    n, total = 600, 0
    for seed in range(n):
        v = tree_shape_view(topk=3, depth=3, num_nodes=9, alpha=0.6, beta=0.5, seed=seed)
        total += len(v.path)
        assert all(v.tree.parents[b] == a for a, b in zip([0, *v.path], v.path))
    mean, want = total / n, v.expected_tokens - 1
    assert abs(mean - want) < 4 * 1.0 / n**0.5, (mean, want)


# ------------------------------------------------------------------------------------------------ widgets
def _check_roofline(app):
    v = roofline_view(**app.settings(), n_max=app.n_max)
    d = app.fig_time.data
    assert list(d[0].y) == pytest.approx(v.per_token_ms) and list(d[1].y) == pytest.approx(v.memory_ms)
    assert list(d[2].y) == pytest.approx(v.compute_ms) and d[3].x == (v.n,)
    assert list(app.fig_ratio.data[0].y) == pytest.approx(v.ratio)
    assert app.fig_ratio.data[1].y[0] == pytest.approx(v.ratio[v.n - 1])
    assert f"T({v.n}) / T(1) = {v.ratio[v.n - 1]:.2f}" in app.summary.value


def test_roofline_app_follows_every_control():
    apps = _widgets()
    me = this_machine(20e9, 200e9)
    app = apps.build_roofline_explorer(n_max=300, extra_hardware=[me])
    _check_roofline(app)
    before = list(app.fig_ratio.data[0].y)
    app.n_slider.value = 64
    _check_roofline(app)
    assert app.fig_ratio.data[1].x == (64,) and list(app.fig_ratio.data[0].y) == before
    for control, value in [(app.hardware, "H200"), (app.model, "Llama-3-70B"), (app.precision, "int4"),
                           (app.batch_slider, 32), (app.context_slider, 8192), (app.hardware, "this machine")]:
        old = list(app.fig_time.data[0].y)
        control.value = value
        _check_roofline(app)
        assert list(app.fig_time.data[0].y) != old, control.description
    assert "this machine" in app.summary.value
    app.fig_ratio.data[0].y = [2.0, *app.fig_ratio.data[0].y[1:]]  # a planted wrong value is caught
    with pytest.raises(AssertionError):
        _check_roofline(app)


def _check_speedup(app):
    v = speedup_view(app.alpha_slider.value, app.c_slider.value, app.verify_ratio(), app.k_slider.value, app.k_max)
    ratio = app.verify_ratio()
    r = (lambda n: ratio) if isinstance(ratio, float) else ratio
    want = [theory.speedup(v.alpha, k, v.c, r(k + 1)) for k in v.ks]
    assert list(app.fig_sk.data[0].y) == pytest.approx(want)
    assert app.fig_sk.data[1].x == (theory.best_k(v.alpha, v.c, k_max=app.k_max, verify_ratio=r),)
    assert app.fig_sk.data[2].x == (v.k,) and app.fig_sk.data[2].y[0] == pytest.approx(want[v.k - 1])
    assert list(app.fig_alpha.data[0].y) == pytest.approx(v.best_by_alpha)
    rect = [s for s in app.fig_alpha.layout.shapes if s.type == "rect"][0]
    assert rect.x0 == 0 and rect.x1 == pytest.approx(min(v.c, 1.0))


def test_speedup_app_follows_every_control():
    apps = _widgets()
    data = json.loads((ROOT / "benchmarks" / "results" / "verify_curve.json").read_text())["verify_curve_ms"]["prepacked"]
    curve = {int(n): ms / data["1"] for n, ms in data.items()}
    app = apps.build_speedup_explorer(alpha=0.8, c=0.1, k=4, k_max=12, curves={"measured (CPU)": curve})
    _check_speedup(app)
    assert app.ratio_slider.disabled
    before = list(app.fig_sk.data[0].y)
    app.alpha_slider.value = 0.6
    _check_speedup(app)
    assert all(a < b for a, b in zip(app.fig_sk.data[0].y, before)) and app.fig_alpha.data[1].x == (0.6,)
    app.c_slider.value = 0.7  # alpha < c: shaded, nothing pays
    _check_speedup(app)
    assert max(app.fig_sk.data[0].y) < 1 and "cannot pay" in app.summary.value
    app.c_slider.value = 0.1
    app.k_slider.value = 7
    _check_speedup(app)
    app.verify.value = "constant T(K+1)/T(1) (slider)"
    assert not app.ratio_slider.disabled
    app.ratio_slider.value = 1.5
    _check_speedup(app)
    assert app.fig_sk.data[0].y[0] == pytest.approx(theory.speedup(0.6, 1, 0.1, 1.5))
    app.verify.value = "measured (CPU)"
    _check_speedup(app)
    assert app.fig_sk.data[0].y[2] == pytest.approx(theory.speedup(0.6, 3, 0.1, curve[4]))
    app.fig_sk.data[0].y = [*app.fig_sk.data[0].y[:-1], 9.0]  # planted
    with pytest.raises(AssertionError):
        _check_speedup(app)


def _check_residual(app):
    v = residual_view(*app.weights())
    f = lambda xs: [float(x) for x in xs]  # noqa: E731
    laws, emit = app.fig_laws.data, app.fig_emit.data
    assert [list(t.y) for t in laws] == [f(v.p), f(v.q), f(v.residual)]
    assert list(emit[0].y) == f(v.accepted) and list(emit[1].y) == f(v.rejected_share)
    assert list(emit[1].base) == f(v.accepted) and list(emit[2].y) == f(v.p)
    assert [a + b for a, b in zip(emit[0].y, emit[1].y)] == pytest.approx(f(theory.exact_emit_law(v.p, v.q)))


def test_residual_app_follows_every_slider():
    apps = _widgets()
    app = apps.build_residual_editor()
    _check_residual(app)
    assert "3/5" in app.summary.value and "equal to p" in app.summary.value
    for slider, value in zip(app.controls, [0.1, 0.7, 0.4, 0.9, 0.05, 0.3]):
        before = list(app.fig_emit.data[0].y)
        slider.value = value
        _check_residual(app)
        assert list(app.fig_emit.data[0].y) != before or slider in app.p_sliders
    for s in app.q_sliders:
        s.value = 0.0
    assert "no positive weight" in app.summary.value and "no positive weight" in app.message
    app.q_sliders[1].value = 1.0  # q is one-hot on token 1
    _check_residual(app)
    assert app.view.beta == app.view.p[1]
    app.fig_emit.data[1].y = [0.0, 0.0, 0.0]  # planted: the rejection's share dropped
    with pytest.raises(AssertionError):
        _check_residual(app)


def _check_tree(app):
    v = tree_shape_view(**app.settings())
    nodes = app.fig_tree.data[1]
    assert list(nodes.x) == list(v.tree.depths) and list(nodes.marker.color) == pytest.approx(v.reach)
    assert list(app.fig_tree.data[2].x) == [v.tree.depths[n] for n in [0, *v.path]]
    assert list(app.fig_depth.data[0].y) == pytest.approx(v.accept_by_depth)
    assert f"tree <b>{tree_expected_tokens(v.accept_by_depth):.3f}</b>" in app.summary.value


def test_tree_app_follows_every_slider():
    apps = _widgets()
    app = apps.build_tree_explorer(topk=2, depth=4, num_nodes=12)
    _check_tree(app)
    assert len(app.fig_tree.data[1].x) == 13
    app.nodes_slider.value = 20  # more than top-k 2 and depth 4 can draft: 2 + 3 * 2 * 2 = 14
    _check_tree(app)
    assert len(app.fig_tree.data[1].x) == 15 and "the most top-k 2 and depth 4 can draft" in app.summary.value
    app.nodes_slider.value = 9
    _check_tree(app)
    assert len(app.fig_tree.data[1].x) == 10
    app.topk_slider.value = 1
    _check_tree(app)
    assert len(app.fig_tree.data[1].x) == 5 and list(app.fig_depth.data[0].y) == pytest.approx([0.7] * 4)
    for slider, value in [(app.topk_slider, 3), (app.depth_slider, 6), (app.alpha_slider, 0.5), (app.beta_slider, 0.6),
                          (app.c_slider, 0.2), (app.growth_slider, 0.05), (app.seed_slider, 9)]:
        slider.value = value
        _check_tree(app)
    ratio = 1 + 0.05 * app.view.n_nodes
    assert f"T({app.view.n_nodes + 1})/T(1) = {ratio:.3f}" in app.summary.value
    app.fig_depth.data[0].y = [1.0] * len(app.fig_depth.data[0].y)  # planted
    with pytest.raises(AssertionError):
        _check_tree(app)


def test_static_figures_carry_every_panel():
    apps = _widgets()
    for app in (apps.build_roofline_explorer(n_max=64), apps.build_speedup_explorer(), apps.build_residual_editor(),
                apps.build_tree_explorer()):
        fig = app.static_figure()
        assert len(fig.data) == sum(len(f.data) for f in app.figures)
        assert len(fig.layout.annotations) == len(app.figures)  # the panel titles
        assert "<br>" in fig.layout.title.text and "<b style" not in fig.layout.title.text


BUILDERS = ("build_roofline_explorer(", "build_speedup_explorer(", "build_residual_editor(", "build_tree_explorer(")


@pytest.mark.parametrize("name", ["00_memory_wall", "01_rejection_sampling", "04_tree_verification"])
def test_notebook_app_cells_show_a_static_image(name):
    """Each app is in its notebook, and the cell that displays it also shows a PNG of its state (a reader without a
    kernel sees no widget)."""
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    app_cells = [s for s in cells if any(b in s for b in BUILDERS)]
    assert app_cells, f"no app in notebook {name}"
    for src in app_cells:
        assert "display(" in src and "show_static(" in src and src.startswith("# NBVAL_IGNORE_OUTPUT")
