"""Draft models derived from the target itself, for teaching and for baselines.

* :func:`noisy_copy` - the target's weights plus Gaussian noise: a draft that agrees with the target
  often but not always, so every number of accepted drafts 0..K occurs (notebooks 02-04 use it on
  the tiny float64 target, where exact laws can be checked);
* :func:`self_draft` - the target's first ``n_layers`` decoder layers with its final norm and head,
  sharing the weights (no copy): untrained as a draft, so it accepts little; it is what Hugging
  Face assisted generation gets when no trained draft exists for the target (the bench's
  ``hf-assisted`` fallback) and the teaching draft of notebooks 02 and 04.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["noisy_copy", "self_draft"]


def noisy_copy(model: torch.nn.Module, scale: float, seed: int = 0, *, relative: bool = True) -> torch.nn.Module:
    """A deep copy of ``model`` whose every parameter tensor gets i.i.d. Gaussian noise of ``scale`` times that
    tensor's standard deviation (``relative=False``: of standard deviation ``scale``), drawn from
    ``torch.Generator(seed)``."""
    if not (isinstance(scale, (int, float)) and scale >= 0):
        raise ValueError(f"scale must be a number >= 0, got {scale!r}")
    draft, g = copy.deepcopy(model), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in draft.parameters():
            noise = torch.randn(prm.shape, generator=g, dtype=prm.dtype)  # [same shape as prm]
            prm.add_(noise * scale * prm.std() if relative else noise * scale)
    return draft.eval()


def self_draft(target: torch.nn.Module, n_layers: int) -> torch.nn.Module | None:
    """A causal LM of ``type(target)`` sharing the target's embedding, first ``n_layers`` decoder layers,
    final norm and head (no copy of any weight); None if the target has no ``model.layers`` to cut
    or ``n_layers`` is not below its depth."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    body = getattr(target, "model", None)
    if body is None or not hasattr(body, "layers") or n_layers >= len(body.layers):
        return None
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:n_layers]
    with torch.device("meta"):
        draft = type(target)(cfg)
    draft.model.embed_tokens, draft.model.norm, draft.lm_head = body.embed_tokens, body.norm, target.lm_head
    draft.model.layers = torch.nn.ModuleList(body.layers[:n_layers])
    if hasattr(body, "rotary_emb"):
        draft.model.rotary_emb = body.rotary_emb
    if getattr(target, "generation_config", None) is not None:
        draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
