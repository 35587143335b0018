"""An adaptive token tree: each step's depth and node count chosen from the run's acceptance and the machine's costs.

A fixed tree (:class:`~.hybrid.HybridTree`) pays for the same nodes on every step: on easy text a long chain would
do, on hard text most nodes are rejected and only make the target's forward wider.  :class:`AdaptiveTree` builds a
candidate tree the way EAGLE-2 does (a beam of the ``topk`` most probable frontier nodes, ``topk`` children each,
one draft forward per level), grafts the lookup's continuation, and keeps the n nodes that maximise the expected
emitted tokens per second (SmartSpec's goodput over a tree)::

    rate(n) = (1 + sum of the n best node values) / (draft seconds spent + T(1 + n) + overhead),

where a node's value estimates the chance its whole path is accepted: the product, along the path, of each edge's
acceptance (a draft edge: the run's acceptance for draft probabilities in that bin, with the probability itself as
the prior mean; a lookup edge: the run's acceptance of lookup tokens at that depth).  A child's value never exceeds
its parent's, so the n best nodes form a tree.  A level is drafted only while its expected gain per second beats
the best rate already in hand; n = 0 is a plain step.  T(n) and the draft's cost are the probe's
(:func:`specdec_lesson.drafters.adaptive.measure_step_costs`).

Exactness: every child is a deterministic function of the context (the draft's top-k tokens, the lookup's), siblings
are distinct tokens, and which nodes are kept depends only on the past steps and on draft laws known before the
target scores the tree, never on a token the target draws; so the ``"distinct"`` sibling rule keeps the output law
the target's, as for the fixed trees (``tests/test_tree_adaptive.py`` checks it with the Fraction enumerator).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass

import torch

from ..drafters.adaptive_policy import StepCosts
from ..validate import as_int
from .structure import Expand, TokenTree, _level

__all__ = ["AdaptiveTree", "TreeAcceptance", "best_node_count", "build_adaptive_tree", "describe_choices", "explain_step"]


@dataclass(frozen=True)
class AdaptiveTree:
    """Up to ``depth`` draft levels of beam ``topk`` plus ``lookup_len`` lookup tokens (grafted when the lookup
    finds at least ``min_tokens``), at most ``node_budget`` nodes below the root, sized per step on ``costs``.
    ``acceptance``: what a run starts from (copied; None: a fresh :class:`TreeAcceptance`)."""

    costs: StepCosts
    depth: int = 6
    topk: int = 4
    node_budget: int = 16
    lookup_len: int = 8
    min_tokens: int = 2
    acceptance: TreeAcceptance | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.costs, StepCosts):
            raise ValueError(f"costs must be a StepCosts (drafters.adaptive.measure_step_costs measures one), got "
                             f"{type(self.costs).__name__}")
        for name in ("depth", "topk", "node_budget", "lookup_len"):
            as_int(getattr(self, name), name, lo=1)
        if not isinstance(self.min_tokens, int) or not 1 <= self.min_tokens <= self.lookup_len:
            raise ValueError(f"min_tokens must be an integer in 1..lookup_len ({self.lookup_len}), got {self.min_tokens!r}")
        if self.acceptance is not None and not isinstance(self.acceptance, TreeAcceptance):
            raise ValueError(f"acceptance must be None or a TreeAcceptance, got {type(self.acceptance).__name__}")

    def start(self) -> TreeAcceptance:
        """A run's record: a copy of ``acceptance``, or a fresh one."""
        return TreeAcceptance(self.lookup_len) if self.acceptance is None else self.acceptance.copy()

    @property
    def max_depth(self) -> int:
        return max(self.depth, self.lookup_len)

    @property
    def max_nodes(self) -> int:
        return self.node_budget


