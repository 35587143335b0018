"""The roofline verify curve as a function, and its agreement with the timing of a chain step."""

import pytest

from specdec_lesson.sim import spec_timing, speedup_curve, verify_ratio


@pytest.mark.parametrize("batch", [1, 64])
def test_verify_ratio_matches_spec_timing(batch):
    ratio = verify_ratio("H100 SXM", "Llama-3-8B", batch=batch)
    assert ratio(1) == pytest.approx(1.0)
    for k in (1, 4, 8):
        t = spec_timing("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", k=k, alpha=0.7, batch=batch)
        assert ratio(k + 1) == pytest.approx(t.t_verify / t.t_target)
    assert ratio(64) >= ratio(8) >= ratio(2) >= 1.0  # more new tokens never cost less


def test_speedup_curve_uses_the_same_curve():
    curve, kbest = speedup_curve("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", alpha=0.7, k_max=8)
    assert len(curve) == 8 and curve[kbest - 1] == pytest.approx(max(curve), rel=0.02)
