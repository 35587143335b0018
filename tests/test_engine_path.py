"""lean.path (which forward the engines run, and its measured costs) and sim.live (predict, then measure)."""

from __future__ import annotations

import pytest
import torch

import specdec_lesson.lean.slots as slots
from specdec_lesson.drafters import ModelDrafter, noisy_copy
from specdec_lesson.drafters.adaptive_policy import StepCosts, expected_tokens_of
from specdec_lesson.lean.path import engine_verify_curve, tune_engine_dispatch, uses_lean
from specdec_lesson.models import tiny_llama
from specdec_lesson.sim.live import paired_speedup, predicted_speedups


def _tiny(dtype=torch.float32):
    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, dtype=dtype)


class _NotALlama(torch.nn.Module):
    config = None


@pytest.mark.parametrize("default", [True, False])
def test_uses_lean_follows_the_default_and_the_override(monkeypatch, default):
    monkeypatch.setattr(slots, "LEAN_BY_DEFAULT", default)
    model = _tiny()
    assert uses_lean(model) is default
    assert uses_lean(model, lean=True) and not uses_lean(model, lean=False)
    assert not uses_lean(_NotALlama(), lean=True)  # unsupported: Hugging Face's forward


@pytest.mark.parametrize("default", [True, False])
def test_engine_verify_curve_times_the_engines_forward(monkeypatch, default):
    monkeypatch.setattr(slots, "LEAN_BY_DEFAULT", default)
    calls = []
    import specdec_lesson.lean.path as P
    import specdec_lesson.profiling as prof

    real_lean, real_hf = P.lean_verify_curve, prof.verify_curve_rounds
    monkeypatch.setattr(P, "lean_verify_curve", lambda *a, **k: calls.append("lean") or real_lean(*a, **k))
    monkeypatch.setattr(prof, "verify_curve_rounds", lambda *a, **k: calls.append("hf") or real_hf(*a, **k))
    curve = engine_verify_curve(_tiny(), [1, 2, 3], context=8, repeats=2)
    assert sorted(curve) == [1, 2, 3] and all(t > 0 for t in curve.values())
    assert set(calls) == {"lean" if default else "hf"}  # more rounds when the tiny model's timings disagree


# three interleaved rounds in which a neighbour process slowed two of the three one-token forwards: the median
# reads T(1) 30 ms, T(4) 20 ms (a wider forward "cheaper" than one token, every tree "free"); the forward's own cost
# is the fastest round (a shared machine's noise only adds time), and the curve keeps its shape
_NOISY_ROUNDS = {1: [0.030, 0.010, 0.031], 2: [0.011, 0.012, 0.011], 4: [0.013, 0.020, 0.024]}
# worse: every one-token forward of the first three rounds slowed; the fastest of them still reads T(1) > T(4), so
# the probe takes more rounds (their spread is far above NOISY_SPREAD), and a later round finds the quiet T(1)
_BUSY_ROUNDS = {1: [0.030, 0.029, 0.031], 2: [0.011, 0.012, 0.011], 4: [0.013, 0.020, 0.024]}
_LATER_ROUNDS = {1: [0.028, 0.010], 2: [0.012, 0.011], 4: [0.014, 0.013]}
_QUIET_ROUNDS = {1: [0.0100, 0.0101, 0.0102], 2: [0.0110, 0.0111, 0.0110], 4: [0.0130, 0.0131, 0.0132]}


