"""Prompt lookup's position index finds exactly what scanning every start finds, as the history grows."""

from __future__ import annotations

import random

from specdec_lesson.drafters.lookup import PromptLookupDrafter


def _scan(hist: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The definition: the latest earlier occurrence of the longest matching tail n-gram, every start tried."""
    for n in range(min(max_ngram, len(hist) - 1), min_ngram - 1, -1):
        tail = hist[-n:]
        for start in range(len(hist) - n - 1, -1, -1):
            if hist[start:start + n] == tail:
                return hist[start + n:start + n + k]
    return []


def test_indexed_lookup_equals_the_scan_on_growing_histories():
    rng = random.Random(0)
    for max_ngram, min_ngram in ((3, 1), (4, 2), (1, 1), (6, 3)):
        d = PromptLookupDrafter(max_ngram, min_ngram)
        for _ in range(30):
            vocab = rng.choice([2, 3, 5, 40])
            hist = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
            for _step in range(60):  # one list, grown in place as the engines grow theirs
                for k in (1, 4, 8):
                    assert d.continuation(hist, k) == _scan(hist, k, max_ngram, min_ngram), (hist, k)
                hist.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, 4)))
            fresh = list(hist[: len(hist) // 2])  # a shorter list: indexed afresh
            assert d.continuation(fresh, 5) == _scan(fresh, 5, max_ngram, min_ngram)
