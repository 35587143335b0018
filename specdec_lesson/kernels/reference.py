"""Torch references for the Triton kernels (and the library's own functions for these jobs).

* chain verification: the reference is :func:`specdec_lesson.verify.verify_chain_from_randoms`
  itself (re-exported here, not copied); it and the kernel's wrapper bring their inputs to fp32 /
  fp64 with the same :func:`specdec_lesson.verify.prepare_verify_inputs` (half-precision laws
  renormalised in fp32), so they agree bit for bit at every input precision;
* :func:`tree_attention`: attention of the new tree tokens to the cached prefix plus the tree,
  under a boolean mask, by ``torch.nn.functional.scaled_dot_product_attention``;
* :func:`build_tree_mask`: that mask from a (left-padded) prefix mask and a tree mask;
* :func:`compact_kv`: in-place KV compaction of the accepted path, the library's compaction
  function (the tree module imports it from here).

This module imports torch only (no triton), so the library can use it on any machine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_lesson.verify import verify_chain_from_randoms

__all__ = ["verify_chain_from_randoms", "tree_attention", "build_tree_mask", "compact_kv", "check_compact_kv_args"]


def build_tree_mask(prefix_mask: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """Attention mask ``[B, N, P+N]`` (True = may attend) of N tree tokens over a cache holding
    a prefix of P slots followed by the N tree slots.

    Args:
        prefix_mask: ``[B, P]`` bool, True where the prefix slot holds a real token (False for
            left padding or freed slots).  Every tree token sees every real prefix token.
        tree_mask: ``[N, N]`` or ``[B, N, N]`` bool, ``tree_mask[i, j]`` True when tree node j is
            node i itself or one of its ancestors.
    """
    if prefix_mask.dim() != 2 or prefix_mask.dtype != torch.bool:
        raise ValueError(f"prefix_mask must be a [B, P] bool tensor, got {prefix_mask.dtype} {tuple(prefix_mask.shape)}")
    B, P = prefix_mask.shape
    if tree_mask.dtype != torch.bool or tree_mask.dim() not in (2, 3) or tree_mask.shape[-1] != tree_mask.shape[-2]:
        raise ValueError(f"tree_mask must be a [N, N] or [B, N, N] bool tensor, got {tree_mask.dtype} {tuple(tree_mask.shape)}")
    N = tree_mask.shape[-1]
    tree = tree_mask.expand(B, N, N)  # [B, N, N]
    if tree.shape[0] != B:
        raise ValueError(f"tree_mask batch {tree_mask.shape[0]} does not match prefix_mask batch {B}")
    prefix = prefix_mask.unsqueeze(1).expand(B, N, P)  # [B, N, P]
    return torch.cat([prefix, tree], dim=-1)  # [B, N, P+N]


def tree_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Softmax attention of tree queries over cache + tree keys under a boolean mask.

    Args:
        queries: ``[B, H, N, D]`` the N new tree tokens.
        keys, values: ``[B, Hkv, S, D]`` prefix cache followed by the tree (``H % Hkv == 0``:
            grouped-query attention, query head h reads kv head ``h // (H // Hkv)``).
        mask: ``[B, N, S]`` bool, True = may attend (e.g. :func:`build_tree_mask`).  Every query
            row must attend at least one key (a tree node always sees itself).
        scale: softmax scale, default ``1 / sqrt(D)``.

    Returns ``[B, H, N, D]`` in the dtype of ``queries``.
    """
    _check_attention(queries, keys, values, mask)
    H, Hkv = queries.shape[1], keys.shape[1]
    attn_mask = mask.unsqueeze(1)  # [B, 1, N, S], broadcast over heads
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=attn_mask, scale=scale, enable_gqa=H != Hkv)


