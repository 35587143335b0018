"""Latency & speedup simulator: presets, roofline model, Monte Carlo, calibration on measurements.

``specdec_lesson.sim.widget`` (ipywidgets + plotly) is imported on demand only: the rest has no widget dependency.
"""

from .model import (
    ForwardCost,
    SimRun,
    SpecTiming,
    arithmetic_intensity,
    forward_cost,
    simulate_generation,
    spec_timing,
    speedup_curve,
    tree_expected_tokens,
    tree_speedup,
    verify_ratio,
)
from .presets import HARDWARE, MODELS, PRECISION_BYTES, Hardware, ModelSpec, custom_model, smollm2_draft, this_machine
from .runcost import RunCosts, in_run_costs

__all__ = [
    "ForwardCost", "SimRun", "SpecTiming", "arithmetic_intensity", "forward_cost", "simulate_generation", "spec_timing",
    "speedup_curve", "tree_expected_tokens", "tree_speedup", "verify_ratio", "HARDWARE", "MODELS", "PRECISION_BYTES", "Hardware",
    "ModelSpec", "custom_model", "smollm2_draft", "this_machine", "RunCosts", "in_run_costs",
]
