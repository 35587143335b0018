"""Trees of lookup and draft candidates (tree/hybrid.py): exact laws, the graft, greedy equality, input errors."""

from fractions import Fraction

import pytest
import torch

from specdec_lesson import toy
from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter
from specdec_lesson.models import tiny_llama, tiny_pair
from specdec_lesson.sampling import SamplingConfig
from specdec_lesson.speculative import autoregressive_generate
from specdec_lesson.stats import chi_square_power, chi_square_test, noncentrality, tv_distance
from specdec_lesson.tree import DynamicTree, StaticTree, TokenTree, sample_tree_toy, tree_generate, tree_joint
from specdec_lesson.tree.exact import TOY_LOOKUP, _toy_expand
from specdec_lesson.tree.hybrid import HybridTree, HybridTreeDrafter, build_hybrid_tree

TARGET = toy.random_markov(3, order=1, seed=5)
DRAFT = toy.random_markov(3, order=1, seed=6)
SPARSE_T = toy.random_markov(4, order=1, seed=4, low=0, high=5)  # laws with zeros
SPARSE_D = toy.random_markov(4, order=1, seed=5, low=0, high=5)
PROMPT = (0, 1, 0)  # the lookup finds "1" after "0" at once

SPECS = [
    HybridTree(StaticTree((2,), "topk"), lookup_len=2, min_tokens=1, with_lookup=None),
    HybridTree(DynamicTree(depth=2, topk=2, num_nodes=3), lookup_len=3, min_tokens=1,
               with_lookup=StaticTree((1,), "topk")),
    HybridTree(StaticTree((2, 1), "topk"), lookup_len=2, min_tokens=2),
]
CONFIGS = [dict(temperature=1), dict(temperature=Fraction(1, 2), top_k=2), dict(top_p=Fraction(4, 5)), dict(temperature=0)]


def test_graft_shares_the_draft_prefix_and_adds_a_branch():
    t = TokenTree(7)
    a = t.add(1, 0)
    b = t.add(2, 0)
    t.add(3, a)
    ids = t.graft([1, 3, 5, 6])
    assert ids[:2] == [a, 3] and t.tokens[ids[2]] == 5 and t.parents[ids[3]] == ids[2]
    assert t.children[0] == [a, b] and len(set(t.source)) == t.size  # fresh source ids
    assert t.graft([2, 9])[0] == b and t.depths[t.size - 1] == 2
    with pytest.raises(ValueError, match="deterministic children"):
        TokenTree(7, "iid").graft([1])


def test_lookup_is_grafted_where_it_finds_a_match():
    """The exact checks below would prove nothing if no tree held a lookup chain: check the graft happens and that
    a step with a long match drafts the smaller ``with_lookup`` tree."""
    spec = HybridTree(DynamicTree(depth=2, topk=2, num_nodes=3), lookup_len=3, min_tokens=2,
                      with_lookup=StaticTree((1,), "topk"))
    ctx = [0, 1, 2, 0, 1]
    chain = TOY_LOOKUP.continuation(ctx, spec.lookup_len)
    assert chain == [2, 0, 1]
    tree = build_hybrid_tree(spec, ctx[-1], _toy_expand(DRAFT, ctx), chain, SamplingConfig(1.0))
    assert tree.lookup_nodes and max(tree.depths) == 3 and len(tree.children[0]) <= 2
    plain = build_hybrid_tree(spec, ctx[-1], _toy_expand(DRAFT, ctx), [], SamplingConfig(1.0))
    assert not plain.lookup_nodes and plain.size == 4  # the draft's own tree: root + 3 nodes


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_hybrid_tree_joint_equals_target_exactly(spec, cfg):
    """Equality of Fractions: 3 tokens of decoding with trees holding the draft's top-k children and the lookup's
    continuation (every accept/reject branch of the library's walk, the 'distinct' rule) have the target's law."""
    for target, draft in ((TARGET, DRAFT), (SPARSE_T, SPARSE_D)):
        assert tree_joint(target, draft, PROMPT, 3, spec, **cfg) == toy.target_joint(target, PROMPT, 3, **cfg)


def test_the_exact_check_flags_the_iid_rule_on_a_hybrid_tree():
    spec = SPECS[1]
    wrong = tree_joint(TARGET, DRAFT, PROMPT, 3, spec, rule="iid")
    assert tv_distance(wrong, toy.target_joint(TARGET, PROMPT, 3)) > 0.02


MC_N, MC_BATCH, MC_LEVEL = 2, 3000, 1e-3
# the torch walk's iid rule needs the draft law at every parent: one grafted token below the root, static draft trees
MC_SPEC = HybridTree(StaticTree((2,), "topk"), lookup_len=1, min_tokens=1, with_lookup=StaticTree((1,), "topk"))


