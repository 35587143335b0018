"""The simulator widget, headless: move each control, check every figure follows the model."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the simulator widget needs ipywidgets (course extra)")
pytest.importorskip("anywidget", reason="plotly 7's FigureWidget needs anywidget (course extra)")

from specdec_lesson.sim import spec_timing, speedup_curve, this_machine  # noqa: E402
from specdec_lesson.sim.widget import build_simulator  # noqa: E402


def state(sim) -> dict:
    sp, bd, tl, tk = sim.fig_speedup.data, sim.fig_breakdown.data, sim.fig_timeline.data, sim.fig_tokens.data
    return {"curve": list(sp[0].y), "best": sp[1].x[0], "current": (sp[2].x[0], sp[2].y[0]),
            "draft_ms": bd[0].x[0], "verify_ms": bd[1].x[0], "overhead_ms": bd[2].x[0], "plain_ms": bd[1].x[1],
            "tl_draft": list(tl[0].x), "tl_verify": list(tl[1].x), "tl_text": list(tl[1].text), "tl_plain": len(tl[2].x),
            "plain_tps": tk[0].y[0], "spec_tps": tk[0].y[1], "summary": sim.summary.value}


def consistent(sim) -> None:
    """Every figure equals what the pure model says for the current control values."""
    s = sim.settings()
    k, alpha = sim.k_slider.value, sim.alpha_slider.value
    t = spec_timing(s["hardware"], s["target"], s["draft"], k, alpha, precision=s["precision"], batch=s["batch"],
                    context=s["context"], n_devices=s["n_devices"])
    curve, kbest = speedup_curve(s["hardware"], s["target"], s["draft"], alpha, sim.k_max, precision=s["precision"],
                                 batch=s["batch"], context=s["context"], n_devices=s["n_devices"])
    st = state(sim)
    assert st["curve"] == pytest.approx(curve) and st["best"] == kbest
    assert st["current"] == (k, pytest.approx(t.speedup))
    assert st["draft_ms"] + st["verify_ms"] + st["overhead_ms"] == pytest.approx(t.step_time * 1e3)
    assert st["spec_tps"] == pytest.approx(t.tokens_per_s) and st["plain_tps"] == pytest.approx(t.baseline_tokens_per_s)
    assert st["tl_draft"] == pytest.approx([k * t.t_draft * 1e3] * sim.timeline_steps)
    assert st["tl_verify"] == pytest.approx([t.t_verify * 1e3] * sim.timeline_steps)
    assert f"{t.speedup:.2f}x" in st["summary"]


@pytest.fixture
def sim():
    s = build_simulator(hardware="H100 SXM", n_gpus=1, target="Llama-3-8B", draft="Llama-3.2-1B", precision="bf16",
                        k=4, alpha=0.8, batch=1, context=1024)
    consistent(s)
    return s


def test_every_control_is_reachable(sim):
    names = ["hardware", "gpus_slider", "target", "draft", "precision", "k_slider", "alpha_slider", "batch_slider",
             "context_slider"]
    assert [getattr(sim, n) for n in names] == sim.controls
    assert sim.ui.children and len(sim.fig_speedup.data) == 3


def test_k_slider(sim):
    before = state(sim)
    sim.k_slider.value = 7
    after = state(sim)
    consistent(sim)
    assert after["current"][0] == 7 and after["curve"] == before["curve"] and after["best"] == before["best"]
    assert after["draft_ms"] > before["draft_ms"]  # 7 draft forwards instead of 4
    assert after["tl_draft"][0] == pytest.approx(before["tl_draft"][0] * 7 / 4)


def test_alpha_slider(sim):
    before = state(sim)
    sim.alpha_slider.value = 0.5
    after = state(sim)
    consistent(sim)
    assert all(a < b for a, b in zip(after["curve"], before["curve"]))
    assert after["best"] <= before["best"] and after["spec_tps"] < before["spec_tps"]
    assert after["plain_tps"] == pytest.approx(before["plain_tps"])  # plain decoding does not care
    assert sum(int(x) for x in after["tl_text"]) < sum(int(x) for x in before["tl_text"])  # same seed, fewer tokens


def test_hardware_dropdown(sim):
    before = state(sim)
    sim.hardware.value = "A100 80GB"  # less bandwidth: every step slower
    consistent(sim)
    assert state(sim)["plain_tps"] < before["plain_tps"]
    sim.hardware.value = "Apple M3 Max laptop"
    consistent(sim)
    assert "Apple M3 Max laptop</b> x1" in sim.summary.value


def test_gpus_slider(sim):
    sim.target.value = "Llama-3-70B"
    one = state(sim)
    assert "does not fit" in one["summary"]  # 141 GB on one 80 GB H100
    sim.gpus_slider.value = 4
    four = state(sim)
    consistent(sim)
    assert four["plain_tps"] > 2 * one["plain_tps"] and "does not fit" not in four["summary"]


def test_target_and_draft_dropdowns(sim):
    before = state(sim)
    sim.draft.value = "Llama-3-8B"  # a draft as large as the target: no speedup possible
    consistent(sim)
    mid = state(sim)
    assert mid["draft_ms"] > before["draft_ms"] and max(mid["curve"]) < 1.0
    sim.target.value = "Llama-3-70B"
    sim.gpus_slider.value = 8
    consistent(sim)
    assert state(sim)["plain_ms"] != mid["plain_ms"] and max(state(sim)["curve"]) > 1.0


def test_precision_dropdown(sim):
    before = state(sim)
    sim.precision.value = "int4"  # 4x fewer weight bytes: memory-bound steps 3-4x faster
    consistent(sim)
    assert 2.5 < state(sim)["plain_tps"] / before["plain_tps"] < 4.0


def test_batch_slider(sim):
    before = state(sim)
    sim.batch_slider.value = 128  # throughput rises, verify stops being free: the speedup shrinks
    after = state(sim)
    consistent(sim)
    assert after["plain_tps"] > 20 * before["plain_tps"]
    assert max(after["curve"]) < max(before["curve"]) and after["best"] <= before["best"]


def test_context_slider(sim):
    before = state(sim)
    sim.context_slider.value = 32768  # the KV cache read grows with the context
    consistent(sim)
    assert state(sim)["plain_tps"] < before["plain_tps"]


def test_this_machine_preset():
    me = this_machine(20e9, 200e9)
    s = build_simulator(hardware="this machine", target="SmolLM2-135M", draft="SmolLM2 draft (4L/256, 16M)",
                        precision="fp32", extra_hardware=[me], k=3, alpha=0.5)
    consistent(s)
    assert "this machine" in s.summary.value
