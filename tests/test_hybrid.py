"""HybridDrafter (prompt lookup where the context repeats, the EAGLE draft elsewhere): exact greedy and sampled laws."""

from __future__ import annotations

import pytest
import torch
from test_speculative import _exact_joint

from specdec_lesson.drafters import ModelDrafter
from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
from specdec_lesson.drafters.hybrid import HybridDrafter
from specdec_lesson.models import tiny_llama
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.stats import chi_square_test


def _eagle(target, dtype=torch.float64, n_sub=None, seed=0):
    torch.manual_seed(seed)
    V = target.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    d2t = torch.arange(V) if n_sub is None else torch.randperm(V, generator=g)[:n_sub].sort().values
    model = EagleDraft(EagleConfig.from_target(target, len(d2t)), *_target_tables(target, dtype), d2t=d2t).to(dtype)
    return EagleDrafter(model.eval())


# repeated n-grams (lookup fires), and none (the model drafts): batches mix both kinds of rows
PROMPTS = [[3, 9, 27, 3, 9, 27, 3, 9, 27, 3, 9], [5, 17, 3, 44, 9], [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]]


@pytest.mark.parametrize("k,lookup_k", [(1, None), (3, None), (4, 8), (6, 3)])
def test_hybrid_greedy_equals_target_greedy(k, lookup_k):
    target = tiny_llama(vocab_size=64, seed=0)  # float64
    alone = [autoregressive_generate(target, [p], 28)[0][0] for p in PROMPTS]
    for b in (1, 2, 3):
        drafter = HybridDrafter(_eagle(target, n_sub=40), lookup_k=lookup_k, min_tokens=min(2, k))
        out, stats = speculative_generate(target, drafter, PROMPTS[:b], 28, k=k)
        for row, ref in zip(out, alone[:b]):
            assert torch.equal(row, ref)
        assert drafter.lookup_steps > 0
        if b > 1:
            assert drafter.model_steps > 0


def test_hybrid_needs_a_drafter_that_commits_foreign_tokens():
    target = tiny_llama(vocab_size=64, seed=0)
    with pytest.raises(ValueError, match="accepts_foreign_proposals"):
        HybridDrafter(ModelDrafter(target))
    with pytest.raises(ValueError, match="min_tokens"):
        HybridDrafter(_eagle(target), min_tokens=0)


def test_hybrid_sampled_law_matches_target():
    """Joint law of the first 2 tokens, K=1, two prompts in every batch: prompt A ends in a repeated 2-gram (its
    rows take the lookup, with a one-hot law), prompt B has none (the EAGLE draft's law), so steps mix both kinds
    of rows.  V = 8, N = 6000 rows per prompt, Pearson chi-square (cells of expected count < 5 pooled), fail at
    p < 1e-3 (false alarm 0.1% per prompt).  Power: the same test rejects a planted bug in which lookup rows
    report the model's law instead of their one-hot law (asserted below)."""
    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    a, b = [1, 5, 2, 6, 1, 5], [1, 5, 2, 6, 3]
    laws = [_exact_joint(target, p, 2, 1.0) for p in (a, b)]
    g = torch.Generator().manual_seed(77)

    def sample(cls):
        counts: list[dict] = [{}, {}]
        for _ in range(12):
            drafter = cls(_eagle(target, seed=4), min_tokens=1)
            out, _ = speculative_generate(target, drafter, [a] * 500 + [b] * 500, 2, k=1, temperature=1.0, generator=g)
            assert drafter.lookup_steps > 0 and drafter.model_steps > 0
            for i, row in enumerate(out):
                key = tuple(row.tolist())
                counts[i >= 500][key] = counts[i >= 500].get(key, 0) + 1
        return counts

    for counts, law in zip(sample(HybridDrafter), laws):
        stat, dof, p = chi_square_test(counts, law)
        assert p > 1e-3, (stat, dof, p)

    class ModelLawOnLookupRows(HybridDrafter):  # planted: a lookup row keeps the model's q
        @staticmethod
        def _set_lookup_law(probs, tokens):
            return None

    stat_b, _, p_b = chi_square_test(sample(ModelLawOnLookupRows)[0], laws[0])
    assert p_b < 1e-3, (stat_b, p_b)


def test_stats_take_more_drafts_than_k():
    from specdec_lesson.stats import SpecStats

    s = SpecStats(k=2)
    s.record([5, 1], [6, 2], [True, True], k_step=8)
    assert s.accept_hist == [0, 1, 0, 0, 0, 1] and s.proposed == 16 and s.accepted == 6


class _Widths(HybridDrafter):
    """Records each proposal's width K' (whichever entry point the engine calls) and the most drafts the token
    budget could use at that step (r - 1 for the row with the most tokens r left, replayed from the commits)."""

    def begin(self, prompt_ids, prompt_mask, target_hidden):
        super().begin(prompt_ids, prompt_mask, target_hidden)
        self.left, self.widths, self.usable = [self.max_new] * prompt_ids.shape[0], [], []

    def _log(self, out):
        self.widths.append(out[0].shape[1])
        self.usable.append(max(1, max(self.left) - 1))
        return out

    def propose(self, k, sampling, generator):
        return self._log(HybridDrafter.propose(self, k, sampling, generator))

    def propose_within(self, k, limit, sampling, generator):
        return self._log(HybridDrafter.propose_within(self, k, limit, sampling, generator))

    def commit(self, num_accepted, next_token, target_hidden):
        self.left = [r - min(n + 1, r) for r, n in zip(self.left, num_accepted.tolist())]
        super().commit(num_accepted, next_token, target_hidden)


@pytest.mark.parametrize("max_new", [2, 3, 6])
def test_hybrid_never_proposes_past_the_token_budget(max_new):
    """k = 2, lookup_k = 4 on periodic prompts (every row takes the lookup): a row with r tokens left can emit at
    most r - 1 accepted drafts, so no step may propose more.  With max_new_tokens = 3 the hybrid used to propose 4
    drafts in its first step (2 usable), wasting target work and inflating ``proposed``."""
    target = tiny_llama(vocab_size=64, seed=0)
    prompt = [3, 9, 27, 5, 11] * 3 + [3, 9]  # period 5: the lookup's continuations are up to 5 tokens long
    drafter = _Widths(_eagle(target, n_sub=40), lookup_k=4, min_tokens=1)
    drafter.max_new = max_new
    out, stats = speculative_generate(target, drafter, [prompt, prompt[3:]], max_new, k=2)
    assert [len(r) for r in out] == [max_new, max_new]
    assert all(w <= u for w, u in zip(drafter.widths, drafter.usable)), (drafter.widths, drafter.usable)
    assert stats.proposed == 2 * sum(drafter.widths) and drafter.lookup_steps > 0
    assert drafter.widths[0] == min(4, max(1, max_new - 1))  # lookup_k still applies within the budget


def test_context_check_covers_the_longest_proposal():
    """prompt 500 + max_new_tokens 6 + k 2 fits a context of 512, but an all-lookup step may propose lookup_k = 8."""
    target = tiny_llama(vocab_size=64, seed=0)
    prompt = [[1, 2, 3, 4] * 125]
    with pytest.raises(ValueError, match=r"drafts per step \(8\) exceeds the model's context of 512"):
        speculative_generate(target, HybridDrafter(_eagle(target), lookup_k=8), prompt, 6, k=2)
    assert HybridDrafter(_eagle(target), lookup_k=8).max_proposal(2) == 8
    assert HybridDrafter(_eagle(target)).max_proposal(3) == 3 and _eagle(target).max_proposal(3) == 3
