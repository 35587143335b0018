"""Exercises of notebook 06 (the latency simulator): the acceptance a speedup needs, the batch where speculation
stops paying, the tokens per step of a tree, and a Monte Carlo run with an explicit generator.  Ground truth:
:func:`specdec_lesson.theory.speedup`, :func:`specdec_lesson.sim.speedup_curve`,
:func:`specdec_lesson.sim.tree_expected_tokens` and :func:`specdec_lesson.stats.truncated_geometric`."""

from __future__ import annotations

import torch

from ..sim import HARDWARE, speedup_curve, tree_expected_tokens
from ..stats import truncated_geometric
from ..theory import expected_tokens, speedup
from ._core import Exercise, call, detectable_tv, fail, fit_test, passed, solve

__all__ = ["check_alpha_needed", "check_last_batch", "check_tree_tokens", "check_simulation", "STEPS", "EXERCISES"]

STEPS = 50_000  # simulated steps per statistical test


def alpha_needed(goal: float, k: int, c: float, verify_ratio: float) -> float | None:
    """Smallest alpha with speedup(alpha, k, c, verify_ratio) >= goal (bisection: S grows with alpha), or None."""
    if speedup(1.0, k, c, verify_ratio) < goal:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if speedup(mid, k, c, verify_ratio) >= goal else (mid, hi)
    return hi


def check_alpha_needed(fn) -> None:
    """``fn(goal, k, c, verify_ratio)`` -> the smallest alpha whose speedup ``E[tokens] / (k c + verify_ratio)``
    reaches ``goal``, or None; compared (1e-6) with :func:`alpha_needed` on 160 cases (goals 1.5 to 3.5, K = 1..8,
    c = 0.02..0.3, verify ratios 1 and 1.3), some unreachable."""
    ex = "6.1"
    for goal in (1.5, 2.0, 2.5, 3.5):
        for k in (1, 2, 4, 8):
            for c in (0.02, 0.05, 0.1, 0.3):
                for ratio in (1.0, 1.3):
                    want = alpha_needed(goal, k, c, ratio)
                    got = call(ex, fn, goal, k, c, ratio, what=f"alpha_needed({goal}, k={k}, c={c}, verify_ratio={ratio})")
                    if want is None and got is not None:
                        fail(ex, f"goal {goal}x with K = {k}, c = {c}, verify ratio {ratio}: even alpha = 1 gives only "
                                 f"{speedup(1.0, k, c, ratio):.3f}x (K + 1 tokens per step), so return None; got {got!r}")
                    if want is not None and (not isinstance(got, (int, float)) or abs(got - want) > 1e-6):
                        fail(ex, f"goal {goal}x with K = {k}, c = {c}, verify ratio {ratio}: expected alpha {want:.6f}, "
                                 f"got {got!r} (speedup = E[tokens](alpha, K) / (K c + verify_ratio))")
    a = alpha_needed(2.5, 4, 0.05, 1.0)
    passed(ex, f"2.5x with K = 4, c = 0.05 on an ideal verify step needs alpha >= {a:.3f}; the same with a verify step "
               f"30% dearer needs {alpha_needed(2.5, 4, 0.05, 1.3):.3f}.")


def _worth(hw, alpha: float, batch: int, context: int) -> bool:
    return max(speedup_curve(hw, "Llama-3-8B", "Llama-3.2-1B", alpha, k_max=8, batch=batch, context=context)[0]) > 1.0


def last_batch_worth_it(hardware, alpha: float, context: int, max_batch: int = 1024) -> int | None:
    """Largest batch in 1..max_batch where the best K (1..8) still beats plain decoding, Llama-3-8B drafted by
    Llama-3.2-1B in bf16 (bisection: the roofline's best speedup does not grow with the batch), or None."""
    if not _worth(hardware, alpha, 1, context):
        return None
    if _worth(hardware, alpha, max_batch, context):
        return max_batch
    lo, hi = 1, max_batch  # worth at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _worth(hardware, alpha, mid, context) else (lo, mid)
    return lo


