"""Lookup over the target's own past answers: prompt lookup extended to a corpus (after SuffixDecoding).

The target is fixed, so its answers repeat themselves across prompts: the same openings ("Here is the completed
function:"), the same code idioms, the same closing lines ("Answer: "). SuffixDecoding (Oliaro et al. 2024,
arXiv 2411.04975) indexes such a corpus and proposes what followed the current context's longest matching suffix
there, at no model cost. This module does it with an n-gram table, which for tails of at most ``max_ngram`` tokens
gives the same matches as a suffix tree:

* ``SuffixIndex(sequences, max_ngram)`` counts, for every n-gram of 1..``max_ngram`` tokens in the corpus, the
  tokens that followed it;
* ``CorpusLookupDrafter`` first looks in the row's own history (prompt lookup: the prompt and the text so far),
  and where that finds nothing, walks the index: it extends the proposal by the most frequent next token of the
  longest matching tail (``min_ngram`` tokens or more) while that token's share of the tail's followers is at
  least ``min_share``.

Every proposal is a deterministic function of the history and the fixed corpus: its law is one-hot and
verification stays exact, whatever the corpus says.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .lookup import PromptLookupDrafter

__all__ = ["SuffixIndex", "CorpusLookupDrafter", "load_answer_corpus", "default_answer_index", "DEFAULT_CORPUS",
           "ANSWER_FILES", "ANSWERS_FORMAT", "KINDS"]

ANSWERS_FORMAT = 1
KINDS = ("code", "math", "chat", "magpie")  # append only: files store the index (chat, magpie: distill.mixture)
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "data" / "answers_smollm2.npz"
# every shipped answer file of the default target: DEFAULT_CORPUS (seed 2) and a larger one (seed 3; teacher data too)
ANSWER_FILES = (DEFAULT_CORPUS, DEFAULT_CORPUS.with_name("answers_smollm2_more.npz"))


class SuffixIndex:
    """Next-token counts of every n-gram (1 <= n <= ``max_ngram``) of a corpus of token sequences.

    ``best(tail)`` is the most frequent follower of ``tail`` with its share of all followers (ties: the token seen
    first in the corpus, so the index is deterministic); ``next_token(context, min_ngram, min_share)`` applies it to
    the longest tail of ``context`` that the corpus contains."""

    def __init__(self, sequences: Iterable[Sequence[int]], max_ngram: int = 6) -> None:
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
            raise ValueError(f"max_ngram must be an integer >= 1, got {max_ngram!r}")
        self.max_ngram = max_ngram
        counts: dict[tuple[int, ...], Counter] = {}
        self.tokens = 0
        for seq in sequences:
            seq = [int(t) for t in seq]
            self.tokens += len(seq)
            for i in range(1, len(seq)):
                nxt = seq[i]
                for n in range(1, min(max_ngram, i) + 1):
                    counts.setdefault(tuple(seq[i - n:i]), Counter())[nxt] += 1
        # keep only the winner of each n-gram: (token, share); Counter.most_common keeps first-seen order on ties
        self._best: dict[tuple[int, ...], tuple[int, float]] = {}
        for gram, c in counts.items():
            tok, hits = c.most_common(1)[0]
            self._best[gram] = (tok, hits / sum(c.values()))

    def __len__(self) -> int:
        return len(self._best)

    def best(self, tail: Sequence[int]) -> tuple[int, float] | None:
        return self._best.get(tuple(int(t) for t in tail))

    def next_token(self, context: Sequence[int], min_ngram: int = 2, min_share: float = 0.5) -> int | None:
        """The most frequent follower of the longest tail of ``context`` (>= ``min_ngram`` tokens) in the corpus, if
        its share is at least ``min_share``; else None."""
        for n in range(min(self.max_ngram, len(context)), min_ngram - 1, -1):
            hit = self._best.get(tuple(context[-n:]))
            if hit is not None:
                return hit[0] if hit[1] >= min_share else None
        return None


class CorpusLookupDrafter(PromptLookupDrafter):
    """Prompt lookup in the row's history, then the corpus ``index`` where the history has no match.

    ``history_ngram``: tails of ``history_min_ngram``..``history_ngram`` tokens searched in the history (as
    :class:`PromptLookupDrafter`); ``min_ngram`` / ``min_share``: how long a corpus tail must match and how
    dominant its follower must be to extend the proposal.  Usable alone or as ``HybridDrafter(..., lookup=...)``."""

    def __init__(self, index: SuffixIndex, *, history_ngram: int = 4, history_min_ngram: int = 2, min_ngram: int = 3,
                 min_share: float = 0.5) -> None:
        super().__init__(max_ngram=history_ngram, min_ngram=history_min_ngram)
        if not isinstance(index, SuffixIndex):
            raise ValueError(f"index must be a SuffixIndex, got {type(index).__name__}")
        if not 1 <= min_ngram <= index.max_ngram:
            raise ValueError(f"min_ngram must lie in 1..{index.max_ngram} (the index's max_ngram), got {min_ngram}")
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must lie in (0, 1], got {min_share}")
        self.index, self.corpus_min_ngram, self.min_share = index, min_ngram, min_share
        self.corpus_proposals = 0  # rows x steps whose proposal came from the corpus (for reports)

    def continuation(self, hist: list[int], k: int) -> list[int]:
        found = super().continuation(hist, k)
        if found:
            return found
        ctx, out = list(hist), []
        while len(out) < k:
            tok = self.index.next_token(ctx, self.corpus_min_ngram, self.min_share)
            if tok is None:
                break
            out.append(tok)
            ctx.append(tok)
        self.corpus_proposals += bool(out)
        return out


def load_answer_corpus(path: str | Path | None = None) -> tuple[list[dict], dict]:
    """``(rows, meta)`` of an answer file written by ``python -m specdec_lesson.distill answers`` (default: the shipped
    ``DEFAULT_CORPUS``): per answer ``{"tokens": list[int], "n_prompt": int, "kind": one of KINDS}``, and the
    settings that made it.  One ValueError naming the file and the fix if it is missing, damaged or inconsistent."""
    path = Path(path) if path is not None else DEFAULT_CORPUS
    fix = "remake it with python -m specdec_lesson.distill answers"
    try:
        with np.load(path, allow_pickle=False) as z:
            tokens, offsets, n_prompt, kind = z["tokens"], z["offsets"], z["n_prompt"], z["kind"]
            meta = json.loads(str(z["meta"]))
    except FileNotFoundError:
        raise ValueError(f"answer corpus {path} does not exist; {fix}") from None
    except Exception as exc:  # a truncated zip, a missing array, bad JSON
        raise ValueError(f"answer corpus {path} is unreadable or incomplete ({type(exc).__name__}: {exc}); {fix}") from None
    if (meta.get("format") != ANSWERS_FORMAT or len(offsets) != len(n_prompt) + 1 or len(kind) != len(n_prompt)
            or int(offsets[-1]) != len(tokens) or np.any(np.diff(offsets) < 0) or np.any(kind >= len(KINDS))):
        raise ValueError(f"answer corpus {path} is inconsistent (format {meta.get('format')!r}, {len(n_prompt)} answers, "
                         f"{len(tokens)} tokens); {fix}")
    rows = [{"tokens": tokens[offsets[i]:offsets[i + 1]].astype(np.int64).tolist(), "n_prompt": int(n_prompt[i]),
             "kind": KINDS[int(kind[i])]} for i in range(len(n_prompt))]
    return rows, meta


def default_answer_index(path: str | Path | None = None, max_ngram: int = 6) -> SuffixIndex:
    """A :class:`SuffixIndex` over the replies (not the prompts) of an answer file, by default of every shipped one
    (``ANSWER_FILES`` that exist): the target's own greedy answers to training prompts, disjoint from every benchmark
    prompt."""
    paths = [Path(path)] if path is not None else [p for p in ANSWER_FILES if p.is_file()] or [DEFAULT_CORPUS]
    rows = [r for p in paths for r in load_answer_corpus(p)[0]]
    return SuffixIndex((r["tokens"][r["n_prompt"]:] for r in rows), max_ngram=max_ngram)
