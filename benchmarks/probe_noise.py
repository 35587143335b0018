"""How a neighbour on the cores misleads the cost model's probe of T(n), read three ways from the same rounds.

    python benchmarks/probe_noise.py            # ~7 min on 2 cores: benchmarks/results/probe_noise_<cpu>.json
    python benchmarks/probe_noise.py --quick    # seconds: tiny counts, to check the script

The adaptive policies (``drafters.adaptive``, ``tree.adaptive``) size each step on T(n), one forward of the target over
n tokens, probed in a few rounds when the run starts.  On a shared machine another process steals time from some
rounds; a curve that reads T(4) as cheap as T(1) makes every tree look free.  This script probes the default target's
lean forward (as the demo does: widths 1..17, interleaved rounds after a warm-up round) many times, alternating two
conditions (ABBA order against drift):

* ``quiet``: nothing else runs (run it on a quiet machine);
* ``neighbour``: a second process streams a 256 MB array on one core, the way a neighbour on a shared host would.

Each probe takes 12 rounds; its curve is read three ways: ``median_first``, the median of the first 3 rounds
(``--rounds``; the probe until 2026-12-07); ``fastest_first``, their fastest (``profiling.probe_cost``); ``probe``,
what ``lean.path.engine_verify_curve`` now reports: the fastest of the first 3 rounds, or of all 12 when those 3
disagree or read a wider forward faster than one token (``profiling.needs_more_rounds``).  Against a reference
curve (per width the fastest of every quiet round: 30 taken before and after, and the quiet probes' own) it reports
per condition and reading: the curve's shape T(4)/T(1), T(9)/T(1), T(17)/T(1) over probes (median, range), how many
probes read T(4) <= T(1), and what the adaptive tree would choose from that curve for a chain of nodes worth alpha^d
(alpha: the shipped draft's held-out alpha on chat and code, ``draft_styles_stage7.json``), with the expected tokens
per second that choice loses under the reference.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from lean_vs_hf import RESULTS, cpu_name, cpu_slug

WIDTHS = list(range(1, 18))  # the demo's: the adaptive tree's root and up to 16 nodes
ALPHA = {"chat": 0.423, "code": 0.574}  # the shipped draft's held-out alpha (draft_styles_stage7.json, N = 2048)
NEIGHBOUR = ("import torch; torch.set_num_threads(1); x = torch.ones(2 ** 26)\n"
             "while True: x.sum()")  # 256 MB read over and over on one core


def _args(argv: list[str] | None):
    from specdec_lesson.cli_args import OneLineParser, UsageError

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny counts (a check of the script, not a measurement)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--probes", type=int, default=12, help="probes per condition (default 12)")
    ap.add_argument("--rounds", type=int, default=3, help="a probe's first rounds (default 3, as the demo's probe)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="overwrite an existing results file")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.probes < 1 or a.rounds < 1:
        raise UsageError("--threads, --probes and --rounds must be positive")
    a.out = a.out or RESULTS / f"probe_noise_{cpu_slug()}{'_quick' if a.quick else ''}.json"
    if a.out.exists() and not a.force:
        raise UsageError(f"{a.out} exists: pass --force to overwrite it, or --out another path")
    return a


def choice(curve: dict[int, float], alpha: float) -> int:
    """The adaptive tree's node count (``tree.adaptive.best_node_count``) for a chain of 16 nodes worth alpha^d,
    on this curve (clamped at T(1) from below, as ``drafters.adaptive.measure_step_costs`` does)."""
    from specdec_lesson.drafters.adaptive_policy import StepCosts
    from specdec_lesson.tree.adaptive import best_node_count

    costs = StepCosts(tuple(max(curve[n], curve[1]) for n in WIDTHS), 0.0, 0.0)
    return best_node_count([alpha ** d for d in range(1, len(WIDTHS))], costs)[0]


def rate(curve: dict[int, float], alpha: float, n: int) -> float:
    """Expected tokens per second of verifying the chain's first n nodes under ``curve``."""
    return (1 + sum(alpha ** d for d in range(1, n + 1))) / curve[1 + n]


def readings(rounds: dict[int, list[float]], first: int) -> tuple[dict[str, dict[int, float]], bool]:
    """The curve that each reading takes from one probe's ``rounds`` (``first`` of them the probe's first), and
    whether the probe as it now runs took the later rounds too (``profiling.needs_more_rounds``)."""
    from specdec_lesson.profiling import needs_more_rounds

    head = {n: ts[:first] for n, ts in rounds.items()}
    extended = needs_more_rounds(head) is not None
    used = rounds if extended else head
    return {"median_first": {n: statistics.median(ts) for n, ts in head.items()},
            "fastest_first": {n: min(ts) for n, ts in head.items()},
            "probe": {n: min(ts) for n, ts in used.items()}}, extended


