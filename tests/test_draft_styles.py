"""benchmarks/draft_styles.py refuses bad input with one line, before any model is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "draft_styles.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("args,fragment", [
    (["--heldout", "none.pt", "--draft", "nofolder"], "NAME=FOLDER"),
    (["--heldout", "none.pt", "--draft", "a=/nonexistent"], "holds no eagle_smollm2.json"),
    (["--heldout", "none.pt", "--draft", "a=specdec_lesson/data", "--draft", "a=specdec_lesson/data"], "given twice"),
    (["--heldout", "none.pt"], "distill heldout"),
    (["--heldout", "none.pt", "--k", "0"], "--k and --threads must be >= 1"),
])
def test_bad_input_one_line(args, fragment):
    r = _run(*args)
    assert r.returncode == 2 and fragment in r.stderr.strip().splitlines()[-1], r.stderr


def test_existing_out_needs_force(tmp_path):
    held, out = tmp_path / "held.pt", tmp_path / "out.json"
    held.write_bytes(b"x")
    out.write_text("{}")
    r = _run("--heldout", str(held), "--out", str(out))
    assert r.returncode == 2 and "--force" in r.stderr and out.read_text() == "{}", r.stderr


def test_train_data_without_shards_is_one_line(tmp_path):
    held = tmp_path / "held.pt"
    held.write_bytes(b"x")
    r = _run("--heldout", str(held), "--train-data", str(tmp_path), "--out", str(tmp_path / "o.json"))
    assert r.returncode == 2 and "holds no data/shard_*.pt" in r.stderr.strip().splitlines()[-1], r.stderr


def test_training_rows_split_as_the_trainer_does(tmp_path):
    """``training_rows``: greedy rows only, long enough, labelled with the trainer's split (row i validates when
    i % 25 == 24, counted over every shard in order), cut to max_new answer tokens with features to match."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("draft_styles", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (tmp_path / "data").mkdir()
    rows = []
    for i in range(120):
        n, new = 5, 60 if i % 7 else 10  # every 7th row too short
        rows.append({"tokens": torch.arange(n + new) + 1000 * i, "feats": torch.zeros(n + new - 1, 4, dtype=torch.bfloat16),
                     "n_prompt": n, "kind": ("chat", "math")[i % 2], "temperature": 0.7 if i % 5 == 3 else 0.0})
    torch.save(rows[:70], tmp_path / "data" / "shard_00000.pt")
    torch.save(rows[70:], tmp_path / "data" / "shard_00001.pt")
    got = mod.training_rows(tmp_path, per_group=100, max_new=32)
    for r in got:
        i = int(r["tokens"][0]) // 1000
        assert r["kind"] == f"{'val' if i % 25 == 24 else 'train'}/{rows[i]['kind']}"
        assert rows[i]["temperature"] == 0.0 and i % 7 and len(r["tokens"]) == 5 + 32 and r["feats"].shape == (36, 4)
        assert r["feats"].dtype == torch.float32
    eligible = [i for i in range(120) if i % 5 != 3 and i % 7]
    assert sorted(int(r["tokens"][0]) // 1000 for r in got) == eligible
    assert {r["kind"] for r in got} == {"train/chat", "train/math", "val/chat", "val/math"}
    few = mod.training_rows(tmp_path, per_group=3)  # val holds rows 24 and 74 (chat), 99 (math): 49 is too short
    assert sorted(r["kind"] for r in few) == ["train/chat"] * 3 + ["train/math"] * 3 + ["val/chat"] * 2 + ["val/math"]
