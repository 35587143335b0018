"""The latency simulator's model: presets, roofline, closed forms vs Monte Carlo, calibration."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_lesson import theory
from specdec_lesson.sim import (
    HARDWARE,
    MODELS,
    arithmetic_intensity,
    custom_model,
    forward_cost,
    simulate_generation,
    smollm2_draft,
    spec_timing,
    speedup_curve,
    this_machine,
    tree_expected_tokens,
    tree_speedup,
)
from specdec_lesson.sim.calibrate import Profile, load_calibration, predict_speedup, profile_from_stats, save_calibration
from specdec_lesson.stats import SpecStats

L70 = MODELS["Llama-3-70B"]


def test_seed_70b_arithmetic_from_presets():
    # "streaming all 140 GB of model weights": 70.55B parameters x 2 bytes (fp16).
    assert L70.n_params == pytest.approx(70.55e9, rel=1e-3)
    assert L70.weight_bytes("fp16") == pytest.approx(141.1e9, rel=1e-3)
    # a decode step streams the matmul weights (the untied embedding table is only looked up): ~139 GB
    assert L70.streamed_bytes("fp16") == pytest.approx(139.0e9, rel=2e-3)
    # intensity at batch 1, weights only: 2 FLOPs/param over 2 bytes/param = 1 FLOP/byte (not "under")
    assert arithmetic_intensity(L70, "fp16", batch=1, context=0) == pytest.approx(1.0, abs=1e-4)
    # "under 1" only when the whole 141 GB (embedding table included) is counted as streamed
    assert 2 * L70.matmul_params / L70.weight_bytes("fp16") == pytest.approx(0.985, abs=1e-3)
    # GQA attention over a 4k context lifts it slightly above 1; still ~300x under an H100's ridge point
    ai = arithmetic_intensity(L70, "fp16", batch=1, context=4096)
    assert 1.0 < ai < 1.1
    assert HARDWARE["H100 SXM"].ridge_point / ai > 250
    # batch b multiplies it by b; int4 by 4
    assert arithmetic_intensity(L70, "fp16", batch=8) == pytest.approx(8.0, rel=1e-3)
    assert arithmetic_intensity(L70, "int4") == pytest.approx(4.0, rel=1e-3)
    # KV cache: 80 layers * 2 * 8 kv heads * 128 * 2 bytes = 320 KiB per token
    assert L70.kv_bytes_per_token(2) == 327680


def test_param_counts_of_presets():
    assert MODELS["Llama-3-8B"].n_params == pytest.approx(8.03e9, rel=1e-3)
    assert MODELS["Llama-3.2-1B"].n_params == pytest.approx(1.236e9, rel=1e-3)
    assert MODELS["SmolLM2-135M"].n_params == 134_515_008  # exactly the HF checkpoint's count
    d = smollm2_draft()
    assert d.n_params == pytest.approx(16.0e6, rel=0.01) and d.embed_params == pytest.approx(12.6e6, rel=0.01)
    assert smollm2_draft(n_layers=2).n_params < d.n_params
    m = custom_model(n_layers=2, hidden=64, n_heads=4)
    assert m.n_kv_heads == 4 and m.head_dim == 16 and m.n_params > 0
    with pytest.raises(ValueError, match="n_layers"):
        custom_model(n_layers=0, hidden=64, n_heads=4)


@pytest.mark.parametrize("name", ["SmolLM2-135M", "Llama-3-8B", "Llama-3.2-1B", "SmolLM2 draft (4L/256, 16M)"])
def test_presets_match_transformers_parameter_counts(name):
    """The shape-derived count equals a LlamaForCausalLM built (on the meta device) from the same config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    m = MODELS[name]
    cfg = LlamaConfig(vocab_size=m.vocab, hidden_size=m.hidden, num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                      num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate,
                      tie_word_embeddings=m.tied)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(unique.values()) == m.n_params


