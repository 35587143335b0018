"""Teacher data recomputed from token ids (``python -m specdec_lesson.distill features``).

The target's own answers are kept as token ids (``distill answers``: a few hundred kB in the repository);
their features are not (a few GB) and are recomputed here on any machine: one teacher-forced target forward
per answer (prompt + reply), batched to a budget of padded positions, about 5x faster than generating the
answers was.  Each row gets the last hidden state after the final norm (``feats``: the teacher's law comes
from it) and, with ``aux_layers``, the residual streams entering those layers (``aux``: the EAGLE-3 draft's
input).  A forward of the whole known sequence gives the same features as the generation did, up to float
rounding (the answers were made with pre-packed weights, the features with plain ones).

Shards ``out/data/shard_ans_<file>_XXXXX.pt`` are written atomically and skipped when present, so an
interrupted run resumes.  The held-out set (``heldout.pt``) gets its ``aux`` the same way (``add_aux``).
"""

from __future__ import annotations

import re
from pathlib import Path

from .teacher import _teacher, atomic_save, forward_in_batches, load_file

__all__ = ["run_features", "add_aux"]


def _tag(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", path.name.removesuffix(".npz"))


def run_features(out: Path, files: list[Path], aux_layers: tuple[int, ...] | None, shard_rows: int = 128,
                 budget: int = 8192, max_len: int = 1024, fast: bool = False, progress: bool = True,
                 max_shards: int | None = None, bf16: bool = False) -> int:
    """Write the feature shards of every answer file in ``files``; returns the number of shards written.
    ``bf16``: the target's forward under bfloat16 autocast (about 2x faster on CPUs with AVX512-BF16 or AMX; the
    features then differ from fp32 ones by about 1.1% in norm, measured on 10k positions of a mixture shard);
    the shards record it (``"bf16"`` per row)."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from ..drafters.suffix import load_answer_corpus

    corpora = [(f, load_answer_corpus(f)[0]) for f in files]  # every file checked before the target is loaded
    for f, rows in corpora:  # mixture shards store each answer's temperature; answers files are greedy
        with np.load(f) as z:
            temps = z["temperature"].tolist() if "temperature" in z.files else [0.0] * len(rows)
        for r, t in zip(rows, temps):
            r["temperature"] = float(t)
    model, _ = _teacher(fast, 0)
    V = model.get_input_embeddings().weight.shape[0]
    for f, rows in corpora:
        top = max((max(r["tokens"]) for r in rows if r["tokens"]), default=0)
        if top >= V:
            raise ValueError(f"answer file {f} has token id {top}, outside the teacher's vocabulary of {V}: it was made "
                             "for another target (with --fast the teacher is a tiny random model)")
    jobs = [(f, rows, i) for f, rows in corpora for i in range(0, len(rows), shard_rows)][:max_shards]
    written = 0
    for f, rows, i in tqdm(jobs, desc="features", disable=not progress):
        path = out / "data" / f"shard_ans_{_tag(f)}_{i // shard_rows:05d}.pt"
        if path.exists():
            continue
        chunk = sorted(rows[i: i + shard_rows], key=lambda r: len(r["tokens"]))
        seqs = [r["tokens"][:max_len] for r in chunk]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            made = forward_in_batches(model, seqs, [min(r["n_prompt"], max_len - 1) for r in chunk], budget, aux_layers)
        for r, src in zip(made, chunk):
            r["kind"], r["temperature"], r["source"], r["bf16"] = src["kind"], src["temperature"], "answers", bf16
        atomic_save(made, path)
        written += 1
    return written


def add_aux(out: Path, aux_layers: tuple[int, ...], budget: int = 8192) -> Path:
    """Give every row of ``out/heldout.pt`` its ``aux`` features for ``aux_layers`` (recomputed teacher-forced);
    rewritten atomically, a no-op when they are there already."""
    path = out / "heldout.pt"
    rows = load_file(path, "the held-out set", "run heldout with the same --out first")
    if all(r.get("aux_layers") == list(aux_layers) for r in rows):
        return path
    model, _ = _teacher(False, 0)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["tokens"]))
    made = forward_in_batches(model, [rows[i]["tokens"].tolist() for i in order], [rows[i]["n_prompt"] for i in order],
                              budget, aux_layers)
    for i, m in zip(order, made):
        rows[i]["aux"], rows[i]["aux_layers"] = m["aux"], m["aux_layers"]
    atomic_save(rows, path)
    return path
