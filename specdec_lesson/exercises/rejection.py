"""Exercises of notebook 01, part 1: the accept test, the residual law and one-token speculative sampling.

Ground truth: the library's exact sibling rule ``tree.FractionRules().reject(p, q, x, "iid")`` (the guarded,
normalised residual max(0, p - q)), exact emission laws in Fractions, and chi-square tests of sampled tokens against
the target law (:func:`specdec_lesson.exercises._core.fit_test`)."""

from __future__ import annotations

from fractions import Fraction

import torch

from ._core import Exercise, call, detectable_tv, exact_value, fail, fit_test, passed, random_laws, solve

__all__ = ["check_accept", "check_residual", "check_speculative_sample", "SAMPLES", "EXERCISES"]

SAMPLES = 100_000  # tokens per statistical test; laws over 6 tokens (5 degrees of freedom)
_V = 6


def _exact_residual(p, q) -> tuple[Fraction, ...]:
    from ..tree.verify import FractionRules  # (the tree package imports transformers: only when checking)

    return FractionRules().reject(tuple(p), tuple(q), 0, "iid")  # norm(max(0, p - q)), p itself when all zero


def _float_laws(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Law pairs over 6 tokens (float64): random, disjoint-ish supports, and p == q."""
    g = torch.Generator().manual_seed(seed)
    p, q = torch.softmax(1.5 * torch.randn(2, _V, generator=g, dtype=torch.float64), -1)  # [V] each
    p0 = torch.tensor([0.4, 0.3, 0.0, 0.2, 0.1, 0.0], dtype=torch.float64)
    q0 = torch.tensor([0.1, 0.0, 0.5, 0.1, 0.2, 0.1], dtype=torch.float64)
    return [(p, q), (p0, q0), (p, p.clone())]


def _one_token_counts(p: torch.Tensor, q: torch.Tensor, accept: list, residual: list, gen: torch.Generator) -> dict:
    """SAMPLES one-token speculative draws with the given per-token accept probabilities and residual law."""
    x = torch.multinomial(q, SAMPLES, replacement=True, generator=gen)  # [N] drafts ~ q
    u = torch.rand(SAMPLES, generator=gen, dtype=torch.float64)  # [N]
    ok = u < torch.tensor([float(a) for a in accept], dtype=torch.float64)[x]  # [N]
    r = torch.tensor([float(v) for v in residual], dtype=torch.float64)  # [V]
    y = torch.multinomial(r, SAMPLES, replacement=True, generator=gen) if float(r.sum()) > 0 else x  # [N]
    out = torch.where(ok, x, y)  # [N]
    return dict(zip(*(t.tolist() for t in out.unique(return_counts=True))))


def check_accept(fn) -> None:
    """``fn(p_x, q_x)`` -> the probability of accepting a draft x ~ q, min(1, p(x)/q(x)).

    Exact part: on 40 random Fraction law pairs (2..5 tokens, zeros included), accept mass q(x) fn(p(x), q(x)) plus
    the rejection mass times the library's residual must give P(emit x) = p(x) exactly.  Statistical part: the same
    step on float64 laws over 6 tokens, 100,000 draws per law pair (3 pairs), chi-square at 1e-4 (false alarm 3e-4
    in all); each pair detects any bias of total variation >= 0.0112 with power 0.99 (``detectable_tv(100_000, 5)``)."""
    ex = "1.1"
    gen = torch.Generator().manual_seed(11)
    for case, (px, qx, want) in {"p(x) = 0": (Fraction(0), Fraction(1, 2), 0), "p(x) > q(x)": (Fraction(1, 2),
                                 Fraction(1, 4), 1), "p(x) < q(x)": (Fraction(1, 6), Fraction(1, 2), Fraction(1, 3))}.items():
        got = exact_value(ex, call(ex, fn, px, qx, what=f"accept({px}, {qx})"), f"accept({px}, {qx})")
        if got != want:
            fail(ex, f"{case}: accept({px}, {qx}) should be {want}, got {got}")
    for vocab in (2, 3, 5):
        for p, q in zip(random_laws(gen, vocab, 14), random_laws(gen, vocab, 14)):
            acc = [exact_value(ex, call(ex, fn, p[x], q[x], what=f"accept({p[x]}, {q[x]})"), f"accept({p[x]}, {q[x]})")
                   if q[x] else Fraction(0) for x in range(vocab)]
            if any(not 0 <= a <= 1 for a in acc):
                fail(ex, f"accept must return a probability in [0, 1]; for p = {_s(p)}, q = {_s(q)} it returned {_s(acc)}")
            beta = sum(qx * a for qx, a in zip(q, acc))
            emit = [qx * a + (1 - beta) * r for qx, a, r in zip(q, acc, _exact_residual(p, q))]
            if emit != list(p):
                fail(ex, f"p = {_s(p)}, q = {_s(q)}: with your accept probabilities {_s(acc)} the step emits "
                         f"{_s(emit)}, not p. Accept x with probability min(1, p(x) / q(x)).")
    for i, (p, q) in enumerate(_float_laws(12)):
        acc = [call(ex, fn, float(p[x]), float(q[x]), what=f"accept({float(p[x])}, {float(q[x])})") if q[x] > 0 else 0.0
               for x in range(_V)]
        residual = (p - q).clamp_min(0)  # [V]
        counts = _one_token_counts(p, q, acc, residual.tolist() if residual.sum() > 0 else p.tolist(), gen)
        fit_test(ex, counts, dict(enumerate(p.tolist())), f"float law pair {i}")
    passed(ex, f"the emitted law equals p exactly on 42 Fraction law pairs and statistically on 3 float pairs "
               f"({SAMPLES} draws each; a bias of TV >= {detectable_tv(SAMPLES, _V - 1):.4f} would show).")


def _s(law) -> str:
    return "(" + ", ".join(str(v) for v in law) + ")"


def check_residual(fn) -> None:
    """``fn(p, q)`` -> the residual law max(0, p - q) normalised, and p itself when that is all zero (p == q).

    Exact part: 45 random Fraction law pairs (2..5 tokens, zeros included) and p == q, compared with the library's
    guarded residual; min(p, q) + (1 - beta) * residual must be p.  Statistical part: a one-token speculative step
    on float64 laws over 6 tokens using your residual, 100,000 draws per pair (3 pairs, one with p == q),
    chi-square at 1e-4; detects any bias of total variation >= 0.0112 with power 0.99."""
    ex = "1.2"
    gen = torch.Generator().manual_seed(21)
    pairs = [(p, q) for vocab in (2, 3, 5) for p, q in zip(random_laws(gen, vocab, 15), random_laws(gen, vocab, 15))]
    for p, q in pairs + [(pairs[0][0], pairs[0][0]), (pairs[-1][0], pairs[-1][0])]:
        what = f"residual({_s(p)}, {_s(q)})" + (" (p == q: the residual is all zero)" if p == q else "")
        got = call(ex, fn, list(p), list(q), what=what)
        got = [exact_value(ex, v, what) for v in got]
        want = list(_exact_residual(p, q))
        if got != want:
            why = ("p == q leaves no residual mass; return p itself (rejection never happens then)" if p == q else
                   "it must sum to 1" if sum(got) != 1 else "max(0, p - q), divided by its sum")
            fail(ex, f"{what}: expected {_s(want)}, got {_s(got)}: {why}")
        beta = sum(min(a, b) for a, b in zip(p, q))
        assert [min(a, b) + (1 - beta) * r for a, b, r in zip(p, q, want)] == list(p)  # the library's identity
    for i, (p, q) in enumerate(_float_laws(22)):
        res = call(ex, fn, p.tolist(), q.tolist(), what=f"residual on float law pair {i}")
        res = [float(v) for v in res]
        if any(v != v or v < 0 for v in res) or abs(sum(res) - 1) > 1e-9:
            fail(ex, f"float law pair {i} (p == q: {bool(torch.equal(p, q))}): your residual {res} is not a law")
        acc = [min(1.0, float(p[x] / q[x])) if q[x] > 0 else 0.0 for x in range(_V)]
        fit_test(ex, _one_token_counts(p, q, acc, res, gen), dict(enumerate(p.tolist())), f"float law pair {i}")
    passed(ex, f"your residual matches the library on {len(pairs) + 2} exact law pairs (p == q guarded) and the step "
               f"that uses it emits p ({SAMPLES} float draws on 3 pairs).")


def check_speculative_sample(fn) -> None:
    """``fn(p, q, n, generator)`` -> ``[n]`` int64 tokens, each one speculative-sampling step (draft x ~ q, accept
    with probability min(1, p(x)/q(x)), else a draw from the residual).

    Checks: same generator seed -> same tokens (all randomness from ``generator``); two successive calls on one
    generator differ (no reseeding inside); on 3 law pairs over 6 tokens (random, zeros on both sides, p == q),
    100,000 tokens each fit p (chi-square at 1e-4, false alarm 3e-4 in all), detecting any bias of total variation
    >= 0.0112 with power 0.99 each: a greedy draft, a residual taken from p, a missing guard all fail."""
    ex = "1.3"
    pairs = _float_laws(31)
    p, q = pairs[0]
    a = call(ex, fn, p, q, 1000, torch.Generator().manual_seed(5), what="speculative_sample(p, q, 1000, generator)")
    if not isinstance(a, torch.Tensor) or a.shape != (1000,) or a.dtype not in (torch.int64, torch.int32):
        fail(ex, f"return a [n] integer tensor of token ids, got {type(a).__name__} "
                 f"{getattr(a, 'dtype', '')} {tuple(getattr(a, 'shape', ()))}")
    b = call(ex, fn, p, q, 1000, torch.Generator().manual_seed(5), what="speculative_sample (same seed again)")
    if not torch.equal(a, b):
        fail(ex, "two generators with the same seed gave different tokens: draw every random number from the "
                 "`generator` argument (torch.multinomial(..., generator=generator), torch.rand(..., generator=generator))")
    g = torch.Generator().manual_seed(6)
    first = call(ex, fn, p, q, 1000, g, what="speculative_sample (first call)")
    if torch.equal(first, call(ex, fn, p, q, 1000, g, what="speculative_sample (second call)")):
        fail(ex, "two successive calls with the same generator returned the same tokens: you reseed the generator "
                 "inside the function (pitfall 5); seed it once, outside")
    gen = torch.Generator().manual_seed(32)
    for i, (p, q) in enumerate(pairs):
        same = " (p == q: an all-zero residual)" if torch.equal(p, q) else ""
        out = call(ex, fn, p, q, SAMPLES, gen, what=f"speculative_sample on law pair {i}{same}")
        if int(out.min()) < 0 or int(out.max()) >= _V:
            fail(ex, f"law pair {i}: token ids must lie in 0..{_V - 1}, got {int(out.min())}..{int(out.max())}")
        counts = dict(zip(*(t.tolist() for t in out.unique(return_counts=True))))
        fit_test(ex, counts, dict(enumerate(p.tolist())), f"law pair {i}{same}")
    passed(ex, f"{SAMPLES} tokens on each of 3 law pairs follow p, all randomness comes from your generator, and "
               "successive calls differ.")


_P11 = """Write `accept(p_x, q_x)`: the probability of keeping a draft token x that was drawn from q, when the target
gives it probability p_x and the draft q_x > 0. It must work on `Fraction`s (exactly) and floats. The check combines
it with the library's residual and demands P(emit x) = p(x) *exactly* on 42 random law pairs, then samples."""

_S11 = '''from fractions import Fraction

from specdec_lesson.exercises import check_accept


def accept(p_x, q_x):
    """Probability of accepting a draft x ~ q."""
    raise NotImplementedError


check_accept(accept)
'''

_A11 = solve(_S11, '''
    return min(1, p_x / q_x)
''')

_P12 = """Write `residual(p, q)`: the law a rejected step samples from, max(0, p - q) normalised, for two laws given
as lists (of `Fraction`s or floats). Guard the case the notebook calls pitfall 4: when the residual is all zero
(p == q) return p itself instead of dividing 0 by 0."""

_S12 = '''from specdec_lesson.exercises import check_residual


def residual(p, q):
    """max(0, p - q) normalised; p itself when that is all zero."""
    raise NotImplementedError


check_residual(residual)
'''

_A12 = solve(_S12, '''
    r = [max(0, a - b) for a, b in zip(p, q)]
    z = sum(r)
    return [v / z for v in r] if z > 0 else list(p)
''')

_P13 = """Put it together with torch: `speculative_sample(p, q, n, generator)` returns n independent tokens, each
from one speculative step (draft x ~ q, test u * q(x) < p(x) with u uniform, else a token from the residual), for
float64 laws `p`, `q` of shape [V]. Take every random number from `generator`. The check samples 100,000 tokens on
three law pairs and tests them against p; it also calls you twice in a row on one generator."""

_S13 = '''import torch

from specdec_lesson.exercises import check_speculative_sample


def speculative_sample(p, q, n, generator):
    """n tokens [n], each one speculative-sampling step from draft law q for target law p."""
    raise NotImplementedError


check_speculative_sample(speculative_sample)
'''

_A13 = solve(_S13, '''
    x = torch.multinomial(q, n, replacement=True, generator=generator)   # [n] drafts
    u = torch.rand(n, generator=generator, dtype=p.dtype)                # [n]
    accepted = u * q[x] < p[x]                                           # [n]
    r = (p - q).clamp_min(0)                                             # [V] residual
    r = r if bool((r > 0).any()) else p                                  # guard: p == q
    y = torch.multinomial(r, n, replacement=True, generator=generator)  # [n]
    return torch.where(accepted, x, y)
''')

EXERCISES = [
    Exercise("1.1", "the accept test", check_accept, _P11, _S11, _A11),
    Exercise("1.2", "the residual, guarded", check_residual, _P12, _S12, _A12),
    Exercise("1.3", "one speculative step with torch", check_speculative_sample, _P13, _S13, _A13),
]
