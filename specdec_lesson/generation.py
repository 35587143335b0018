"""Bookkeeping shared by every generation loop (chain, tree, baseline): prompt preparation,
argument checks, per-row outputs cut at EOS and at the token budget, and a CUDA-aware clock."""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .sampling import NonFiniteLogitsError
from .validate import as_token_ids

__all__ = ["prepare_inputs", "check_run", "Outputs", "eos_of", "Clock", "blame"]


def _token_id(t, where: str) -> int:
    """One token id of a list prompt, as an int; a float / bool / other value is a ValueError."""
    if isinstance(t, bool) or isinstance(t, torch.Tensor) and (t.dim() != 0 or t.is_floating_point() or t.dtype == torch.bool):
        raise ValueError(f"input_ids must hold integer token ids; {where} holds {t!r}: pass lists of ints or a LongTensor")
    try:
        return operator.index(t)  # int, numpy / torch integer scalars; 2.0 and "2" raise TypeError
    except TypeError:
        raise ValueError(f"input_ids must hold integer token ids; {where} holds {t!r} ({type(t).__name__}): "
                         "pass lists of ints or a LongTensor (token ids are never rounded)") from None


def _is_row(r) -> bool:
    """A prompt row: a list, tuple, 1-D tensor or array (anything with a length but a string)."""
    if isinstance(r, (str, bytes)):
        return False
    try:
        len(r)  # a 0-dim tensor / array raises TypeError, like an int
    except TypeError:
        return False
    return True


def _list_prompts(input_ids) -> list[list[int]]:
    rows = list(input_ids)
    if rows and not any(_is_row(r) for r in rows):
        rows = [rows]  # a flat list of ids is one prompt, like a 1-D tensor
    if not rows or not all(_is_row(r) for r in rows):
        raise ValueError("input_ids must be a LongTensor [B, L] or [L], or a list of token-id lists (one per prompt)")
    out = [[_token_id(t, f"row {b}, position {i}") for i, t in enumerate(list(r))] for b, r in enumerate(rows)]
    if any(len(r) == 0 for r in out):
        raise ValueError("empty prompt: every row needs at least one token")
    return out


def _left_padding_mask(attention_mask, shape: torch.Size) -> torch.Tensor:
    mask = torch.as_tensor(attention_mask)
    if mask.dim() == 1 and len(shape) == 2 and shape[0] == 1:
        mask = mask[None]
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but input_ids has shape {tuple(shape)}: "
                         "give one entry per token ([B, L], 1 = real token, 0 = left padding)")
    if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 / 1 (or False / True): 1 = real token, 0 = left padding")
    mask = mask.bool()
    if not bool(mask[:, -1].all()):
        raise ValueError("attention_mask must describe left padding: the last column must be real tokens")
    if bool((mask[:, 1:].long() < mask[:, :-1].long()).any()):
        raise ValueError("attention_mask must describe left padding (0...0 1...1 per row)")
    return mask


def prepare_inputs(input_ids, attention_mask=None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as ``(ids [B, L], mask [B, L] bool)``, left-padded.

    ``input_ids``: a LongTensor [B, L] or [L] (with an optional left-padding ``attention_mask`` of
    the same shape, 1 = real token) or a list of token-id lists of any lengths (a flat list of ids is
    one prompt).  Non-integer ids (floats, bools) and a mask of another shape are ValueErrors."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ValueError("attention_mask goes with a tensor input_ids, not a list of prompts")
        rows = _list_prompts(input_ids)
        L = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (L - len(r)) + r for r in rows], dtype=torch.long)  # [B, L]
        mask = torch.tensor([[False] * (L - len(r)) + [True] * len(r) for r in rows])  # [B, L]
    else:
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"empty prompt: input_ids must be [B, L] with B, L >= 1, got shape {tuple(ids.shape)}")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}: pass a LongTensor")
        ids = ids.long()
        mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else _left_padding_mask(attention_mask, ids.shape)
    if bool((ids < 0).any()):
        raise ValueError("input_ids contain negative token ids")
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


def check_run(model, ids, max_new_tokens: int, k: int = 1) -> None:
    """Argument checks before a run; ``k`` is the largest number of drafts one step may propose
    (``Drafter.max_proposal``), so that prompt + budget + one step's drafts fit in the context."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    vocab = model.get_output_embeddings().weight.shape[0]
    if int(ids.max()) >= vocab:
        raise ValueError(f"input_ids contain token id {int(ids.max())} outside the vocabulary of {vocab}")
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and ids.shape[1] + max_new_tokens + k > limit:
        raise ValueError(
            f"prompt ({ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + drafts per step ({k}) exceeds the model's "
            f"context of {limit}"
        )


class Outputs:
    """Per-row emitted tokens, cut at EOS (kept) and at max_new_tokens."""

    def __init__(self, batch: int, max_new_tokens: int, eos_token_id) -> None:
        eos = eos_token_id if eos_token_id is not None else []
        self.eos = {int(t) for t in ([eos] if isinstance(eos, int) else eos)}
        self.rows: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self.max_new = max_new_tokens

    def emit(self, b: int, tokens: list[int]) -> int:
        if self.done[b]:
            return 0
        out = self.rows[b]
        n0 = len(out)
        for t in tokens:
            out.append(t)
            if t in self.eos or len(out) >= self.max_new:
                self.done[b] = True
                break
        return len(out) - n0

    @property
    def all_done(self) -> bool:
        return all(self.done)

    def max_remaining(self) -> int:
        return max(self.max_new - len(r) for r, d in zip(self.rows, self.done) if not d)

    def tensors(self, device) -> list[torch.Tensor]:
        return [torch.tensor(r, dtype=torch.long, device=device) for r in self.rows]


def eos_of(model, eos_token_id):
    """The stop tokens of a run: ``eos_token_id`` when given (None, an id or a list of ids, each in the
    model's vocabulary, else ValueError), else the model's ``generation_config.eos_token_id``."""
    if eos_token_id is not None:
        return as_token_ids(eos_token_id, "eos_token_id", model.get_output_embeddings().weight.shape[0])
    gen = getattr(model, "generation_config", None)
    return getattr(gen, "eos_token_id", None) if gen is not None else None


@contextmanager
def blame(model: str, step: int) -> Iterator[None]:
    """A :class:`~specdec_lesson.sampling.NonFiniteLogitsError` raised inside (a drafter's forwards, which do not
    know their role) names ``model`` (``"draft"``) and the decoding ``step``."""
    try:
        yield
    except NonFiniteLogitsError as exc:
        if exc.model is not None:
            raise
        raise NonFiniteLogitsError(model, step) from None


class Clock:
    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
