"""Verification is exact at every input precision: bf16 / fp16 laws give unbiased acceptance and
unbiased residual / bonus draws (chain, tree, the Triton wrapper), because verification computes in
fp32 (fp64 for fp64 laws) and draws its random numbers in fp32 whatever the laws' dtype.

The cases come from an audit of the half-precision path: p(0) = 0.6875, q(0) = 0.75 are exact in
bf16 and fp16, so the acceptance probability of a drafted token 0 is exactly p(0)/q(0) = 11/12,
and every emitted token is a race between two equal weights (residual (0, 1/32, 1/32) after a
rejection, bonus law (1/2, 1/2, 0) after an acceptance).  Before the fix, bf16 randoms (multiples
of 1/256) and bf16 products u*q gave an acceptance rate of 0.9141 (z = -18 at N = 4e6), and bf16
exponential races favoured the lower index (ties).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec_lesson.stats import chi_square_power, chi_square_test, min_noncentrality
from specdec_lesson.tree import TokenTree, verify_tree
from specdec_lesson.verify import draw_verify_randoms, race_sample, verify_chain

HALF = [torch.bfloat16, torch.float16]
P1 = [0.6875, 0.15625, 0.15625]  # target law at the drafted position (exact in bf16 and fp16)
Q1 = [0.75, 0.125, 0.125]  # draft law; the drafted token is 0: accepted with probability 11/12
P2 = [0.5, 0.5, 0.0]  # bonus law: a race between two equal weights
ACCEPT = 0.6875 / 0.75
LEVEL = 1e-3  # significance level of every test in this file
Z_CRIT = 3.2905  # two-sided critical value of a standard normal at LEVEL


def _z_binomial(k: float, n: float, p: float) -> float:
    return (k - n * p) / math.sqrt(n * p * (1 - p))


def _power_z(effect_sd_units: float) -> float:
    """Power of the two-sided z-test at LEVEL against a shift of ``effect_sd_units`` standard deviations."""
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))
    return phi(effect_sd_units - Z_CRIT) + phi(-effect_sd_units - Z_CRIT)


# ------------------------------------------------------------------ chain verification


def chain_statistics(dtype: torch.dtype, n: int, seed: int = 0) -> dict:
    """``n`` rows of ``verify_chain`` on the audit's case in ``dtype``: the chi-square of the
    outcomes (num_accepted, next_token) against their exact law, and two z-scores: the
    acceptance rate against 11/12 and the frequency of the lower-index token in the race."""
    gen = torch.Generator().manual_seed(seed)
    target_probs = torch.tensor([P1, P2], dtype=dtype).expand(n, 2, 3)  # [N, K+1, V]
    draft_probs = torch.tensor([Q1], dtype=dtype).expand(n, 1, 3)  # [N, K, V]
    draft_tokens = torch.zeros(n, 1, dtype=torch.long)  # [N, K]
    num_accepted, next_token = verify_chain(target_probs, draft_probs, draft_tokens, gen, validate=False)
    cell = num_accepted * 3 + next_token  # [N] (n, y) -> 3 n + y
    counts = {(c // 3, c % 3): v for c, v in enumerate(torch.bincount(cell, minlength=6).tolist()) if v}
    law = {(0, 1): (1 - ACCEPT) / 2, (0, 2): (1 - ACCEPT) / 2, (1, 0): ACCEPT / 2, (1, 1): ACCEPT / 2}
    stat, dof, p_value = chi_square_test(counts, law)
    accepted = counts.get((1, 0), 0) + counts.get((1, 1), 0)
    lower = counts.get((1, 0), 0) + counts.get((0, 1), 0)
    return {"p_value": p_value, "stat": stat, "dof": dof, "z_accept": _z_binomial(accepted, n, ACCEPT),
            "z_race": _z_binomial(lower, n, 0.5), "accept_rate": accepted / n}


@pytest.mark.parametrize("dtype", HALF)
def test_chain_half_precision_laws_are_verified_without_bias(dtype):
    """N = 4,000,000 rows, K = 1, V = 3, drafted token 0.  Pearson chi-square over the 4 outcomes
    (dof 3), fail at p < 1e-3.  Power: >= 0.98 against ANY outcome law at total variation >= 0.0015
    from the exact one (Cauchy-Schwarz floor), 1.00 against the pre-fix bf16 law (TV 0.0026)."""
    n = 4_000_000
    assert chi_square_power(n, 3, min_noncentrality(n, 0.0015), LEVEL) > 0.98
    s = chain_statistics(dtype, n)
    assert s["p_value"] > LEVEL, s
    assert abs(s["z_accept"]) < Z_CRIT and abs(s["z_race"]) < Z_CRIT, s


def race_statistic(dtype: torch.dtype, n: int, seed: int = 1) -> float:
    """z-score of the frequency of token 0 in ``n`` exponential races between two equal weights in
    ``dtype``, with the exponentials that verification draws for laws of that dtype."""
    gen = torch.Generator().manual_seed(seed)
    _, exponentials = draw_verify_randoms(n, 1, 2, dtype=dtype, generator=gen)  # [N, 2]
    weights = torch.full((n, 2), 0.5, dtype=dtype)  # [N, 2]
    first = int((race_sample(weights, exponentials) == 0).sum())
    return _z_binomial(first, n, 0.5)


@pytest.mark.parametrize("dtype", HALF)
def test_race_between_equal_half_precision_weights_is_fair(dtype):
    """N = 8,000,000 races; two-sided z-test at level 1e-3.  Power 0.99 against a bias of 0.001
    (the pre-fix bf16 race picked token 0 with probability ~0.501: ties of bf16 exponentials)."""
    n = 8_000_000
    assert _power_z(0.001 / (0.5 / math.sqrt(n))) > 0.99
    z = race_statistic(dtype, n)
    assert abs(z) < Z_CRIT, z


# ------------------------------------------------------------------ tree verification


def _chain_tree(dtype: torch.dtype, depth: int) -> tuple[TokenTree, torch.Tensor]:
    """A chain-shaped ``"iid"`` tree of ``depth`` drafted tokens 0, each node with the audit's laws."""
    tree = TokenTree(0, rule="iid")
    v = 0
    for _ in range(depth):
        v = tree.add(0, v)
    q = torch.tensor(Q1, dtype=dtype)  # [V]
    tree.draft_probs = {i: q for i in range(depth)}
    target_probs = torch.tensor([P1] * depth + [P2], dtype=dtype)  # [N, V] row v: law after node v
    return tree, target_probs


