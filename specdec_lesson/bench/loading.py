"""Loading a model pair for the benchmark: presets, paths, the tiny test pair, draft fallbacks.

Presets (``PAIRS``): ``default`` (SmolLM2-135M-Instruct and its shipped draft, offline), ``tiny``
(random test models), ``llama3-8b-70b`` and ``qwen2.5-0.5b-7b`` (hub names: need the weights on
disk or a reachable hub), or any ``--target``/``--draft`` pair sharing a tokenizer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from . import tasks as T

__all__ = ["PAIRS", "CharTokenizer", "Loaded", "load_models", "check_pair_args"]

PAIRS = {
    "default": None, "tiny": None,
    "llama3-8b-70b": ("meta-llama/Meta-Llama-3-70B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
    "qwen2.5-0.5b-7b": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
}
TINY_PROMPT_TOKENS = 48


class CharTokenizer:
    """Stand-in tokenizer for the tiny random test models (no vocabulary files exist for them)."""

    chat_template = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text][-TINY_PROMPT_TOKENS:]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + int(i) % 95) for i in ids)


@dataclass
class Loaded:
    target: torch.nn.Module
    draft: object  # a HF causal LM, a Drafter, or None
    tokenizer: object
    info: dict
    notes: list[str] = field(default_factory=list)
    eos_token_id: int | list[int] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def encode(self, text: str) -> list[int]:
        if isinstance(self.tokenizer, CharTokenizer):
            return self.tokenizer.encode(text)
        return self.tokenizer(T.chat(self.tokenizer, text), add_special_tokens=False)["input_ids"]

    def hf_assistant(self, self_draft_layers: int = 8):
        """The model HF assisted generation can run: the pair's draft if it is a HF causal LM, else
        the causal LM inside a model drafter, else (a feature-level draft, or none) a self-draft made
        of the target's first ``self_draft_layers`` layers and its head (untrained: low acceptance),
        else None.  ``self.notes`` says which."""
        from transformers import PreTrainedModel

        if isinstance(self.draft, PreTrainedModel):
            return self.draft
        inner = getattr(self.draft, "model", None)
        if isinstance(inner, PreTrainedModel):
            return inner
        if getattr(self, "_self_draft", None) is None:
            self._self_draft = _self_draft(self.target, self_draft_layers)
            if self._self_draft is not None:
                why = f"the pair's draft ({type(self.draft).__name__}) is not" if self.draft is not None else "the pair has no"
                self.notes.append(
                    f"hf-assisted: {why} a Hugging Face causal LM, so it runs the best HF-runnable draft available: a "
                    f"self-draft of the target's first {self_draft_layers} layers + its head (shared weights, untrained, "
                    "low acceptance); it measures HF's assisted-generation machinery, not the pair's draft")
        return self._self_draft


def _self_draft(target, layers: int):
    """The target's first ``layers`` decoder layers + its norm and head, sharing the weights
    (:func:`specdec_lesson.drafters.derived.self_draft`); None if the target cannot be cut there."""
    from ..drafters.derived import self_draft

    return self_draft(target, layers)


def _pad_draft_vocab(target, draft, note: list[str]) -> None:
    """Qwen2.5-style pairs: same tokenizer, but the target's embedding has more (padding) rows.
    Extra draft rows are zero: the draft's law changes, exactness does not (any q is exact)."""
    vt, vd = target.get_output_embeddings().weight.shape[0], draft.get_output_embeddings().weight.shape[0]
    if vd < vt:
        draft.resize_token_embeddings(vt, mean_resizing=False)
        with torch.no_grad():
            draft.get_output_embeddings().weight[vd:].zero_()
            draft.get_input_embeddings().weight[vd:].zero_()
        note.append(f"the draft's vocabulary was padded from {vd} to {vt} rows (zero rows; same tokenizer): lossless")


