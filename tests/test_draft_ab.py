"""benchmarks/draft_ab.py: its input checks (before any model loads) and its paired summary on synthetic runs."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_ab.py"


def _mod():
    spec = importlib.util.spec_from_file_location("draft_ab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _err(mod, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    return str(e.value.code) + capsys.readouterr().err


def test_bad_input_is_refused_before_loading(tmp_path, capsys):
    mod = _mod()
    assert "has no eagle_smollm2.safetensors" in _err(mod, ["--old", str(tmp_path)], capsys)
    same = tmp_path / "same"
    shutil.copytree(DEFAULT_DRAFT_DIR, same, ignore=shutil.ignore_patterns("mixture", "*.npz"))
    assert "holds the shipped draft itself" in _err(mod, ["--old", str(same)], capsys)
    other = tmp_path / "other"
    shutil.copytree(same, other)
    (other / "eagle_smollm2.safetensors").write_bytes(b"another draft")
    assert "--repeats must be >= 2" in _err(mod, ["--old", str(other), "--repeats", "1"], capsys)
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert "pass --force" in _err(mod, ["--old", str(other), "--out", str(out)], capsys)


def test_summary_pairs_each_repeat_and_compares_the_drafts_directly():
    mod = _mod()
    runs = []
    # per (prompt, repeat): ar 10 tokens in 1 s; the new draft's chain 2x ar, the old draft's 1.6x; adaptive 2.5x / 2x
    rate = {"ar": 10, "chain-k4@new": 20, "chain-k4@old": 16, "adaptive-k4@new": 25, "adaptive-k4@old": 20}
    for task in mod.TASKS:
        for p in range(3):
            for r in range(2):
                slow = 1.0 + 0.5 * r  # repeat 1 is slower for every method alike: pairing cancels it
                for label, v in rate.items():
                    stats = None if label == "ar" else {"accepted": 3, "rejections": 1, "proposed": 8, "emitted": 8,
                                                        "row_steps": 4, "accept_hist": [1, 0, 0, 3]}
                    runs.append({"task": task, "prompt_id": f"{task}{p}", "label": label, "repeat": r,
                                 "wall_s": 10 / v * slow, "new_tokens": 10, "stats": stats,
                                 "tokens": [1, 2] if label != "chain-k4@old" or p else [1, 3]})
    s = mod.summarise(runs)
    for task in mod.TASKS:
        assert s[task]["chain-k4@new"]["speedup"] == pytest.approx(2.0)
        assert s[task]["adaptive-k4@old"]["speedup"] == pytest.approx(2.0)
        assert s[task]["chain_new_over_old"]["ratio"] == pytest.approx(20 / 16)
        assert s[task]["adaptive_new_over_old"]["ratio"] == pytest.approx(25 / 20)
        assert s[task]["chain-k4@new"]["alpha"] == pytest.approx(0.75)
        assert s[task]["chain-k4@old"]["same_as_ar"] == pytest.approx(2 / 3)  # prompt 0 differs from ar
        assert s[task]["chain-k4@new"]["n"] == "3x2"
