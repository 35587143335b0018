"""What every exercise shares: the :class:`Exercise` record, the pass and fail messages, calling the learner's
code, and the chi-square test behind the statistical checks.

A check takes the learner's function (or number) and either prints ``Exercise N.M passed: ...`` or raises ONE
``AssertionError`` that starts with ``Exercise N.M:`` and says what is wrong.  A learner's function that raises is
reported the same way (an AssertionError naming the input it failed on), so a notebook cell always ends in one of
the two messages.

Statistical checks use the Pearson chi-square test of :mod:`specdec_lesson.stats` at level :data:`LEVEL` (1e-4)
with a fixed seed: a correct answer fails with probability 1e-4 over seeds (with the fixed seed it passes every
time once it has passed), and :func:`detectable_tv` gives the total-variation bias each check detects with power
0.99 (``stats.chi_square_power`` against ``stats.min_noncentrality``, the least favourable bias of that size); each
check's docstring states it and ``tests/test_exercises.py`` recomputes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import NoReturn

import torch

from ..stats import chi_square_power, chi_square_test, min_noncentrality

__all__ = ["Exercise", "LEVEL", "POWER", "passed", "fail", "call", "fit_test", "detectable_tv", "random_laws",
           "exact_value", "solve"]

LEVEL = 1e-4  # false-alarm rate of every statistical check
POWER = 0.99  # the power the docstrings' detectable biases are computed at


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``id`` "N.M" (notebook N, M-th exercise), ``title``, ``check`` (the grader), and as data the
    markdown ``prompt``, the ``starter`` cell a learner fills in and the ``solution`` cell (the notebooks carry
    the solution, followed by the check call; :mod:`specdec_lesson.exercises.insert` writes them)."""

    id: str
    title: str
    check: Callable
    prompt: str
    starter: str
    solution: str


def solve(starter: str, body: str, placeholder: str = "    raise NotImplementedError\n") -> str:
    """The solution cell: ``starter`` with its one ``placeholder`` replaced by ``body`` (a leading newline of
    ``body`` is dropped, so it can start on its own line)."""
    if starter.count(placeholder) != 1:
        raise ValueError(f"the starter must hold the placeholder {placeholder!r} exactly once")
    return starter.replace(placeholder, body[1:] if body.startswith("\n") else body)


def passed(ex_id: str, text: str) -> None:
    print(f"Exercise {ex_id} passed: {text}")


def fail(ex_id: str, text: str) -> NoReturn:
    raise AssertionError(f"Exercise {ex_id}: {text}")


def call(ex_id: str, fn: Callable, *args, what: str, **kw):
    """``fn(*args, **kw)``; an exception becomes an AssertionError that names the call (``what``)."""
    if not callable(fn):
        fail(ex_id, f"expected a function, got {type(fn).__name__} {fn!r}")
    try:
        return fn(*args, **kw)
    except NotImplementedError:
        fail(ex_id, "not written yet: replace `raise NotImplementedError` with your code")
    except AssertionError:
        raise
    except Exception as exc:  # the learner's bug, reported as the check's failure
        fail(ex_id, f"{what} raised {type(exc).__name__}: {exc}")


def fit_test(ex_id: str, counts: dict, law: dict, what: str) -> tuple[float, float]:
    """Pearson chi-square of ``counts`` against ``law`` at :data:`LEVEL`; returns ``(p_value, tv)`` or fails with
    the empirical total-variation distance."""
    n = sum(counts.values())
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - float(law.get(k, 0))) for k in set(counts) | set(law))
    stat, dof, p_value = chi_square_test(counts, law)
    if p_value < LEVEL:
        fail(ex_id, f"{what}: the samples do not follow the law they should (chi-square {stat:.1f} on {dof} degrees of "
                    f"freedom, p-value {p_value:.1e} < {LEVEL:g}; total variation {tv:.4f} over {n} samples)")
    return p_value, tv


def detectable_tv(n: int, dof: int, level: float = LEVEL, power: float = POWER) -> float:
    """The smallest total-variation bias a chi-square test on ``n`` samples and ``dof`` degrees of freedom detects
    with probability ``power`` at ``level``, whatever its shape (bisection on the power against the least favourable
    alternative, lambda = 4 n tv^2)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if chi_square_power(n, dof, min_noncentrality(n, mid), level) >= power else (mid, hi)
    return hi


def random_laws(generator: torch.Generator, vocab: int, count: int, zeros: bool = True) -> list[tuple[Fraction, ...]]:
    """``count`` exact laws over ``vocab`` tokens, proportional to random integers in 0..6 (1..6 without zeros)."""
    out = []
    while len(out) < count:
        w = torch.randint(0 if zeros else 1, 7, (vocab,), generator=generator).tolist()
        if sum(w):
            out.append(tuple(Fraction(v, sum(w)) for v in w))
    return out


def exact_value(ex_id: str, value, what: str) -> Fraction:
    """``value`` as a Fraction if it is exact (int, Fraction, a sympy rational); a float fails (not exact)."""
    if value is None:
        fail(ex_id, f"{what} is None: not answered yet")
    if isinstance(value, bool):
        fail(ex_id, f"{what} returned a bool, {value!r}: return a number")
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if type(value).__module__.startswith("sympy") and getattr(value, "is_Rational", False):
        return Fraction(int(value.p), int(value.q))
    fail(ex_id, f"{what} returned {value!r} ({type(value).__name__}): with Fraction inputs return an exact value "
                "(Fraction arithmetic only: no float(), no math.pow, no numpy)")
