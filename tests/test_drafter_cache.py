"""Pitfalls 3c and 6 (draft side): the draft's KV cache after each step.

Both bugs keep the output law exact (the target verifies everything), so no law test can see them; they
only lower acceptance.  With the draft equal to the target (float64), a correct draft cache makes every
greedy draft the target's own choice: every proposed draft is accepted.  A cache missing the bonus step's
d_K, or not trimmed back to the accepted prefix, feeds the draft a wrong context and drafts get rejected.
"""

from __future__ import annotations

import pytest
import torch

from specdec_lesson.drafters import ModelDrafter
from specdec_lesson.models import tiny_pair
from specdec_lesson.speculative import autoregressive_generate, speculative_generate

TARGET, _, _ = tiny_pair(vocab_size=64, seed=3)
PROMPTS = [[1, 5, 9, 2, 33, 17], [4, 4, 8], [60, 2, 7, 7, 11, 3, 19, 23]]  # ragged: left-padded in one batch


class ForgetsBonusDraft(ModelDrafter):
    """BUG (pitfall 3c): after a fully accepted step the pending block is ``[bonus]`` only; d_K, sampled but
    never fed, is missing from the draft cache."""

    def commit(self, num_accepted, next_token, target_hidden):
        super().commit(num_accepted, next_token, target_hidden)
        self.pending = next_token[:, None]  # [B, 1]
        self.pending_valid = torch.ones_like(self.pending, dtype=torch.bool)
        self.pending_holes = False


class UntrimmedDraft(ModelDrafter):
    """BUG (pitfall 6, draft side): the draft cache keeps every draft it fed, rejected ones included."""

    def commit(self, num_accepted, next_token, target_hidden):
        k = self.last_tokens.shape[1]
        super().commit(torch.full_like(num_accepted, k - 1), next_token, target_hidden)


def checked(cls):
    """``cls`` with a recorder: at every proposal, the largest difference between the draft's first law and
    the draft model's law recomputed from scratch over the row's committed history (no cache at all)."""

    class Checked(cls):
        def begin(self, prompt_ids, prompt_mask, target_hidden):
            super().begin(prompt_ids, prompt_mask, target_hidden)
            self.history = [row[m].tolist() for row, m in zip(prompt_ids, prompt_mask)]
            self.worst = 0.0

        def propose(self, k, sampling, generator):
            tokens, probs = super().propose(k, sampling, generator)
            with torch.inference_mode():
                for b, hist in enumerate(self.history):
                    logits = self.model(input_ids=torch.tensor([hist])).logits[0, -1]  # [V]
                    ref = sampling.probs(logits.double()[None])[0]  # [V]
                    self.worst = max(self.worst, float((probs[b, 0].double() - ref).abs().max()))
            return tokens, probs

        def commit(self, num_accepted, next_token, target_hidden):
            for b, (n, t) in enumerate(zip(num_accepted.tolist(), next_token.tolist())):
                self.history[b] += self.last_tokens[b, :n].tolist() + [t]
            super().commit(num_accepted, next_token, target_hidden)

    return Checked


def _run(drafter, paged: bool = False):
    g = torch.Generator().manual_seed(0)
    return speculative_generate(TARGET, drafter, PROMPTS, 24, k=4, temperature=1.0, generator=g, paged=paged)


@pytest.mark.parametrize("paged", [False, True])
def test_draft_cache_equals_recomputation(paged):
    """The correct drafter's law at every step equals a cache-free recomputation (within 1e-6), on a
    ragged left-padded batch, contiguous and paged."""
    drafter = checked(ModelDrafter)(TARGET, paged=paged)
    _run(drafter, paged)
    assert drafter.worst < 1e-6  # q is handed over in at least fp32


def test_self_draft_accepts_every_greedy_draft():
    out, stats = speculative_generate(TARGET, ModelDrafter(TARGET), PROMPTS, 24, k=4)
    ref, _ = autoregressive_generate(TARGET, PROMPTS, 24)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert stats.rejections == 0 and stats.accepted > 0 and stats.utilisation == 1.0


@pytest.mark.parametrize("bug", [ForgetsBonusDraft, UntrimmedDraft], ids=["missing-bonus-kv", "untrimmed"])
def test_draft_cache_bugs_are_caught(bug):
    """Each planted bug drafts from a wrong context: the recomputation check sees it (while the greedy text,
    verified by the target, stays exact)."""
    drafter = checked(bug)(TARGET)
    _run(drafter)
    assert drafter.worst > 1e-3
    out, _ = speculative_generate(TARGET, bug(TARGET), PROMPTS, 24, k=4)
    ref, _ = autoregressive_generate(TARGET, PROMPTS, 24)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
