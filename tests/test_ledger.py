"""The published tables match the committed results files (bench.ledger, benchmarks/ledger.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specdec_lesson.bench.ledger import draft_line, file_table, machine_line, matrix, matrix_svg, read_block, replace_block

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("ledger_script", ROOT / "benchmarks" / "ledger.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_marked_block_matches_its_results_file():
    """README's results matrix, its time table and course map, and docs/results.md's tables, each against the
    file it comes from: run ``python benchmarks/ledger.py`` after a benchmark to update them."""
    for doc, blocks in _script().expected().items():
        text = doc.read_text()
        for name, content in blocks.items():
            assert read_block(text, name) == content, f"{doc.name}: block {name} is stale (python benchmarks/ledger.py)"


def test_svg_matches_the_headline():
    mod = _script()
    svg = matrix_svg(json.loads((mod.RESULTS / mod.HEADLINE).read_text()),
                     title="Speedup over plain decoding, greedy (bars: median of repeats; whiskers: 95% nominal interval)")
    assert mod.SVG.read_text() == svg and "<script" not in svg and "http://" not in svg.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


def _res(speedup=1.5, ci=(1.2, 1.9)):
    return {"per_task": [{"task": "code", "label": "ar", "speedup": 1.0, "speedup_ci": None, "prompts": 12, "repeats": 3},
                         {"task": "code", "label": "chain-k4", "speedup": speedup, "speedup_ci": list(ci), "prompts": 12,
                          "repeats": 3, "alpha": 0.5, "tau": 2.0, "equal_ar_rate": 1.0}],
            "machine": {"cpu": "AMD EPYC", "isa": ["avx2"], "torch_threads": 2, "torch": "2.13.0"}}


def test_matrix_states_n_and_interval_and_moves_with_the_file():
    text = matrix(_res())
    assert "code (n = 12x3)" in text and "| draft alone (`chain`, K = 4) | 1.50x [1.20-1.90] |" in text
    assert matrix(_res(speedup=1.51)) != text  # a planted change in the file changes the table
    assert "| code | chain-k4 | 12x3 | 1.50x [1.20-1.90] | 0.50 | 2.00 | 1.00 |" in file_table(_res())


def test_block_markers():
    text = "x\n<!-- ledger:m -->\nold\n<!-- /ledger:m -->\ny"
    new = replace_block(text, "m", "new\nlines")
    assert read_block(new, "m") == "new\nlines" and new.startswith("x\n") and new.endswith("\ny")
    with pytest.raises(ValueError, match="add the two markers"):
        replace_block("no markers", "m", "z")


def test_readme_is_a_newcomers_page():
    """At most 12,000 characters; it names no file the repository lacks (checked elsewhere) and defines its words."""
    text = (ROOT / "README.md").read_text()
    assert len(text) <= 12_000, len(text)
    for word in ("alpha", "utilisation", "tau", "T(n)"):
        assert f"| {word}" in text


def test_report_works_offline(tmp_path):
    """The HTML report loads plotly.js from a file beside it, never from a CDN (the course runs offline)."""
    import re

    from specdec_lesson.bench.report import write_html
    from specdec_lesson.bench.results import load_results

    page = write_html(load_results(ROOT / "benchmarks" / "results" / "bench_default_t0.json"), tmp_path / "r.html")
    text = page.read_text()
    srcs = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", text)
    assert srcs == ["plotly.min.js"] and (tmp_path / "plotly.min.js").stat().st_size > 1_000_000
    assert "cdn.plot.ly" not in text
    committed = ROOT / "benchmarks" / "results"
    for html in [*committed.glob("*.html"), *committed.glob("archive/*.html")]:
        page_text = html.read_text()
        assert "cdn.plot.ly" not in page_text, html.name
        for src in re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page_text):  # every script resolves offline
            assert (html.parent / src).is_file(), f"{html.name}: {src}"
    assert (committed / "plotly.min.js").is_file()


def test_machine_kind_tells_the_amd_generations_apart():
    """The model name alone reads "AMD EPYC" on Zen 3, 4 and 5; the CPUID family and model tell them apart."""
    from specdec_lesson.bench.results import _kind

    assert _kind("AuthenticAMD", 25, 0x01, set()) == "AMD Zen 3"
    assert _kind("AuthenticAMD", 25, 0x11, {"avx512f"}) == "AMD Zen 4"
    assert _kind("AuthenticAMD", 26, 0x02, {"avx512f"}) == "AMD Zen 5"
    assert _kind("GenuineIntel", 6, 0x8F, {"amx_tile"}) == "Intel with AMX"
    line = machine_line({"machine": {"cpu": "AMD EPYC", "kind": "AMD Zen 5", "isa": ["avx2"], "torch_threads": 2,
                                     "torch": "2.13.0"}})
    assert line == "AMD EPYC (AMD Zen 5) (avx2), 2 threads, torch 2.13.0"


def test_draft_line_names_the_draft_a_run_used():
    w = {"sha256_16": "21c0bba8c460bd6f", "n_sub": 2048, "steps_total": 6900}
    assert draft_line({"pair": {"pair": "default", "draft_weights": w}}) == \
        "draft weights 21c0bba8c460bd6f (output subset 2048, 6900 training steps)"
    assert "not recorded" in draft_line({"pair": {"pair": "default"}})
    assert draft_line({"pair": {"pair": "tiny"}}) == ""  # a custom or toy pair names its draft in pair.draft


def test_every_archived_file_is_labelled():
    """A file kept as a record under benchmarks/results/archive/ is named in that folder's README (what it measured,
    what supersedes it) and has its section in docs/results.md; nothing else of the course loads it from the top."""
    archive = ROOT / "benchmarks" / "results" / "archive"
    readme = (archive / "README.md").read_text()
    ledger = (ROOT / "docs" / "results.md").read_text()
    files = [p for p in archive.iterdir() if p.suffix in (".json", ".html")]
    assert files
    for path in files:
        assert f"`{path.name}`" in readme or f"`{path.stem}.json` (+ `.html`" in readme, path.name
        if path.suffix == ".json":
            assert f"`archive/{path.name}`" in ledger.split("## Archived records", 1)[1], path.name
            assert not (archive.parent / path.name).exists(), f"{path.name} is both archived and current"


def test_drafts_per_step_counts_plain_steps_and_keeps_first_greedy_repeat():
    """Shares of steps by drafts chosen: steps absent from verify_hist drafted nothing (K' = 0); a greedy file's
    later repeats replay the same tokens and are left out; a file without verify_hist gives {}."""
    from specdec_lesson.bench.report import drafts_per_step

    def run(repeat, steps, hist, task="chat"):
        return {"task": task, "label": "adaptive-k4", "repeat": repeat,
                "stats": {"row_steps": steps, "verify_hist": hist}}

    res = {"settings": {"temperature": 0.0},
           "runs": [run(0, 10, {"2": [1, 1, 2], "4": [0, 0, 0, 1, 1]}),  # 4 + 2 steps with drafts, 4 without
                    run(1, 99, {"2": [50, 0, 0]}),  # a greedy repeat: ignored
                    run(0, 5, {"4": [5, 0, 0, 0, 0]}, task="code")]}
    assert drafts_per_step(res, "chat", "adaptive-k4") == {0: 0.4, 2: 0.4, 4: 0.2}
    assert drafts_per_step(res, "code", "adaptive-k4") == {0: 0.0, 4: 1.0}
    res["settings"]["temperature"] = 0.7  # sampled repeats are different samples: pooled
    assert drafts_per_step(res, "chat", "adaptive-k4") == {0: 53 / 109, 2: 54 / 109, 4: 2 / 109}
    assert drafts_per_step(res, "math", "adaptive-k4") == {}
    assert drafts_per_step({"settings": {}, "runs": [{"task": "chat", "label": "adaptive-k4", "repeat": 0,
                                                       "stats": {"row_steps": 3}}]}, "chat", "adaptive-k4") == {}
