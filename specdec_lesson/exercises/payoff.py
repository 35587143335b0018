"""Exercises of notebook 01, part 2: what speculation buys, exactly.  Tokens per step with the bonus dropped
(pitfall 3b) and the expected accepted drafts of token-level verification, block verification and the bound no
lossless verifier beats.  Ground truth: :mod:`specdec_lesson.theory` and the exact step laws of
:mod:`specdec_lesson.toy_block`, all in Fractions."""

from __future__ import annotations

from fractions import Fraction

from .. import theory, toy_block
from ..toy import MarkovLM
from ._core import Exercise, call, exact_value, fail, passed, solve

__all__ = ["check_no_bonus_tokens", "check_block_prediction", "BLOCK_P", "BLOCK_Q", "BLOCK_K", "EXERCISES"]

BLOCK_P = (Fraction(1, 2), Fraction(1, 3), Fraction(1, 6))  # the target's law at every position
BLOCK_Q = (Fraction(1, 6), Fraction(1, 2), Fraction(1, 3))  # the draft's
BLOCK_K = 3


def tokens_without_bonus(alpha: Fraction, k: int) -> Fraction:
    """E[tokens per step] when a fully accepted chain emits no bonus: n + 1 tokens for n < K accepted (the last one
    from the residual), K tokens when all K pass; summed over the truncated geometric law, exactly."""
    alpha = Fraction(alpha)
    total = sum((n + 1) * alpha**n * (1 - alpha) for n in range(k)) + k * alpha**k
    assert abs(float(total) - (theory.expected_tokens(float(alpha), k) - float(alpha) ** k)) < 1e-12  # the library
    return total


def check_no_bonus_tokens(fn) -> None:
    """``fn(alpha, k)`` -> E[tokens per target forward] with the bonus dropped, exact for Fraction alpha; compared
    with :func:`tokens_without_bonus` (the law summed in Fractions, itself checked against
    ``theory.expected_tokens(alpha, k) - alpha**k``) for alpha in {0, 1/3, 1/2, 4/5, 99/100, 1} and k = 1..6."""
    ex = "1.4"
    for alpha in (Fraction(0), Fraction(1, 3), Fraction(1, 2), Fraction(4, 5), Fraction(99, 100), Fraction(1)):
        for k in range(1, 7):
            what = f"tokens_no_bonus({alpha}, {k})"
            got = exact_value(ex, call(ex, fn, alpha, k, what=what + (" (alpha = 1: every draft accepted)" if alpha == 1
                                                                     else "")), what)
            want = tokens_without_bonus(alpha, k)
            if got != want:
                with_bonus = want + alpha**k
                hint = (" That is the count WITH the bonus: a fully accepted chain now emits K tokens, not K + 1." if
                        got == with_bonus else " Sum (tokens emitted) x P(n accepted) over n = 0..K: n + 1 tokens with "
                        "probability alpha^n (1 - alpha) for n < K, K tokens with probability alpha^K.")
                fail(ex, f"{what}: expected {want}, got {got}.{hint}")
    a, k = Fraction(4, 5), 4
    passed(ex, f"dropping the bonus costs alpha^K tokens per step: at alpha = {a}, K = {k}, "
               f"{tokens_without_bonus(a, k)} = {float(tokens_without_bonus(a, k)):.3f} instead of "
               f"{float(tokens_without_bonus(a, k) + a**k):.3f}; the output law is unchanged.")


def _context_free(law) -> MarkovLM:
    return MarkovLM({(i,): law for i in range(len(law))}, len(law), order=1)


def block_truth(p=BLOCK_P, q=BLOCK_Q, k: int = BLOCK_K) -> dict[str, Fraction]:
    """E[accepted drafts per step] for context-free laws: token-level and block verification (exact enumeration of
    every drafted block by :func:`specdec_lesson.toy_block.expected_accepted`) and the bound of any lossless rule."""
    target, draft = _context_free(p), _context_free(q)
    out = {rule: toy_block.expected_accepted(target, draft, (0,), k, verify=rule) for rule in ("token", "block")}
    assert out["token"] == theory.token_expected_accepted(p, q, k)  # the closed form sum_i beta^i
    out["bound"] = theory.expected_accepted_bound(p, q, k)
    return out


