"""Tree attention: a flash-attention forward of the N tree tokens over the cache + tree, under a mask.

Reference: :func:`specdec_lesson.kernels.reference.tree_attention` (``scaled_dot_product_attention``
with the same boolean mask).

Design:

* Grouped-query attention is folded into the row dimension: one program serves one
  ``(batch, kv head)`` pair and a block of ``BLOCK_M`` rows of the ``G * N`` (query head in the
  group, tree token) pairs, so each key/value block is read from memory once for all G query
  heads that share it (decode-time attention is bandwidth-bound: the bytes are the KV cache).
* Keys are visited in blocks of ``BLOCK_N`` with an online softmax (running max ``m``, running
  sum ``l``, rescaled accumulator): the ``[N, S]`` score matrix never exists in memory.
* The mask tile ``[BLOCK_M, BLOCK_N]`` is loaded from the ``[B, N, S]`` byte mask (shared by all
  heads; True = may attend); masked scores become ``-inf``.  A row that has seen no allowed key
  yet keeps ``m = -inf`` and is guarded against ``exp(-inf - -inf)``.  A row with no allowed key
  at all returns zeros (the reference returns NaN there; tree rows always see themselves).
* Scores and the softmax run in fp32; fp32 inputs use IEEE-precision dots (no TF32), so the
  result matches the reference within ~1e-5; fp16/bf16 inputs use tensor-core dots with fp32
  accumulation (the probabilities are cast to the value dtype for the second dot).  Under the
  CPU interpreter bf16 tiles are upcast to fp32 first (its bf16 ``tl.dot`` is wrong).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from specdec_lesson.kernels.reference import _check_attention, tree_attention

__all__ = ["tree_attention_triton", "tree_attention"]


@triton.jit
def _tree_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr,
    N, S, Hkv, qk_scale,  # qk_scale = softmax scale * log2(e): exp2 instead of exp
    sqb, sqh, sqn, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smn, sms, sob, soh, son, sod,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOTS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // Hkv).to(tl.int64)
    kvh = (pid_bh % Hkv).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] index into the G*N (head, token) pairs
    row_ok = rows < G * N
    h = kvh * G + (rows // N)  # [BLOCK_M] query head
    n = rows % N  # [BLOCK_M] tree token
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q_ptrs = q_ptr + b * sqb + h[:, None] * sqh + n[:, None] * sqn + d[None, :] * sqd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    cols = tl.arange(0, BLOCK_N)
    k_base = k_ptr + b * skb + kvh * skh
    v_base = v_ptr + b * svb + kvh * svh
    m_base = mask_ptr + b * smb + n[:, None] * smn
    for start in range(0, S, BLOCK_N):
        s = start + cols  # [BLOCK_N]
        s_ok = s < S
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + s[:, None] * sks + d[None, :] * skd, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_base + s[:, None] * svs + d[None, :] * svd, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        allowed = tl.load(m_base + s[None, :] * sms, mask=row_ok[:, None] & s_ok[None, :], other=0) != 0  # [BLOCK_M, BLOCK_N]
        if F32_DOTS:
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(allowed, scores * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # [BLOCK_M]
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
        p = tl.exp2(scores - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        alpha = tl.exp2(m_i - m_safe)  # [BLOCK_M] rescales the old sum and accumulator
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if F32_DOTS:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # fully masked rows: 0
    o_ptrs = out_ptr + b * sob + h[:, None] * soh + n[:, None] * son + d[None, :] * sod
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _interpreting() -> bool:
    # triton 3.7's interpreter computes tl.dot on bfloat16 operands wrongly (raw bits), so under
    # TRITON_INTERPRET=1 bf16 tiles are upcast to fp32 before the dots; GPUs use bf16 tensor cores.
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def tree_attention_triton(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Triton version of :func:`specdec_lesson.kernels.reference.tree_attention`: same arguments
    (``queries [B, H, N, D]``, ``keys/values [B, Hkv, S, D]``, ``mask [B, N, S]`` bool), same result
    ``[B, H, N, D]`` within float tolerance (fp32: about 1e-5 absolute)."""
    _check_attention(queries, keys, values, mask)
    B, H, N, D = queries.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    G = H // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty_like(queries)  # [B, H, N, D]
    mask_u8 = mask.view(torch.uint8) if mask.is_contiguous() else mask.contiguous().view(torch.uint8)  # [B, N, S]
    block_d = triton.next_power_of_2(D)
    if block_m is None:
        block_m = max(16, min(64 if block_d > 64 else 128, triton.next_power_of_2(G * N)))
    if block_n is None:
        block_n = 64 if queries.dtype == torch.float32 else 128
    if num_warps is None:
        num_warps = 4 if block_m * block_d <= 64 * 64 else 8
    grid = (triton.cdiv(G * N, block_m), B * Hkv)
    _tree_attention_kernel[grid](
        queries, keys, values, mask_u8, out,
        N, S, Hkv, scale * 1.4426950408889634,
        *queries.stride(), *keys.stride(), *values.stride(), *mask_u8.stride(), *out.stride(),
        G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        F32_DOTS=queries.dtype == torch.float32 or (_interpreting() and queries.dtype == torch.bfloat16),
        num_warps=num_warps,
    )
    return out
