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

Precision.  Verification computes in fp32 (fp64 when an input is fp64) and draws its random
numbers in that precision, whatever the laws' dtype.  bf16 / fp16 laws are upcast and
renormalised in fp32: that is the law ``torch.multinomial`` actually samples from (it
accumulates half-precision weights in fp32 and divides by their sum), so the q used to accept
is the q the draft was drawn from, and the emitted law is p / sum(p), the law plain sampling
from p would follow.  Half-precision *random numbers* would not be exact (bf16 uniforms take
a few hundred values, bf16 exponentials tie), so they are refused.
"""

from __future__ import annotations

import torch

__all__ = [
    "verify_chain",
    "verify_chain_from_randoms",
    "draw_verify_randoms",
    "check_verify_inputs",
    "prepare_verify_inputs",
    "verify_dtype",
    "as_verify_law",
    "race_sample",
]

HALF_DTYPES = (torch.float16, torch.bfloat16)


def verify_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The precision verification computes and draws its random numbers in: fp64 if any of
    ``dtypes`` is fp64, else fp32 (half-precision inputs are upcast)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def as_verify_law(probs: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``probs [..., V]`` in the verification precision ``dtype`` (default :func:`verify_dtype`).

    A bf16 / fp16 law is upcast and renormalised in fp32 (rows summing to 0 are left at 0):
    its rows sum to 1 only up to half-precision rounding, and the renormalised law is the one
    ``torch.multinomial`` samples from.  fp32 / fp64 laws are only cast (no copy when the
    dtype already matches)."""
    dtype = verify_dtype(probs.dtype) if dtype is None else dtype
    if probs.dtype not in HALF_DTYPES:
        return probs.to(dtype)
    law = probs.to(dtype)  # [..., V]
    return law / law.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)  # an all-zero row stays 0


def _prob_tolerance(dtype: torch.dtype) -> float:
    """How far a row may sum from 1: rounding of the dtype, with room for a softmax and a
    top-p renormalisation (4 eps for fp16 / bf16: 0.004 / 0.03)."""
    if dtype == torch.float64:
        return 1e-9
    if dtype in HALF_DTYPES:
        return max(1e-3, 4 * torch.finfo(dtype).eps)
    return 1e-3


def check_verify_inputs(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> None:
    """Raise ValueError naming the first problem with the shapes, dtypes or values.

    A batch of 0 rows is valid (verification then returns empty tensors)."""
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [B, K+1, V], got shape {tuple(target_probs.shape)}")
    B, K1, V = target_probs.shape
    K = K1 - 1
    if K < 1:
        raise ValueError(f"target_probs must cover K+1 >= 2 positions, got {K1}")
    if V < 1:
        raise ValueError("target_probs must have a non-empty vocabulary (V >= 1)")
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
    if B == 0:
        return
    if bool((draft_tokens < 0).any()) or bool((draft_tokens >= V).any()):
        raise ValueError(f"draft_tokens must lie in [0, {V}); got min {int(draft_tokens.min())}, max {int(draft_tokens.max())}")
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError(f"{name} must be finite and non-negative")
        err = float((t.sum(-1, dtype=torch.float64) - 1.0).abs().max())
        if err > _prob_tolerance(t.dtype):
            raise ValueError(f"{name} rows must sum to 1 (largest deviation {err:.3g}, tolerance for {t.dtype} "
                             f"{_prob_tolerance(t.dtype):.3g})")


def draw_verify_randoms(
    batch: int, k: int, vocab: int, *, device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers one verification step consumes: ``uniforms [B, K]`` in [0, 1)
    and ``exponentials [B, V]`` ~ Exp(1), clamped away from 0 so that w / E never divides by 0.

    ``dtype`` is the laws' dtype; the numbers are drawn in :func:`verify_dtype` of it (fp64 for
    fp64 laws, fp32 for fp32 / fp16 / bf16 laws), never in half precision."""
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    dtype = verify_dtype(dtype)
    uniforms = torch.rand(batch, k, device=device, dtype=dtype, generator=generator)  # [B, K]
    exponentials = torch.empty(batch, vocab, device=device, dtype=dtype).exponential_(generator=generator)  # [B, V]
    exponentials.clamp_(min=torch.finfo(dtype).tiny)
    return uniforms, exponentials


def race_sample(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Categorical draw proportional to non-negative ``weights [..., V]`` (exponential race),
    computed in :func:`verify_dtype` of the inputs (half-precision ratios would tie)."""
    dtype = verify_dtype(weights.dtype, exponentials.dtype)
    return (weights.to(dtype) / exponentials.to(dtype)).argmax(dim=-1)


def prepare_verify_inputs(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, uniforms: torch.Tensor, exponentials: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four float inputs in one verification precision (:func:`verify_dtype` of them all):
    laws through :func:`as_verify_law`, random numbers cast.  Raises ValueError for
    half-precision random numbers (draw them with :func:`draw_verify_randoms`).  Shared by the
    torch reference and the Triton wrapper, so both see the same numbers."""
    for name, t in (("uniforms", uniforms), ("exponentials", exponentials)):
        if not torch.is_floating_point(t) or t.dtype in HALF_DTYPES:
            raise ValueError(f"{name} must be fp32 or fp64 (draw them with draw_verify_randoms), got dtype {t.dtype}")
    dtype = verify_dtype(target_probs.dtype, draft_probs.dtype, uniforms.dtype, exponentials.dtype)
    return as_verify_law(target_probs, dtype), as_verify_law(draft_probs, dtype), uniforms.to(dtype), exponentials.to(dtype)


def verify_chain_from_randoms(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic core of :func:`verify_chain` given its random numbers (the torch
    reference of the fused Triton kernel).  Returns ``(num_accepted [B], next_token [B])``.

    Inputs go through :func:`prepare_verify_inputs` (fp32 / fp64 arithmetic whatever the laws'
    dtype; half-precision laws renormalised)."""
    target_probs, draft_probs, uniforms, exponentials = prepare_verify_inputs(target_probs, draft_probs, uniforms, exponentials)
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

    Any float dtype is accepted; the arithmetic and the random numbers are fp32 (fp64 for fp64
    laws), see the module docstring.  ``B = 0`` returns two empty tensors.

    Returns:
        ``num_accepted [B]`` in 0..K and ``next_token [B]``: the residual sample at the first
        rejection, or the bonus token from ``target_probs[:, K]`` when all K pass.
    """
    if validate:
        check_verify_inputs(target_probs, draft_probs, draft_tokens)
    B, K1, V = target_probs.shape
    uniforms, exponentials = draw_verify_randoms(
        B, K1 - 1, V, device=target_probs.device, dtype=verify_dtype(target_probs.dtype, draft_probs.dtype),
        generator=generator,
    )
    return verify_chain_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, exponentials)