class TreeAcceptance:
    """What the run has seen: for draft edges, acceptance per bin of the edge's draft probability q (the prior mean
    is q itself, weight ``prior_weight``); for lookup edges, acceptance per depth (depth 1 shrinks to ``lookup_prior``,
    each deeper depth to the one above; 0.8 was chosen on training prompts (HumanEval 0-81, the math training split,
    templated chat), never on the held-out sets).  Counts are discounted by ``decay`` per step, so they follow the
    text."""

    EDGES = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.97)

    def __init__(self, lookup_len: int, prior_weight: float = 4.0, lookup_prior: float = 0.8, decay: float = 0.98) -> None:
        self.prior_weight, self.lookup_prior, self.decay = prior_weight, lookup_prior, decay
        nb = len(self.EDGES) + 1
        self.bin_acc, self.bin_seen, self.bin_q = [0.0] * nb, [0.0] * nb, [0.0] * nb
        self.lk_acc, self.lk_seen = [0.0] * lookup_len, [0.0] * lookup_len
        self.top_acc, self.top_seen = 0.0, 0.0  # the draft's most probable child, whatever its q

    def copy(self) -> TreeAcceptance:
        new = object.__new__(type(self))
        new.__dict__ = {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}
        return new

    def top(self) -> float:
        """Estimated acceptance of the draft's most probable child (prior 0.5, weight 2): a level's worth before
        it is drafted."""
        return (self.top_acc + 1.0) / (self.top_seen + 2.0)

    def draft(self, q: float) -> float:
        """Estimated acceptance of a draft child of probability ``q`` (its parent accepted): q plus its bin's observed
        excess of acceptance over the bin's probabilities, shrunk towards 0 by the prior weight (a calibrated draft
        keeps q; one that is accepted less often than it claims is marked down)."""
        b = bisect_right(self.EDGES, q)
        excess = (self.bin_acc[b] - self.bin_q[b]) / (self.bin_seen[b] + self.prior_weight)
        return min(1.0, max(0.0, q + excess))

    def lookup(self, depth: int) -> float:
        """Estimated acceptance of a lookup token at ``depth`` (1-based) whose parent was accepted."""
        mean = self.lookup_prior
        for j in range(min(depth, len(self.lk_acc))):
            mean = (self.lk_acc[j] + 2.0 * mean) / (self.lk_seen[j] + 2.0)
        return mean

    def update(self, tree: TokenTree, path: list[int]) -> None:
        """One verified step: every child of an accepted node (the root included) was tried."""
        for lst in (self.bin_acc, self.bin_seen, self.bin_q, self.lk_acc, self.lk_seen):
            lst[:] = [x * self.decay for x in lst]
        self.top_acc, self.top_seen = self.top_acc * self.decay, self.top_seen * self.decay
        on_path = set(path)
        for u in [0] + list(path):
            for c in tree.children[u]:
                ok = float(c in on_path)
                q, lk = tree.edge_q.get(c), tree.edge_lookup.get(c)
                if q is not None:
                    b = bisect_right(self.EDGES, q)
                    self.bin_acc[b] += ok
                    self.bin_seen[b] += 1.0
                    self.bin_q[b] += q
                    if tree.edge_rank.get(c) == 0:
                        self.top_acc += ok
                        self.top_seen += 1.0
                if lk is not None and lk <= len(self.lk_acc):
                    self.lk_acc[lk - 1] += ok
                    self.lk_seen[lk - 1] += 1.0


def _values(tree: TokenTree, acc: TreeAcceptance) -> list[float]:
    """Each node's estimated chance that its path is accepted (parents precede children)."""
    val = [1.0] * tree.size
    for v in range(1, tree.size):
        q, lk = tree.edge_q.get(v), tree.edge_lookup.get(v)
        p = max(acc.draft(q) if q is not None else 0.0, acc.lookup(lk) if lk is not None else 0.0)
        val[v] = val[tree.parents[v]] * p
    return val


