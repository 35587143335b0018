"""Block verification (Sun et al. 2024): exact losslessness with Fractions, never fewer accepted
drafts than token-level verification, the torch implementation against its exact twin, and
Monte Carlo chi-square tests of the torch rule with stated sample size, level and power."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from specdec_lesson import theory, toy
from specdec_lesson.drafters import noisy_copy
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import logits_to_probs
from specdec_lesson.stats import chi_square_power, chi_square_test, noncentrality
from specdec_lesson.toy_block import expected_accepted, verified_joint, verified_step_law
from specdec_lesson.verify import draw_verify_randoms, verify_chain, verify_chain_from_randoms
from specdec_lesson.verify.block import (
    block_outcome_law,
    block_thresholds,
    block_thresholds_exact,
    expected_accepted_given_drafts,
    token_outcome_law,
    verify_block,
    verify_block_from_randoms,
)

F = Fraction
LEVEL = 1e-3

PAIRS = {
    "dense": (toy.random_markov(3, order=1, seed=5), toy.random_markov(3, order=1, seed=6)),
    "sparse": (toy.random_markov(4, order=1, seed=4, low=0, high=5), toy.random_markov(4, order=1, seed=5, low=0, high=5)),
    "order2": (toy.random_markov(3, order=2, seed=7), toy.random_markov(3, order=1, seed=8)),
}
CONFIGS = [dict(), dict(temperature=F(1, 2)), dict(temperature=0), dict(top_k=2), dict(top_p=0.8),
           dict(temperature=F(1, 2), top_k=3, top_p=0.7)]


def _iid(law, vocab):
    return toy.MarkovLM({(c,): law for c in range(vocab)}, vocab)


# ------------------------------------------------------------------ exact (Fractions)


def test_paper_example_token_10_9_block_11_9_bound_12_9():
    """p = (1/3, 2/3), q = (2/3, 1/3), context-free, K = 2 (the paper's motivating example)."""
    p, q = [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]
    target, draft = _iid(p, 2), _iid(q, 2)
    assert expected_accepted(target, draft, (0,), 2, verify="token") == F(10, 9) == theory.token_expected_accepted(p, q, 2)
    assert expected_accepted(target, draft, (0,), 2, verify="block") == F(11, 9)
    assert theory.expected_accepted_bound(p, q, 2) == F(12, 9)
    assert verified_joint(target, draft, (0,), 4, 2, verify="block") == toy.target_joint(target, (0,), 4)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_block_rule_is_lossless_and_never_accepts_fewer(pair, k):
    """For every configuration (T = 1, 1/2, 0, top-k, top-p, all three): the law of the first 3
    emitted tokens under block verification EQUALS the target's (Fractions), and E[accepted] of a
    step is >= token-level's; strictly > somewhere for K >= 2 (K = 1: the two rules coincide)."""
    target, draft = PAIRS[pair]
    prompt = (0, 1)
    strict = False
    for cfg in CONFIGS:
        exact = toy.target_joint(target, prompt, 3, **cfg)
        assert verified_joint(target, draft, prompt, 3, k, verify="block", **cfg) == exact, cfg
        e_token = expected_accepted(target, draft, prompt, k, verify="token", **cfg)
        e_block = expected_accepted(target, draft, prompt, k, verify="block", **cfg)
        assert e_block >= e_token, cfg
        strict |= e_block > e_token
        if k == 1:
            assert e_block == e_token
    assert strict == (k >= 2)


def test_token_verifier_is_the_toy_chain_rule():
    """The token-level outcome law, enumerated over drafted blocks, gives exactly the step law of
    toy.speculative_step_law (Leviathan's rule walked token by token)."""
    target, draft = PAIRS["sparse"]
    for k in (1, 2, 3):
        for cfg in CONFIGS[:4]:
            want = toy.speculative_step_law(target, draft, (2,), k, k + 1, **cfg)
            assert verified_step_law(target, draft, (2,), k, k + 1, verify="token", **cfg) == want


@pytest.mark.parametrize("seed", range(4))
def test_random_iid_pairs_token_le_block_le_bound(seed):
    """Context-free laws over 3 tokens: token-level <= block <= the coupling bound, K = 2, 3."""
    rng = torch.Generator().manual_seed(seed)
    laws = []
    for _ in range(2):
        w = torch.randint(1, 10, (3,), generator=rng).tolist()
        laws.append([F(v, sum(w)) for v in w])
    p, q = laws
    for k in (2, 3):
        e_block = expected_accepted(_iid(p, 3), _iid(q, 3), (0,), k, verify="block")
        assert theory.token_expected_accepted(p, q, k) <= e_block <= theory.expected_accepted_bound(p, q, k)


# ------------------------------------------------------------------ torch against the exact twin


def _random_case(gen, B, K, V, zeros=True):
    tp = torch.softmax(torch.randn(B, K + 1, V, generator=gen, dtype=torch.float64) * 1.5, -1)  # [B, K+1, V]
    dp = torch.softmax(torch.randn(B, K, V, generator=gen, dtype=torch.float64) * 1.5, -1)  # [B, K, V]
    if zeros:  # p(x) = 0 on a random token of each row (after the draft picked it, sometimes)
        tp.scatter_(-1, torch.randint(0, V, (B, K + 1, 1), generator=gen), 0.0)
        tp /= tp.sum(-1, keepdim=True)
    dt = torch.multinomial(dp.reshape(B * K, V), 1, generator=gen).reshape(B, K)  # [B, K]
    return tp, dp, dt


def test_torch_thresholds_match_the_exact_definitions():
    """The log-domain (cumsum / cummax) weights and the vectorised thresholds equal the recursive
    Fraction definitions to 1e-12, on 200 random rows with K = 5 (zeros in p included)."""
    gen = torch.Generator().manual_seed(0)
    tp, dp, dt = _random_case(gen, 200, 5, 6)
    w, h = block_thresholds(tp, dp, dt)
    for b in range(200):
        p_laws = [[F(v) for v in row] for row in tp[b].tolist()]
        q_laws = [[F(v) for v in row] for row in dp[b].tolist()]
        we, he = block_thresholds_exact(p_laws, q_laws, dt[b].tolist())
        assert torch.allclose(w[b], torch.tensor([float(v) for v in we], dtype=torch.float64), atol=1e-12)
        assert torch.allclose(h[b], torch.tensor([float(v) for v in he], dtype=torch.float64), atol=1e-12)


def test_zero_over_zero_threshold_is_one():
    """w_1 = 1 (p_1(X_1) >= q_1(X_1)) and p_2 == q_2 (Z_1 = 0): h_1 = 0/0 is defined as 1."""
    tp = torch.tensor([[[0.5, 0.5], [0.3, 0.7], [0.5, 0.5]]], dtype=torch.float64)
    dp = torch.tensor([[[0.4, 0.6], [0.3, 0.7]]], dtype=torch.float64)
    dt = torch.tensor([[0, 1]])
    w, h = block_thresholds(tp, dp, dt)
    assert w.tolist() == [[1.0, 1.0, 1.0]] and h.tolist() == [[1.0, 1.0]]
    assert block_thresholds_exact(tp[0].tolist(), dp[0].tolist(), [0, 1])[1] == [1, 1]
    n, _ = verify_block(tp.expand(64, 3, 2), dp.expand(64, 2, 2), dt.expand(64, 2), torch.Generator().manual_seed(1))
    assert (n == 2).all()


def test_random_number_protocol_greedy_and_edge_cases():
    """verify_block == verify_block_from_randoms(draw_verify_randoms(...)) from the same generator
    state; one-hot (greedy) laws give exactly token-level's answer on the same random numbers;
    p == q accepts all K; B = 0 returns empty tensors; bad input raises one ValueError."""
    gen = torch.Generator().manual_seed(2)
    B, K, V = 256, 4, 7
    tp, dp, dt = _random_case(gen, B, K, V)
    state = gen.get_state()
    a = verify_block(tp, dp, dt, gen)
    gen.set_state(state)
    b = verify_block_from_randoms(tp, dp, dt, *draw_verify_randoms(B, K, V, dtype=tp.dtype, generator=gen))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    hot = lambda t: torch.nn.functional.one_hot(t, V).double()  # noqa: E731
    greedy_t, greedy_d = hot(tp.argmax(-1)), hot(dt)
    randoms = draw_verify_randoms(B, K, V, dtype=torch.float64, generator=gen)
    block = verify_block_from_randoms(greedy_t, greedy_d, dt, *randoms)
    chain = verify_chain_from_randoms(greedy_t, greedy_d, dt, *randoms)
    assert torch.equal(block[0], chain[0]) and torch.equal(block[1], chain[1])
    n, _ = verify_block(tp, tp[:, :K].clone(), dt, gen)
    assert (n[(tp[:, :K].gather(-1, dt[..., None]) > 0).all(1).squeeze(-1)] == K).all()
    n, y = verify_block(torch.zeros(0, K + 1, V), torch.zeros(0, K, V), torch.zeros(0, K, dtype=torch.long), gen)
    assert n.shape == y.shape == (0,)
    with pytest.raises(ValueError, match="sum to 1"):
        verify_block(tp * 1.1, dp, dt, gen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_laws_are_their_fp32_renormalisation(dtype):
    gen = torch.Generator().manual_seed(3)
    tp, dp, dt = _random_case(gen, 512, 3, 9, zeros=False)
    tp, dp = tp.to(dtype), dp.to(dtype)
    a = verify_block(tp, dp, dt, torch.Generator().manual_seed(4))
    b = verify_block(*(t.float() / t.float().sum(-1, keepdim=True) for t in (tp, dp)), dt, torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ------------------------------------------------------------------ Monte Carlo (torch rule, real random numbers)


def buggy_block_outcome_law(p_laws, q_laws, drafts) -> dict:
    """A plausible bug for the power statements: the residual after tau ignores the weight w_tau
    (max(p - q, 0) instead of max(w_tau p - q, 0)).  Not lossless."""
    good = block_outcome_law(p_laws, q_laws, drafts)
    tau_law: dict[int, Fraction] = {}
    for (tau, _), pr in good.items():
        tau_law[tau] = tau_law.get(tau, F(0)) + pr
    K, out = len(drafts), {}
    for tau, pr in tau_law.items():
        law = p_laws[K] if tau == K else _residual(p_laws[tau], q_laws[tau], F(1))
        for y, py in enumerate(law):
            if py:
                out[(tau, y)] = out.get((tau, y), F(0)) + pr * py
    return out


def _residual(p, q, w):
    r = [max(F(0), w * F(a) - F(b)) for a, b in zip(p, q)]
    return [v / sum(r) for v in r] if sum(r) else list(p)


def first_failure_outcome_law(p_laws, q_laws, drafts) -> dict:
    """A gross bug: stop at the first failed test (tau = the length of the leading run of passed
    tests, as token-level verification does) while using block thresholds.  Not lossless."""
    K = len(drafts)
    w, h = block_thresholds_exact(p_laws, q_laws, drafts)
    out, reach = {}, F(1)
    for tau in range(K + 1):
        pr = reach * (1 - h[tau]) if tau < K else reach
        law = p_laws[K] if tau == K else _residual(p_laws[tau], q_laws[tau], w[tau])
        for y, py in enumerate(law):
            if py and pr:
                out[(tau, y)] = out.get((tau, y), F(0)) + pr * py
        reach *= h[tau] if tau < K else 1
    return out


def test_monte_carlo_joint_law_toy():
    """Toy pair "dense", prompt (0, 1), K = 3, T = 1 with top-k = 2: the first 3 emitted tokens of
    40,000 independent chains decoded with the torch verify_block, Pearson chi-square against the
    exact target law (27 outcomes), fail at p < 1e-3.  Power, from the exact joint laws of two bugs:
    >= 0.99 against a residual that ignores w_tau (a subtle bug: at most 0.009 per outcome here,
    and on some pairs it happens to be exact), 1.00 against stopping at the first failed test."""
    target, draft = PAIRS["dense"]
    n_chains, prompt, cfg = 40_000, (0, 1), dict(top_k=2)
    exact = {s: float(v) for s, v in toy.target_joint(target, prompt, 3, **cfg).items()}
    for bug_rule, power in ((buggy_block_outcome_law, 0.99), (first_failure_outcome_law, 0.999)):
        bug = {s: float(v) for s, v in verified_joint(target, draft, prompt, 3, 3, verify=bug_rule, **cfg).items()}
        assert chi_square_power(n_chains, len(exact) - 1, noncentrality(exact, bug, n_chains), LEVEL) >= power
    res = toy.mc_joint_check(target, draft, prompt, 3, 3, n_chains, torch.Generator().manual_seed(5), top_k=2,
                             verify_fn=verify_block)
    assert res["p_value"] > LEVEL, res["p_value"]




@torch.no_grad()
def _tiny_model_laws(V: int, prompt: list[int], temperature: float):
    """Laws of a real tiny Llama target and a perturbed copy as draft, for every drafted block of
    K = 2: p1 [V], p2 [V, V], p3 [V, V, V] (target after prompt, +x1, +x1 x2), q1 [V], q2 [V, V]."""
    target = tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.3, 5, relative=False)
    L = len(prompt)
    blocks = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(V), repeat=2)])  # [V*V, L+2]
    p = logits_to_probs(target(blocks).logits[:, L - 1:], temperature)  # [V*V, 3, V]
    q = logits_to_probs(draft(blocks[::V, :L + 1]).logits[:, L - 1:], temperature)  # [V, 2, V] one row per x1
    return p[0, 0], p[::V, 1], p[:, 2].reshape(V, V, V), q[0, 0], q[:, 1]