def _load_hf_pair(target_name: str, draft_name: str, device, draft_device, dtype, target_device_map, notes) -> tuple:
    from ..models import check_model_source, check_same_vocab, load_hf_model

    check_model_source(target_name, "target")  # both, before the (maybe long) target load
    check_model_source(draft_name, "draft")
    ttok, target = load_hf_model(target_name, "target", dtype, **({"device_map": target_device_map} if target_device_map else {}))
    dtok, draft = load_hf_model(draft_name, "draft", dtype)
    if ttok.get_vocab() != dtok.get_vocab():
        check_same_vocab(target, draft, ttok, dtok)  # raises, naming the difference
    _pad_draft_vocab(target, draft, notes)
    check_same_vocab(target, draft)
    if not target_device_map:
        target = target.to(device)
    return target.eval(), draft.to(draft_device).eval(), ttok


_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_pair_args(pair: str | None, target: str | None = None, draft: str | None = None, dtype: str = "auto",
                    target_device_map: str | None = None) -> str | None:
    """The pair to load (None for ``target``/``draft`` paths), or one ValueError: an unknown pair name (only the
    names of ``PAIRS``: a name is also part of the default results path, so it is checked before any path is made
    from it), ``--target`` without ``--draft``, an unknown dtype, a ``target_device_map`` for a pair that ignores
    it (``default``, ``tiny``)."""
    if target or draft:
        if not (target and draft):
            raise ValueError("--target and --draft go together (or use --pair)")
        pair = None
    if pair is not None and pair not in PAIRS:
        raise ValueError(f"unknown pair {pair!r}; choose from {', '.join(PAIRS)} or give --target/--draft")
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(_DTYPES)}")
    if target_device_map and pair in ("default", "tiny"):
        raise ValueError(f"--target-device-map shards a large target over devices; the {pair} pair loads on one device "
                         "and would ignore it: drop it, or use --pair llama3-8b-70b / qwen2.5-0.5b-7b or --target/--draft")
    return pair


def load_models(pair: str | None = "default", target: str | None = None, draft: str | None = None, *,
                device: str = "cpu", draft_device: str | None = None, dtype: str = "auto",
                target_device_map: str | None = None, tune: bool = True) -> Loaded:
    """Load a preset pair (see ``PAIRS``) or ``target``/``draft`` paths; one clear ValueError otherwise.

    ``tune`` (default pair on CPU): route each forward width to the faster of plain and pre-packed weights
    (``profiling.tune_dispatch``), so every method, ``ar`` included, runs the fastest form of the target on
    this machine; the measurement is kept in ``info["dispatch"]``."""
    from .. import models as M

    draft_device = draft_device or device
    notes: list[str] = []
    pair = check_pair_args(pair, target, draft, dtype, target_device_map)
    tdtype = _DTYPES
    if pair == "tiny":
        tgt, drf, _ = M.tiny_pair(dtype=tdtype[dtype] or torch.float32)
        tok = CharTokenizer(tgt.config.vocab_size)
        info = {"pair": "tiny", "target": "tiny_llama(hidden 32, 2 layers, seed 0)",
                "draft": "tiny_llama(hidden 16, 1 layer, seed 1)"}
        return Loaded(tgt.to(device), drf.to(draft_device), tok, info, notes, None)
    if pair == "default":
        if tdtype[dtype] not in (None, torch.float32):
            raise ValueError("the default pair runs in float32 (bf16 is slow on these CPUs); drop --dtype")
        # fast=True: linears pre-packed for oneDNN on CPU, for every method alike (ar, chain, hf, ...)
        tgt, tok = M.load_default_target(device=device, verbose=False, fast=True)
        dispatch = _tune(tgt, device, notes) if tune else None
        drf, dname = _default_draft(tgt, notes)
        if isinstance(drf, torch.nn.Module) and draft_device != device:
            drf = drf.to(draft_device)
        info = {"pair": "default", "target": M.DEFAULT_TARGET_NAME + " (linears pre-packed for oneDNN on CPU)", "draft": dname}
        if dname is not None:  # which draft: the shipped one changes between stages
            from ..drafters.eagle import draft_identity

            info["draft_weights"] = draft_identity()
        if dispatch is not None:
            info["dispatch"] = dispatch
        return Loaded(tgt, drf, tok, info, notes, tok.eos_token_id)
    tname, dname = (target, draft) if pair is None else PAIRS[pair]
    ldtype = tdtype[dtype] or (torch.float32 if device == "cpu" and not target_device_map else torch.bfloat16)
    tgt, drf, tok = _load_hf_pair(tname, dname, device, draft_device, ldtype, target_device_map, notes)
    info = {"pair": pair or "custom", "target": tname, "draft": dname}
    eos = getattr(getattr(tgt, "generation_config", None), "eos_token_id", None)  # e.g. Llama-3: end_of_text and eot_id
    return Loaded(tgt, drf, tok, info, notes, eos if eos is not None else tok.eos_token_id)


