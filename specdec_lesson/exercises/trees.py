"""Exercises of notebook 04 (token trees): the sibling rule for distinct children, the sibling rule for i.i.d.
children, the tree attention mask, and how many nodes an adaptive tree should verify.  Ground truth: the exact law
of the first tokens of whole tree runs on toy Markov models (:func:`specdec_lesson.tree.tree_joint`) against the
target's own law (:func:`specdec_lesson.toy.target_joint`), all in Fractions, :func:`specdec_lesson.tree.tree_mask`
and :func:`specdec_lesson.tree.best_node_count`."""

from __future__ import annotations

from fractions import Fraction

import torch

from .. import toy
from ..stats import tv_distance
from ._core import Exercise, call, exact_value, fail, passed, random_laws, solve

__all__ = ["check_distinct_rule", "check_iid_rule", "check_tree_mask", "check_node_count", "EXERCISES"]


def _learner_rules(ex: str, rule: str, accept_fn, reject_fn):
    """The library's FractionRules with ``rule``'s accept / reject replaced by the learner's functions."""
    from ..tree import FractionRules

    class Rules(FractionRules):
        def accept(self, r, q, x, which):
            if which != rule:
                return super().accept(r, q, x, which)
            args = (list(r), x) if rule == "distinct" else (list(r), list(q), x)
            a = exact_value(ex, call(ex, accept_fn, *args, what=f"accept{_args(args)}"), f"accept{_args(args)}")
            if not 0 <= a <= 1:
                fail(ex, f"accept{_args(args)} = {a} is not a probability")
            return a, Fraction(1)

        def reject(self, r, q, x, which):
            if which != rule:
                return super().reject(r, q, x, which)
            args = (list(r), x) if rule == "distinct" else (list(r), list(q))
            out = call(ex, reject_fn, *args, what=f"reject{_args(args)}")
            return tuple(exact_value(ex, v, f"reject{_args(args)}") for v in out)

    return Rules()


def _args(args) -> str:
    return "(" + ", ".join(("(" + ", ".join(map(str, a)) + ")") if isinstance(a, list) else str(a) for a in args) + ")"


def _tree_runs(ex: str, rules, specs: dict) -> None:
    """Exact law of the first 2 tokens of tree runs on two toy Markov pairs against the target's; fails naming the
    tree when they differ."""
    from ..tree import tree_joint

    for seed in (5, 7):
        target, draft = toy.random_markov(3, order=1, seed=seed), toy.random_markov(3, order=1, seed=seed + 1)
        exact = toy.target_joint(target, (0,), 2)
        for name, spec in specs.items():
            law = tree_joint(target, draft, (0,), 2, spec, rules=rules)
            if law != exact:
                fail(ex, f"{name}, toy pair {seed}: the first two tokens of a tree run do not follow the target's law "
                         f"(total variation {tv_distance(law, exact):.4f}; the exact law sums to {sum(law.values())})")


def check_distinct_rule(accept, reject) -> None:
    """Distinct (deterministic) children: ``accept(r, x)`` -> probability of accepting child token x against the
    current residual r, ``reject(r, x)`` -> the residual after rejecting it.  Checked exactly: whole tree runs with
    your rule (top-2/top-3 static trees and an EAGLE-2 dynamic tree, two toy pairs) must emit the target's law of
    the first two tokens, a Fraction equality."""
    ex = "4.1"
    from ..tree import DynamicTree, StaticTree

    _tree_runs(ex, _learner_rules(ex, "distinct", accept, reject),
               {"top-3 children": StaticTree((3,), "topk"), "a (2, 2, 1) top-k tree": StaticTree((2, 2, 1), "topk"),
                "an EAGLE-2 tree": DynamicTree(depth=3, topk=2, num_nodes=4)})
    passed(ex, "trees of distinct children verified with your rule are exact: the law of the first tokens equals "
               "the target's, as Fractions.")


