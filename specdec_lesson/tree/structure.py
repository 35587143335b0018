"""Token trees: their structure, construction from a draft, and tree attention masks.

A chain drafts one continuation; a tree drafts several, sharing prefixes, and the target
scores every node in ONE forward: the nodes are flattened (breadth first, node 0 = the root =
the pending token) into tokens, parent indices and depths; node i's position is the root's
position + depth(i), and node i attends to the whole cached prefix and to its own ancestors
(and itself) only - the *tree attention mask*.  Verification (:mod:`specdec_lesson.tree.verify`)
accepts one root-to-node path and draws the next token; the accepted path's KV entries are
then moved to contiguous slots (:meth:`specdec_lesson.kvcache.SlotCache.compact`) and the rest
is dropped, in the target's and the draft's cache.

Two shapes (both built level by level, one draft forward per level):

* :class:`StaticTree` - a fixed branching per depth, e.g. ``(4, 2, 2, 1)``; children either
  sampled i.i.d. from q (``children="sample"``, sibling rule ``"iid"``) or the top-b tokens of
  the draft (``children="topk"``, rule ``"distinct"``);
* :class:`DynamicTree` - EAGLE-2 (Li et al. 2024): expand the ``topk`` frontier nodes with the
  highest cumulative draft probability, ``topk`` children each, for ``depth`` levels, then keep
  the best ``num_nodes`` nodes (rule ``"distinct"``).

:func:`specdec_lesson.tree.generate.tree_generate` runs the whole loop on Hugging Face models (batch size 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..sampling import SamplingConfig, SubsetLogits, as_float, check_logits

__all__ = ["TokenTree", "StaticTree", "DynamicTree", "build_tree", "tree_mask", "Expand", "expand_of"]

Expand = Callable[["TokenTree", list[int]], "torch.Tensor | SubsetLogits"]  # (tree, node ids) -> draft logits [n, V]


def expand_of(drafter) -> Expand:
    """The drafter's tree expansion, on its output subset when it has one (``tree_expand_subset``)."""
    return getattr(drafter, "tree_expand_subset", None) or drafter.tree_expand


def _level(out) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An expansion's logits ``[n, N]`` (fp32 or fp64) and the vocabulary ids of their columns (None: all of them)."""
    if isinstance(out, SubsetLogits):
        return as_float(out.values), out.ids
    return as_float(out), None


