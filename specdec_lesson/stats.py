"""Statistics: engine counters (SpecStats) and the distribution tests the course relies on."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

__all__ = ["SpecStats", "tv_distance", "empirical_law", "chi_square_test", "chi2_sf"]


@dataclass
class SpecStats:
    """Counters of one generation call.

    accept_hist[n] counts (row, step) pairs in which exactly n of the K drafts were accepted.
    alpha = accepted drafts / proposed drafts; tau = tokens emitted per row per target forward.
    Times are wall-clock seconds (the engine synchronises CUDA before reading the clock).
    """

    k: int = 0
    accept_hist: list[int] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    row_steps: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_prefill: float = 0.0

    def __post_init__(self) -> None:
        if not self.accept_hist:
            self.accept_hist = [0] * (self.k + 1)

    @property
    def alpha(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tau(self) -> float:
        return self.emitted / self.row_steps if self.row_steps else float("nan")

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_draft + self.time_verify + self.time_other

    def record(self, num_accepted: torch.Tensor, emitted: torch.Tensor, active: torch.Tensor) -> None:
        """Add one step: ``num_accepted [B]``, tokens ``emitted [B]`` (after EOS / length cuts),
        ``active [B]`` rows that took part.  One host transfer for all three."""
        stacked = torch.stack([num_accepted.long(), emitted.long(), active.long()]).cpu()  # [3, B]
        for n, e, a in zip(*stacked.tolist()):
            if not a:
                continue
            self.accept_hist[n] += 1
            self.accepted += n
            self.proposed += self.k
            self.emitted += e
            self.row_steps += 1

    def summary(self) -> dict:
        return {
            "k": self.k, "alpha": self.alpha, "tau": self.tau, "accept_hist": list(self.accept_hist),
            "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
            "emitted": self.emitted, "time_prefill": self.time_prefill, "time_draft": self.time_draft,
            "time_verify": self.time_verify, "time_other": self.time_other, "time_total": self.time_total,
        }


def tv_distance(p: Mapping | torch.Tensor | Iterable, q: Mapping | torch.Tensor | Iterable) -> float:
    """Total variation distance 0.5 * sum |p - q| between two laws (dicts or vectors)."""
    if isinstance(p, Mapping) or isinstance(q, Mapping):
        p, q = dict(p), dict(q)
        keys = set(p) | set(q)
        return 0.5 * sum(abs(float(p.get(k, 0)) - float(q.get(k, 0))) for k in keys)
    pt, qt = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    if pt.shape != qt.shape:
        raise ValueError(f"laws differ in shape: {tuple(pt.shape)} vs {tuple(qt.shape)}")
    return 0.5 * float((pt - qt).abs().sum())


def empirical_law(samples: Iterable) -> dict:
    """Relative frequencies of hashable outcomes (e.g. tuples of the first n tokens)."""
    counts = Counter(samples)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    return {k: v / n for k, v in counts.items()}


def chi2_sf(x: float, dof: int) -> float:
    """Upper tail P(X >= x) of a chi-square with ``dof`` degrees of freedom (regularized gamma)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    if z < a + 1:  # series for the lower incomplete gamma
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction (Lentz) for the upper incomplete gamma
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, h * math.exp(-z + a * math.log(z) - math.lgamma(a)))


def chi_square_test(counts: Mapping, expected_law: Mapping, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson chi-square goodness of fit of observed ``counts`` to ``expected_law``.

    Outcomes whose expected count is below ``min_expected`` are pooled into one cell, as are
    observed outcomes the law gives probability 0 (any such count makes the statistic infinite).
    Returns ``(statistic, degrees_of_freedom, p_value)``.
    """
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    total_p = sum(float(v) for v in expected_law.values())
    if abs(total_p - 1.0) > 1e-6:
        raise ValueError(f"expected_law must sum to 1, sums to {total_p}")
    impossible = sum(c for k, c in counts.items() if float(expected_law.get(k, 0)) == 0)
    if impossible:
        return math.inf, 1, 0.0
    cells, pooled_obs, pooled_exp = [], 0.0, 0.0
    for k, pk in expected_law.items():
        e = n * float(pk)
        if e == 0:
            continue
        o = counts.get(k, 0)
        if e < min_expected:
            pooled_obs += o
            pooled_exp += e
        else:
            cells.append((o, e))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    if len(cells) < 2:
        raise ValueError("fewer than two cells with enough expected counts; draw more samples")
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return stat, dof, chi2_sf(stat, dof)
