"""benchmarks/probe_noise.py: bad flags fail in one line before any model loads, an existing result is never
overwritten without --force, its readings follow the library's probe (fastest round, more rounds when the first
ones disagree or dip), and a quick run writes every reading for both conditions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_checks import refuses_to_overwrite, rejects_in_one_line

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_noise.py"
sys.path.insert(0, str(SCRIPT.parent))


@pytest.mark.parametrize("flags", [["--threads", "0"], ["--probes", "0"], ["--rounds", "0"]])
def test_rejects_bad_flags_before_loading_models(flags):
    rejects_in_one_line(SCRIPT, flags)


def test_refuses_to_overwrite_without_force(tmp_path):
    refuses_to_overwrite(SCRIPT, tmp_path)


def _curve(t1: float, slope: float) -> dict[int, float]:
    return {n: t1 + slope * (n - 1) for n in range(1, 18)}


def test_readings_follow_the_probe():
    """Three first rounds whose one-token forwards were all slowed (a dip: T(4) < T(1)) and nine later quiet ones:
    the median and the fastest of the first three read the dip, the probe takes every round and reads the quiet
    curve; a quiet probe keeps its first three rounds."""
    import probe_noise as P

    quiet, slow = _curve(10.0, 0.5), _curve(10.0, 0.5)
    slow[1] = 14.0
    rounds = {n: [slow[n]] * 3 + [quiet[n]] * 9 for n in quiet}
    got, extended = P.readings(rounds, 3)
    assert got["median_first"][1] == got["fastest_first"][1] == 14.0 and got["probe"] == quiet and extended
    calm = {n: [quiet[n] * f for f in (1.0, 1.01, 1.02)] + [quiet[n] * 0.5] * 9 for n in quiet}
    got, extended = P.readings(calm, 3)
    assert got["probe"] == quiet and not extended  # its later (faster) rounds are not read


def test_tree_choice_grows_on_a_flat_curve():
    import probe_noise as P

    steep, flat = _curve(10.0, 1.0), _curve(10.0, 0.0)
    assert P.choice(flat, 0.5) == 16 and P.choice(steep, 0.5) < 16
    assert P.rate(steep, 0.5, 0) == pytest.approx(1 / 10.0)


def test_quick_run_writes_every_reading(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [p["condition"] for p in res["probes"]] == ["quiet", "neighbour", "neighbour", "quiet"]
    keys = {f"{c}/{r}" for c in ("quiet", "neighbour") for r in ("median_first", "fastest_first", "probe")}
    assert set(res["summary"]) == keys | {"reference_choice"}
    for k in keys:
        row = res["summary"][k]
        assert row["probes"] == 2 and row["T1_ms"]["min"] > 0 and set(row["tree_chat"]) >= {"nodes", "loss_vs_reference"}
    assert not out.with_suffix(".tmp").exists()
