"""Statistics: engine counters (SpecStats) and the distribution tests the course relies on."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from .validate import as_int, as_prob

__all__ = [
    "SpecStats", "tv_distance", "empirical_law", "chi_square_test", "chi2_sf", "chi2_isf", "noncentral_chi2_sf",
    "chi_square_power", "noncentrality", "min_noncentrality", "truncated_geometric", "acceptance_independence",
]


@dataclass
class SpecStats:
    """Counters of one generation call, per (row, step) pair of the rows still active.

    * ``accepted``: drafts EMITTED as accepted (a draft accepted by verification but cut by EOS or
      the token budget is not counted); ``accept_hist[n]``: pairs that emitted n accepted drafts;
    * ``rejections``: pairs whose chain ended in an emitted rejection (n < K' accepted, then the
      residual token); a pair that accepted all K' drafts, or was cut before its rejection, has none;
    * ``alpha`` = accepted / (accepted + rejections): Leviathan's per-token acceptance probability
      (the maximum-likelihood estimate under i.i.d. acceptance, each emitted draft a success, each
      emitted rejection a failure); ``utilisation`` = accepted / proposed drafts (lower: a chain stops
      at its first rejection, and the drafts after it are never used);
    * ``verify_hist[K'][n]``: raw verification outcomes (n of K' accepted, before any cut) by proposal
      length K': the sample of :func:`acceptance_independence`;
    * ``tau`` = tokens emitted per row per target forward (per verify step).

    Times are wall-clock seconds (the engine synchronises CUDA before reading the clock).
    """

    k: int = 0
    accept_hist: list[int] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0
    emitted: int = 0
    row_steps: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    verify_hist: dict[int, list[int]] = field(default_factory=dict)
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    time_prefill: float = 0.0

    def __post_init__(self) -> None:
        self.k = as_int(self.k, "SpecStats k (drafts per step)", lo=0)
        if not self.accept_hist:
            self.accept_hist = [0] * (self.k + 1)

    @property
    def alpha(self) -> float:
        """Per-token acceptance: accepted / (accepted + rejections) (nan when nothing was observed)."""
        trials = self.accepted + self.rejections
        return self.accepted / trials if trials else float("nan")

    @property
    def utilisation(self) -> float:
        """Accepted / proposed drafts (nan when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tau(self) -> float:
        return self.emitted / self.row_steps if self.row_steps else float("nan")

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_draft + self.time_verify + self.time_other

    def record(self, num_accepted, emitted, active, k_step: int | None = None, rejected=None) -> None:
        """Add one step: per row ``num_accepted`` (verification's n), tokens ``emitted`` (after EOS /
        length cuts: the first min(n, emitted) of them are accepted drafts) and whether the row was
        ``active``; host lists, or tensors (one transfer for all three).  ``k_step`` is the number of
        drafts proposed per row in this step (default ``k``); ``rejected[b]`` whether row b's
        verification ended in a rejection (default n < k_step; a tree passes it: a path may end at a leaf)."""
        if isinstance(num_accepted, torch.Tensor):
            stacked = torch.stack([num_accepted.long(), emitted.long(), active.long()]).cpu()  # [3, B]
            num_accepted, emitted, active = stacked.tolist()
        k_step = self.k if k_step is None else k_step
        if rejected is None:
            rejected = [n < k_step for n in num_accepted]
        for n, e, a, rej in zip(num_accepted, emitted, active, rejected):
            if not a:
                continue
            used = min(n, e)  # drafts emitted as accepted
            if used >= len(self.accept_hist):  # a drafter may propose more than k (hybrid.HybridDrafter's lookup)
                self.accept_hist.extend([0] * (used + 1 - len(self.accept_hist)))
            self.accept_hist[used] += 1
            self.accepted += used
            self.rejections += int(bool(rej) and e > n)  # the residual token after the rejection was emitted
            self.proposed += k_step
            self.emitted += e
            self.row_steps += 1
            if k_step > 0:
                self.verify_hist.setdefault(k_step, [0] * (k_step + 1))[min(n, k_step)] += 1

    def summary(self) -> dict:
        return {
            "k": self.k, "alpha": self.alpha, "utilisation": self.utilisation, "tau": self.tau,
            "accept_hist": list(self.accept_hist), "accepted": self.accepted, "rejections": self.rejections,
            "proposed": self.proposed, "row_steps": self.row_steps,
            "verify_hist": {k: list(h) for k, h in sorted(self.verify_hist.items())},
            "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
            "emitted": self.emitted, "time_prefill": self.time_prefill, "time_draft": self.time_draft,
            "time_verify": self.time_verify, "time_other": self.time_other, "time_total": self.time_total,
        }


def truncated_geometric(alpha: float, k: int) -> list[float]:
    """Law of the accepted length n in 0..k when each of k drafts is accepted independently with
    probability ``alpha`` until the first rejection: alpha^n (1 - alpha) for n < k, alpha^k for n = k."""
    alpha, k = as_prob(alpha, "alpha"), as_int(k, "k", lo=0)
    return [alpha**n * (1 - alpha) for n in range(k)] + [alpha**k]


def acceptance_independence(hists, alpha: float | None = None, min_expected: float = 5.0) -> dict:
    """Does i.i.d. acceptance explain the measured accepted lengths?  Compares the histograms of
    verification outcomes ``{K': [count of n = 0..K']}`` (a :class:`SpecStats` gives its
    ``verify_hist``) with the truncated geometric law of the same ``alpha`` (default: its maximum-
    likelihood estimate from these histograms, sum n / (sum n + steps with n < K'), which costs one
    degree of freedom).  Pearson chi-square per K' (cells of expected count < ``min_expected``
    pooled), statistics and degrees of freedom summed over K'.  Returns ``{"alpha", "steps",
    "observed", "expected" ({(K', n): count}), "tv" (between the observed and expected joint laws),
    "statistic", "dof", "p_value"}``; a small p-value says acceptances are NOT independent (e.g. a
    draft that is right tends to stay right, so long accepted runs are more common than alpha^n says)."""
    hists = getattr(hists, "verify_hist", hists)
    hists = {int(k): list(h) for k, h in dict(hists).items() if int(k) > 0 and sum(h) > 0}
    if not hists:
        raise ValueError("no verification outcomes: pass the SpecStats (or verify_hist) of a speculative run")
    estimated = alpha is None
    if estimated:
        acc = sum(n * c for h in hists.values() for n, c in enumerate(h))
        rej = sum(c for k, h in hists.items() for n, c in enumerate(h) if n < k)
        alpha = acc / (acc + rej) if acc + rej else 1.0
    steps = sum(sum(h) for h in hists.values())
    observed = {(k, n): c for k, h in hists.items() for n, c in enumerate(h)}
    expected = {(k, n): sum(h) * pn for k, h in hists.items() for n, pn in enumerate(truncated_geometric(alpha, k))}
    stat, dof = 0.0, 0
    for k, h in hists.items():
        law = {n: pn for n, pn in enumerate(truncated_geometric(alpha, k)) if pn > 0}
        try:
            s_k, d_k, _ = chi_square_test(dict(enumerate(h)), law, min_expected)
        except ValueError:  # fewer than two cells with enough expected counts: this K' adds nothing
            continue
        stat, dof = stat + s_k, dof + d_k
    dof -= int(estimated)
    p_value = float("nan") if dof < 1 else 0.0 if math.isinf(stat) else chi2_sf(stat, dof)
    tv = 0.5 * sum(abs(observed[c] - expected[c]) for c in observed) / steps
    return {"alpha": alpha, "steps": steps, "observed": observed, "expected": expected, "tv": tv, "statistic": stat,
            "dof": dof, "p_value": p_value}


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
