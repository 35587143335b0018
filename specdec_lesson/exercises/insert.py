"""Write each notebook's "## Exercises" section from the registry: ``python -m specdec_lesson.exercises.insert``.

The section goes at the end of the notebook: a header cell, then per exercise a markdown cell "### Exercise N.M:
title" with the prompt and a code cell holding the SOLUTION followed by its check, so that the test command
(nbval) runs the notebooks with the solutions in place; a learner replaces a solution with their own code.

* Idempotent: every cell of the section carries the metadata tag ``exercises`` and a fixed cell id; a re-run
  replaces the tagged cells (never duplicates them) and keeps a cell whose source is unchanged as it is, outputs
  included, so re-running after the notebooks were executed changes nothing.
* Quick read-modify-write: each notebook is read, rebuilt in memory and written back at once (through a temporary
  file and ``os.replace``), and only if the file did not change since it was read (else it is read again): a
  process editing other cells at the same time loses nothing.  The JSON layout is nbformat's (indent 1, sorted
  keys, UTF-8), the layout the notebooks are stored in.

Options: ``--check`` reports the notebooks whose section differs from the registry (exit status 1, nothing
written); ``--starters DIR`` writes copies of the notebooks with the STARTER cells into DIR (a blank workbook)
instead of touching the originals; ``--notebooks DIR`` names the notebook folder (default: the repository's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import EXERCISES, Exercise

__all__ = ["TAG", "HEADER", "section_cells", "apply_section", "update_notebook", "main"]

TAG = "exercises"
HEADER = """## Exercises

Each exercise below states a task; the code cell under it holds a solution followed by the check that grades it,
so the notebook runs from top to bottom. Replace the solution with your own code (or write a blank workbook with
`python -m specdec_lesson.exercises.insert --starters DIR`). A check prints `Exercise N.M passed: ...`, or raises an
AssertionError saying what is wrong. The checks compare with the library's reference functions
(`specdec_lesson.exercises`)."""


def _source(text: str) -> list[str]:
    """nbformat's list of lines: each ends with a newline but the last."""
    return text.rstrip("\n").splitlines(keepends=True)


def _cell(kind: str, cell_id: str, text: str) -> dict:
    cell = {"cell_type": kind, "id": cell_id, "metadata": {"tags": [TAG]}, "source": _source(text)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def section_cells(exercises: list[Exercise], starters: bool = False) -> list[dict]:
    """The section's cells: the header, then a markdown and a code cell per exercise."""
    cells = [_cell("markdown", "exercises-header", HEADER)]
    for ex in exercises:
        slug = ex.id.replace(".", "-")
        cells.append(_cell("markdown", f"exercise-{slug}-prompt", f"### Exercise {ex.id}: {ex.title}\n\n{ex.prompt}"))
        cells.append(_cell("code", f"exercise-{slug}-code", ex.starter if starters else ex.solution))
    return cells


def _tagged(cell: dict) -> bool:
    return TAG in cell.get("metadata", {}).get("tags", [])


def apply_section(nb: dict, cells: list[dict]) -> dict:
    """``nb`` with its tagged cells removed and ``cells`` appended; a new cell equal in source (and kind) to an old
    tagged cell of the same id is kept as it was (outputs and execution count included)."""
    old = {c.get("id"): c for c in nb["cells"] if _tagged(c)}
    kept = [c for c in nb["cells"] if not _tagged(c)]
    for cell in cells:
        prev = old.get(cell["id"])
        same = prev is not None and prev["cell_type"] == cell["cell_type"] and prev["source"] == cell["source"]
        kept.append(prev if same else cell)
    return {**nb, "cells": kept}


def _dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def update_notebook(path: Path, cells: list[dict], out: Path | None = None, attempts: int = 5) -> bool:
    """Read-modify-write ``path`` (to ``out`` when given); True when something was written."""
    for _ in range(attempts):
        raw = path.read_text(encoding="utf-8")
        text = _dumps(apply_section(json.loads(raw), cells))
        target = out or path
        if target.exists() and target.read_text(encoding="utf-8") == text:
            return False
        if out is None and path.read_text(encoding="utf-8") != raw:
            continue  # someone wrote the notebook meanwhile: read it again
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return True
    raise RuntimeError(f"{path} kept changing while the exercises were written; run the command again")


def _section_differs(path: Path, cells: list[dict]) -> bool:
    nb = json.loads(path.read_text(encoding="utf-8"))
    have = [(c["cell_type"], c.get("id"), c["source"]) for c in nb["cells"] if _tagged(c)]
    return have != [(c["cell_type"], c["id"], c["source"]) for c in cells] or not _tagged(nb["cells"][-1])


def default_folder() -> Path:
    return Path(__file__).resolve().parents[2] / "notebooks"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_lesson.exercises.insert", description=__doc__.split("\n")[0])
    ap.add_argument("--notebooks", type=Path, default=default_folder(), help="folder of the notebooks")
    ap.add_argument("--check", action="store_true", help="report notebooks whose section is not the registry's")
    ap.add_argument("--starters", type=Path, metavar="DIR", help="write copies with the starter cells into DIR")
    a = ap.parse_args(argv)
    if a.check and a.starters:
        ap.error("--check and --starters do not go together: pick one")
    paths = {stem: a.notebooks / f"{stem}.ipynb" for stem in EXERCISES}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        print(f"error: notebook(s) not found: {', '.join(missing)}; pass --notebooks DIR", file=sys.stderr)
        return 2
    if a.starters:
        a.starters.mkdir(parents=True, exist_ok=True)
    stale = []
    for stem, path in paths.items():
        cells = section_cells(EXERCISES[stem], starters=a.starters is not None)
        if a.check:
            if _section_differs(path, cells):
                stale.append(path.name)
            continue
        out = a.starters / path.name if a.starters else None
        wrote = update_notebook(path, cells, out)
        print(f"{(out or path)}: {len(EXERCISES[stem])} exercises, {'written' if wrote else 'unchanged'}")
    if a.check:
        print("exercise sections out of date: " + ", ".join(stale) if stale else "every exercise section is up to date")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
