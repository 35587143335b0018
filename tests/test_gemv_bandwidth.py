"""benchmarks/gemv_bandwidth.py: bad flags fail in one line before any model loads, an existing result is never
overwritten without --force, and a quick run writes every figure it promises (positive, finite)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from script_checks import refuses_to_overwrite, rejects_in_one_line

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gemv_bandwidth.py"


@pytest.mark.parametrize("flags", [["--threads", "0"], ["--rounds", "0"]])
def test_rejects_bad_flags_before_loading_models(flags):
    rejects_in_one_line(SCRIPT, flags)


def test_refuses_to_overwrite_without_force(tmp_path):
    refuses_to_overwrite(SCRIPT, tmp_path)


def test_quick_run_writes_every_figure(tmp_path):
    from specdec_lesson.fastcpu import packed_linear_available

    if not packed_linear_available():
        pytest.skip("no pre-packed (oneDNN) linears in this torch build: the script has nothing to measure")
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--threads", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["threads"] == [1, 2] and res["bytes"]["matrices"] == 120
    for t in ("1", "2"):
        assert set(res["gbps"][t]) == {"stream", "sum_one", "sum_layers", "gemv_one", "gemv_layers", "gemv_head"}
        assert all(math.isfinite(v) and v > 0 for v in res["gbps"][t].values())
    parts = res["breakdown"]["parts"]
    assert set(parts) == {"projections", "attention", "lm_head", "rest"}
    assert res["breakdown"]["total_ms"] > 0 and res["breakdown"]["floor_ms"] > 0
    assert not out.with_suffix(".tmp").exists()
