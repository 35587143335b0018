"""The EAGLE-style draft network (``EagleConfig``, ``EagleDraft``): what it computes and how it trains.

The draft predicts the target's next *feature* (its last hidden state after the final norm) from the target's
feature and the next token's embedding, through ``fc`` and ONE Llama decoder layer; ``forward_train`` unrolls it
over its own predictions (training-time test).  The engine's view of it, with its cache, rollback and trees, is
:class:`specdec_lesson.drafters.eagle.EagleDrafter`; its files (save, load, identity) live there too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EagleConfig", "EagleDraft", "widen_mlp_state"]

class EagleConfig(dict):
    """hidden, heads, kv_heads, head_dim, intermediate, rope_theta, eps, n_sub (a JSON-able dict)."""

    @classmethod
    def from_target(cls, target, n_sub: int) -> EagleConfig:
        c = target.config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 10000.0))
        return cls(hidden=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=hd,
                   intermediate=c.intermediate_size, rope_theta=float(theta), eps=float(c.rms_norm_eps), n_sub=n_sub)


def widen_mlp_state(state: dict, intermediate: int, generator: torch.Generator, std: float = 0.02) -> dict:
    """A draft's weights with its MLP widened to ``intermediate`` units and computing the same function (the growth
    of Net2Net): the new units' gate and up rows are drawn (normal, ``std``), their ``down`` columns are zero, so their
    output starts at zero and training decides what they add.  ``state`` holds ``gate_up.weight`` [2 I0, H] (gate rows,
    then up rows) and ``down.weight`` [H, I0]; ValueError if ``intermediate`` < I0."""
    gate_up, down = state["gate_up.weight"], state["down.weight"]  # [2 I0, H], [H, I0]
    old, H = down.shape[1], down.shape[0]
    if intermediate < old:
        raise ValueError(f"cannot narrow the draft's MLP from {old} to {intermediate} units; pass --intermediate >= {old}")
    extra = intermediate - old
    new_rows = torch.randn(2, extra, H, generator=generator, dtype=torch.float32).to(gate_up.dtype) * std  # [2, I-I0, H]
    gate, up = gate_up[:old], gate_up[old:]  # [I0, H] each
    return {**state, "gate_up.weight": torch.cat([gate, new_rows[0], up, new_rows[1]], 0),  # [2 I, H]
            "down.weight": torch.cat([down, down.new_zeros(H, extra)], 1)}  # [H, I]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class EagleDraft(nn.Module):
    """fc + one decoder layer + norm; ``embed`` [V, H] (input embedding) and ``head`` [N, H] (rows ``d2t`` of the
    output embedding, the same tensor when tied) are frozen target buffers, not saved with the draft."""

    def __init__(self, cfg: EagleConfig, embed: torch.Tensor, out_embed: torch.Tensor, d2t: torch.Tensor) -> None:
        super().__init__()
        self.cfg = EagleConfig(cfg)
        H, nh, nkv, hd, inter = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["intermediate"]
        self.fc = nn.Linear(2 * H, H)
        self.norm_in = nn.Parameter(torch.ones(H))
        self.qkv = nn.Linear(H, (nh + 2 * nkv) * hd, bias=False)
        self.o = nn.Linear(nh * hd, H, bias=False)
        self.norm_mlp = nn.Parameter(torch.ones(H))
        self.gate_up = nn.Linear(H, 2 * inter, bias=False)
        self.down = nn.Linear(inter, H, bias=False)
        self.norm_out = nn.Parameter(torch.ones(H))
        self.register_buffer("embed", embed.detach(), persistent=False)  # [V, H] target's (tied) embedding
        self.register_buffer("d2t", d2t.long(), persistent=True)  # [N] subset -> full vocabulary id
        self.register_buffer("head", out_embed.detach()[d2t.long()].clone(), persistent=False)  # [N, H]
        self.register_buffer("out_embed", out_embed.detach(), persistent=False)  # [V, H] (shares the target's storage)
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        self.register_buffer("inv_freq", inv, persistent=False)
        with torch.no_grad():
            self.fc.weight.mul_(0.5)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # [..., hd/2]
        ang = torch.cat([ang, ang], -1)  # [..., hd]
        return ang.cos().unsqueeze(-3), ang.sin().unsqueeze(-3)  # [.., 1, T, hd] (broadcast over heads)

    def qkv_of(self, feats: torch.Tensor, tokens: torch.Tensor, cos, sin):
        """feats [B, T, H], tokens [B, T] -> (residual x, q [B, nh, T, hd], k, v [B, nkv, T, hd])."""
        c = self.cfg
        x = self.fc(torch.cat([feats, self.embed[tokens]], -1))  # [B, T, H]
        B, T, _ = x.shape
        qkv = self.qkv(_rms(x, self.norm_in, c["eps"])).view(B, T, -1, c["head_dim"]).transpose(1, 2)  # [B, nh+2nkv, T, hd]
        q, k, v = qkv.split([c["heads"], c["kv_heads"], c["kv_heads"]], 1)
        return x, _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def residual_out(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] residual, attn [B, nh, T, hd] -> the layer's residual stream after o and the MLP [B, T, H]."""
        B, _, T, _ = attn.shape
        x = x + self.o(attn.transpose(1, 2).reshape(B, T, -1))  # [B, T, H]
        gate, up = self.gate_up(_rms(x, self.norm_mlp, self.cfg["eps"])).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)  # [B, T, H]

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] residual, attn [B, nh, T, hd] -> predicted next feature g [B, T, H] (after the final norm)."""
        return _rms(self.residual_out(x, attn), self.norm_out, self.cfg["eps"])

    target_hidden_layers: tuple[int, ...] | None = None  # None: the target's last hidden state after its final norm

    def embed_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's features as the draft's input feature (here: the last hidden state itself)."""
        return hidden

    def out_features(self, g: torch.Tensor) -> torch.Tensor:
        """The draft's output ``g`` as a feature for the (tied) output layer (here ``g`` is already normed)."""
        return g

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.out_features(g) @ self.head.T  # [..., N] subset logits

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        return kv.repeat_interleave(self.cfg["heads"] // self.cfg["kv_heads"], 1)  # [B, nh, S, hd]

    def forward_train(self, feats: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test.  feats [B, T, H] = f_0..f_{T-1}, tokens [B, T] = x_1..x_T.  Returns g of each unrolled
        step s (list of [B, T, H]); g_s[:, t] predicts f_{t+1} having fed predicted features for the last s-1 inputs."""
        B, T, _ = feats.shape
        cos, sin = self.rope(torch.arange(T, device=feats.device))
        scale = 1.0 / math.sqrt(self.cfg["head_dim"])
        keys, vals, outs = [], [], []
        inp = first = self.embed_features(feats)  # [B, T, H]
        idx = torch.arange(T, device=feats.device)
        for s in range(steps):
            x, q, k, v = self.qkv_of(inp, tokens, cos, sin)
            keys.append(self.expand(k))
            vals.append(self.expand(v))
            base = (q @ keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T] step-1 (true-feature) keys
            base = base.masked_fill(idx[None, :] > idx[:, None] - s, float("-inf"))  # key j <= t - s
            diag = []
            for r in range(1, s + 1):  # step-r key at position t - (s - r)
                shift = s - r
                kr = F.pad(keys[r], (0, 0, shift, 0))[:, :, :T]  # [B, nh, T, hd]
                d = (q * kr).sum(-1, keepdim=True) * scale  # [B, nh, T, 1]
                diag.append(d.masked_fill((idx < shift)[:, None], float("-inf")))
            p = torch.softmax(torch.cat([base] + diag, -1), -1)  # [B, nh, T, T + s]
            attn = p[..., :T] @ vals[0]
            for r in range(1, s + 1):
                vr = F.pad(vals[r], (0, 0, s - r, 0))[:, :, :T]
                attn = attn + p[..., T + r - 1:T + r] * vr
            g = self.finish(x, attn)  # [B, T, H]
            outs.append(g)
            inp = torch.cat([first[:, :1], g[:, :-1]], 1)  # next step feeds predicted f_t = g[t-1]
        return outs
