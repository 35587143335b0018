"""verify_chain: greedy equivalence, edge cases, random-number protocol, precision, bad input."""

import pytest
import torch

from specdec_lesson.sampling import logits_to_probs
from specdec_lesson.verify import (
    as_verify_law,
    check_verify_inputs,
    draw_verify_randoms,
    race_sample,
    verify_chain,
    verify_chain_from_randoms,
)


def _laws(gen, *shape):
    return torch.softmax(torch.randn(*shape, generator=gen, dtype=torch.float64) * 2, dim=-1)


def _one_hot(tokens, V):
    return torch.nn.functional.one_hot(tokens, V).double()


@pytest.mark.parametrize("sampled_draft", [False, True])
def test_greedy_equals_accept_while_argmax_matches(sampled_draft):
    """T = 0: accept while the drafted token is the target's argmax, then emit the argmax.
    Holds for a one-hot (greedy) q and for any sampled q (p one-hot decides alone)."""
    gen = torch.Generator().manual_seed(0)
    B, K, V = 512, 4, 6
    logits = torch.randn(B, K + 1, V, generator=gen, dtype=torch.float64)
    target_probs = logits_to_probs(logits, temperature=0.0)  # [B, K+1, V]
    greedy = logits.argmax(-1)  # [B, K+1]
    # drafts agree with the target's argmax with probability 0.7 per position
    noise = torch.randint(0, V, (B, K), generator=gen)
    draft_tokens = torch.where(torch.rand(B, K, generator=gen) < 0.7, greedy[:, :K], noise)  # [B, K]
    draft_probs = _laws(gen, B, K, V) if sampled_draft else _one_hot(draft_tokens, V)
    n_acc, nxt = verify_chain(target_probs, draft_probs, draft_tokens, gen)
    match = (draft_tokens == greedy[:, :K]).long().cumprod(-1).sum(-1)  # [B]
    assert torch.equal(n_acc, match)
    assert torch.equal(nxt, greedy[torch.arange(B), match])
    assert len(set(n_acc.tolist())) == K + 1  # every acceptance length occurred


def test_p_equals_q_accepts_everything():
    gen = torch.Generator().manual_seed(1)
    B, K, V = 4096, 3, 5
    p = _laws(gen, B, K + 1, V)
    tokens = torch.multinomial(p[:, :K].reshape(-1, V), 1, generator=gen).view(B, K)
    n_acc, nxt = verify_chain(p, p[:, :K].clone(), tokens, gen)
    assert (n_acc == K).all()
    assert (nxt >= 0).all() and (nxt < V).all()


def test_disjoint_supports_accept_nothing():
    """q on {0, 1}, p on {2, 3}: nothing is accepted and the residual is p itself."""
    gen = torch.Generator().manual_seed(2)
    B, K, V = 4000, 2, 4
    q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64).expand(B, K, V)
    p = torch.tensor([0.0, 0.0, 0.25, 0.75], dtype=torch.float64).expand(B, K + 1, V)
    tokens = torch.randint(0, 2, (B, K), generator=gen)
    n_acc, nxt = verify_chain(p, q, tokens, gen)
    assert (n_acc == 0).all()
    assert set(nxt.tolist()) == {2, 3}
    frac3 = float((nxt == 3).double().mean())
    assert abs(frac3 - 0.75) < 0.035  # binomial sd 0.0068: 5 sigma


def test_k1_v2_single_step_law_and_token_zero():
    """K = 1, V = 2, drafting token 0: P(accept) = min(1, p0/q0) and the emitted first token
    has law p.  200,000 rows; sd of a frequency <= 0.0011, tolerance 0.006 (5 sigma)."""
    gen = torch.Generator().manual_seed(3)
    B = 200_000
    p = torch.tensor([[0.3, 0.7], [0.6, 0.4]], dtype=torch.float64).expand(B, 2, 2)
    q = torch.tensor([[[0.8, 0.2]]], dtype=torch.float64).expand(B, 1, 2)
    tokens = torch.multinomial(q[:, 0], 1, generator=gen)  # [B, 1]
    n_acc, nxt = verify_chain(p, q, tokens, gen)
    first = torch.where(n_acc == 1, tokens[:, 0], nxt)
    assert abs(float((first == 0).double().mean()) - 0.3) < 0.006
    accept_rate_of_0 = float(n_acc[tokens[:, 0] == 0].double().mean())
    assert abs(accept_rate_of_0 - 0.3 / 0.8) < 0.006
    assert (n_acc[tokens[:, 0] == 1] == 1).all()  # p(1) >= q(1): always accepted
    # bonus after acceptance comes from p_1 = (0.6, 0.4)
    assert abs(float((nxt[n_acc == 1] == 0).double().mean()) - 0.6) < 0.01


