"""The bench's methods in one table (``bench.methods.REGISTRY``): every entry complete, a new method plugs in with
no change to the runner's loop, the K / non-K labels and the checks read the table."""

from __future__ import annotations

import pytest

from specdec_lesson.bench import methods as M
from specdec_lesson.bench.runner import K_METHODS, METHODS, BenchSettings, load_models, run_benchmark

NAMES = ("ar", "chain", "hybrid", "hybrid-suffix", "adaptive", "suffix", "tree", "hybrid-tree", "adaptive-tree",
         "prompt-lookup", "hf", "hf-assisted", "hf-prompt-lookup", "vllm", "vllm-ngram", "vllm-eagle")


def _settings(methods: list[str], **kw) -> BenchSettings:
    return BenchSettings(tasks=["math"], methods=methods, max_new_tokens=4, repeats=1, warmup=0, limit=1, **kw)


def test_every_method_has_its_entry():
    assert tuple(M.REGISTRY) == NAMES == METHODS
    for name, m in M.REGISTRY.items():
        assert isinstance(m, M.Method) and m.name == name and callable(m.run) and callable(m.max_step)
        for flag in ("takes_k", "needs_draft", "needs_corpus", "needs_tree", "needs_hf_lm"):
            assert isinstance(getattr(m, flag), bool), (name, flag)
        assert m.check is None or callable(m.check)
        assert m.engine in ("native", "vllm")
        assert m.vllm_peer is None or M.REGISTRY[m.vllm_peer].engine == "vllm"
        assert m.max_step(BenchSettings(), 4 if m.takes_k else None) >= 1
    assert K_METHODS == M.k_methods() == {"chain", "hybrid", "hybrid-suffix", "adaptive", "suffix", "prompt-lookup",
                                          "hf-assisted", "hf-prompt-lookup", "vllm-ngram", "vllm-eagle"}
    assert {n: m.vllm_peer for n, m in M.REGISTRY.items() if m.vllm_peer} == {
        "ar": "vllm", "chain": "vllm-eagle", "prompt-lookup": "vllm-ngram"}


def test_k_and_non_k_labels():
    s = BenchSettings(methods=["hf", "chain", "ar", "tree", "vllm-ngram"], ks=[2, 4])
    assert s.labels() == [("ar", "ar", None), ("hf", "hf", None), ("chain-k2", "chain", 2), ("chain-k4", "chain", 4),
                          ("tree", "tree", None), ("vllm-ngram-k2", "vllm-ngram", 2), ("vllm-ngram-k4", "vllm-ngram", 4)]


def test_a_planted_method_runs_through_the_loop(monkeypatch):
    ar, calls = M.REGISTRY["ar"].run, []

    def run(loaded, k, ids, s, seed):  # plain decoding under another name, taking K
        calls.append((k, seed))
        return ar(loaded, None, ids, s, seed)

    monkeypatch.setitem(M.REGISTRY, "planted", M.Method("planted", run, takes_k=True))
    s = _settings(["ar", "planted", "hf"], ks=[2, 3])
    assert [lab for lab, _, _ in s.labels()] == ["ar", "planted-k2", "planted-k3", "hf"]
    res = run_benchmark(load_models("tiny"), s, progress=False)
    rows = {r["label"]: r for r in res["per_task"]}
    assert res["complete"] and set(rows) == {"ar", "planted-k2", "planted-k3", "hf"}
    assert sorted(k for k, _ in calls) == [2, 3] and len({seed for _, seed in calls}) == 1  # the shared seed
    assert rows["planted-k2"]["new_tokens"] == 4 and rows["planted-k2"]["equal_ar_rate"] == 1.0


def test_the_checks_read_the_table(monkeypatch, capsys):
    def never(*a):
        raise AssertionError("ran before the checks")

    checked = []
    monkeypatch.setitem(M.REGISTRY, "needy", M.Method("needy", never, needs_draft=True, check=checked.append))
    monkeypatch.setitem(M.REGISTRY, "wide", M.Method("wide", never, max_step=lambda s, k: 10_000))
    loaded = load_models("tiny")
    M.check_methods(loaded, ["ar", "needy"])
    assert checked == [loaded]  # its own check, once
    draftless = load_models("tiny")
    draftless.draft = None
    with pytest.raises(ValueError, match=r"methods \['chain', 'needy'\] need a draft model"):
        run_benchmark(draftless, _settings(["ar", "chain", "needy"]), progress=False)
    with pytest.raises(ValueError, match="up to 10000 drafts per step it exceeds the target's context"):
        run_benchmark(loaded, _settings(["ar", "wide"]), progress=False)
    # the command line's "--k with no method that takes K" lists the table's K methods, a planted one too
    from specdec_lesson.bench.__main__ import main

    monkeypatch.setitem(M.REGISTRY, "planted", M.Method("planted", never, takes_k=True))
    assert main(["--pair", "tiny", "--method", "ar,hf", "--k", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--k 2 sets the drafts per step of the K methods (" in err and "planted" in err and "none of ar,hf" in err


def test_a_vllm_method_without_its_engine_says_prepare_was_not_called(monkeypatch):
    monkeypatch.delitem(M.ENGINES, "vllm", raising=False)
    with pytest.raises(RuntimeError, match="no vLLM worker for vllm-ngram k=4: prepare"):
        M.REGISTRY["vllm-ngram"].run(None, 4, [1, 2], BenchSettings(), 0)
