"""Exercises of notebook 05 (Triton kernels): the fused verification kernel's two steps written by hand, and a
bug planted in a kernel for the bit-exact test to catch.  Ground truth: the torch references the library's kernels
are tested against, :func:`specdec_lesson.verify.verify_chain_from_randoms` and
:func:`specdec_lesson.verify.race_sample`.  The Triton exercises run anywhere triton imports: natively on a GPU,
and under ``TRITON_INTERPRET=1`` on a CPU (``specdec_lesson.notebook.setup`` sets it before triton is imported)."""

from __future__ import annotations

import torch

from ..verify import race_sample, verify_chain_from_randoms
from ._core import Exercise, call, fail, passed, solve

__all__ = ["check_leading_accepts", "check_accept_kernel", "check_bug_is_caught", "check_chunked_race", "EXERCISES"]


def _rounding_rows(g: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 (p, q, u) with u one ulp below fl(p / q) where u < p / q but not u q < p (about 1 candidate in 9)."""
    q = torch.rand(20 * count, generator=g) * 0.5 + 0.25  # [M]
    p = torch.rand(20 * count, generator=g) * q  # [M]
    u = torch.nextafter(p / q, torch.zeros_like(q))  # [M]
    differ = ((u * q < p) != (u < p / q)).nonzero().flatten()[:count]
    assert len(differ) == count, "too few rounding cases: draw more candidates"
    return p[differ], q[differ], u[differ]


def _accept_cases(device: str = "cpu") -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(name, uniforms [B, K], p_x [B, K], q_x [B, K], reference n [B]) in fp32: random rows, then the edge cases a
    kernel gets wrong: u = 0 with p(x) = 0 (reject), u q = p exactly (reject), q(x) = 0 < p(x) (accept), and u just
    below p / q where u q rounds to p (reject: the reference multiplies, never divides)."""
    g = torch.Generator().manual_seed(51)
    out = []
    for K, V in ((1, 7), (3, 50), (5, 20), (8, 9)):
        B = 64
        tp = torch.softmax(2 * torch.randn(B, K + 1, V, generator=g), -1)  # [B, K+1, V]
        dp = torch.softmax(torch.log(tp[:, :K]) + torch.randn(B, K, V, generator=g), -1)  # [B, K, V]
        tok = torch.multinomial(dp.reshape(-1, V), 1, generator=g).view(B, K)  # [B, K]
        u = torch.rand(B, K, generator=g)  # [B, K]
        tp[:8, :, 0], dp[:8, :, 0], tok[:8], u[:8] = 0.0, 0.3, 0, 0.0  # p(x) = 0, u = 0: 0 < 0 is false
        tp[8:16, :, 1], dp[8:16, :, 1], tok[8:16], u[8:16] = 0.25, 0.5, 1, 0.5  # u q == p exactly: reject
        tp[16:24, :, 2], dp[16:24, :, 2], tok[16:24] = 0.25, 0.0, 2  # q(x) = 0 < p(x): accept
        p3, q3, u3 = _rounding_rows(g, 8)  # u < p / q holds, u q < p does not: dividing rounds differently
        tp[24:32, :, 3], dp[24:32, :, 3], tok[24:32], u[24:32] = p3[:, None], q3[:, None], 3, u3[:, None]
        e = torch.ones(B, V)  # [B, V] unused by the count
        n = verify_chain_from_randoms(tp, dp, tok, u, e)[0]  # [B] the reference
        idx = tok.unsqueeze(-1)  # [B, K, 1]
        p_x, q_x = tp[:, :K].gather(-1, idx).squeeze(-1), dp.gather(-1, idx).squeeze(-1)  # [B, K] each
        out.append((f"K = {K}", u.to(device), p_x.to(device), q_x.to(device), n.to(device)))
    return out


def _accept_mismatch(ex: str, fn, device: str = "cpu") -> str | None:
    """None when ``fn`` equals the reference on every case, else a description of the first difference."""
    for name, u, p_x, q_x, n in _accept_cases(device):
        got = call(ex, fn, u.clone(), p_x.clone(), q_x.clone(), what=f"your function on the {name} case")
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(n.shape):
            return f"{name}: expected a [{n.shape[0]}] tensor of counts, got shape {tuple(got.shape)}"
        bad = (got.long().cpu() != n.cpu()).nonzero().flatten().tolist()
        if bad:
            b = bad[0]
            edge = ("u = 0 and p(x) = 0: 0 < 0 is false, the draft is rejected" if b < 8 else
                    "u q(x) == p(x) exactly: the test is strict, the draft is rejected" if b < 16 else
                    "q(x) = 0 < p(x): u q(x) < p(x) holds, the draft is accepted" if b < 24 else
                    "u q(x) rounds to p(x) although u < p(x) / q(x) in floats: test u q < p, never divide" if b < 32
                    else "a random row")
            return (f"{name}, row {b} ({edge}): expected n = {int(n[b])}, got {int(got[b])}; u = {u[b].tolist()}, "
                    f"p(x) = {p_x[b].tolist()}, q(x) = {q_x[b].tolist()}")
    return None


def check_leading_accepts(fn) -> None:
    """``fn(uniforms [B, K], p_x [B, K], q_x [B, K])`` -> ``[B]`` int: the number of leading drafts with
    ``u * q(x) < p(x)`` (the kernel's step 1), equal to the reference's ``num_accepted`` on 256 fp32 rows
    (K = 1, 3, 5, 8) with the edge cases u = 0 & p = 0, u q == p, q = 0 < p and u q rounding to p."""
    ex = "5.1"
    bad = _accept_mismatch(ex, fn)
    if bad:
        fail(ex, bad)
    passed(ex, "your accept count equals the reference on 256 rows, edge cases included: no division, a strict test, "
               "stop at the first rejection.")


def check_accept_kernel(fn) -> None:
    """``fn(uniforms, p_x, q_x)`` launching YOUR Triton kernel; the same bit-exact comparison as
    :func:`check_leading_accepts`, on CUDA tensors when a GPU is present (else on CPU, interpreted)."""
    ex = "5.2"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bad = _accept_mismatch(ex, fn, device)
    if bad:
        fail(ex, f"your kernel differs from the reference: {bad}")
    passed(ex, f"your Triton kernel ({'on the GPU' if device == 'cuda' else 'interpreted on the CPU'}) equals the "
               "reference on all 256 rows.")


def _agreement(ex: str, fn, device: str) -> tuple[float, float]:
    """Fractions of all rows, and of rows with n > 0, on which ``fn`` equals the reference."""
    same = total = same_pos = total_pos = 0
    for name, u, p_x, q_x, n in _accept_cases(device):
        got = torch.as_tensor(call(ex, fn, u.clone(), p_x.clone(), q_x.clone(), what=f"your function on the {name} case"))
        if tuple(got.shape) != tuple(n.shape):
            fail(ex, f"{name}: expected a [{n.shape[0]}] tensor of counts, got shape {tuple(got.shape)}")
        ok, pos = got.long().cpu() == n.cpu(), n.cpu() > 0
        same, total = same + int(ok.sum()), total + len(n)
        same_pos, total_pos = same_pos + int(ok[pos].sum()), total_pos + int(pos.sum())
    return same / total, same_pos / max(1, total_pos)


def check_bug_is_caught(fn) -> None:
    """``fn``: a copy of your accept-count kernel (or function) with ONE planted bug.  Passes when the bit-exact
    comparison of :func:`check_accept_kernel` catches it, and says on which row; fails when your variant still
    agrees with the reference everywhere (the bug is one this test cannot see, or not a bug), when it crashes, or
    when it is broken wholesale (it must still agree on at least 60% of the rows and half of those that accept
    something: a stub that returns zeros is not a planted bug)."""
    ex = "5.3"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bad = _accept_mismatch(ex, fn, device)
    if bad is None:
        fail(ex, "your variant agrees with the reference on every row: this change is invisible to the test (or "
                 "not a bug). Try `<=` for `<`, a sum of all accepted flags instead of the leading run, or p / q.")
    agree, agree_pos = _agreement(ex, fn, device)
    if agree < 0.6 or agree_pos < 0.5:
        fail(ex, f"your variant agrees with the reference on only {100 * agree:.0f}% of the rows ({100 * agree_pos:.0f}% "
                 "of those that accept a draft): that is a broken kernel, not a planted bug. Start from your working "
                 "kernel and change ONE thing.")
    passed(ex, f"the bit-exact test caught it (your variant still agrees on {100 * agree:.0f}% of the rows): {bad}")


def _race_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """(name, weights [B, V], exponentials [B, V], block): random rows, zeros, and ratios tied within a block and
    across a block boundary (the lowest index must win, as torch.argmax)."""
    g = torch.Generator().manual_seed(54)
    out = []
    for V, block in ((64, 16), (100, 32), (37, 8), (5, 8)):
        w = torch.rand(32, V, generator=g)  # [B, V]
        w[:, ::3] = 0.0  # zero weights (a residual is often sparse)
        e = torch.empty(32, V).exponential_(generator=g).clamp_(min=torch.finfo(torch.float32).tiny)  # [B, V]
        top = (w / e).amax(-1)  # [B]
        for b, (i, j) in enumerate(((0, 1), (block - 1, block), (1, V - 1), (V // 2, V - 1))):  # ties
            if j < V:
                w[b, i], e[b, i], w[b, j], e[b, j] = 1.0, float(1 / (2 * top[b])), 1.0, float(1 / (2 * top[b]))
        out.append((f"V = {V}, block {block}", w, e, block))
    return out


def check_chunked_race(fn) -> None:
    """``fn(weights [B, V], exponentials [B, V], block)`` -> ``[B]`` argmax of weights / exponentials computed one
    block of the vocabulary at a time (as the kernel's single pass does); bit-exact against ``race_sample`` (torch's
    argmax) on 128 fp32 rows, with ties inside a block and across a block boundary."""
    ex = "5.4"
    for name, w, e, block in _race_cases():
        want = race_sample(w, e)  # [B]
        got = torch.as_tensor(call(ex, fn, w.clone(), e.clone(), block, what=f"chunked_race on {name}"))
        bad = (got.long() != want).nonzero().flatten().tolist()
        if tuple(got.shape) != tuple(want.shape) or bad:
            b = bad[0] if bad else 0
            tie = " (a tie: the lowest index wins, so a later block replaces the best only if strictly greater)" \
                if b < 4 and got.shape == want.shape else ""
            fail(ex, f"{name}, row {b}: expected token {int(want[b])}, got {got.tolist()[b] if got.dim() else got}{tie}")
    passed(ex, "one pass over the vocabulary in blocks, with a running maximum, picks exactly torch's token, ties "
               "included.")


_P51 = """The fused kernel's first step decides, per row, how many leading drafts pass `u * q(x) < p(x)`: no division
(q(x) may be 0), a strict test, and the count stops at the first rejection. Write it in torch,
`leading_accepts(uniforms, p_x, q_x)` for `[B, K]` fp32 tensors -> `[B]`, the way the kernel does it: the index of
the first rejection (K if there is none). The check compares with the reference bit for bit, edge cases included."""

_S51 = '''import torch

from specdec_lesson.exercises import check_leading_accepts


def leading_accepts(uniforms, p_x, q_x):
    """[B] number of leading drafts with u * q(x) < p(x)."""
    raise NotImplementedError


check_leading_accepts(leading_accepts)
'''

_A51 = solve(_S51, '''
    B, K = uniforms.shape
    rejected = ~(uniforms * q_x < p_x)                                   # [B, K]
    ks = torch.arange(K).expand(B, K)                                    # [B, K]
    return torch.where(rejected, ks, torch.full_like(ks, K)).amin(-1)   # first rejection, K if none
''')

_P52 = """Now the same step as a Triton kernel, one program per row: load the row's K values with a mask (K need not
be a power of two), test, and store the index of the first rejection. The launcher is given. On a CPU the kernel
runs in Triton's interpreter (slow, but the same program)."""

_S52 = '''import torch

import specdec_lesson.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on a machine without CUDA, before triton loads)
import triton
import triton.language as tl

from specdec_lesson.exercises import check_accept_kernel


@triton.jit
def accept_count_kernel(u_ptr, p_ptr, q_ptr, out_ptr, K, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    # your code: load u, p, q of row b (mask ks < K), test, store the first rejection (K if none)
    tl.store(out_ptr + b, tl.zeros((), tl.int64))


def accept_count(uniforms, p_x, q_x):
    B, K = uniforms.shape
    out = torch.empty(B, dtype=torch.int64, device=uniforms.device)
    accept_count_kernel[(B,)](uniforms.contiguous(), p_x.contiguous(), q_x.contiguous(), out, K,
                              BLOCK_K=triton.next_power_of_2(K))
    return out


check_accept_kernel(accept_count)
'''

_KERNEL_BODY = '''    ok = ks < K
    u = tl.load(u_ptr + b * K + ks, mask=ok, other=0.0)
    p = tl.load(p_ptr + b * K + ks, mask=ok, other=0.0)
    q = tl.load(q_ptr + b * K + ks, mask=ok, other=0.0)
    accepted = u * q < p
    n = tl.min(tl.where(ok & (accepted == 0), ks, K), axis=0)   # first rejection, K if none
    tl.store(out_ptr + b, n.to(tl.int64))
'''

_PLACEHOLDER = '''    # your code: load u, p, q of row b (mask ks < K), test, store the first rejection (K if none)
    tl.store(out_ptr + b, tl.zeros((), tl.int64))
'''
_A52 = solve(_S52, _KERNEL_BODY, _PLACEHOLDER)

_P53 = """Break it on purpose: copy your kernel, change ONE thing (`<=` for `<`, summing every passing test instead of
stopping at the first rejection, dividing p by q, ...) and hand the copy to the bit-exact test. The check passes when
the test catches your bug and shows the row; it fails if your change slipped through. Predict first: which edge case
will catch yours?"""

_S53 = '''import torch

import specdec_lesson.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on a machine without CUDA, before triton loads)
import triton
import triton.language as tl

from specdec_lesson.exercises import check_bug_is_caught


@triton.jit
def buggy_kernel(u_ptr, p_ptr, q_ptr, out_ptr, K, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    # your kernel from the exercise above, with ONE planted bug
    tl.store(out_ptr + b, tl.zeros((), tl.int64))


def buggy_count(uniforms, p_x, q_x):
    B, K = uniforms.shape
    out = torch.empty(B, dtype=torch.int64, device=uniforms.device)
    buggy_kernel[(B,)](uniforms.contiguous(), p_x.contiguous(), q_x.contiguous(), out, K,
                       BLOCK_K=triton.next_power_of_2(K))
    return out


check_bug_is_caught(buggy_count)
'''

_BUG = "    accepted = u * q <= p                                       # the planted bug\n"
_A53 = solve(_S53, _KERNEL_BODY.replace("    accepted = u * q < p\n", _BUG),
             "    # your kernel from the exercise above, with ONE planted bug\n"
             "    tl.store(out_ptr + b, tl.zeros((), tl.int64))\n")

_P54 = """The kernel's second step draws the next token by an exponential race, `argmax(w / E)`, in ONE pass over the
vocabulary, `block` entries at a time, keeping a running best. Write `chunked_race(weights, exponentials, block)`
for `[B, V]` fp32 tensors -> `[B]` that way (a python loop over blocks, torch inside a block). It must pick exactly
torch's token, ties included: the lowest index wins."""

_S54 = '''import torch

from specdec_lesson.exercises import check_chunked_race


def chunked_race(weights, exponentials, block):
    """[B] argmax of weights / exponentials, one block of the vocabulary at a time."""
    raise NotImplementedError


check_chunked_race(chunked_race)
'''

_A54 = solve(_S54, '''
    B, V = weights.shape
    best = torch.full((B,), -1.0)                       # every ratio is >= 0
    idx = torch.zeros(B, dtype=torch.long)
    for start in range(0, V, block):
        s = weights[:, start:start + block] / exponentials[:, start:start + block]   # [B, <= block]
        i = s.argmax(-1)                                # ties inside a block: the first
        v = s.gather(-1, i[:, None])[:, 0]
        better = v > best                               # strict: an equal later value keeps the lower index
        idx = torch.where(better, start + i, idx)
        best = torch.where(better, v, best)
    return idx
''')

EXERCISES = [
    Exercise("5.1", "the accept count, as the kernel computes it", check_leading_accepts, _P51, _S51, _A51),
    Exercise("5.2", "the accept count as a Triton kernel", check_accept_kernel, _P52, _S52, _A52),
    Exercise("5.3", "plant a kernel bug, watch the bit-exact test catch it", check_bug_is_caught, _P53, _S53, _A53),
    Exercise("5.4", "the exponential race in one blocked pass", check_chunked_race, _P54, _S54, _A54),
]