class TokenTree:
    """A flattened token tree: ``tokens``, ``parents`` (-1 for the root) and ``depths``, breadth
    first (a parent always precedes its children); ``children[v]`` in the order they are tried.

    ``draft_probs[v]``: the law v's children were drawn from (needed by the ``"iid"`` rule);
    ``scores[v]``: cumulative draft log-probability; ``source[v]``: v's id while it was built
    (before pruning); ``rule``: the sibling rule its children call for."""

    def __init__(self, root_token: int, rule: str = "distinct") -> None:
        self.tokens, self.parents, self.depths = [int(root_token)], [-1], [0]
        self.children: list[list[int]] = [[]]
        self.scores, self.source = [0.0], [0]
        self.draft_probs: dict = {}
        self.rule = rule

    @property
    def size(self) -> int:
        """Number of nodes, root included (the target scores all of them)."""
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths)

    def add(self, token: int, parent: int, score: float = 0.0) -> int:
        v = self.size
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])
        self.children[parent].append(v)
        self.scores.append(score)
        self.source.append(v)
        return v

    def graft(self, tokens: list[int]) -> list[int]:
        """Add the chain ``tokens`` below the root, sharing the nodes whose path it already follows; returns the
        chain's node ids.  New nodes go last (a parent still precedes its children; the order is no longer breadth
        first) and get fresh ``source`` ids.  Siblings stay distinct tokens, so the ``"distinct"`` rule applies;
        a tree of i.i.d. children (rule ``"iid"``) cannot take a deterministic chain (ValueError)."""
        if self.rule != "distinct":
            raise ValueError(f"a chain can be grafted only onto a tree of deterministic children (rule 'distinct'), "
                             f"this one has rule {self.rule!r}: build the draft part with children='topk' or a DynamicTree")
        v, ids = 0, []
        for t in tokens:
            match = next((c for c in self.children[v] if self.tokens[c] == int(t)), None)
            if match is None:
                fresh = max(self.source) + 1
                match = self.add(t, v, self.scores[v])
                self.source[match] = fresh
            ids.append(match)
            v = match
        return ids

    def ancestors(self, v: int) -> list[int]:
        """Node ids from the root's child down to v (v included, root excluded)."""
        out = []
        while v > 0:
            out.append(v)
            v = self.parents[v]
        return out[::-1]

    def path_tokens(self, v: int) -> list[int]:
        return [self.tokens[a] for a in self.ancestors(v)]

    def flatten(self, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens [N], parents [N], depths [N])`` as LongTensors."""
        return tuple(torch.tensor(x, dtype=torch.long, device=device) for x in (self.tokens, self.parents, self.depths))

    def positions(self, root_position: int, device=None) -> torch.Tensor:
        return root_position + torch.tensor(self.depths, dtype=torch.long, device=device)  # [N]

    def mask(self, device=None) -> torch.Tensor:
        return tree_mask(torch.tensor(self.parents, dtype=torch.long), device)

    def copy(self) -> TokenTree:
        t = TokenTree(self.tokens[0], self.rule)
        t.tokens, t.parents, t.depths = list(self.tokens), list(self.parents), list(self.depths)
        t.children = [list(c) for c in self.children]
        t.scores, t.source, t.draft_probs = list(self.scores), list(self.source), dict(self.draft_probs)
        return t

    def prune(self, keep) -> TokenTree:
        """The subtree of the nodes in ``keep`` and all their ancestors, order preserved."""
        kept = {0}
        for v in keep:
            kept.update(self.ancestors(v))
        old = sorted(kept)
        new_id = {v: i for i, v in enumerate(old)}
        t = TokenTree(self.tokens[0], self.rule)
        for v in old[1:]:
            t.add(self.tokens[v], new_id[self.parents[v]], self.scores[v])
        t.source = [self.source[v] for v in old]
        t.draft_probs = {new_id[v]: q for v, q in self.draft_probs.items() if v in new_id}
        return t


def tree_mask(parents: torch.Tensor, device=None) -> torch.Tensor:
    """Ancestor-or-self mask ``[N, N]`` bool: ``mask[i, j]`` is True when node j is node i or
    one of its ancestors (parents precede children; ``parents[0] == -1``)."""
    par = parents.tolist()
    N = len(par)
    mask = torch.eye(N, dtype=torch.bool)  # [N, N]
    for i in range(1, N):
        if not 0 <= par[i] < i:
            raise ValueError(f"parents must precede children (parents[{i}] = {par[i]})")
        mask[i] |= mask[par[i]]  # my ancestors are my parent's ancestors and my parent
    return mask.to(device)


@dataclass(frozen=True)
class StaticTree:
    """Fixed branching per depth, e.g. ``(4, 2, 2, 1)``: 4 + 8 + 16 + 16 = 44 draft nodes.

    ``children="sample"``: each node's children are drawn i.i.d. from the draft's sampling law q
    (sibling rule ``"iid"``); ``"topk"``: the top-b tokens of the draft (rule ``"distinct"``).
    Greedy runs (temperature 0) always use ``"topk"`` (i.i.d. draws from a one-hot q would all
    be the same token)."""

    branching: tuple[int, ...] = (4, 2, 2, 1)
    children: str = "topk"

    def __post_init__(self) -> None:
        if not self.branching or any(not isinstance(b, int) or b < 1 for b in self.branching):
            raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {self.branching!r}")
        if self.children not in ("sample", "topk"):
            raise ValueError(f"children must be 'sample' or 'topk', got {self.children!r}")

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    @property
    def max_nodes(self) -> int:
        total, width = 0, 1
        for b in self.branching:
            width *= b
            total += width
        return total


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic tree: ``depth`` levels, beam ``topk``, ``num_nodes`` draft nodes kept."""

    depth: int = 5
    topk: int = 4
    num_nodes: int = 24

    def __post_init__(self) -> None:
        if min(self.depth, self.topk, self.num_nodes) < 1:
            raise ValueError(f"depth, topk and num_nodes must be >= 1, got {self}")

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_nodes(self) -> int:
        return self.num_nodes