def test_rows_accept_different_lengths():
    """One batch, one-hot laws force row r to accept exactly r drafts; each row's next token
    comes from its own position (residual row, or the bonus for the full row)."""
    B, V = 4, 5
    draft_tokens = torch.tensor([[1, 2, 3]] * B)
    draft_probs = _one_hot(draft_tokens, V)  # [B, K, V]
    target_tokens = torch.tensor([[4, 2, 3, 0], [1, 4, 3, 0], [1, 2, 4, 0], [1, 2, 3, 0]])  # [B, K+1]
    target_probs = _one_hot(target_tokens, V)  # [B, K+1, V]
    n_acc, nxt = verify_chain(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(0))
    assert n_acc.tolist() == [0, 1, 2, 3]
    assert nxt.tolist() == [4, 4, 4, 0]  # the bonus of the last row is token id 0


def test_generator_protocol_is_reproducible():
    """verify_chain == verify_chain_from_randoms(draw_verify_randoms(...)) from the same state,
    and the same generator state gives the same answer twice."""
    gen = torch.Generator().manual_seed(4)
    B, K, V = 64, 4, 7
    tp, dp = _laws(gen, B, K + 1, V), _laws(gen, B, K, V)
    dt = torch.randint(0, V, (B, K), generator=gen)
    state = gen.get_state()
    a = verify_chain(tp, dp, dt, gen)
    gen.set_state(state)
    u, e = draw_verify_randoms(B, K, V, dtype=tp.dtype, generator=gen)
    b = verify_chain_from_randoms(tp, dp, dt, u, e)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert (e > 0).all() and (u >= 0).all() and (u < 1).all()


def test_race_sample_law():
    """argmax(w / E) picks v with probability w(v) / sum w (unnormalised weights).  100,000 draws."""
    gen = torch.Generator().manual_seed(5)
    w = torch.tensor([0.0, 2.0, 1.0, 1.0], dtype=torch.float64).expand(100_000, 4)
    _, e = draw_verify_randoms(100_000, 1, 4, dtype=torch.float64, generator=gen)
    freq = torch.bincount(race_sample(w, e), minlength=4).double() / 100_000
    assert freq[0] == 0
    assert (freq - torch.tensor([0, 0.5, 0.25, 0.25], dtype=torch.float64)).abs().max() < 0.008


def test_float32_inputs_work():
    gen = torch.Generator().manual_seed(6)
    tp, dp = _laws(gen, 8, 3, 5).float(), _laws(gen, 8, 2, 5).float()
    n_acc, nxt = verify_chain(tp, dp, torch.randint(0, 5, (8, 2), generator=gen), gen)
    assert n_acc.dtype == torch.int64 and nxt.shape == (8,)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda tp, dp, dt: (tp[0], dp, dt), r"target_probs must be \[B, K\+1, V\]"),
        (lambda tp, dp, dt: (tp[:, :1], dp[:, :0], dt[:, :0]), "K\\+1 >= 2"),
        (lambda tp, dp, dt: (tp, dp[:, :1], dt), "draft_probs must be"),
        (lambda tp, dp, dt: (tp, dp[..., :4], dt), "draft_probs must be"),
        (lambda tp, dp, dt: (tp, dp, dt[:1]), "draft_tokens must be"),
        (lambda tp, dp, dt: (tp, dp, dt.double()), "integer"),
        (lambda tp, dp, dt: (tp, dp, dt + 5), "must lie in"),
        (lambda tp, dp, dt: (tp, dp, dt - 1), "must lie in"),
        (lambda tp, dp, dt: (tp * 1.01, dp, dt), "sum to 1"),
        (lambda tp, dp, dt: (tp, dp * 0.9, dt), "sum to 1"),
        (lambda tp, dp, dt: (tp.masked_fill(tp > 0.3, float("nan")), dp, dt), "finite"),
        (lambda tp, dp, dt: (tp - 0.5, dp, dt), "non-negative"),
        (lambda tp, dp, dt: (tp.long(), dp, dt), "floating-point"),
    ],
)
def test_bad_input_raises_one_clear_value_error(mutate, match):
    gen = torch.Generator().manual_seed(7)
    tp, dp = _laws(gen, 3, 3, 5), _laws(gen, 3, 2, 5)
    dt = torch.randint(0, 5, (3, 2), generator=gen)
    with pytest.raises(ValueError, match=match):
        verify_chain(*mutate(tp, dp, dt), gen)


# ------------------------------------------------------------------ batch 0 and precision


