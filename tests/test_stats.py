"""stats: TV, empirical laws, the chi-square test and its power, SpecStats counters."""

import math

import pytest
import torch

from specdec_lesson.stats import (
    SpecStats,
    chi2_isf,
    chi2_sf,
    chi_square_power,
    chi_square_test,
    empirical_law,
    min_noncentrality,
    noncentral_chi2_sf,
    noncentrality,
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
    assert s.alpha == pytest.approx(3 / 6) and s.tau == pytest.approx(5 / 2)
    assert math.isnan(SpecStats(k=2).alpha)
    assert s.summary()["accept_hist"] == [1, 0, 0, 1]
