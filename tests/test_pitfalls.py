"""Every buggy variant in specdec_lesson.pitfalls is caught; the correct sampler is not."""

import pytest
import torch

from specdec_lesson import pitfalls as P
from specdec_lesson import toy
from specdec_lesson.theory import expected_tokens
from specdec_lesson.verify import draw_verify_randoms, verify_chain, verify_chain_from_randoms

# The toy pair and Monte Carlo protocol of tests/test_toy.py (power >= 0.90 against TV 0.02 there).
TARGET = toy.random_markov(3, order=1, seed=1)
DRAFT = toy.random_markov(3, order=1, seed=2)
PROMPT = (0, 0)
MC_BATCH, MC_N, MC_LEVEL, MC_MIN_TV = 30_000, 3, 1e-3, 0.02


LAW_BUGS = [  # (label, harness override, processing): the same Monte Carlo test as tests/test_toy.py
    ("1 greedy draft with softmax q", dict(draft_fn=P.buggy_draft_greedy_softmax_q), dict(temperature=1.0)),
    ("2 q without the temperature", dict(draft_fn=P.buggy_draft_q_unprocessed), dict(temperature=0.5)),
    ("2 q without top-p", dict(draft_fn=P.buggy_draft_q_unprocessed), dict(temperature=1.0, top_p=0.6)),
    ("3a argmax bonus token", dict(verify_fn=P.buggy_verify_argmax_bonus), dict(temperature=1.0)),
    ("5 reseeded every step", dict(verify_fn=P.buggy_verify_reseeded), dict(temperature=1.0)),
]


@pytest.mark.parametrize("label,harness,cfg", LAW_BUGS, ids=[b[0] for b in LAW_BUGS])
def test_monte_carlo_flags_each_law_bug(label, harness, cfg):
    """Same protocol as test_toy.test_monte_carlo_joint_law_of_real_verify_chain (30,000 chains,
    K = 2, first 3 tokens, reject at p < 1e-3, power >= 0.90 at TV 0.02): each bug is rejected
    and its measured TV distortion is beyond 0.02.  The correct sampler with the same seed passes."""
    gen = torch.Generator().manual_seed(1234)
    res = toy.mc_joint_check(TARGET, DRAFT, PROMPT, MC_N, 2, MC_BATCH, gen, **cfg, **harness)
    assert res["p_value"] < MC_LEVEL and res["tv"] > MC_MIN_TV, (label, res["p_value"], res["tv"])
    ok = toy.mc_joint_check(TARGET, DRAFT, PROMPT, MC_N, 2, MC_BATCH, torch.Generator().manual_seed(1234), **cfg)
    assert ok["p_value"] > MC_LEVEL


def test_dropped_bonus_keeps_the_law_but_loses_tokens():
    """Pitfall 3b is lossless (the law test rightly does not flag it; the exact enumerator proves
    it in test_toy) but emits alpha^K fewer tokens per step.  i.i.d. positions (same p, q at
    every position) so that E[tokens] = (1 - a^(K+1)) / (1 - a) holds exactly; 200,000 steps,
    standard error of the mean < 0.003, tolerance 0.015 (5 sigma)."""
    gen = torch.Generator().manual_seed(3)
    res = toy.mc_joint_check(TARGET, DRAFT, PROMPT, MC_N, 2, MC_BATCH, gen, verify_fn=P.buggy_verify_no_bonus)
    assert res["p_value"] > MC_LEVEL
    B, K = 200_000, 3
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    alpha = float(torch.minimum(p, q).sum())
    draft_tokens = torch.multinomial(q.expand(B * K, 3), 1, generator=gen).view(B, K)  # [B, K]
    target_probs, draft_probs = p.expand(B, K + 1, 3), q.expand(B, K, 3)
    emitted = {}
    for name, fn in (("ok", verify_chain), ("no_bonus", P.buggy_verify_no_bonus)):
        n_acc, nxt = fn(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(5))
        emitted[name] = float((n_acc + (nxt >= 0).long()).double().mean())
    assert abs(emitted["ok"] - expected_tokens(alpha, K)) < 0.015
    assert abs(emitted["no_bonus"] - (expected_tokens(alpha, K) - alpha**K)) < 0.015


def test_unguarded_residual_returns_token_zero():
    """Pitfall 4 needs an all-zero residual at a rejection, which only floating-point rounding
    produces: p and q equal except p(x) a hair smaller (rows still sum to 1 within float32's
    tolerance).  Forced rejection (u = 0.9999): the guarded verifier samples from p, the
    unguarded one computes 0/0 and always returns token 0.  2,000 draws; P(correct sampler
    returns 0 every time) = 0.2^2000."""
    B = 2000
    target_probs = torch.tensor([[0.2, 0.3996, 0.4]] * 2, dtype=torch.float32).expand(B, 2, 3)  # [B, 2, 3]
    draft_probs = torch.tensor([[[0.2, 0.4, 0.4]]], dtype=torch.float32).expand(B, 1, 3)  # [B, 1, 3]
    draft_tokens = torch.ones(B, 1, dtype=torch.long)  # [B, 1]
    _, expo = draw_verify_randoms(B, 1, 3, generator=torch.Generator().manual_seed(0))
    uniforms = torch.full((B, 1), 0.9999)
    n_ok, tok_ok = verify_chain_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, expo)
    n_bad, tok_bad = P.buggy_verify_unguarded_from_randoms(target_probs, draft_probs, draft_tokens, uniforms, expo)
    assert (n_ok == 0).all() and (n_bad == 0).all()
    assert (tok_bad == 0).all()
    freq = torch.bincount(tok_ok, minlength=3).double() / B
    assert (freq - torch.tensor([0.2, 0.4, 0.4], dtype=torch.float64)).abs().max() < 0.05
    # with ordinary inputs it behaves like the correct verifier (same random-number protocol)
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    tp = torch.softmax(torch.randn(64, 3, 5, generator=gen_a, dtype=torch.float64), -1)
    dp = torch.softmax(torch.randn(64, 2, 5, generator=gen_a, dtype=torch.float64), -1)
    dt = torch.randint(0, 5, (64, 2), generator=gen_a)
    gen_b.set_state(gen_a.get_state())
    assert all(torch.equal(a, b) for a, b in zip(verify_chain(tp, dp, dt, gen_a), P.buggy_verify_unguarded(tp, dp, dt, gen_b)))


