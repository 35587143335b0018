"""Chain verification: modified rejection sampling (Leviathan et al. 2023, Alg. 1).

Notation (Leviathan): p = target law, q = draft law.  For drafted token x_i ~ q_i:

* accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
* at the first rejection, emit a token from the residual max(0, p_i - q_i) / Z;
* if all K drafts pass, emit a bonus token from p_K (the target's law after the last draft).

Everything is vectorized over the batch and the K positions: no Python loop over tokens
and no host sync.  Randomness is drawn once per call from an explicit generator:
``uniforms [B, K]`` for the accept tests and ``exponentials [B, V]`` for one categorical
draw per row by the exponential race  argmax_v w(v) / E(v),  E(v) ~ Exp(1) i.i.d., which
picks v with probability w(v) / sum(w) (no normalisation needed, and it is what the fused
Triton kernel reproduces bit for bit).
"""

from __future__ import annotations

import torch

__all__ = [
    "verify_chain",
    "verify_chain_from_randoms",
    "draw_verify_randoms",
    "check_verify_inputs",
    "race_sample",
]


def _prob_tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-3


def check_verify_inputs(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> None:
    """Raise ValueError naming the first problem with the shapes, dtypes or values."""
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [B, K+1, V], got shape {tuple(target_probs.shape)}")
    B, K1, V = target_probs.shape
    K = K1 - 1
    if K < 1:
        raise ValueError(f"target_probs must cover K+1 >= 2 positions, got {K1}")
    if tuple(draft_probs.shape) != (B, K, V):
        raise ValueError(
            f"draft_probs must be [B, K, V] = {(B, K, V)} to match target_probs {tuple(target_probs.shape)}, "
            f"got {tuple(draft_probs.shape)}"
        )
    if tuple(draft_tokens.shape) != (B, K):
        raise ValueError(f"draft_tokens must be [B, K] = {(B, K)}, got {tuple(draft_tokens.shape)}")
    if not (torch.is_floating_point(target_probs) and torch.is_floating_point(draft_probs)):
        raise ValueError("target_probs and draft_probs must be floating-point tensors")
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"draft_tokens must be an integer tensor, got dtype {draft_tokens.dtype}")
    if bool((draft_tokens < 0).any()) or bool((draft_tokens >= V).any()):
        raise ValueError(f"draft_tokens must lie in [0, {V}); got min {int(draft_tokens.min())}, max {int(draft_tokens.max())}")
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError(f"{name} must be finite and non-negative")
        err = float((t.sum(-1, dtype=torch.float64) - 1.0).abs().max())
        if err > _prob_tolerance(t.dtype):
            raise ValueError(f"{name} rows must sum to 1 (largest deviation {err:.3g})")


def draw_verify_randoms(
    batch: int, k: int, vocab: int, *, device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers one verification step consumes: ``uniforms [B, K]`` in [0, 1)
    and ``exponentials [B, V]`` ~ Exp(1), clamped away from 0 so that w / E never divides by 0."""
    uniforms = torch.rand(batch, k, device=device, dtype=dtype, generator=generator)  # [B, K]
    exponentials = torch.empty(batch, vocab, device=device, dtype=dtype).exponential_(generator=generator)  # [B, V]
    exponentials.clamp_(min=torch.finfo(dtype).tiny)
    return uniforms, exponentials


def race_sample(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Categorical draw proportional to non-negative ``weights [..., V]`` (exponential race)."""
    return (weights / exponentials).argmax(dim=-1)


def verify_chain_from_randoms(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic core of :func:`verify_chain` given its random numbers (the torch
    reference of the fused Triton kernel).  Returns ``(num_accepted [B], next_token [B])``."""
    B, K1, V = target_probs.shape
    K = K1 - 1
    tok = draft_tokens.long().unsqueeze(-1)  # [B, K, 1]
    p_x = target_probs[:, :K].gather(-1, tok).squeeze(-1)  # [B, K]
    q_x = draft_probs.gather(-1, tok).squeeze(-1)  # [B, K]
    # u < p/q  <=>  u*q < p : never divides, q(x) = 0 with p(x) > 0 accepts, p(x) = 0 rejects.
    accepted = uniforms * q_x < p_x  # [B, K]
    num_accepted = accepted.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [B]
    rows = torch.arange(B, device=target_probs.device)
    p_row = target_probs[rows, num_accepted]  # [B, V]  law at the first rejection (or the bonus law p_K)
    q_row = draft_probs[rows, num_accepted.clamp(max=K - 1)]  # [B, V]
    q_row = torch.where((num_accepted < K).unsqueeze(-1), q_row, torch.zeros_like(q_row))  # bonus: q = 0
    residual = (p_row - q_row).clamp_min(0)  # [B, V]  max(0, p - q)
    # Guard (pitfall 4): an all-zero residual (p == q up to rounding) would be 0/0; fall back to p.
    empty = ~(residual > 0).any(dim=-1, keepdim=True)  # [B, 1]
    weights = torch.where(empty, p_row, residual)  # [B, V]
    next_token = race_sample(weights, exponentials)  # [B]
    return num_accepted, next_token


def verify_chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of K drafted tokens per row.

    Args:
        target_probs: ``[B, K+1, V]`` target law at each drafted position and after the last.
        draft_probs: ``[B, K, V]`` the law each draft token was *actually sampled from*
            (one-hot rows for a greedy / deterministic draft).
        draft_tokens: ``[B, K]`` the drafted token ids.
        generator: the explicit source of randomness.
        validate: check shapes and that the rows are probability laws (host syncs);
            the engine turns it off in its hot loop after checking its own inputs.

    Returns:
        ``num_accepted [B]`` in 0..K and ``next_token [B]``: the residual sample at the first
        rejection, or the bonus token from ``target_probs[:, K]`` when all K pass.
    """
    if validate:
        check_verify_inputs(target_probs, draft_probs, draft_tokens)
    B, K1, V = target_probs.shape
    uniforms, exponentials = draw_verify_randoms(
        B, K1 - 1, V, device=target_probs.device, dtype=target_probs.dtype, generator=generator
    )
    return verify_chain_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, exponentials)
