"""Lookup over past answers (drafters.suffix) and the answer corpus (distill.answers): index, exactness, the file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_hybrid import PROMPTS, _eagle

from specdec_lesson.drafters.hybrid import HybridDrafter
from specdec_lesson.drafters.suffix import CorpusLookupDrafter, SuffixIndex, load_answer_corpus
from specdec_lesson.models import tiny_llama
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.stats import chi_square_test


def test_index_counts_followers_and_prefers_the_longest_tail():
    idx = SuffixIndex([[1, 2, 3, 4], [1, 2, 3, 5], [9, 2, 3, 5], [7, 3, 6]], max_ngram=3)
    assert idx.best([2, 3]) == (5, pytest.approx(2 / 3))  # followers of (2, 3): 4, 5, 5
    assert idx.best([1, 2, 3]) == (4, 0.5)  # a tie: the first seen wins
    assert idx.best([3]) == (5, pytest.approx(2 / 4))  # 4, 5, 5, 6 -> 5
    assert idx.next_token([0, 1, 2, 3], min_ngram=2, min_share=0.5) == 4  # the 3-gram (1, 2, 3) decides
    assert idx.next_token([0, 9, 2, 3], min_ngram=2, min_share=0.5) == 5  # (9, 2, 3) -> 5
    assert idx.next_token([0, 1, 2, 3], min_ngram=2, min_share=0.6) is None  # the longest tail's winner is too weak
    assert idx.next_token([8, 8], min_ngram=1) is None


def test_drafter_prefers_the_history_then_walks_the_corpus():
    idx = SuffixIndex([[10, 11, 12, 13, 14, 15]], max_ngram=4)
    d = CorpusLookupDrafter(idx, min_ngram=2)
    assert d.continuation([1, 10, 11, 12], 3) == [13, 14, 15]  # not in the history: the corpus
    assert d.continuation([10, 11, 5, 6, 10, 11], 2) == [5, 6]  # in the history: prompt lookup wins
    assert d.continuation([1, 2, 3], 4) == []
    assert d.corpus_proposals == 1


@pytest.mark.parametrize("bad,match", [(dict(min_ngram=0), "min_ngram"), (dict(min_ngram=9), "min_ngram"),
                                       (dict(min_share=0.0), "min_share")])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        CorpusLookupDrafter(SuffixIndex([[1, 2, 3]], max_ngram=4), **bad)
    with pytest.raises(ValueError, match="SuffixIndex"):
        CorpusLookupDrafter([[1, 2, 3]])
    with pytest.raises(ValueError, match="max_ngram"):
        SuffixIndex([[1, 2]], max_ngram=0)
    with pytest.raises(ValueError, match="PromptLookupDrafter"):
        HybridDrafter(_eagle(tiny_llama(vocab_size=64, seed=0)), lookup=object())


def _corpus_from_target(target, n=6, length=30) -> SuffixIndex:
    # the target's own greedy continuations of other prompts: a corpus that really predicts it
    seqs = [autoregressive_generate(target, [[i + 1, (3 * i) % 60 + 2]], length)[0][0].tolist() for i in range(n)]
    return SuffixIndex(seqs, max_ngram=4)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_plain_alone_and_in_the_hybrid(k):
    target = tiny_llama(vocab_size=64, seed=0)  # float64
    idx = _corpus_from_target(target)
    alone = [autoregressive_generate(target, [p], 28)[0][0] for p in PROMPTS]
    for make in (lambda: CorpusLookupDrafter(idx, min_ngram=2, min_share=0.3),
                 lambda: HybridDrafter(_eagle(target, n_sub=40), lookup=CorpusLookupDrafter(idx, min_ngram=2),
                                       lookup_k=8, min_tokens=1)):
        drafter = make()
        out, stats = speculative_generate(target, drafter, PROMPTS, 28, k=k)
        for row, ref in zip(out, alone):
            assert torch.equal(row, ref)
        assert stats.proposed > 0


def test_sampled_law_is_the_targets():
    """Joint law of the first 2 tokens at T = 1, K = 2, the hybrid with corpus lookup: V = 8, N = 6000 rows (12
    batches of 500), Pearson chi-square (cells of expected count < 5 pooled), fail at p < 1e-3.  Same size and
    design as tests/test_hybrid.py's sampled test, whose planted one-hot bug this test size rejects; here the corpus
    proposals are one-hot too, so a wrong law on them is the same bug."""
    from test_speculative import _exact_joint

    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    idx = SuffixIndex([autoregressive_generate(target, [[i % 8, (5 * i + 1) % 8]], 10)[0][0].tolist() for i in range(8)],
                      max_ngram=3)
    prompt = [1, 5, 2, 6, 3]
    law = _exact_joint(target, prompt, 2, 1.0)
    g = torch.Generator().manual_seed(5)
    counts: dict = {}
    corpus = 0
    for _ in range(12):
        look = CorpusLookupDrafter(idx, history_ngram=3, history_min_ngram=3, min_ngram=1, min_share=0.01)
        drafter = HybridDrafter(_eagle(target, seed=4), lookup=look, min_tokens=1)
        out, _ = speculative_generate(target, drafter, [prompt] * 500, 2, k=2, temperature=1.0, generator=g)
        corpus += look.corpus_proposals
        for row in out:
            key = tuple(row.tolist())
            counts[key] = counts.get(key, 0) + 1
    assert corpus > 0
    stat, dof, p = chi_square_test(counts, law)
    assert p > 1e-3, (stat, dof, p)


def _write(path, tokens, offsets, n_prompt, kind, meta='{"format": 1}'):
    np.savez_compressed(path, tokens=np.asarray(tokens, np.uint16), offsets=np.asarray(offsets, np.int64),
                        n_prompt=np.asarray(n_prompt, np.int32), kind=np.asarray(kind, np.uint8), meta=np.asarray(meta))


def test_answer_file_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="does not exist; remake it with python -m specdec_lesson.distill answers"):
        load_answer_corpus(tmp_path / "none.npz")
    good = tmp_path / "good.npz"
    _write(good, [1, 2, 3, 4, 5], [0, 2, 5], [1, 2], [0, 1])
    rows, meta = load_answer_corpus(good)
    assert rows == [{"tokens": [1, 2], "n_prompt": 1, "kind": "code"}, {"tokens": [3, 4, 5], "n_prompt": 2, "kind": "math"}]
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:40])
    with pytest.raises(ValueError, match="unreadable or incomplete"):
        load_answer_corpus(cut)
    bad = tmp_path / "bad.npz"
    _write(bad, [1, 2, 3], [0, 2, 5], [1, 2], [0, 1])  # offsets past the end
    with pytest.raises(ValueError, match="inconsistent"):
        load_answer_corpus(bad)


class _Tok:
    """A character tokenizer with the calls run_answers makes (vocabulary 96, like the tiny test models)."""

    vocab_size, eos_token_id, pad_token_id = 96, 2, 2

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "<u>" + messages[0]["content"][-40:] + "<a>"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) % 90 for c in text][-24:]}


def test_run_answers_resumes_to_the_same_file(tmp_path, monkeypatch):
    from specdec_lesson.distill import answers as A
    from specdec_lesson.distill import teacher

    model = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    whole = A.run_answers(tmp_path / "whole.npz", 3, 2, 2, 6, seed=0, progress=False, model=model, tokenizer=_Tok())
    real, calls = teacher.generate_teacher, {"n": 0}

    def dies_on_second_batch(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(teacher, "generate_teacher", dies_on_second_batch)
    out = tmp_path / "cut.npz"
    with pytest.raises(KeyboardInterrupt):
        A.run_answers(out, 3, 2, 2, 6, seed=0, progress=False, model=model, tokenizer=_Tok())
    assert not out.exists() and (tmp_path / "cut.partial.npz").exists()  # nothing that passes for complete
    monkeypatch.setattr(teacher, "generate_teacher", real)
    resumed = A.run_answers(out, 3, 2, 2, 6, seed=0, progress=False, model=model, tokenizer=_Tok())
    assert resumed == whole and load_answer_corpus(out)[0] == load_answer_corpus(tmp_path / "whole.npz")[0]
    assert not (tmp_path / "cut.partial.npz").exists()
    assert whole["answers"] == 5
    with pytest.raises(ValueError, match="other settings"):  # a partial file of other settings is never mixed in
        (tmp_path / "cut.partial.npz").write_bytes((tmp_path / "whole.npz").read_bytes())
        A.run_answers(out, 3, 2, 2, 7, seed=0, progress=False, model=model, tokenizer=_Tok(), force=True)


def test_run_answers_max_batches_writes_a_prefix(tmp_path):
    from specdec_lesson.distill import answers as A

    model = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    whole = A.run_answers(tmp_path / "whole.npz", 3, 2, 2, 6, seed=0, progress=False, model=model, tokenizer=_Tok())
    part = A.run_answers(tmp_path / "part.npz", 3, 2, 2, 6, seed=0, progress=False, model=model, tokenizer=_Tok(),
                         max_batches=2)
    assert whole["answers"] == 5 and part["answers"] == 4 and part["n_code"] + part["n_math"] == 5
    rows, meta = load_answer_corpus(tmp_path / "part.npz")
    assert rows == load_answer_corpus(tmp_path / "whole.npz")[0][:4] and meta["answers"] == 4
