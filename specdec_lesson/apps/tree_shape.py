"""Notebook 04's tree-shape explorer: an EAGLE-2 dynamic tree (:class:`specdec_lesson.tree.DynamicTree`: ``topk``
children per expanded node, ``depth`` levels, a budget of ``num_nodes`` draft nodes) drafted by a toy draft whose law
is the same at every node, the accepted path of one sampled verification, and what the shape buys.

The acceptance model (greedy verification, context-free): the target's next token is the draft's rank-i token with
probability ``rank_law[i]``: ``alpha`` for rank 0, then each further rank catches a share ``beta`` of what is left,
p_i = (1 - alpha) beta (1 - beta)^(i-1).  A node is on the accepted path with probability reach(v) = the product of
p_rank along its path, so the chance that the path reaches depth d is R_d = sum of reach over depth d, the
per-depth acceptance a_d = R_d / R_(d-1) (what :func:`specdec_lesson.sim.tree_expected_tokens` takes) and
E[tokens] = 1 + sum_d R_d.  With topk = 1 the tree is a chain and a_d = alpha.  The draft's scores are the log p_rank,
so EAGLE-2's choice of nodes (highest cumulative draft probability) is the choice of the likeliest nodes.

:func:`tree_shape_view` is the pure part; :func:`build_tree_explorer` the widget::

    app = build_tree_explorer()
    app.topk_slider.value = 3
    app.fig_tree.data[1].x        # the nodes' depths
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import SamplingConfig
from ..sim.model import tree_expected_tokens, tree_speedup
from ..theory import expected_tokens, speedup
from ..tree.structure import DynamicTree, TokenTree, build_tree
from ..validate import as_int, as_real
from .controls import MARGIN, App, figure_widget, float_slider, int_slider, ui_modules

__all__ = ["rank_law", "TreeView", "tree_shape_view", "TreeExplorer", "build_tree_explorer"]

VOCAB = 64  # the toy draft's vocabulary: token id = rank under the draft
MAX_DEPTH = 8


def rank_law(alpha: float, beta: float, size: int = VOCAB) -> list[float]:
    """P(the target's token is the draft's rank-i token), i < ``size``; the tail beyond goes to the last rank."""
    alpha = as_real(alpha, "alpha", lo=0.0, hi=1.0, lo_open=True)
    beta = as_real(beta, "beta", lo=0.0, hi=1.0, lo_open=True)
    size = as_int(size, "size", lo=2)
    law = [alpha] + [(1 - alpha) * beta * (1 - beta) ** (i - 1) for i in range(1, size - 1)]
    return law + [max(0.0, 1.0 - sum(law))]


@dataclass(frozen=True)
class TreeView:
    """``tree``: the drafted :class:`TokenTree` (token = rank); ``reach[v]``: P(accepted path reaches v);
    ``accept_by_depth[d-1]`` = a_d; ``path``: the sampled accepted node ids (root excluded), from the target's draws
    ``target_ranks`` (one per depth, fixed by ``seed`` whatever the shape); ``x``/``y``: the drawing's coordinates;
    ``ratio``: T(nodes + 1)/T(1) = 1 + growth * nodes."""

    tree: TokenTree
    reach: list[float]
    accept_by_depth: list[float]
    expected_tokens: float
    speedup: float
    chain_expected: float
    chain_speedup: float
    ratio: float
    path: list[int]
    target_ranks: list[int]
    x: list[int]
    y: list[float]

    @property
    def n_nodes(self) -> int:
        return self.tree.size - 1


def _layout(tree: TokenTree) -> list[float]:
    """Leaves on successive rows in depth-first order, a parent at the mean of its children."""
    y: dict[int, float] = {}
    nxt = [0]

    def place(v: int) -> None:
        for c in tree.children[v]:
            place(c)
        if tree.children[v]:
            y[v] = sum(y[c] for c in tree.children[v]) / len(tree.children[v])
        else:
            y[v], nxt[0] = float(-nxt[0]), nxt[0] + 1  # rank #0 on top

    place(0)
    return [y[v] for v in range(tree.size)]


def tree_shape_view(topk: int = 2, depth: int = 4, num_nodes: int = 12, alpha: float = 0.7, beta: float = 0.3,
                    c: float = 0.1, growth: float = 0.0, seed: int = 4) -> TreeView:
    """The tree, its acceptance and speedup, and one sampled accepted path (see :class:`TreeView`).  ``c``: one draft
    pass per level against one plain target step; ``growth``: the verify cost's slope, T(n)/T(1) = 1 + growth (n - 1)."""
    topk, depth = as_int(topk, "topk", lo=1, hi=VOCAB), as_int(depth, "depth", lo=1, hi=MAX_DEPTH)
    num_nodes, seed = as_int(num_nodes, "num_nodes", lo=1), as_int(seed, "seed", lo=0)
    c, growth = as_real(c, "c", lo=0.0), as_real(growth, "growth", lo=0.0)
    law = rank_law(alpha, beta)
    logits = torch.tensor([math.log(p) if p > 0 else -math.inf for p in law], dtype=torch.float64)  # [V]
    tree = build_tree(DynamicTree(depth=depth, topk=topk, num_nodes=num_nodes), 0,
                      lambda t, nodes: logits.expand(len(nodes), VOCAB), SamplingConfig())  # [F, V] the same law everywhere
    reach = [1.0]
    for v in range(1, tree.size):
        reach.append(reach[tree.parents[v]] * law[tree.tokens[v]])
    per_depth = [sum(r for r, d in zip(reach, tree.depths) if d == k) for k in range(tree.depth + 1)]  # R_0 = 1, R_1, ...
    accept = [per_depth[k] / per_depth[k - 1] for k in range(1, len(per_depth))]
    ratio = lambda n: 1.0 + growth * (n - 1)  # noqa: E731
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(MAX_DEPTH, generator=gen, dtype=torch.float64)  # [D] one uniform per depth
    cdf = torch.tensor(law, dtype=torch.float64).cumsum(0)  # [V]
    ranks = torch.searchsorted(cdf, u, right=True).clamp(max=VOCAB - 1)  # [D] the target's token (a rank) per depth
    path, v = [], 0
    for r in ranks.tolist():
        v = next((ch for ch in tree.children[v] if tree.tokens[ch] == r), None)
        if v is None:
            break
        path.append(v)
    k_chain = tree.depth
    return TreeView(tree=tree, reach=reach, accept_by_depth=accept, expected_tokens=tree_expected_tokens(accept),
                    speedup=tree_speedup(accept, tree.size - 1, c, ratio),
                    chain_expected=expected_tokens(alpha, k_chain),
                    chain_speedup=speedup(alpha, k_chain, c, ratio(k_chain + 1)), ratio=ratio(tree.size),
                    path=path, target_ranks=ranks.tolist(), x=list(tree.depths), y=_layout(tree))