def build_tree(spec, root_token: int, expand: Expand, sampling: SamplingConfig,
               generator: torch.Generator | None = None) -> TokenTree:
    """Draft a tree of shape ``spec`` below ``root_token``, one ``expand`` call per level.

    ``expand(tree, nodes)`` returns the draft's logits ``[len(nodes), V]`` after each node, or a
    :class:`~specdec_lesson.sampling.SubsetLogits` (-inf outside its ids: the same tree, built over N columns)
    (it may feed the nodes to a draft model with the tree mask)."""
    if isinstance(spec, StaticTree):
        return _build_static(spec, root_token, expand, sampling, generator)
    if isinstance(spec, DynamicTree):
        return _build_dynamic(spec, root_token, expand)
    raise ValueError(f"tree must be a StaticTree or a DynamicTree, got {type(spec).__name__}")


def _build_static(spec: StaticTree, root: int, expand: Expand, sampling: SamplingConfig, generator) -> TokenTree:
    iid = spec.children == "sample" and not sampling.greedy
    tree = TokenTree(root, "iid" if iid else "distinct")
    frontier = [0]
    for b in spec.branching:
        out = expand(tree, frontier)
        if isinstance(out, SubsetLogits) and not sampling.greedy:
            out = out.full()  # the laws q are full-vocabulary
        logits, ids = _level(out)  # [F, V] or [F, N]
        if sampling.greedy:
            check_logits(logits)  # NaN logits raise (top-k would pick garbage)
        else:
            q = sampling.probs(logits)  # [F, V] the draft's sampling law at each frontier node (NaN logits raise)
            tree.draft_probs.update({v: q[i] for i, v in enumerate(frontier)})
        if iid:
            toks = torch.multinomial(q, b, replacement=True, generator=generator)  # [F, b] i.i.d. from q
        else:
            toks = logits.topk(min(b, logits.shape[-1]), dim=-1).indices  # [F, b] distinct
            toks = toks if ids is None else ids[toks]
        frontier = [tree.add(t, v) for v, row in zip(frontier, toks.tolist()) for t in row]
    return tree


def _build_dynamic(spec: DynamicTree, root: int, expand: Expand) -> TokenTree:
    tree = TokenTree(root, "distinct")
    frontier = [0]
    for _ in range(spec.depth):
        logits, ids = _level(expand(tree, frontier))  # [F, V] or [F, N] (-inf elsewhere: the same log-softmax)
        check_logits(logits)  # NaN logits raise
        logq = torch.log_softmax(logits.double(), dim=-1)  # [F, V or N]
        top = logq.topk(min(spec.topk, logq.shape[-1]), dim=-1)  # [F, topk]
        toks_of = top.indices if ids is None else ids[top.indices]  # [F, topk] vocabulary ids
        new = []
        for v, toks, lps in zip(frontier, toks_of.tolist(), top.values.tolist()):
            new += [tree.add(t, v, tree.scores[v] + lp) for t, lp in zip(toks, lps)]
        frontier = sorted(new, key=lambda v: (-tree.scores[v], v))[: spec.topk]  # beam: best cumulative scores
    best = sorted(range(1, tree.size), key=lambda v: (-tree.scores[v], v))[: spec.num_nodes]
    return tree.prune(best)  # a child never outscores its parent, so the best nodes form a tree
