"""Block verification (Sun et al. 2024, "Block verification accelerates speculative decoding",
arXiv 2403.10444, Algorithm 2): judge the drafted block as a whole, not token by token.

Notation (Leviathan): p = target law, q = draft law; the drafts X_1..X_K were drawn
X_i ~ q_i = q( . | prefix, X_<i), and p_i = p( . | prefix, X_<i), p_{K+1} the law after X_K.

Token-level verification (:mod:`specdec_lesson.verify`) stops at the first rejected token: a
draft with p_i(X_i) < q_i(X_i) costs the whole rest of the block even when the next drafts are
ones the target likes *more* than the draft does.  Block verification carries that credit along:

* a running weight  w_0 = 1,  w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))  (how much of the
  prefix X_1..X_i the target "still owes" the draft, capped at 1);
* the mass the target has left over after position i,  Z_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0),
  and the threshold  h_i = Z_i / (Z_i + 1 - w_i)  for i < K,  h_K = w_K  (0/0 when w_i = 1 and
  Z_i = 0: then h_i = 1);
* draw u_1..u_K ~ U[0, 1) and accept the *longest* prefix whose test passes:
  tau = max{i : u_i < h_i} (0 if none).  A failed test at i does not end the block: a later
  position can still pass, which is where the extra accepted tokens come from;
* if tau < K emit a token from  max(w_tau p_{tau+1} - q_{tau+1}, 0)  normalised (w_0 = 1 gives the
  usual residual at tau = 0), else the bonus token from p_{K+1}.

The output law is exactly the target's (the paper's Theorem 1; checked here with Fractions by
:mod:`specdec_lesson.toy_block` for K = 1..4, temperatures, top-k and top-p), and the expected
number of accepted drafts is never below token-level verification's and is the best any
verifier that sees only the drafted path's laws can reach (Theorem 2).  The paper's motivating
example (p = (1/3, 2/3), q = (2/3, 1/3) i.i.d., K = 2): token-level accepts 10/9 tokens per
step, block 11/9, and the coupling bound sum_i sum_{x^i} min(p(x^i), q(x^i)) is 12/9
(:func:`specdec_lesson.theory.expected_accepted_bound`).

Vectorisation: the recursion w_i = min(1, w_{i-1} r_i) (r_i = p_i(X_i) / q_i(X_i)) is a Lindley
recursion in the log domain, log w_i = S_i - max_{0 <= j <= i} S_j with S_i = sum_{m <= i} log r_m
(S_0 = 0), so all K weights come from one cumsum and one cummax; the K + 1 residual masses are one
``[B, K, V]`` reduction.  Random numbers, precision (fp32 / fp64, half-precision laws renormalised)
and the return convention are those of :func:`specdec_lesson.verify.verify_chain_from_randoms`, so
an engine can swap the two rules on the same ``uniforms [B, K]`` and ``exponentials [B, V]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import torch

from .chain import (
    as_verify_law,
    check_verify_inputs,
    draw_verify_randoms,
    prepare_verify_inputs,
    race_sample,
    verify_dtype,
)

__all__ = [
    "VERIFY_RULES", "block_thresholds", "verify_block_from_randoms", "verify_block", "expected_accepted_given_drafts",
    "block_thresholds_exact", "block_outcome_law", "token_outcome_law",
]

VERIFY_RULES = ("token", "block")
_LOG_RATIO_CAP = 1e4  # q(x) = 0 < p(x) (a draft q could not have drawn): log ratio +inf, capped so cumsums never meet inf - inf


def _drafted_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor):
    """``(p_i(X_i), q_i(X_i))``, each ``[B, K]``."""
    tok = draft_tokens.long().unsqueeze(-1)  # [B, K, 1]
    K = tok.shape[1]
    return target_probs[:, :K].gather(-1, tok).squeeze(-1), draft_probs.gather(-1, tok).squeeze(-1)


def block_thresholds(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights ``w [B, K+1]`` (w_0 .. w_K) and thresholds ``h [B, K]`` (h_1 .. h_K) of block
    verification, for laws already in the verification precision (fp32 / fp64)."""
    B, K1, V = target_probs.shape
    K = K1 - 1
    p_x, q_x = _drafted_probs(target_probs, draft_probs, draft_tokens)  # [B, K], [B, K]
    log_r = (p_x.log() - q_x.log()).clamp(max=_LOG_RATIO_CAP)  # [B, K]  -inf where p_i(X_i) = 0
    log_r = torch.where(p_x > 0, log_r, torch.full_like(log_r, float("-inf")))  # p = q = 0: 0/0 -> reject
    s = torch.cat([torch.zeros_like(log_r[:, :1]), log_r.cumsum(-1)], dim=-1)  # [B, K+1]  S_0 = 0, S_1 .. S_K
    w = torch.exp(s - s.cummax(-1).values)  # [B, K+1]  w_i = min(1, w_{i-1} r_i), Lindley form
    residual = (w[:, :K, None] * target_probs[:, :K] - draft_probs).clamp_min(0)  # [B, K, V] max(w_i p_{i+1} - q_{i+1}, 0)
    z = residual.sum(-1)  # [B, K]  Z_0 .. Z_{K-1}
    den = z[:, 1:] + (1 - w[:, 1:K])  # [B, K-1]  Z_i + 1 - w_i
    h_mid = torch.where(den > 0, z[:, 1:] / torch.where(den > 0, den, torch.ones_like(den)), torch.ones_like(den))  # 0/0 -> 1
    return w, torch.cat([h_mid, w[:, K:]], dim=-1)  # [B, K+1], [B, K] (h_K = w_K)


