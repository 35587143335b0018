"""theory: the sympy derivation, the Fraction check, and the closed forms."""

import random
from fractions import Fraction

import pytest
import sympy as sp

from specdec_lesson import theory
from specdec_lesson.stats import tv_distance


@pytest.fixture(scope="module")
def speed():
    return theory.derive_expected_tokens()  # asserts each step; a few seconds of sympy, so once per module


def test_symbolic_derivation_for_a_general_vocabulary():
    """Every step asserts internally; here we check the statements that come out."""
    d = theory.derive_output_law()
    n = sp.Symbol("n", integer=True, positive=True)
    assert n in d["residual_mass"].lhs.free_symbols  # a symbolic vocabulary size, not a number
    assert d["emit_x"].rhs == sp.IndexedBase("p", nonnegative=True)[sp.Symbol("x", integer=True, positive=True)]
    assert d["residual_mass"].rhs == 1 - sp.Symbol("beta", nonnegative=True)
    assert d["tv"].rhs == d["residual_mass"].rhs


def test_pointwise_identities_are_checked_by_cases():
    ident = theory.pointwise_identities()
    a, b = sp.symbols("a b", real=True)
    for eq in ident.values():
        for va, vb in ((3, 1), (1, 3), (2, 2), (-1, Fraction(1, 2))):
            assert eq.lhs.subs({a: va, b: vb}) == eq.rhs.subs({a: va, b: vb})


def test_expected_tokens_derivation_matches_closed_form(speed):
    d = speed
    alpha, c, k = sp.Symbol("alpha", positive=True), sp.Symbol("c", positive=True), sp.Symbol("K", integer=True, positive=True)
    for a in (0.1, 0.5, 0.9):
        for kk in (1, 3, 7):
            assert abs(float(d["expected_tokens"].rhs.subs({alpha: a, k: kk})) - theory.expected_tokens(a, kk)) < 1e-12
            assert abs(float(d["speedup"].rhs.subs({alpha: a, k: kk, c: 0.1})) - theory.speedup(a, kk, 0.1)) < 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_exact_emit_law_is_p(seed):
    rng = random.Random(seed)
    for vocab in (1, 2, 3, 7):
        for _ in range(10):
            w = [rng.randint(0, 9) for _ in range(vocab)]
            u = [rng.randint(0, 9) for _ in range(vocab)]
            w[0] += 1
            u[-1] += 1
            p = [Fraction(x, sum(w)) for x in w]
            q = [Fraction(x, sum(u)) for x in u]
            assert theory.exact_emit_law(p, q) == p
            assert theory.exact_emit_law(p, p) == p
    disjoint = theory.exact_emit_law([0, Fraction(1, 4), Fraction(3, 4)], [1, 0, 0])
    assert disjoint == [0, Fraction(1, 4), Fraction(3, 4)]
    with pytest.raises(ValueError, match="summing to 1"):
        theory.exact_emit_law([0.5, 0.4], [0.5, 0.5])


def test_acceptance_rate_is_one_minus_tv():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    assert abs(theory.acceptance_rate(p, q) - (1 - tv_distance(p, q))) < 1e-12
    assert theory.acceptance_rate(p, p) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="length"):
        theory.acceptance_rate(p, q[:2])


def test_closed_forms():
    assert theory.expected_tokens(0.0, 5) == 1.0
    assert theory.expected_tokens(1.0, 5) == 6.0
    assert theory.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert theory.speedup(0.8, 4, 0.0) == pytest.approx(theory.expected_tokens(0.8, 4))
    assert theory.speedup(0.8, 4, 0.1, verify_ratio=2.0) == pytest.approx(theory.expected_tokens(0.8, 4) / 2.4)
    for alpha in (0.3, 0.6, 0.9):
        for c in (0.05, 0.2):
            brute = max(range(1, 65), key=lambda k: theory.speedup(alpha, k, c))
            assert theory.best_k(alpha, c) == brute
            assert theory.speedup(alpha, brute, c) >= theory.speedup_bound(alpha, c) > 1
    # a verify-cost curve that grows with n pushes the best K down
    assert theory.best_k(0.8, 0.05, verify_ratio=lambda n: 1 + 0.3 * (n - 1)) < theory.best_k(0.8, 0.05)
    for bad in (lambda: theory.expected_tokens(1.5, 2), lambda: theory.expected_tokens(0.5, 0),
                lambda: theory.speedup(0.5, 2, -1), lambda: theory.speedup_bound(0.1, 0.2)):
        with pytest.raises(ValueError):
            bad()


def test_best_k_is_where_the_consecutive_ratio_drops_below_one(speed):
    ratio = speed["ratio_next"].rhs
    alpha, c, k = sp.Symbol("alpha", positive=True), sp.Symbol("c", positive=True), sp.Symbol("K", integer=True, positive=True)
    f = sp.lambdify((alpha, c, k), ratio)
    for a in (0.3, 0.6, 0.8, 0.95):
        for cc in (0.02, 0.1, 0.3):
            first_drop = next(kk for kk in range(1, 200) if f(a, cc, kk) <= 1)
            assert theory.best_k(a, cc, k_max=200) == first_drop
