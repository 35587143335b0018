"""Lossless verification of a token tree: multi-round speculative sampling over siblings.

Notation (Leviathan): p = target law, q = draft law.  The walk starts at the root (the pending
token) with the residual r = p(root).  At a node, its children x_1, x_2, ... are tried in order:

* accept x_i with probability min(1, r(x_i) / q(x_i)) (``u * q(x_i) < r(x_i)``, no division);
  on acceptance move to x_i and restart with r = p(x_i);
* on rejection update the residual (the *sibling rule*, see below) and try the next sibling;
* if every child is rejected, emit a token from r; at a leaf (after accepting it), emit the
  bonus token from p(leaf).

Two sibling rules keep the output law exactly the target's (SpecInfer, Miao et al. 2024):

* ``"iid"`` - the children were drawn i.i.d. from q (the draft's sampling law at the parent):
  after a rejected sibling ``r <- norm(max(0, r - q))``, the residual of chain speculative
  sampling applied again, because the next sibling is a fresh draw from the same q.
* ``"distinct"`` - the children are distinct tokens chosen deterministically (top-k of the
  draft, a dynamic EAGLE-2 tree, greedy drafting): each child is a proposal with a one-hot
  q = delta(x_i), so it is accepted with probability r(x_i) and on rejection
  ``r <- norm(r with r(x_i) = 0)``: the rejected child is removed from p and p renormalised.

Using the ``"iid"`` update on distinct children (or no update at all) is *not* exact; the tests
and notebook 04 measure the bias.  The walk is written once (:func:`walk_tree`) and driven by
either torch tensors and random numbers (:func:`verify_tree`) or exact ``Fraction`` laws whose
every branch is enumerated (:func:`tree_outcome_law`), so the exact tests check the very code
that samples.  Trees hold one sequence (batch size 1).

Precision: as in chain verification (:mod:`specdec_lesson.verify`), the laws are upcast to fp32
(fp64 when one is fp64; bf16 / fp16 laws renormalised in fp32) and the random numbers are drawn
in that precision, whatever the laws' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

import torch

from ..verify import HALF_DTYPES, as_verify_law, draw_verify_randoms, race_sample, verify_dtype

__all__ = [
    "RULES", "TorchRules", "FractionRules", "walk_tree", "verify_tree", "verify_tree_from_randoms",
    "verify_tree_greedy", "tree_outcome_law",
]

RULES = ("iid", "distinct")


def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"sibling rule must be one of {RULES}, got {rule!r}")


class TorchRules:
    """The sibling rules on torch laws ``[V]`` (one node's residual r and draft law q)."""

    def accept(self, r: torch.Tensor, q: torch.Tensor | None, x: int, rule: str) -> tuple[float, float]:
        """(numerator, denominator) of the acceptance probability min(1, num / den)."""
        if rule == "iid":
            return float(r[x]), float(q[x])
        return float(r[x]), 1.0

    def reject(self, r: torch.Tensor, q: torch.Tensor | None, x: int, rule: str) -> torch.Tensor:
        """The residual after rejecting child token ``x``."""
        if rule == "iid":
            w = (r - q).clamp_min(0)  # [V] max(0, r - q)
        else:
            w = r.clone()  # [V]
            w[x] = 0
        z = w.sum()
        # an all-zero residual is unreachable (a rejection needs r(x) < q(x)); guard 0/0 anyway
        return w / z if float(z) > 0 else r


class FractionRules:
    """The same rules on exact laws (tuples of ``Fraction``)."""

    def accept(self, r: Sequence[Fraction], q: Sequence[Fraction] | None, x: int, rule: str) -> tuple[Fraction, Fraction]:
        return (r[x], q[x]) if rule == "iid" else (r[x], Fraction(1))

    def reject(self, r, q, x: int, rule: str) -> tuple[Fraction, ...]:
        if rule == "iid":
            w = [max(Fraction(0), a - b) for a, b in zip(r, q)]
        else:
            w = list(r)
            w[x] = Fraction(0)
        z = sum(w)
        return tuple(v / z for v in w) if z > 0 else tuple(r)


def walk_tree(tree, p_of: Callable, q_of: Callable, rule: str, rules, decide: Callable) -> tuple[list[int], object]:
    """Walk ``tree`` from the root; returns ``(accepted node ids (root excluded), law to emit from)``.

    ``p_of(v)`` / ``q_of(v)``: the target's law after node v / the draft law v's children were
    drawn from; ``rules``: :class:`TorchRules` or :class:`FractionRules`; ``decide(child, num,
    den)`` -> bool says whether ``child`` is accepted (probability min(1, num / den))."""
    v, path = 0, []
    while True:
        kids = tree.children[v]
        r = p_of(v)
        if not kids:
            return path, r  # bonus token from p(leaf)
        q = q_of(v) if rule == "iid" else None
        for c in kids:
            x = tree.tokens[c]
            num, den = rules.accept(r, q, x, rule)
            if decide(c, num, den):
                path.append(c)
                v = c
                break
            r = rules.reject(r, q, x, rule)
        else:
            return path, r  # every child rejected: emit from the residual


def _tree_dtype(tree, target_probs: torch.Tensor) -> torch.dtype:
    return verify_dtype(target_probs.dtype, *(q.dtype for q in tree.draft_probs.values()))


def _draft_laws(tree, dtype: torch.dtype) -> dict:
    """``tree.draft_probs`` in the verification precision; half-precision laws of one dtype are
    renormalised all at once (one stacked op instead of a few per node)."""
    laws = tree.draft_probs
    dtypes = {q.dtype for q in laws.values()}
    if len(dtypes) == 1 and dtypes <= set(HALF_DTYPES):
        keys = list(laws)
        return dict(zip(keys, as_verify_law(torch.stack([laws[v] for v in keys]), dtype).unbind(0)))  # [M, V] rows
    return {v: as_verify_law(q, dtype) for v, q in laws.items()}


def verify_tree_from_randoms(
    tree, target_probs: torch.Tensor, uniforms: torch.Tensor, exponentials: torch.Tensor, rule: str | None = None,
    rules: TorchRules | None = None,
) -> tuple[list[int], int]:
    """Deterministic core of :func:`verify_tree`: ``uniforms [N]`` (one per node, used when
    that node is tried as a child) and ``exponentials [V]`` (the emitted token's race).

    ``target_probs [N, V]``: row v is the target's law after node v (node 0 = root).  The laws
    (``target_probs`` and ``tree.draft_probs``) are used in fp32 / fp64
    (:func:`specdec_lesson.verify.as_verify_law`)."""
    rule = tree.rule if rule is None else rule
    _check_rule(rule)
    if rule == "iid" and any(tree.children[v] and v not in tree.draft_probs for v in range(tree.size)):
        raise ValueError("the 'iid' rule needs tree.draft_probs for every node with children")
    for name, t in (("uniforms", uniforms), ("exponentials", exponentials)):
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} must be fp32 or fp64 (half-precision random numbers are biased), got {t.dtype}")
    dtype = _tree_dtype(tree, target_probs)
    target_probs = as_verify_law(target_probs, dtype)  # [N, V]
    u = uniforms.tolist()

    def decide(c: int, num: float, den: float) -> bool:
        return u[c] * den < num

    rules = TorchRules() if rules is None else rules
    draft_laws = _draft_laws(tree, dtype) if rule == "iid" else {}
    path, law = walk_tree(tree, lambda v: target_probs[v], lambda v: draft_laws[v], rule, rules, decide)
    return path, int(race_sample(law, exponentials))


