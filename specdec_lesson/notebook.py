"""The first cell of every notebook: seed everything, pick the Triton mode, set plotly's renderer, word warnings.

Usage (first code cell)::

    import os
    FAST = "CI" in os.environ          # CI shrinks trial counts
    from specdec_lesson.notebook import setup
    gen = setup(seed=0)                 # a torch.Generator to pass explicitly to every sampler
"""

from __future__ import annotations

import os
import random
import warnings

import torch

__all__ = ["setup"]


def setup(seed: int = 0, *, threads: int | None = None) -> torch.Generator:
    """Seed python/numpy/torch once, set ``TRITON_INTERPRET=1`` when there is no CUDA (must
    happen before triton is imported), use plotly's ``plotly_mimetype`` renderer (plain JSON
    outputs, no random ids), show warnings as one line, "UserWarning: message", without the file path
    and source line of the code that raised them (a committed notebook then holds no path of the
    machine that ran it), and return a seeded ``torch.Generator``.

    Both arguments are checked before anything is set (a ValueError names the bad one): ``seed`` an
    int >= 0 (numpy takes it modulo 2**32), ``threads`` None or an int in 1..os.cpu_count() (a huge
    count would crash the process at the next matmul)."""
    from .cli_args import check_seed, check_threads

    check_seed(seed, "setup(seed=...)")
    check_threads(threads, "setup(threads=...)")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        import plotly.io as pio

        pio.renderers.default = "plotly_mimetype"
    except ImportError:  # pragma: no cover - plotly is a course dependency
        pass
    warnings.formatwarning = _one_line
    gen = torch.Generator().manual_seed(seed)
    return gen


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}\n"
