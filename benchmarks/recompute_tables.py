"""Recompute the tables of committed bench results files from their raw runs, with the paired statistics.

Every ``specdec-bench/1`` file keeps one record per (prompt, method, repeat) with that repeat's tokens and seconds,
so its per-prompt and per-task tables can be rebuilt without running anything: this replaces ``per_prompt``,
``per_task`` (and vLLM's ``speedup_vs_vllm``) with what ``bench.metrics`` computes now, adds ``repeat_spread``,
and records what was done under ``tables_recomputed``.  The runs themselves are not touched.  Each file is
rewritten atomically; ``--check`` only reports what would change.

    python benchmarks/recompute_tables.py --check
    python benchmarks/recompute_tables.py benchmarks/results/bench_default_t0.json ...   # default: every bench file
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec_lesson.bench.metrics import prompt_table, task_table  # noqa: E402
from specdec_lesson.bench.paired import CI_METHOD, repeat_spread  # noqa: E402
from specdec_lesson.bench.results import RESULTS_FORMAT, _git_revision, write_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def recompute(res: dict) -> dict:
    """The same results with their tables rebuilt from ``runs`` (a new dict; ``res`` is left as it was)."""
    out = dict(res)
    out["per_prompt"] = prompt_table(res["runs"])
    out["per_task"] = task_table(res["runs"])
    out["repeat_spread"] = repeat_spread(res["runs"])
    if any(r.get("label") == "vllm" for r in out["per_task"]):
        from specdec_lesson.bench.vllm_engine import add_vllm_speedups

        out["notes"] = [n for n in res.get("notes", []) if not n.startswith("speedup_vs_vllm")]
        add_vllm_speedups(out)
    out["definitions"] = ("see specdec_lesson/bench/metrics.py and bench/paired.py: each repeat's tokens with its own "
                          "seconds; task speedup = median over repeats of the paired throughput ratio over ar; "
                          f"interval: {CI_METHOD}; alpha, tau pooled")
    out["tables_recomputed"] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "git": _git_revision(),
                                "how": "benchmarks/recompute_tables.py: tables rebuilt from the unchanged runs"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="bench results files (default: every one in benchmarks/results)")
    ap.add_argument("--check", action="store_true", help="print the speedups before and after; write nothing")
    a = ap.parse_args(argv)
    files = a.files or sorted(RESULTS.glob("*.json"))
    for path in files:
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            ap.error(f"{path}: not readable JSON ({exc})")
        if not isinstance(res, dict) or res.get("format") != RESULTS_FORMAT:
            if a.files:
                ap.error(f"{path} is not a {RESULTS_FORMAT} results file")
            continue
        if res.get("complete") is not True or not isinstance(res.get("runs"), list):
            ap.error(f"{path} is incomplete or has no runs: nothing to recompute from")
        new = recompute(res)
        before = {(r["task"], r["label"]): r.get("speedup") for r in res.get("per_task", [])}
        moved = [(k, b, r["speedup"]) for r in new["per_task"] if (k := (r["task"], r["label"])) in before
                 and (b := before[k]) and r["speedup"] and abs(r["speedup"] / b - 1) > 0.02]
        print(f"{path.name}: {len(new['per_task'])} task rows, {len(moved)} moved by more than 2%")
        for (task, label), b, n in moved:
            print(f"    {task:9s} {label:22s} {b:.2f}x -> {n:.2f}x")
        if not a.check:
            write_results(new, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