def test_roofline_regimes_and_tensor_parallelism():
    h100 = HARDWARE["H100 SXM"]
    one = forward_cost(h100, "Llama-3-8B", "bf16", n_tokens=1, batch=1, context=1024)
    assert one.bound == "memory"
    assert one.memory_s == pytest.approx(one.bytes / h100.bandwidth)
    assert one.total == pytest.approx(one.memory_s + h100.step_overhead)
    # verify over 5 tokens costs about the same as 1 (memory bound) ...
    five = forward_cost(h100, "Llama-3-8B", "bf16", n_tokens=5, context=1024)
    assert five.total / one.total < 1.01
    # ... but at batch 128 x 16 tokens the step is compute bound
    assert forward_cost(h100, "Llama-3-8B", "bf16", n_tokens=16, batch=128).bound == "compute"
    # tensor parallelism halves the per-device bytes and adds all-reduces (2 per layer, ring)
    tp2 = forward_cost(h100, "Llama-3-70B", "bf16", n_devices=2)
    tp1 = forward_cost(h100, "Llama-3-70B", "bf16", n_devices=1)
    assert tp2.bytes == pytest.approx(tp1.bytes / 2)
    msg = 1 * 1 * 8192 * 2.0
    ring = 2 * (2 - 1) / 2 * msg / h100.link_bandwidth + 2 * (2 - 1) * h100.link_latency
    assert tp2.comm_s == pytest.approx(2 * 80 * ring) and tp1.comm_s == 0
    assert forward_cost(h100, "Llama-3-70B", "bf16", n_devices=8).total < tp2.total
    with pytest.raises(ValueError, match="at most 1 device"):
        forward_cost("Apple M3 Max laptop", "Llama-3-8B", n_devices=2)
    with pytest.raises(ValueError, match="precision"):
        forward_cost(h100, "Llama-3-8B", "fp8")
    with pytest.raises(ValueError, match="unknown hardware"):
        forward_cost("TPU", "Llama-3-8B")
    me = this_machine(20e9, 100e9)
    assert me.ridge_point == pytest.approx(5.0) and forward_cost(me, "SmolLM2-135M", "fp32").total > 0


def test_spec_timing_matches_theory_and_best_k():
    t = spec_timing("A100 80GB", "Llama-3-70B", "Llama-3-8B", k=4, alpha=0.8, n_devices=4)
    c, r = t.t_draft / t.t_target, t.t_verify / t.t_target
    assert t.speedup == pytest.approx(theory.expected_tokens(0.8, 4) / (4 * c + r))
    assert sum(t.breakdown().values()) == pytest.approx(t.step_time)
    assert t.tokens_per_s / t.baseline_tokens_per_s == pytest.approx(t.speedup)
    curve, kbest = speedup_curve("A100 80GB", "Llama-3-70B", "Llama-3-8B", 0.8, k_max=12, n_devices=4)
    assert curve[kbest - 1] == max(curve) and len(curve) == 12
    # with the ideal flat verify curve the best K matches the closed form's
    assert theory.best_k(0.8, c) >= kbest - 1
    # higher alpha: higher speedup at every K, best K never smaller
    curve9, kbest9 = speedup_curve("A100 80GB", "Llama-3-70B", "Llama-3-8B", 0.9, k_max=12, n_devices=4)
    assert all(a > b for a, b in zip(curve9, curve)) and kbest9 >= kbest


def test_tree_closed_forms_reduce_to_the_chain():
    for alpha, k in [(0.5, 3), (0.8, 6), (0.0, 2), (1.0, 4)]:
        assert tree_expected_tokens([alpha] * k) == pytest.approx(theory.expected_tokens(alpha, k))
        assert tree_speedup([alpha] * k, k, 0.1, 1.2) == pytest.approx(theory.speedup(alpha, k, 0.1, 1.2))
    # a wider tree: higher per-depth acceptance for more nodes
    assert tree_expected_tokens([0.9, 0.8, 0.7]) == pytest.approx(1 + 0.9 + 0.72 + 0.504)
    assert tree_speedup([0.9, 0.8], n_nodes=6, c=0.1, verify_ratio=lambda n: 1 + 0.05 * n) == pytest.approx(
        (1 + 0.9 + 0.72) / (2 * 0.1 + 1 + 0.05 * 7))
    with pytest.raises(ValueError, match="accept_by_depth"):
        tree_expected_tokens([1.2])
    with pytest.raises(ValueError, match="at least 3 nodes"):
        tree_speedup([0.5] * 3, n_nodes=2, c=0.1)


@pytest.mark.parametrize("alpha,k", [(0.5, 4), (0.8, 4), (0.8, 8), (0.95, 2)])
def test_monte_carlo_agrees_with_closed_form(alpha, k):
    """100k steps.  From the exact law of tokens/step, the relative standard error of the mean is
    0.05-0.21% for these settings, so the 1% threshold sits beyond 4.7 standard errors (false-failure
    rate < 3e-6 per case); a simulator with alpha off by 0.02 moves the mean by 2.0-6.8% and fails
    (power ~1).  Histogram bins: SE <= 0.0016, threshold 0.01 (> 6 SE)."""
    n = 100_000
    run = simulate_generation(alpha, k, n, t_draft=0.05, t_verify=1.1, t_baseline=1.0, seed=1)
    e = theory.expected_tokens(alpha, k)
    assert run.tokens_per_step == pytest.approx(e, rel=0.01)
    assert run.speedup == pytest.approx(theory.speedup(alpha, k, 0.05, 1.1), rel=0.01)
    hist = torch.bincount(torch.tensor(run.accepted), minlength=k + 1).double() / n  # [K+1]
    law = torch.tensor([(1 - alpha) * alpha**i for i in range(k)] + [alpha**k], dtype=torch.float64)
    assert (hist - law).abs().max() < 0.01


