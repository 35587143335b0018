"""Exact (Fraction) and Monte Carlo laws of tree speculative decoding on toy Markov models."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from itertools import product

import torch

from ..drafters.lookup import PromptLookupDrafter
from ..sampling import SamplingConfig
from ..toy import compose_steps, process_law
from .adaptive import AdaptiveTree, build_adaptive_tree
from .hybrid import HybridTree, build_hybrid_tree
from .structure import StaticTree, TokenTree, build_tree
from .verify import tree_outcome_law, verify_tree, verify_tree_greedy

__all__ = ["tree_step_law", "tree_joint", "sample_tree_toy"]


# ------------------------------------------------------------------ toy Markov models (exact and Monte Carlo)
TOY_LOOKUP = PromptLookupDrafter(max_ngram=2, min_ngram=1)  # a HybridTree's lookup on toy contexts (deterministic)


def _build(spec, context: Sequence[int], draft, sampling: SamplingConfig, generator=None) -> TokenTree:
    """The library's own builder below ``context``; a :class:`HybridTree` grafts ``TOY_LOOKUP``'s continuation, an
    :class:`AdaptiveTree` is sized from its ``acceptance`` record (the same record at every step)."""
    expand = _toy_expand(draft, context)
    if isinstance(spec, AdaptiveTree):
        chain = TOY_LOOKUP.continuation(list(context), spec.lookup_len)
        return build_adaptive_tree(spec, context[-1], expand, chain, spec.start())
    if isinstance(spec, HybridTree):
        chain = TOY_LOOKUP.continuation(list(context), spec.lookup_len)
        return build_hybrid_tree(spec, context[-1], expand, chain, sampling, generator)
    return build_tree(spec, context[-1], expand, sampling, generator)



def _toy_expand(draft, context: Sequence[int]) -> Callable:
    """``expand(tree, nodes)`` for a :class:`specdec_lesson.toy.MarkovLM` draft below ``context``."""
    def expand(tree, nodes: list[int]) -> torch.Tensor:
        ctx = [(list(context) + tree.path_tokens(v))[-draft.order:] for v in nodes]
        return draft.logits(torch.tensor(ctx, dtype=torch.long))  # [n, V]
    return expand


def _iid_trees(spec, context: tuple[int, ...], draft, proc: Callable) -> list:
    """Every i.i.d.-sampled static tree below ``context`` with its exact probability."""
    level = [(TokenTree(context[-1], "iid"), [0], Fraction(1))]
    for b in spec.branching:
        nxt = []
        for tree, frontier, w in level:
            qs = {v: proc(draft.next_law(context + tuple(tree.path_tokens(v)))) for v in frontier}
            slots = [v for v in frontier for _ in range(b)]
            for combo in product(*[[t for t, qt in enumerate(qs[v]) if qt] for v in slots]):
                t, ww = tree.copy(), w
                t.draft_probs.update(qs)
                new = []
                for v, tok in zip(slots, combo):
                    new.append(t.add(tok, v))
                    ww *= qs[v][tok]
                nxt.append((t, new, ww))
        level = nxt
    return [(t, w) for t, _, w in level]


def tree_step_law(target, draft, context: Sequence[int], spec, horizon: int, temperature=1, top_k=None, top_p=None,
                  rule: str | None = None, rules=None) -> dict:
    """Exact law of the block of tokens ONE tree step emits after ``context`` (toy Markov
    target and draft, ``Fraction``s): every tree the draft can build, weighted by its
    probability, times every branch of the verification walk.  Blocks are cut at ``horizon``."""

    proc = lambda law: process_law(law, temperature, top_k, top_p)  # noqa: E731
    context = tuple(context)
    if isinstance(spec, StaticTree) and spec.children == "sample" and temperature != 0:
        trees = _iid_trees(spec, context, draft, proc)
    else:  # deterministic children: one tree, built by the library's own builder
        sampling = SamplingConfig(float(temperature), top_k, None if top_p is None else float(top_p))
        trees = [(_build(spec, context, draft, sampling), Fraction(1))]
    out: dict[tuple[int, ...], Fraction] = {}
    for tree, w in trees:
        p_of = lambda v, t=tree: proc(target.next_law(context + tuple(t.path_tokens(v))))  # noqa: E731
        q_of = lambda v, t=tree: proc(draft.next_law(context + tuple(t.path_tokens(v))))  # noqa: E731
        law = tree_outcome_law(tree, p_of, q_of, rule, rules)
        for (path, y), pw in law.items():
            block = (tuple(tree.path_tokens(path[-1])) if path else ()) + (y,)
            key = block[:horizon]
            out[key] = out.get(key, Fraction(0)) + w * pw
    return out


def tree_joint(target, draft, prompt: Sequence[int], n: int, spec, temperature=1, top_k=None, top_p=None,
               rule: str | None = None, rules=None) -> dict:
    """Exact law of the first ``n`` tokens emitted by tree speculative decoding (toy models):
    ``{tuple: Fraction}``, to compare with :func:`specdec_lesson.toy.target_joint`."""
    memo: dict = {}
    m = max(target.order, draft.order)

    def step(context: tuple[int, ...], horizon: int) -> dict:
        # Markov: only the last m tokens matter, except to a lookup, which reads the whole context
        key = (context if isinstance(spec, (HybridTree, AdaptiveTree)) else context[-m:], horizon)
        if key not in memo:
            memo[key] = tree_step_law(target, draft, context, spec, horizon, temperature, top_k, top_p, rule, rules)
        return memo[key]


    return compose_steps(step, prompt, n)


def sample_tree_toy(target, draft, prompt: Sequence[int], n: int, spec, batch: int, generator: torch.Generator,
                    temperature: float = 1.0, top_k=None, top_p=None, rule: str | None = None, rules=None) -> torch.Tensor:
    """``batch`` independent runs of tree speculative decoding on toy models, each until ``n``
    tokens are out, through the real :func:`build_tree` and :func:`verify_tree`: ``[batch, n]``."""

    sampling = SamplingConfig(temperature, top_k, top_p)
    rows = []
    for _ in range(batch):
        ctx = list(prompt)
        while len(ctx) < len(prompt) + n:
            tree = _build(spec, ctx, draft, sampling, generator)
            windows = torch.tensor([(ctx + tree.path_tokens(v))[-target.order:] for v in range(tree.size)])  # [N, m]
            target_probs = sampling.probs(target.logits(windows))  # [N, V]
            if sampling.greedy:
                path, y = verify_tree_greedy(tree, target_probs.argmax(-1).tolist())
            else:
                path, y = verify_tree(tree, target_probs, generator, rule, rules)
            ctx += (tree.path_tokens(path[-1]) if path else []) + [y]
        rows.append(ctx[len(prompt):len(prompt) + n])
    return torch.tensor(rows, dtype=torch.long)
