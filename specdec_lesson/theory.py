"""Closed forms of speculative decoding (Leviathan et al. 2023, section 3).

alpha: the expected acceptance rate E[beta], beta = sum_x min(p(x), q(x)) = 1 - TV(p, q).
c: the cost of one draft forward relative to one target forward.
"""

from __future__ import annotations

import math

__all__ = ["acceptance_rate", "expected_tokens", "speedup", "best_k", "speedup_bound"]


def _check_alpha(alpha: float) -> None:
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def acceptance_rate(target_probs, draft_probs) -> float:
    """beta = sum_x min(p(x), q(x)) for two laws given as sequences or 1-D tensors."""
    p = [float(v) for v in target_probs]
    q = [float(v) for v in draft_probs]
    if len(p) != len(q):
        raise ValueError(f"target_probs and draft_probs differ in length: {len(p)} vs {len(q)}")
    return sum(min(a, b) for a, b in zip(p, q))


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target forward] = (1 - alpha^(K+1)) / (1 - alpha)  (K+1 when alpha = 1)."""
    _check_alpha(alpha)
    _check_k(k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """Walltime speedup S(K) = E[tokens] / (K c + verify_ratio).

    ``verify_ratio`` = T_verify(K+1) / T_target(1); the paper's idealisation is 1.
    """
    if c < 0 or verify_ratio <= 0:
        raise ValueError(f"c must be >= 0 and verify_ratio > 0, got c={c!r}, verify_ratio={verify_ratio!r}")
    return expected_tokens(alpha, k) / (k * c + verify_ratio)


def best_k(alpha: float, c: float, k_max: int = 64, verify_ratio=None) -> int:
    """The integer K in 1..k_max with the largest S(K).

    ``verify_ratio`` may be a callable ``n -> T(n)/T(1)`` (n = K+1 verified positions)."""
    _check_k(k_max)

    def ratio(k: int) -> float:
        if verify_ratio is None:
            return 1.0
        return verify_ratio(k + 1) if callable(verify_ratio) else float(verify_ratio)

    return max(range(1, k_max + 1), key=lambda k: (speedup(alpha, k, c, ratio(k)), -k))


def speedup_bound(alpha: float, c: float) -> float:
    """When alpha > c, K = 1 already gives (1 + alpha) / (1 + c) > 1, so the best K does at least that."""
    _check_alpha(alpha)
    if not alpha > c:
        raise ValueError(f"the bound (1 + alpha)/(1 + c) holds for alpha > c; got alpha={alpha}, c={c}")
    return (1.0 + alpha) / (1.0 + c)
