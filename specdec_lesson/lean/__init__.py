"""The lean forward: a Llama target without the Hugging Face machinery around its matrix products.

* :mod:`.model` - :class:`LeanLlama`: fused QKV and gate/up weights, RoPE tables, one attention call per layer,
  the plain / pre-packed choice per forward width (:func:`tune_lean_dispatch`); :func:`check_supported` and
  :func:`lean_model`;
* :mod:`.cache` - :class:`StaticKVCache`: keys and values allocated once, one length per row (rollback moves it);
* :mod:`.breakdown` - :func:`decode_breakdown`: one decode step's milliseconds by part, beside the roofline;
* :mod:`.path` - which forward the engines run for a model, and its measured costs;
* :mod:`.slots` - :class:`LeanSlotCache`, the engines' ``SlotCache`` interface on top, and :func:`make_cache`,
  which the engines call: lean for supported models when asked (``lean=True``, or ``LEAN_BY_DEFAULT``).
"""

from .breakdown import decode_breakdown
from .cache import StaticKVCache, Step
from .model import LeanLlama, UnsupportedModelError, check_supported, lean_model, lean_verify_curve, tune_lean_dispatch
from .slots import LeanSlotCache, make_cache

__all__ = ["decode_breakdown", "StaticKVCache", "Step", "lean_verify_curve", "tune_lean_dispatch", "LeanLlama",
           "UnsupportedModelError", "check_supported", "lean_model", "LeanSlotCache", "make_cache"]