class TreeExplorer(App):
    """Controls: ``topk_slider``, ``depth_slider``, ``nodes_slider`` (the node budget), ``alpha_slider``,
    ``beta_slider``, ``c_slider``, ``growth_slider``, ``seed_slider``.  Figures: ``fig_tree`` (edges, nodes coloured
    by reach, the accepted path) and ``fig_depth`` (a_d of the tree against the chain's alpha)."""

    def __init__(self, topk: int = 2, depth: int = 4, num_nodes: int = 12, alpha: float = 0.7, beta: float = 0.3,
                 c: float = 0.1, growth: float = 0.0, seed: int = 4):
        widgets, _ = ui_modules()
        self.topk_slider = int_slider("top-k (branching)", topk, 1, 6)
        self.depth_slider = int_slider("depth (levels)", depth, 1, MAX_DEPTH)
        self.nodes_slider = int_slider("node budget", num_nodes, 1, 64)
        self.alpha_slider = float_slider("alpha (top-1 accepted)", alpha, 0.05, 0.95)
        self.beta_slider = float_slider("beta (next ranks)", beta, 0.05, 0.95)
        self.c_slider = float_slider("c (draft pass / T(1))", c, 0.0, 0.5)
        self.growth_slider = float_slider("verify growth per node", growth, 0.0, 0.1, 0.005, ".3f")
        self.seed_slider = int_slider("sample (seed)", seed, 0, 50)
        self.controls = [self.topk_slider, self.depth_slider, self.nodes_slider, self.alpha_slider, self.beta_slider,
                         self.c_slider, self.growth_slider, self.seed_slider]
        self.summary = widgets.HTML(layout=widgets.Layout(width="520px"))
        self.fig_tree = figure_widget(
            [{"type": "scatter", "name": "edges", "mode": "lines", "line": {"color": "#bab0ac", "width": 1.5},
              "hoverinfo": "skip"},
             {"type": "scatter", "name": "nodes", "mode": "markers+text", "textposition": "middle right",
              "marker": {"size": 14, "colorscale": "Blues", "cmin": 0, "cmax": 1, "line": {"color": "#4c78a8", "width": 1}}},
             {"type": "scatter", "name": "accepted path", "mode": "lines+markers",
              "line": {"color": "#e45756", "width": 4}, "marker": {"size": 9, "color": "#e45756"}}],
            "draft tree (#rank; darker: likelier accepted), a sampled path",
            xaxis={"title": {"text": "depth"}, "dtick": 1}, yaxis={"visible": False}, showlegend=False, height=420,
            width=530, margin={**MARGIN, "b": 50})
        self.fig_depth = figure_widget(
            [{"type": "bar", "name": "tree: a_d", "marker": {"color": "#4c78a8"}},
             {"type": "scatter", "name": "chain: alpha", "mode": "lines+markers", "line": {"color": "#f58518", "dash": "dash"}}],
            "acceptance per depth a_d = R_d / R_(d-1)", xaxis={"title": {"text": "depth d"}, "dtick": 1},
            yaxis={"title": {"text": "P(reach d | reached d - 1)"}, "range": [0, 1]}, height=420, width=370)
        self.figures = [self.fig_tree, self.fig_depth]
        self._finish()

    def settings(self) -> dict:
        return {"topk": self.topk_slider.value, "depth": self.depth_slider.value, "num_nodes": self.nodes_slider.value,
                "alpha": self.alpha_slider.value, "beta": self.beta_slider.value, "c": self.c_slider.value,
                "growth": self.growth_slider.value, "seed": self.seed_slider.value}

    def update(self) -> None:
        v = self.view = tree_shape_view(**self.settings())
        t = v.tree
        ex, ey = [], []
        for node in range(1, t.size):
            p = t.parents[node]
            ex += [v.x[p], v.x[node], None]
            ey += [v.y[p], v.y[node], None]
        way = [0, *v.path]
        with self.fig_tree.batch_update():
            self.fig_tree.data[0].update(x=ex, y=ey)
            self.fig_tree.data[1].update(x=v.x, y=v.y, marker={"color": v.reach},
                                         text=["root"] + [f"#{t.tokens[n]}" for n in range(1, t.size)],
                                         hovertext=[f"node {n}: reach {r:.3f}" for n, r in enumerate(v.reach)])
            self.fig_tree.data[2].update(x=[v.x[n] for n in way], y=[v.y[n] for n in way])
        ds = list(range(1, len(v.accept_by_depth) + 1))
        with self.fig_depth.batch_update():
            self.fig_depth.data[0].update(x=ds, y=v.accept_by_depth)
            self.fig_depth.data[1].update(x=ds, y=[self.alpha_slider.value] * len(ds))
        gain = v.speedup / v.chain_speedup
        s = self.settings()
        cap = f" (the most top-k {s['topk']} and depth {s['depth']} can draft)" if v.n_nodes < s["num_nodes"] else ""
        self.summary.value = (
            f"{v.n_nodes} draft nodes{cap}, depth {t.depth}; verify T({t.size})/T(1) = {v.ratio:.3f}<br>"
            f"E[tokens per step]: tree <b>{v.expected_tokens:.3f}</b>, chain of K = {t.depth}: {v.chain_expected:.3f}<br>"
            f"speedup: tree <b>{v.speedup:.3f}x</b>, chain {v.chain_speedup:.3f}x (tree / chain = {gain:.2f})<br>"
            f"this sample: the target picks ranks {v.target_ranks[:t.depth]}, "
            f"{len(v.path)} drafts accepted, {len(v.path) + 1} tokens emitted")


def build_tree_explorer(**kwargs) -> TreeExplorer:
    """The tree-shape explorer; display it with ``display(app.ui)``.  Keyword arguments: see :class:`TreeExplorer`."""
    return TreeExplorer(**kwargs)
