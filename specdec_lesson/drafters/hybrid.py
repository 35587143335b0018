"""Two draft sources behind one ``Drafter``: prompt lookup where the context repeats, a model elsewhere.

Code answers copy long stretches of their prompt (the signature and the docstring are echoed back),
math answers copy numbers and phrases of the question.  A long n-gram match then predicts the
continuation better than any small draft model, at no cost; elsewhere the model drafts.  Each step,
each row takes the lookup's continuation when the last ``min_ngram``+ tokens occurred earlier in the
row's history and the match supplies at least ``min_tokens`` tokens, and the model's drafts otherwise.

Exactness is kept row by row: a lookup row's tokens are a deterministic function of the history, so
its law is one-hot (returned as such when the run samples), and a model row's law is the model's
own.  The model drafter always proposes (its state must advance with every commit) unless every
row takes the lookup, and it commits the tokens that were actually accepted whatever their source.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingConfig
from .base import Drafter
from .lookup import PromptLookupDrafter

__all__ = ["HybridDrafter"]


class HybridDrafter(Drafter):
    """``model`` drafts unless prompt lookup finds a match of ``min_ngram``..``max_ngram`` tokens giving at least
    ``min_tokens`` proposals; ``lookup_k`` (> k) lets a step where every row takes the lookup propose more tokens
    (verifying 8-12 tokens costs about as much as 4 with a pre-packed target), never past the token budget the
    engine passes to :meth:`propose_within`.  ``lookup`` replaces the prompt lookup (``max_ngram`` / ``min_ngram``
    are then unused), e.g. by a ``drafters.suffix.CorpusLookupDrafter`` that also searches the target's past answers.
    ``model`` must accept proposals other than its own at commit (``accepts_foreign_proposals``, as ``EagleDrafter``
    does: its commit re-feeds the accepted tokens)."""

    def __init__(self, model: Drafter, *, max_ngram: int = 4, min_ngram: int = 2, min_tokens: int = 2,
                 lookup_k: int | None = None, lookup: PromptLookupDrafter | None = None) -> None:
        if not getattr(model, "accepts_foreign_proposals", False):
            raise ValueError(f"{type(model).__name__} cannot commit tokens it did not propose; HybridDrafter needs a "
                             "drafter with accepts_foreign_proposals = True (e.g. EagleDrafter)")
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        self.model = model
        if lookup is not None and not isinstance(lookup, PromptLookupDrafter):
            raise ValueError(f"lookup must be a PromptLookupDrafter (e.g. drafters.suffix.CorpusLookupDrafter), got "
                             f"{type(lookup).__name__}")
        # the lookup source: prompt lookup by default, or one that also searches a corpus (drafters.suffix)
        self.lookup = lookup if lookup is not None else PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.min_tokens = min_tokens
        self.lookup_k = lookup_k  # proposals per lookup step when every row takes the lookup (None: the run's k)
        self.needs_target_hidden = model.needs_target_hidden
        self.target_hidden_layers = getattr(model, "target_hidden_layers", None)
        self.default_k = getattr(model, "default_k", 4)
        self.lookup_steps = 0  # rows x steps drafted by lookup, and by the model (for reports)
        self.model_steps = 0

    @property
    def forwards(self) -> int:  # draft model forwards
        return self.model.forwards

    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        self.model.begin(prompt_ids, prompt_mask, target_hidden)
        self.lookup.begin(prompt_ids, prompt_mask, target_hidden)

    def max_proposal(self, k: int) -> int:
        """A step where every row takes the lookup proposes up to ``max(k, lookup_k)`` drafts."""
        return max(k, self.lookup_k or k)

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """At most ``k`` drafts (the Drafter contract); the engine calls :meth:`propose_within`."""
        return self.propose_within(k, k, sampling, generator)

    @torch.inference_mode()
    def propose_within(self, k: int, limit: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """The model drafts ``min(k, limit)`` tokens; an all-lookup step up to ``min(max_proposal(k), limit)``."""
        k_model, n_look = min(k, limit), min(self.max_proposal(k), limit)
        found = [self.lookup.continuation(h, n_look) for h in self.lookup.history]
        use = [len(f) >= self.min_tokens for f in found]
        B = len(found)
        self.lookup_steps += sum(use)
        self.model_steps += B - sum(use)
        if all(use):  # no model forward this step
            width = max(len(f) for f in found)
            rows = [f + [f[-1]] * (width - len(f)) for f in found]
            tokens = torch.tensor(rows, dtype=torch.long, device=self.lookup.device)  # [B, K'], K' <= n_look
            self.model.propose_foreign(tokens)
            self.last = tokens
            return tokens, None
        tokens, probs = self.model.propose(k_model, sampling, generator)  # [B, K], [B, K, V] or None
        if any(use):
            tokens = tokens.clone()
            probs = None if probs is None else probs.clone()
            K = tokens.shape[1]
            for b, f in enumerate(found):
                if use[b]:
                    tokens[b] = torch.tensor((f + [f[-1]] * K)[:K], dtype=torch.long, device=tokens.device)
                    if probs is not None:
                        self._set_lookup_law(probs[b], tokens[b])
            self.model.propose_foreign(tokens)
        self.last = tokens
        return tokens, probs

    @staticmethod
    def _set_lookup_law(probs: torch.Tensor, tokens: torch.Tensor) -> None:
        """probs [K, V] of a lookup row <- one-hot on its tokens [K]: a deterministic proposal's law."""
        probs.zero_()
        probs[torch.arange(len(tokens), device=probs.device), tokens] = 1

    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        self.lookup.last = self.last.tolist()
        self.lookup.commit(num_accepted, next_token, target_hidden)
        self.model.commit(num_accepted, next_token, target_hidden)