def check_iid_rule(accept, reject) -> None:
    """Children drawn i.i.d. from q: ``accept(r, q, x)`` -> probability of accepting child token x against the
    current residual r, ``reject(r, q)`` -> the residual after rejecting a child.  First compared with the library
    on 40 random exact laws, then whole tree runs with your rule (2 and 3 sampled children, a (2, 1) tree, two toy
    pairs) must emit the target's law of the first two tokens exactly."""
    ex = "4.2"
    from ..tree import FractionRules, StaticTree

    gen, lib = torch.Generator().manual_seed(42), FractionRules()
    for r, q in zip(random_laws(gen, 4, 40), random_laws(gen, 4, 40)):
        x = max(range(4), key=lambda t: q[t])  # a token the draft could have sampled
        want = lib.reject(r, q, x, "iid")
        out = call(ex, reject, list(r), list(q), what=f"reject{_args((list(r), list(q)))}")
        got = tuple(exact_value(ex, v, "reject") for v in out)
        if got != want:
            fail(ex, f"reject{_args((list(r), list(q)))} = {_args((list(got),))}, expected {_args((list(want),))}: the "
                     "next sibling is a fresh draw from q, so it is tested against norm(max(0, r - q)), the chain's "
                     "residual applied again (r itself if that is all zero)")
    _tree_runs(ex, _learner_rules(ex, "iid", accept, reject),
               {"2 sampled children": StaticTree((2,), "sample"), "3 sampled children": StaticTree((3,), "sample"),
                "a (2, 1) sampled tree": StaticTree((2, 1), "sample")})
    passed(ex, "trees of i.i.d. children verified with your multi-round rule are exact (Fraction equality).")


def _random_parents(gen: torch.Generator, n: int) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def check_tree_mask(fn) -> None:
    """``fn(parents)`` -> ``[N, N]`` bool mask, True where node j is node i or one of its ancestors (``parents[0] ==
    -1``, parents precede children); compared with :func:`specdec_lesson.tree.tree_mask` on 60 random trees (1..40
    nodes), chains and stars."""
    ex = "4.3"
    from ..tree import tree_mask

    gen = torch.Generator().manual_seed(43)
    trees = sorted([[-1] + list(range(12)), [-1] + [0] * 9] + [_random_parents(gen, 1 + i % 40) for i in range(60)], key=len)
    for parents in trees:
        want = tree_mask(torch.tensor(parents))  # [N, N]
        got = call(ex, fn, list(parents), what=f"tree_mask({parents})")
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(want.shape) or not torch.equal(got.bool(), want):
            if tuple(got.shape) == tuple(want.shape) and torch.equal(got.bool().T, want):
                why = "you built its transpose: row i is the query node, column j the key node it may see"
            elif got.shape == want.shape and torch.equal(got.bool() | torch.eye(len(parents), dtype=torch.bool), want):
                why = "every node must see itself (the diagonal)"
            else:
                why = "row i must be True at i, its parent, its parent's parent, ... up to the root"
            fail(ex, f"parents {parents}: {why}; expected\n{want.int()}\ngot\n{got.int() if got.dim() == 2 else got}")
    passed(ex, "your masks equal the library's on 62 trees: each node attends to its own path only, so one forward "
               "scores every branch.")


def _node_cases(gen: torch.Generator) -> list[tuple[list[float], list[float], float, float]]:
    """(values best first, T(1..len + 1) in seconds, spent, overhead): 3 built cases (nothing pays, everything pays,
    the best in the middle) and 80 random ones."""
    cases = [([0.02] * 6, [0.015 + 0.002 * k for k in range(7)], 0.0005, 0.001),
             ([0.9, 0.8, 0.7, 0.6], [0.015, 0.0151, 0.0152, 0.0153, 0.0154], 0.0005, 0.001),
             ([0.9, 0.7, 0.4, 0.1, 0.05], [0.015 + 0.0015 * k for k in range(6)], 0.0, 0.0)]
    for _ in range(80):
        m = int(torch.randint(0, 13, (1,), generator=gen))
        vals = sorted((torch.rand(m, generator=gen) ** 2).tolist(), reverse=True)
        steps = (torch.rand(m + 1, generator=gen) * 0.003).tolist()
        t1 = 0.01 + 0.03 * float(torch.rand(1, generator=gen))
        curve = [t1 + sum(steps[1:k + 1]) for k in range(m + 1)]
        cases.append((vals, curve, 0.002 * float(torch.rand(1, generator=gen)), 0.0015 * float(torch.rand(1, generator=gen))))
    return cases


