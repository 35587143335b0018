"""stats: TV, empirical laws, the chi-square test and its power, SpecStats counters."""

import math

import pytest
import torch

from specdec_lesson.stats import (
    SpecStats,
    acceptance_independence,
    chi2_isf,
    chi2_sf,
    chi_square_power,
    chi_square_test,
    empirical_law,
    min_noncentrality,
    noncentral_chi2_sf,
    noncentrality,
    truncated_geometric,
    tv_distance,
)


def test_chi2_sf_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    for x in (0.5, 2.0, 10.0, 40.0):
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)  # dof 2: exponential tail
    assert chi2_sf(0.0, 3) == 1.0
    assert chi2_sf(26.0, 26) == pytest.approx(0.4624, abs=1e-3)  # near the median
    with pytest.raises(ValueError, match="dof"):
        chi2_sf(1.0, 0)


def test_chi2_isf_inverts():
    for dof in (1, 7, 26):
        for level in (0.05, 1e-3):
            assert chi2_sf(chi2_isf(level, dof), dof) == pytest.approx(level, rel=1e-6)
    with pytest.raises(ValueError, match="level"):
        chi2_isf(0.0, 3)


def test_noncentral_sf():
    assert noncentral_chi2_sf(5.0, 4, 0.0) == pytest.approx(chi2_sf(5.0, 4))
    # mean of a non-central chi-square is dof + lambda: the sf at the mean is near 1/2
    assert 0.4 < noncentral_chi2_sf(26 + 48, 26, 48.0) < 0.6
    assert noncentral_chi2_sf(10.0, 3, 200.0) > 0.999999


def test_power_matches_simulation():
    """Analytic power vs simulated power of the same test: 10 cells, n = 2,000 samples, an
    alternative at TV 0.04, level 0.01.  600 simulated tests: sd of the rate <= 0.021, tolerance 0.08."""
    null = {i: 0.1 for i in range(10)}
    alt = {i: 0.1 + (0.008 if i < 5 else -0.008) for i in range(10)}
    n, level, trials = 2000, 0.01, 600
    lam = noncentrality(null, alt, n)
    analytic = chi_square_power(n, 9, lam, level)
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(torch.tensor(list(alt.values())), n * trials, replacement=True, generator=gen).view(trials, n)
    rejected = 0
    for row in draws:
        counts = dict(enumerate(torch.bincount(row, minlength=10).tolist()))
        rejected += chi_square_test(counts, null)[2] < level
    assert abs(rejected / trials - analytic) < 0.08
    assert lam >= min_noncentrality(n, tv_distance(null, alt)) - 1e-9  # the Cauchy-Schwarz floor


def test_chi_square_test_pools_and_flags_impossible_outcomes():
    law = {"a": 0.5, "b": 0.499, "c": 0.001}
    stat, dof, p = chi_square_test({"a": 520, "b": 480}, law)  # c expects 1 < 5: pooled with b
    assert dof == 1 and 0 < p < 1
    assert chi_square_test({"a": 1, "d": 1}, law) == (math.inf, 1, 0.0)
    exact = chi_square_test({"a": 500, "b": 499, "c": 1}, law, min_expected=1.0)
    assert exact[0] == pytest.approx(0.0) and exact[2] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="sum to 1"):
        chi_square_test({"a": 1}, {"a": 0.5})
    with pytest.raises(ValueError, match="no samples"):
        chi_square_test({}, law)
    with pytest.raises(ValueError, match="two cells"):
        chi_square_test({"a": 3}, {"a": 0.5, "b": 0.5})