def tree_statistics(dtype: torch.dtype, calls: int, depth: int = 16, seed: int = 2) -> dict:
    """``calls`` independent ``verify_tree`` calls on a chain tree: z-score of the accept decisions
    (S successes in T tests, (S - a T) / sqrt(a (1 - a) T), a martingale CLT, the tests stop at the
    first rejection) and of the lower-index frequency of the emitted token (a two-weight race)."""
    gen = torch.Generator().manual_seed(seed)
    tree, target_probs = _chain_tree(dtype, depth)
    successes = trials = lower = 0
    for _ in range(calls):
        path, y = verify_tree(tree, target_probs, gen)
        a = len(path)
        successes += a
        trials += a + (a < depth)
        lower += (y == 0) if a == depth else (y == 1)
    return {"z_accept": (successes - ACCEPT * trials) / math.sqrt(ACCEPT * (1 - ACCEPT) * trials),
            "trials": trials, "accept_rate": successes / trials, "z_race": _z_binomial(lower, calls, 0.5)}


@pytest.mark.parametrize("dtype", HALF)
def test_tree_half_precision_laws_are_verified_without_bias(dtype):
    """30,000 calls on a depth-16 chain tree (~270,000 accept tests), two-sided z-tests at 1e-3.
    Power >= 0.9 against an acceptance bias of 0.0025 (the pre-fix bf16 tree bias was +0.0021),
    and against a race bias of 0.015 (30,000 draws).  The exact equivalence of half-precision and
    fp32 tree verification is tested separately (test_tree_half_equals_fp32_verification)."""
    calls = 30_000
    s = tree_statistics(dtype, calls)
    sd = math.sqrt(ACCEPT * (1 - ACCEPT) / s["trials"])
    assert _power_z(0.0025 / sd) > 0.9 and _power_z(0.015 / (0.5 / math.sqrt(calls))) > 0.95
    assert abs(s["z_accept"]) < Z_CRIT and abs(s["z_race"]) < Z_CRIT, s


# ------------------------------------------------------------------ the Triton wrapper (interpreter on CPU: few rows)


def triton_statistics(dtype: torch.dtype, rows: int, k: int = 16, seed: int = 3) -> dict:
    """``rows`` rows of ``verify_chain_triton`` with K = ``k`` drafted tokens 0 per row (each row's
    accept tests stop at its first rejection): z-scores of the accept tests and of the race."""
    from specdec_lesson.kernels import verify_chain_triton

    gen = torch.Generator().manual_seed(seed)
    target_probs = torch.tensor([P1] * k + [P2], dtype=dtype).expand(rows, k + 1, 3).contiguous()  # [B, K+1, V]
    draft_probs = torch.tensor([Q1], dtype=dtype).expand(rows, k, 3).contiguous()  # [B, K, V]
    draft_tokens = torch.zeros(rows, k, dtype=torch.long)  # [B, K]
    uniforms, exponentials = draw_verify_randoms(rows, k, 3, dtype=dtype, generator=gen)
    num_accepted, next_token = verify_chain_triton(target_probs, draft_probs, draft_tokens, uniforms, exponentials)
    successes = int(num_accepted.sum())
    trials = successes + int((num_accepted < k).sum())
    lower = int(torch.where(num_accepted == k, next_token == 0, next_token == 1).sum())
    return {"z_accept": (successes - ACCEPT * trials) / math.sqrt(ACCEPT * (1 - ACCEPT) * trials),
            "trials": trials, "accept_rate": successes / trials, "z_race": _z_binomial(lower, rows, 0.5)}


