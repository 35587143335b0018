"""Token trees: masks, exact losslessness of tree verification, greedy equality, KV compaction."""

import random
from fractions import Fraction

import pytest
import torch

from specdec_lesson import toy
from specdec_lesson.drafters import ModelDrafter
from specdec_lesson.kernels.reference import build_tree_mask
from specdec_lesson.kvcache import SlotCache
from specdec_lesson.models import tiny_llama, tiny_pair
from specdec_lesson.sampling import SamplingConfig
from specdec_lesson.speculative import autoregressive_generate
from specdec_lesson.stats import chi2_isf, chi_square_power, chi_square_test, noncentrality, tv_distance
from specdec_lesson.tree import (
    DynamicTree,
    FractionRules,
    StaticTree,
    TokenTree,
    TorchRules,
    build_tree,
    sample_tree_toy,
    tree_generate,
    tree_joint,
    tree_mask,
    verify_tree,
    verify_tree_greedy,
)

TARGET = toy.random_markov(3, order=1, seed=5)
DRAFT = toy.random_markov(3, order=1, seed=6)
SPARSE_T = toy.random_markov(4, order=1, seed=4, low=0, high=5)  # laws with zeros
SPARSE_D = toy.random_markov(4, order=1, seed=5, low=0, high=5)
PROMPT = (0,)




# ------------------------------------------------------------------ structure and masks


def _random_tree(n: int, seed: int) -> TokenTree:
    rng = random.Random(seed)
    t = TokenTree(rng.randrange(50))
    for _ in range(n):
        t.add(rng.randrange(50), rng.randrange(t.size))
    return t


def _brute_mask(parents: list[int]) -> torch.Tensor:
    N = len(parents)
    m = torch.zeros(N, N, dtype=torch.bool)
    for i in range(N):
        j = i
        while j != -1:  # walk up to the root
            m[i, j] = True
            j = parents[j]
    return m


@pytest.mark.parametrize("seed", range(5))
def test_tree_mask_matches_brute_force(seed):
    tree = _random_tree(20, seed)
    assert torch.equal(tree.mask(), _brute_mask(tree.parents))
    tokens, parents, depths = tree.flatten()
    assert parents[0] == -1 and bool((parents[1:] < torch.arange(1, tree.size)).all())  # parents precede children
    assert torch.equal(tree.positions(7), 7 + depths)
    assert all(depths[v] == len(tree.ancestors(v)) for v in range(tree.size))
    full = build_tree_mask(torch.tensor([[False, True, True]]), tree.mask())  # [1, N, 3 + N]
    assert full.shape == (1, tree.size, 3 + tree.size) and not bool(full[0, :, 0].any()) and bool(full[0, :, 1:3].all())
    with pytest.raises(ValueError, match="parents must precede"):
        tree_mask(torch.tensor([-1, 2, 0]))


def test_builders_shape_and_dynamic_tree_is_eagle2():
    logits_of = lambda tree, nodes: toy.random_markov(6, 1, seed=9).logits(  # noqa: E731
        torch.tensor([[tree.tokens[v]] for v in nodes]))
    sampling = SamplingConfig(1.0)
    g = torch.Generator().manual_seed(0)
    static = build_tree(StaticTree((3, 2, 1), "sample"), 0, logits_of, sampling, g)
    assert static.size == 1 + 3 + 6 + 6 and static.rule == "iid" and set(static.draft_probs) == set(range(10))
    topk = build_tree(StaticTree((3, 2)), 0, logits_of, sampling, g)
    assert topk.rule == "distinct" and all(len(set(topk.tokens[c] for c in ch)) == len(ch) for ch in topk.children)
    dyn = build_tree(DynamicTree(depth=3, topk=2, num_nodes=5), 0, logits_of, sampling)
    assert dyn.size == 6 and dyn.depth <= 3
    # brute force: every kept node outscores every dropped candidate of the full beam search
    full = DynamicTree(depth=3, topk=2, num_nodes=10**6)
    every = build_tree(full, 0, logits_of, sampling)
    kept = sorted(dyn.scores[1:], reverse=True)
    assert kept == sorted(every.scores[1:], reverse=True)[:5]
    with pytest.raises(ValueError, match="branching"):
        StaticTree(())


# ------------------------------------------------------------------ exact losslessness (Fractions)


