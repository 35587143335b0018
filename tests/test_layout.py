"""The package's shape: no import circle (lazy imports inside functions included), no module over 400 lines,
no file that points outside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specdec_lesson"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py") if ".ipynb_checkpoints" not in p.parts}


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over every import statement of the package, at any depth."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, is_pkg, node.level, node.module) if node.level else (node.module or "")
                targets = [src]
                targets += [f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in mods]
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    graph = import_graph()
    # a package's __init__ re-exports its submodules; a submodule importing its own package's __init__ would
    # therefore be a circle through the re-export: forbidden too (it is one of the cycles found below)
    assert find_cycles(graph) == []
    assert "specdec_lesson.drafters.eagle" in graph["specdec_lesson.drafters"]  # the graph sees re-exports


def test_nothing_below_imports_the_default_pair():
    graph = import_graph()
    users = sorted(m for m, deps in graph.items() if "specdec_lesson.drafters.pair" in deps)
    assert set(users) <= {"specdec_lesson.__main__", "specdec_lesson.bench.loading", "specdec_lesson.bench.runner"}, users


def test_modules_at_most_400_lines():
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def _project_files() -> list[Path]:
    """The files git tracks, plus untracked ones it does not ignore (every file outside .git without git)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.relative_to(ROOT).parts]


def test_no_reference_outside_the_repository():
    """Every document a project file names (``*.md``, ``*.txt``) is a file of the repository, and every ``../`` path
    stays inside the repository and exists: a learner has the repository and nothing beside it."""
    files = _project_files()
    names = {p.name for p in files}
    doc = re.compile(r"\b[A-Za-z0-9_.-]+\.(?:md|txt)\b")
    up = re.compile(r"(?:\.\./)+[A-Za-z0-9_./-]+")
    hits = []
    for p in files:
        if p.suffix not in {".py", ".ipynb", ".md", ".sh", ".toml", ".txt", ".yml", ".cfg", ""}:
            continue
        if p.resolve() == Path(__file__).resolve():  # its own planted example below
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            hits += [f"{p.relative_to(ROOT)}:{i}: {m}" for m in doc.findall(line) if m not in names]
            for m in up.findall(line):
                target = (p.parent / m.rstrip(".")).resolve()
                if ROOT.resolve() not in (target, *target.parents) or not target.exists():
                    hits.append(f"{p.relative_to(ROOT)}:{i}: {m}")
    assert hits == []


def test_the_reference_check_can_fail():
    bad = ROOT / "tests" / "_planted_reference.md"
    bad.write_text("see ../../elsewhere/NOTES.md\n")
    try:
        with pytest.raises(AssertionError):
            test_no_reference_outside_the_repository()
    finally:
        bad.unlink()
