"""The shipped draft's output subset, re-chosen without retraining (``python -m specdec_lesson.distill resubset``).

The EAGLE-style draft scores its predicted feature with the target's own frozen output layer restricted to N rows
(``d2t``), so its trained weights do not depend on N: one trained draft can be re-headed over any subset.
``benchmarks/draft_vocab.py`` measured acceptance per millisecond for N = 1024 .. 49152 and found alpha flat while
the head's cost grows with N; ``resubset`` ships the subset it chose:

* ``answer_subset``: the N most frequent reply tokens of the target's shipped answers to *training* prompts
  (``drafters.suffix.ANSWER_FILES`` and the mixture shards, ``distill.mixture``), end-of-sequence always in, ties to
  the lowest id;
* ``with_subset``: the same trained draft with its head over a given ``d2t``;
* ``run_resubset``: a draft re-headed and written to a folder (each file renamed into place when complete), its
  record saying which subset it carries and, given a held-out set, the offline acceptance with it.  Rewriting the
  shipped draft needs ``force`` (``--force``), and the files it replaces are copied to a backup folder first
  (``backup``; the command line keeps them under ``--out``).  A held-out acceptance in the old record was measured
  with the old head: unless it is measured again (``--heldout``) it moves to ``subset.replaced_head_heldout``, so
  the record never claims it for the new head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .evaluate import _load_weights, _publish, backup_draft, check_draft_dest, offline_alpha
from .teacher import load_file
from .train import choose_subset

__all__ = ["SUBSET_SOURCE", "subset_files", "data_name", "answer_subset", "with_subset", "run_resubset", "check_resubset_dest"]

SUBSET_SOURCE = ("the N most frequent reply tokens of the target's shipped answers to training prompts (drafters.suffix "
                 "answer files and the distill.mixture shards)")


def subset_files() -> list[Path]:
    """The answer files ``answer_subset`` counts by default: the shipped answer files and every mixture shard."""
    from ..drafters.suffix import ANSWER_FILES
    from .mixture import mixture_files

    return [Path(p) for p in (*ANSWER_FILES, *mixture_files()) if Path(p).is_file()]


def data_name(path: Path) -> str:
    """``path`` relative to the package's data folder (how a draft's record names the files its subset came from)."""
    from .answers import SHIPPED_DATA  # not the draft's folder, which a draft elsewhere (or a test) moves

    return Path(path).resolve().relative_to(SHIPPED_DATA.resolve()).as_posix()


def answer_subset(n_sub: int, vocab: int, eos: int, files: tuple[Path, ...] | None = None) -> torch.Tensor:
    """``d2t``: the ``n_sub`` most frequent reply tokens of ``files`` (default ``subset_files()``: the shipped answer
    files and mixture shards; ``eos`` always in), sorted."""
    from ..drafters.suffix import ANSWER_FILES, load_answer_corpus

    paths = [p for p in files if Path(p).is_file()] if files else subset_files()
    if not paths:
        raise FileNotFoundError(f"no answer file among {[str(p) for p in (files or ANSWER_FILES)]}; make one with "
                                "python -m specdec_lesson.distill answers")
    rows = [r for p in paths for r in load_answer_corpus(p)[0]]
    rows = [{"tokens": torch.tensor(r["tokens"]), "n_prompt": r["n_prompt"]} for r in rows]
    return choose_subset(rows, n_sub, vocab, always=(eos,))  # [N]


def with_subset(draft, target, d2t: torch.Tensor):
    """The same trained draft, with its head over the tokens ``d2t`` (``[N]`` target ids)."""
    from ..drafters.eagle import EagleConfig, _target_tables, draft_class

    cfg = EagleConfig(dict(draft.cfg), n_sub=len(d2t))
    model = draft_class(cfg)(cfg, *_target_tables(target), d2t=d2t)
    _load_weights(model, draft.state_dict())  # the trained weights; d2t stays the new subset
    return model.eval()


def check_resubset_dest(src: Path, dest: Path, force: bool = False) -> None:
    """One UsageError naming the fix, before any model is loaded, unless ``dest`` may be written: rewriting the
    shipped draft folder, or replacing a draft already in another folder, needs ``force``."""
    from ..cli_args import UsageError
    from ..drafters.eagle import DEFAULT_DRAFT_NAME

    if not (Path(src) / f"{DEFAULT_DRAFT_NAME}.json").is_file():
        raise UsageError(f"no draft {DEFAULT_DRAFT_NAME}.json in {src} to re-head")
    check_draft_dest(dest, force, "resubset", src=src)


def run_resubset(n_sub: int, held_path: Path | None = None, k: int = 4, dest: Path | None = None, *,
                 src: Path | None = None, force: bool = False, backup: Path | None = None) -> dict:
    """Re-head the draft in ``src`` (default: ``dest``, else the shipped one) over ``answer_subset(n_sub)`` and write
    it to ``dest`` (default: ``src``, in place).  Rewriting the shipped draft needs ``force``
    (``check_resubset_dest``); ``backup``, a new folder, receives a copy of the draft files ``dest`` held first.

    Its JSON keeps the training record; ``subset`` says where the N tokens came from and what they replaced, and
    ``training.heldout_offline_alpha_k{k}`` is rescored on ``held_path`` (``distill heldout``) when given; every
    held-out acceptance not rescored (measured with the replaced head) moves to ``subset.replaced_head_heldout``."""
    from ..drafters.eagle import DEFAULT_DRAFT_DIR, DEFAULT_DRAFT_NAME, EagleDrafter, load_draft, save_draft
    from ..models import load_default_target

    src = Path(src or dest or DEFAULT_DRAFT_DIR)
    dest = Path(dest or src)
    check_resubset_dest(src, dest, force)
    meta = json.loads((src / f"{DEFAULT_DRAFT_NAME}.json").read_text())
    held = load_file(held_path, "the held-out set", "delete it and rerun distill heldout") if held_path else None
    target, tok = load_default_target(verbose=False)
    old = load_draft(target, src)
    V = target.config.vocab_size
    if n_sub > V:
        raise ValueError(f"--n-sub {n_sub} is larger than the target's vocabulary ({V})")
    files = subset_files()
    model = with_subset(old, target, answer_subset(n_sub, V, tok.eos_token_id, tuple(files)))
    info = {k_: v for k_, v in meta.items() if k_ != "config"}
    info["subset"] = {"n": n_sub, "source": SUBSET_SOURCE, "replaced_n": len(old.d2t),
                      "chosen_by": "benchmarks/draft_vocab.py (acceptance per millisecond)",
                      "files": [data_name(f) for f in files]}  # the mixture grows: which shards counted
    training = info.setdefault("training", {})
    stale = {key: training.pop(key) for key in list(training) if key.startswith("heldout_offline_alpha_k")}
    if held is not None:
        training[f"heldout_offline_alpha_k{k}"] = offline_alpha(EagleDrafter(model), held, k)
        stale.pop(f"heldout_offline_alpha_k{k}", None)
    if stale:
        info["subset"]["replaced_head_heldout"] = dict(stale, note=(
            f"measured with the replaced head of {len(old.d2t)} tokens, not with this one: rerun distill resubset "
            "with --heldout to measure it"))
    info_backup = backup_draft(dest, backup)
    _publish(dest, lambda tmp: save_draft(model, tmp, DEFAULT_DRAFT_NAME, extra=info))
    return dict(info, backup=info_backup)
