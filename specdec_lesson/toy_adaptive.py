"""Exact enumeration of speculative decoding under a policy that picks each step's drafts, on toy models.

:func:`specdec_lesson.toy.speculative_joint` fixes K.  Here a *policy* decides, before each draft token is
drawn, whether to draft it at all, from its memory of the past steps and from the draft's law at that position
(the draft's confidence); K = 0 is a plain step.  The output law stays the target's for EVERY such policy: at
each position the token emitted is either an accepted draft, the residual after a rejection, or (when the policy
stopped drafting) a plain draw from p, and in each case its law given the past is p, because the decision to draft
is made from quantities fixed before the draft is drawn.  A policy that looks at the drawn token before deciding
to keep it (:class:`PeekingPolicy`) proposes from a law other than the q the verifier is told, and is biased.

A policy here is an object with (memory is any value the enumerator carries from step to step, never mutated):

* ``initial() -> memory``;
* ``decide(memory, context, drafted, laws) -> bool``: draft position ``len(drafted) + 1``?  ``laws`` are the
  draft's laws at positions 1..len(drafted)+1 (the last is the one about to be drawn from);
* ``keep(memory, context, drafted, laws, x) -> bool`` (optional, default True): keep the drawn token x?  Only a
  peeking (inexact) policy says no;
* ``update(memory, laws, accepted, rejected) -> memory``: after a step with ``accepted`` drafts passed and a
  rejection at the next one (``rejected``) or none; ``laws`` as in the last ``decide`` of the step.

:func:`adaptive_joint` returns the exact law (``Fraction``s) of the first n tokens; exactness is
``adaptive_joint(...) == toy.target_joint(...)``.  :class:`PolicyAdapter` runs the real
:class:`~specdec_lesson.drafters.adaptive_policy.SpeculationPolicy` (the one ``AdaptiveDrafter`` uses) through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from .drafters.adaptive_policy import SpeculationPolicy
from .toy import MarkovLM, process_law

__all__ = ["adaptive_joint", "PolicyAdapter", "ThresholdPolicy", "PeekingPolicy"]

Law = tuple[Fraction, ...]


def adaptive_joint(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, policy, temperature=1,
                   proposals: Counter | None = None) -> dict:
    """Exact law ``{tuple: Fraction}`` of the first ``n`` tokens emitted under ``policy`` (module docstring).
    ``proposals``, when given, counts the steps enumerated per number of drafts verified (K; a step rejected at
    depth j counts as K = j, the drafts past a rejection being irrelevant to the output)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    proc = lambda law: process_law(law, temperature)  # noqa: E731
    keep = getattr(policy, "keep", None)
    out: dict[tuple[int, ...], Fraction] = {}

    def add(seq: tuple[int, ...], w: Fraction) -> None:
        out[seq[:n]] = out.get(seq[:n], Fraction(0)) + w

    def run(emitted: tuple[int, ...], memory, w: Fraction) -> None:
        if len(emitted) >= n:
            return add(emitted, w)
        walk(tuple(prompt) + emitted, emitted, memory, (), [], w)

    def end(emitted, memory, drafted, laws, p, w) -> None:
        """The step ends after ``drafted`` were accepted: a plain draw from p at the next position."""
        if proposals is not None:
            proposals[len(drafted)] += 1
        new = policy.update(memory, laws, len(drafted), False)
        for y, py in enumerate(p):
            if py:
                run(emitted + drafted + (y,), new, w * py)

    def walk(ctx, emitted, memory, drafted: tuple[int, ...], laws: list[Law], w: Fraction) -> None:
        if len(emitted) + len(drafted) >= n:  # the first n tokens are out: the rest of the step sums to 1
            return add(emitted + drafted, w)
        p = proc(target.next_law(ctx + drafted))
        q = proc(draft.next_law(ctx + drafted))
        seen = laws + [q]
        if not policy.decide(memory, ctx, drafted, seen):
            return end(emitted, memory, drafted, seen, p, w)
        residual = [max(Fraction(0), a - b) for a, b in zip(p, q)]
        z = sum(residual)
        for x, qx in enumerate(q):
            if not qx:
                continue
            if keep is not None and not keep(memory, ctx, drafted, seen, x):  # dropped after looking at it
                end(emitted, memory, drafted, seen, p, w * qx)
                continue
            acc = min(Fraction(1), p[x] / qx)
            if acc:
                walk(ctx, emitted, memory, drafted + (x,), seen, w * qx * acc)
            if acc < 1:  # rejection: p(x) < q(x), so z > 0
                if proposals is not None:
                    proposals[len(drafted) + 1] += 1
                new = policy.update(memory, seen, len(drafted), True)
                for y, r in enumerate(residual):
                    if r:
                        run(emitted + drafted + (y,), new, w * qx * (1 - acc) * r / z)

    run((), policy.initial(), Fraction(1))
    return out


