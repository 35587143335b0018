"""Benchmark metrics: from one record per (prompt, method, repeat) to per-prompt and per-task tables.

A *run record* (what the runner stores in ``results["runs"]``) is a dict with at least
``task``, ``prompt_id``, ``label`` (method and K, e.g. ``chain-k4``), ``repeat``, ``wall_s`` and
``new_tokens``; engine methods add ``stats`` (the SpecStats counters ``accepted``, ``rejections``,
``proposed``, ``emitted``, ``row_steps``, ``accept_hist``, ``target_forwards``, ``draft_forwards``); repeat 0
adds ``equal_ar`` (greedy: the same tokens as ``ar``), ``correct`` (math) and ``passed`` (code,
with ``--check-code``).

Definitions (all stated in the results file and the notebook):

* pairing (``paired``): every throughput pairs a repeat's tokens with that repeat's own seconds, and every speedup
  pairs a method's repeat with ``ar``'s run of the same prompt in the same repeat (at T > 0 the repeats are different
  samples of different lengths: medians of seconds and of tokens taken separately would mix them);
* per prompt: ``wall_s`` / ``new_tokens`` are medians over repeats (for reading only), ``tokens_per_s`` the median
  of the per-repeat ``new_tokens / wall_s``, and ``speedup`` the median over repeats of the repeat's paired
  throughput ratio over ``ar``;
* per task: ``tokens_per_s`` is the median over repeats of the repeat's tokens / seconds summed over the prompts,
  ``speedup`` the median over repeats of the repeat's paired throughput ratio over ``ar`` (``speedup_repeats`` lists
  them), ``speedup_ci`` its two-level bootstrap interval (``paired.CI_METHOD``, nominal 95%; ``prompts`` and
  ``repeats`` give its n), ``speedup_median`` the median of the per-prompt speedups and ``speedup_range`` their
  [min, max]; ``wall_s`` and ``new_tokens`` are totals over every prompt and repeat;
* ``alpha`` = accepted / (accepted + rejections), the per-token acceptance probability (Leviathan's
  alpha, ``SpecStats.alpha``); ``utilisation`` = accepted / proposed drafts (``SpecStats.utilisation``:
  lower, the drafts after a rejection are wasted); ``tau`` = emitted tokens / verify steps; all pooled
  over all prompts and repeats (not an average of ratios); ``accept_hist`` summed.  A record without
  ``rejections`` (written before the counter existed) counts, as rejections, its steps with n < k
  accepted in ``accept_hist`` (exact unless a step was cut by EOS / the budget or proposed != k drafts);
  ``target_forwards_per_token`` = target forwards / new tokens (prefill included);
* ``accuracy``, ``equal_ar_rate`` and ``pass_at_1`` are fractions of the prompts (repeat 0);
* spread: per prompt, ``tokens_per_s_range`` is [min, max] over repeats; per file, ``repeat_spread``
  (``paired.repeat_spread``) the run-to-run noise of identical work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .paired import (
    CI_METHOD,
    paired_cells,
    paired_task_speedup,
    percentile_interval,
    prompt_speedup,
    repeat_speedups,
    two_level_bootstrap_ci,
)

__all__ = ["median", "pooled_acceptance", "prompt_table", "task_table", "bootstrap_speedup_ci", "AR_LABEL"]

AR_LABEL = "ar"
BOOTSTRAP_RESAMPLES = 2000


def median(xs: Iterable[float]) -> float:
    s = sorted(float(x) for x in xs)
    if not s:
        return float("nan")
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _rate(flags: list) -> float | None:
    flags = [f for f in flags if f is not None]
    return sum(bool(f) for f in flags) / len(flags) if flags else None


def _rejections(s: dict) -> int:
    if "rejections" in s:
        return s["rejections"]
    hist = s.get("accept_hist") or []
    k = s.get("k") or len(hist) - 1  # an older record: steps that accepted fewer than k drafts
    return sum(c for n, c in enumerate(hist) if n < k)


def pooled_acceptance(stats: Iterable[dict | None]) -> dict:
    """alpha, utilisation, tau, summed accept_hist and forward counts over several SpecStats counter dicts."""
    stats = [s for s in stats if s]
    if not stats:
        return {"alpha": None, "utilisation": None, "tau": None, "accept_hist": None, "target_forwards": None,
                "draft_forwards": None}
    width = max(len(s.get("accept_hist") or []) for s in stats)
    hist = [0] * width
    for s in stats:
        for i, c in enumerate(s.get("accept_hist") or []):
            hist[i] += c
    proposed = sum(s.get("proposed", 0) for s in stats)
    accepted = sum(s.get("accepted", 0) for s in stats)
    trials = accepted + sum(_rejections(s) for s in stats)
    steps = sum(s.get("row_steps", 0) for s in stats)
    return {
        "alpha": accepted / trials if trials else None,
        "utilisation": accepted / proposed if proposed else None,
        "tau": sum(s.get("emitted", 0) for s in stats) / steps if steps else None,
        "accept_hist": hist if width else None,
        "target_forwards": sum(s.get("target_forwards", 0) for s in stats),
        "draft_forwards": sum(s.get("draft_forwards", 0) for s in stats),
    }


def bootstrap_speedup_ci(pairs: list[tuple[float, float, float, float]], level: float = 0.95,
                         resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> list[float] | None:
    """Percentile bootstrap interval of a throughput ratio over prompts.  ``pairs`` holds, per prompt,
    ``(tokens, wall_s, ar_tokens, ar_wall_s)``; a resample draws prompts with replacement and computes
    (sum tokens / sum wall) / (sum ar_tokens / sum ar_wall).  None for fewer than 2 prompts."""
    import random

    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    n, stats = len(pairs), []
    for _ in range(resamples):
        pick = [pairs[rng.randrange(n)] for _ in range(n)]
        wall, ar_wall = sum(p[1] for p in pick), sum(p[3] for p in pick)
        if wall <= 0 or ar_wall <= 0:
            continue
        stats.append((sum(p[0] for p in pick) / wall) / (sum(p[2] for p in pick) / ar_wall))
    return percentile_interval(stats, level)


def _first(runs: list[dict], key: str):
    for r in sorted(runs, key=lambda r: r["repeat"]):
        if key in r:
            return r[key]
    return None


def prompt_table(runs: Iterable[dict]) -> list[dict]:
    """One row per (task, prompt_id, label): medians over repeats and the paired speedup over ``ar``."""
    runs = list(runs)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["task"], r["prompt_id"], r["label"])].append(r)
    cells = {(t, lab): paired_cells(runs, t, lab, AR_LABEL) for t, lab in {(t, lab) for t, _, lab in groups}}
    rows = []
    for (task, pid, label), rs in groups.items():
        tps = [r["new_tokens"] / r["wall_s"] for r in rs if r["wall_s"] > 0]
        acc = pooled_acceptance(r.get("stats") for r in rs)
        tokens = sum(r["new_tokens"] for r in rs)
        mine = cells[(task, label)].get(pid)
        rows.append({
            "task": task, "prompt_id": pid, "label": label, "method": rs[0].get("method", label), "k": rs[0].get("k"),
            "repeats": len(rs), "wall_s": median(r["wall_s"] for r in rs), "new_tokens": median(r["new_tokens"] for r in rs),
            "tokens_per_s": median(tps) if tps else float("nan"),
            "tokens_per_s_range": [min(tps), max(tps)] if tps else None,
            "speedup": prompt_speedup(mine) if mine else None,
            "alpha": acc["alpha"], "utilisation": acc["utilisation"], "tau": acc["tau"], "accept_hist": acc["accept_hist"],
            "target_forwards_per_token": (acc["target_forwards"] / tokens
                                          if acc["target_forwards"] is not None and tokens else None),
            "equal_ar": _first(rs, "equal_ar"), "correct": _first(rs, "correct"), "passed": _first(rs, "passed"),
        })
    rows.sort(key=lambda r: (r["task"], r["prompt_id"], r["label"]))
    return rows


def _repeat_throughput(rs: list[dict]) -> float:
    """Median over repeats of the repeat's tokens / seconds summed over the prompts."""
    by_rep: dict[int, list[dict]] = defaultdict(list)
    for r in rs:
        by_rep[r["repeat"]].append(r)
    xs = [sum(r["new_tokens"] for r in g) / wall for g in by_rep.values() if (wall := sum(r["wall_s"] for r in g)) > 0]
    return median(xs) if xs else float("nan")


