"""specdec-lesson: the reference implementation that the speculative-decoding course teaches.

Without CUDA, Triton kernels can only run in its interpreter, which ``TRITON_INTERPRET=1`` selects, and
the variable must be set before ``import triton`` (Hugging Face transformers imports triton when it
builds a model).  The package sets it here, at the first import, on machines without CUDA, so that
:mod:`specdec_lesson.kernels` works whatever was imported after this package.  Nothing else is imported.
"""

import os as _os

if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch

    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"