def _exact_block_law(laws, V: int, outcome_law) -> dict:
    """Exact law of the emitted block (x_1..x_tau, y) of one step, laws normalised as Fractions."""
    p1, p2, p3, q1, q2 = laws
    norm = lambda t: [v / sum(map(F, t.tolist())) for v in map(F, t.tolist())]  # noqa: E731
    out: dict[tuple[int, ...], float] = {}
    for x1, x2 in itertools.product(range(V), repeat=2):
        w = F(q1[x1].item()) * F(q2[x1, x2].item())
        if not w:
            continue
        law = outcome_law([norm(p1), norm(p2[x1]), norm(p3[x1, x2])], [norm(q1), norm(q2[x1])], (x1, x2))
        for (tau, y), pr in law.items():
            key = (x1, x2)[:tau] + (y,)
            out[key] = out.get(key, 0.0) + float(w * pr)
    return out


def test_monte_carlo_one_step_on_real_tiny_models():
    """A real tiny Llama target (V = 8) and a perturbed copy as draft, T = 1, K = 2: 200,000
    independent steps (drafts sampled from q with torch, verified by verify_block), Pearson
    chi-square of the emitted block (x_1..x_tau, y) against its exact law (block_outcome_law over
    the 64 drafted blocks), fail at p < 1e-3.  Power against the residual-ignores-w bug: >= 0.99.
    Also the mean number of accepted drafts against its exact value (z-test at 1e-3), which is
    above token-level's exact value."""
    V, N = 8, 200_000
    laws = _tiny_model_laws(V, [1, 5, 2, 6, 3], 1.0)
    exact = _exact_block_law(laws, V, block_outcome_law)
    bug = _exact_block_law(laws, V, buggy_block_outcome_law)
    cells = sum(1 for v in exact.values() if v * N >= 5)
    assert chi_square_power(N, cells, noncentrality(exact, bug, N), LEVEL) >= 0.99
    p1, p2, p3, q1, q2 = laws
    gen = torch.Generator().manual_seed(6)
    x1 = torch.multinomial(q1, N, replacement=True, generator=gen)  # [N]
    x2 = torch.multinomial(q2[x1], 1, generator=gen)[:, 0]  # [N]
    target_probs = torch.stack([p1.expand(N, V), p2[x1], p3[x1, x2]], 1)  # [N, 3, V]
    draft_probs = torch.stack([q1.expand(N, V), q2[x1]], 1)  # [N, 2, V]
    tau, y = verify_block(target_probs, draft_probs, torch.stack([x1, x2], 1), gen)
    rows = torch.stack([x1, x2, y], 1).tolist()
    counts: dict[tuple[int, ...], int] = {}
    for (a, b, c), t in zip(rows, tau.tolist()):
        key = (a, b)[:t] + (c,)
        counts[key] = counts.get(key, 0) + 1
    stat, dof, p_value = chi_square_test(counts, exact)
    assert p_value > LEVEL, (stat, dof, p_value)
    mean_tau = sum((len(k) - 1) * v for k, v in exact.items())  # exact E[tau]
    var_tau = sum((len(k) - 1) ** 2 * v for k, v in exact.items()) - mean_tau**2
    z = (float(tau.double().mean()) - mean_tau) / math.sqrt(var_tau / N)
    assert abs(z) < 3.2905, z
    token = _exact_block_law(laws, V, token_outcome_law)
    assert mean_tau > sum((len(k) - 1) * v for k, v in token.items())
    n_chain, _ = verify_chain(target_probs, draft_probs, torch.stack([x1, x2], 1), gen)
    assert float(tau.double().mean()) > float(n_chain.double().mean())