def check_block_prediction(token_level, block, bound) -> None:
    """Your three numbers for p = BLOCK_P, q = BLOCK_Q at every position, K = BLOCK_K: E[accepted drafts] under
    token-level verification, under block verification, and the most any lossless verifier can reach; exact
    Fractions, compared with :func:`block_truth`."""
    ex = "1.5"
    truth = block_truth()
    got = {name: exact_value(ex, v, name) for name, v in (("token_level", token_level), ("block", block), ("bound", bound))}
    hints = {"token_level": "token-level acceptance stops at the first rejection: sum over i = 1..K of beta^i, "
                            "beta = sum_x min(p(x), q(x))",
             "block": "enumerate the K-token blocks X ~ q^K; for each, the weights w_i = min(1, w_{i-1} p(X_i)/q(X_i)), "
                      "the thresholds h_i, and E[tau] = sum_i i h_i prod_{j>i} (1 - h_j) (notebook section 6)",
             "bound": "sum over i = 1..K of sum over blocks x of length i of min(p^i(x), q^i(x))"}
    for name, key in (("token_level", "token"), ("block", "block"), ("bound", "bound")):
        if got[name] != truth[key]:
            fail(ex, f"{name} = {got[name]} is not right (p = {tuple(map(str, BLOCK_P))}, q = {tuple(map(str, BLOCK_Q))},"
                     f" K = {BLOCK_K}). Hint: {hints[name]}.")
    passed(ex, f"token-level {truth['token']} <= block {truth['block']} <= bound {truth['bound']} accepted drafts per "
               f"step ({float(truth['block'] / truth['token']):.3f}x the token rule's, on the same drafts).")


_P14 = """Pitfall 3b drops the bonus token: after K accepted drafts the step emits those K tokens and nothing more. The
output law does not change (notebook section 4), the speed does. Write `tokens_no_bonus(alpha, k)`, the expected
tokens per target forward with i.i.d. acceptance alpha, *exact* for a `Fraction` alpha (use sympy as in section 5,
or sum the law of the accepted length by hand). Mind alpha = 1."""

_S14 = '''from fractions import Fraction

from specdec_lesson.exercises import check_no_bonus_tokens


def tokens_no_bonus(alpha, k):
    """E[tokens per target forward] when a fully accepted chain emits no bonus token."""
    raise NotImplementedError


check_no_bonus_tokens(tokens_no_bonus)
'''

_A14 = solve(_S14, '''
    if alpha == 1:
        return Fraction(k)                                   # K tokens, every step
    return (1 - alpha ** (k + 1)) / (1 - alpha) - alpha ** k  # the bonus formula minus the bonus
''')

_P15 = """Block verification (section 6) accepts more drafts than the token rule on the same drafts, and no lossless
rule beats the bound of the theory module. Predict all three for laws that do not depend on the context, p =
(1/2, 1/3, 1/6) at every position (target), q = (1/6, 1/2, 1/3) (draft), K = 3: the expected accepted drafts per
step under token-level verification, under block verification, and the bound. Exact `Fraction`s; compute them by
enumeration (the library's `toy_block` is what the check uses)."""

_S15 = '''from fractions import Fraction
from itertools import product

from specdec_lesson.exercises import check_block_prediction

p = (Fraction(1, 2), Fraction(1, 3), Fraction(1, 6))
q = (Fraction(1, 6), Fraction(1, 2), Fraction(1, 3))
K = 3
token_level = block = bound = None   # your three Fractions

check_block_prediction(token_level, block, bound)
'''

_A15 = solve(_S15, '''
beta = sum(min(a, b) for a, b in zip(p, q))
token_level = sum(beta**i for i in range(1, K + 1))

block = Fraction(0)
for xs in product(range(3), repeat=K):                   # every drafted block, probability q^K
    w = [Fraction(1)]
    for x in xs:
        w.append(min(Fraction(1), w[-1] * p[x] / q[x]))
    h = []
    for i in range(1, K):                                # threshold h_i: mass left after X_1..X_i
        z = sum(max(Fraction(0), w[i] * a - b) for a, b in zip(p, q))
        h.append(z / (z + 1 - w[i]) if z + 1 - w[i] else Fraction(1))
    h.append(w[K])
    e_tau = Fraction(0)
    for i in range(1, K + 1):                            # tau = i: test i passes, every later test fails
        pr = h[i - 1]
        for j in range(i, K):
            pr *= 1 - h[j]
        e_tau += i * pr
    prob = Fraction(1)
    for x in xs:
        prob *= q[x]
    block += prob * e_tau

bound = Fraction(0)
for i in range(1, K + 1):
    for xs in product(range(3), repeat=i):
        pi = qi = Fraction(1)
        for x in xs:
            pi, qi = pi * p[x], qi * q[x]
        bound += min(pi, qi)
''', 'token_level = block = bound = None   # your three Fractions\n')

EXERCISES = [
    Exercise("1.4", "tokens per step with the bonus dropped", check_no_bonus_tokens, _P14, _S14, _A14),
    Exercise("1.5", "token rule, block rule and the bound", check_block_prediction, _P15, _S15, _A15),
]
