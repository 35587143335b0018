"""The offline default pair: SmolLM2-135M-Instruct and the project's distilled draft.

Nothing inside the package imports this module except the CLIs on top (demo, bench), so loading
the pair never runs in a circle."""

from __future__ import annotations

from ..models import ModelPair, load_default_target
from .eagle import load_default_draft

__all__ = ["load_default_pair"]


def load_default_pair(device: str = "cpu", *, fast: bool = True, verbose: bool = True, tune: bool = True):
    """``ModelPair(target, draft, tokenizer)``: SmolLM2-135M-Instruct (its linears pre-packed for
    oneDNN when ``fast`` and on CPU) and the shipped distilled draft, fully offline.

    With ``fast`` and ``tune`` (on CPU), :func:`specdec_lesson.lean.path.tune_engine_dispatch` measures plain
    against pre-packed weights per forward width on this machine (a few seconds; on the forward the engines run)
    and routes each width to the faster one, so plain decoding and verification both run in their fastest form;
    what it measured is kept as ``target.dispatch_profile``."""
    target, tok = load_default_target(device, fast=fast, verbose=verbose)
    if fast and tune and str(device).startswith("cpu"):
        from ..lean.path import tune_engine_dispatch

        target.dispatch_profile = tune_engine_dispatch(target, repeats=3, verbose=verbose)
    return ModelPair(target, load_default_draft(target), tok)