@pytest.mark.parametrize("dtype", HALF)
def test_triton_wrapper_half_precision_laws_without_bias(dtype):
    """The interpreter runs one program per row (~15 ms each), so only 256 rows, K = 16 (~2,300
    accept tests), two-sided z-tests at 1e-3: power 0.9 against an acceptance bias of 0.03 and
    against a race bias of 0.15 (gross errors only).  The kernel's exactness rests on its
    bit-equality with the torch reference on the same inputs, bf16 / fp16 included
    (tests/test_kernels.py), and on the reference's own N = 4e6 test above."""
    rows = 256
    s = triton_statistics(dtype, rows)
    sd = math.sqrt(ACCEPT * (1 - ACCEPT) / s["trials"])
    assert _power_z(0.03 / sd) > 0.9 and _power_z(0.15 / (0.5 / math.sqrt(rows))) > 0.9
    assert abs(s["z_accept"]) < Z_CRIT and abs(s["z_race"]) < Z_CRIT, s


# ------------------------------------------------------------------ exact equivalences (no statistics)


def _random_iid_tree(gen: torch.Generator, dtype: torch.dtype, n: int, V: int) -> tuple[TokenTree, torch.Tensor]:
    """A random ``"iid"`` tree of ``n`` nodes whose children are drawn from half-precision laws."""
    tree = TokenTree(0, rule="iid")
    laws = {}
    for _ in range(n - 1):
        parent = int(torch.randint(tree.size, (1,), generator=gen))
        if parent not in laws:
            laws[parent] = torch.softmax(torch.randn(V, generator=gen) * 2, -1).to(dtype)  # [V]
        tree.add(int(torch.multinomial(laws[parent].float(), 1, generator=gen)), parent)
    tree.draft_probs = laws
    target_probs = torch.softmax(torch.randn(tree.size, V, generator=gen) * 2, -1).to(dtype)  # [N, V]
    return tree, target_probs


@pytest.mark.parametrize("dtype", HALF)
def test_tree_half_equals_fp32_verification(dtype):
    """verify_tree on bf16 / fp16 laws == verify_tree on their fp32 renormalisation (p / sum p,
    q / sum q), same generator seed: 300 random trees of 8 nodes, identical paths and tokens."""
    gen = torch.Generator().manual_seed(4)
    lengths = set()
    for seed in range(300):
        tree, target_probs = _random_iid_tree(gen, dtype, 8, 6)
        fp32 = tree.copy()
        fp32.draft_probs = {v: q.float() / q.float().sum() for v, q in tree.draft_probs.items()}
        a = verify_tree(tree, target_probs, torch.Generator().manual_seed(seed))
        b = verify_tree(fp32, target_probs.float() / target_probs.float().sum(-1, keepdim=True),
                        torch.Generator().manual_seed(seed))
        assert a == b, (seed, a, b)
        lengths.add(len(a[0]))
    assert len(lengths) >= 3


# ------------------------------------------------------------------ drafters hand q in fp32


def test_drafters_return_fp32_laws_for_bf16_models():
    """A bf16 EAGLE draft and a bf16 small LM draft: q comes back in fp32, summing to 1 within
    fp32 rounding (a bf16 q sums to 1 only within ~1e-3 and is what the audit flagged)."""
    from specdec_lesson.drafters import ModelDrafter
    from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
    from specdec_lesson.models import tiny_llama
    from specdec_lesson.sampling import SamplingConfig

    target = tiny_llama(vocab_size=64, seed=0)
    V = 64
    torch.manual_seed(0)
    d2t = torch.arange(V)
    eagle = EagleDraft(EagleConfig.from_target(target, V), *_target_tables(target, torch.bfloat16), d2t=d2t)
    eagle = EagleDrafter(eagle.to(torch.bfloat16).eval())
    ids = torch.tensor([[3, 9, 27, 5, 1]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    hidden = torch.randn(1, ids.shape[1] - 1, target.config.hidden_size)  # [B, L-1, H] stand-in target features
    eagle.begin(ids, mask, hidden)
    small = ModelDrafter(tiny_llama(vocab_size=V, seed=1).to(torch.bfloat16))
    small.begin(ids, mask, None)
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    for drafter in (eagle, small):
        tokens, q = drafter.propose(3, sampling, torch.Generator().manual_seed(0))
        assert q.dtype == torch.float32 and q.shape == (1, 3, V), type(drafter).__name__
        assert float((q.double().sum(-1) - 1).abs().max()) < 1e-5
