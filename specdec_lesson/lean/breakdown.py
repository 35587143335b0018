"""Where the milliseconds of one decode step go: the lean forward taken apart, beside the memory roofline.

One decode step of a Llama streams every weight once (the layers' projections and the LM head), reads the KV cache
(attention), and does a little arithmetic on a few thousand numbers (norms, RoPE, SiLU, residual adds) that costs
no bandwidth but does cost dispatch: one small op after another, each a few microseconds of framework time.
:func:`decode_breakdown` times each part on its own, with the forward's own weights and kernels, and sets it beside
the part's floor, bytes / bandwidth:

* ``projections``: the 4 fused projections of every layer (QKV, O, gate/up, down) at one row, plain or pre-packed
  as the forward's dispatch picks for one row;
* ``attention``: ``scaled_dot_product_attention`` of one query token against a ``context``-token cache, every layer;
* ``lm_head``: the output layer (the tied embedding read as a matrix);
* ``rest``: one whole forward minus the three: norms, RoPE, the cache writes, SiLU, residual adds, the embedding
  lookup, and Python between them.  Its floor is ~0: this is the overhead a fused engine removes.

The parts are timed separately, so they need not add up exactly to the whole (caches are warmer in isolation); the
``rest`` absorbs the difference, and says so.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .model import LeanLlama, lean_model

__all__ = ["decode_breakdown"]


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def decode_breakdown(model, bandwidth: float, context: int = 128, repeats: int = 9) -> dict:
    """Milliseconds of one lean decode step (batch 1, one new token after ``context`` tokens) by part, with each
    part's roofline floor at ``bandwidth`` bytes/s (measure it with ``profiling.measure_bandwidth``).

    Returns ``{"parts": {name: {"ms", "floor_ms", "bytes"}}, "total_ms", "floor_ms", "plain_weights"}``; ``model``
    is a supported Llama (or its :class:`LeanLlama`)."""
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    if context < 1 or repeats < 1:
        raise ValueError(f"context and repeats must be >= 1, got {context} and {repeats}")
    lean = model if isinstance(model, LeanLlama) else lean_model(model)
    plain = 1 <= lean.plain_rows_max  # the dispatch of a one-row forward
    item = lean.embed.element_size()
    x = torch.randn(1, 1, lean.hidden, dtype=lean.dtype, device=lean.device)  # [1, 1, H]
    att_in = torch.randn(1, 1, lean.heads * lean.head_dim, dtype=lean.dtype, device=lean.device)  # [1, 1, nh * D]
    mlp_in = torch.randn(1, 1, lean.inter, dtype=lean.dtype, device=lean.device)  # [1, 1, I]

    def projections() -> None:
        for lay in lean.layers:
            lay.qkv(x, plain)
            lay.o(att_in, plain)
            lay.gate_up(x, plain)
            lay.down(mlp_in, plain)

    g = lean.heads // lean.kv_heads
    q = torch.randn(1, lean.kv_heads, g, lean.head_dim, dtype=lean.dtype, device=lean.device)  # [1, nkv, g, D]
    kv = torch.randn(2, lean.num_layers, 1, lean.kv_heads, context + 1, lean.head_dim, dtype=lean.dtype,
                     device=lean.device)  # keys and values of every layer [2, L, 1, nkv, P, D]

    def attention() -> None:
        for i in range(lean.num_layers):
            F.scaled_dot_product_attention(q, kv[0, i], kv[1, i])

    def lm_head() -> None:
        lean.lm_head(x, plain)

    ids = torch.randint(lean.embed.shape[0], (1, context), generator=torch.Generator().manual_seed(0)).to(lean.device)
    cache = lean.new_cache(1, context + 1)
    lean.forward(ids, cache, cache.plan(context), logits_to_keep=1)
    new = ids[:, :1]

    def whole() -> None:
        lean.forward(new, cache, cache.plan(1))
        cache.set_lengths([context])

    proj_bytes = sum(p.weight.numel() for lay in lean.layers for p in (lay.qkv, lay.o, lay.gate_up, lay.down)) * item
    att_bytes = kv.numel() * item
    head_bytes = lean.lm_head.weight.numel() * item
    total = _median_ms(whole, repeats)
    parts = {"projections": (_median_ms(projections, repeats), proj_bytes),
             "attention": (_median_ms(attention, repeats), att_bytes),
             "lm_head": (_median_ms(lm_head, repeats), head_bytes)}
    rest = total - sum(ms for ms, _ in parts.values())
    out = {name: {"ms": ms, "bytes": b, "floor_ms": b / bandwidth * 1e3} for name, (ms, b) in parts.items()}
    out["rest"] = {"ms": rest, "bytes": 0, "floor_ms": 0.0}
    return {"parts": out, "total_ms": total, "floor_ms": sum(p["floor_ms"] for p in out.values()),
            "plain_weights": plain, "context": context, "bandwidth_gbps": bandwidth / 1e9}