def _check_attention(queries, keys, values, mask) -> None:
    if queries.dim() != 4:
        raise ValueError(f"queries must be [B, H, N, D], got shape {tuple(queries.shape)}")
    B, H, N, D = queries.shape
    if keys.dim() != 4 or keys.shape[0] != B or keys.shape[3] != D or tuple(values.shape) != tuple(keys.shape):
        raise ValueError(
            f"keys and values must both be [B, Hkv, S, D] with B={B}, D={D}; got {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    Hkv, S = keys.shape[1], keys.shape[2]
    if H % Hkv != 0:
        raise ValueError(f"query heads H={H} must be a multiple of kv heads Hkv={Hkv}")
    if mask.dtype != torch.bool or tuple(mask.shape) != (B, N, S):
        raise ValueError(f"mask must be a [B, N, S] = {(B, N, S)} bool tensor, got {mask.dtype} {tuple(mask.shape)}")
    if not (queries.dtype == keys.dtype == values.dtype) or not torch.is_floating_point(queries):
        raise ValueError(
            f"queries, keys, values must share one floating dtype, got {queries.dtype}, {keys.dtype}, {values.dtype}"
        )


def check_compact_kv_args(keys, values, src_index, dst_start, n_valid) -> None:
    """Raise ValueError naming the first problem (shapes, dtypes, index ranges: one host sync)."""
    if keys.dim() != 4 or tuple(values.shape) != tuple(keys.shape):
        raise ValueError(f"keys and values must both be [B, H, S, D], got {tuple(keys.shape)} and {tuple(values.shape)}")
    B, _, S, _ = keys.shape
    if src_index.dim() != 2 or src_index.shape[0] != B or src_index.dtype != torch.int64:
        raise ValueError(f"src_index must be a [B, N] int64 tensor with B={B}, got {src_index.dtype} {tuple(src_index.shape)}")
    N = src_index.shape[1]
    for name, t in (("dst_start", dst_start), ("n_valid", n_valid)):
        if tuple(t.shape) != (B,) or t.dtype != torch.int64:
            raise ValueError(f"{name} must be a [B] int64 tensor, got {t.dtype} {tuple(t.shape)}")
    if bool(((n_valid < 0) | (n_valid > N)).any()):
        raise ValueError(f"n_valid must lie in [0, N={N}], got {n_valid.tolist()}")
    valid = torch.arange(N, device=src_index.device) < n_valid.unsqueeze(1)  # [B, N]
    if bool((valid & ((src_index < 0) | (src_index >= S))).any()):
        raise ValueError(f"src_index entries below n_valid must lie in [0, S={S})")
    if bool(((dst_start < 0) | (dst_start + n_valid > S)).any()):
        raise ValueError(f"destination slots dst_start .. dst_start + n_valid - 1 must lie in [0, S={S})")


def compact_kv(
    keys: torch.Tensor,
    values: torch.Tensor,
    src_index: torch.Tensor,
    dst_start: torch.Tensor,
    n_valid: torch.Tensor,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the accepted path's cache entries to contiguous slots, in place.

    For every row b and i < n_valid[b]:  ``cache[b, :, dst_start[b] + i] = old cache[b, :, src_index[b, i]]``
    for both ``keys`` and ``values`` (all sources are read before any destination is written, so
    sources and destinations may overlap in any way).  Slots outside the destinations are left
    untouched; entries of ``src_index`` at or beyond ``n_valid[b]`` are ignored (padding).

    Args:
        keys, values: ``[B, H, S, D]`` one layer's cache (modified in place).
        src_index: ``[B, N]`` int64, slot of the i-th accepted token (e.g. prefix length + tree
            node index along the accepted path).
        dst_start: ``[B]`` int64, first destination slot (e.g. the prefix length).
        n_valid: ``[B]`` int64 in ``0..N``, how many entries of each row to move.

    Returns ``(keys, values)`` (the same tensors).  The new valid length of row b is
    ``dst_start[b] + n_valid[b]``: crop or mask the cache beyond it.
    """
    if validate:
        check_compact_kv_args(keys, values, src_index, dst_start, n_valid)
    N = src_index.shape[1]
    valid = torch.arange(N, device=src_index.device) < n_valid.unsqueeze(1)  # [B, N]
    rows, cols = valid.nonzero(as_tuple=True)  # [M], [M]
    src = src_index[rows, cols]  # [M]
    dst = dst_start[rows] + cols  # [M]
    for cache in (keys, values):
        cache[rows, :, dst] = cache[rows, :, src]  # [M, H, D]: the right side is gathered first
    return keys, values
