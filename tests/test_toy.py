"""Exactness of speculative decoding on toy Markov models: Fraction equality and Monte Carlo."""

from fractions import Fraction

import pytest
import torch

from specdec_lesson import toy
from specdec_lesson.sampling import logits_to_probs
from specdec_lesson.stats import chi2_isf, chi_square_power, min_noncentrality

TARGET = toy.random_markov(3, order=1, seed=1)
DRAFT = toy.random_markov(3, order=1, seed=2)
TARGET2 = toy.random_markov(3, order=2, seed=3)  # an order-2 target with an order-1 draft
SPARSE_T = toy.random_markov(4, order=1, seed=4, low=0, high=5)  # laws with zeros
SPARSE_D = toy.random_markov(4, order=1, seed=5, low=0, high=5)
PROMPT = (0, 0)

# Monte Carlo protocol (shared by tests/test_pitfalls.py):
MC_BATCH = 30_000  # independent chains; each contributes its first MC_N tokens
MC_N = 3  # 3 tokens over 3 symbols: 27 joint outcomes (26 dof when no cell is pooled)
MC_LEVEL = 1e-3  # reject "the output law is the target's" when the chi-square p-value < 1e-3
MC_MIN_TV = 0.02  # the smallest distortion (TV over the 27 outcomes) the test must detect




EXACT_CONFIGS = [
    dict(temperature=1),
    dict(temperature=Fraction(1, 2)),
    dict(temperature=Fraction(1, 3)),
    dict(temperature=0),
    dict(top_k=2),
    dict(top_p=Fraction(3, 5)),
    dict(temperature=Fraction(1, 2), top_k=2, top_p=Fraction(9, 10)),
]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("cfg", EXACT_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_speculative_joint_equals_target_exactly(k, cfg):
    """Fractions, equality (not tolerance): the first 4 tokens of speculative decoding have the
    target's law, for K = 1..4, temperatures 1, 1/2, 1/3, 0 and top-k / top-p."""
    for target, draft, prompt in ((TARGET, DRAFT, PROMPT), (TARGET2, DRAFT, PROMPT), (SPARSE_T, SPARSE_D, (1,))):
        spec = toy.speculative_joint(target, draft, prompt, 4, k, **cfg)
        assert spec == toy.target_joint(target, prompt, 4, **cfg)
        assert sum(spec.values()) == 1


def test_exact_enumerator_can_fail():
    """The equality is not vacuous: a different draft processing or a greedy bonus breaks it."""
    spec = toy.speculative_joint(TARGET, DRAFT, PROMPT, 3, 2)
    assert spec != toy.target_joint(TARGET, PROMPT, 3, temperature=Fraction(1, 2))
    assert spec != toy.target_joint(DRAFT, PROMPT, 3)
    # the step law itself: its blocks have lengths 1..K+1 and its mass is 1
    step = toy.speculative_step_law(TARGET, DRAFT, PROMPT, 2, horizon=10)
    assert sum(step.values()) == 1 and {len(b) for b in step} == {1, 2, 3}


def test_dropped_bonus_is_still_exact():
    """Pitfall 3b (no bonus token after K acceptances) is an efficiency bug, not a law bug."""
    for k in (1, 2, 3):
        assert toy.speculative_joint(TARGET, DRAFT, PROMPT, 4, k, bonus=False) == toy.target_joint(TARGET, PROMPT, 4)


def test_process_law_rules():
    law = (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5))
    assert toy.process_law(law, Fraction(1, 2)) == (Fraction(25, 38), Fraction(9, 38), Fraction(4, 38))
    assert toy.process_law(law, 0) == (1, 0, 0)
    assert toy.process_law((Fraction(1, 3),) * 3, 0) == (1, 0, 0)  # ties -> lowest id
    assert toy.process_law(law, 1, top_k=1) == (1, 0, 0)
    assert toy.process_law((Fraction(2, 5), Fraction(2, 5), Fraction(1, 5)), 1, top_k=1) == (Fraction(1, 2), Fraction(1, 2), 0)
    assert toy.process_law(law, 1, top_p=0.5) == (1, 0, 0)  # mass before 2nd token = 1/2, not < 1/2
    assert toy.process_law(law, 1, top_p=0.51) == (Fraction(5, 8), Fraction(3, 8), 0)
    assert toy.process_law(law, 1, top_p=0.8) == (Fraction(5, 8), Fraction(3, 8), 0)  # 0.8 read as 4/5
    for bad in (2, Fraction(2, 3), 0.3):
        with pytest.raises(ValueError, match="temperature"):
            toy.process_law(law, bad)


