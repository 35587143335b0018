"""One token tree from two draft sources: the draft model's tree and a lookup's continuation.

``drafters.hybrid.HybridDrafter`` chooses per step between prompt lookup and the draft model: a wrong
lookup then costs the whole step.  A tree can hold both.  Each step :func:`build_hybrid_tree` drafts the
model's tree (a :class:`~specdec_lesson.tree.structure.DynamicTree` or a top-k
:class:`~specdec_lesson.tree.structure.StaticTree`) and grafts the lookup's continuation below the root
(:meth:`TokenTree.graft`: where the lookup agrees with the draft the nodes are shared, where it leaves the
draft's tree it becomes a branch of its own).  The target scores every node in its one forward and
:func:`~specdec_lesson.tree.verify.verify_tree` accepts one path.

Exactness: every child in such a tree is a deterministic function of the context (the draft's top-k tokens,
the lookup's tokens) and siblings are distinct tokens, so the ``"distinct"`` sibling rule (accept child x with
probability r(x), on rejection remove x from r and renormalise) keeps the output law the target's; the
Fraction enumerator in :mod:`.exact` checks it on toy models.  The lookup may also search a corpus of the
target's past answers (``drafters.suffix.CorpusLookupDrafter``): still deterministic.

Cost: a step where the lookup found a continuation of at least ``min_tokens`` tokens drafts the smaller
``with_lookup`` tree (``None``: the lookup chain alone; for EAGLE drafters a depth-1 tree costs no forward:
the root's draft law comes from the last commit), so the draft forwards a long match makes useless
are not paid.  :class:`HybridTreeDrafter` holds the two sources for
:func:`~specdec_lesson.tree.generate.tree_generate`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from ..drafters.lookup import PromptLookupDrafter
from ..sampling import SamplingConfig
from .adaptive import AdaptiveTree, TreeAcceptance, build_adaptive_tree, explain_step
from .structure import DynamicTree, Expand, StaticTree, TokenTree, build_tree, expand_of

__all__ = ["HybridTree", "HybridTreeDrafter", "build_hybrid_tree"]


def _check_deterministic(name: str, spec) -> None:
    if isinstance(spec, DynamicTree) or (isinstance(spec, StaticTree) and spec.children == "topk"):
        return
    raise ValueError(f"HybridTree.{name} must be a DynamicTree or a StaticTree with children='topk' (deterministic "
                     f"children, the 'distinct' rule), got {spec!r}")


@dataclass(frozen=True)
class HybridTree:
    """The draft's tree ``draft`` plus up to ``lookup_len`` lookup tokens below the root; a step whose lookup
    supplies at least ``min_tokens`` tokens drafts ``with_lookup`` instead (``None``: no draft tree then)."""

    # the default: the best hybrid tree over three prompt styles in benchmarks/results/archive/hybrid_tree.json (AMD EPYC)
    draft: StaticTree | DynamicTree = DynamicTree(depth=3, topk=4, num_nodes=6)
    lookup_len: int = 8
    min_tokens: int = 2
    with_lookup: StaticTree | DynamicTree | None = DynamicTree(depth=1, topk=2, num_nodes=2)

    def __post_init__(self) -> None:
        _check_deterministic("draft", self.draft)
        if self.with_lookup is not None:
            _check_deterministic("with_lookup", self.with_lookup)
        if not isinstance(self.lookup_len, int) or self.lookup_len < 1:
            raise ValueError(f"lookup_len must be an integer >= 1, got {self.lookup_len!r}")
        if not isinstance(self.min_tokens, int) or not 1 <= self.min_tokens <= self.lookup_len:
            raise ValueError(f"min_tokens must be an integer in 1..lookup_len ({self.lookup_len}), got {self.min_tokens!r}")

    @property
    def max_depth(self) -> int:
        depths = [self.draft.max_depth, self.lookup_len] + ([self.with_lookup.max_depth] if self.with_lookup else [])
        return max(depths)

    @property
    def max_nodes(self) -> int:
        return max(self.draft.max_nodes, self.with_lookup.max_nodes if self.with_lookup else 0) + self.lookup_len


def build_hybrid_tree(spec: HybridTree, root_token: int, expand: Expand, chain: list[int], sampling: SamplingConfig,
                      generator: torch.Generator | None = None) -> TokenTree:
    """The draft's tree below ``root_token`` (``spec.with_lookup`` when ``chain`` has at least ``spec.min_tokens``
    tokens) with ``chain[:spec.lookup_len]`` grafted below the root.  ``tree.lookup_nodes``: the nodes only the
    lookup proposed."""
    chain = [int(t) for t in chain[: spec.lookup_len]]
    found = len(chain) >= spec.min_tokens
    shape = spec.with_lookup if found else spec.draft
    if shape is None:  # the root is still expanded: that feeds a model drafter's pending tokens (free for EAGLE)
        tree = TokenTree(root_token, "distinct")
        expand(tree, [0])
    else:
        tree = build_tree(shape, root_token, expand, sampling, generator)
    before = tree.size
    if found:
        tree.graft(chain)
    tree.lookup_nodes = set(range(before, tree.size))
    return tree


class HybridTreeDrafter:
    """Tree drafting by ``model`` (any drafter with ``tree_expand`` / ``commit_tree``: ``EagleDrafter``,
    ``ModelDrafter``) beside ``lookup`` (prompt lookup by default; ``drafters.suffix.CorpusLookupDrafter`` also
    searches the target's past answers).  Batch size 1.  ``lookup_steps`` / ``lookup_tokens``: steps whose tree
    held a lookup chain, and accepted tokens only the lookup had proposed."""

    def __init__(self, model, lookup: PromptLookupDrafter | None = None) -> None:
        if not (hasattr(model, "tree_expand") and hasattr(model, "commit_tree")):
            raise ValueError(f"HybridTreeDrafter needs a drafter with tree_expand / commit_tree (EagleDrafter, "
                             f"ModelDrafter), got {type(model).__name__}")
        if lookup is not None and not isinstance(lookup, PromptLookupDrafter):
            raise ValueError(f"lookup must be a PromptLookupDrafter (e.g. drafters.suffix.CorpusLookupDrafter), got "
                             f"{type(lookup).__name__}")
        self.model = model
        self.lookup = lookup if lookup is not None else PromptLookupDrafter(max_ngram=4, min_ngram=2)
        self.needs_target_hidden = getattr(model, "needs_target_hidden", False)
        self.target_hidden_layers = getattr(model, "target_hidden_layers", None)
        self.lookup_steps = self.lookup_tokens = 0
        # an AdaptiveTree's record of acceptances (made on its first step) and its (depth, nodes) per step; both carry
        # over to the next generation of the same drafter, as the chain's AdaptiveDrafter does
        self.acceptance: TreeAcceptance | None = None
        self.choices: Counter = Counter()
        self.why: dict[str, tuple[int, dict]] = {}  # the latest step of each kind ("plain", "tree"): (step, tree.why)

    @property
    def forwards(self) -> int:  # draft model forwards
        return self.model.forwards

    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        if prompt_ids.shape[0] != 1:
            raise ValueError(f"tree drafting supports batch size 1 only, got {prompt_ids.shape[0]} rows")
        self.model.begin(prompt_ids, prompt_mask, target_hidden)
        self.lookup.begin(prompt_ids, prompt_mask, target_hidden)

    def tree_expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        return self.model.tree_expand(tree, nodes)

    def tree_expand_subset(self, tree: TokenTree, nodes: list[int]):
        return expand_of(self.model)(tree, nodes)  # the model's subset logits where it has them

    def chain(self, n: int) -> list[int]:
        """The lookup's continuation of the history (up to ``n`` tokens after the pending one)."""
        return self.lookup.continuation(self.lookup.history[0], n)

    def build(self, spec: HybridTree | AdaptiveTree, root_token: int, sampling: SamplingConfig,
              generator: torch.Generator | None) -> TokenTree:
        chain = self.chain(spec.lookup_len)
        if isinstance(spec, AdaptiveTree):
            if self.acceptance is None:
                self.acceptance = spec.start()
            tree = build_adaptive_tree(spec, root_token, self.tree_expand_subset, chain, self.acceptance, self.choices)
            self.why["tree" if tree.why["n"] else "plain"] = (sum(self.choices.values()), tree.why)
        else:
            tree = build_hybrid_tree(spec, root_token, self.tree_expand_subset, chain, sampling, generator)
        self.lookup_steps += bool(tree.lookup_nodes)
        return tree

    def explain(self) -> str:
        """Why the adaptive tree chose what it did: the latest step that kept nodes and the latest step that kept none
        (counted over every generation of this drafter), with the numbers of the rule (expected tokens per second of
        the tree kept, against the root alone)."""
        return "\n".join(f"  e.g. step {step}: {explain_step(why)}" for _, (step, why) in sorted(self.why.items(),
                                                                                               reverse=True))

    def commit_tree(self, tree: TokenTree, path: list[int], next_token: int, target_hidden: torch.Tensor | None) -> None:
        self.lookup_tokens += sum(v in tree.lookup_nodes for v in path)
        if self.acceptance is not None and hasattr(tree, "edge_q"):
            self.acceptance.update(tree, path)
        self.model.commit_tree(tree, path, next_token, target_hidden)
        self.lookup.last = [tree.path_tokens(path[-1]) if path else []]
        self.lookup.commit(torch.tensor([len(path)]), torch.tensor([int(next_token)]), None)