def check_last_batch(fn) -> None:
    """``fn(hardware, alpha, context, max_batch)`` -> the largest batch (1..max_batch) at which speculation still
    pays for Llama-3-8B drafted by Llama-3.2-1B (bf16, best K in 1..8, ``sim.speedup_curve``), or None; compared with
    :func:`last_batch_worth_it` on every preset hardware, alpha 0.6 and 0.8, context 0 and 1024."""
    ex = "6.2"
    for hw in HARDWARE.values():
        for alpha in (0.6, 0.8):
            for context in (0, 1024):
                want = last_batch_worth_it(hw, alpha, context, 1024)
                got = call(ex, fn, hw, alpha, context, 1024, what=f"last_batch({hw.name!r}, {alpha}, {context}, 1024)")
                if got != want:
                    fail(ex, f"{hw.name}, alpha {alpha}, context {context}: expected {want}, got {got!r}. Speculation pays "
                             "at a batch when max(speedup_curve(hw, 'Llama-3-8B', 'Llama-3.2-1B', alpha, k_max=8, "
                             "batch=batch, context=context)[0]) > 1")
    b0, b1 = (last_batch_worth_it("H200", 0.8, c, 1024) for c in (0, 1024))
    passed(ex, f"on an H200 at alpha 0.8 speculation pays up to batch {b0} with an empty cache, and up to "
               f"{b1}{' (the limit)' if b1 == 1024 else ''} at a 1k context, where reading the KV cache keeps every "
               "step memory bound.")


def check_tree_tokens(fn) -> None:
    """``fn(accept_by_depth)`` -> E[tokens per verify step] of a tree whose accepted path reaches depth d with
    conditional probability ``accept_by_depth[d-1]``; compared (1e-12) with ``sim.tree_expected_tokens`` on 50 random
    profiles and with the chain's closed form (1 - a^(K+1)) / (1 - a)."""
    ex = "6.3"
    g = torch.Generator().manual_seed(63)
    profiles = [[0.7] * 4, [0.9, 0.8, 0.7, 0.6], [1.0, 1.0], [0.0, 0.5]]
    profiles += [torch.rand(1 + i % 7, generator=g, dtype=torch.float64).tolist() for i in range(50)]
    for a in profiles:
        want = tree_expected_tokens(a)
        got = call(ex, fn, list(a), what=f"tree_tokens({[round(v, 3) for v in a]})")
        if not isinstance(got, (int, float)) or abs(got - want) > 1e-12:
            fail(ex, f"accept_by_depth {[round(v, 3) for v in a]}: expected {want:.6f} tokens per step, got {got!r}. A "
                     "step emits 1 token (the residual or bonus) plus one per accepted depth, and reaching depth d "
                     "takes passing depths 1..d.")
    assert abs(tree_expected_tokens([0.7] * 4) - expected_tokens(0.7, 4)) < 1e-12  # a chain is a tree
    passed(ex, f"a 4-deep tree with per-depth acceptance 0.9, 0.8, 0.7, 0.6 emits {fn([0.9, 0.8, 0.7, 0.6]):.3f} "
               f"tokens per step; a chain at 0.7, {fn([0.7] * 4):.3f} (the closed form says {expected_tokens(0.7, 4):.3f}).")


def check_simulation(fn) -> None:
    """``fn(alpha, k, n_steps, generator)`` -> ``[n_steps]`` int accepted drafts per simulated step (each draft
    accepted with probability alpha independently, a step stops at its first rejection).

    Checks: same seed -> same steps, successive calls on one generator differ (no reseeding), and 50,000 steps fit
    the truncated geometric law (``stats.truncated_geometric``) for (alpha, K) = (0.6, 4), (0.9, 6), (0.3, 2):
    chi-square at 1e-4 (false alarm 3e-4 in all), each detecting any bias of TV >= 0.0155 (K = 4) with power 0.99."""
    ex = "6.4"
    a = call(ex, fn, 0.6, 4, 1000, torch.Generator().manual_seed(1), what="simulate(0.6, 4, 1000, generator)")
    if not isinstance(a, torch.Tensor) or a.shape != (1000,) or a.is_floating_point():
        fail(ex, f"return a [n_steps] integer tensor, got {type(a).__name__} {tuple(getattr(a, 'shape', ()))}")
    if not torch.equal(a, call(ex, fn, 0.6, 4, 1000, torch.Generator().manual_seed(1), what="simulate (same seed)")):
        fail(ex, "the same seed gave different steps: take every random number from `generator`")
    g = torch.Generator().manual_seed(2)
    if torch.equal(call(ex, fn, 0.6, 4, 1000, g, what="simulate"), call(ex, fn, 0.6, 4, 1000, g, what="simulate")):
        fail(ex, "two successive calls on one generator returned the same steps: do not reseed inside the function")
    g = torch.Generator().manual_seed(64)
    for alpha, k in ((0.6, 4), (0.9, 6), (0.3, 2)):
        n = call(ex, fn, alpha, k, STEPS, g, what=f"simulate({alpha}, {k}, {STEPS}, generator)")
        if int(n.min()) < 0 or int(n.max()) > k:
            fail(ex, f"alpha {alpha}, K = {k}: accepted counts must lie in 0..{k}, got {int(n.min())}..{int(n.max())}")
        counts = dict(zip(*(t.tolist() for t in n.long().unique(return_counts=True))))
        law = dict(enumerate(truncated_geometric(alpha, k)))
        fit_test(ex, counts, law, f"alpha {alpha}, K = {k} (a step accepts the LEADING run of passing drafts)")
    passed(ex, f"{STEPS} simulated steps per setting follow alpha^n (1 - alpha) / alpha^K (a bias of TV >= "
               f"{detectable_tv(STEPS, 4):.4f} would show), reproducibly from your generator.")


