"""From logits to the probability law a token is actually sampled from.

Speculative sampling is exact only if the draft law q and the target law p are the
laws the tokens are really drawn from, after *the same* temperature / top-k / top-p
processing (pitfall 2 in docs/pitfalls.md).  Both models therefore go through this one function.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "logits_to_probs", "sample_from_probs", "check_sampling_args", "SamplingConfig", "as_float", "check_logits",
    "NonFiniteLogitsError", "SubsetLogits", "greedy_tokens",
]


class NonFiniteLogitsError(ValueError):
    """A model produced NaN / +inf logits (or a row of -inf only): its weights are damaged, so every token it
    would emit is garbage (greedy decoding would repeat token 0).  ``model`` names it (``"target"``,
    ``"draft"``), ``step`` the decoding step (None: outside a run); the engines fill both in."""

    def __init__(self, model: str | None = None, step: int | None = None) -> None:
        self.model, self.step = model, step
        who = f"the {model} model's" if model else "a model's"
        at = f" at decoding step {step}" if step is not None else ""
        super().__init__(
            f"{who} logits hold NaN or infinite values{at}: its weights are damaged; if it was loaded from the "
            "converted-weights cache, delete that model's folder under $SPECDEC_CACHE (default ~/.cache/specdec_lesson) "
            "and load it again")


def check_logits(logits: torch.Tensor, model: str | None = None, step: int | None = None) -> None:
    """Raise :class:`NonFiniteLogitsError` unless every row of ``logits [..., V]`` has a finite maximum (no NaN,
    no +inf, not all -inf; -inf entries, masked tokens, are fine).  One reduction and one host sync per call:
    the engines call it once per forward."""
    # the row maxima summed in fp64 and read as one number: NaN and +-inf survive the sum (amax propagates NaN),
    # fp32 maxima cannot overflow it, and one reduction fewer than isfinite().all() (each small CPU operation costs
    # 10-30 us right after a forward)
    if logits.numel() and not math.isfinite(logits.amax(dim=-1).sum(dtype=torch.float64).item()):
        raise NonFiniteLogitsError(model, step)


def greedy_tokens(logits: torch.Tensor, model: str | None = None, step: int | None = None) -> torch.Tensor:
    """``logits.argmax(-1)`` (the greedy token: the first maximal index, ties to the lowest id) after
    :func:`check_logits`."""
    check_logits(logits, model, step)
    return logits.argmax(-1)  # [...]


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the first bad sampling argument."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


class SubsetLogits(NamedTuple):
    """Logits on part of the vocabulary: ``values [n, N]`` are the logits of tokens ``ids [N]`` (distinct), every
    other token of the ``vocab`` has logit -inf (probability 0).  A draft with a small output layer (an EAGLE-style
    subset head) returns these so that top-k and log-softmax run over N columns, not the whole vocabulary."""

    values: torch.Tensor  # [n, N]
    ids: torch.Tensor  # [N] vocabulary ids of the columns
    vocab: int

    def full(self) -> torch.Tensor:
        """The same logits over the whole vocabulary ``[n, vocab]``, -inf outside ``ids``."""
        out = self.values.new_full((self.values.shape[0], self.vocab), float("-inf"))
        return out.index_copy_(1, self.ids, self.values)  # [n, V]


def as_float(logits: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 logits -> fp32 before softmax; fp32/fp64 unchanged."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the sampling law ``[..., V]`` over the full vocabulary.

    Order of processing (the same as Hugging Face): temperature, then top-k, then top-p.

    * ``temperature == 0`` is greedy decoding: a one-hot law on the argmax, ties broken
      by the lowest token id.  top-k / top-p do not change an argmax and are ignored.
    * ``top_k``: keep the tokens whose logit is >= the k-th largest (ties at the boundary are
      all kept, so the rule does not depend on sort order).  Dividing by T > 0 keeps the order,
      so this is the same set as on the scaled logits, without the ties rounding could make.
    * ``top_p``: sort the (top-k filtered) law descending with a stable sort and keep a
      token while the mass strictly before it is < top_p (the smallest prefix whose mass
      reaches top_p; the most likely token is always kept).

    Numerics: the law is computed in fp32 (fp64 for fp64 logits) and returned in that dtype,
    whatever the logits' dtype, and the max is subtracted *before* dividing by T:
    ``(l - max l) / T`` is <= 0, exactly 0 at the maximum, so the softmax never sees inf - inf,
    and is stable at any T > 0 (T = 1e-38, or fp16 logits at T = 1e-4, where ``l / T``
    overflows).  As T -> 0 the law tends to uniform over the tied maxima, and entries whose
    scaled logit underflows get probability 0.

    ``validate=False`` skips the finiteness check (one host sync) for hot loops whose
    inputs come from a model that was already checked.
    """
    check_sampling_args(temperature, top_k, top_p)
    if not torch.is_floating_point(logits):
        raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got {tuple(logits.shape)}")
    if validate and not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values")
    logits = as_float(logits)  # [..., V] fp32 / fp64
    vocab = logits.shape[-1]
    if temperature == 0:
        idx = logits.argmax(dim=-1, keepdim=True)  # [..., 1] first maximum = lowest id
        return torch.zeros_like(logits).scatter_(-1, idx, 1.0)  # [..., V]
    if top_k is not None and top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # [..., V] <= 0, 0 at the maximum
    # d / T with d <= 0: never NaN for d < 0 (at worst -inf); d == 0 stays 0 even if T rounds to 0 in fp32
    scaled = torch.where(shifted == 0, shifted, shifted / temperature)  # [..., V]
    probs = torch.softmax(scaled, dim=-1)  # [..., V]
    if top_p is not None and top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [..., V]
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [..., V]
        keep_sorted = mass_before < top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # [..., V]
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from ``probs [..., V]``; returns ``[...]`` (int64), no host sync."""
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    tok = torch.multinomial(flat, 1, generator=generator)  # [N, 1]
    return tok.reshape(probs.shape[:-1])


class SamplingConfig:
    """One run's sampling settings, applied identically to draft and target logits."""

    __slots__ = ("temperature", "top_k", "top_p")

    def __init__(self, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None) -> None:
        check_sampling_args(temperature, top_k, top_p)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor, model: str | None = None, step: int | None = None) -> torch.Tensor:
        """``logits [..., V]`` -> the sampling law ``[..., V]``.  Logits with NaN / +inf (or a row of -inf only) raise
        :class:`NonFiniteLogitsError` naming ``model`` and ``step`` (:func:`check_logits`: one host sync per call,
        negligible beside a forward)."""
        check_logits(logits, model, step)
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p, validate=False)

    def __repr__(self) -> str:
        return f"SamplingConfig(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p})"