def test_torch_rules_match_fraction_rules():
    rng = random.Random(0)
    for _ in range(20):
        p = [Fraction(rng.randint(0, 9)) for _ in range(5)]
        q = [Fraction(rng.randint(1, 9)) for _ in range(5)]
        p = [v / sum(p) for v in p] if sum(p) else [Fraction(1, 5)] * 5
        q = [v / sum(q) for v in q]
        x = rng.randrange(5)
        for rule in ("iid", "distinct"):
            exact = FractionRules().reject(p, q, x, rule)
            got = TorchRules().reject(torch.tensor([float(v) for v in p], dtype=torch.float64),
                                      torch.tensor([float(v) for v in q], dtype=torch.float64), x, rule)
            assert torch.allclose(got, torch.tensor([float(v) for v in exact], dtype=torch.float64), atol=1e-12)


IID_SPECS = [StaticTree((3,), "sample"), StaticTree((2, 1), "sample")]
DISTINCT_SPECS = [StaticTree((3,), "topk"), StaticTree((2, 2, 1), "topk"), DynamicTree(depth=3, topk=2, num_nodes=4)]
CONFIGS = [dict(temperature=1), dict(temperature=Fraction(1, 2), top_k=2), dict(top_p=Fraction(4, 5))]


@pytest.mark.parametrize("spec", IID_SPECS + DISTINCT_SPECS, ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_tree_joint_equals_target_exactly(spec, cfg):
    """Equality of Fractions: the first 2 tokens of tree decoding (every tree the draft can
    build x every accept/reject branch of the library's walk) have the target's law, for i.i.d.
    siblings (residual max(0, r - q)) and distinct siblings (rejected child removed from r)."""
    for target, draft in ((TARGET, DRAFT), (SPARSE_T, SPARSE_D)):
        law = tree_joint(target, draft, PROMPT, 2, spec, **cfg)
        assert law == toy.target_joint(target, PROMPT, 2, **cfg)


@pytest.mark.parametrize("spec", [StaticTree((2, 1), "sample"), StaticTree((2, 2, 1), "topk")], ids=str)
def test_tree_joint_three_tokens_and_greedy(spec):
    assert tree_joint(TARGET, DRAFT, PROMPT, 3, spec) == toy.target_joint(TARGET, PROMPT, 3)
    assert tree_joint(TARGET, DRAFT, PROMPT, 3, spec, temperature=0) == toy.target_joint(TARGET, PROMPT, 3, temperature=0)


class NoUpdateFraction(FractionRules):
    """Bug: the residual is not updated after a rejected sibling."""

    def reject(self, r, q, x, rule):
        return tuple(r)


class NoUpdateTorch(TorchRules):
    def reject(self, r, q, x, rule):
        return r


def test_exact_check_flags_wrong_sibling_rules():
    exact = toy.target_joint(TARGET, PROMPT, 2)
    no_update = tree_joint(TARGET, DRAFT, PROMPT, 2, StaticTree((3,), "sample"), rules=NoUpdateFraction())
    iid_on_topk = tree_joint(TARGET, DRAFT, PROMPT, 2, StaticTree((3,), "topk"), rule="iid")
    assert tv_distance(no_update, exact) > 0.05 and tv_distance(iid_on_topk, exact) > 0.1


# ------------------------------------------------------------------ Monte Carlo through the torch sampler

MC_N = 2  # tokens per run: 9 joint outcomes over 3 symbols (8 dof)
MC_BATCH = 3000  # independent runs per check
MC_LEVEL = 1e-3  # reject "output law == target law" when the chi-square p-value < 1e-3


def _mc(spec, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    samples = sample_tree_toy(TARGET, DRAFT, PROMPT, MC_N, spec, MC_BATCH, g, **kw)
    counts = toy.counts_of(samples)
    law = {k: float(v) for k, v in toy.target_joint(TARGET, PROMPT, MC_N).items()}
    return chi_square_test(counts, law)[2]


def test_monte_carlo_tree_sampler_and_its_power():
    """The real sampler (torch, generator) passes; the two wrong sibling updates fail.

    Sample size 3000 runs, level 1e-3 (false alarm rate 1e-3 per check for a correct sampler).
    Power, from the exact biased laws (non-central chi-square, 8 dof): stated and asserted
    >= 0.99 for both bugs below, so a failure to flag them is itself improbable."""
    exact = {k: float(v) for k, v in toy.target_joint(TARGET, PROMPT, MC_N).items()}
    bugs = {
        "no residual update (iid siblings)": (StaticTree((3,), "sample"), dict(rules=NoUpdateTorch()),
                                              tree_joint(TARGET, DRAFT, PROMPT, MC_N, StaticTree((3,), "sample"),
                                                         rules=NoUpdateFraction())),
        "iid rule on top-k children": (StaticTree((3,), "topk"), dict(rule="iid"),
                                       tree_joint(TARGET, DRAFT, PROMPT, MC_N, StaticTree((3,), "topk"), rule="iid")),
    }
    dof = len(exact) - 1
    for name, (spec, kw, biased) in bugs.items():
        lam = noncentrality(exact, {k: float(v) for k, v in biased.items()}, MC_BATCH)
        assert chi_square_power(MC_BATCH, dof, lam, MC_LEVEL) >= 0.99, name
        assert _mc(spec, 1, **kw) < MC_LEVEL, name
    assert chi2_isf(MC_LEVEL, dof) > 0
    assert _mc(StaticTree((3,), "sample"), 2) > MC_LEVEL
    assert _mc(StaticTree((2, 1), "topk"), 3) > MC_LEVEL


def test_verify_tree_checks_inputs():
    tree = TokenTree(0, "iid")
    tree.add(1, 0)
    probs = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_tree(tree, probs)
    with pytest.raises(ValueError, match="sibling rule"):
        verify_tree(tree, probs, rule="topk")
    with pytest.raises(ValueError, match="rows"):
        verify_tree(tree, probs[:1])
    assert verify_tree_greedy(tree, [1, 2]) == ([1], 2) and verify_tree_greedy(tree, [2, 2]) == ([], 2)


# ------------------------------------------------------------------ real (tiny) models

PAIR = tiny_pair()
PROMPT_IDS = [[1, 5, 7, 9, 3, 11]]


@pytest.mark.parametrize("paged", [False, True])
def test_greedy_tree_decoding_equals_target_greedy(paged):
    """Tiny float64 models: greedy tree decoding emits exactly the target's greedy tokens, with
    a weak draft (mostly rejections) and with the target as its own draft (deep paths, unfed
    accepted leaves, bonus tokens)."""
    ref, _ = autoregressive_generate(PAIR.target, PROMPT_IDS, 30)
    tau = {}
    for name, draft in (("weak", PAIR.draft), ("self", tiny_llama(hidden_size=32, num_layers=2, seed=0))):
        for spec in (StaticTree((3, 2, 1)), DynamicTree(depth=4, topk=3, num_nodes=8)):
            out, stats = tree_generate(PAIR.target, draft, PROMPT_IDS, 30, tree=spec, paged=paged)
            assert torch.equal(out[0], ref[0]), (spec, paged)
            assert stats.emitted == 30 and sum(stats.accept_hist) == stats.row_steps == stats.target_forwards - 1
            tau[name, type(spec).__name__] = stats.tau
    assert tau["self", "StaticTree"] >= 3.5  # self-draft: every step accepts the full depth-3 path + bonus
    assert tau["self", "DynamicTree"] >= 2.5


def test_sampled_tree_decoding_is_reproducible_and_consistent():
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(3)
        out, stats = tree_generate(PAIR.target, PAIR.draft, PROMPT_IDS, 20, tree=StaticTree((2, 2), "sample"),
                                   temperature=1.0, generator=g)
        outs.append(out[0])
    assert torch.equal(outs[0], outs[1]) and len(outs[0]) == 20 and int(outs[0].max()) < 64
    assert stats.tau == stats.emitted / stats.row_steps
    with pytest.raises(ValueError, match="batch size 1"):
        tree_generate(PAIR.target, PAIR.draft, [[1, 2], [3, 4]], 5)
    with pytest.raises(ValueError, match="StaticTree, a DynamicTree, a HybridTree or an AdaptiveTree"):
        tree_generate(PAIR.target, PAIR.draft, PROMPT_IDS, 5, tree=(4, 2))


def _layers(state: SlotCache):
    """Per layer (keys, values) as [B, H, S, D], for either storage."""
    if hasattr(state.cache, "table"):
        return [layer.gather(state.valid.shape[0]) for layer in state.cache.layers]
    return [(layer.keys, layer.values) for layer in state.cache.layers]


@pytest.mark.parametrize("paged", [False, True])
@torch.inference_mode()
def test_compaction_equals_recomputation(paged):
    """Target side: prefill, one tree forward, compact the accepted path; the cache equals a
    from-scratch forward of prompt + path (same keys, values, next logits).  Draft side: the
    ModelDrafter's cache after commit_tree equals a fresh prefill of the committed tokens."""
    model = PAIR.target
    prompt = torch.tensor(PROMPT_IDS)
    tree = _random_tree(12, seed=7)
    tree.tokens = [t % 64 for t in tree.tokens]
    leaf = max(range(tree.size), key=lambda v: (tree.depths[v], v))
    path = tree.ancestors(leaf)
    state = SlotCache(model, 1, "cpu", paged=paged, block_size=4)
    state.forward(prompt)
    since = state.num_slots
    L = int(state.lengths[0])
    state.forward(torch.tensor([tree.tokens]), block_mask=tree.mask()[None], positions=tree.positions(L)[None])
    state.compact(since, [[0] + path])
    fresh = SlotCache(model, 1, "cpu", paged=paged, block_size=4)
    seq = torch.tensor([PROMPT_IDS[0] + [tree.tokens[0]] + tree.path_tokens(leaf)])  # prompt, root, path
    fresh.forward(seq)
    assert state.num_slots == fresh.num_slots and torch.equal(state.lengths, fresh.lengths)
    for (k1, v1), (k2, v2) in zip(_layers(state), _layers(fresh)):
        assert torch.allclose(k1, k2, atol=1e-12) and torch.allclose(v1, v2, atol=1e-12)
    nxt = torch.tensor([[17]])
    assert torch.allclose(state.forward(nxt)[0], fresh.forward(nxt)[0], atol=1e-10)
    if paged:
        state.cache.table.check()

    # draft side: build a tree through the drafter, accept a path whose last node was never fed
    drafter = ModelDrafter(model, paged=paged, lean=False)  # the Hugging Face cache's layers are compared below
    drafter.begin(prompt, torch.ones_like(prompt, dtype=torch.bool), None)
    built = build_tree(StaticTree((2, 2)), PROMPT_IDS[0][-1], drafter.tree_expand, SamplingConfig(0.0))
    deep = built.size - 1  # a depth-2 leaf: unfed
    drafter.commit_tree(built, built.ancestors(deep), 42)
    assert drafter.pending.tolist() == [[built.tokens[deep], 42]]
    ref = SlotCache(model, 1, "cpu")
    ref.forward(torch.tensor([PROMPT_IDS[0] + built.path_tokens(built.parents[deep])]))
    assert drafter.state.num_slots == ref.num_slots
    for (k1, v1), (k2, v2) in zip(_layers(drafter.state), _layers(ref)):
        assert torch.allclose(k1, k2, atol=1e-12) and torch.allclose(v1, v2, atol=1e-12)


# ------------------------------------------------------------------ the EAGLE-style feature-level drafter


def _eagle(target):
    from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter

    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(1)
        emb, out = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
        draft = EagleDraft(EagleConfig.from_target(target, 40), emb, out, torch.arange(40)).to(torch.float64)
    return EagleDrafter(draft)


@torch.inference_mode()
def test_eagle_tree_drafting_matches_chain_drafting():
    """Every node of a tree drafted by the feature-level drafter (tree mask over its one-layer
    cache) gets the same law as drafting its path as a chain; greedy tree decoding with it
    equals the target's greedy output."""
    target = PAIR.target
    prompt = torch.tensor(PROMPT_IDS)
    mask = torch.ones_like(prompt, dtype=torch.bool)
    state = SlotCache(target, 1, "cpu")
    _, hidden = state.forward(prompt[:, :-1], output_hidden=True)
    drafter = _eagle(target)
    drafter.begin(prompt, mask, hidden)
    seen = {}

    def expand(tree, nodes):
        logits = drafter.tree_expand(tree, nodes)
        seen.update({v: logits[i] for i, v in enumerate(nodes)})
        return logits

    tree = build_tree(StaticTree((2, 2, 1)), PROMPT_IDS[0][-1], expand, SamplingConfig(0.0))
    for v in seen:
        chain = _eagle(target)
        chain.begin(prompt, mask, hidden)
        g = chain.g_last
        for tok in tree.path_tokens(v):
            g = chain._step(g[:, None], torch.tensor([[tok]]), torch.ones(1, 1, dtype=torch.bool))[:, 0]
            chain.cursor += 1
        assert torch.allclose(chain._full_logits(g), seen[v][None], atol=1e-10), v
    ref, _ = autoregressive_generate(target, PROMPT_IDS, 20)
    for spec in (StaticTree((3, 2, 1)), DynamicTree(depth=3, topk=2, num_nodes=6)):
        out, _ = tree_generate(target, _eagle(target), PROMPT_IDS, 20, tree=spec)
        assert torch.equal(out[0], ref[0])


@pytest.mark.parametrize("paged", [False, True])
@torch.inference_mode()
def test_compact_moves_each_rows_path_and_marks_holes(paged):
    """SlotCache.compact on a batch of 2 with paths of different lengths: row b's slot since + i
    holds what slot since + paths[b][i] held; shorter rows get holes; positions follow."""
    state = SlotCache(PAIR.target, 2, "cpu", paged=paged, block_size=4)
    state.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    since = state.num_slots
    state.forward(torch.tensor([[7, 8, 9, 10, 11], [12, 13, 14, 15, 16]]))
    before = [(k.clone(), v.clone()) for k, v in _layers(state)]
    paths = [[0, 2, 4], [1]]
    state.compact(since, paths)
    assert state.num_slots == since + 3 and state.lengths.tolist() == [since + 3, since + 1] and state.holes
    assert state.valid[:, since:].tolist() == [[True, True, True], [True, False, False]]
    for (k0, v0), (k1, v1) in zip(before, _layers(state)):
        for b, p in enumerate(paths):
            for i, o in enumerate(p):
                assert torch.equal(k1[b, :, since + i], k0[b, :, since + o])
                assert torch.equal(v1[b, :, since + i], v0[b, :, since + o])
    with pytest.raises(ValueError, match="slot offsets"):
        state.compact(since, [[0, 9], [0]])


def test_shipped_draft_tree_greedy_on_real_target():
    """The default pair (fp32 SmolLM2 + the shipped EAGLE-style draft): greedy tree decoding
    reproduces greedy decoding on a code prompt, and the tree accepts more than one token a step."""
    from specdec_lesson.bench.tasks import chat, code_problems, format_code_prompt
    from specdec_lesson.drafters.pair import load_default_pair

    target, drafter, tok = load_default_pair()
    ids = tok(chat(tok, format_code_prompt(code_problems("eval")[0])), add_special_tokens=False)["input_ids"]
    ref, _ = autoregressive_generate(target, [ids], 16, eos_token_id=tok.eos_token_id)
    out, stats = tree_generate(target, drafter, [ids], 16, tree=DynamicTree(depth=4, topk=4, num_nodes=16),
                               eos_token_id=tok.eos_token_id)
    assert torch.equal(out[0], ref[0])
    assert stats.tau > 1.5


def test_tree_generate_with_triton_compaction_matches_torch():
    """use_kernels=True routes KV compaction through the Triton kernel (the interpreter on a CPU):
    the same tokens as the torch reference path, contiguous and paged."""
    target = tiny_llama(vocab_size=64, seed=0)
    draft = tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)
    for paged in (False, True):
        ref, _ = tree_generate(target, draft, [[5, 17, 3, 44]], 10, tree=StaticTree((2, 2, 1)), paged=paged, use_kernels=False)
        out, _ = tree_generate(target, draft, [[5, 17, 3, 44]], 10, tree=StaticTree((2, 2, 1)), paged=paged, use_kernels=True)
        assert torch.equal(out[0], ref[0])


def test_tree_stats_count_a_path_ending_at_a_leaf_as_no_rejection():
    """Greedy, the target as its own draft, an EAGLE-2 tree pruned to 8 nodes: every step follows the target's
    argmax down to a leaf of the pruned tree (often shallower than depth 4) and draws the bonus from p.  No child was
    rejected, so the per-token alpha is 1 (it used to count a rejection whenever the path was shorter than the depth);
    utilisation (accepted / (steps x depth)) stays below 1."""
    self_draft = tiny_llama(hidden_size=32, num_layers=2, seed=0)
    out, stats = tree_generate(PAIR.target, self_draft, PROMPT_IDS, 30, tree=DynamicTree(depth=4, topk=3, num_nodes=8))
    assert stats.rejections == 0 and stats.alpha == 1.0 and stats.utilisation < 1.0
    _, weak = tree_generate(PAIR.target, PAIR.draft, PROMPT_IDS, 30, tree=DynamicTree(depth=4, topk=3, num_nodes=8))
    assert weak.rejections > 0 and weak.alpha < 1.0
