"""logits_to_probs / sample_from_probs / SamplingConfig: rules, exact twin, bad input."""

from fractions import Fraction

import pytest
import torch

from specdec_lesson.sampling import SamplingConfig, check_sampling_args, logits_to_probs, sample_from_probs
from specdec_lesson.toy import process_law


def test_temperature_one_is_softmax_and_half_squares():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    assert torch.allclose(logits_to_probs(logits), torch.softmax(logits, -1))
    p = torch.softmax(logits, -1)
    sq = p**2 / (p**2).sum(-1, keepdim=True)
    assert torch.allclose(logits_to_probs(logits, 0.5), sq)  # T = 1/2: p^2 normalised


def test_greedy_is_one_hot_lowest_id_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    probs = logits_to_probs(logits, temperature=0.0, top_k=2, top_p=0.3)
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_top_k_keeps_ties_at_the_boundary():
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    probs = logits_to_probs(logits, top_k=2)
    assert (probs > 0).tolist() == [True, True, True, False]
    assert torch.allclose(probs.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.equal(logits_to_probs(logits, top_k=10), logits_to_probs(logits))  # k >= V: no-op


def test_top_p_smallest_prefix_reaching_p():
    law = torch.tensor([0.1, 0.5, 0.25, 0.15], dtype=torch.float64)
    logits = law.log()
    assert (logits_to_probs(logits, top_p=0.5) > 0).tolist() == [False, True, False, False]
    assert (logits_to_probs(logits, top_p=0.51) > 0).tolist() == [False, True, True, False]
    assert (logits_to_probs(logits, top_p=0.85) > 0).tolist() == [False, True, True, True]
    assert (logits_to_probs(logits, top_p=0.01) > 0).tolist() == [False, True, False, False]  # argmax always kept
    assert torch.equal(logits_to_probs(logits, top_p=1.0), logits_to_probs(logits))


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_exact_fraction_twin(seed):
    """logits_to_probs(log p) is the float image of toy.process_law(p) for random rational laws
    (T in {1, 1/2, 1/3, 0}, top-k, top-p away from exact ties)."""
    import random

    rng = random.Random(seed)
    for _ in range(20):
        w = [rng.randint(1, 30) for _ in range(6)]
        law = [Fraction(v, sum(w)) for v in w]
        logits = torch.tensor([float(v) for v in law], dtype=torch.float64).log()
        for t in (Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(0)):
            for top_k, top_p in ((None, None), (3, None), (None, 0.737), (4, 0.611)):
                exact = process_law(law, t, top_k, top_p)
                got = logits_to_probs(logits, float(t), top_k, top_p)
                assert torch.allclose(got, torch.tensor([float(v) for v in exact], dtype=torch.float64), atol=1e-12)


def test_batched_shapes_and_no_nan():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 11, generator=gen) * 30
    for kw in (dict(), dict(temperature=0.1, top_k=3), dict(temperature=2.0, top_p=0.2)):
        probs = logits_to_probs(logits, **kw)
        assert probs.shape == logits.shape and torch.isfinite(probs).all()
        assert torch.allclose(probs.sum(-1), torch.ones(2, 3), atol=1e-5)


def test_sample_from_probs_law_and_shape():
    """100,000 draws, 3 categories: sd <= 0.0016, tolerance 0.008 (5 sigma)."""
    gen = torch.Generator().manual_seed(2)
    probs = torch.tensor([0.2, 0.0, 0.8]).expand(4, 25_000, 3)
    tok = sample_from_probs(probs, gen)
    assert tok.shape == (4, 25_000) and tok.dtype == torch.int64
    freq = torch.bincount(tok.flatten(), minlength=3).double() / tok.numel()
    assert freq[1] == 0 and abs(float(freq[2]) - 0.8) < 0.008


def test_sampling_config_applies_the_same_processing():
    cfg = SamplingConfig(0.5, 3, 0.9)
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(cfg.probs(logits), logits_to_probs(logits, 0.5, 3, 0.9))
    assert SamplingConfig().greedy and not cfg.greedy
    assert "top_p=0.9" in repr(cfg)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        logits_to_probs(torch.zeros(3), **kwargs)
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**{"temperature": 1.0, **kwargs})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_raise(bad):
    with pytest.raises(ValueError, match="NaN or infinite"):
        logits_to_probs(torch.tensor([0.0, bad, 1.0]))


