"""Regenerate the published tables from the committed results: the README's results matrix and its SVG chart, and
one table per bench results file in docs/results.md (``specdec_lesson.bench.ledger``).

    python benchmarks/ledger.py            # rewrite the marked blocks and docs/speedup.svg
    python benchmarks/ledger.py --check    # exit 1 if any of them differs from what the files say (the test does this)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec_lesson.bench.ledger import draft_line, file_table, machine_line, matrix, matrix_svg, read_block, replace_block  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
HEADLINE = "bench_default_t0_zen5.json"  # the README's matrix: the shipped draft's run
SVG = ROOT / "docs" / "speedup.svg"
TIMINGS = RESULTS / "course_timings.json"
COURSE = {  # notebook -> what a learner takes from it
    "00_memory_wall": "why decoding is memory-bound: the roofline, your machine's bandwidth, its verify-cost curve "
                      "T(n) in four forms, and where each millisecond of a decode step goes",
    "01_rejection_sampling": "the accept / residual / bonus rule derived with sympy, checked exactly with fractions and "
                             "by Monte Carlo; the classic bugs and what they distort; S(K); block verification",
    "02_speculative_decoding": "the engine built cell by cell on the real models: the loop, KV caches, the seed page's "
                               "bugs and their fixes, ragged batches, the statistics of a run; watch your own prompt "
                               "decode",
    "03_kv_cache_rollback": "rolling a cache back after a rejection: crop, a static cache where rollback moves a "
                            "pointer, a paged cache with a block table, ragged batches as a valid-slot map",
    "04_tree_verification": "token trees and tree attention masks, lossless multi-candidate verification (greedy and "
                            "at T = 0.7), one tree of draft and lookup candidates, sized per step",
    "05_triton_kernels": "fused verification, tree attention and KV compaction kernels beside their torch references "
                         "(the Triton interpreter on a CPU), the bytes each path moves, and what an H200 measured",
    "06_latency_simulator": "the latency and speedup simulator with sliders, calibrated on measurements; predict a "
                            "speedup, measure it, and see when speculation should be switched off",
    "07_benchmarks": "the benchmark: code, requests, math and chat against plain decoding, Hugging Face and vLLM, "
                     "next to published numbers",
    "08_training_a_draft": "distilling the draft: how acceptance grows, why the output layer and the verify curve "
                           "matter; a lab that trains a draft in minutes",
}


def bench_files() -> list[Path]:
    out = []
    for path in sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("archive/*.json")):  # archived records too
        try:
            res = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(res, dict) and res.get("format") == "specdec-bench/1" and res.get("complete") is True:
            out.append(path)
    return out


def expected() -> dict[Path, dict[str, str]]:
    """{document: {block name: content}} as the committed results make them."""
    head = json.loads((RESULTS / HEADLINE).read_text())
    readme = {"matrix": f"Measured on: {machine_line(head)}; {draft_line(head)}; `benchmarks/results/{HEADLINE}`.\n\n"
                        f"{matrix(head)}"}
    readme.update(_course_blocks())
    docs = {}
    for path in bench_files():
        res = json.loads(path.read_text())
        s = res["settings"]
        d = draft_line(res)
        drafted = f" {d[:1].upper()}{d[1:]}." if d else ""
        docs[path.stem] = (f"Machine: {machine_line(res)}.{drafted} Settings: temperature {s['temperature']}, "
                           f"{s['max_new_tokens']} new tokens, K = {', '.join(map(str, s['ks']))}"
                           f"{' (chosen by --k auto)' if s.get('auto_k') else ''}, {s['repeats']} interleaved repeats, "
                           f"created {res.get('created', '?')}.\n\n{file_table(res)}")
    return {ROOT / "README.md": readme, ROOT / "docs" / "results.md": docs}


def _minutes(secs: float) -> str:
    return f"{secs:.0f} s" if secs < 90 else f"{round(secs / 60)} min"


def _course_blocks() -> dict[str, str]:
    t = json.loads(TIMINGS.read_text())
    m = t.get("machine") or {}
    kind = f" ({m['kind']})" if m.get("kind") else ""
    where = f"{m.get('cpu') or 'this machine'}{kind}, {t['threads']} threads, {t['date'][:10]}"
    steps = t["steps"]
    parts = [f"{name} {_minutes(steps[key]['seconds'])}" for key, name in
             (("install", "install"), ("demo", "demo"), ("tests", "tests (CI mode)")) if key in steps]
    timings = (f"Measured times ({where}; `benchmarks/results/course_timings.json`): {', '.join(parts)}; the first "
               "model load adds a one-time conversion.")
    rows = ["| notebook | what you will learn | time to run it |", "|---|---|---|"]
    for stem, what in COURSE.items():
        full = t["notebooks"].get(stem, {}).get("full", {}).get("seconds")
        mins = _minutes(full) if full else "not measured"
        rows.append(f"| `notebooks/{stem}.ipynb` | {what} | {mins} |")
    return {"timings": timings, "course": "\n".join(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; write nothing")
    a = ap.parse_args(argv)
    stale = []
    for doc, blocks in expected().items():
        text = doc.read_text()
        new = text
        for name, content in blocks.items():
            if read_block(new, name) != content:
                stale.append(f"{doc.relative_to(ROOT)}: block {name}")
                if not a.check:
                    new = replace_block(new, name, content)
        if new != text:
            doc.write_text(new)
    svg = matrix_svg(json.loads((RESULTS / HEADLINE).read_text()),
                     title="Speedup over plain decoding, greedy (bars: median of repeats; whiskers: 95% nominal interval)")
    if not SVG.is_file() or SVG.read_text() != svg:
        stale.append(str(SVG.relative_to(ROOT)))
        if not a.check:
            SVG.write_text(svg)
    for s in stale:
        print(("stale: " if a.check else "updated: ") + s)
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
