"""The engines' sampled laws (T > 0) against the target's exact law, in the cases the other law tests leave out.

Each test draws N independent generations and compares the law of the first 2-3 emitted tokens (the whole
emitted tuple, cut at EOS) with the target's autoregressive law, enumerated exactly from the float64 tiny target
(:func:`exact_law`).  Pearson chi-square, outcomes of expected count < 5 pooled; a test fails when p < 1e-3.
Power: :func:`_check` asserts that the test, with the degrees of freedom it actually had, rejects ANY alternative
at total variation >= the stated TV (over the tested cells) with probability >= 0.9 (the non-central chi-square
floor lambda >= 4 N TV^2, :func:`specdec_lesson.stats.min_noncentrality`).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_hybrid import _eagle

from specdec_lesson.drafters import EagleDrafter, HybridDrafter, ModelDrafter, noisy_copy
from specdec_lesson.drafters.adaptive_policy import StepCosts
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import logits_to_probs
from specdec_lesson.speculative import speculative_generate
from specdec_lesson.stats import chi_square_power, chi_square_test, min_noncentrality
from specdec_lesson.tree import AdaptiveTree, DynamicTree, HybridTreeDrafter, StaticTree, tree_generate

LEVEL = 1e-3


@pytest.fixture(autouse=True, params=[False, True], ids=["hf", "lean"])
def _forward_path(request, monkeypatch):
    """Every law test runs twice: on the Hugging Face forward and on the lean one (specdec_lesson.lean)."""
    monkeypatch.setattr("specdec_lesson.lean.slots.LEAN_BY_DEFAULT", request.param)


@torch.inference_mode()
def exact_law(target, prompt: list[int], n: int, temperature: float = 1.0, top_k=None, top_p=None, eos=None) -> dict:
    """Exact law of the emitted tuple of at most ``n`` tokens (cut after ``eos``, kept), by enumeration: one batched
    float64 forward per depth over every live prefix."""
    law, frontier = {}, {(): 1.0}
    for depth in range(n):
        seqs = list(frontier)
        logits = target(torch.tensor([prompt + list(s) for s in seqs])).logits[:, -1]  # [S, V]
        probs = logits_to_probs(logits, temperature, top_k, top_p).tolist()  # [S, V]
        new = {}
        for s, row in zip(seqs, probs):
            for tok, pt in enumerate(row):
                if pt > 0:
                    (law if tok == eos or depth == n - 1 else new)[s + (tok,)] = frontier[s] * pt
        frontier = new
    return law


def _check(counts: Counter, law: dict, tv: float) -> None:
    n = sum(counts.values())
    stat, dof, p = chi_square_test(counts, law)
    power = chi_square_power(n, dof, min_noncentrality(n, tv), LEVEL)
    assert power >= 0.9, f"N = {n}, {dof} dof: power {power:.3f} against TV {tv}"
    assert p > LEVEL, (stat, dof, p)


def _counts(outs) -> Counter:
    return Counter(tuple(row.tolist()) for row in outs)


@pytest.fixture(scope="module")
def pair8():
    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    return target, noisy_copy(target, 0.3, 5, relative=False)


def test_chain_law_with_eos_inside_a_step(pair8):
    """EOS inside a step: K = 3, max_new_tokens = 3, EOS = token 0 (P = 0.17 as the first token), a close draft, so
    EOS is often an accepted draft with accepted drafts after it that must be dropped.  N = 30,000 rows (3 calls of
    10,000), outcomes = the emitted tuples (1-3 tokens, EOS kept); level 1e-3; power >= 0.9 against TV 0.05 (asserted)."""
    target, draft = pair8
    prompt, eos = [1, 5, 2], 0
    law = exact_law(target, prompt, 3, eos=eos)
    g = torch.Generator().manual_seed(11)
    counts, cut = Counter(), 0
    for _ in range(3):
        out, stats = speculative_generate(target, ModelDrafter(draft), [prompt] * 10000, 3, k=3, temperature=1.0,
                                          generator=g, eos_token_id=eos)
        counts += _counts(out)
        raw = sum(n * c for h in stats.verify_hist.values() for n, c in enumerate(h))
        cut += raw - stats.accepted  # accepted by verification, dropped after EOS (or the budget)
    early_eos = sum(c for s, c in counts.items() if len(s) < 3)
    assert early_eos > 3000 and cut > 1500  # the case is exercised: EOS inside steps, accepted drafts dropped
    _check(counts, law, tv=0.05)


def test_chain_law_with_top_k_and_top_p(pair8):
    """T = 0.8 with top-k = 5 AND top-p = 0.85 (both truncations active: 3 or 4 tokens survive), K = 3, first 2
    tokens.  N = 10,000 rows; level 1e-3; power >= 0.9 against TV 0.05 (asserted).  A token outside the target's
    truncated support is an impossible outcome (statistic infinite)."""
    target, draft = pair8
    prompt = [1, 5, 2]
    law = exact_law(target, prompt, 2, 0.8, top_k=5, top_p=0.85)
    g = torch.Generator().manual_seed(12)
    counts = Counter()
    for _ in range(2):
        out, _ = speculative_generate(target, ModelDrafter(draft), [prompt] * 5000, 2, k=3, temperature=0.8, top_k=5,
                                      top_p=0.85, generator=g)
        counts += _counts(out)
    assert len({s[0] for s in counts}) == 4  # top-p cut the top-5 to 4 first tokens
    _check(counts, law, tv=0.05)


def test_chain_law_on_the_paged_cache(pair8):
    """paged=True (target and draft on PagedKVCache), T = 1, K = 1, first 2 tokens (a row whose draft is rejected
    takes a second step, after the paged rollback).  N = 10,000 rows (2 calls of 5,000); level 1e-3; power >= 0.9
    against TV 0.05 (asserted)."""
    target, draft = pair8
    prompt = [4]
    law = exact_law(target, prompt, 2)
    g = torch.Generator().manual_seed(13)
    counts = Counter()
    for _ in range(2):
        out, stats = speculative_generate(target, ModelDrafter(draft, paged=True), [prompt] * 5000, 2, k=1,
                                          temperature=1.0, generator=g, paged=True)
        counts += _counts(out)
    assert stats.rejections > 0 and stats.accepted > 0
    _check(counts, law, tv=0.05)


def test_chain_law_on_ragged_prompts(pair8):
    """Three prompts of lengths 1, 3 and 6 in ONE batch (left padding and the attention mask): once as a list of
    lists, once as a left-padded tensor with an explicit attention_mask.  K = 3, T = 1, first 2 tokens; each prompt
    against its own exact law.  N = 10,000 rows per prompt (2 calls x 5,000); level 1e-3 per prompt; power >= 0.9
    against TV 0.05 for each prompt (asserted)."""
    target, draft = pair8
    prompts = [[4], [1, 5, 2], [6, 3, 7, 0, 2, 5]]
    batch = [p for _ in range(5000) for p in prompts]  # interleaved: every row has neighbours of other lengths
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in batch])  # [B, L]
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch])  # [B, L]
    g = torch.Generator().manual_seed(14)
    counts = [Counter() for _ in prompts]
    for kwargs in ({"input_ids": batch}, {"input_ids": ids, "attention_mask": mask}):
        out, _ = speculative_generate(target, ModelDrafter(draft), max_new_tokens=2, k=3, temperature=1.0, generator=g,
                                      **kwargs)
        for i, row in enumerate(out):
            counts[i % 3][tuple(row.tolist())] += 1
    for prompt, c in zip(prompts, counts):
        _check(c, exact_law(target, prompt, 2), tv=0.05)


def test_hybrid_law_with_restricted_eagle_and_long_lookup_steps():
    """HybridDrafter at T = 1 over an EAGLE draft restricted to 4 of the 8 tokens (q = 0 elsewhere; prompt tokens
    not added), k = 1, lookup_k = 4, first 3 tokens.  Prompt A ends in a repeated 2-gram: a batch of A alone takes
    the lookup in every row, so its first step proposes K' = 2 > k drafts (the budget allows 2); later steps mix
    lookup rows and EAGLE rows.  Prompt B (no repeat) rows draft with the restricted EAGLE.  N = 12,000 A rows
    (8,000 alone + 4,000 mixed with B) and 8,000 B rows; level 1e-3 per prompt; power >= 0.9 against TV 0.08 per
    prompt (asserted)."""
    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    a, b = [1, 5, 2, 6, 1, 5], [1, 5, 2, 6, 3]
    sub = _eagle(target, n_sub=4, seed=4).model
    off = set(range(8)) - set(sub.d2t.tolist())
    law_a, law_b = exact_law(target, a, 3), exact_law(target, b, 3)
    assert sum(p for s, p in law_b.items() if off & set(s)) > 0.3  # the restriction matters: q = 0 where p > 0
    g = torch.Generator().manual_seed(15)
    counts = [Counter(), Counter()]
    long_steps = model_rows = 0
    for batch in ([a] * 8000, [a] * 4000 + [b] * 8000):
        drafter = HybridDrafter(EagleDrafter(sub, add_prompt_tokens=False), min_tokens=1, lookup_k=4)
        out, stats = speculative_generate(target, drafter, batch, 3, k=1, temperature=1.0, generator=g)
        long_steps += sum(sum(h) for kk, h in stats.verify_hist.items() if kk > 1)
        model_rows += drafter.model_steps
        for prompt, row in zip(batch, out):
            counts[prompt == b][tuple(row.tolist())] += 1
    assert long_steps >= 8000 and model_rows > 0  # K' > k happened, and the restricted EAGLE drafted
    _check(counts[0], law_a, tv=0.08)
    _check(counts[1], law_b, tv=0.08)


@pytest.mark.parametrize("spec", [StaticTree((2, 2), "sample"), DynamicTree(2, 2, 4)], ids=["static-iid", "dynamic-distinct"])
def test_tree_law(spec):
    """tree_generate at T = 1 (batch size 1, so one call per sample): i.i.d. children (StaticTree children="sample",
    rule "iid") and distinct children (EAGLE-2 DynamicTree, pruned to 4 of its 6 nodes; rule "distinct").  V = 4, a
    one-token prompt (no prefill forward: the calls stay cheap), a draft close to the target, first 2 tokens (16
    outcomes): the second is an accepted depth-2 node, or the residual / bonus after depth 1, or the first token of a
    second step after a rejection at the root.  N = 1,200 calls; level 1e-3; power >= 0.9 against TV 0.1 (asserted)."""
    target = tiny_llama(vocab_size=4, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.2, 5, relative=False)
    prompt = [1]
    law = exact_law(target, prompt, 2)
    g = torch.Generator().manual_seed(16)
    counts, deep, second_step = Counter(), 0, 0
    for _ in range(1200):
        out, stats = tree_generate(target, draft, [prompt], 2, tree=spec, temperature=1.0, generator=g)
        counts[tuple(out[0].tolist())] += 1
        deep += stats.accept_hist[2]
        second_step += stats.row_steps > 1
    assert deep > 60 and second_step > 60  # depth-2 acceptances and steps after a rejection both occur
    _check(counts, law, tv=0.1)


def test_adaptive_tree_law():
    """tree_generate at T = 1 with an AdaptiveTree (draft candidates and a grafted prompt-lookup chain, sized per step)
    and one HybridTreeDrafter for 50 calls in a row, so its acceptance record learns across calls and each call's
    trees depend on the samples before it: each sample must still follow the target's law.  V = 4, a prompt whose last
    2-gram appeared before (the lookup grafts from the first step), first 2 tokens (16 outcomes), N = 1,200 calls;
    level 1e-3; power >= 0.9 against TV 0.1 (asserted).  The trees vary (four shapes or more, lookup-only nodes on
    hundreds of steps, depth-2 acceptances), so the law is checked across the choices; with a rejected child
    left in the residual (planted in tree/verify.py's distinct rule), the same run fails."""
    target = tiny_llama(vocab_size=4, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.2, 5, relative=False)
    spec = AdaptiveTree(StepCosts.linear(1.0, 1.05, 0.01, 0.01), depth=2, topk=2, node_budget=4, lookup_len=3, min_tokens=1)
    prompt = [1, 2, 3, 1, 2]
    law = exact_law(target, prompt, 2)
    g = torch.Generator().manual_seed(16)
    counts, deep, shapes, lookup_steps = Counter(), 0, Counter(), 0
    for i in range(1200):
        if i % 50 == 0:  # a fresh record every 50 calls: learning from scratch again (a settled record picks one shape)
            drafter = HybridTreeDrafter(ModelDrafter(draft))
        out, stats = tree_generate(target, drafter, [prompt], 2, tree=spec, temperature=1.0, generator=g)
        counts[tuple(out[0].tolist())] += 1
        deep += stats.accept_hist[2]
        if i % 50 == 49:
            shapes.update(drafter.choices)
            lookup_steps += drafter.lookup_steps
    assert len(shapes) >= 4 and lookup_steps > 300 and deep > 30, (shapes, lookup_steps, deep)
    _check(counts, law, tv=0.1)