def verify_tree(
    tree, target_probs: torch.Tensor, generator: torch.Generator | None = None, rule: str | None = None,
    rules: TorchRules | None = None,
) -> tuple[list[int], int]:
    """Verify ``tree`` against ``target_probs [N, V]`` (row v: target law after node v).

    Returns ``(accepted node ids along one root-to-node path, root excluded; next token)``.
    ``rule``: ``"iid"`` (siblings drawn i.i.d. from q: residual ``norm(max(0, r - q))`` after
    each rejected sibling) or ``"distinct"`` (deterministic children such as top-k: remove each
    rejected child from r and renormalise); default ``tree.rule``.  Randomness: one uniform per
    node and one exponential race for the emitted token, all from ``generator``, in fp32 (fp64
    for fp64 laws) whatever the laws' dtype.  ``rules`` swaps the rule implementation (tests and
    notebook 04 use it to show a wrong update failing)."""
    N, V = target_probs.shape
    if N != tree.size:
        raise ValueError(f"target_probs has {N} rows for a tree of {tree.size} nodes")
    uniforms, expo = draw_verify_randoms(1, N, V, device=target_probs.device, dtype=_tree_dtype(tree, target_probs),
                                         generator=generator)  # [1, N], [1, V]
    return verify_tree_from_randoms(tree, target_probs, uniforms[0], expo[0], rule, rules)


def verify_tree_greedy(tree, target_argmax: Sequence[int]) -> tuple[list[int], int]:
    """Greedy verification: follow the children equal to the target's argmax as deep as they
    go; the next token is the target's argmax after the last accepted node.

    ``target_argmax``: one token per node (node 0 = root).  This is the longest root-to-node
    path whose every token equals the target's greedy choice (children of a node are
    distinct under greedy drafting, so the path is unique)."""
    v, path = 0, []
    while True:
        want = target_argmax[v]
        nxt = next((c for c in tree.children[v] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, int(want)
        path.append(nxt)
        v = nxt


class _NeedDecision(Exception):
    pass


class _Script:
    """Replays a fixed sequence of accept/reject decisions and multiplies their probabilities."""

    def __init__(self, decisions: tuple[bool, ...]) -> None:
        self.decisions, self.step, self.weight = decisions, 0, Fraction(1)

    def __call__(self, c: int, num, den) -> bool:
        a = min(Fraction(1), Fraction(num) / Fraction(den))
        if self.step == len(self.decisions):
            raise _NeedDecision(a)
        take = self.decisions[self.step]
        self.step += 1
        self.weight *= a if take else 1 - a
        return take


def tree_outcome_law(tree, p_of: Callable, q_of: Callable, rule: str | None = None, rules=None) -> dict:
    """Exact law of one verification's outcome: ``{(accepted node ids, next token): Fraction}``.

    Enumerates every accept / reject branch of :func:`walk_tree` (depth-first over decision
    sequences, re-running the walk), with ``p_of`` / ``q_of`` returning ``Fraction`` laws."""
    rule = tree.rule if rule is None else rule
    _check_rule(rule)
    rules = FractionRules() if rules is None else rules
    out: dict[tuple[tuple[int, ...], int], Fraction] = {}
    stack: list[tuple[bool, ...]] = [()]
    while stack:
        script = _Script(stack.pop())
        try:
            path, law = walk_tree(tree, p_of, q_of, rule, rules, script)
        except _NeedDecision as need:
            a = need.args[0]
            stack += [script.decisions + (True,)] if a > 0 else []
            stack += [script.decisions + (False,)] if a < 1 else []
            continue
        for y, py in enumerate(law):
            if py:
                key = (tuple(path), y)
                out[key] = out.get(key, Fraction(0)) + script.weight * py
    return out