@pytest.mark.parametrize("default", [True, False])
@pytest.mark.parametrize("first,later,want,calls", [
    (_NOISY_ROUNDS, _LATER_ROUNDS, {1: 0.010, 2: 0.011, 4: 0.013}, 2),
    (_BUSY_ROUNDS, _LATER_ROUNDS, {1: 0.010, 2: 0.011, 4: 0.013}, 2),
    (_QUIET_ROUNDS, _BUSY_ROUNDS, {1: 0.0100, 2: 0.0110, 4: 0.0130}, 1),  # quiet: no more rounds taken
])
def test_engine_verify_curve_reports_the_fastest_round(monkeypatch, default, first, later, want, calls):
    import specdec_lesson.lean.path as P
    import specdec_lesson.profiling as prof

    monkeypatch.setattr(slots, "LEAN_BY_DEFAULT", default)
    asked: list[int] = []

    def lean(model, ns, context, rounds, warmup):  # one call per batch of rounds: the first (warm-up), then more
        asked.append(rounds)
        src = first if warmup else later
        assert rounds == len(src[1])
        return {n: src[n] for n in ns}

    def hf(model, ns, context, rounds):  # the first batch of rounds, then the later one
        src = later if asked else first
        asked.append(rounds)
        assert rounds == len(src[1])
        return {n: src[n] for n in ns}

    monkeypatch.setattr(P, "lean_verify_curve", lean)
    monkeypatch.setattr(prof, "verify_curve_rounds", hf)
    max_repeats = 3 + len(later[1])
    assert engine_verify_curve(_tiny(), [1, 2, 4], repeats=3, max_repeats=max_repeats) == pytest.approx(want)
    assert len(asked) == calls


def test_verify_curve_rounds_and_probe_cost():
    from specdec_lesson.profiling import measure_verify_curve, probe_cost, verify_curve_rounds

    assert probe_cost(_NOISY_ROUNDS[1]) == 0.010
    times = verify_curve_rounds(_tiny(), [1, 2], context=8, rounds=3)
    assert sorted(times) == [1, 2] and all(len(ts) == 3 and min(ts) > 0 for ts in times.values())
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        verify_curve_rounds(_tiny(), [1], context=8, rounds=0)
    assert sorted(measure_verify_curve(_tiny(), context=8, repeats=1, ns=[2, 1])) == [1, 2]


def test_tune_engine_dispatch_reports_which_forward(monkeypatch):
    from specdec_lesson.fastcpu import count_packed, prepack_linears

    model = prepack_linears(_tiny())
    if count_packed(model) == 0:
        pytest.skip("the oneDNN packed linear is not available in this PyTorch build")
    monkeypatch.setattr(slots, "LEAN_BY_DEFAULT", True)
    d = tune_engine_dispatch(model, repeats=2, verbose=False)
    assert d["forward"] == "lean" and set(d["hf"]) >= {"plain_ms", "packed_ms", "plain_rows_max"}
    assert set(d["best_ms"]) == {1, 2, 3, 4, 5, 6, 8}
    monkeypatch.setattr(slots, "LEAN_BY_DEFAULT", False)
    d = tune_engine_dispatch(model, repeats=2, verbose=False)
    assert d["forward"] == "hf" and "hf" not in d


def test_predicted_speedups_is_the_cost_model():
    costs = StepCosts((0.010, 0.011, 0.012, 0.013, 0.014), 0.002, 0.001, overhead=0.0005)
    pred = predicted_speedups(costs, 0.6, [0, 1, 3])
    assert pred[0] == pytest.approx(1.0)
    assert pred[3] == pytest.approx(expected_tokens_of([0.6] * 3) * 0.010 / (0.002 + 2 * 0.001 + 0.013 + 0.0005))
    assert predicted_speedups(costs, 0.0, [2])[2] < 1.0  # alpha 0: every draft wasted
    with pytest.raises(ValueError, match="alpha"):
        predicted_speedups(costs, 1.5, [1])


def test_paired_speedup_measures_both_and_pools_alpha():
    target = _tiny(torch.float64)
    draft = noisy_copy(target, 0.05)
    res = paired_speedup(target, lambda: ModelDrafter(draft), [[1, 2, 3, 4], [5, 6, 7]], 3, 12, repeats=2, batch=2)
    assert len(res["per_repeat"]) == 2 and res["speedup"] > 0
    assert 0.0 < res["alpha"] <= 1.0 and res["tau"] >= 1.0 and res["plain_tok_s"] > 0 and res["spec_tok_s"] > 0
    with pytest.raises(ValueError, match="repeats, batch and k"):
        paired_speedup(target, lambda: ModelDrafter(draft), [], 3, 12)