# ------------------------------------------------------------------ small API checks


def test_bad_rule_names_and_laws_raise():
    target, draft = PAIRS["dense"]
    with pytest.raises(ValueError, match="verify must be one of"):
        expected_accepted(target, draft, (0,), 2, verify="blocks")
    with pytest.raises(ValueError, match="summing to 1"):
        theory.expected_accepted_bound([F(1, 2), F(1, 3)], [F(1, 2), F(1, 2)], 2)
    with pytest.raises(ValueError, match="k must be"):
        theory.token_expected_accepted([F(1)], [F(1)], 0)


# ------------------------------------------------------------------ the engine option


def test_engine_block_verification():
    """speculative_generate(..., verify="block"): greedy output equals the target's greedy output,
    and the joint law of the first 2 sampled tokens (V = 8: 64 outcomes; N = 6000 rows in 12
    batches of 500, K = 3, T = 1) passes a Pearson chi-square at 1e-3 against the exact target law;
    power >= 0.95 against ANY distortion at total variation >= 0.06 (Cauchy-Schwarz floor)."""
    from specdec_lesson.speculative import autoregressive_generate, speculative_generate
    from specdec_lesson.stats import min_noncentrality

    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.3, 5, relative=False)
    prompts = [[1, 5, 2], [3, 3, 7, 1], [6]]
    for p in prompts:
        ref = autoregressive_generate(target, [p], 12)[0][0]
        assert torch.equal(speculative_generate(target, draft, [p], 12, k=3, verify="block")[0][0], ref)
    prompt, n = [1, 5, 2], 6000
    with torch.no_grad():
        seqs = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(8), repeat=2)])  # [64, L+2]
        probs = logits_to_probs(target(seqs).logits[:, len(prompt) - 1:len(prompt) + 1], 1.0)  # [64, 2, V]
    law = {(a, b): float(probs[8 * a + b, 0, a] * probs[8 * a + b, 1, b]) for a, b in itertools.product(range(8), repeat=2)}
    assert chi_square_power(n, 63, min_noncentrality(n, 0.06), LEVEL) >= 0.95
    g = torch.Generator().manual_seed(1234)
    counts: dict = {}
    for _ in range(12):
        out, _ = speculative_generate(target, draft, [prompt] * 500, 2, k=3, temperature=1.0, generator=g, verify="block")
        for row in out:
            counts[tuple(row.tolist())] = counts.get(tuple(row.tolist()), 0) + 1
    stat, dof, p_value = chi_square_test(counts, law)
    assert p_value > LEVEL, (stat, dof, p_value)
    with pytest.raises(ValueError, match="verify"):
        speculative_generate(target, draft, [prompt], 2, k=3, verify="blocks")