def test_monte_carlo_hybrid_tree_sampler_and_its_power():
    """The torch sampler (verify_tree with random numbers) on hybrid trees passes a chi-square test at level 1e-3,
    3000 runs; with the iid rule it fails, and the test's power against that bug (non-central chi-square from the
    exact biased law) is asserted >= 0.99."""
    spec = MC_SPEC
    exact = {k: float(v) for k, v in toy.target_joint(TARGET, PROMPT, MC_N).items()}
    biased = {k: float(v) for k, v in tree_joint(TARGET, DRAFT, PROMPT, MC_N, spec, rule="iid").items()}
    assert chi_square_power(MC_BATCH, len(exact) - 1, noncentrality(exact, biased, MC_BATCH), MC_LEVEL) >= 0.99

    def p_value(seed, **kw):
        g = torch.Generator().manual_seed(seed)
        samples = sample_tree_toy(TARGET, DRAFT, PROMPT, MC_N, spec, MC_BATCH, g, **kw)
        return chi_square_test(toy.counts_of(samples), exact)[2]

    assert p_value(1) > MC_LEVEL
    assert p_value(2, rule="iid") < MC_LEVEL


PAIR = tiny_pair()
REPEATS = [[1, 5, 7, 9, 3, 11, 1, 5, 7, 9, 3]]  # a prompt that repeats: the lookup proposes at once


def _eagle(target):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        emb, out = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
        draft = EagleDraft(EagleConfig.from_target(target, 40), emb, out, torch.arange(40)).to(torch.float64)
    return EagleDrafter(draft)


@pytest.mark.parametrize("paged", [False, True])
def test_greedy_hybrid_tree_decoding_equals_target_greedy(paged):
    """Tiny float64 models: greedy decoding with hybrid trees emits the target's greedy tokens, for a weak causal-LM
    draft, the target as its own draft, and the feature-level drafter, with and without a draft tree on lookup
    steps; the lookup proposes on the repeating prompt."""
    ref, _ = autoregressive_generate(PAIR.target, REPEATS, 30)
    specs = (HybridTree(), HybridTree(StaticTree((2, 1)), lookup_len=6, with_lookup=None))
    drafts = {"weak": lambda: PAIR.draft, "self": lambda: tiny_llama(hidden_size=32, num_layers=2, seed=0),
              "eagle": lambda: _eagle(PAIR.target)}
    for name, make in drafts.items():
        for spec in specs:
            drafter = HybridTreeDrafter(make()) if name == "eagle" else make()
            out, stats = tree_generate(PAIR.target, drafter, REPEATS, 30, tree=spec, paged=paged)
            assert torch.equal(out[0], ref[0]), (name, spec, paged)
            assert stats.emitted == 30 and sum(stats.accept_hist) == stats.row_steps
            if name == "eagle":
                assert drafter.lookup_steps > 0


def test_sampled_hybrid_tree_decoding_is_reproducible():
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(3)
        out, _ = tree_generate(PAIR.target, PAIR.draft, REPEATS, 20, tree=HybridTree(), temperature=1.0, generator=g)
        outs.append(out[0])
    assert torch.equal(outs[0], outs[1]) and len(outs[0]) == 20


def test_hybrid_tree_inputs_are_checked():
    with pytest.raises(ValueError, match="deterministic children"):
        HybridTree(StaticTree((2,), "sample"))
    with pytest.raises(ValueError, match="with_lookup"):
        HybridTree(with_lookup=StaticTree((2,), "sample"))
    with pytest.raises(ValueError, match="lookup_len"):
        HybridTree(lookup_len=0)
    with pytest.raises(ValueError, match="min_tokens"):
        HybridTree(lookup_len=3, min_tokens=4)
    with pytest.raises(ValueError, match="tree_expand"):
        HybridTreeDrafter(object())
    with pytest.raises(ValueError, match="PromptLookupDrafter"):
        HybridTreeDrafter(_eagle(PAIR.target), lookup=object())
    with pytest.raises(ValueError, match="pass tree=HybridTree"):
        tree_generate(PAIR.target, HybridTreeDrafter(_eagle(PAIR.target)), REPEATS, 5, tree=StaticTree((2,)))
    assert HybridTree().max_nodes == 6 + 8 and HybridTree().max_depth == 8


def test_greedy_with_the_answer_lookup_equals_plain():
    """A corpus of the target's own continuations (as drafters.suffix searches the shipped answers): the lookup's
    tokens are accepted in the tree, and the output is still the target's greedy output."""
    from specdec_lesson.drafters.suffix import CorpusLookupDrafter, SuffixIndex

    target = tiny_llama(vocab_size=64, seed=0)  # float64
    corpus = [autoregressive_generate(target, [[i + 1, (3 * i) % 60 + 2]], 30)[0][0].tolist() for i in range(6)]
    index = SuffixIndex(corpus, max_ngram=4)
    for prompt in ([[1, 2]], [[2, 5, 9]]):
        ref, _ = autoregressive_generate(target, prompt, 28)
        drafter = HybridTreeDrafter(_eagle(target), lookup=CorpusLookupDrafter(index, min_ngram=2))
        out, _ = tree_generate(target, drafter, prompt, 28, tree=HybridTree(lookup_len=6))
        assert torch.equal(out[0], ref[0])
    assert drafter.lookup_tokens > 0