def test_tv_and_empirical_law():
    assert tv_distance([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5)
    assert tv_distance({"x": 0.5, "y": 0.5}, {"x": 1.0}) == pytest.approx(0.5)
    assert tv_distance(torch.tensor([0.2, 0.8]), torch.tensor([0.2, 0.8])) == 0.0
    with pytest.raises(ValueError, match="shape"):
        tv_distance([0.5, 0.5], [1.0])
    assert empirical_law([(1, 2), (1, 2), (0, 0), (1, 2)]) == {(1, 2): 0.75, (0, 0): 0.25}
    with pytest.raises(ValueError, match="no samples"):
        empirical_law([])


def test_spec_stats_counters():
    s = SpecStats(k=3)
    s.record(torch.tensor([3, 0, 1]), torch.tensor([4, 1, 2]), torch.tensor([1, 1, 0]))
    assert s.accept_hist == [1, 0, 0, 1]
    # row 0: all 3 accepted (no rejection); row 1: rejected at once; row 2 inactive
    assert s.rejections == 1 and s.alpha == pytest.approx(3 / 4) and s.utilisation == pytest.approx(3 / 6)
    assert s.tau == pytest.approx(5 / 2)
    assert math.isnan(SpecStats(k=2).alpha) and math.isnan(SpecStats(k=2).utilisation)
    summary = s.summary()
    assert summary["accept_hist"] == [1, 0, 0, 1] and summary["alpha"] == s.alpha and summary["utilisation"] == 0.5
    assert summary["verify_hist"] == {3: [1, 0, 0, 1]} and summary["rejections"] == 1


def test_spec_stats_count_only_emitted_drafts():
    """A draft accepted by verification but cut by EOS / the token budget is neither accepted nor a trial:
    row 0 accepted 4 of 4 but the budget let it emit 2 (2 accepted, no rejection); row 1 accepted 1 of 4, its
    EOS was that accepted draft (1 accepted, its rejection cut: none); row 2 accepted 2 of 4 and emitted the
    residual token (2 accepted, 1 rejection).  Before the fix accepted was 7 and alpha 7/16."""
    s = SpecStats(k=4)
    s.record([4, 1, 2], [2, 1, 3], [True, True, True])
    assert s.accepted == 5 and s.rejections == 1 and s.proposed == 12 and s.emitted == 6
    assert s.accept_hist == [0, 1, 2, 0, 0] and s.accepted == sum(n * c for n, c in enumerate(s.accept_hist))
    assert s.alpha == pytest.approx(5 / 6) and s.utilisation == pytest.approx(5 / 12)
    assert s.verify_hist == {4: [0, 1, 1, 0, 1]}  # raw verification outcomes, before the cuts
    tree = SpecStats(k=3)  # a tree path may end at a shallow leaf: the caller says there was no rejection
    tree.record([1], [2], [True], rejected=[False])
    assert tree.rejections == 0 and tree.alpha == 1.0


def test_truncated_geometric_law():
    law = truncated_geometric(0.6, 3)
    assert law == pytest.approx([0.4, 0.24, 0.144, 0.216]) and sum(law) == pytest.approx(1.0)
    assert truncated_geometric(1.0, 2) == [0.0, 0.0, 1.0] and truncated_geometric(0.3, 0) == [1.0]
    with pytest.raises(ValueError, match="alpha"):
        truncated_geometric(1.5, 2)


def _geometric_hist(gen: torch.Generator, alpha_of_position, k: int, n: int) -> list[int]:
    """n chains of k drafts; draft j is accepted with probability alpha_of_position(j, accepted so far)."""
    hist = [0] * (k + 1)
    u = torch.rand(n, k, generator=gen, dtype=torch.float64).tolist()
    for row in u:
        m = 0
        while m < k and row[m] < alpha_of_position(m):
            m += 1
        hist[m] += 1
    return hist


def test_acceptance_independence_accepts_iid_and_flags_correlation():
    """i.i.d. acceptance (alpha 0.6, K = 4, N = 4000 chains, plus 1000 chains of K' = 2): the test of the truncated
    geometric law (alpha estimated, level 1e-3) does not reject.  A correlated chain (first draft 0.5, later ones
    0.85: a right draft tends to stay right) of the same size is rejected.  Power against that alternative, from
    the non-central chi-square with lambda = N * sum (r - p)^2 / p at the fitted alpha: > 0.999 (asserted)."""
    gen = torch.Generator().manual_seed(0)
    iid = {4: _geometric_hist(gen, lambda j: 0.6, 4, 4000), 2: _geometric_hist(gen, lambda j: 0.6, 2, 1000)}
    res = acceptance_independence(iid)
    assert abs(res["alpha"] - 0.6) < 0.03 and res["p_value"] > 1e-3 and res["tv"] < 0.03, res
    assert res["dof"] == 4 + 2 - 1 and res["steps"] == 5000
    corr = {4: _geometric_hist(gen, lambda j: 0.5 if j == 0 else 0.85, 4, 4000)}
    bad = acceptance_independence(corr)
    assert bad["p_value"] < 1e-3, bad
    # the alternative's law against the null fitted to it: its power at N = 4000
    alt = [0.5, 0.5 * 0.15, 0.5 * 0.85 * 0.15, 0.5 * 0.85**2 * 0.15, 0.5 * 0.85**3]
    a = sum(n * pn for n, pn in enumerate(alt)) / (sum(n * pn for n, pn in enumerate(alt)) + sum(alt[:4]))
    lam = noncentrality(dict(enumerate(truncated_geometric(a, 4))), dict(enumerate(alt)), 4000)
    assert chi_square_power(4000, 3, lam, 1e-3) > 0.999
    stats = SpecStats(k=4)  # the SpecStats form: its verify_hist; the given alpha costs no degree of freedom
    stats.record([4, 0, 2, 1], [5, 1, 3, 2], [True] * 4)
    assert acceptance_independence(stats, alpha=0.5)["steps"] == 4
    with pytest.raises(ValueError, match="no verification outcomes"):
        acceptance_independence(SpecStats(k=2))
