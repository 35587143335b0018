"""specdec_lesson.sim.runcost (the cost model calibrated on the runs' own counters) and benchmarks/calibrate_inrun.py."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from specdec_lesson.sim.runcost import alpha_for_speedup, in_run_costs, isotonic_fit, linear_fit, predict
from specdec_lesson.theory import speedup

ROOT = Path(__file__).resolve().parents[1]


def _run(label: str, method: str, k: int | None, prompt: str, *, steps: int, emitted: int, t_verify: float,
         t_draft: float = 0.0, t_other: float = 0.0, t_prefill: float = 0.2, prompt_tokens: int = 100,
         accepted: int = 0, rejections: int = 0, draft_forwards: int | None = None, repeat: int = 0) -> dict:
    kk = k or 0
    stats = {"k": kk, "accepted": accepted, "rejections": rejections, "proposed": kk * steps, "emitted": emitted,
             "row_steps": steps, "target_forwards": steps + 1,
             "draft_forwards": kk * steps if draft_forwards is None else draft_forwards,
             "time_prefill": t_prefill, "time_draft": t_draft, "time_verify": t_verify, "time_other": t_other,
             "verify_hist": {str(kk): [steps] + [0] * kk} if kk else {}}
    return {"task": "code", "prompt_id": prompt, "label": label, "method": method, "k": k, "repeat": repeat,
            "prompt_tokens": prompt_tokens, "new_tokens": emitted, "stats": stats,
            "wall_s": t_prefill + t_draft + t_verify + t_other}


def test_isotonic_fit_pools_a_planted_dip():
    assert isotonic_fit([1.0, 3.0, 2.0, 4.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert isotonic_fit([1.0, 3.0, 2.0], [1.0, 1.0, 3.0]) == pytest.approx([1.0, 2.25, 2.25])
    assert isotonic_fit([5.0, 4.0, 3.0]) == pytest.approx([4.0, 4.0, 4.0])
    assert isotonic_fit([1.0, 2.0]) == [1.0, 2.0]


def test_verify_curve_from_runs_is_monotone():
    # T(1) = 50 ms (ar), T(2) = 70 ms over 100 steps, T(3) = 60 ms over 300 steps: the dip is pooled (weights = steps)
    runs = [_run("ar", "ar", None, "p", steps=100, emitted=100, t_verify=5.0),
            _run("chain-k1", "chain", 1, "p", steps=100, emitted=150, t_verify=7.0),
            _run("chain-k2", "chain", 2, "p", steps=300, emitted=600, t_verify=18.0)]
    c = in_run_costs(runs)
    assert c.verify_points[2][0] == pytest.approx(0.07) and c.verify_points[3][0] == pytest.approx(0.06)
    pooled = (0.07 * 100 + 0.06 * 300) / 400
    assert c.verify_fit == pytest.approx({1: 0.05, 2: pooled, 3: pooled})
    assert c.T(1.5) == pytest.approx(0.5 * (0.05 + pooled))
    assert c.T(4) == pytest.approx(pooled)  # the last two fitted points are flat, so is the extension


def test_linear_draft_fit_recovers_planted_costs():
    a, b = 0.0008, 0.003  # seconds per step at K = 1, seconds per further draft
    runs = [_run("ar", "ar", None, "p", steps=100, emitted=100, t_verify=5.0)]
    for k in (1, 2, 4, 6):
        runs.append(_run(f"chain-k{k}", "chain", k, "p", steps=40 + k, emitted=100, t_verify=0.06 * (40 + k),
                         t_draft=(a + b * (k - 1)) * (40 + k)))
    c = in_run_costs(runs)
    assert c.draft_fit == pytest.approx((a, b))
    assert c.draft_cost(3) == pytest.approx(a + 2 * b)
    assert linear_fit([0, 1, 2], [1.0, 3.0, 5.0], [1, 5, 2]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="two distinct x"):
        linear_fit([3, 3], [1.0, 2.0])
    one_k = in_run_costs([runs[0], runs[3]])  # chain at K = 4 only: no fit, that K's mean
    assert one_k.draft_fit is None and one_k.draft_cost(4) == pytest.approx(a + 3 * b)
    with pytest.raises(ValueError, match="K = 2"):
        one_k.draft_cost(2)


def test_prediction_on_a_hand_computed_example():
    # calibration prompt "a": plain 50 ms/token, prefill 2 ms/prompt token (ar) and 3 ms (chain);
    # chain K = 4: draft 10 ms, verify T(5) 60 ms, overhead 4 ms per step
    cal = [_run("ar", "ar", None, "a", steps=100, emitted=100, t_verify=5.0, t_prefill=0.2),
           _run("chain-k4", "chain", 4, "a", steps=50, emitted=100, t_verify=3.0, t_draft=0.5, t_other=0.2,
                t_prefill=0.3)]
    # held-out prompt "b": 100 tokens in 40 steps (tau 2.5), 60 accepted / 36 rejected (alpha 0.625); its timings are
    # deliberately absurd: the prediction must not read them
    held = [_run("ar", "ar", None, "b", steps=100, emitted=100, t_verify=99.0, prompt_tokens=100),
            _run("chain-k4", "chain", 4, "b", steps=40, emitted=100, t_verify=99.0, accepted=60, rejections=36)]
    runs = cal + held
    c = in_run_costs(runs, exclude=[("code", "b")])
    assert c.t_plain == pytest.approx(0.05) and c.overhead["chain-k4"] == pytest.approx(0.004)
    p = predict(c, [held[1]], [held[0]])
    step = 0.010 + 0.060 + 0.004
    assert p["step_s"] == pytest.approx(step)
    assert p["predicted_decode_only"] == pytest.approx(2.5 * 0.05 / 0.074)  # 1.6892
    assert p["predicted"] == pytest.approx((0.2 + 100 * 0.05) / (0.3 + 40 * 0.074))  # 5.2 / 3.26 = 1.5951
    e = (1 - 0.625 ** 5) / (1 - 0.625)
    assert p["alpha"] == pytest.approx(0.625)
    assert p["predicted_iid"] == pytest.approx((0.2 + 100 * 0.05) / (0.3 + 100 / e * 0.074))


def test_alpha_for_speedup_reaches_the_target():
    runs = [_run("ar", "ar", None, "p", steps=100, emitted=100, t_verify=5.0)]
    for k in (2, 4):
        runs.append(_run(f"chain-k{k}", "chain", k, "p", steps=50, emitted=100, t_verify=0.055 * 50,
                         t_draft=0.001 * k * 50, t_other=0.002 * 50))
    c = in_run_costs(runs)
    out = alpha_for_speedup(2.0, c, range(1, 5))
    k, a = out["k"], out["alpha"]
    cost = (c.T(k + 1) + c.overhead.get(f"chain-k{k}", 0.002)) / c.t_plain
    assert speedup(a, k, c.draft_cost(k) / (k * c.t_plain), cost) == pytest.approx(2.0, abs=1e-4)
    assert all(v is None or v >= a for v in out["per_k"].values())


def _script():
    spec = importlib.util.spec_from_file_location("calibrate_inrun", ROOT / "benchmarks" / "calibrate_inrun.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _close(a, b, path="") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{path}: keys differ: {sorted(set(a) ^ set(b))}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_committed_calibration_inrun_matches_the_script():
    committed = json.loads((ROOT / "benchmarks" / "results" / "calibration_inrun.json").read_text())
    committed.pop("created")
    computed = json.loads(json.dumps(_script().compute()))
    _close(computed, committed)
    for kind in ("AMD EPYC", "Intel Xeon"):  # the goal, on the committed runs
        assert committed["kinds"][kind]["held_out"]["chain"]["mean_abs_error"] <= 0.10


def test_script_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "x.json"
    out.write_text("keep")
    assert _script().main(["--out", str(out)]) == 2
    assert out.read_text() == "keep"
    assert "--force" in capsys.readouterr().err


def test_redo_draft_vocab_scores_every_style_with_in_run_costs():
    """Two subsets, hand-computed: the cheaper head with the same alpha wins on every style; chat is scored too."""
    c = in_run_costs([_run("ar", "ar", None, "p", steps=40, emitted=40, t_verify=1.0),
                      _run("chain-k4", "chain", 4, "p", steps=10, emitted=30, t_verify=0.375, t_draft=0.2,
                           accepted=20, rejections=10)])
    off = {s: {"alpha_tok": a} for s, a in (("chat", 0.4), ("code", 0.6), ("math", 0.7))}
    dv = {"k": 4, "verify_ratio": 1.5, "best": None,
          "subsets": {"answers-2048": {"n": 2048, "draft_ms_per_token": 1.0, "offline": off, "predicted_speedup": {}},
                      "shipped-8192": {"n": 8192, "draft_ms_per_token": 2.0, "offline": off, "predicted_speedup": {}}}}
    out = _script().redo_draft_vocab(dv, c, ("chat", "code", "math"))
    assert out["best_inrun"] == {"chat": "answers-2048", "code": "answers-2048", "math": "answers-2048"}
    ratio = (c.T(5) + c.overhead.get("chain-k4", 0.0)) / c.t_plain
    for name, ms in (("answers-2048", 1.0), ("shipped-8192", 2.0)):
        cc = c.draft_cost(4) * ms / 2.0 / (4 * c.t_plain)
        assert out["subsets"][name]["c_inrun"] == pytest.approx(cc)
        assert out["subsets"][name]["predicted_speedup_inrun"]["chat"] == pytest.approx(speedup(0.4, 4, cc, ratio))


def test_redo_draft_vocab_scales_from_the_head_the_runs_timed():
    """When the runs' draft had a 2048-token head, its in-run cost is that head's: scale from the 2048 row, not the
    shipped-8192 one (the file's older default)."""
    c = in_run_costs([_run("ar", "ar", None, "p", steps=40, emitted=40, t_verify=1.0),
                      _run("chain-k4", "chain", 4, "p", steps=10, emitted=30, t_verify=0.375, t_draft=0.2,
                           accepted=20, rejections=10)])
    off = {s: {"alpha_tok": 0.5} for s in ("code", "math")}
    dv = {"k": 4, "verify_ratio": 1.5, "best": None,
          "subsets": {"answers-2048": {"n": 2048, "draft_ms_per_token": 1.0, "offline": off, "predicted_speedup": {}},
                      "shipped-8192": {"n": 8192, "draft_ms_per_token": 2.0, "offline": off, "predicted_speedup": {}}}}
    out = _script().redo_draft_vocab(dv, c, ref_n=2048)
    assert out["reference_subset"] == "answers-2048"
    assert out["subsets"]["answers-2048"]["draft_s_per_step_inrun"] == pytest.approx(c.draft_cost(4))
    assert out["subsets"]["shipped-8192"]["draft_s_per_step_inrun"] == pytest.approx(2 * c.draft_cost(4))
    assert _script().redo_draft_vocab(dv, c)["reference_subset"] == "shipped-8192"  # runs that did not name a draft