def _rate(vals: list[float], curve: list[float], spent: float, overhead: float, n: int, plus: float = 1.0,
          shift: int = 1) -> float:
    return (plus + sum(vals[:n])) / (spent + curve[min(n + shift, len(curve)) - 1] + overhead)


def check_node_count(fn) -> None:
    """``fn(values, T, spent, overhead)`` -> n: of the nodes whose acceptance ``values`` are given best first, how
    many to verify (0..len(values)) so that the expected tokens per second are highest, when a forward over k tokens
    costs ``T[k - 1]`` seconds, the draft already spent ``spent`` seconds and a step adds ``overhead``.  Compared with
    :func:`specdec_lesson.tree.best_node_count` on 83 cases."""
    ex = "4.4"
    from ..drafters.adaptive_policy import StepCosts
    from ..tree import best_node_count

    cases, answers, first = _node_cases(torch.Generator().manual_seed(44)), [], None
    for vals, curve, spent, overhead in cases:
        want, rate = best_node_count(vals, StepCosts(tuple(curve), 0.0, 0.0, overhead), spent)
        what = f"best_n({[round(v, 3) for v in vals]}, T, {spent:.4f}, {overhead:.4f})"
        got = call(ex, fn, list(vals), list(curve), spent, overhead, what=what)
        if not isinstance(got, int) or isinstance(got, bool) or not 0 <= got <= len(vals):
            fail(ex, f"{what} returned {got!r}: return a whole number of nodes from 0 to {len(vals)}")
        answers.append(got)
        if first is None and got != want and abs(_rate(vals, curve, spent, overhead, got) - rate) > 1e-12 * rate:
            first = (what, vals, curve, spent, overhead, got, want, rate)
    if first is None:
        passed(ex, "your node counts equal the library's on 83 cases: a node is worth its place in the forward when "
                   "its chance of acceptance beats the rate times the time it adds.")
        return

    def argmax(vals, curve, spent, overhead, lo: int = 0, **kw) -> int:
        options = range(min(lo, len(vals)), len(vals) + 1)
        return max(options, key=lambda n: (_rate(vals, curve, spent, overhead, n, **kw), -n))

    wrong = {  # the learner's answers on every case match one of these mistakes
        "a step emits one token of the target's own besides the accepted nodes: the numerator is 1 + the sum":
            [argmax(*c, plus=0.0) for c in cases],
        "the target scores the root as well: n nodes cost a forward over 1 + n tokens, T[n]":
            [argmax(*c, shift=0) for c in cases],
        "n = 0 (a plain step) is allowed: when no node pays for its place in the forward, verify none":
            [argmax(*c, lo=1) for c in cases],
        "not every node pays: a node is worth verifying only when its value beats the rate times the time it adds":
            [len(c[0]) for c in cases],
    }
    why = next((w for w, ans in wrong.items() if ans == answers),
               "try every n from 0 to len(values) and keep the best rate (1 + sum of the first n) / (spent + T(1 + n) "
               "+ overhead)")
    what, vals, curve, spent, overhead, got, want, rate = first
    fail(ex, f"{what} with T(1..) = {[round(1e3 * t, 2) for t in curve]} ms: you chose n = {got}, the best is "
             f"n = {want} ({rate:.1f} tokens/s against {_rate(vals, curve, spent, overhead, got):.1f}); {why}")


_ACCEPT, _REJECT = '    raise NotImplementedError("accept")\n', '    raise NotImplementedError("reject")\n'

_P41 = """Children chosen deterministically (top-k of the draft, an EAGLE-2 tree) are distinct tokens, each a
proposal with a one-hot q. At a node, siblings are tried in order against a residual r (starting at the target's
law p). Write `accept(r, x)`, the probability of accepting child token x, and `reject(r, x)`, the residual after
it is rejected. The check runs whole trees with your rule and demands the target's exact law of the first tokens."""

