"""Closed forms of speculative decoding (Leviathan et al. 2023, section 3).

alpha: the expected acceptance rate E[beta], beta = sum_x min(p(x), q(x)) = 1 - TV(p, q).
c: the cost of one draft forward relative to one target forward.

How many drafts can a lossless verifier accept?  On the event "at least i drafts accepted" the
first i emitted tokens ARE the drafts X^i ~ q^i, and they must also follow the target's p^i,
so P(tau >= i) <= sum_{x^i} min(p^i(x^i), q^i(x^i)) and E[tau] <= sum_i of that
(:func:`expected_accepted_bound`).  Token-level verification reaches only sum_i beta^i for
i.i.d. laws (:func:`token_expected_accepted`): it rejects at the first token with p < q even when
the block as a whole is likelier under p.  Block verification (Sun et al. 2024,
:mod:`specdec_lesson.verify.block`) carries a weight w_i = min(1, w_{i-1} p_i(X_i)/q_i(X_i)) along
the block and accepts the longest prefix whose test u_i < h_i passes; it is still exact and is the
best rule that only sees the drafted path's laws.  Their example, p = (1/3, 2/3), q = (2/3, 1/3),
K = 2: token-level 10/9, block 11/9, the bound 12/9 (reachable only by a rule that knows the
laws off the drafted path, here that they do not depend on the context).
"""

from __future__ import annotations

from fractions import Fraction

import sympy as sp

from .validate import as_int, as_law, as_prob, as_real

__all__ = [
    "acceptance_rate", "expected_tokens", "speedup", "best_k", "speedup_bound",
    "pointwise_identities", "derive_output_law", "derive_expected_tokens", "exact_emit_law",
    "token_expected_accepted", "expected_accepted_bound",
]


def _check_ratio(verify_ratio, name: str = "verify_ratio") -> float:
    return as_real(verify_ratio, name, lo=0.0, lo_open=True)