def task_table(runs: Iterable[dict]) -> list[dict]:
    """One row per (task, label): paired throughput and speedup (see the module docstring)."""
    runs = list(runs)
    prows = prompt_table(runs)
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in prows:
        by[(r["task"], r["label"])].append(r)
    raw: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        raw[(r["task"], r["label"])].append(r)
    out = []
    for (task, label), rs in by.items():
        mine = raw[(task, label)]
        acc = pooled_acceptance(r.get("stats") for r in mine)
        all_tokens = sum(r["new_tokens"] for r in mine)
        speedups = [r["speedup"] for r in rs if r["speedup"] is not None]
        cells = paired_cells(runs, task, label, AR_LABEL)
        rep = repeat_speedups(cells)
        out.append({
            "task": task, "label": label, "method": rs[0]["method"], "k": rs[0]["k"], "prompts": len(rs),
            "repeats": max(r["repeats"] for r in rs), "wall_s": sum(r["wall_s"] for r in mine), "new_tokens": all_tokens,
            "tokens_per_s": _repeat_throughput(mine),
            "speedup": paired_task_speedup(cells), "speedup_repeats": rep or None,
            "speedup_ci": two_level_bootstrap_ci(cells) if label != AR_LABEL else None,
            "speedup_ci_method": CI_METHOD if label != AR_LABEL else None,
            "speedup_median": median(speedups) if speedups else None,
            "speedup_range": [min(speedups), max(speedups)] if speedups else None,
            "alpha": acc["alpha"], "utilisation": acc["utilisation"], "tau": acc["tau"], "accept_hist": acc["accept_hist"],
            "target_forwards_per_token": (acc["target_forwards"] / all_tokens
                                          if acc["target_forwards"] is not None and all_tokens else None),
            "accuracy": _rate([r["correct"] for r in rs]), "equal_ar_rate": _rate([r["equal_ar"] for r in rs]),
            "pass_at_1": _rate([r["passed"] for r in rs]),
        })
    out.sort(key=lambda r: (r["task"], r["label"] != AR_LABEL, r["label"]))
    return out
