"""The autoregressive baseline and the speculative decoder (chain), with KV caches.

One speculative step, for every row of the batch at once:

1. the drafter proposes K tokens ``d_1..d_K`` and their laws q, never more than the token budget
   can use (``Drafter.propose_within``: K <= r - 1 for the row with the most tokens r left);
2. ONE target forward over ``[pending, d_1..d_K]`` (K+1 positions) gives p;
3. ``verify_chain`` accepts a prefix of n drafts and draws the next token (residual or bonus);
4. both caches roll back to the accepted prefix (per row: ragged batches keep holes that the
   attention mask hides), and ``next`` becomes the new pending token.

``pending`` is the last committed token whose KV entry is not in the target cache yet, so
every target forward both writes the KV of what was committed and scores what was drafted.
One host transfer per step (accepted counts and tokens), none per token, plus one finiteness check of the logits
per forward (``sampling.check_logits``: NaN logits from damaged weights raise, naming the model and the step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .drafters import Drafter, ModelDrafter
from .drafters.base import hidden_request
from .generation import Clock, Outputs, blame, check_run, eos_of, prepare_inputs
from .lean import make_cache
from .models import check_same_vocab
from .sampling import SamplingConfig, as_float, greedy_tokens, sample_from_probs
from .stats import SpecStats
from .verify import VERIFY_RULES, draw_verify_randoms, race_sample, verify_block_from_randoms, verify_chain_from_randoms

__all__ = ["autoregressive_generate", "speculative_generate", "prepare_inputs"]  # prepare_inputs re-exported


@torch.inference_mode()
def autoregressive_generate(
    target: torch.nn.Module, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
    top_p: float | None = None, generator: torch.Generator | None = None, *, eos_token_id=None, attention_mask=None,
    paged: bool = False, lean: bool | None = None,
) -> tuple[list[torch.Tensor], SpecStats]:
    """The baseline: one target forward (with a KV cache) per token.  Returns per-row new tokens.  ``lean``: the
    lean forward for a supported Llama target (:func:`specdec_lesson.lean.make_cache`; None: ``LEAN_BY_DEFAULT``)."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    device = next(target.parameters()).device
    ids, mask = prepare_inputs(input_ids, attention_mask, device)
    check_run(target, ids, max_new_tokens)
    B, L = ids.shape
    clock, stats = Clock(device), SpecStats(k=0)
    out = Outputs(B, max_new_tokens, eos_of(target, eos_token_id))
    t0 = clock()
    state = make_cache(target, B, device, lean=lean, paged=paged, capacity=L + max_new_tokens)
    if L > 1:
        state.forward(ids[:, :-1], mask[:, :-1], has_holes=not bool(mask.all()), logits_to_keep=1)
        stats.target_forwards += 1
    pending = ids[:, -1:]  # [B, 1]
    stats.time_prefill = clock() - t0
    step = 0
    while not out.all_done:
        t1 = clock()
        step += 1
        logits, _ = state.forward(pending)  # [B, 1, V]
        if sampling.greedy:  # the argmax of the one-hot law sampling.probs would build, without building it
            tok = greedy_tokens(logits[:, -1], "target", step)  # [B]; NaN logits raise
        else:
            tok = sample_from_probs(sampling.probs(as_float(logits[:, -1]), "target", step), generator)  # [B]
        stats.target_forwards += 1
        t2 = clock()
        active = [not d for d in out.done]
        emitted = [out.emit(b, [t]) for b, t in enumerate(tok.tolist())]
        stats.record([0] * B, emitted, active, k_step=0)
        pending = tok[:, None]
        stats.time_verify += t2 - t1
        stats.time_other += clock() - t2
    return out.tensors(device), stats


def _use_kernels(flag: bool | None, device: torch.device) -> bool:
    if flag is False or (flag is None and device.type != "cuda"):
        return False
    from .kernels import kernels_available  # triton is imported only here

    ok = device.type == "cuda" and kernels_available()
    if flag and not ok:
        raise ValueError("use_kernels=True needs CUDA and triton")
    return ok