def acceptance_rate(target_probs, draft_probs) -> float:
    """beta = sum_x min(p(x), q(x)) for two laws given as sequences or 1-D tensors (each non-negative,
    summing to 1)."""
    sizes = [len(v) if hasattr(v, "__len__") else None for v in (target_probs, draft_probs)]
    if None not in sizes and sizes[0] != sizes[1]:  # the likelier mistake: say it first
        raise ValueError(f"target_probs and draft_probs differ in length: {sizes[0]} vs {sizes[1]}")
    p = as_law(target_probs, "target_probs")
    q = as_law(draft_probs, "draft_probs")
    if len(p) != len(q):
        raise ValueError(f"target_probs and draft_probs differ in length: {len(p)} vs {len(q)}")
    return sum(min(a, b) for a, b in zip(p, q))


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per target forward] = (1 - alpha^(K+1)) / (1 - alpha)  (K+1 when alpha = 1)."""
    alpha = as_prob(alpha, "alpha")
    k = as_int(k, "k", lo=1)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """Walltime speedup S(K) = E[tokens] / (K c + verify_ratio).

    ``verify_ratio`` = T_verify(K+1) / T_target(1); the paper's idealisation is 1.
    """
    c, verify_ratio = as_real(c, "c", lo=0.0), _check_ratio(verify_ratio)
    return expected_tokens(alpha, k) / (k * c + verify_ratio)


def best_k(alpha: float, c: float, k_max: int = 64, verify_ratio=None) -> int:
    """The integer K in 1..k_max with the largest S(K).

    ``verify_ratio`` may be a callable ``n -> T(n)/T(1)`` (n = K+1 verified positions)."""
    alpha, c, k_max = as_prob(alpha, "alpha"), as_real(c, "c", lo=0.0), as_int(k_max, "k_max", lo=1)
    if verify_ratio is not None and not callable(verify_ratio):
        verify_ratio = _check_ratio(verify_ratio)

    def ratio(k: int) -> float:
        if verify_ratio is None:
            return 1.0
        if callable(verify_ratio):
            return _check_ratio(verify_ratio(k + 1), f"verify_ratio({k + 1})")
        return verify_ratio

    return max(range(1, k_max + 1), key=lambda k: (speedup(alpha, k, c, ratio(k)), -k))


def speedup_bound(alpha: float, c: float) -> float:
    """When alpha > c, K = 1 already gives (1 + alpha) / (1 + c) > 1, so the best K does at least that."""
    alpha, c = as_prob(alpha, "alpha"), as_real(c, "c", lo=0.0)
    if not alpha > c:
        raise ValueError(f"the bound (1 + alpha)/(1 + c) holds for alpha > c; got alpha={alpha}, c={c}")
    return (1.0 + alpha) / (1.0 + c)


# --------------------------------------------------------------------------------------------
# The sympy derivation.  Every step returns the sympy objects it proved, so the notebook can
# display them; each helper *asserts* its identity (a failed step raises AssertionError).
# --------------------------------------------------------------------------------------------


def _zero(expr) -> bool:
    return sp.simplify(expr) == 0


def _linear(expr):
    """Linearity of a symbolic sum: split Sum(a + b) into Sum(a) + Sum(b) and pull constants out."""
    return sp.factor_terms(sp.expand(expr))


def pointwise_identities() -> dict:
    """The two facts about real numbers the whole proof rests on, proved by cases.

        min(a, b) + max(0, a - b) = a          |a - b| = 2 max(0, a - b) - (a - b)

    sympy cannot decide ``Min(a, b)`` for free symbols, so we split into the cases a >= b
    (write a = b + t with t >= 0) and a < b (a = b - t with t > 0); in each case sympy knows
    the order and both identities reduce to 0 = 0.
    """
    a, b = sp.symbols("a b", real=True)
    t0, t1 = sp.Symbol("t", nonnegative=True), sp.Symbol("t", positive=True)
    min_max = sp.Min(a, b) + sp.Max(0, a - b) - a
    abs_max = sp.Abs(a - b) - (2 * sp.Max(0, a - b) - (a - b))
    for expr in (min_max, abs_max):
        assert _zero(expr.subs(a, b + t0)) and _zero(expr.subs(a, b - t1)), expr
    return {
        "min_plus_residual": sp.Eq(sp.Min(a, b) + sp.Max(0, a - b), a),
        "abs_as_max": sp.Eq(sp.Abs(a - b), 2 * sp.Max(0, a - b) - (a - b)),
    }


def derive_output_law() -> dict:
    """Speculative sampling emits x with probability exactly p(x), for ANY vocabulary size n.

    Draft x ~ q, accept with probability min(1, p(x)/q(x)), else emit y ~ max(0, p - q) / Z.

    1. P(draft x and accept) = q(x) min(1, p(x)/q(x)) = min(p(x), q(x)).
    2. beta = P(accept) = sum_x min(p(x), q(x)).
    3. The trick: the normaliser Z = sum_x' max(0, p(x') - q(x')) is NOT a new unknown.  By the
       pointwise identity max(0, a - b) = a - min(a, b), the sum over the symbolic range
       1..n splits (linearity of Sum) into sum p - sum min(p, q) = 1 - beta.  So the rejection
       probability 1 - beta and Z cancel.
    4. P(emit x) = min(p, q) + (1 - beta) max(0, p - q) / (1 - beta) = min(p, q) + max(0, p - q) = p(x)
       (pointwise identity again).  When beta = 1 (p == q) rejection never happens and P = min(p, p) = p.
    5. beta = 1 - TV(p, q): TV = 1/2 sum |p - q| = sum max(0, p - q) (|d| = 2 max(0, d) - d and
       sum (p - q) = 0), which is 1 - beta by step 3.

    The sums use a symbolic n and ``IndexedBase`` p[i], q[i] with sum p = sum q = 1 as the only
    facts about the laws: the proof holds for every vocabulary, not just the ones we tried.
    """
    ident = pointwise_identities()
    n = sp.Symbol("n", integer=True, positive=True)
    i = sp.Symbol("i", integer=True, positive=True)
    x = sp.Symbol("x", integer=True, positive=True)
    p, q = sp.IndexedBase("p", nonnegative=True), sp.IndexedBase("q", nonnegative=True)
    beta = sp.Symbol("beta", nonnegative=True)
    sum_p, sum_q, sum_min = sp.Sum(p[i], (i, 1, n)), sp.Sum(q[i], (i, 1, n)), sp.Sum(sp.Min(p[i], q[i]), (i, 1, n))
    facts = {sum_p: 1, sum_q: 1, sum_min: beta}

    accept_x = q[x] * sp.Min(1, p[x] / q[x])  # step 1 (q[x] > 0: q[x] * min(1, p/q) = min(q, p))
    qx = sp.Symbol("q_x", positive=True)
    px = sp.Symbol("p_x", nonnegative=True)
    step1 = qx * sp.Min(1, px / qx) - sp.Min(px, qx)  # by cases again: p >= q and p < q
    t0, t1 = sp.Symbol("t", nonnegative=True), sp.Symbol("t", positive=True)
    assert _zero(step1.subs(px, qx + t0)) and _zero(step1.subs(px, qx - t1))

    z = sp.Sum(sp.Max(0, p[i] - q[i]), (i, 1, n))  # step 3
    z_rewritten = sp.Sum(p[i] - sp.Min(p[i], q[i]), (i, 1, n))  # termwise: max(0, a-b) = a - min(a, b)
    z_value = _linear(z_rewritten).subs(facts)
    assert _zero(z_value - (1 - beta)), z_value

    emit_x = sp.Min(p[x], q[x]) + (1 - beta) * sp.Max(0, p[x] - q[x]) / z_value  # step 4
    emit_x = sp.simplify(emit_x)
    a, b = sp.symbols("a b", real=True)
    assert _zero(emit_x.subs({p[x]: a, q[x]: b}) - (sp.Min(a, b) + sp.Max(0, a - b)))
    assert ident["min_plus_residual"].rhs == a  # ... = p(x) by the pointwise identity

    tv = sp.Rational(1, 2) * sp.Sum(sp.Abs(p[i] - q[i]), (i, 1, n))  # step 5
    tv_rewritten = sp.Rational(1, 2) * sp.Sum(2 * sp.Max(0, p[i] - q[i]) - (p[i] - q[i]), (i, 1, n))
    tv_value = _linear(tv_rewritten).subs(facts).subs(z, 1 - beta)
    assert _zero(tv_value - (1 - beta)), tv_value
    return {
        "accept_x": sp.Eq(accept_x, sp.Min(p[x], q[x])),
        "beta": sp.Eq(beta, sum_min),
        "residual_mass": sp.Eq(z, 1 - beta),
        "emit_x": sp.Eq(sp.Min(p[x], q[x]) + (1 - beta) * sp.Max(0, p[x] - q[x]) / (1 - beta), p[x]),
        "tv": sp.Eq(tv, 1 - beta),
        **ident,
    }


def derive_expected_tokens() -> dict:
    """E[tokens per step] = (1 - alpha^(K+1)) / (1 - alpha), derived as a sympy sum.

    With i.i.d. acceptances (probability alpha), a step emits j + 1 tokens with probability
    alpha^j (1 - alpha) for j < K (j accepted, then the residual token) and K + 1 with
    probability alpha^K (all accepted, plus the bonus).  sympy sums this for a symbolic K.
    """
    alpha, c = sp.Symbol("alpha", positive=True), sp.Symbol("c", positive=True)
    k, j = sp.Symbol("K", integer=True, positive=True), sp.Symbol("j", integer=True, nonnegative=True)
    mean = sp.piecewise_fold(sp.summation((j + 1) * alpha**j * (1 - alpha), (j, 0, k - 1)) + (k + 1) * alpha**k)
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)
    general = mean.args[-1].expr if isinstance(mean, sp.Piecewise) else mean
    assert _zero(general - closed), general
    if isinstance(mean, sp.Piecewise):  # the alpha = 1 branch: K + 1 tokens every step
        assert _zero(mean.args[0].expr.subs(alpha, 1) - (k + 1))
    s = closed / (k * c + 1)
    # best integer K: S is compared at consecutive integers; K + 1 helps iff this ratio > 1
    # (it falls towards alpha (Kc + 1)/((K+1)c + 1) < 1 as K grows, so a finite best K exists);
    # best_k() scans the integers, which also handles a measured verify-cost curve.
    ratio = sp.simplify(s.subs(k, k + 1) / s)
    assert _zero(ratio - (1 - alpha ** (k + 2)) * (k * c + 1) / ((1 - alpha ** (k + 1)) * ((k + 1) * c + 1)))
    s1 = s.subs(k, 1)
    assert _zero(s1 - (1 + alpha) / (1 + c))
    assert _zero((s1 - 1) - (alpha - c) / (1 + c))  # > 0 exactly when alpha > c
    return {
        "expected_tokens": sp.Eq(sp.Symbol("E[N]"), closed),
        "speedup": sp.Eq(sp.Symbol("S(K)"), s),
        "ratio_next": sp.Eq(sp.Symbol("S(K+1)/S(K)"), ratio),
        "speedup_k1": sp.Eq(sp.Symbol("S(1)"), (1 + alpha) / (1 + c)),
        "gain_k1": sp.Eq(sp.Symbol("S(1)") - 1, (alpha - c) / (1 + c)),
    }


def exact_emit_law(target_law, draft_law) -> list[Fraction]:
    """P(emit x) of one speculative-sampling step computed with Fractions (no shortcut:
    accept mass + rejection mass times the normalised residual).  Equals ``target_law``."""
    p, q = _exact_laws(target_law, draft_law)
    accept = [min(a, b) for a, b in zip(p, q)]
    beta = sum(accept)
    residual = [max(Fraction(0), a - b) for a, b in zip(p, q)]
    z = sum(residual)
    return [acc + ((1 - beta) * r / z if z else 0) for acc, r in zip(accept, residual)]


def _fractions(law, name: str) -> list[Fraction]:
    if isinstance(law, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of probabilities (Fractions, ints or finite floats), got {law!r}")
    out = []
    for i, v in enumerate(law):
        if isinstance(v, float):
            as_real(v, f"{name}[{i}]")  # NaN / inf: one message naming the entry
        try:
            out.append(Fraction(v))
        except (TypeError, ValueError):
            raise ValueError(f"{name}[{i}] must be a Fraction, an int or a finite float, got {v!r}") from None
    return out


def _exact_laws(target_law, draft_law) -> tuple[list[Fraction], list[Fraction]]:
    p, q = _fractions(target_law, "target_law"), _fractions(draft_law, "draft_law")
    if not p or len(p) != len(q) or sum(p) != 1 or sum(q) != 1 or min(p + q) < 0:
        raise ValueError("target_law and draft_law must be laws over the same vocabulary, summing to 1 exactly")
    return p, q


def token_expected_accepted(target_law, draft_law, k: int) -> Fraction:
    """E[accepted drafts] of token-level verification for context-free i.i.d. laws:
    sum_{i=1..K} beta^i, beta = sum_x min(p(x), q(x)) (the i-th draft counts iff the first i pass)."""
    k = as_int(k, "k", lo=1)
    p, q = _exact_laws(target_law, draft_law)
    beta = sum(min(a, b) for a, b in zip(p, q))
    return sum(beta**i for i in range(1, k + 1))


def expected_accepted_bound(target_law, draft_law, k: int) -> Fraction:
    """The most any lossless verifier can accept per step, for context-free i.i.d. laws:
    sum_{i=1..K} sum_{x in V^i} min(p^i(x), q^i(x)) with p^i(x) = prod_j p(x_j) (see the module
    docstring; enumerates the V^i blocks, so for small V and K)."""
    k = as_int(k, "k", lo=1)
    p, q = _exact_laws(target_law, draft_law)
    total, blocks = Fraction(0), [(Fraction(1), Fraction(1))]  # (p^i, q^i) of every block of length i
    for _ in range(k):
        blocks = [(bp * a, bq * b) for bp, bq in blocks for a, b in zip(p, q) if a or b]
        total += sum(min(bp, bq) for bp, bq in blocks)
    return total