def test_registry_is_labelled():
    assert set(P.BUGGY_DRAFT_STEPS) | set(P.BUGGY_VERIFIERS) == {
        "1 greedy draft with softmax q", "2 q not the law sampled from", "3a argmax bonus token",
        "3b bonus dropped (lossless, slower)", "4 unguarded residual", "5 reseeded every step",
    }
    for fn in list(P.BUGGY_DRAFT_STEPS.values()) + list(P.BUGGY_VERIFIERS.values()):
        assert fn.__name__.startswith("buggy_") and "BUG" in fn.__doc__


LOSSY = [(label, fn) for label, fn in P.LOSSY_VERIFIERS.items()]


@pytest.mark.parametrize("label,fn", LOSSY, ids=[lab for lab, _ in LOSSY])
def test_monte_carlo_rejects_each_lossy_shortcut(label, fn):
    """Pitfall 9: a lossy verifier accepts MORE drafts than the exact rule and the same Monte Carlo test
    (30,000 chains, K = 2, power >= 0.90 at TV 0.02) rejects its output law, with TV beyond 0.02."""
    lossy, counts = P.count_acceptance(fn)
    res = toy.mc_joint_check(TARGET, DRAFT, PROMPT, MC_N, 2, MC_BATCH, torch.Generator().manual_seed(1234),
                             temperature=1.0, verify_fn=lossy)
    assert res["p_value"] < MC_LEVEL and res["tv"] > MC_MIN_TV, (label, res["p_value"], res["tv"])
    exact, exact_counts = P.count_acceptance(verify_chain)
    ok = toy.mc_joint_check(TARGET, DRAFT, PROMPT, MC_N, 2, MC_BATCH, torch.Generator().manual_seed(1234),
                            temperature=1.0, verify_fn=exact)
    assert ok["p_value"] > MC_LEVEL
    assert counts["alpha"]() > exact_counts["alpha"]() + 0.05, (counts["alpha"](), exact_counts["alpha"]())


def test_relaxed_threshold_one_is_the_exact_rule():
    """threshold = 1 leaves the uniforms unscaled: the same outputs as verify_chain, random number for random number."""
    gen_a = torch.Generator().manual_seed(2)
    tp = torch.softmax(torch.randn(64, 3, 5, generator=gen_a, dtype=torch.float64), -1)
    dp = torch.softmax(torch.randn(64, 2, 5, generator=gen_a, dtype=torch.float64), -1)
    dt = torch.randint(0, 5, (64, 2), generator=gen_a)
    a = verify_chain(tp, dp, dt, torch.Generator().manual_seed(9))
    b = P.lossy_verify_relaxed(tp, dp, dt, torch.Generator().manual_seed(9), threshold=1.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError):
        P.lossy_verify_relaxed(tp, dp, dt, threshold=0.0)


def test_shared_position_counter_breaks_a_ragged_batch():
    """Pitfall 7: rows of one batch keep 1, 5 and 3 of 5 verify slots (holes in rows 0 and 2).  With the
    library's per-row positions every row's next logits equal the row alone; inside
    ``buggy_shared_positions`` the rows with holes are off, the row without holes is not, and on exit
    the engine's cache is restored."""
    from specdec_lesson.kvcache import SlotCache
    from specdec_lesson.models import tiny_llama

    model = tiny_llama(seed=0)
    original = SlotCache.forward
    gen = torch.Generator().manual_seed(4)
    prompts = torch.randint(0, 64, (3, 6), generator=gen)  # [B, L] equal lengths: no padding
    step = torch.randint(0, 64, (3, 5), generator=gen)  # [B, K+1]
    nxt = torch.randint(0, 64, (3, 1), generator=gen)  # [B, 1]
    keep = [1, 5, 3]
    errors = {}
    for bug in (False, True):
        ctx = P.buggy_shared_positions() if bug else torch.inference_mode()
        with ctx, torch.inference_mode():
            state = SlotCache(model, 3, "cpu")
            state.forward(prompts)
            since = state.num_slots
            state.forward(step)
            state.rollback(since, keep)
            logits, _ = state.forward(nxt)  # [B, 1, V]
            errors[bug] = []
            for b in range(3):
                row = prompts[b].tolist() + step[b, : keep[b]].tolist() + nxt[b].tolist()
                alone = model(input_ids=torch.tensor([row])).logits[0, -1]  # [V]
                errors[bug].append(float((alone - logits[b, -1]).abs().max()))
    assert SlotCache.forward is original
    assert max(errors[False]) < 1e-9
    assert errors[True][1] < 1e-9 and min(errors[True][0], errors[True][2]) > 1e-4, errors[True]


def test_lossy_registry_is_labelled():
    for fn in P.LOSSY_VERIFIERS.values():
        assert fn.__name__.startswith("lossy_") and "LOSSY (pitfall 9)" in fn.__doc__
    assert "BUG (pitfall 7)" in P.buggy_shared_positions.__doc__
