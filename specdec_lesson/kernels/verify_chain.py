"""Fused chain verification: accept tests, residual and bonus draw in ONE kernel launch.

Reference (the library function, not a copy): :func:`specdec_lesson.verify.verify_chain_from_randoms`.
Given the same random numbers (``uniforms [B, K]``, ``exponentials [B, V]`` from
:func:`specdec_lesson.verify.draw_verify_randoms`), the kernel returns the same
``(num_accepted [B], next_token [B])`` bit for bit, hence the same law.

Design (one program per row, bandwidth-bound single pass):

1. The K accept tests ``u_i * q_i(x_i) < p_i(x_i)`` as one vector (one gather round trip);
   ``n`` = index of the first rejection (K if none) = length of the accepted prefix.
2. One pass over the vocabulary in ``BLOCK_V`` chunks reading only the three rows that matter:
   ``p_n`` (target law at the first rejection, or the bonus law ``p_K``), ``q_n`` (not even
   loaded when ``n == K``: the bonus uses q = 0) and the row's exponentials.  In the same pass it
   keeps two running exponential-race maxima, of ``max(0, p - q) / E`` and of ``p / E``, and
   whether any residual entry is > 0.  The all-zero guard then picks the second race without a
   second pass.  Ties resolve to the lowest index (``tl.argmax`` ties left inside a chunk,
   strict ``>`` across chunks), like ``torch.argmax``.  The chunk loop is software-pipelined
   (``num_stages``: the next chunks' loads are in flight, through shared memory, while this one
   is computed), which matters because B programs may not cover every SM and each must keep
   enough bytes in flight on its own.
3. Optional ``splits``: B * splits programs, each racing over one slice of the vocabulary; the
   last program of a row to arrive combines the slices' winners (still one launch).

The torch reference materialises several ``[B, V]`` temporaries (gathered rows, residual,
weights, ratio) and launches a dozen kernels; the fused kernel reads each needed byte once.

Bit exactness: every arithmetic step is the one torch does, in the same precision.  Division
uses ``tl.math.div_rn`` (IEEE round-to-nearest; Triton's ``/`` on fp32 is an approximate
division on NVIDIA GPUs).

Precision: the kernel computes in fp32 or fp64 only.  The wrapper passes its inputs through
:func:`specdec_lesson.verify.prepare_verify_inputs`, as the reference does: bf16 / fp16 laws are
upcast and renormalised in fp32 (one extra pass over the laws, for half-precision inputs only;
the engine hands fp32 laws), and half-precision random numbers are refused (they would bias the
accept test and tie in the race).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_lesson.verify import prepare_verify_inputs, verify_chain_from_randoms

__all__ = ["verify_chain_triton", "verify_chain_from_randoms"]

_SUPPORTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@triton.jit
def _div(a, b, IS_F64: tl.constexpr):
    if IS_F64:
        r = a / b  # fp64 division is IEEE round-to-nearest on every backend
    else:
        r = tl.math.div_rn(a, b)
    return r


@triton.jit
def _verify_chain_kernel(
    target_ptr, draft_ptr, tokens_ptr, uniforms_ptr, expo_ptr,  # inputs
    num_accepted_ptr, next_token_ptr,  # outputs [B] int64
    part_val_ptr, part_idx_ptr, part_any_ptr, counter_ptr,  # SPLITS > 1 only: per-split partials, per-row counter
    K, V, V_PER_SPLIT,
    stride_tb, stride_tk, stride_db, stride_dk, stride_xb, stride_ub, stride_eb,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr, SPLITS: tl.constexpr,
    IS_F64: tl.constexpr,
):
    CT: tl.constexpr = tl.float64 if IS_F64 else tl.float32  # compute type
    b = tl.program_id(0).to(tl.int64)
    t_row = target_ptr + b * stride_tb
    d_row = draft_ptr + b * stride_db

    # 1. accept tests, all K at once (two dependent memory round trips, not 2K):
    #    n = number of leading accepted drafts = index of the first rejection, K if none
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    k_ok = ks < K
    x = tl.load(tokens_ptr + b * stride_xb + ks, mask=k_ok, other=0).to(tl.int64)  # [BLOCK_K] drafted ids
    p_x = tl.load(t_row + ks * stride_tk + x, mask=k_ok, other=0.0).to(CT)  # [BLOCK_K] p_i(x_i)
    q_x = tl.load(d_row + ks * stride_dk + x, mask=k_ok, other=0.0).to(CT)  # [BLOCK_K] q_i(x_i)
    u = tl.load(uniforms_ptr + b * stride_ub + ks, mask=k_ok, other=0.0).to(CT)  # [BLOCK_K]
    accept = u * q_x < p_x  # u < p/q without dividing
    n = tl.min(tl.where(k_ok & (accept == 0), ks, K), axis=0)  # scalar int32

    # 2. one pass over V: residual race, plain-p race, and "any residual > 0"
    has_q = n < K  # bonus position: q treated as 0, q row never loaded
    p_base = t_row + n.to(tl.int64) * stride_tk
    q_base = d_row + tl.minimum(n, K - 1).to(tl.int64) * stride_dk
    e_base = expo_ptr + b * stride_eb
    offs = tl.arange(0, BLOCK_V)
    best_r = tl.full((), -1.0, CT)
    best_p = tl.full((), -1.0, CT)
    idx_r = tl.full((), 0, tl.int64)
    idx_p = tl.full((), 0, tl.int64)
    any_pos = tl.full((), 0, tl.int32)
    lo = tl.program_id(1) * V_PER_SPLIT  # this program's slice of the vocabulary (all of it when SPLITS == 1)
    hi = tl.minimum(lo + V_PER_SPLIT, V)
    for start in tl.range(lo, hi, BLOCK_V, num_stages=NUM_STAGES):  # software-pipelined loads
        o = start + offs  # [BLOCK_V]
        m = o < hi
        p = tl.load(p_base + o, mask=m, other=0.0).to(CT)  # [BLOCK_V]
        q = tl.load(q_base + o, mask=m & has_q, other=0.0).to(CT)  # [BLOCK_V]
        e = tl.load(e_base + o, mask=m, other=1.0).to(CT)  # [BLOCK_V]
        r = tl.maximum(p - q, 0.0)  # max(0, p - q)
        any_pos = tl.maximum(any_pos, tl.max((r > 0).to(tl.int32), axis=0))
        s_r = tl.where(m, _div(r, e, IS_F64), -1.0)  # [BLOCK_V] residual race
        s_p = tl.where(m, _div(p, e, IS_F64), -1.0)  # [BLOCK_V] fallback race
        v_r, i_r = tl.max(s_r, axis=0, return_indices=True, return_indices_tie_break_left=True)
        v_p, i_p = tl.max(s_p, axis=0, return_indices=True, return_indices_tie_break_left=True)
        up_r = v_r > best_r  # strict: an equal value in a later chunk keeps the lower index
        up_p = v_p > best_p
        idx_r = tl.where(up_r, start + i_r.to(tl.int64), idx_r)
        idx_p = tl.where(up_p, start + i_p.to(tl.int64), idx_p)
        best_r = tl.maximum(best_r, v_r)
        best_p = tl.maximum(best_p, v_p)
    if SPLITS == 1:
        tl.store(num_accepted_ptr + b, n.to(tl.int64))
        tl.store(next_token_ptr + b, tl.where(any_pos > 0, idx_r, idx_p))
    else:
        # publish this slice's partial results; the last program of the row to arrive combines them
        slot = b * SPLITS + tl.program_id(1)
        tl.store(part_val_ptr + 2 * slot, best_r)
        tl.store(part_val_ptr + 2 * slot + 1, best_p)
        tl.store(part_idx_ptr + 2 * slot, idx_r)
        tl.store(part_idx_ptr + 2 * slot + 1, idx_p)
        tl.store(part_any_ptr + slot, any_pos)
        tl.debug_barrier()  # all of this program's stores precede its release below
        arrived = tl.atomic_add(counter_ptr + b, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            ss = tl.arange(0, SPLITS)
            row = 2 * (b * SPLITS + ss)  # [SPLITS]
            v_r = tl.load(part_val_ptr + row, volatile=True)  # [SPLITS] (volatile: not from a stale L1 line)
            v_p = tl.load(part_val_ptr + row + 1, volatile=True)
            i_r = tl.load(part_idx_ptr + row, volatile=True)
            i_p = tl.load(part_idx_ptr + row + 1, volatile=True)
            a = tl.load(part_any_ptr + b * SPLITS + ss, volatile=True)
            # ties between slices go to the lower slice, i.e. the lower vocabulary index
            _, j_r = tl.max(v_r, axis=0, return_indices=True, return_indices_tie_break_left=True)
            _, j_p = tl.max(v_p, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tok_r = tl.sum(tl.where(ss == j_r, i_r, 0), axis=0)
            tok_p = tl.sum(tl.where(ss == j_p, i_p, 0), axis=0)
            tl.store(num_accepted_ptr + b, n.to(tl.int64))
            tl.store(next_token_ptr + b, tl.where(tl.max(a, axis=0) > 0, tok_r, tok_p))
            tl.store(counter_ptr + b, 0)  # reset for the next launch


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _row_counters(device: torch.device, rows: int) -> torch.Tensor:
    """Per-row arrival counters for ``splits > 1``: zeroed once, reset to zero by the kernel."""
    c = _COUNTERS.get(device)
    if c is None or c.numel() < rows:
        c = torch.zeros(max(rows, 256), dtype=torch.int32, device=device)
        _COUNTERS[device] = c
    return c


def _check(target_probs, draft_probs, draft_tokens, uniforms, exponentials) -> None:
    if target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [B, K+1, V], got shape {tuple(target_probs.shape)}")
    B, K1, V = target_probs.shape
    K = K1 - 1
    expected = {
        "draft_probs": (draft_probs, (B, K, V)),
        "draft_tokens": (draft_tokens, (B, K)),
        "uniforms": (uniforms, (B, K)),
        "exponentials": (exponentials, (B, V)),
    }
    if K < 1:
        raise ValueError(f"target_probs must cover K+1 >= 2 positions, got {K1}")
    for name, (t, shape) in expected.items():
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} to match target_probs {tuple(target_probs.shape)}, got {tuple(t.shape)}"
            )
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if t.dtype not in _SUPPORTED:
            raise ValueError(f"{name} dtype must be one of {_SUPPORTED}, got {t.dtype}")
    for name, t in (("uniforms", uniforms), ("exponentials", exponentials)):
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} dtype must be fp32 or fp64 (draw them with draw_verify_randoms), got {t.dtype}")
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"draft_tokens must be an integer tensor, got dtype {draft_tokens.dtype}")
    devices = {t.device for t in (target_probs, draft_probs, draft_tokens, uniforms, exponentials)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def verify_chain_triton(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    splits: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`specdec_lesson.verify.verify_chain_from_randoms`: same arguments, same
    ``(num_accepted [B], next_token [B])`` (int64), bit for bit, in one launch of B programs.

    The laws may be fp32, fp64, fp16 or bf16 and the random numbers fp32 or fp64 (dtypes may
    differ): everything is brought to one precision by
    :func:`specdec_lesson.verify.prepare_verify_inputs`, exactly as the reference does, and the
    kernel computes in fp32 (fp64 if any input is fp64).  ``B = 0`` returns empty tensors.

    Draft tokens are trusted to lie in ``[0, V)`` (checking would cost a host sync; the engine
    produces them).  Rows are read along a unit-stride vocabulary axis (inputs are made
    contiguous in that axis if needed).  ``block_v``, ``num_warps``, ``num_stages`` are tuning
    knobs (results do not depend on them); ``num_stages > 1`` pipelines the vocabulary loop's
    loads through shared memory (``(num_stages - 1) * 3 * block_v * itemsize`` bytes).

    ``splits`` (a power of two, default 1) cuts each row's vocabulary into that many slices
    handled by separate programs (B * splits programs: fills a GPU that has more SMs than rows).
    It is still one launch: each program publishes its slice's race winners, and the last
    program of the row to arrive (an acq_rel atomic counter) combines them in slice order, so
    the result is the same bit for bit.  The per-row counters are cached per device and reset
    by the kernel itself: do not run two ``splits > 1`` calls concurrently on different streams.
    """
    _check(target_probs, draft_probs, draft_tokens, uniforms, exponentials)
    B, K1, V = target_probs.shape  # [B, K+1, V]
    if B == 0:
        empty = torch.empty(0, dtype=torch.int64, device=target_probs.device)
        return empty, empty.clone()
    target_probs, draft_probs, uniforms, exponentials = prepare_verify_inputs(target_probs, draft_probs, uniforms, exponentials)
    target_probs, draft_probs, exponentials = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (target_probs, draft_probs, exponentials)
    )
    draft_tokens, uniforms = draft_tokens.contiguous(), uniforms.contiguous()  # [B, K] each, tiny
    device = target_probs.device
    num_accepted = torch.empty(B, dtype=torch.int64, device=device)  # [B]
    next_token = torch.empty(B, dtype=torch.int64, device=device)  # [B]
    if block_v is None:
        block_v = min(4096, triton.next_power_of_2(V))
    if num_warps is None:
        num_warps = 8 if block_v >= 2048 else 4
    if num_stages is None:  # 3, fewer if the pipeline buffers would exceed 160 KiB of shared memory
        num_stages = 3
        while num_stages > 1 and (num_stages - 1) * 3 * block_v * target_probs.element_size() > 160 * 1024:
            num_stages -= 1
    if splits < 1 or splits & (splits - 1):
        raise ValueError(f"splits must be a power of two >= 1, got {splits}")
    v_per_split = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v  # slices start on block boundaries
    splits_used = triton.cdiv(V, v_per_split)  # no empty slice
    splits_used = triton.next_power_of_2(splits_used) if splits_used > 1 else 1
    while splits_used > 1 and (splits_used - 1) * v_per_split >= V:  # keep every slice non-empty
        splits_used //= 2
        v_per_split = triton.cdiv(triton.cdiv(V, splits_used), block_v) * block_v
    if splits_used > 1:
        compute = torch.float64 if target_probs.dtype == torch.float64 else torch.float32
        part_val = torch.empty(B, splits_used, 2, dtype=compute, device=device)  # [B, S, 2] race winners' values
        part_idx = torch.empty(B, splits_used, 2, dtype=torch.int64, device=device)  # [B, S, 2] their token ids
        part_any = torch.empty(B, splits_used, dtype=torch.int32, device=device)  # [B, S] any residual > 0
        counter = _row_counters(device, B)  # [>= B] int32, zero between launches
    else:
        v_per_split = V
        part_val = part_idx = part_any = counter = num_accepted  # unused placeholders
    _verify_chain_kernel[(B, splits_used)](
        target_probs, draft_probs, draft_tokens, uniforms, exponentials,
        num_accepted, next_token, part_val, part_idx, part_any, counter,
        K1 - 1, V, v_per_split,
        target_probs.stride(0), target_probs.stride(1), draft_probs.stride(0), draft_probs.stride(1),
        draft_tokens.stride(0), uniforms.stride(0), exponentials.stride(0),
        BLOCK_K=triton.next_power_of_2(K1 - 1), BLOCK_V=block_v, NUM_STAGES=num_stages, SPLITS=splits_used,
        IS_F64=target_probs.dtype == torch.float64, num_warps=num_warps,
    )
    return num_accepted, next_token
