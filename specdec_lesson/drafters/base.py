"""The ``Drafter`` interface: every draft source (model, prompt lookup, EAGLE, hybrid) implements it.

The engine talks to a drafter through three calls per generation:

* ``begin(prompt_ids [B, L], prompt_mask [B, L], target_hidden)`` once, after the target's prefill;
* ``propose(k, sampling, generator) -> (draft_tokens [B, K'], draft_probs [B, K', V] or None)``
  each step (K' <= k; ``None`` means a deterministic drafter whose law is one-hot);
* ``commit(num_accepted [B], next_token [B], target_hidden)`` after verification: row b
  committed its first ``num_accepted[b]`` drafts and then ``next_token[b]``.

Exactness needs ``draft_probs`` to be the law each token was actually drawn from, after the
same temperature / top-k / top-p as the target (pitfalls 1 and 2 in docs/pitfalls.md): the model
drafter samples from exactly the ``sampling.probs`` it returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingConfig

__all__ = ["Drafter"]


class Drafter(ABC):
    """Base class of draft sources (see the module docstring for the protocol)."""

    needs_target_hidden: bool = False
    forwards: int = 0  # draft model forwards so far (0 for model-free drafters)

    @abstractmethod
    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        """Start a generation after the target's prefill (``target_hidden``: its last hidden states)."""

    @abstractmethod
    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """``(draft_tokens [B, K'], draft_probs [B, K', V] or None)`` with K' <= k."""

    @abstractmethod
    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        """Row b committed its first ``num_accepted[b]`` drafts, then ``next_token[b]``."""
