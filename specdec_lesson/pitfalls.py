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
7         one position counter for a ragged batch  transformers #29769 (batch > 1 refused)        wrong text
9         typical acceptance / threshold below 1   Medusa; vLLM #5015                             LOSSY by design
========  =======================================  =============================================  ==========

The numbers are the course's one numbering of pitfalls (``docs/pitfalls.md``, which also lists the
engine-level pitfalls 3c, 6 and 8, shown on the engine's caches and logits in notebooks 02 and 03).
Pitfall 7 is here as a context manager that plants a shared position counter in the engine's own
:class:`specdec_lesson.kvcache.SlotCache` (:func:`buggy_shared_positions`); pitfall 9 as two LOSSY
verifiers, which are not bugs of an implementation but a different algorithm sold as exact:
:func:`lossy_verify_relaxed` (an acceptance threshold below 1) and :func:`lossy_verify_typical`
(Medusa's typical acceptance).  :func:`count_acceptance` wraps any verifier to measure its acceptance.

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

import contextlib
from collections.abc import Callable, Iterator

import torch

from .sampling import SamplingConfig, logits_to_probs, sample_from_probs
from .verify import check_verify_inputs, draw_verify_randoms, race_sample, verify_chain, verify_chain_from_randoms

__all__ = [
    "BUGGY_DRAFT_STEPS", "BUGGY_VERIFIERS", "LOSSY_VERIFIERS", "buggy_shared_positions", "count_acceptance",
    "lossy_verify_relaxed", "lossy_verify_typical",
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


# --------------------------------------------------------------------- pitfall 7: the engine, patched
@contextlib.contextmanager
def buggy_shared_positions() -> Iterator[None]:
    """BUG (pitfall 7), as a context manager: inside it, every :class:`specdec_lesson.kvcache.SlotCache`
    (the engine's per-model cache) gives ALL rows of a batch the same positions, the slot index
    ``num_slots + 0..n-1``: one position counter for the batch, the cache's length.

    That is right while every row has the same number of valid slots, and wrong as soon as rows
    accept different numbers of drafts: a row that accepted fewer drafts has holes (rejected slots
    hidden by the mask), so its next token is really at position ``lengths[b]``, not at the slot
    index.  Its rotary embeddings then encode the wrong distances and its text drifts away from the
    row generated alone.  The library's fix: per-row ``SlotCache.lengths`` as the positions.  The lean path's
    :class:`specdec_lesson.lean.LeanSlotCache` (same slot bookkeeping) gets the same bug planted."""
    from .kvcache import SlotCache
    from .lean import LeanSlotCache

    originals = {cls: cls.forward for cls in (SlotCache, LeanSlotCache)}

    def buggy(original):
        def forward(self, tokens, new_valid=None, *, positions=None, **kw):
            if positions is None:
                B, n = tokens.shape
                positions = (self.num_slots + torch.arange(n, device=tokens.device)).expand(B, n)  # [B, n] shared
            return original(self, tokens, new_valid, positions=positions, **kw)
        return forward

    for cls, original in originals.items():
        cls.forward = buggy(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.forward = original


# -------------------------------------------------------------------------- pitfall 9: lossy verifiers
def lossy_verify_relaxed(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True, threshold: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LOSSY (pitfall 9): an acceptance threshold below 1.  Accepts x with probability
    min(1, p(x) / (threshold * q(x))) instead of min(1, p(x)/q(x)) (the uniform u is scaled by
    ``threshold``), then the exact rule's residual / bonus.  Acceptance rises; the output law moves
    from p towards q (threshold = 1 is :func:`verify_chain`, threshold -> 0 accepts every draft)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if validate:
        check_verify_inputs(target_probs, draft_probs, draft_tokens)
    B, K1, V = target_probs.shape
    uniforms, exponentials = draw_verify_randoms(B, K1 - 1, V, device=target_probs.device, dtype=target_probs.dtype,
                                                 generator=generator)
    return verify_chain_from_randoms(target_probs, draft_probs, draft_tokens, uniforms * threshold, exponentials)


def lossy_verify_typical(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None, *, validate: bool = True, epsilon: float = 0.09, delta: float = 0.3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LOSSY (pitfall 9): Medusa's *typical acceptance*.  Draft x_i is accepted when the target finds it
    typical enough, p_i(x_i) > min(epsilon, delta * exp(-H(p_i))) (H the entropy; Medusa's defaults
    posterior_threshold = 0.09, posterior_alpha = 0.3), with no random test and no look at q; after
    the accepted prefix the next token is sampled from p_n itself (no residual).  Every draft the
    target finds plausible passes, so the output over-represents the draft's choices among them."""
    if validate:
        check_verify_inputs(target_probs, draft_probs, draft_tokens)
    B, K1, V = target_probs.shape
    K = K1 - 1
    _, exponentials = draw_verify_randoms(B, K, V, device=target_probs.device, dtype=target_probs.dtype, generator=generator)
    entropy = -torch.special.xlogy(target_probs, target_probs).sum(-1)  # [B, K+1]
    bar = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))  # [B, K+1]
    p_x = target_probs[:, :K].gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)  # [B, K]
    num_accepted = (p_x > bar[:, :K]).to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [B]
    rows = torch.arange(B, device=target_probs.device)
    return num_accepted, race_sample(target_probs[rows, num_accepted], exponentials)


LOSSY_VERIFIERS = {
    "9 acceptance threshold 0.5": lossy_verify_relaxed,
    "9 typical acceptance (Medusa)": lossy_verify_typical,
}


def count_acceptance(verify_fn: Callable) -> tuple[Callable, dict]:
    """``verify_fn`` wrapped to count, over all its calls, ``accepted`` drafts, ``rejections`` (rows with
    n < K) and ``proposed`` drafts; returns ``(wrapped, counts)``.  ``counts["alpha"]()`` is the
    per-token acceptance accepted / (accepted + rejections), as ``SpecStats.alpha``."""
    counts = {"accepted": 0, "rejections": 0, "proposed": 0}

    def wrapped(target_probs, draft_probs, draft_tokens, generator=None, **kw):
        num_accepted, next_token = verify_fn(target_probs, draft_probs, draft_tokens, generator, **kw)
        K = draft_tokens.shape[1]
        counts["accepted"] += int(num_accepted.sum())
        counts["rejections"] += int((num_accepted < K).sum())
        counts["proposed"] += draft_tokens.numel()
        return num_accepted, next_token

    counts["alpha"] = lambda: counts["accepted"] / max(1, counts["accepted"] + counts["rejections"])
    return wrapped, counts