class PolicyAdapter:
    """The real :class:`SpeculationPolicy` as an enumerator policy (one row, the draft's source): memory is a
    copy of the policy; each decision replays the step's earlier ones (``start``, then ``keep_going`` per
    position with the confidence max q), exactly the calls ``AdaptiveDrafter`` makes."""

    def __init__(self, policy: SpeculationPolicy, kcap: int | None = None) -> None:
        self.policy, self.kcap = policy, kcap if kcap is not None else policy.k_max

    def initial(self) -> SpeculationPolicy:
        return self.policy.copy()

    def _replay(self, memory: SpeculationPolicy, laws: Sequence[Law]) -> tuple[SpeculationPolicy, bool]:
        pol, go = memory.copy(), True
        if pol.start(self.kcap, ["draft"]) == 0:  # a plain step: nothing is drafted
            go = len(laws) > 1
            if go:
                raise RuntimeError("the enumerator drafted in a plain step: decide was not consulted")
        for i, q in enumerate(laws if go else []):
            if not go:
                raise RuntimeError("the enumerator drafted past a stop: decide was not consulted")
            go = pol.keep_going(i, [float(max(q))])
        return pol, go

    def decide(self, memory, context, drafted, laws) -> bool:
        return self._replay(memory, laws)[1]

    def update(self, memory, laws, accepted: int, rejected: bool) -> SpeculationPolicy:
        pol, go = memory.copy(), True
        planned = pol.start(self.kcap, ["draft"]) > 0
        for i, q in enumerate(laws):
            if not (planned and go):
                break
            go = pol.keep_going(i, [float(max(q))])
        pol.finish(accepted + 1 if rejected else accepted, [accepted])
        return pol


class ThresholdPolicy:
    """A hand-written exact policy: plan K = min(k_max, accepted in the last step + 1) (K = 0 after a step that
    drafted and accepted nothing), and draft position j+1 only while the draft's top probability there is at
    least ``threshold``.  Memory: the last step's (K, accepted)."""

    def __init__(self, k_max: int = 3, threshold: Fraction = Fraction(1, 2)) -> None:
        self.k_max, self.threshold = k_max, Fraction(threshold)

    def initial(self) -> tuple[int, int]:
        return (1, 1)

    def decide(self, memory, context, drafted, laws) -> bool:
        last_k, last_acc = memory
        plan = 0 if last_k > 0 and last_acc == 0 else min(self.k_max, last_acc + 1)
        return len(drafted) < plan and max(laws[-1]) >= self.threshold

    def update(self, memory, laws, accepted: int, rejected: bool) -> tuple[int, int]:
        return (accepted + int(rejected), accepted)


class PeekingPolicy:
    """The bug: draft up to ``k`` tokens but keep a drawn token x only if q(x) >= ``threshold`` (looked at AFTER
    drawing it), ending the step there otherwise.  The verifier is told q while the proposal follows q restricted
    to the kept tokens, so the output law is biased."""

    def __init__(self, k: int = 2, threshold: Fraction = Fraction(1, 3)) -> None:
        self.k, self.threshold = k, Fraction(threshold)

    def initial(self) -> None:
        return None

    def decide(self, memory, context, drafted, laws) -> bool:
        return len(drafted) < self.k

    def keep(self, memory, context, drafted, laws, x: int) -> bool:
        return laws[-1][x] >= self.threshold

    def update(self, memory, laws, accepted: int, rejected: bool) -> None:
        return None
