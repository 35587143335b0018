"""KV compaction after acceptance: move the accepted path's cache entries to contiguous slots.

Reference (and the library's compaction function): :func:`specdec_lesson.kernels.reference.compact_kv`.
After tree verification the accepted tokens sit at scattered slots ``src_index[b, :n_valid[b]]``
of the cache (prefix + tree node index); the next step needs them at ``dst_start[b] + i``.

Design: one program per ``(row, head)``; it gathers all (at most ``BLOCK_N``) accepted entries of
its head slice, for keys then values, into registers, waits at a block barrier, then writes them
to their destinations.  Reading everything before writing anything makes overlapping sources
and destinations safe (the same "gather first" semantics as the reference), and programs touch
disjoint ``(row, head)`` slices, so no two programs race.  Rows beyond ``n_valid`` are masked
off: nothing is read or written for them.  One launch handles the whole batch, both tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_lesson.kernels.reference import check_compact_kv_args, compact_kv

__all__ = ["compact_kv_triton", "compact_kv"]

MAX_N = 1024  # accepted entries per row handled by one program (a path is a few tokens long)


@triton.jit
def _move_rows(base, src, dst, ok, d, d_ok, s_s, s_d):
    rows_ok = ok[:, None] & d_ok[None, :]
    x = tl.load(base + src[:, None] * s_s + d[None, :] * s_d, mask=rows_ok)  # [BLOCK_N, BLOCK_D]
    tl.debug_barrier()  # every read of this head slice happens before any write
    tl.store(base + dst[:, None] * s_s + d[None, :] * s_d, x, mask=rows_ok)


@triton.jit
def _compact_kv_kernel(
    k_ptr, v_ptr, src_ptr, dst_start_ptr, n_valid_ptr,
    H,
    skb, skh, sks, skd, svb, svh, svs, svd, s_src_b, s_src_n,
    D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    n_valid = tl.load(n_valid_ptr + b)
    dst_start = tl.load(dst_start_ptr + b)
    i = tl.arange(0, BLOCK_N)
    ok = i < n_valid  # [BLOCK_N]
    src = tl.load(src_ptr + b * s_src_b + i * s_src_n, mask=ok, other=0)  # [BLOCK_N] slots to read
    dst = dst_start + i  # [BLOCK_N] slots to write
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    _move_rows(k_ptr + b * skb + h * skh, src, dst, ok, d, d_ok, sks, skd)
    _move_rows(v_ptr + b * svb + h * svh, src, dst, ok, d, d_ok, svs, svd)


def compact_kv_triton(
    keys: torch.Tensor,
    values: torch.Tensor,
    src_index: torch.Tensor,
    dst_start: torch.Tensor,
    n_valid: torch.Tensor,
    *,
    validate: bool = True,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`specdec_lesson.kernels.reference.compact_kv`: same arguments
    (``keys/values [B, H, S, D]`` modified in place, ``src_index [B, N]``, ``dst_start [B]``,
    ``n_valid [B]``, all int64), same result exactly (it copies bits).  ``validate=False`` skips
    the index-range checks (one host sync); out-of-range indices are then undefined behaviour."""
    if validate:
        check_compact_kv_args(keys, values, src_index, dst_start, n_valid)
    B, H, _, D = keys.shape
    N = src_index.shape[1]
    if N > MAX_N:
        raise ValueError(f"compact_kv_triton moves at most {MAX_N} entries per row, got N={N}")
    if B == 0 or N == 0:
        return keys, values
    _compact_kv_kernel[(B, H)](
        keys, values, src_index, dst_start.contiguous(), n_valid.contiguous(),
        H, *keys.stride(), *values.stride(), *src_index.stride(),
        D=D, BLOCK_N=triton.next_power_of_2(N), BLOCK_D=triton.next_power_of_2(D), num_warps=num_warps,
    )
    return keys, values
