"""How many bytes one chain verification moves: the torch reference against the fused kernel.

Verification is bandwidth bound (a few comparisons per byte), so its cost on a GPU is about
bytes moved / bandwidth.  This module counts the bytes of each path from the shapes alone, pass
by pass, so that notebook 05 can plot them and ``benchmarks/gpu_verify.py`` can set measured
times beside them.  Counted: every full ``[B, V]`` or ``[B, K, V]`` tensor that is read or written
(the ``[B, K]`` scalars are negligible and left out).  Not counted: caches (an L2 of 50-60 MB
holds a whole ``[64, 128k]`` fp32 row block only partly, so real traffic lies between the count
and the count of the passes that miss).

For fp16 / bf16 laws both paths first run :func:`specdec_lesson.verify.chain.as_verify_law`
in torch: upcast to fp32 (read 2 bytes, write 4 per element) and renormalise (read 4 for the row
sums, read 4 and write 4 for the division), over all ``B (2K+1) V`` elements of both laws.  The
fused kernel's own traffic is only the rows it needs, so at half precision the upcast, not the
kernel, sets the cost (the ratio is printed by :func:`upcast_share`).
"""

from __future__ import annotations

from dataclasses import dataclass

HALF_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class VerifyBytes:
    """Bytes of one verification step of ``B`` rows, ``K`` drafts, vocabulary ``V``."""

    prepare: int  # upcast + renormalise of fp16 / bf16 laws (0 for fp32 laws): shared by both paths
    reference: int  # the torch reference after preparation
    fused: int  # the fused kernel after preparation

    @property
    def reference_total(self) -> int:
        return self.prepare + self.reference

    @property
    def fused_total(self) -> int:
        return self.prepare + self.fused


def prepare_bytes(B: int, K: int, V: int, half: bool) -> int:
    """Upcast and renormalisation of both laws (``B (K+1) V`` target and ``B K V`` draft elements)."""
    if not half:
        return 0
    elements = B * (2 * K + 1) * V
    per_element = HALF_BYTES + FP32_BYTES + FP32_BYTES + FP32_BYTES + FP32_BYTES  # read, write, sum read, div read+write
    return elements * per_element


def reference_bytes(B: int, V: int) -> int:
    """The torch reference's full-row passes over ``[B, V]`` fp32 tensors (see
    :func:`specdec_lesson.verify.chain.verify_chain_from_randoms`), counted as reads + writes:

    p_row and q_row gathered (2 reads, 2 writes); the bonus ``where`` on q_row (1 read, 1 write);
    the residual ``clamp(p - q)`` (2 reads, 1 write, the subtraction's temporary: 1 write, 1 read);
    the empty-residual ``any`` (1 read, 1 bool write counted as a quarter);  the fallback ``where``
    (2 reads, 1 write); the race ``weights / E`` (2 reads, 1 write) and its ``argmax`` (1 read).
    """
    passes = (2 + 2) + (1 + 1) + (2 + 1 + 1 + 1) + (1 + 0.25) + (2 + 1) + (2 + 1) + 1
    return int(passes * B * V * FP32_BYTES)


def fused_bytes(B: int, V: int, rows_with_q: int | None = None) -> int:
    """The fused kernel reads, per row, the target law at the first rejection, the exponentials,
    and the draft law there unless all K drafts passed (``rows_with_q``, default all B rows)."""
    rows_with_q = B if rows_with_q is None else rows_with_q
    return (2 * B + rows_with_q) * V * FP32_BYTES


def verify_bytes(B: int, K: int, V: int, half: bool, rows_with_q: int | None = None) -> VerifyBytes:
    if min(B, K, V) < 1:
        raise ValueError(f"B, K and V must be >= 1, got B={B}, K={K}, V={V}")
    return VerifyBytes(prepare_bytes(B, K, V, half), reference_bytes(B, V), fused_bytes(B, V, rows_with_q))


def upcast_share(B: int, K: int, V: int) -> float:
    """At half precision, the fraction of the fused path's bytes that the torch upcast moves."""
    b = verify_bytes(B, K, V, half=True)
    return b.prepare / b.fused_total


def grid(Bs=(1, 16, 64), Vs=(32_000, 128_256), K: int = 8) -> list[dict]:
    """The table notebook 05 plots: one row per (B, V, precision of the laws)."""
    rows = []
    for B in Bs:
        for V in Vs:
            for half in (False, True):
                b = verify_bytes(B, K, V, half)
                rows.append(dict(B=B, K=K, V=V, laws="bf16" if half else "fp32", prepare_mb=b.prepare / 1e6,
                                 reference_mb=b.reference_total / 1e6, fused_mb=b.fused_total / 1e6,
                                 fused_kernel_mb=b.fused / 1e6, ratio=b.reference_total / b.fused_total))
    return rows
