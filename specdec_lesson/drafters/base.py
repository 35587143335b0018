"""The ``Drafter`` interface: every draft source (model, prompt lookup, EAGLE, hybrid) implements it.

The engine talks to a drafter through three calls per generation:

* ``begin(prompt_ids [B, L], prompt_mask [B, L], target_hidden)`` once, after the target's prefill;
* ``propose(k, sampling, generator) -> (draft_tokens [B, K'], draft_probs [B, K', V] or None)``
  each step (K' <= k; ``None`` means a deterministic drafter whose law is one-hot), called by the
  engine through ``propose_within(k, limit, sampling, generator)`` (see the token budget below);
* ``commit(num_accepted [B], next_token [B], target_hidden)`` after verification: row b
  committed its first ``num_accepted[b]`` drafts and then ``next_token[b]``.

The token budget: a row with r tokens left can emit at most r - 1 accepted drafts (plus the token
drawn after them), so each step the engine passes ``limit = max(1, r_max - 1)`` (r_max over the active
rows) and a proposal never exceeds it: drafts past the budget would cost target work and inflate
``proposed``.  ``k`` is the run's drafts per step; the default ``propose_within`` proposes
``min(k, limit)``, so a drafter that never proposes more than k implements ``propose`` only.  A
drafter that may propose MORE than k (``HybridDrafter``'s lookup, up to ``lookup_k``) overrides
``max_proposal(k)`` (the most one step may propose: the engine's context-length check uses it) and
``propose_within`` (never above ``limit``).

Exactness needs ``draft_probs`` to be the law each token was actually drawn from, after the
same temperature / top-k / top-p as the target (pitfalls 1 and 2 in docs/pitfalls.md): the model
drafter samples from exactly the ``sampling.probs`` it returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingConfig

__all__ = ["Drafter", "hidden_request"]


def hidden_request(drafter) -> bool | tuple[int, ...]:
    """What the engine asks the target's forward for on behalf of ``drafter`` (``SlotCache.forward(output_hidden=)``):
    False, True (the last hidden state after the final norm) or the layers in ``target_hidden_layers``."""
    if not getattr(drafter, "needs_target_hidden", False):
        return False
    layers = getattr(drafter, "target_hidden_layers", None)
    return tuple(layers) if layers else True


class Drafter(ABC):
    """Base class of draft sources (see the module docstring for the protocol)."""

    needs_target_hidden: bool = False
    target_hidden_layers: tuple[int, ...] | None = None  # with needs_target_hidden: None = the last, after the final norm
    forwards: int = 0  # draft model forwards so far (0 for model-free drafters)

    @abstractmethod
    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        """Start a generation after the target's prefill (``target_hidden``: its last hidden states)."""

    @abstractmethod
    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """``(draft_tokens [B, K'], draft_probs [B, K', V] or None)`` with K' <= k."""

    def max_proposal(self, k: int) -> int:
        """The most drafts one step may propose in a run of ``k`` drafts per step (default ``k``)."""
        return k

    def propose_within(self, k: int, limit: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """The engine's call: ``propose`` with K' <= ``limit`` (>= 1, the token budget); ``k`` is the run's drafts per step."""
        return self.propose(min(k, limit), sampling, generator)

    @abstractmethod
    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        """Row b committed its first ``num_accepted[b]`` drafts, then ``next_token[b]``."""