def _tune(target, device: str, notes: list[str]) -> dict | None:
    """Measure plain against pre-packed weights per forward width and route each width to the faster one."""
    if not str(device).startswith("cpu"):
        return None
    from ..lean.path import tune_engine_dispatch
    from ..profiling import noisy_probe_note

    with warnings.catch_warnings():  # a noisy probe is reported once, as the WARNING note below
        warnings.filterwarnings("ignore", message=r"tune_(lean_)?dispatch: ", category=UserWarning)
        d = tune_engine_dispatch(target, repeats=3)
    target.dispatch_profile = d  # the adaptive method's T(n) and the simulator's calibration read it
    r = d["plain_rows_max"]
    t1 = (d["plain_ms"].get(1), d["packed_ms"].get(1))
    where = f"plain weights up to {r} rows, pre-packed beyond" if r else "pre-packed weights at every width"
    fwd = "the lean forward (specdec_lesson.lean)" if d["forward"] == "lean" else "Hugging Face's forward"
    notes.append(f"fastest plain decoding: our methods, ar included, run {fwd}; its one-token forward took {t1[0]:.1f} ms "
                 f"plain, {t1[1]:.1f} ms pre-packed on this machine (the fastest of 3 interleaved rounds"
                 f"{', 12 when they disagreed' if d['forward'] == 'lean' else ''}), so it runs {where} "
                 "(lean.path.tune_engine_dispatch)")
    if d["forward"] == "lean":
        h = d["hf"]
        notes.append(f"Hugging Face's forward (its generate-based methods): one-token forward {h['plain_ms'].get(1):.1f} ms "
                     f"plain, {h['packed_ms'].get(1):.1f} ms pre-packed")
    if d["noisy"] or d.get("hf", {}).get("noisy"):
        notes.append(f"WARNING: {noisy_probe_note(max(d['spread'], d.get('hf', {}).get('spread', 0.0)))}")
    out = {"forward": d["forward"], "plain_rows_max": r, "plain_ms": d["plain_ms"], "packed_ms": d["packed_ms"],
           "spread": d["spread"]}
    if "hf" in d:
        out["hf"] = {k: d["hf"][k] for k in ("plain_rows_max", "plain_ms", "packed_ms", "spread")}
    return out


def _default_draft(target, notes: list[str]) -> tuple[object, str | None]:
    """The shipped default draft for the default target (``drafters.eagle.load_default_draft``), or
    (None, None) with a note saying why not."""
    from ..drafters.eagle import load_default_draft

    try:
        draft = load_default_draft(target)
    except Exception as exc:  # a missing or damaged draft file (SafetensorError included): noted, not fatal
        first = (str(exc).strip().splitlines() or [""])[0]
        notes.append(f"the default draft could not be loaded (drafters.eagle.load_default_draft: {type(exc).__name__}: "
                     f"{first}): methods that need a draft cannot run")
        return None, None
    return draft, f"drafters.eagle.load_default_draft: {type(draft).__name__}"
