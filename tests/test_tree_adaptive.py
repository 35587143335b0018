"""The adaptive tree (tree/adaptive.py): exact laws whatever it chooses, choices that follow the record and the
costs, greedy equality on the engine, input errors."""

from fractions import Fraction

import pytest
import torch
from test_tree_hybrid import _eagle

from specdec_lesson import toy
from specdec_lesson.drafters import ModelDrafter
from specdec_lesson.drafters.adaptive_policy import StepCosts
from specdec_lesson.models import tiny_pair
from specdec_lesson.speculative import autoregressive_generate
from specdec_lesson.stats import tv_distance
from specdec_lesson.tree import AdaptiveTree, HybridTreeDrafter, StaticTree, TokenTree, TreeAcceptance, tree_generate, tree_joint
from specdec_lesson.tree.adaptive import build_adaptive_tree, explain_step
from specdec_lesson.tree.exact import TOY_LOOKUP, _toy_expand

TARGET = toy.random_markov(3, order=1, seed=5)
DRAFT = toy.random_markov(3, order=1, seed=6)
SPARSE_T = toy.random_markov(4, order=1, seed=4, low=0, high=5)  # laws with zeros
SPARSE_D = toy.random_markov(4, order=1, seed=5, low=0, high=5)
PROMPT = (0, 1, 0)
COSTS = StepCosts.linear(1.0, 2.0, 0.02, 0.05)  # made-up units: each node costs 1/7 of a plain step


def _record(rate: float | None, lookup_len: int = 2) -> TreeAcceptance:
    """A record that has seen every draft probability bin and lookup depth accepted at ``rate`` (None: fresh)."""
    acc = TreeAcceptance(lookup_len)
    if rate is not None:
        edges = (0.0,) + acc.EDGES + (1.0,)
        nb = len(acc.bin_seen)
        acc.bin_seen, acc.bin_acc = [100.0] * nb, [100.0 * rate] * nb
        acc.bin_q = [50.0 * (lo + hi) for lo, hi in zip(edges, edges[1:])]  # the probabilities seen: each bin's middle
        acc.lk_seen, acc.lk_acc = [100.0] * lookup_len, [100.0 * rate] * lookup_len
        acc.top_seen, acc.top_acc = 100.0, 100.0 * rate
    return acc


SPECS = [AdaptiveTree(COSTS, depth=2, topk=2, node_budget=4, lookup_len=2, min_tokens=1, acceptance=_record(r))
         for r in (None, 0.05, 0.95)]
CONFIGS = [dict(temperature=1), dict(temperature=Fraction(1, 2), top_k=2), dict(top_p=Fraction(4, 5)), dict(temperature=0)]


def _sizes(spec, contexts) -> set[int]:
    return {build_adaptive_tree(spec, c[-1], _toy_expand(DRAFT, c), TOY_LOOKUP.continuation(list(c), spec.lookup_len),
                                spec.start()).size - 1 for c in contexts}


def test_the_choice_follows_the_record_and_the_costs():
    """The exact checks below would prove little if the tree never changed: a record of rejections gives plain steps
    (no node), one of acceptances fills the budget, and a fresh record sizes the tree by the draft's confidence,
    differently across contexts; a flat verify curve makes more nodes pay."""
    contexts = [(0,), (1,), (2,), (0, 1, 0), (2, 1, 2, 1)]
    assert _sizes(SPECS[1], contexts) == {0}
    assert _sizes(SPECS[2], contexts) == {4}
    assert len(_sizes(SPECS[0], contexts)) >= 2
    flat = AdaptiveTree(StepCosts.linear(1.0, 1.01, 0.0, 0.0), depth=2, topk=2, node_budget=4, lookup_len=2, min_tokens=1)
    assert min(_sizes(flat, contexts)) > max(_sizes(SPECS[0], contexts) - {4})


