"""Exercises of notebook 07 (benchmarks), on the committed measurements: K chosen from the measured verify curves
of the AMD EPYC and Intel Xeon runs, alpha pooled over runs, and the in-run cost model's prediction.  Ground truth:
:func:`specdec_lesson.theory.best_k`, :func:`specdec_lesson.bench.metrics.pooled_acceptance` and
:func:`specdec_lesson.sim.calibrate.predict_speedup`, on ``benchmarks/results/*.json``."""

from __future__ import annotations

import json

import torch

from ..theory import best_k
from ._core import Exercise, call, fail, passed, solve

__all__ = ["check_choose_k", "check_pooled_alpha", "check_predicted_speedup", "verify_curves", "EXERCISES"]

MACHINES = {"AMD EPYC": "verify_curve.json", "Intel Xeon": "verify_curve_intel.json"}


def _results(ex: str, name: str) -> dict:
    from ..bench.report import RESULTS_DIR

    path = RESULTS_DIR / name
    if not path.exists():
        fail(ex, f"{path} is missing: this exercise reads the repository's committed benchmark results (run it from "
                 "a clone of the repository, not an installed copy of the package)")
    return json.loads(path.read_text())


def verify_curves(ex: str = "7.1") -> dict[str, dict[int, float]]:
    """``{"<machine>, <form>": {n: ms}}``: T(n) of the default target on both machines, plain weights, pre-packed
    weights, and the fastest form per width (what the benchmark's dispatch runs)."""
    out = {}
    for machine, name in MACHINES.items():
        ms = _results(ex, name)["verify_curve_ms"]
        forms = {form: {int(n): float(t) for n, t in ms[form].items()} for form in ("plain", "prepacked")}
        forms["fastest per width"] = {n: min(forms["plain"][n], forms["prepacked"][n]) for n in forms["plain"]}
        out.update({f"{machine}, {form}": curve for form, curve in forms.items()})
    return out


def check_choose_k(fn) -> None:
    """``fn(alpha, c, curve_ms, k_max)`` -> the K in 1..k_max with the largest speedup E[tokens](alpha, K) / (K c +
    T(K+1) / T(1)) for a measured curve ``{n: ms}`` (ties: the smaller K); compared with ``theory.best_k`` on the
    six committed curves (two machines, three forms) for alpha in {0.5, 0.62, 0.8, 0.9} and c in {0.03, 0.05, 0.1}."""
    ex = "7.1"
    curves = verify_curves(ex)
    for name, curve in curves.items():
        k_max = max(curve) - 1
        for alpha in (0.5, 0.62, 0.8, 0.9):
            for c in (0.03, 0.05, 0.1):
                want = best_k(alpha, c, k_max=k_max, verify_ratio=lambda n, t=curve: t[n] / t[1])
                got = call(ex, fn, alpha, c, dict(curve), k_max, what=f"choose_k({alpha}, {c}, <{name}>, {k_max})")
                if got != want:
                    ideal = best_k(alpha, c, k_max=k_max)
                    hint = (" That is the best K for a free verify step (T(n) = T(1)): use the measured T(K + 1) / T(1)."
                            if got == ideal else " Verifying K drafts is one forward over K + 1 tokens: T(K + 1).")
                    fail(ex, f"{name}, alpha {alpha}, c {c}: expected K = {want}, got {got!r}.{hint}")
    picks = {m: best_k(0.7, 0.04, k_max=15, verify_ratio=lambda n, t=curves[f"{m}, fastest per width"]: t[n] / t[1])
             for m in MACHINES}
    passed(ex, "at alpha 0.7, c 0.04, the machines' own curves (fastest form per width) call for K = "
               + " and K = ".join(f"{k} on the {m}" for m, k in picks.items()) + ".")