def test_bad_logits_tensors_raise():
    with pytest.raises(ValueError, match="floating-point"):
        logits_to_probs(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="vocabulary"):
        logits_to_probs(torch.zeros(3, 0))
    check_sampling_args(0.0, None, None)  # greedy defaults are valid


# ------------------------------------------------------------------ numerics: tiny temperatures, half-precision logits

TINY_T = [1e-4, 1e-38, 1e-46, 5e-324]  # 1e-38 is subnormal in fp32, 1e-46 rounds to 0 in fp32, 5e-324 is fp64's least


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", TINY_T)
def test_tiny_temperature_is_one_hot_on_the_maximum(dtype, temperature):
    """l / T overflows for a tiny T (inf - inf = NaN in the softmax); (l - max l) / T does not: the
    law tends to the one-hot argmax, with or without top-k / top-p, in fp32 (fp64 for fp64 logits)."""
    logits = torch.tensor([[20.0, 10.0, 0.0], [0.0, 3.0, 1.0]], dtype=dtype)
    want = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    for top_k, top_p in ((None, None), (2, None), (None, 0.9), (2, 0.5), (1, None)):
        probs = logits_to_probs(logits, temperature, top_k, top_p)  # [2, V]
        assert probs.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert torch.equal(probs.double(), want), (top_k, top_p, probs)


@pytest.mark.parametrize("temperature", TINY_T)
def test_tiny_temperature_splits_tied_maxima_evenly(temperature):
    """The T -> 0 limit of softmax(l / T) is uniform over the tied maxima (greedy, T = 0, breaks the
    tie by the lowest id instead); top-k = 1 keeps both ties."""
    logits = torch.tensor([[5.0, 7.0, 7.0, -3.0]], dtype=torch.float16)
    for top_k in (None, 1):
        assert logits_to_probs(logits, temperature, top_k).tolist() == [[0.0, 0.5, 0.5, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_give_the_fp32_law(dtype):
    """fp16 / bf16 logits are processed exactly as their (exact) fp32 upcast, at every temperature,
    top-k and top-p: the returned law is fp32 and sums to 1 within fp32 rounding."""
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(6, 50, generator=gen) * 8).to(dtype)  # [6, V]
    for t in (2.0, 1.0, 0.3, 1e-4, 1e-30, 0.0):
        for top_k, top_p in ((None, None), (5, None), (None, 0.8), (7, 0.6)):
            got = logits_to_probs(logits, t, top_k, top_p)
            assert got.dtype == torch.float32
            assert torch.equal(got, logits_to_probs(logits.float(), t, top_k, top_p))
            assert torch.isfinite(got).all() and torch.allclose(got.sum(-1), torch.ones(6), atol=1e-5)


def test_shift_before_scaling_keeps_ordinary_temperatures_unchanged():
    """At ordinary temperatures the stable form is the textbook softmax(l / T) to rounding."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 30, generator=gen, dtype=torch.float64) * 5
    for t in (0.05, 0.7, 1.0, 3.0, 1e6):
        assert torch.allclose(logits_to_probs(logits, t), torch.softmax(logits / t, -1), atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_tokens_is_the_checked_argmax(dtype):
    """The engines' greedy pick: the first maximal index (ties to the lowest id, as the one-hot law of T = 0) on any
    leading shape, -inf entries allowed; NaN, +inf or a row of -inf only raise NonFiniteLogitsError naming the model
    and the step."""
    from specdec_lesson.sampling import NonFiniteLogitsError, greedy_tokens

    g = torch.Generator().manual_seed(0)
    for V in (1, 7, 4096, 49152):
        logits = torch.randint(0, 4, (2, 3, V), generator=g).to(dtype)  # few values: ties everywhere
        logits[0, 1, : V // 2] = float("-inf")
        assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
        assert torch.equal(greedy_tokens(logits, "target", 3), logits_to_probs(logits.float(), 0.0, validate=False).argmax(-1))
    assert greedy_tokens(torch.zeros(0, 5)).shape == (0,)
    for bad in (float("nan"), float("inf")):
        logits = torch.zeros(2, 3, 50, dtype=dtype)
        logits[1, 2, 7] = bad
        with pytest.raises(NonFiniteLogitsError, match="the target model's logits .* at decoding step 4"):
            greedy_tokens(logits, "target", 4)
    logits = torch.zeros(2, 50, dtype=dtype)
    logits[1] = float("-inf")  # a row with no finite logit
    with pytest.raises(NonFiniteLogitsError):
        greedy_tokens(logits)
