"""Paired benchmark statistics (bench.paired): tokens with their own seconds, method with ar of the same repeat,
and an interval whose coverage is measured."""

from __future__ import annotations

import math
import random

import pytest

from specdec_lesson.bench.metrics import task_table
from specdec_lesson.bench.paired import (
    paired_cells,
    paired_task_speedup,
    prompt_speedup,
    repeat_spread,
    two_level_bootstrap_ci,
)


def _run(task, pid, label, rep, wall, tokens):
    return {"task": task, "prompt_id": pid, "label": label, "method": label.split("-k")[0], "k": None, "repeat": rep,
            "wall_s": wall, "new_tokens": tokens}


def test_sampled_repeats_are_paired_not_mixed():
    """At T > 0 the repeats differ in length.  The median seconds and the median token count of a prompt can come
    from different repeats; the paired statistic divides each repeat's tokens by that repeat's own seconds."""
    runs = [
        *[_run("code", "p", "ar", r, 6.0, 96) for r in range(3)],  # ar: 96 tokens in 6 s every repeat (16 tok/s)
        # three different samples: 20 tokens in 1 s, 96 in 4 s, 60 in 5 s
        _run("code", "p", "hybrid-k4", 0, 1.0, 20), _run("code", "p", "hybrid-k4", 1, 4.0, 96),
        _run("code", "p", "hybrid-k4", 2, 5.0, 60),
    ]
    row = next(r for r in task_table(runs) if r["label"] == "hybrid-k4")
    assert row["speedup_repeats"] == pytest.approx([20 / 16, 24 / 16, 12 / 16])
    assert row["speedup"] == pytest.approx(1.25)
    unpaired = (60 / 4.0) / 16  # median tokens (60, repeat 2) over median seconds (4 s, repeat 1)
    assert abs(row["speedup"] - unpaired) > 0.3


def test_prompt_speedup_pairs_each_repeat_with_ar_of_the_same_repeat():
    runs = [_run("m", "a", "ar", 0, 1.0, 10), _run("m", "a", "ar", 1, 3.0, 10),
            _run("m", "a", "x", 0, 0.5, 10), _run("m", "a", "x", 1, 1.5, 10)]
    cells = paired_cells(runs, "m", "x")
    assert prompt_speedup(cells["a"]) == pytest.approx(2.0)  # both repeats 2x; an unpaired median would say 2.0 too
    runs[3]["wall_s"] = 3.0  # repeat 1 of x is as slow as repeat 1 of ar: ratios 2.0 and 1.0
    assert prompt_speedup(paired_cells(runs, "m", "x")["a"]) == pytest.approx(1.5)


def test_missing_repeat_is_left_out_not_guessed():
    runs = [_run("m", "a", "ar", 0, 1.0, 10), _run("m", "a", "x", 0, 0.5, 10), _run("m", "a", "x", 1, 0.1, 10)]
    assert paired_cells(runs, "m", "x") == {"a": {0: (10.0, 0.5, 10.0, 1.0)}}


def test_interval_needs_two_prompts_and_holds_the_estimate():
    cells = {"a": {0: (10, 1.0, 10, 2.0), 1: (10, 1.1, 10, 2.1)}}
    assert two_level_bootstrap_ci(cells) is None
    cells["b"] = {0: (10, 1.0, 10, 1.5), 1: (10, 0.9, 10, 1.6)}
    lo, hi = two_level_bootstrap_ci(cells)
    assert lo <= paired_task_speedup(cells) <= hi and lo < hi


def _sim_cells(rng, n, true_log, sp=0.15, sr=0.08):
    cells = {}
    for p in range(n):
        speed = math.exp(true_log + rng.gauss(0, sp))
        cells[str(p)] = {r: (96, 96 * 0.06 / speed * math.exp(rng.gauss(0, sr)), 96, 96 * 0.06 * math.exp(rng.gauss(0, sr)))
                         for r in range(3)}
    return cells


def test_interval_coverage_near_nominal_with_12_prompts():
    """80 simulated runs of 12 prompts x 3 repeats (equal lengths, so the truth, the pooled ratio of the population,
    is exp(mean log speedup - sd^2 / 2)); nominal 95%.  The coverage count is Binomial(80, c): a true c of 0.93
    (what benchmarks/interval_coverage.py measured at this n) passes (>= 70) with probability 0.98, and an interval
    that covers only 80% fails with probability 0.94 (an 80% interval built the same way scored 66 of 80 here).
    A fixed seed keeps the test deterministic."""
    rng = random.Random(3)
    sp, true_log = 0.15, math.log(1.6)
    truth = math.exp(true_log) / math.exp(sp * sp / 2) * 1.0  # pooled ratio with equal lengths: 1 / E[1/speed]
    hits = 0
    for t in range(80):
        lo, hi = two_level_bootstrap_ci(_sim_cells(rng, 12, true_log, sp), resamples=400, seed=t)
        hits += lo <= truth <= hi
    assert hits >= 70, hits


def test_repeat_spread_uses_identical_work_only():
    runs = [_run("m", "a", "ar", r, w, 10) for r, w in enumerate([1.0, 1.2, 1.1])]
    runs += [_run("m", "a", "x", 0, 1.0, 10), _run("m", "a", "x", 1, 5.0, 12)]  # different lengths: skipped
    s = repeat_spread(runs)
    assert s["groups"] == 1 and s["median"] == pytest.approx(0.2 / 1.1)
    assert repeat_spread(runs[3:]) is None