_S41 = '''from specdec_lesson.exercises import check_distinct_rule


def accept(r, x):
    """Probability of accepting the distinct child token x against residual r."""
    raise NotImplementedError("accept")


def reject(r, x):
    """The residual after rejecting distinct child token x."""
    raise NotImplementedError("reject")


check_distinct_rule(accept, reject)
'''

_A41 = solve(solve(_S41, '''
    return r[x]                      # min(1, r(x) / q(x)) with q one-hot on x
''', _ACCEPT), '''
    w = list(r)
    w[x] = 0                         # x is ruled out; the rest keeps its proportions
    z = sum(w)
    return [v / z for v in w] if z > 0 else list(r)
''', _REJECT)

_P42 = """Children sampled i.i.d. from the draft's law q (`StaticTree(..., "sample")`) need the other rule. Write
`accept(r, q, x)`, the probability of accepting a child token x against the current residual r, and `reject(r, q)`,
the residual the next sibling is tested against after a rejection (guard an all-zero residual: return r). The check
compares with the library on random laws, then runs whole sampled trees with your rule, exactly."""

_S42 = '''from specdec_lesson.exercises import check_iid_rule


def accept(r, q, x):
    """Probability of accepting an i.i.d. child token x against residual r."""
    raise NotImplementedError("accept")


def reject(r, q):
    """The residual the next i.i.d. sibling is tested against."""
    raise NotImplementedError("reject")


check_iid_rule(accept, reject)
'''

_A42 = solve(solve(_S42, '''
    return min(1, r[x] / q[x])
''', _ACCEPT), '''
    w = [max(0, a - b) for a, b in zip(r, q)]
    z = sum(w)
    return [v / z for v in w] if z > 0 else list(r)
''', _REJECT)

_P43 = """The target scores every node of a tree in one forward; node i may attend to the cached prefix, to its
ancestors and to itself, never to another branch. Write `tree_mask(parents)`: for a list of parent indices
(`parents[0] == -1` for the root, parents before children) the `[N, N]` bool tensor, True at `[i, j]` when node j
is node i or one of its ancestors."""

_S43 = '''import torch

from specdec_lesson.exercises import check_tree_mask


def tree_mask(parents):
    """[N, N] bool: node j is node i or an ancestor of node i."""
    raise NotImplementedError


check_tree_mask(tree_mask)
'''

_A43 = solve(_S43, '''
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)        # every node sees itself
    for i in range(1, n):
        mask[i] |= mask[parents[i]]               # ... and whatever its parent sees
    return mask
''')

_P44 = """An adaptive tree (section 8) values each candidate node by the chance its whole path is accepted, sorts the
nodes best first, and verifies the n best. Write `best_n(values, T, spent, overhead)` returning that n, from 0 (a
plain step) to `len(values)`: the one maximising the expected tokens per second, (1 + the sum of the first n values)
over (spent + T(1 + n) + overhead), where `T[k - 1]` is the seconds of a forward over k tokens (the root and n nodes)
and 1 counts the token the target always adds. The check compares with `tree.best_node_count` on 83 cases."""

_S44 = '''from specdec_lesson.exercises import check_node_count


def best_n(values, T, spent, overhead):
    """How many of the best-first nodes to verify (0..len(values)) for the most tokens per second."""
    raise NotImplementedError


check_node_count(best_n)
'''

_A44 = solve(_S44, '''
    def rate(n):
        return (1 + sum(values[:n])) / (spent + T[n] + overhead)   # T[n] = T(1 + n)

    return max(range(len(values) + 1), key=lambda n: (rate(n), -n))
''')

EXERCISES = [
    Exercise("4.1", "the sibling rule for distinct children", check_distinct_rule, _P41, _S41, _A41),
    Exercise("4.2", "the sibling rule for i.i.d. children", check_iid_rule, _P42, _S42, _A42),
    Exercise("4.3", "the tree attention mask", check_tree_mask, _P43, _S43, _A43),
    Exercise("4.4", "how many nodes pay for their place", check_node_count, _P44, _S44, _A44),
]
