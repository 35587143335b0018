"""Optional Triton accelerators for the hot paths, each beside its torch reference.

* :func:`verify_chain_triton` - fused chain verification, bit for bit equal to
  :func:`specdec_lesson.verify.verify_chain_from_randoms` (which is its reference).
* :func:`tree_attention_triton` - flash-attention forward of tree tokens under a tree mask;
  reference :func:`specdec_lesson.kernels.reference.tree_attention`.
* :func:`compact_kv_triton` - in-place KV compaction of the accepted path;
  reference :func:`specdec_lesson.kernels.reference.compact_kv`.

Importing :mod:`specdec_lesson` never imports this package (nor triton).  Importing this package
sets ``TRITON_INTERPRET=1`` when CUDA is absent (it must be set before ``import triton``), so the
kernels also run, slowly, on a CPU.  The wrappers are imported lazily: ``kernels_available()``
answers without failing on a machine where triton is missing.
"""

from __future__ import annotations

import importlib
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

__all__ = ["kernels_available", "verify_chain_triton", "tree_attention_triton", "compact_kv_triton"]

_LAZY = {
    "verify_chain_triton": "specdec_lesson.kernels.verify_chain",
    "tree_attention_triton": "specdec_lesson.kernels.tree_attention",
    "compact_kv_triton": "specdec_lesson.kernels.compaction",
}


def triton_importable() -> bool:
    """True when ``import triton`` succeeds (on CPU it then runs in interpreter mode)."""
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install failing at import time
        return False
    return True


def kernels_available() -> bool:
    """True when the kernels can run natively: triton imports and CUDA is present.
    (Without CUDA they still run under ``TRITON_INTERPRET=1``, for tests and teaching only.)"""
    return torch.cuda.is_available() and triton_importable()


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specdec_lesson.kernels' has no attribute {name!r}")