# ------------------------------------------------------------------ E[accepted | drafted block], the paired measurement


@pytest.mark.parametrize("rule,outcome_law", [("token", token_outcome_law), ("block", block_outcome_law)])
@pytest.mark.parametrize("K", [1, 2, 4])
def test_expected_accepted_given_drafts_equals_the_exact_outcome_law(rule, outcome_law, K):
    """The vectorised conditional mean equals sum_tau tau P(tau | drafts) of the Fraction twin, to
    1e-12, on 60 random rows (zeros in p included); fp32 laws are scored in fp32."""
    gen = torch.Generator().manual_seed(10 + K)
    tp, dp, dt = _random_case(gen, 60, K, 5)
    got = expected_accepted_given_drafts(tp, dp, dt, rule)  # [B]
    for b in range(60):
        p_laws = [[F(v) for v in row] for row in tp[b].tolist()]
        q_laws = [[F(v) for v in row] for row in dp[b].tolist()]
        exact = sum((tau * pr for (tau, _), pr in outcome_law(p_laws, q_laws, dt[b].tolist()).items()), F(0))
        assert abs(float(got[b]) - float(exact)) < 1e-12, (b, float(got[b]), float(exact))
    got32 = expected_accepted_given_drafts(tp.float(), dp.float(), dt, rule)
    assert got32.dtype == torch.float32 and torch.allclose(got32.double(), got, atol=1e-5)