def test_batch_zero_returns_empty_outputs():
    """B = 0 is a valid batch: two empty int64 tensors, from the validated path and the core alike."""
    V, K = 5, 3
    tp, dp, dt = torch.zeros(0, K + 1, V), torch.zeros(0, K, V), torch.zeros(0, K, dtype=torch.long)
    for n_acc, nxt in (verify_chain(tp, dp, dt, torch.Generator().manual_seed(0)),
                       verify_chain_from_randoms(tp, dp, dt, *draw_verify_randoms(0, K, V))):
        assert n_acc.shape == nxt.shape == (0,) and n_acc.dtype == nxt.dtype == torch.int64
    with pytest.raises(ValueError, match="vocabulary"):
        verify_chain(torch.zeros(0, K + 1, 0), torch.zeros(0, K, 0), dt)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_randoms_are_never_half_precision(dtype):
    """Uniforms and exponentials come in fp32 (fp64 for fp64 laws) whatever the laws' dtype; the
    stream for fp32 laws is the one the library always drew (same numbers as dtype=float32)."""
    want = torch.float64 if dtype == torch.float64 else torch.float32
    u, e = draw_verify_randoms(4, 3, 7, dtype=dtype, generator=torch.Generator().manual_seed(1))
    assert u.dtype == e.dtype == want
    ref = draw_verify_randoms(4, 3, 7, dtype=want, generator=torch.Generator().manual_seed(1))
    assert torch.equal(u, ref[0]) and torch.equal(e, ref[1])


def test_half_precision_randoms_are_refused():
    tp, dp = torch.full((1, 2, 4), 0.25), torch.full((1, 1, 4), 0.25)
    dt = torch.zeros(1, 1, dtype=torch.long)
    u, e = torch.rand(1, 1), torch.ones(1, 4)
    for bad in ((u.bfloat16(), e), (u, e.half())):
        with pytest.raises(ValueError, match="fp32 or fp64"):
            verify_chain_from_randoms(tp, dp, dt, *bad)


def _half_laws(gen, dtype, B, K, V):
    """Softmax laws rounded to ``dtype`` (rows sum to 1 only up to that rounding)."""
    tp = torch.softmax(torch.randn(B, K + 1, V, generator=gen) * 2, -1).to(dtype)  # [B, K+1, V]
    dp = torch.softmax(torch.randn(B, K, V, generator=gen) * 2, -1).to(dtype)  # [B, K, V]
    dt = torch.multinomial(dp.reshape(B * K, V).float(), 1, generator=gen).reshape(B, K)  # [B, K] drawn from dp
    return tp, dp, dt


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_laws_verify_as_their_fp32_renormalisation(dtype):
    """bf16 / fp16 laws are verified as exactly the fp32 laws p / sum p, q / sum q (the law
    torch.multinomial samples q from) with the same fp32 random numbers: bit-equal outputs."""
    gen = torch.Generator().manual_seed(8)
    B, K, V = 2048, 4, 50
    tp, dp, dt = _half_laws(gen, dtype, B, K, V)
    tp32, dp32 = tp.float() / tp.float().sum(-1, keepdim=True), dp.float() / dp.float().sum(-1, keepdim=True)
    assert torch.equal(as_verify_law(tp), tp32) and as_verify_law(tp).dtype == torch.float32
    a = verify_chain(tp, dp, dt, torch.Generator().manual_seed(9))
    b = verify_chain(tp32, dp32, dt, torch.Generator().manual_seed(9))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert len(set(a[0].tolist())) == K + 1  # every acceptance length occurred


def test_validation_tolerance_follows_the_dtype():
    """Sharp bf16 softmax laws over 3 tokens sum to 1 only within bf16 rounding (here off by more
    than the fp32 tolerance 1e-3): accepted for bf16.  A row summing to 1.1 is refused in every dtype."""
    gen = torch.Generator().manual_seed(10)
    B, K, V = 512, 2, 3
    tp = torch.softmax(torch.randn(B, K + 1, V, generator=gen) * 4, -1).to(torch.bfloat16)  # [B, K+1, V]
    dp = torch.softmax(torch.randn(B, K, V, generator=gen) * 4, -1).to(torch.bfloat16)  # [B, K, V]
    dt = torch.zeros(B, K, dtype=torch.long)
    assert float((tp.double().sum(-1) - 1).abs().max()) > 1e-3
    check_verify_inputs(tp, dp, dt)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        with pytest.raises(ValueError, match="sum to 1"):
            check_verify_inputs(tp.to(dtype) * 1.1, dp.to(dtype), dt)


def test_race_sample_computes_in_fp32():
    """Two equal bf16 weights against the bf16 exponentials 1 - 2^-8 and 1 - 2^-7: in bf16 the
    ratios w / E round to the same value (a tie the argmax gives to token 0), in fp32 the smaller
    E, token 1, wins."""
    w = torch.full((1, 2), 0.5, dtype=torch.bfloat16)
    e = torch.tensor([[1 - 2**-8, 1 - 2**-7]], dtype=torch.bfloat16)
    assert (w / e)[0, 0] == (w / e)[0, 1]
    assert int(race_sample(w, e)[0]) == 1