def test_monte_carlo_trees_per_depth_and_determinism():
    a = [0.9, 0.7, 0.5, 0.3]
    run = simulate_generation(a, 4, 100_000, seed=3)
    assert run.tokens_per_step == pytest.approx(tree_expected_tokens(a), rel=0.01)
    assert simulate_generation(0.7, 3, 50, seed=5).accepted == simulate_generation(0.7, 3, 50, seed=5).accepted
    g = torch.Generator().manual_seed(5)
    assert simulate_generation(0.7, 3, 50, generator=g).accepted == simulate_generation(0.7, 3, 50, seed=5).accepted
    ev = simulate_generation(0.7, 3, 5, t_draft=0.1, t_verify=1.0, seed=0).events()
    assert [e["start"] for e in ev] == pytest.approx([i * 1.3 for i in range(5)])
    assert all(e["emitted"] == e["accepted"] + 1 and 0 <= e["accepted"] <= 3 for e in ev)
    with pytest.raises(ValueError, match="3 probabilities"):
        simulate_generation([0.5, 0.5], 3, 10)


FAKE_CURVE = {1: 0.060, 2: 0.070, 4: 0.075, 8: 0.090, 16: 0.120}


def test_profile_and_prediction_with_a_fake_curve(tmp_path):
    prof = Profile(FAKE_CURVE, t_draft=0.010, alpha=0.6, overhead=0.002)
    assert prof.T(3) == pytest.approx(0.0725) and prof.T(5) == pytest.approx(0.075 + 0.015 / 4)
    assert prof.T(20) == pytest.approx(0.120 + 4 * 0.030 / 8)  # extrapolated from the last two points
    for k in (1, 3, 4):
        want = theory.expected_tokens(0.6, k) * 0.060 / (k * 0.010 + prof.T(k + 1) + 0.002)
        assert predict_speedup(prof, k) == pytest.approx(want)
    assert predict_speedup(prof, 4, alpha=0.9) > predict_speedup(prof, 4)
    rec = save_calibration(tmp_path / "cal.json", prof, k=4, measured_speedup=1.1, machine="test")
    back = load_calibration(tmp_path / "cal.json")
    assert back["profile"].verify_curve == prof.verify_curve and back["machine"] == "test"
    assert back["predicted_speedup"] == pytest.approx(rec["predicted_speedup"])
    assert load_calibration(tmp_path / "missing.json") is None
    with pytest.raises(ValueError, match="T\\(1\\)"):
        Profile({2: 0.1}, 0.01, 0.5)


def test_profile_from_engine_stats():
    st = SpecStats(k=4)
    for n in [4, 1, 0, 2, 4]:  # five steps of one row
        st.record([n], [n + 1], [True])
    st.time_draft, st.time_verify, st.time_other = 0.2, 0.4, 0.05
    base = SpecStats(k=0)
    base.emitted, base.time_verify, base.time_other = 16, 0.96, 0.04
    prof = profile_from_stats(st, FAKE_CURVE, baseline=base)
    # Leviathan's per-token alpha: 11 accepted, 3 rejections (the steps with n < 4); not accepted / proposed = 11 / 20
    assert prof.alpha == pytest.approx(11 / 14) and prof.notes["utilisation"] == pytest.approx(11 / 20)
    assert prof.t_draft == pytest.approx(0.2 / 20) and prof.overhead == pytest.approx(0.01)
    assert prof.t_baseline == pytest.approx(1.0 / 16)
    assert math.isfinite(predict_speedup(prof, 4))
    with pytest.raises(ValueError, match="no proposed drafts"):
        profile_from_stats(SpecStats(k=4), FAKE_CURVE)


def test_closed_form_takes_the_per_token_alpha():
    """i.i.d. acceptance at 0.7, K = 4, 4000 simulated steps recorded in SpecStats: the closed form
    (1 - a^(K+1)) / (1 - a) at the profile's alpha (SpecStats.alpha, per token) predicts the measured tau within
    0.05 (sd of tau here ~ 0.025); at accepted / proposed (utilisation, the old alpha) it would be off by > 0.5."""
    gen = torch.Generator().manual_seed(0)
    st = SpecStats(k=4)
    u = torch.rand(4000, 4, generator=gen, dtype=torch.float64)
    n = (u < 0.7).long().cumprod(1).sum(1).tolist()  # [4000] accepted lengths
    st.record(n, [m + 1 for m in n], [True] * len(n))
    st.time_draft = st.time_other = 0.1
    prof = profile_from_stats(st, FAKE_CURVE)
    assert abs(prof.alpha - 0.7) < 0.02
    assert abs(theory.expected_tokens(prof.alpha, 4) - st.tau) < 0.05
    assert abs(theory.expected_tokens(st.utilisation, 4) - st.tau) > 0.5
