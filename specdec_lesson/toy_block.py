"""Exact enumeration of one speculative step under a chosen verification rule, on toy models.

:func:`specdec_lesson.toy.speculative_step_law` walks Leviathan's token-level rule, stopping at
the first rejection.  Block verification (:mod:`specdec_lesson.verify.block`) decides after
seeing the whole block, so here every drafted block X_1..X_K (probability prod_i q_i(X_i)) is
enumerated and handed to a *verifier*: a function ``(p_laws, q_laws, drafts) -> {(tau,
next_token): Fraction}`` giving the exact law of the outcome, :func:`block_outcome_law` or
:func:`token_outcome_law` (the same rule as ``toy.speculative_step_law``, as a function of the
drafts).  The step emits ``X_1..X_tau, next_token``.  On top of that:

* :func:`verified_joint`: the exact joint law of the first n emitted tokens (steps repeat);
  losslessness of a rule is ``verified_joint(...) == toy.target_joint(...)``, an equality of
  Fractions;
* :func:`expected_accepted`: E[tau] of one step from a context, exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import cache

from .toy import MarkovLM, compose_steps, process_law
from .verify import block_outcome_law, token_outcome_law

__all__ = ["VERIFIERS", "verified_step_outcomes", "verified_step_law", "verified_joint", "expected_accepted"]

VERIFIERS: dict[str, Callable] = {"token": token_outcome_law, "block": block_outcome_law}


def _verifier(verify) -> Callable:
    if callable(verify):
        return verify
    if verify not in VERIFIERS:
        raise ValueError(f"verify must be one of {tuple(VERIFIERS)} or a callable, got {verify!r}")
    return VERIFIERS[verify]


def verified_step_outcomes(target: MarkovLM, draft: MarkovLM, context: Sequence[int], k: int, temperature=1,
                           top_k=None, top_p=None, verify="block") -> dict:
    """Exact law ``{(drafts, tau, next_token): Fraction}`` of one step after ``context``: the drafts
    X_1..X_K from the processed q, then the verifier's outcome law given them."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    rule = _verifier(verify)
    proc = lambda law: process_law(law, temperature, top_k, top_p)  # noqa: E731
    ctx0 = tuple(context)
    out: dict[tuple, Fraction] = {}

    def walk(drafted: tuple[int, ...], q_laws: list, weight: Fraction) -> None:
        if len(drafted) == k:
            p_laws = [proc(target.next_law(ctx0 + drafted[:i])) for i in range(k + 1)]
            for (tau, y), pr in rule(p_laws, q_laws, drafted).items():
                key = (drafted, tau, y)
                out[key] = out.get(key, Fraction(0)) + weight * pr
            return
        q = proc(draft.next_law(ctx0 + drafted))
        for x, qx in enumerate(q):
            if qx:
                walk(drafted + (x,), q_laws + [q], weight * qx)

    walk((), [], Fraction(1))
    return out


def verified_step_law(target: MarkovLM, draft: MarkovLM, context: Sequence[int], k: int, horizon: int, temperature=1,
                      top_k=None, top_p=None, verify="block") -> dict:
    """Exact law ``{block: Fraction}`` of the tokens one step emits, cut to the first ``horizon``."""
    out: dict[tuple[int, ...], Fraction] = {}
    for (drafted, tau, y), pr in verified_step_outcomes(target, draft, context, k, temperature, top_k, top_p, verify).items():
        block = (drafted[:tau] + (y,))[:horizon]
        out[block] = out.get(block, Fraction(0)) + pr
    return out


def verified_joint(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, k: int, temperature=1,
                   top_k=None, top_p=None, verify="block") -> dict:
    """Exact law of the first ``n`` tokens emitted by speculative decoding with rule ``verify``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    @cache
    def step(context: tuple[int, ...], horizon: int) -> dict:
        return verified_step_law(target, draft, context, k, horizon, temperature, top_k, top_p, verify)

    return compose_steps(step, prompt, n)


def expected_accepted(target: MarkovLM, draft: MarkovLM, context: Sequence[int], k: int, temperature=1, top_k=None,
                      top_p=None, verify="block") -> Fraction:
    """E[number of accepted drafts] of one step after ``context``, exactly."""
    outcomes = verified_step_outcomes(target, draft, context, k, temperature, top_k, top_p, verify)
    return sum((pr * tau for (_, tau, _), pr in outcomes.items()), Fraction(0))