@pytest.mark.parametrize(
    "cfg", [dict(temperature=1.0), dict(temperature=0.5), dict(temperature=1 / 3), dict(temperature=0.0),
            dict(top_k=2), dict(top_p=0.6), dict(temperature=0.5, top_p=0.8)]
)
def test_torch_processing_matches_fraction_twin(cfg):
    """The torch path the Monte Carlo tests use (logits_to_probs on toy log-probs) is the
    float image of the exact processing for every context of the test models."""
    for model in (TARGET, DRAFT, TARGET2, SPARSE_T):
        for ctx, law in model.table.items():
            exact = toy.process_law(law, Fraction(cfg.get("temperature", 1.0)).limit_denominator(10), cfg.get("top_k"),
                                    cfg.get("top_p"))
            got = logits_to_probs(model.logits(torch.tensor(ctx)), **cfg)  # [V]
            assert torch.allclose(got, torch.tensor([float(v) for v in exact], dtype=torch.float64), atol=1e-12), (ctx, cfg)


def test_markov_validation():
    with pytest.raises(ValueError, match="law"):
        toy.MarkovLM({(0,): (Fraction(1, 2), Fraction(1, 3)), (1,): (1, 0)}, vocab=2)
    with pytest.raises(ValueError, match="lacks"):
        toy.MarkovLM({(0,): (1, 0)}, vocab=2)
    with pytest.raises(ValueError, match="context"):
        TARGET2.next_law((0,))
    with pytest.raises(ValueError, match="prompt"):
        toy.sample_speculative(TARGET2, DRAFT, (0,), 3, 2, 4, torch.Generator())


def test_sample_target_matches_its_law():
    gen = torch.Generator().manual_seed(7)
    out = toy.sample_target(TARGET, PROMPT, 2, 20_000, gen)  # [B, 2]
    assert out.shape == (20_000, 2)
    from specdec_lesson.stats import chi_square_test

    law = {k: float(v) for k, v in toy.target_joint(TARGET, PROMPT, 2).items()}
    assert chi_square_test(toy.counts_of(out), law)[2] > MC_LEVEL


def test_monte_carlo_power():
    """Power of the Monte Carlo test below, analytically: for ANY alternative at TV >= 0.02 from
    the target over the 27 cells, lambda >= 4 n TV^2 = 48 (Cauchy-Schwarz), and a non-central
    chi-square(26, 48) exceeds the 1e-3 critical value 54.05 with probability >= 0.90
    (>= 0.99 for TV 0.025, 1.00 for TV 0.03).  Fewer cells (top-k/top-p: 8) only raise it."""
    assert abs(chi2_isf(MC_LEVEL, 26) - 54.05) < 0.01
    assert chi_square_power(MC_BATCH, 26, min_noncentrality(MC_BATCH, MC_MIN_TV), MC_LEVEL) >= 0.90
    assert chi_square_power(MC_BATCH, 26, min_noncentrality(MC_BATCH, 0.03), MC_LEVEL) >= 0.999


MC_CONFIGS = [  # (target, k, processing)
    (TARGET, 2, dict(temperature=1.0)),
    (TARGET, 2, dict(temperature=0.5)),
    (TARGET, 1, dict(temperature=1.0, top_k=2)),
    (TARGET, 2, dict(temperature=0.5, top_p=0.8)),
    (TARGET, 3, dict(temperature=1.0, top_p=0.6)),
    (TARGET2, 3, dict(temperature=1.0)),
]


@pytest.mark.parametrize("target,k,cfg", MC_CONFIGS, ids=[f"k{k}-" + ",".join(f"{a}={b}" for a, b in c.items())
                                                            for _, k, c in MC_CONFIGS])
def test_monte_carlo_joint_law_of_real_verify_chain(target, k, cfg):
    """The real verify_chain, 30,000 independent chains as one batch, first 3 emitted tokens:
    chi-square against the target's exact joint law, reject at p < 1e-3 (false-alarm rate 1e-3
    per config; seeds are fixed, so the outcome is deterministic).  Power >= 0.90 against any
    distortion of TV >= 0.02 (see test_monte_carlo_power); tests/test_pitfalls.py shows the same
    test flagging every law-changing bug."""
    gen = torch.Generator().manual_seed(1234)
    res = toy.mc_joint_check(target, DRAFT, PROMPT, MC_N, k, MC_BATCH, gen, **cfg)
    assert res["p_value"] > MC_LEVEL, res["p_value"]
    assert res["tv"] < MC_MIN_TV
