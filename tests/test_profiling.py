"""Machine profiling helpers: shapes and positivity of results, cache crop, argument checks.

These tests do not check speed (a shared CI machine is too noisy for that); they run in a few
seconds on tiny models and small arrays."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_lesson.models import tiny_llama
from specdec_lesson.profiling import (
    crop_to,
    measure_bandwidth,
    measure_framework_overhead,
    measure_matmul_flops,
    measure_verify_curve,
)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, dtype=torch.float32)


def _finite_positive(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_bandwidth_and_flops_positive_and_plausible():
    bw = measure_bandwidth(size_mb=8, repeats=2)
    flops = measure_matmul_flops(n=128, repeats=2)
    assert _finite_positive(bw) and 1e8 < bw < 1e13  # 0.1 GB/s .. 10 TB/s
    assert _finite_positive(flops) and 1e7 < flops < 1e15


def test_verify_curve_keys_and_values(model):
    curve = measure_verify_curve(model, n_max=4, context=16, repeats=2)
    assert list(curve) == [1, 2, 3, 4]
    assert all(_finite_positive(t) for t in curve.values())
    some = measure_verify_curve(model, context=8, repeats=1, ns=[3, 1])
    assert list(some) == [3, 1] and all(_finite_positive(t) for t in some.values())


def test_crop_to_restores_cache_length(model):
    from transformers import DynamicCache

    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))  # [1, 20]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :12], cache=cache, use_cache=True)
        want = model(input_ids=ids[:, 12:13], position_ids=torch.tensor([[12]]), cache=cache, use_cache=True).logits
        crop_to(cache, 12)
        assert cache.get_seq_length() == 12
        model(input_ids=ids[:, 12:20], position_ids=torch.arange(12, 20).unsqueeze(0), cache=cache, use_cache=True)
        assert cache.get_seq_length() == 20
        crop_to(cache, 12)
        assert cache.get_seq_length() == 12
        crop_to(cache, 12)  # no-op
        assert cache.get_seq_length() == 12
        # after the rollback, the same one-token forward sees the same context: same logits
        again = model(input_ids=ids[:, 12:13], position_ids=torch.tensor([[12]]), cache=cache, use_cache=True).logits
        assert torch.allclose(again, want, atol=1e-6)
        with pytest.raises(ValueError, match="shorter"):
            crop_to(cache, 30)


def test_framework_overhead_positive():
    assert _finite_positive(measure_framework_overhead(num_layers=1, context=8, repeats=2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_max": 0}, "n_max"),
        ({"context": 0}, "context"),
        ({"repeats": 0}, "repeats"),
        ({"ns": []}, "ns"),
        ({"ns": [0, 1]}, "ns"),
        ({"n_max": 2.5}, "n_max"),
    ],
)
def test_verify_curve_rejects_bad_arguments(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure_verify_curve(model, **kwargs)


def test_bandwidth_flops_reject_bad_arguments():
    with pytest.raises(ValueError, match="size_mb"):
        measure_bandwidth(size_mb=0)
    with pytest.raises(ValueError, match="repeats"):
        measure_bandwidth(size_mb=1, repeats=0)
    with pytest.raises(ValueError, match="n must"):
        measure_matmul_flops(n=-3)


def test_wall_ms_and_count_parameters():
    import torch

    from specdec_lesson.drafters import noisy_copy, self_draft
    from specdec_lesson.models import tiny_pair
    from specdec_lesson.profiling import count_parameters, wall_ms

    calls = []
    ms = wall_ms(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and ms >= 0
    for bad in ({"repeats": 0}, {"warmup": -1}, {"quantile": 1.5}):
        with pytest.raises(ValueError):
            wall_ms(lambda: None, **bad)
    lin = torch.nn.Linear(3, 4)
    tied = torch.nn.Sequential(lin, lin)  # a shared tensor counts once
    assert count_parameters(tied) == 3 * 4 + 4
    target, _, _ = tiny_pair()
    assert count_parameters(noisy_copy(target, 0.1)) == count_parameters(target)
    draft = self_draft(target, 1)
    assert len(draft.model.layers) == 1 and draft.lm_head is target.lm_head
    assert self_draft(target, len(target.model.layers)) is None
    with pytest.raises(ValueError):
        self_draft(target, 0)
    with pytest.raises(ValueError):
        noisy_copy(target, -1.0)


def _packed_model() -> torch.nn.Module:
    from specdec_lesson.fastcpu import count_packed, prepack_linears

    m = tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, dtype=torch.float32)
    prepack_linears(m)
    if count_packed(m) == 0:
        pytest.skip("the oneDNN packed linear is not available in this PyTorch build")
    return m


def _fake_probe(monkeypatch, factors):
    """measure_verify_curve replaced by a deterministic one: call i (one path, one round) scaled by factors[i]."""
    import itertools

    from specdec_lesson import profiling

    calls = itertools.count()
    monkeypatch.setattr(profiling, "measure_verify_curve",
                        lambda m, context, repeats, ns: {n: 0.010 * n * factors[next(calls) % len(factors)] for n in ns})


def test_tune_dispatch_prints_a_status_line_and_progress(monkeypatch, capsys):
    """A probe that takes minutes on a busy machine must not be silent: one status line before, one per round."""
    from specdec_lesson.profiling import tune_dispatch

    model = _packed_model()
    _fake_probe(monkeypatch, [1.0])
    tune_dispatch(model, widths=(1, 2, 8), repeats=3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[specdec] probing plain vs pre-packed weights at widths 1..8 (3 rounds; a few seconds on a quiet " \
                     "machine) ..."
    assert [line.split(" done")[0] for line in err[1:]] == [f"[specdec] probe round {i}/3" for i in (1, 2, 3)]
    assert "s left)" in err[1] and err[3].endswith(" s")
    tune_dispatch(model, widths=(1, 2), repeats=2, verbose=False)
    assert capsys.readouterr().err == ""


def test_noisy_probe_warning_says_what_was_measured(monkeypatch):
    """The warning reports the measured spread and both possible causes (a Zen 3 with nothing else running showed
    17-33%), not "another process is using the cores" as a fact; the bench's results note uses the same words."""
    from specdec_lesson import profiling
    from specdec_lesson.bench import loading

    model = _packed_model()
    _fake_probe(monkeypatch, [0.75, 0.75, 1.0, 1.0, 1.25, 1.25])  # rounds at 0.75x, 1x, 1.25x: a spread of 50%
    with pytest.warns(UserWarning) as rec:
        res = profiling.tune_dispatch(model, widths=(1, 2), repeats=3, verbose=False)
    text = str(rec[0].message)
    assert text == ("tune_dispatch: the dispatch probe's repeats varied by 50% (median relative spread; a quiet machine "
                    "shows 2-3%), so the plain/pre-packed choice and the timings taken alongside may be unreliable: "
                    "another process may be using the cores, or this machine is noisy; rerun on a quiet machine to be sure")
    assert res["noisy"] and res["spread"] == 0.5
    monkeypatch.setattr(profiling, "tune_dispatch", lambda target, repeats, **kw: res)
    notes: list[str] = []
    loading._tune(model, "cpu", notes)
    assert notes[-1] == f"WARNING: {profiling.noisy_probe_note(0.5)}" and text.endswith(profiling.noisy_probe_note(0.5))
