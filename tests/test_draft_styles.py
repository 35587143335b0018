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
