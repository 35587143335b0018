"""Checks shared by the tests of benchmark scripts that write one results file: one-line flag errors before any
model loads, and no overwrite without --force."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def rejects_in_one_line(script: Path, flags: list[str], words: str = "must be positive") -> None:
    proc = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def refuses_to_overwrite(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text("{}")
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--force" in proc.stderr and out.read_text() == "{}"
