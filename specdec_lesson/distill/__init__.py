"""Distilling the default draft from the target, in one direction: prompts and corpora (:mod:`.data`) ->
teacher data (:mod:`.teacher`) -> training (:mod:`.train`) -> evaluation and export (:mod:`.evaluate`);
the command line is :mod:`.cli` (``python -m specdec_lesson.distill``)."""

from .evaluate import offline_alpha, run_export, run_heldout
from .teacher import atomic_save, load_shards, run_corpus, run_gen
from .train import run_train

__all__ = ["run_gen", "run_corpus", "run_train", "run_heldout", "run_export", "offline_alpha", "load_shards", "atomic_save"]