def test_expected_accepted_given_drafts_is_the_mean_of_the_counted_tau():
    """Averaged over the rule's own random numbers, the counted tau has the conditional mean:
    20000 draws of the same 8 blocks (K = 3), both rules, within 5 standard errors."""
    gen = torch.Generator().manual_seed(7)
    tp, dp, dt = _random_case(gen, 8, 3, 6, zeros=False)
    reps = 20_000
    for rule, fn in (("token", verify_chain_from_randoms), ("block", verify_block_from_randoms)):
        mean = expected_accepted_given_drafts(tp, dp, dt, rule)  # [8]
        uni, expo = draw_verify_randoms(8 * reps, 3, 6, dtype=torch.float64, generator=gen)
        tau, _ = fn(tp.repeat(reps, 1, 1), dp.repeat(reps, 1, 1), dt.repeat(reps, 1), uni, expo)
        counted = tau.double().reshape(reps, 8)  # [reps, 8]
        se = counted.std(0) / math.sqrt(reps)
        assert ((counted.mean(0) - mean).abs() <= 5 * se + 1e-9).all(), (rule, counted.mean(0), mean)
    with pytest.raises(ValueError, match="verify must be one of"):
        expected_accepted_given_drafts(tp, dp, dt, "blocks")


def test_engine_observe_hook_sees_each_verified_block_and_changes_nothing():
    """speculative_generate(observe=f) calls f with [B, K+1, V], [B, K, V], [B, K] before every
    verification; the sampled output is bit-equal to the run without it (same generator seed)."""
    from specdec_lesson.speculative import speculative_generate

    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.3, 5, relative=False)
    seen = []

    def observe(tp, dp, dt):
        seen.append((tuple(tp.shape), tuple(dp.shape), tuple(dt.shape),
                     expected_accepted_given_drafts(tp, dp, dt, "block")))

    runs = []
    for hook in (None, observe):
        out, stats = speculative_generate(target, draft, [[1, 5, 2], [6, 1]], 10, k=3, temperature=1.0,
                                          generator=torch.Generator().manual_seed(5), verify="block", observe=hook)
        runs.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert len(seen) == stats.target_forwards - 1  # every step but the prefill
    assert all(s[:3] == ((2, 4, 8), (2, 3, 8), (2, 3)) for s in seen[:1])
    with pytest.raises(ValueError, match="observe must be a callable"):
        speculative_generate(target, draft, [[1, 5, 2]], 4, k=3, observe="print")


@pytest.mark.parametrize("flags,message", [(["--temperatures", "0"], "must be > 0"),
                                           (["--temperatures", "hot"], "comma-separated numbers"),
                                           (["--seeds", "0"], "must be >= 1")])
def test_block_verify_benchmark_rejects_bad_flags_before_loading_models(flags, message):
    """benchmarks/block_verify.py: one clear error naming the flag, exit 2, before any model loads."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "block_verify.py"
    proc = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