_P61 = """Invert the speedup formula: write `alpha_needed(goal, k, c, verify_ratio)`, the smallest per-token acceptance
alpha at which `E[tokens](alpha, K) / (K c + verify_ratio)` reaches `goal` (to 1e-6), or `None` when even alpha = 1
falls short. `theory.expected_tokens` may help; the speedup grows with alpha."""

_S61 = '''from specdec_lesson.exercises import check_alpha_needed
from specdec_lesson.theory import expected_tokens


def alpha_needed(goal, k, c, verify_ratio):
    """Smallest alpha reaching `goal`x, or None."""
    raise NotImplementedError


check_alpha_needed(alpha_needed)
'''

_A61 = solve(_S61, '''
    s = lambda a: expected_tokens(a, k) / (k * c + verify_ratio)
    if s(1.0) < goal:
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-9:                     # bisection: s grows with alpha
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if s(mid) >= goal else (mid, hi)
    return hi
''')

_P62 = """Section 3 showed the best K shrinking as the batch grows. Find where speculation stops paying at all: write
`last_batch(hardware, alpha, context, max_batch)`, the largest batch in 1..max_batch at which Llama-3-8B drafted by
Llama-3.2-1B (bf16) still beats plain decoding with its best K in 1..8 (`speedup_curve(hardware, "Llama-3-8B",
"Llama-3.2-1B", alpha, k_max=8, batch=..., context=...)`), or `None`. Predict first for an H200 at alpha 0.8: with an
empty cache, and at a 1k context?"""

_S62 = '''from specdec_lesson.exercises import check_last_batch
from specdec_lesson.sim import speedup_curve


def last_batch(hardware, alpha, context, max_batch):
    """Largest batch at which speculation still beats plain decoding, or None."""
    raise NotImplementedError


check_last_batch(last_batch)
'''

_A62 = solve(_S62, '''
    def worth(b):
        curve, _ = speedup_curve(hardware, "Llama-3-8B", "Llama-3.2-1B", alpha, k_max=8, batch=b, context=context)
        return max(curve) > 1.0

    if not worth(1):
        return None
    if worth(max_batch):
        return max_batch
    lo, hi = 1, max_batch                     # bisection: worth(lo), not worth(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if worth(mid) else (lo, mid)
    return lo
''')

_P63 = """A tree raises the chance that SOME candidate is accepted at each depth. Write `tree_tokens(accept_by_depth)`:
the expected tokens per verify step when the accepted path reaches depth d with probability `accept_by_depth[d-1]`
given that it reached depth d - 1 (a step also emits one token after its accepted path). A chain is the case of
equal entries."""

_S63 = '''from specdec_lesson.exercises import check_tree_tokens


def tree_tokens(accept_by_depth):
    """E[tokens per verify step] of a tree from per-depth acceptance."""
    raise NotImplementedError


check_tree_tokens(tree_tokens)
'''

_A63 = solve(_S63, '''
    total, reach = 1.0, 1.0
    for a in accept_by_depth:
        reach *= a                  # P(the path reaches this depth)
        total += reach
    return total
''')

_P64 = """Write the simulator's Monte Carlo: `simulate(alpha, k, n_steps, generator)` returns `[n_steps]` accepted
drafts per step, each of the K drafts accepted independently with probability alpha and a step ending at its first
rejection. Vectorise it (one `torch.rand(n_steps, k, generator=generator)`), and take every random number from
`generator`. The check tests the law of the counts and calls you twice in a row."""

_S64 = '''import torch

from specdec_lesson.exercises import check_simulation


def simulate(alpha, k, n_steps, generator):
    """[n_steps] accepted drafts per simulated step."""
    raise NotImplementedError


check_simulation(simulate)
'''

_A64 = solve(_S64, '''
    u = torch.rand(n_steps, k, generator=generator)        # [S, K]
    return (u < alpha).long().cumprod(dim=1).sum(dim=1)    # [S] the leading run of accepted drafts
''')

EXERCISES = [
    Exercise("6.1", "the alpha a speedup needs", check_alpha_needed, _P61, _S61, _A61),
    Exercise("6.2", "the batch where speculation stops paying", check_last_batch, _P62, _S62, _A62),
    Exercise("6.3", "tokens per step of a tree", check_tree_tokens, _P63, _S63, _A63),
    Exercise("6.4", "a Monte Carlo run with an explicit generator", check_simulation, _P64, _S64, _A64),
]