def best_node_count(values: list[float], costs: StepCosts, spent: float = 0.0, cap: int | None = None) -> tuple[int, float]:
    """``(n, rate)``: how many of the nodes whose ``values`` are given (best first) to verify, n in 0..``cap``
    (default all), maximising the expected tokens per second (1 + the n values' sum) / (``spent`` + T(1 + n) +
    overhead): the root is always scored, and every step emits one token of the target's own besides the accepted
    nodes.  Ties go to the smaller n."""
    rates = _rates(values, costs, spent, cap)
    best = _best(rates)
    return best, rates[best]


def _best(rates: list[float]) -> int:
    return max(range(len(rates)), key=lambda n: (rates[n], -n))  # ties: the smaller n


def _rates(values: list[float], costs: StepCosts, spent: float, cap: int | None) -> list[float]:
    """The expected tokens per second of verifying the n best nodes, for n = 0..min(cap, len(values))."""
    cap = len(values) if cap is None else min(cap, len(values))
    rates, total = [1.0 / (spent + costs.T(1) + costs.overhead)], 1.0
    for n, v in enumerate(values[:cap], start=1):
        total += v
        rates.append(total / (spent + costs.T(1 + n) + costs.overhead))
    return rates


def build_adaptive_tree(spec: AdaptiveTree, root_token: int, expand: Expand, chain: list[int], acc: TreeAcceptance,
                        log: Counter | None = None) -> TokenTree:
    """The tree ``spec`` drafts below ``root_token`` given what the run has seen (``acc``); ``chain``: the lookup's
    continuation.  ``log`` (optional) counts the chosen (depth, nodes).  The tree's ``why`` holds the numbers behind
    the choice (:func:`explain_step` words them)."""
    costs = spec.costs
    tree = TokenTree(root_token, "distinct")
    tree.edge_q, tree.edge_lookup, tree.edge_rank = {}, {}, {}
    chain = [int(t) for t in chain[: spec.lookup_len]]
    if len(chain) >= spec.min_tokens:  # the lookup's tokens first: a level's gain is then judged beside them
        for j, v in enumerate(tree.graft(chain), start=1):
            tree.edge_lookup[v] = j
    frontier, spent = [0], costs.draft_first  # the root's law: paid whatever the tree
    val: list[float] = []  # the nodes' values, set after each level is drafted
    stopped: tuple | None = None  # why no further level was drafted: (gain, seconds more) of the level refused
    levels = 0
    for level in range(spec.depth):
        if level > 0:  # each level below the root's children costs one more draft forward
            order = sorted(range(1, tree.size), key=lambda v: (-val[v], tree.depths[v], v))
            n, rate = best_node_count([val[v] for v in order], costs, spent, spec.node_budget)
            step = costs.draft_next
            # the next level's worth before it is drafted: below each frontier node, the draft's best child where
            # the children already there (the lookup's) leave room
            gain = sum(max(0.0, val[u] * acc.top() - sum(val[c] for c in tree.children[u])) for u in frontier)
            more = costs.T(1 + min(n + spec.topk, spec.node_budget)) - costs.T(1 + n)
            if gain <= 0 or (1 + sum(val[v] for v in order[:n]) + gain) / (spent + step + costs.T(1 + n) + more
                                                                          + costs.overhead) <= rate:
                stopped = (gain, step + more)
                break
            spent += step
        levels += 1
        logits, ids = _level(expand(tree, frontier))  # [F, V] or [F, N] (-inf elsewhere)
        q = torch.softmax(logits.double(), dim=-1)  # [F, V or N]
        top = q.topk(min(spec.topk, q.shape[-1]), dim=-1)  # [F, topk]
        toks_of = top.indices if ids is None else ids[top.indices]  # [F, topk] vocabulary ids
        new = []
        for u, toks, ps in zip(frontier, toks_of.tolist(), top.values.tolist()):
            for rank, (t, p) in enumerate(zip(toks, ps)):
                c = next((c for c in tree.children[u] if tree.tokens[c] == t), None)
                if c is None:
                    c = tree.add(t, u)
                tree.edge_q[c], tree.edge_rank[c] = p, rank
                new.append(c)
        val = _values(tree, acc)  # the tree as it now stands: read by the next level's test and by the final cut
        frontier = sorted(new, key=lambda v: (-val[v], v))[: spec.topk]  # the beam: best path values
    order = sorted(range(1, tree.size), key=lambda v: (-val[v], tree.depths[v], v))
    values = [val[v] for v in order]
    rates = _rates(values, costs, spent, spec.node_budget)
    n = _best(rates)  # best_node_count's choice
    kept = tree.prune(order[:n])
    m = n or max(range(1, len(rates)), key=rates.__getitem__, default=0)  # a plain step: the best tree it refused
    kept.why = dict(levels=levels, drafted=tree.size - 1, n=n, m=m, expected=1 + sum(values[:m]), spent=spent,
                    T=costs.T(1 + m), overhead=costs.overhead, plain=rates[0], rate=rates[n], stopped=stopped)
    old = list(kept.source)
    where = {s: v for v, s in enumerate(tree.source)}
    kept.edge_q = {i: tree.edge_q[where[s]] for i, s in enumerate(old) if where[s] in tree.edge_q}
    kept.edge_lookup = {i: tree.edge_lookup[where[s]] for i, s in enumerate(old) if where[s] in tree.edge_lookup}
    kept.edge_rank = {i: tree.edge_rank[where[s]] for i, s in enumerate(old) if where[s] in tree.edge_rank}
    if log is not None:
        log[(kept.depth, kept.size - 1)] += 1
    kept.lookup_nodes = {v for v in kept.edge_lookup if v not in kept.edge_q}
    return kept


