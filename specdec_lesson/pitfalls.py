"""WRONG on purpose: the speculative-sampling bugs real projects shipped (docs/pitfalls.md lists them).

Every function here is BUGGY and labelled so; each has the signature of the correct function
it imitates (:func:`specdec_lesson.toy.draft_step` for draft steps,
:func:`specdec_lesson.verify.verify_chain` for verification), so the same harness
(:func:`specdec_lesson.toy.sample_speculative`) runs the correct and the buggy versions and the
tests / notebook 01 measure how far each one moves the output law.

========  =======================================  =============================================  ==========
pitfall   bug                                      seen in                                        output law
========  =======================================  =============================================  ==========
1         greedy draft, softmax q                  jaymody #3, transformers #32867 / #47932       biased
2         q from other processing than sampled     vLLM #9834                                     biased
3a        bonus token by argmax at T > 0           vLLM PR #9730                                  biased
3b        bonus dropped on full acceptance         (efficiency bug)                               EXACT, slower
4         residual max(0, p - q) not guarded       jaymody #5 (0/0 -> NaN)                        wrong when it fires
5         generator reseeded inside the loop       feifeibear/LLMSpeculativeSampling              biased
========  =======================================  =============================================  ==========

The numbers are the course's one numbering of pitfalls (``docs/pitfalls.md``, which also lists the
engine-level pitfalls 3c and 6-9 that need caches and batches rather than one verification step).

Pitfall 3b is instructive: the token after a fully accepted chain is simply produced by the next
step, from the same context, so the law is unchanged (``speculative_joint(..., bonus=False)``
equals the target exactly) - it only wastes the target's K+1-th distribution and lowers the
tokens per step from (1 - a^(K+1)) / (1 - a) to that minus a^K (see the tests).
Pitfall 4 fires only when the residual is all zero at a rejection, which in exact arithmetic never
happens (rejection needs p(x) < q(x), hence mass of p - q elsewhere).  It happens in floating
point when p and q are nearly equal but rounded differently (e.g. a draft that is the target in
another precision); then 0/0 = NaN, and argmax over NaN silently returns token 0.
"""

from __future__ import annotations

import torch

from .sampling import SamplingConfig, logits_to_probs, sample_from_probs
from .verify import draw_verify_randoms, race_sample, verify_chain

__all__ = [
    "BUGGY_DRAFT_STEPS", "BUGGY_VERIFIERS",
    "buggy_draft_greedy_softmax_q", "buggy_draft_q_unprocessed",
    "buggy_verify_argmax_bonus", "buggy_verify_no_bonus", "buggy_verify_reseeded",
    "buggy_verify_unguarded", "buggy_verify_unguarded_from_randoms",
]


def buggy_draft_greedy_softmax_q(
    logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 1): the draft token is the argmax, but q is reported as the softmax law.

    The verifier then believes x was drawn from q and accepts it with probability
    min(1, p(x)/q(x)) as if it were random: the output over-represents the draft's favourite.
    Fix: report a one-hot q for a greedy draft, or sample the draft token from q."""
    q = sampling.probs(logits)  # [B, V]
    return logits.argmax(dim=-1), q


def buggy_draft_q_unprocessed(
    logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 2): the token is sampled with the run's temperature / top-k / top-p, but q is computed
    from the raw logits (T = 1, no filtering), i.e. not the law the token was drawn from."""
    sampled_from = sampling.probs(logits)  # [B, V]
    tok = sample_from_probs(sampled_from, generator)  # [B]
    return tok, logits_to_probs(logits, 1.0, validate=False)  # [B, V] the wrong q


def buggy_verify_argmax_bonus(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 3a): after K acceptances the bonus token is argmax p_K instead of a sample from p_K."""
    num_accepted, next_token = verify_chain(target_probs, draft_probs, draft_tokens, generator, validate=validate)
    K = draft_tokens.shape[1]
    greedy_bonus = target_probs[:, K].argmax(dim=-1)  # [B]
    return num_accepted, torch.where(num_accepted == K, greedy_bonus, next_token)


def buggy_verify_no_bonus(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 3b, efficiency only): no bonus token after K acceptances; next_token = -1 means none."""
    num_accepted, next_token = verify_chain(target_probs, draft_probs, draft_tokens, generator, validate=validate)
    K = draft_tokens.shape[1]
    return num_accepted, torch.where(num_accepted == K, torch.full_like(next_token, -1), next_token)


def buggy_verify_reseeded(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True, seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 5): the step reseeds its generator (``manual_seed(seed)`` "for reproducibility").

    Every step then reuses the same uniforms and exponentials, and the draft steps that follow
    reuse the same stream too: positions are no longer independent."""
    gen = generator if generator is not None else torch.default_generator
    gen.manual_seed(seed)
    return verify_chain(target_probs, draft_probs, draft_tokens, gen, validate=validate)


def buggy_verify_unguarded_from_randoms(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    uniforms: torch.Tensor, exponentials: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 4): the residual is normalised without a guard; an all-zero residual gives 0/0 = NaN
    and argmax over NaN returns the first NaN's index (token 0).  Otherwise identical to
    :func:`specdec_lesson.verify.verify_chain_from_randoms`."""
    B, K1, V = target_probs.shape
    K = K1 - 1
    tok = draft_tokens.long().unsqueeze(-1)  # [B, K, 1]
    p_x = target_probs[:, :K].gather(-1, tok).squeeze(-1)  # [B, K]
    q_x = draft_probs.gather(-1, tok).squeeze(-1)  # [B, K]
    num_accepted = (uniforms * q_x < p_x).to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [B]
    rows = torch.arange(B, device=target_probs.device)
    p_row = target_probs[rows, num_accepted]  # [B, V]
    q_row = draft_probs[rows, num_accepted.clamp(max=K - 1)]  # [B, V]
    q_row = torch.where((num_accepted < K).unsqueeze(-1), q_row, torch.zeros_like(q_row))
    residual = (p_row - q_row).clamp_min(0)  # [B, V]
    residual = residual / residual.sum(dim=-1, keepdim=True)  # [B, V]  NaN when the sum is 0
    return num_accepted, race_sample(residual, exponentials)


def buggy_verify_unguarded(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BUG (pitfall 4) with the :func:`verify_chain` signature (same random-number protocol)."""
    B, K1, V = target_probs.shape
    uniforms, exponentials = draw_verify_randoms(
        B, K1 - 1, V, device=target_probs.device, dtype=target_probs.dtype, generator=generator
    )
    return buggy_verify_unguarded_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, exponentials)


BUGGY_DRAFT_STEPS = {
    "1 greedy draft with softmax q": buggy_draft_greedy_softmax_q,
    "2 q not the law sampled from": buggy_draft_q_unprocessed,
}
BUGGY_VERIFIERS = {
    "3a argmax bonus token": buggy_verify_argmax_bonus,
    "3b bonus dropped (lossless, slower)": buggy_verify_no_bonus,
    "4 unguarded residual": buggy_verify_unguarded,
    "5 reseeded every step": buggy_verify_reseeded,
}
