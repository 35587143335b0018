"""Statistics: engine counters (SpecStats) and the distribution tests the course relies on."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

__all__ = [
    "SpecStats", "tv_distance", "empirical_law", "chi_square_test", "chi2_sf", "chi2_isf", "noncentral_chi2_sf",
    "chi_square_power", "noncentrality", "min_noncentrality",
]


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

    def record(self, num_accepted, emitted, active, k_step: int | None = None) -> None:
        """Add one step: per row ``num_accepted``, tokens ``emitted`` (after EOS / length cuts)
        and whether the row was ``active``; host lists, or tensors (one transfer for all three).
        ``k_step`` is the number of drafts proposed per row in this step (default ``k``)."""
        if isinstance(num_accepted, torch.Tensor):
            stacked = torch.stack([num_accepted.long(), emitted.long(), active.long()]).cpu()  # [3, B]
            num_accepted, emitted, active = stacked.tolist()
        k_step = self.k if k_step is None else k_step
        for n, e, a in zip(num_accepted, emitted, active):
            if not a:
                continue
            if n >= len(self.accept_hist):  # a drafter may propose more than k (hybrid.HybridDrafter's lookup)
                self.accept_hist.extend([0] * (n + 1 - len(self.accept_hist)))
            self.accept_hist[n] += 1
            self.accepted += n
            self.proposed += k_step
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

    Outcomes whose expected count is below ``min_expected`` are pooled into one cell (merged
    into the smallest other cell if the pool is still below ``min_expected``).  An observed
    outcome the law gives probability 0 makes the statistic infinite (p-value 0).
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
        if pooled_exp < min_expected and cells:  # still too small: merge it into the smallest cell
            j = min(range(len(cells)), key=lambda i: cells[i][1])
            cells[j] = (cells[j][0] + pooled_obs, cells[j][1] + pooled_exp)
        else:
            cells.append((pooled_obs, pooled_exp))
    if len(cells) < 2:
        raise ValueError("fewer than two cells with enough expected counts; draw more samples")
    stat = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return stat, dof, chi2_sf(stat, dof)


def chi2_isf(level: float, dof: int) -> float:
    """Critical value x with P(chi2_dof >= x) = level (bisection on :func:`chi2_sf`)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    lo, hi = 0.0, float(dof) + 10.0
    while chi2_sf(hi, dof) > level:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if chi2_sf(mid, dof) > level else (lo, mid)
    return hi


def noncentral_chi2_sf(x: float, dof: int, noncentrality: float) -> float:
    """P(X >= x) for a non-central chi-square: a Poisson(lambda/2) mixture of central ones."""
    if noncentrality < 0:
        raise ValueError(f"noncentrality must be >= 0, got {noncentrality!r}")
    half = noncentrality / 2.0
    centre = int(half)
    total, weight_sum = 0.0, 0.0
    for j in range(max(0, centre - 60 - int(10 * half**0.5)), centre + 60 + int(10 * half**0.5)):
        w = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half > 0 else float(j == 0)
        total += w * chi2_sf(x, dof + 2 * j)
        weight_sum += w
    return min(1.0, total / weight_sum) if weight_sum else 0.0


def chi_square_power(n: int, dof: int, noncentrality: float, level: float = 1e-3) -> float:
    """Power of the Pearson test (reject when p-value < ``level``) against an alternative with
    ``noncentrality`` lambda = n * sum_cells (r - p)^2 / p (large-sample approximation)."""
    return noncentral_chi2_sf(chi2_isf(level, dof), dof, noncentrality)


def noncentrality(expected_law: Mapping, alt_law: Mapping, n: int) -> float:
    """lambda = n * sum (r - p)^2 / p over the outcomes of ``expected_law`` (p) with p > 0."""
    return n * sum((float(alt_law.get(k, 0)) - float(pk)) ** 2 / float(pk) for k, pk in expected_law.items() if float(pk) > 0)


def min_noncentrality(n: int, tv: float) -> float:
    """The smallest lambda of ANY alternative at total variation ``tv`` from the null:
    by Cauchy-Schwarz (sum |d|)^2 <= (sum d^2 / p)(sum p), so sum d^2 / p >= (2 tv)^2 and
    lambda >= 4 n tv^2.  Power against lambda_min is a guaranteed floor for that TV."""
    return 4.0 * n * tv * tv
