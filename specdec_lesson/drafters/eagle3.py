"""An EAGLE-3-style draft: features fused from three target layers, and the draft's own hidden state fed back.

What changes from :class:`specdec_lesson.drafters.eagle.EagleDraft` (Li et al., EAGLE-3, 2025):

* the input feature is ``fc([h_low ; h_mid ; h_high])``: the target's residual stream entering a low, a middle
  and a high layer (EAGLE-3 and vLLM use layers 2, L/2 and L-3), not its last hidden state alone;
* the decoder layer's attention reads ``[norm(e(x)) ; norm(h)]`` (2H wide), with ``h`` (not the embedding) as
  the residual, so the token and the feature keep separate norms;
* the layer's output ``g`` is the residual stream before the final norm: it is fed back as the next position's
  ``h`` past the verified prefix, and ``norm(g) @ E_sub.T`` gives the logits (the target's tied output layer on
  the draft vocabulary ``d2t``); no feature-regression loss ties ``g`` to the target's features.

The weights map one to one onto vLLM's EAGLE-3 Llama draft (``fc``, one decoder layer with ``hidden_norm``,
``norm``, ``lm_head`` over the draft vocabulary, and ``d2t``).  Everything else (training-time test, the
engine's cache, rollback, trees) is the parent's.  Importing this module registers ``arch = "eagle3"`` for
``drafters.eagle.load_draft``.
"""

from __future__ import annotations

import torch
from torch import nn

from .eagle import DRAFT_CLASSES
from .eagle_model import EagleConfig, EagleDraft, _rms, _rotate

__all__ = ["Eagle3Draft", "eagle3_config", "default_aux_layers"]


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's layers (2, L // 2, L - 3), clamped to 1..L for tiny targets: the residual stream entering layer i
    is ``hidden_states[i]`` in HF (vLLM's ``aux_hidden_state_layers``)."""
    return tuple(max(1, min(num_layers, i)) for i in (2, num_layers // 2, num_layers - 3))


def eagle3_config(target, n_sub: int, aux_layers: tuple[int, ...] | None = None) -> EagleConfig:
    """The target's shapes (``EagleConfig.from_target``) with ``arch`` and ``aux_layers``."""
    layers = tuple(aux_layers or default_aux_layers(target.config.num_hidden_layers))
    n = target.config.num_hidden_layers
    if not layers or any(not 0 < i <= n for i in layers):
        raise ValueError(f"aux_layers must be target layer indices in 1..{n}, got {layers}")
    return EagleConfig(EagleConfig.from_target(target, n_sub), arch="eagle3", aux_layers=list(layers))


class Eagle3Draft(EagleDraft):
    """fc (n_aux * H -> H) + one decoder layer reading [norm(embedding) ; norm(feature)] + final norm."""

    def __init__(self, cfg: EagleConfig, embed: torch.Tensor, out_embed: torch.Tensor, d2t: torch.Tensor) -> None:
        super().__init__(cfg, embed, out_embed, d2t)
        H, nh, nkv, hd = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        n_aux = len(cfg["aux_layers"])
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.qkv = nn.Linear(2 * H, (nh + 2 * nkv) * hd, bias=False)
        self.norm_hidden = nn.Parameter(torch.ones(H))
        with torch.no_grad():  # start as "the highest fused layer": the residual stream closest to the output
            self.fc.weight.zero_()
            self.fc.weight[:, (n_aux - 1) * H:].copy_(torch.eye(H))

    @property
    def target_hidden_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg["aux_layers"])

    def embed_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., n_aux * H] (the target's residual streams, concatenated) -> fused feature [..., H]."""
        return self.fc(hidden)

    def out_features(self, g: torch.Tensor) -> torch.Tensor:
        return _rms(g, self.norm_out, self.cfg["eps"])  # [..., H]

    def qkv_of(self, feats: torch.Tensor, tokens: torch.Tensor, cos, sin):
        """feats [B, T, H] (fused target feature or the draft's own g), tokens [B, T] -> (residual, q, k, v)."""
        c = self.cfg
        e = _rms(self.embed[tokens], self.norm_in, c["eps"])  # [B, T, H]
        h = _rms(feats, self.norm_hidden, c["eps"])  # [B, T, H]
        B, T, _ = feats.shape
        qkv = self.qkv(torch.cat([e, h], -1)).view(B, T, -1, c["head_dim"]).transpose(1, 2)  # [B, nh+2nkv, T, hd]
        q, k, v = qkv.split([c["heads"], c["kv_heads"], c["kv_heads"]], 1)
        return feats, _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] residual, attn [B, nh, T, hd] -> g [B, T, H], the residual stream before the final norm."""
        return self.residual_out(x, attn)


def init_eagle3_from_target(model: Eagle3Draft, target) -> None:
    """The layer from the target's last decoder layer (its attention's feature half) and first one (the
    embedding half); the final norm from the target's."""
    last, first = target.model.layers[-1], target.model.layers[0]
    H = model.cfg["hidden"]

    def qkv(layer) -> torch.Tensor:
        a = layer.self_attn
        return torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)  # [(nh+2nkv)*hd, H]

    with torch.no_grad():
        model.qkv.weight[:, :H].copy_(qkv(first))
        model.qkv.weight[:, H:].copy_(qkv(last))
        model.norm_in.copy_(first.input_layernorm.weight)
        model.norm_hidden.copy_(last.input_layernorm.weight)
        model.o.weight.copy_(last.self_attn.o_proj.weight)
        model.gate_up.weight.copy_(torch.cat([last.mlp.gate_proj.weight, last.mlp.up_proj.weight], 0))
        model.down.weight.copy_(last.mlp.down_proj.weight)
        model.norm_mlp.copy_(last.post_attention_layernorm.weight)
        model.norm_out.copy_(target.model.norm.weight)


DRAFT_CLASSES["eagle3"] = Eagle3Draft
