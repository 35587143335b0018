"""The target's own answers to training prompts, kept compactly as token ids (``distill answers``).

What must survive a new machine is small: token ids, not hidden states (features are recomputed from the ids
whenever they are needed).  ``run_answers`` has the target answer ``distill.data.training_prompts`` greedily in
batches and writes ``tokens`` (uint16, every answer's prompt and reply concatenated), ``offsets``, ``n_prompt`` and
``kind`` to one ``.npz`` file, with the settings that made it (read back by
``drafters.suffix.load_answer_corpus``).  Progress is saved atomically after each batch in a
``.partial.npz`` beside the output, so an interrupted run resumes where it stopped and never leaves a file that
passes for complete; the finished file is renamed into place at the end.

The replies are the corpus of :class:`specdec_lesson.drafters.suffix.SuffixIndex` (lookup over past answers), and
teacher data for the next draft.  Training prompts are disjoint from every benchmark prompt (``distill.data``),
so the corpus holds no benchmark answer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..drafters.suffix import ANSWERS_FORMAT, KINDS, load_answer_corpus
from .data import chat_text, training_prompts

__all__ = ["run_answers", "check_answers_out", "SHIPPED_DATA"]

SHIPPED_DATA = Path(__file__).resolve().parents[1] / "data"  # the package's shipped files: never written by default


def _save(path: Path, rows: list[dict], meta: dict, extra: dict[str, np.ndarray] | None = None) -> None:
    """Write ``rows`` ({tokens, n_prompt, kind}) and the ``extra`` arrays to ``path`` through a temporary file,
    fsync and a rename (``distill.mixture`` adds a temperature per answer)."""
    lens = [len(r["tokens"]) for r in rows]
    tokens = np.concatenate([np.asarray(r["tokens"], dtype=np.uint16) for r in rows]) if rows else np.zeros(0, np.uint16)
    arrays = {
        "tokens": tokens, "offsets": np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        "n_prompt": np.asarray([r["n_prompt"] for r in rows], dtype=np.int32),
        "kind": np.asarray([KINDS.index(r["kind"]) for r in rows], dtype=np.uint8),
        "meta": np.asarray(json.dumps(meta, sort_keys=True)), **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def check_answers_out(out: Path, force: bool = False, flag: str = "--file") -> Path:
    """``out`` if it may be written: an existing finished file, or any path inside the package's shipped data
    (``specdec_lesson/data``, e.g. the shipped answer corpus), only with ``force``; else one UsageError naming the
    fix.  Its ``.partial.npz`` (an interrupted run to resume) needs nothing."""
    from ..cli_args import UsageError

    out = Path(out)
    shipped = out.expanduser().resolve().is_relative_to(SHIPPED_DATA.resolve())
    if force:
        return out
    if out.exists():
        what = "a shipped answer corpus" if shipped else "a finished answers file"
        raise UsageError(f"{flag} {out} exists ({what}): add --force to replace it, or choose another {flag}")
    if shipped:
        raise UsageError(f"{flag} {out} is inside the package's shipped data ({SHIPPED_DATA}): add --force to write "
                         f"there, or choose a {flag} outside the package")
    return out


def run_answers(out: Path, n_code: int, n_math: int, batch: int, max_new: int, seed: int, progress: bool = True,
                model=None, tokenizer=None, max_batches: int | None = None, force: bool = False) -> dict:
    """Answer the first ``n_code`` + ``n_math`` training prompts of ``seed`` greedily, ``batch`` at a time; write
    ``out`` and return its meta.  ``model`` / ``tokenizer`` default to the default target (pre-packed).
    ``max_batches`` stops after that many batches: the file is then complete for a prefix of the same prompt list
    (its meta's ``answers`` says how many).  An existing ``out``, or one inside the package's shipped data, is
    replaced only with ``force`` (``check_answers_out``, before the model is loaded)."""
    from tqdm import tqdm

    from .teacher import generate_teacher

    check_answers_out(out, force)

    name = "a model passed in"
    if model is None:
        from ..models import DEFAULT_TARGET_NAME, load_default_target

        model, tokenizer = load_default_target(verbose=False, fast=True)  # pre-packed: batched rows run faster
        name = DEFAULT_TARGET_NAME  # a name, never a path of this machine
    if tokenizer.vocab_size > 65536:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens; this file stores ids as uint16 (< 65536)")
    items = training_prompts(n_code, n_math, seed)
    meta = {"format": ANSWERS_FORMAT, "seed": seed, "n_code": n_code, "n_math": n_math, "max_new": max_new,
            "batch": batch, "temperature": 0.0, "model": name,
            "prompts": "distill.data.training_prompts(n_code, n_math, seed)"}
    partial = out.with_name(out.name.replace(".npz", "") + ".partial.npz")
    rows: list[dict] = []
    if partial.exists():
        rows, old = load_answer_corpus(partial)
        if {k: v for k, v in old.items() if k != "done"} != meta:
            raise ValueError(f"{partial} was made with other settings ({old}); delete it or rerun with those settings")
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    end = len(items) if max_batches is None else min(len(items), max_batches * batch)
    batches = range(len(rows) // batch * batch, end, batch)
    for start in tqdm(batches, desc="answers", disable=not progress):
        chunk = items[start:start + batch]
        ids = [tokenizer(chat_text(tokenizer, text), add_special_tokens=False)["input_ids"] for _, text in chunk]
        with torch.inference_mode():
            made = generate_teacher(model, ids, max_new, 0.0, torch.Generator().manual_seed(seed), eos, pad)
        rows = rows[:start] + [{"tokens": r["tokens"].tolist(), "n_prompt": r["n_prompt"], "kind": kind}
                               for r, (kind, _) in zip(made, chunk)]
        _save(partial, rows, dict(meta, done=len(rows)))
    meta = dict(meta, answers=len(rows), tokens=sum(len(r["tokens"]) for r in rows),
                reply_tokens=sum(len(r["tokens"]) - r["n_prompt"] for r in rows))
    _save(out, rows, meta)
    if partial.exists():
        partial.unlink()
    return meta
