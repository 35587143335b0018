"""Paired speedup statistics: each repeat's tokens with its own seconds, each method with ``ar`` of the same repeat.

Why pairing matters.  At temperature > 0 every repeat of a prompt is a different sample of a different length, so a
throughput built from the *median* seconds and the *median* token count of a prompt mixes numbers from different
repeats (on one committed run that inflated a task's speedup from 1.67x to 1.97x).  And timing noise is large: the
same greedy prompt, same tokens, varies by 14-27% between repeats on a 2-core machine.  So:

* a **repeat's throughput** of a (task, method) is the repeat's tokens over the repeat's seconds, summed over the
  task's prompts: ``sum_p tokens[p, r] / sum_p seconds[p, r]``;
* a **repeat's speedup** is that over ``ar``'s throughput in the *same* repeat (the runner interleaves the methods
  inside each repeat, and at T > 0 gives ``ar`` the same seeds);
* the **task speedup** is the median of the repeats' speedups (the median of interleaved repeats);
* its **interval** is a two-level percentile bootstrap of that same statistic: prompts resampled with replacement,
  then, inside each resampled prompt, repeat slots resampled with replacement (the method and ``ar`` of a slot stay
  together).  Its coverage is not exact: ``benchmarks/interval_coverage.py`` measures it on simulated runs with the
  committed runs' spread (``interval_coverage.json``): with few prompts it covers less than its nominal level, which
  is why the headline runs use at least 12 prompts per style and every table states n.

Per prompt, the speedup is the median over repeats of ``(tokens_r / seconds_r) / (ar_tokens_r / ar_seconds_r)``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable

__all__ = ["paired_cells", "repeat_speedups", "paired_task_speedup", "two_level_bootstrap_ci", "prompt_speedup",
           "repeat_spread", "percentile_interval", "CI_LEVEL", "CI_METHOD", "BOOTSTRAP_RESAMPLES"]

CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
CI_METHOD = ("two-level percentile bootstrap (prompts, then repeats within a prompt; method and ar of a repeat kept "
             f"together), {BOOTSTRAP_RESAMPLES} resamples, seed 0")

Cell = tuple[float, float, float, float]  # (tokens, seconds, ar_tokens, ar_seconds) of one (prompt, repeat)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def paired_cells(runs: Iterable[dict], task: str, label: str, base: str = "ar") -> dict[str, dict[int, Cell]]:
    """``{prompt_id: {repeat: (tokens, seconds, base_tokens, base_seconds)}}`` for the (prompt, repeat) pairs that
    both ``label`` and ``base`` measured in ``task`` (a repeat missing on either side is left out, not guessed)."""
    mine: dict[tuple, dict] = {}
    other: dict[tuple, dict] = {}
    for r in runs:
        if r["task"] != task:
            continue
        if r["label"] == label:
            mine[(r["prompt_id"], r["repeat"])] = r
        if r["label"] == base:
            other[(r["prompt_id"], r["repeat"])] = r
    out: dict[str, dict[int, Cell]] = defaultdict(dict)
    for (pid, rep), a in mine.items():
        b = other.get((pid, rep))
        if b is not None and a["wall_s"] > 0 and b["wall_s"] > 0:
            out[pid][rep] = (float(a["new_tokens"]), float(a["wall_s"]), float(b["new_tokens"]), float(b["wall_s"]))
    return dict(out)


def _ratio(cells: list[Cell]) -> float | None:
    tok, sec = sum(c[0] for c in cells), sum(c[1] for c in cells)
    btok, bsec = sum(c[2] for c in cells), sum(c[3] for c in cells)
    if sec <= 0 or bsec <= 0 or btok <= 0:
        return None
    return (tok / sec) / (btok / bsec)


def prompt_speedup(cells: dict[int, Cell]) -> float | None:
    """One prompt's speedup: the median over its repeats of the repeat's paired throughput ratio."""
    ratios = [x for c in cells.values() if (x := _ratio([c])) is not None]
    return _median(ratios) if ratios else None


def repeat_speedups(cells: dict[str, dict[int, Cell]]) -> list[float]:
    """Per repeat index: the task's paired throughput ratio over the prompts measured in that repeat."""
    by_rep: dict[int, list[Cell]] = defaultdict(list)
    for reps in cells.values():
        for rep, c in reps.items():
            by_rep[rep].append(c)
    return [x for rep in sorted(by_rep) if (x := _ratio(by_rep[rep])) is not None]


def paired_task_speedup(cells: dict[str, dict[int, Cell]]) -> float | None:
    """The task speedup: the median over repeats of the repeats' paired throughput ratios."""
    xs = repeat_speedups(cells)
    return _median(xs) if xs else None


def two_level_bootstrap_ci(cells: dict[str, dict[int, Cell]], level: float = CI_LEVEL,
                           resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> list[float] | None:
    """Percentile interval of :func:`paired_task_speedup` under a two-level bootstrap (see the module docstring).
    None for fewer than 2 prompts (no spread over prompts can be estimated)."""
    prompts = [sorted(reps.items()) for reps in cells.values() if reps]
    if len(prompts) < 2:
        return None
    n_slots = max(len(p) for p in prompts)
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        pick = [prompts[rng.randrange(len(prompts))] for _ in prompts]
        slots: list[list[Cell]] = [[] for _ in range(n_slots)]
        for reps in pick:
            for s in range(n_slots):  # slot s of this prompt: one of its repeats, drawn with replacement
                slots[s].append(reps[rng.randrange(len(reps))][1])
        xs = [x for cs in slots if (x := _ratio(cs)) is not None]
        if xs:
            stats.append(_median(xs))
    return percentile_interval(stats, level)


def percentile_interval(stats: list[float], level: float = CI_LEVEL) -> list[float] | None:
    """``[lo, hi]``: the (1 - level) / 2 and (1 + level) / 2 order statistics of bootstrap replicates (None if none)."""
    if not stats:
        return None
    stats = sorted(stats)
    return [stats[int((1 - level) / 2 * (len(stats) - 1))], stats[int((1 + level) / 2 * (len(stats) - 1))]]


def repeat_spread(runs: Iterable[dict]) -> dict | None:
    """Run-to-run timing noise on identical work: over every (task, prompt, method) whose repeats produced the same
    number of tokens, the relative range (max - min) / median of the repeats' seconds; returns its median and 90th
    percentile and how many groups it covers (None when no prompt has 2 repeats)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["task"], r["prompt_id"], r["label"])].append(r)
    spreads = []
    for rs in groups.values():
        if len(rs) < 2 or len({r["new_tokens"] for r in rs}) != 1:
            continue
        secs = [r["wall_s"] for r in rs]
        med = _median(secs)
        if med > 0:
            spreads.append((max(secs) - min(secs)) / med)
    if not spreads:
        return None
    spreads.sort()
    return {"median": _median(spreads), "p90": spreads[int(0.9 * (len(spreads) - 1))], "groups": len(spreads),
            "what": "relative range (max - min) / median of a (prompt, method)'s repeat seconds, same token count"}
