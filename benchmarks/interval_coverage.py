"""How often does the benchmark's speedup interval cover the true speedup?  Simulated runs, spread taken from a
committed run.

``bench.paired`` quotes each task's speedup (the median over repeats of the paired throughput ratio) with a
two-level percentile bootstrap interval, nominal 95%.  A percentile bootstrap is only approximately right, and with
few prompts it covers less than it says.  This script measures its coverage:

1. From a committed greedy results file it estimates the spread between prompts (sd of the per-prompt log speedups,
   pooled over the drafting methods) and the timing noise of a repeat (sd of log seconds around a prompt's mean,
   pooled over every (prompt, method) with identical tokens in every repeat).
2. It simulates runs of n prompts x 3 repeats with those spreads (prompt lengths and plain speeds drawn like the
   committed ones), computes the interval exactly as the benchmark does, and counts how often it holds the true
   speedup of the simulated population (computed once from 200,000 prompts without timing noise).

    python benchmarks/interval_coverage.py            # -> benchmarks/results/interval_coverage.json (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec_lesson.bench.paired import (  # noqa: E402
    paired_cells,
    paired_task_speedup,
    prompt_speedup,
    two_level_bootstrap_ci,
)
from specdec_lesson.bench.results import cpu_model, write_results  # noqa: E402

SOURCE = ROOT / "benchmarks" / "results" / "bench_default_t0.json"


def _sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def estimate_spreads(res: dict) -> dict:
    """sd of per-prompt log speedups (around each (task, method)'s mean) and sd of a repeat's log seconds."""
    runs = res["runs"]
    dev, noise = [], []
    for row in res["per_task"]:
        if row["label"] == "ar" or not row.get("alpha"):
            continue
        cells = paired_cells(runs, row["task"], row["label"])
        logs = [math.log(s) for c in cells.values() if (s := prompt_speedup(c))]
        m = sum(logs) / len(logs)
        dev += [x - m for x in logs]
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["prompt_id"], r["label"]), []).append(r)
    for rs in groups.values():
        if len(rs) > 1 and len({r["new_tokens"] for r in rs}) == 1:
            logs = [math.log(r["wall_s"]) for r in rs]
            m = sum(logs) / len(logs)
            noise += [x - m for x in logs]
    n_rep = max(r["repeat"] for r in runs) + 1
    # deviations around a mean of n_rep values have variance sigma^2 (n_rep - 1) / n_rep
    return {"prompt_log_sd": math.sqrt(sum(d * d for d in dev) / max(1, len(dev) - 1)),
            "repeat_log_sd": math.sqrt(sum(d * d for d in noise) / len(noise) * n_rep / (n_rep - 1)),
            "prompts_used": len(dev), "groups_used": len(groups)}


def simulate(n_prompts: int, n_repeats: int, trials: int, spreads: dict, true_log: float, rng: random.Random,
             resamples: int) -> dict:
    sp, sr = spreads["prompt_log_sd"], spreads["repeat_log_sd"]
    truth = _population_truth(true_log, sp, random.Random(1))
    covered, widths = 0, []
    for t in range(trials):
        cells = {}
        for p in range(n_prompts):
            tokens = rng.choice([64, 80, 96, 96, 96])
            ar_s_per_tok = 0.06 * math.exp(rng.gauss(0, 0.1))
            speed = math.exp(true_log + rng.gauss(0, sp))
            cells[str(p)] = {r: (tokens, tokens * ar_s_per_tok / speed * math.exp(rng.gauss(0, sr)), tokens,
                                 tokens * ar_s_per_tok * math.exp(rng.gauss(0, sr))) for r in range(n_repeats)}
        ci = two_level_bootstrap_ci(cells, resamples=resamples, seed=t)
        if ci is None:
            continue
        covered += ci[0] <= truth <= ci[1]
        widths.append(ci[1] / ci[0])
    return {"prompts": n_prompts, "repeats": n_repeats, "trials": trials, "coverage": covered / trials,
            "median_width_ratio": sorted(widths)[len(widths) // 2], "truth": truth}


def _population_truth(true_log: float, sp: float, rng: random.Random, n: int = 200_000) -> float:
    """The estimand on a noise-free population: pooled tokens/s of the method over that of ar."""
    tok = sec = btok = bsec = 0.0
    for _ in range(n):
        tokens = rng.choice([64, 80, 96, 96, 96])
        a = 0.06 * math.exp(rng.gauss(0, 0.1))
        speed = math.exp(true_log + rng.gauss(0, sp))
        tok += tokens
        sec += tokens * a / speed
        btok += tokens
        bsec += tokens * a
    return (tok / sec) / (btok / bsec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=SOURCE, help="a committed greedy bench results file")
    ap.add_argument("--trials", type=int, default=300, help="simulated runs per n")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples per interval")
    ap.add_argument("--prompts", default="3,4,6,12,24")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "interval_coverage.json")
    ap.add_argument("--force", action="store_true", help="replace an existing --out file")
    a = ap.parse_args(argv)
    if a.out.exists() and not a.force:
        ap.error(f"{a.out} exists: pass --force to replace it, or choose another --out")
    if not a.source.is_file():
        ap.error(f"--source {a.source} does not exist")
    res = json.loads(a.source.read_text())
    spreads = estimate_spreads(res)
    print(f"spreads from {a.source.name}: {spreads}")
    rng = random.Random(0)
    rows = []
    for n in [int(x) for x in a.prompts.split(",")]:
        row = simulate(n, 3, a.trials, spreads, math.log(1.6), rng, a.resamples)
        rows.append(row)
        print(f"n = {n:3d} prompts x 3 repeats: coverage {row['coverage']:.3f} ({a.trials} simulated runs), "
              f"median upper/lower {row['median_width_ratio']:.2f}")
    # a check of the simulation itself: the estimator's median over simulated runs sits near the truth
    out = {"what": "coverage of the bench's nominal 95% two-level bootstrap interval of the task speedup, simulated",
           "date": datetime.now(UTC).isoformat(timespec="seconds"), "source": str(a.source.relative_to(ROOT)),
           "spreads": spreads, "true_speedup": rows[0]["truth"], "rows": rows, "machine": cpu_model(),
           "estimator": paired_task_speedup.__doc__.strip(), "level": 0.95}
    write_results(out, a.out)  # atomic, strict JSON
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