def explain_step(why: dict) -> str:
    """One step's choice in words, from a tree's ``why`` (:func:`build_adaptive_tree`)."""
    w, ms = why, lambda x: f"{1e3 * x:.1f} ms"  # noqa: E731
    secs = w["spent"] + w["T"] + w["overhead"]
    nodes = f"{w['m']} node{'s' if w['m'] != 1 else ''}"
    tree = (f"{nodes}: {w['expected']:.2f} expected tokens in {ms(secs)} (drafting {ms(w['spent'])}, "
            f"T({w['m'] + 1}) {ms(w['T'])}, overhead {ms(w['overhead'])}) = {w['expected'] / secs:.0f} tokens/s")
    plain = f"{w['plain']:.0f} tokens/s for the root alone (1 token in {ms(1 / w['plain'])})"
    if w["n"] == 0:
        if not w["m"]:
            return f"no node: nothing was drafted beside the root ({plain})"
        return f"no node: the best tree, {tree}, is slower than {plain}"
    drafted = f"{w['levels']} draft level{'s' if w['levels'] != 1 else ''}"
    if w["stopped"] is None:
        deeper = f"{drafted}, the most allowed"
    elif w["stopped"][0] <= 0:
        deeper = f"{drafted}; another could add nothing"
    else:
        deeper = (f"{drafted}; another would add {w['stopped'][0]:.2f} expected tokens for {ms(w['stopped'][1])} "
                  f"more, below the rate in hand")
    return f"kept {w['n']} of {w['drafted']} drafted nodes ({deeper}): {tree}, against {plain}"


def describe_choices(choices: Counter) -> str:
    """What an adaptive tree chose, from ``HybridTreeDrafter.choices`` ({(depth, nodes): steps}): the steps, the
    nodes kept per step (median and range), the plain steps (no node) and the most frequent shapes."""
    steps = sum(choices.values())
    if not steps:
        return "no step yet"
    nodes = sorted(n for (_, n), c in choices.items() for _ in range(c))
    plain = sum(c for (_, n), c in choices.items() if n == 0)
    common = ", ".join(f"{n} nodes to depth {d} ({c} steps)" for (d, n), c in choices.most_common(3))
    return (f"{steps} steps, nodes kept per step median {nodes[len(nodes) // 2]} (range {nodes[0]}-{nodes[-1]}), "
            f"{plain} plain steps; most often {common}")
