"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the last n tokens."""

from __future__ import annotations

import torch

from ..sampling import SamplingConfig
from .base import Drafter

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter(Drafter):
    """Prompt lookup decoding: find the latest earlier occurrence of the last n tokens
    (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed it.

    The proposal is a deterministic function of the history, so its law is one-hot and
    verification stays exact.  K' is the longest match over the rows (0 = no proposal);
    shorter rows are padded with their last token (still a deterministic proposal).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._index: dict[int, list] = {}  # id(history list) -> [the list, tokens indexed, {token: positions}]

    def begin(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        self.device = prompt_ids.device
        self.history = [[t for t, m in zip(row, mrow) if m] for row, mrow in zip(prompt_ids.tolist(), prompt_mask.tolist())]
        self._index = {}

    def _positions(self, hist: list[int]) -> dict[int, list[int]]:
        """Each token's positions in ``hist`` (ascending), kept up to date as the list grows (a history only ever
        grows by commits; a list that shrank, or a new one, is indexed afresh)."""
        entry = self._index.get(id(hist))
        if entry is None or entry[0] is not hist or entry[1] > len(hist):
            if len(self._index) > 64:  # callers that pass a fresh list per call: keep the cache small
                self._index = {}
            entry = self._index[id(hist)] = [hist, 0, {}]
        pos = entry[2]
        for i in range(entry[1], len(hist)):
            pos.setdefault(hist[i], []).append(i)
        entry[1] = len(hist)
        return pos

    def continuation(self, hist: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of ``hist``'s longest matching tail n-gram.

        An earlier occurrence of the tail ends at a position e <= len - 2 holding the history's last token, so only
        those positions are tried (latest first), from the token's position index: the same answer as scanning
        every start, at a cost that does not grow with the history."""
        L = len(hist)
        ends = self._positions(hist).get(hist[-1], []) if L > 1 else []
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = hist[-n:]
            for e in reversed(ends):
                if e > L - 2:
                    continue
                if e < n - 1:
                    break
                if hist[e - n + 1:e + 1] == tail:
                    return hist[e + 1:e + 1 + k]
        return []

    def propose(self, k: int, sampling: SamplingConfig, generator: torch.Generator | None):
        found = [self.continuation(h, k) for h in self.history]
        width = max(len(f) for f in found)
        rows = [f + [f[-1] if f else h[-1]] * (width - len(f)) for f, h in zip(found, self.history)]
        self.last = rows
        return torch.tensor(rows, dtype=torch.long, device=self.device).reshape(len(rows), width), None

    def commit(self, num_accepted: torch.Tensor, next_token: torch.Tensor, target_hidden: torch.Tensor | None) -> None:
        for h, prop, n, t in zip(self.history, self.last, num_accepted.tolist(), next_token.tolist()):
            h.extend(prop[:n])
            h.append(t)
