"""Course conventions: every notebook is executed by the test command, committed executed,
seeded in its first cell, without widget state, and with small outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


def test_test_command_runs_every_notebook():
    """`pytest` (the README's test command) collects every notebook under nbval."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "notebooks" in cfg["testpaths"] and "--nbval-lax" in cfg["addopts"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "notebooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout
    collected = {line.split("::")[0] for line in out.splitlines() if "::" in line}
    for nb in NOTEBOOKS:
        assert f"notebooks/{nb.name}" in collected, f"{nb.name} is not collected by the test command"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(nb_path: Path):
    nb = json.loads(nb_path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "no code cells"
    first = "".join(code[0]["source"])
    assert 'FAST = "CI" in os.environ' in first and "setup(" in first, "first code cell must seed via setup() and set FAST"
    assert all(c.get("execution_count") for c in code if "".join(c["source"]).strip()), "commit the notebook executed"
    assert "widgets" not in nb.get("metadata", {}), "widget state must not be committed"
    assert nb_path.stat().st_size < 2_000_000, "outputs too large: keep committed notebooks small"