@torch.inference_mode()
def speculative_generate(
    target: torch.nn.Module, draft, input_ids, max_new_tokens: int, k: int = 4, temperature: float = 0.0,
    top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None, *,
    eos_token_id=None, attention_mask=None, paged: bool = False, use_kernels: bool | None = None, verify: str = "token",
    observe: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None, trace=None,
    lean: bool | None = None,
) -> tuple[list[torch.Tensor], SpecStats]:
    """Speculative decoding (chain of ``k`` drafts per step), exact in distribution.

    ``draft`` is a Hugging Face causal LM sharing the target's vocabulary, or a
    :class:`~specdec_lesson.drafters.Drafter` (e.g. ``PromptLookupDrafter()``).  Returns per-row
    new tokens (EOS kept, nothing after it) and a :class:`SpecStats`.

    ``verify``: ``"token"`` (Leviathan's token-level rule, default; ``use_kernels`` may fuse it) or
    ``"block"`` (block verification, Sun et al. 2024, :mod:`specdec_lesson.verify.block`): also
    exact, the same random numbers, never fewer accepted drafts in expectation (torch only).

    ``lean``: the lean forward (static KV cache, fused weights) for a supported Llama target and model draft
    (:func:`specdec_lesson.lean.make_cache`; None: ``LEAN_BY_DEFAULT``; other models use the Hugging Face forward).

    ``observe``: a measurement hook, called before each step's verification with
    ``(target_probs [B, K+1, V], draft_probs [B, K, V], draft_tokens [B, K])`` (e.g. to score both
    rules on the same blocks with :func:`~specdec_lesson.verify.expected_accepted_given_drafts`);
    it must not change them.  Not called on steps that proposed nothing.

    ``trace``: None (default: nothing recorded) or a :class:`specdec_lesson.lab.Trace`, filled with each
    step's drafts, accepted count, correction / bonus token and draft / verify times per row, from the host
    list the step transfers anyway (``lab.render`` draws it as coloured text)."""
    if observe is not None and not callable(observe):
        raise ValueError(f"observe must be a callable or None, got {type(observe).__name__}")
    if trace is not None and not (callable(getattr(trace, "start", None)) and callable(getattr(trace, "record", None))):
        raise ValueError(f"trace must be None or a specdec_lesson.lab.Trace(), got {type(trace).__name__}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if verify not in VERIFY_RULES:
        raise ValueError(f"verify must be one of {VERIFY_RULES}, got {verify!r}")
    sampling = SamplingConfig(temperature, top_k, top_p)
    device = next(target.parameters()).device
    ids, mask = prepare_inputs(input_ids, attention_mask, device)
    if isinstance(draft, Drafter):
        drafter = draft
    elif isinstance(draft, torch.nn.Module):
        check_same_vocab(target, draft)
        drafter = ModelDrafter(draft, paged=paged, lean=lean)
    else:
        raise ValueError(f"draft must be a causal LM or a Drafter, got {type(draft).__name__}")
    k_max = drafter.max_proposal(k)  # the longest proposal one step may make (HybridDrafter: lookup_k)
    check_run(target, ids, max_new_tokens, k_max)
    kernels = verify == "token" and _use_kernels(use_kernels, device)  # the fused kernel is the token rule
    need_hidden = hidden_request(drafter)  # False, True (last hidden state) or layer indices
    B, L = ids.shape
    V = target.get_output_embeddings().weight.shape[0]
    clock, stats = Clock(device), SpecStats(k=k)
    out = Outputs(B, max_new_tokens, eos_of(target, eos_token_id))
    draft_forwards0 = drafter.forwards
    t0 = clock()
    state = make_cache(target, B, device, lean=lean, paged=paged, capacity=L + max_new_tokens + k_max)
    hidden = None
    if L > 1:
        _, hidden = state.forward(ids[:, :-1], mask[:, :-1], has_holes=not bool(mask.all()), output_hidden=need_hidden,
                                  logits_to_keep=1)
        stats.target_forwards += 1
    drafter.begin(ids, mask, hidden)
    if trace is not None:
        trace.start(ids, mask, k)
    pending = ids[:, -1:]  # [B, 1]
    stats.time_prefill = clock() - t0
    step = 0
    # greedy with the chain rule: no law is materialised and no random number drawn, as in plain greedy decoding
    # (the block rule, the Triton kernel and an ``observe`` hook get the laws as at T > 0)
    greedy_fast = sampling.greedy and verify != "block" and not kernels and observe is None
    while not out.all_done:
        t1 = clock()
        step += 1
        limit = max(1, out.max_remaining() - 1)  # a row with r tokens left emits at most r - 1 accepted drafts
        with blame("draft", step):  # NaN draft logits raise, naming the draft
            draft_tokens, draft_probs = drafter.propose_within(k, limit, sampling, generator)
        K = draft_tokens.shape[1]  # [B, K]
        if K > limit:
            raise RuntimeError(f"{type(drafter).__name__} proposed {K} drafts, more than the {limit} this step allows")
        t2 = clock()
        since = state.num_slots
        logits, hidden = state.forward(torch.cat([pending, draft_tokens], 1), output_hidden=need_hidden)  # [B, K+1, V]
        stats.target_forwards += 1
        if greedy_fast:  # T = 0: the verification below with one-hot laws, from the argmax alone, on the host
            num_accepted, next_token, host = _greedy_verify(logits, draft_tokens, step)  # [B], [B], [B][2 + K]
        else:
            target_probs = sampling.probs(as_float(logits), "target", step)  # [B, K+1, V]; NaN logits raise
            if K == 0:  # nothing proposed: a plain step
                num_accepted = torch.zeros(B, dtype=torch.long, device=device)
                _, expo = draw_verify_randoms(B, 0, V, device=device, dtype=target_probs.dtype, generator=generator)
                next_token = race_sample(target_probs[:, 0], expo)  # [B]
            else:
                if draft_probs is None:  # deterministic drafter: q is one-hot
                    draft_probs = torch.nn.functional.one_hot(draft_tokens, V).to(target_probs.dtype)  # [B, K, V]
                if observe is not None:
                    observe(target_probs, draft_probs, draft_tokens)
                uni, expo = draw_verify_randoms(B, K, V, device=device, dtype=target_probs.dtype, generator=generator)
                if verify == "block":
                    verify_fn = verify_block_from_randoms
                else:
                    verify_fn = _triton_verify if kernels else verify_chain_from_randoms
                num_accepted, next_token = verify_fn(target_probs, draft_probs.to(target_probs.dtype), draft_tokens,
                                                     uni, expo)
            host = torch.cat([num_accepted[:, None], next_token[:, None], draft_tokens], 1).tolist()  # one sync per step
        t3 = clock()
        active = [not d for d in out.done]
        n_acc = [row[0] for row in host]
        emitted = [out.emit(b, row[2:2 + row[0]] + [row[1]]) for b, row in enumerate(host)]
        stats.record(n_acc, emitted, active, k_step=K)
        if trace is not None:
            trace.record(step, host, emitted, active, t2 - t1, t3 - t2)
        state.rollback(since, [n + 1 for n in n_acc])  # pending + accepted drafts stay
        if not out.all_done:
            drafter.commit(num_accepted, next_token, hidden)
        pending = next_token[:, None]
        t4 = clock()
        stats.time_draft += t2 - t1
        stats.time_verify += t3 - t2
        stats.time_other += t4 - t3
    stats.draft_forwards = drafter.forwards - draft_forwards0
    return out.tensors(device), stats


def _greedy_verify(logits: torch.Tensor, draft_tokens: torch.Tensor,
                   step: int) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """``verify_chain`` at T = 0, where p is one-hot on the argmax (ties to the lowest id): draft x passes iff it is
    the argmax, and the token after the accepted prefix (residual or bonus) is the argmax there.  Returns
    ``(num_accepted [B], next_token [B])``, equal to the full verification's (tests/test_speculative.py), and the
    step's host rows ``[num_accepted, next_token, *drafts]``, all from one transfer of the argmax and the drafts (a
    few list operations instead of five small tensor ones after the forward)."""
    best = greedy_tokens(logits, "target", step)  # [B, K+1] the first maximal index; NaN logits raise
    K = draft_tokens.shape[1]
    rows = []
    for row in torch.cat([best, draft_tokens.to(best.dtype)], 1).tolist():  # [B, 2K+1]: argmax, then the drafts
        top, drafts = row[:K + 1], row[K + 1:]
        n = next((j for j in range(K) if drafts[j] != top[j]), K)
        rows.append([n, top[n]] + drafts)
    return (torch.tensor([r[0] for r in rows], device=logits.device),
            torch.tensor([r[1] for r in rows], device=logits.device), rows)


def _triton_verify(target_probs, draft_probs, draft_tokens, uniforms, exponentials):
    from .kernels import verify_chain_triton

    return verify_chain_triton(target_probs, draft_probs, draft_tokens, uniforms, exponentials)