def verify_block_from_randoms(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic core of :func:`verify_block` given its random numbers: ``uniforms [B, K]``
    (u_i for the test at position i) and ``exponentials [B, V]`` (one race for the emitted token),
    exactly those of :func:`specdec_lesson.verify.draw_verify_randoms`.

    Returns ``(num_accepted [B], next_token [B])``: tau in 0..K and the token drawn from
    ``max(w_tau p_{tau+1} - q_{tau+1}, 0)`` (tau < K; falls back to p_{tau+1} if that is all zero,
    a case only rounding can reach) or from the bonus law p_{K+1} (tau = K)."""
    target_probs, draft_probs, uniforms, exponentials = prepare_verify_inputs(target_probs, draft_probs, uniforms, exponentials)
    B, K1, V = target_probs.shape
    K = K1 - 1
    w, h = block_thresholds(target_probs, draft_probs, draft_tokens)  # [B, K+1], [B, K]
    positions = torch.arange(1, K + 1, device=target_probs.device)  # [K]
    tau = torch.where(uniforms < h, positions, torch.zeros_like(positions)).amax(-1)  # [B] longest passing prefix
    rows = torch.arange(B, device=target_probs.device)
    bonus = (tau == K).unsqueeze(-1)  # [B, 1]
    p_row = target_probs[rows, tau]  # [B, V]  p_{tau+1} (the bonus law p_{K+1} when tau = K)
    q_row = torch.where(bonus, torch.zeros_like(p_row), draft_probs[rows, tau.clamp(max=K - 1)])  # [B, V]
    w_row = torch.where(bonus, torch.ones_like(w[:, :1]), w[rows, tau].unsqueeze(-1))  # [B, 1]
    residual = (w_row * p_row - q_row).clamp_min(0)  # [B, V]
    empty = ~(residual > 0).any(dim=-1, keepdim=True)  # [B, 1]  0/0 guard, as in verify_chain
    next_token = race_sample(torch.where(empty, p_row, residual), exponentials)  # [B]
    return tau, next_token


def verify_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of K drafted tokens per row: same arguments, random numbers and return
    convention as :func:`specdec_lesson.verify.verify_chain` (``target_probs [B, K+1, V]``,
    ``draft_probs [B, K, V]``, ``draft_tokens [B, K]`` -> ``(num_accepted [B], next_token [B])``)."""
    if validate:
        check_verify_inputs(target_probs, draft_probs, draft_tokens)
    B, K1, V = target_probs.shape
    uniforms, exponentials = draw_verify_randoms(
        B, K1 - 1, V, device=target_probs.device, dtype=verify_dtype(target_probs.dtype, draft_probs.dtype),
        generator=generator,
    )
    return verify_block_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, exponentials)


