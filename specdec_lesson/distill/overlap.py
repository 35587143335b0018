"""Near-duplicate prompts: training prompts must not repeat, or nearly repeat, any evaluation prompt.

Two texts are near-duplicates when, after ``normalise`` (lower case, every run of non-alphanumeric characters one
space), they are equal, or their word 3-gram sets (``shingles``) have a Jaccard overlap of at least 0.5, or at least
80% of the 3-grams of the smaller one (when it has 3 or more) occur in the other (one text copied inside a longer
one).  3-grams, not 5-grams: one word changed in a 14-word question leaves 5 of its 10 5-grams (Jaccard 0.33, missed)
but 9 of its 12 3-grams (Jaccard 0.6, found).  Prompt wrappers shared by every prompt of a style (the code and math
instructions of ``distill.data``) are cut off first (``content``): otherwise every code prompt would share the
instruction's 3-grams.

``NearDuplicateIndex`` answers "which stored text does this one nearly repeat?" through an inverted index of
3-grams, so a few hundred held-out prompts are checked against tens of thousands of training prompts in about a
second.  ``heldout_texts`` lists the user texts of the benchmark's four held-out styles (HumanEval 82..163, the
math evaluation split, the free-form function requests, the chat prompts): ``distill.mixture`` drops a sampled
(Magpie) question that nearly repeats one of them, and ``tests/test_mixture.py`` checks every training source.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["normalise", "shingles", "content", "NearDuplicateIndex", "heldout_texts", "JACCARD", "CONTAINMENT"]

JACCARD = 0.5
CONTAINMENT = 0.8
NGRAM = 3


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def shingles(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The word n-grams of the normalised text (a text of fewer than n words: one shingle, all its words)."""
    words = normalise(text).split()
    if len(words) <= n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def content(text: str) -> str:
    """``text`` without the code / math prompt wrapper of ``distill.data`` (the bench uses the same two)."""
    from .data import CODE_TEMPLATE, MATH_TEMPLATE

    for template, field in ((CODE_TEMPLATE, "{prompt}"), (MATH_TEMPLATE, "{question}")):
        head, tail = template.split(field)
        if text.startswith(head) and text.endswith(tail):
            return text[len(head):len(text) - len(tail)]
    return text


class NearDuplicateIndex:
    """Stored texts, with ``match(text)``: the index of a stored text that ``text`` nearly repeats, else None."""

    def __init__(self, texts: list[str] = ()) -> None:
        self._sets: list[set] = []
        self._exact: dict[str, int] = {}
        self._post: dict[tuple[str, ...], list[int]] = {}
        for t in texts:
            self.add(t)

    def __len__(self) -> int:
        return len(self._sets)

    def add(self, text: str) -> int:
        i = len(self._sets)
        s = shingles(text)
        self._sets.append(s)
        self._exact.setdefault(normalise(text), i)
        for g in s:
            self._post.setdefault(g, []).append(i)
        return i

    def match(self, text: str) -> int | None:
        key = normalise(text)
        if key in self._exact:
            return self._exact[key]
        s = shingles(text)
        shared = Counter(j for g in s for j in self._post.get(g, ()))
        for j, common in shared.most_common():
            other = self._sets[j]
            small = min(len(s), len(other))
            if common / len(s | other) >= JACCARD or (small >= 3 and common / small >= CONTAINMENT):
                return j
        return None


def heldout_texts() -> list[tuple[str, str]]:
    """(id, user text without its wrapper) of every held-out evaluation prompt of the four benchmark styles."""
    from ..bench.chat import chat_prompts
    from ..bench.requests import function_requests
    from ..bench.tasks import code_problems, math_problems

    out = [(p["task_id"], p["prompt"]) for p in code_problems("eval")]
    out += [(r["id"], r["text"]) for r in function_requests()]
    out += [(p["id"], p["question"]) for p in math_problems("eval")]
    out += [(c["id"], c["text"]) for c in chat_prompts()]
    return out