def check_pooled_alpha(fn) -> None:
    """``fn(stats_list)`` -> alpha pooled over runs, from SpecStats counter dicts (``accepted``, ``rejections``,
    ``proposed``, ...); compared (1e-12) with ``bench.metrics.pooled_acceptance`` on the committed chain runs of
    ``bench_default_t0.json`` per task and on 20 random lists of runs of uneven length."""
    ex = "7.2"
    from ..bench.metrics import pooled_acceptance

    runs = _results(ex, "bench_default_t0.json")["runs"]
    groups = {}
    for r in runs:
        if r.get("method") == "chain" and r.get("stats") and "rejections" in r["stats"]:
            groups.setdefault(r["task"], []).append(r["stats"])
    g = torch.Generator().manual_seed(72)
    for i in range(20):
        acc = torch.randint(0, 200, (6,), generator=g).tolist()
        rej = [int(torch.randint(1, 3 + a // 2, (1,), generator=g)) for a in acc]
        groups[f"random list {i}"] = [{"accepted": a, "rejections": r, "proposed": 4 * (a + r), "row_steps": a + r,
                                       "emitted": 2 * a + r} for a, r in zip(acc, rej)]
    for name, stats in groups.items():
        want = pooled_acceptance(stats)["alpha"]
        got = call(ex, fn, [dict(s) for s in stats], what=f"pooled_alpha(<{len(stats)} runs: {name}>)")
        if not isinstance(got, (int, float)) or abs(got - want) > 1e-12:
            mean = sum(s["accepted"] / (s["accepted"] + s["rejections"]) for s in stats) / len(stats)
            hint = (" That is the mean of the runs' alphas: a short run would count as much as a long one. Pool the "
                    "counts: sum accepted / sum (accepted + rejections)." if isinstance(got, float) and
                    abs(got - mean) < 1e-12 else " alpha = accepted / (accepted + rejections), summed over the runs.")
            fail(ex, f"{name}: expected alpha {want:.6f}, got {got!r}.{hint}")
    code = groups.get("code", [])
    passed(ex, "pooled alpha equals the benchmark's on every list" + (
        f"; the committed code runs pool to {pooled_acceptance(code)['alpha']:.3f} over {len(code)} runs." if code else "."))


def check_predicted_speedup(fn) -> None:
    """``fn(curve, t_draft, overhead, t_baseline, k, tau)`` -> the cost model's speedup tau * t_baseline / (K t_draft
    + T(K+1) + overhead), with ``curve`` T(n) in seconds; compared (1e-12) with ``sim.calibrate.predict_speedup`` on
    the committed calibration (K = 1..8, tau from 1 to K + 1) and on two synthetic profiles."""
    ex = "7.3"
    from ..sim.calibrate import Profile, predict_speedup

    rec = _results(ex, "calibration.json")
    profiles = [Profile.from_dict(rec["profile"]),
                Profile({n: 0.01 * (1 + 0.05 * n) for n in range(1, 17)}, 0.001, 0.7, 0.002, 0.011),
                Profile({n: 0.03 + 0.001 * n * n for n in range(1, 17)}, 0.004, 0.6, 0.0, 0.031)]
    for i, prof in enumerate(profiles):
        for k in range(1, 9):
            for tau in (1.0, 1 + k / 2, k + 1.0):
                want = predict_speedup(prof, k, tokens_per_step=tau)
                base = prof.t_baseline if prof.t_baseline is not None else prof.T(1)
                got = call(ex, fn, dict(prof.verify_curve), prof.t_draft, prof.overhead, base, k, tau,
                           what=f"predicted_speedup(<profile {i}>, k={k}, tau={tau})")
                if not isinstance(got, (int, float)) or abs(got - want) > 1e-12 * max(1.0, want):
                    fail(ex, f"profile {i}, K = {k}, tau = {tau}: expected {want:.6f}, got {got!r}. One step: K draft "
                             "forwards, one verify forward over K + 1 tokens, the step's overhead; it emits tau tokens, "
                             "which plain decoding would take tau x t_baseline to make.")
    p, k = profiles[0], rec["k"]
    tau = p.notes.get("tau", 1 + k / 2)
    passed(ex, f"with its own costs the committed calibration run (K = {k}, tau {tau:.2f}) predicts "
               f"{predict_speedup(p, k, tokens_per_step=tau):.2f}x (notebook 06 sets predictions against measurements).")


_P71 = """`benchmarks/verify_curve.py` measured the default target's T(n) on two machines (`verify_curve.json`, an AMD
EPYC, and `verify_curve_intel.json`, an Intel Xeon, in `benchmarks/results/`): plain weights, pre-packed weights,
and the faster of the two per width. Write `choose_k(alpha, c, curve_ms, k_max)`: the K in 1..k_max with the
largest predicted speedup E[tokens](alpha, K) / (K c + T(K+1) / T(1)) for a curve `{n: milliseconds}` (ties: the
smaller K). Then look at the K each machine gets: why do they differ?"""

_S71 = '''from specdec_lesson.exercises import check_choose_k, verify_curves
from specdec_lesson.theory import expected_tokens


def choose_k(alpha, c, curve_ms, k_max):
    """The best K for a measured verify curve {n: ms}."""
    raise NotImplementedError


check_choose_k(choose_k)
for name, curve in verify_curves().items():
    print(f"{name:32s} T(5)/T(1) = {curve[5] / curve[1]:.2f}  best K at alpha 0.7, c 0.04: {choose_k(0.7, 0.04, curve, 15)}")
'''

_A71 = solve(_S71, '''
    def s(k):
        return expected_tokens(alpha, k) / (k * c + curve_ms[k + 1] / curve_ms[1])

    return max(range(1, k_max + 1), key=lambda k: (s(k), -k))
''')

_P72 = """Each benchmark run stores its counters (`accepted`, `rejections`, `proposed`, ...). Write
`pooled_alpha(stats_list)`: the per-token acceptance alpha of a whole task, pooled over its runs. The check compares
with the benchmark's own pooling on the committed chain runs and on random lists."""

_S72 = '''from specdec_lesson.exercises import check_pooled_alpha


def pooled_alpha(stats_list):
    """alpha over several runs' counters."""
    raise NotImplementedError


check_pooled_alpha(pooled_alpha)
'''

_A72 = solve(_S72, '''
    accepted = sum(s["accepted"] for s in stats_list)
    return accepted / (accepted + sum(s["rejections"] for s in stats_list))
''')

_P73 = """Notebooks 06 and 07 predict a run's speedup from its own costs. Write `predicted_speedup(curve, t_draft,
overhead, t_baseline, k, tau)`: T(n) in seconds as `curve[n]`, seconds per draft forward, per-step overhead, seconds
per plain decoding token, K, and tau (tokens emitted per step). The check compares with the simulator's
`predict_speedup` on the committed calibration and two synthetic profiles."""

_S73 = '''from specdec_lesson.exercises import check_predicted_speedup


def predicted_speedup(curve, t_draft, overhead, t_baseline, k, tau):
    """Speedup over plain decoding predicted from a run's costs."""
    raise NotImplementedError


check_predicted_speedup(predicted_speedup)
'''

_A73 = solve(_S73, '''
    return tau * t_baseline / (k * t_draft + curve[k + 1] + overhead)
''')

EXERCISES = [
    Exercise("7.1", "choose K from a measured verify curve", check_choose_k, _P71, _S71, _A71),
    Exercise("7.2", "alpha pooled over runs", check_pooled_alpha, _P72, _S72, _A72),
    Exercise("7.3", "the in-run cost model's prediction", check_predicted_speedup, _P73, _S73, _A73),
]