def expected_accepted_given_drafts(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, verify: str = "block",
) -> torch.Tensor:
    """E[accepted drafts | the drafted block] per row ``[B]`` under rule ``verify`` ("token" or
    "block"), the step's own uniform tests integrated out; same inputs as :func:`verify_block`.

    token: sum_i prod_{j <= i} min(1, r_j);  block: sum_i i h_i prod_{j > i} (1 - h_j) (tau is the
    last passing test).  Averaged over steps this has the mean of the counted accepted drafts with
    less variance (Rao-Blackwell), and it scores both rules on the *same* drafted blocks: a paired
    measurement of what block verification buys on a real model."""
    if verify not in VERIFY_RULES:
        raise ValueError(f"verify must be one of {VERIFY_RULES}, got {verify!r}")
    check_verify_inputs(target_probs, draft_probs, draft_tokens)
    dtype = verify_dtype(target_probs.dtype, draft_probs.dtype)
    target_probs, draft_probs = as_verify_law(target_probs, dtype), as_verify_law(draft_probs, dtype)
    K = draft_tokens.shape[1]
    if verify == "token":
        p_x, q_x = _drafted_probs(target_probs, draft_probs, draft_tokens)  # [B, K], [B, K]
        accept = (p_x / q_x).clamp(max=1).nan_to_num(0.0)  # [B, K]  min(1, p/q): p/0 -> 1 (accepted), 0/0 -> 0, as u q < p
        return accept.cumprod(-1).sum(-1)  # [B]
    _, h = block_thresholds(target_probs, draft_probs, draft_tokens)  # [B, K]
    after = torch.cat([(1 - h).flip(-1).cumprod(-1).flip(-1)[:, 1:], torch.ones_like(h[:, :1])], -1)  # [B, K] prod_{j>i}
    positions = torch.arange(1, K + 1, device=h.device, dtype=dtype)  # [K]
    return (positions * h * after).sum(-1)  # [B]


# ------------------------------------------------------------------ the exact twins (Fractions, one drafted block)

Law = Sequence[Fraction]


def _residual(p: Law, q: Law, w: Fraction) -> tuple[Fraction, ...]:
    r = [max(Fraction(0), w * a - b) for a, b in zip(p, q)]
    z = sum(r)
    return tuple(v / z for v in r) if z else tuple(p)


def block_thresholds_exact(p_laws: Sequence[Law], q_laws: Sequence[Law], drafts: Sequence[int]):
    """``(w, h)``: w_0..w_K and h_1..h_K in exact arithmetic (the definitions, no log domain)."""
    K = len(drafts)
    w = [Fraction(1)]
    for i, x in enumerate(drafts):
        p, q = Fraction(p_laws[i][x]), Fraction(q_laws[i][x])
        w.append(min(Fraction(1), w[-1] * p / q) if q else Fraction(int(p > 0 and w[-1] > 0)))
    h = []
    for i in range(1, K):
        z = sum(max(Fraction(0), w[i] * a - b) for a, b in zip(p_laws[i], q_laws[i]))
        den = z + 1 - w[i]
        h.append(z / den if den else Fraction(1))
    return w, h + [w[K]]


def block_outcome_law(p_laws: Sequence[Law], q_laws: Sequence[Law], drafts: Sequence[int]) -> dict:
    """Exact law ``{(tau, next_token): Fraction}`` of block verification given the drafts.

    ``p_laws``: K+1 target laws (p_1 .. p_{K+1}); ``q_laws``: K draft laws; ``drafts``: X_1..X_K.
    P(tau = i) = h_i prod_{j > i} (1 - h_j) (h_0 = 1): tau is the last passing test."""
    K = len(drafts)
    w, h = block_thresholds_exact(p_laws, q_laws, drafts)
    out: dict[tuple[int, int], Fraction] = {}
    for tau in range(K + 1):
        pr = Fraction(1) if tau == 0 else h[tau - 1]
        for j in range(tau, K):
            pr *= 1 - h[j]
        if not pr:
            continue
        law = p_laws[K] if tau == K else _residual(p_laws[tau], q_laws[tau], w[tau])
        for y, py in enumerate(law):
            if py:
                out[(tau, y)] = out.get((tau, y), Fraction(0)) + pr * py
    return out


def token_outcome_law(p_laws: Sequence[Law], q_laws: Sequence[Law], drafts: Sequence[int]) -> dict:
    """The same for token-level verification (Leviathan): P(n = i) = prod_{j <= i} a_j (1 - a_{i+1}),
    a_j = min(1, p_j(X_j) / q_j(X_j)); residual max(p_{i+1} - q_{i+1}, 0) normalised, bonus p_{K+1}."""
    K = len(drafts)
    out: dict[tuple[int, int], Fraction] = {}
    reach = Fraction(1)
    for n in range(K + 1):
        if n < K:
            p, q = Fraction(p_laws[n][drafts[n]]), Fraction(q_laws[n][drafts[n]])
            a = min(Fraction(1), p / q) if q else Fraction(int(p > 0))
            stop, law = reach * (1 - a), _residual(p_laws[n], q_laws[n], Fraction(1))
        else:
            a, stop, law = Fraction(0), reach, p_laws[K]
        for y, py in enumerate(law):
            if py and stop:
                out[(n, y)] = out.get((n, y), Fraction(0)) + stop * py
        reach *= a
    return out