@pytest.mark.parametrize("spec", SPECS, ids=["fresh", "rejecting", "accepting"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_adaptive_tree_joint_equals_target_exactly(spec, cfg):
    """Equality of Fractions: 3 tokens of decoding with trees sized by the policy (every accept/reject branch of the
    library's walk, the 'distinct' rule) have the target's law, for each record."""
    for target, draft in ((TARGET, DRAFT), (SPARSE_T, SPARSE_D)):
        assert tree_joint(target, draft, PROMPT, 3, spec, **cfg) == toy.target_joint(target, PROMPT, 3, **cfg)


def _learning_joint(target, draft, prompt, n, spec, temperature=1, peek=False, shapes: set | None = None,
                    learn: bool = True) -> dict:
    """Exact law of the first ``n`` tokens when the record LEARNS along the way, as in a run: every branch of every
    step's verification (Fractions) is followed with the record updated by that branch's path, so each step's tree
    depends on the blocks emitted before it.  ``peek`` plants a bug: a step whose verification rejected every node
    is thrown away and a larger tree verified instead (a choice that reads the drawn outcome)."""
    from specdec_lesson.toy import process_law
    from specdec_lesson.tree.verify import tree_outcome_law

    out: dict = {}

    def outcomes(ctx: tuple, record: TreeAcceptance) -> list:
        tree = build_adaptive_tree(spec, ctx[-1], _toy_expand(draft, ctx),
                                   TOY_LOOKUP.continuation(list(ctx), spec.lookup_len), record)
        p_of = lambda v: process_law(target.next_law(ctx + tuple(tree.path_tokens(v))), temperature)  # noqa: E731
        q_of = lambda v: process_law(draft.next_law(ctx + tuple(tree.path_tokens(v))), temperature)  # noqa: E731
        if shapes is not None:
            shapes.add((tuple(tree.tokens), tuple(tree.parents)))
        return [(tree, list(path), y, pw) for (path, y), pw in tree_outcome_law(tree, p_of, q_of).items()]

    def go(ctx: tuple, emitted: tuple, record: TreeAcceptance, w: Fraction) -> None:
        if len(emitted) >= n:
            out[emitted[:n]] = out.get(emitted[:n], Fraction(0)) + w
            return
        branches = outcomes(ctx, record)
        if peek:
            retry = outcomes(ctx, _record(0.95))
            branches = [b for b in branches if b[1]] + [(t, p, y, pw * qw) for *_, qw in [b for b in branches if not b[1]]
                                                     for t, p, y, pw in retry]
        for tree, path, y, pw in branches:
            block = (tuple(tree.path_tokens(path[-1])) if path else ()) + (y,)
            nxt = record.copy()
            if learn:
                nxt.update(tree, path)
            go(ctx + block, emitted + block, nxt, w * pw)

    go(tuple(prompt), (), TreeAcceptance(spec.lookup_len), Fraction(1))
    return out


@pytest.mark.parametrize("temperature", [1, Fraction(1, 2), 0])
def test_a_record_that_learns_along_the_run_keeps_the_target_law(temperature):
    """Equality of Fractions over 4 tokens with the record updated after every step from that step's verified path
    (what HybridTreeDrafter.commit_tree does): the trees differ between branches of the run, the law does not.  Sizing
    a tree on anything known before the draw keeps the law (even the target's law itself); a step redone after its
    drawn outcome is seen (planted) is caught."""
    spec = AdaptiveTree(COSTS, depth=2, topk=2, node_budget=3, lookup_len=2, min_tokens=1)
    for target, draft in ((TARGET, DRAFT), (SPARSE_T, SPARSE_D)):
        exact, shapes = toy.target_joint(target, PROMPT, 4, temperature=temperature), set()
        assert _learning_joint(target, draft, PROMPT, 4, spec, temperature, shapes=shapes) == exact
        if temperature != 0:  # many branches: learning changed some step's tree (against a record that never learns)
            frozen: set = set()
            _learning_joint(target, draft, PROMPT, 4, spec, temperature, shapes=frozen, learn=False)
            assert shapes != frozen
    if temperature == 1:
        biased = _learning_joint(TARGET, DRAFT, PROMPT, 4, spec, temperature, peek=True)
        assert tv_distance(biased, toy.target_joint(TARGET, PROMPT, 4)) > 1e-3


def test_each_choice_is_explained_by_the_numbers_of_the_rule():
    """A tree's ``why`` is the rule's own arithmetic: the kept count, and the expected tokens and seconds that give
    best_node_count's rate; a rejecting record explains a plain step by the best tree it refused, an accepting one
    names the depth limit."""
    for spec in SPECS:
        for c in [(0,), (2, 1, 2, 1)]:
            tree = build_adaptive_tree(spec, c[-1], _toy_expand(DRAFT, c), TOY_LOOKUP.continuation(list(c), 2),
                                       spec.start())
            w = tree.why
            assert w["n"] == tree.size - 1 and w["drafted"] >= w["n"]
            secs = w["spent"] + w["T"] + w["overhead"]
            text = explain_step(w)
            if w["n"]:
                assert w["expected"] / secs == pytest.approx(w["rate"]) and text.startswith(f"kept {w['n']} of")
            else:
                assert w["rate"] == pytest.approx(w["plain"]) and text.startswith("no node")
                assert not w["m"] or w["expected"] / secs < w["plain"]
    rejecting = build_adaptive_tree(SPECS[1], 0, _toy_expand(DRAFT, (0,)), [], SPECS[1].start())
    assert "is slower than" in explain_step(rejecting.why) and "for the root alone" in explain_step(rejecting.why)
    accepting = build_adaptive_tree(SPECS[2], 0, _toy_expand(DRAFT, (0,)), [], SPECS[2].start())
    assert "2 draft levels, the most allowed" in explain_step(accepting.why)


def test_the_record_learns_from_the_verified_path():
    tree = TokenTree(0)
    tree.edge_q, tree.edge_lookup, tree.edge_rank = {}, {}, {}
    a, b = tree.add(1, 0), tree.add(2, 0)
    tree.edge_q.update({a: 0.7, b: 0.2})
    tree.edge_rank.update({a: 0, b: 1})
    acc = TreeAcceptance(2)
    for _ in range(30):
        acc.update(tree, [b])  # the second child accepted every time, the draft's favourite never
    assert acc.top() < 0.1 and acc.draft(0.7) < 0.2 and acc.draft(0.2) > 0.8
    assert acc.lookup(1) == acc.lookup_prior == 0.8  # no lookup edge was seen: the prior


PAIR = tiny_pair()
REPEATS = [[1, 5, 7, 9, 3, 11, 1, 5, 7, 9, 3]]


@pytest.mark.parametrize("paged", [False, True])
def test_greedy_adaptive_tree_decoding_equals_target_greedy(paged):
    """Tiny float64 models: greedy decoding with adaptive trees emits the target's greedy tokens, for the feature-level
    drafter and a weak causal-LM draft, on a flat and a steep verify curve; the trees vary."""
    ref, _ = autoregressive_generate(PAIR.target, REPEATS, 30)
    for costs in (StepCosts.linear(1.0, 1.05, 0.01, 0.01), COSTS):
        for make in (lambda: HybridTreeDrafter(_eagle(PAIR.target)), lambda: HybridTreeDrafter(ModelDrafter(PAIR.draft))):
            drafter = make()
            out, stats = tree_generate(PAIR.target, drafter, REPEATS, 30, tree=AdaptiveTree(costs), paged=paged)
            assert torch.equal(out[0], ref[0]), (costs, paged)
            assert stats.emitted == 30 and sum(stats.accept_hist) == stats.row_steps
            assert sum(drafter.choices.values()) == stats.row_steps
            assert drafter.explain().startswith("  e.g. step ") and set(drafter.why) <= {"tree", "plain"}
            if costs.T(8) < 1.1:  # nodes are cheap, so the trees have some: the verified paths reach the record
                assert sum(drafter.acceptance.bin_seen) > 0 and drafter.acceptance.top_seen > 0


def test_sampled_adaptive_tree_decoding_is_reproducible():
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(3)
        out, _ = tree_generate(PAIR.target, PAIR.draft, REPEATS, 20, tree=AdaptiveTree(COSTS), temperature=1.0, generator=g)
        outs.append(out[0])
    assert torch.equal(outs[0], outs[1]) and len(outs[0]) == 20


def test_bad_adaptive_trees_fail_with_one_clear_error():
    with pytest.raises(ValueError, match="costs must be a StepCosts"):
        AdaptiveTree(None)
    with pytest.raises(ValueError, match="node_budget"):
        AdaptiveTree(COSTS, node_budget=0)
    with pytest.raises(ValueError, match="min_tokens"):
        AdaptiveTree(COSTS, lookup_len=2, min_tokens=3)
    with pytest.raises(ValueError, match="acceptance must be None or a TreeAcceptance"):
        AdaptiveTree(COSTS, acceptance={})
    with pytest.raises(ValueError, match="pass tree=HybridTree"):
        tree_generate(PAIR.target, HybridTreeDrafter(ModelDrafter(PAIR.draft)), REPEATS, 5, tree=StaticTree((2,)))