def summarise(probes: list[dict], reference: dict[int, float], first: int) -> dict:
    """Per condition and reading: the curve's shape over probes, the probes that read T(4) <= T(1), and the tree's
    choices with their loss under ``reference``."""
    out: dict = {}
    ref_n = {s: choice(reference, a) for s, a in ALPHA.items()}
    for cond in sorted({p["condition"] for p in probes}):
        read = [readings(p["rounds_ms"], first) for p in probes if p["condition"] == cond]
        for reading in ("median_first", "fastest_first", "probe"):
            curves = [curves_of[reading] for curves_of, _ in read]
            row: dict = {"probes": len(curves), "T1_ms": _spread([c[1] for c in curves])}
            if reading == "probe":
                row["probes_extended"] = sum(extended for _, extended in read)
            for n in (4, 9, 17):
                row[f"T{n}_over_T1"] = _spread([c[n] / c[1] for c in curves])
            row["reads_T4_at_or_below_T1"] = sum(c[4] <= c[1] for c in curves)
            for s, a in ALPHA.items():
                ns = [choice(c, a) for c in curves]
                loss = [1 - rate(reference, a, n) / rate(reference, a, ref_n[s]) for n in ns]
                row[f"tree_{s}"] = {"nodes": _spread(ns), "loss_vs_reference": _spread(loss),
                                    "probes_losing_over_5pct": sum(x > 0.05 for x in loss)}
            out[f"{cond}/{reading}"] = row
    out["reference_choice"] = ref_n
    return out


def _spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def main(argv: list[str] | None = None) -> int:
    from specdec_lesson.cli_args import UsageError

    try:
        a = _args(argv)
    except UsageError as exc:
        print(f"probe_noise.py: error: {exc}", file=sys.stderr)
        return 2
    total = 4 * a.rounds  # a probe's rounds in all: engine_verify_curve's default max_repeats
    if a.quick:
        a.probes, total = 2, a.rounds + 1
    torch.set_num_threads(a.threads)
    from specdec_lesson.bench.results import machine_info
    from specdec_lesson.lean import lean_verify_curve, tune_lean_dispatch
    from specdec_lesson.models import load_default_target

    target, _ = load_default_target("cpu", fast=True, verbose=False)
    tuned = tune_lean_dispatch(target, repeats=3)
    ref_rounds = 2 if a.quick else 15
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        neighbour.send_signal(signal.SIGSTOP)
        before = lean_verify_curve(target, WIDTHS, 128, rounds=ref_rounds)
        order = [("quiet", "neighbour", "neighbour", "quiet")[i % 4] for i in range(2 * a.probes)]
        probes, start = [], time.perf_counter()
        for i, cond in enumerate(order):
            neighbour.send_signal(signal.SIGCONT if cond == "neighbour" else signal.SIGSTOP)
            time.sleep(0.2)  # let the neighbour reach its loop (or stop)
            rounds = lean_verify_curve(target, WIDTHS, 128, rounds=total)  # one warm-up round, as the demo
            probes.append({"condition": cond, "rounds_ms": {n: [t * 1e3 for t in ts] for n, ts in rounds.items()}})
            print(f"[probe_noise] probe {i + 1}/{len(order)} ({cond}) {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
        neighbour.send_signal(signal.SIGSTOP)
        after = lean_verify_curve(target, WIDTHS, 128, rounds=ref_rounds)
    finally:
        neighbour.send_signal(signal.SIGCONT)
        neighbour.kill()
        neighbour.wait()
    quiet = [before, after] + [{n: [t / 1e3 for t in ts] for n, ts in p["rounds_ms"].items()}
                               for p in probes if p["condition"] == "quiet"]
    reference = {n: min(t for r in quiet for t in r[n]) * 1e3 for n in WIDTHS}  # the fastest of every quiet round
    res = {
        "what": __doc__.strip().splitlines()[0], "cpu": cpu_name(), "cpu_slug": cpu_slug(), "machine": machine_info(),
        "threads": a.threads, "quick": a.quick, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "probes_per_condition": a.probes, "first_rounds": a.rounds, "rounds_per_probe": total, "widths": WIDTHS, "alpha": ALPHA,
        "lean_plain_rows_max": tuned["plain_rows_max"], "dispatch_spread": tuned["spread"],
        "reference": {"how": f"per width the fastest of every quiet round: {2 * ref_rounds} before and after the "
                             "probes and the quiet probes' own", "curve_ms": reference,
                      "before_after_median_ms": {n: statistics.median(before[n] + after[n]) * 1e3 for n in WIDTHS}},
        "summary": summarise(probes, reference, a.rounds),
        "probes": probes,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(a.out)
    print(json.dumps(res["summary"], indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
