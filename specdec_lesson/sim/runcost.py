"""The cost model calibrated on a benchmark run's own counters, not on a separate probe (issue 27).

A separate probe of the target (``sim.calibrate``) measures T(n) on an idle, warm forward; inside a run the same
forward costs more (its cache is longer and colder, the draft shares the cores).  So here every cost comes from the
engine's counters of the runs themselves (``SpecStats`` as stored in a ``specdec-bench/1`` results file, plain dicts):

* ``t_plain``: seconds per token of plain decoding, (time_verify + time_other) / row_steps of the ``ar`` runs; its
  time_verify / row_steps is T(1);
* T(n): the verify forward over n tokens, time_verify / row_steps of the chain runs at K (n = K + 1), with a
  monotone (non-decreasing, isotonic) fit over the n observed, interpolated linearly between them and extended by
  the last two fitted points' slope beyond;
* the draft's seconds per step, time_draft / row_steps of the chain runs, fitted as a + b (K - 1) by least squares
  when the runs hold two K or more (``draft_fit``); at one K it is that K's mean;
* the overhead per step (time_other / row_steps), the prefill per prompt token and the prefill's share of the wall
  time, per method label.

Prediction of a run (or of a prompt's pooled repeats) of label L at K, whose acceptance counters are known::

    step    = draft(K) + T(K + 1) + overhead_L                      (chain)
    speedup = (P_ar + N t_plain) / (P_L + (N / tau) step)           (P: prefill = seconds per prompt token x length)

tau = emitted / row_steps is the run's measured tokens per step (the acceptance model's error left out);
``predicted_iid`` replaces it with theory.expected_tokens(alpha, K), alpha = accepted / (accepted + rejections).
Hybrid labels (lookup proposals of any length, the draft only when the lookup misses): the verify step is the mean
of T(m + 1) over the run's ``verify_hist`` (m proposed tokens per step), the draft's cost is its seconds per draft
forward (from the label's calibration runs) times the run's draft_forwards / row_steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..theory import expected_tokens, speedup
from ..validate import as_int, as_real

__all__ = ["isotonic_fit", "linear_fit", "RunCosts", "in_run_costs", "pool_stats", "step_cost", "predict", "alpha_for_speedup",
           "TIME_FIELDS"]

TIME_FIELDS = ("time_prefill", "time_draft", "time_verify", "time_other")
_COUNTS = ("accepted", "rejections", "proposed", "emitted", "row_steps", "draft_forwards")


def isotonic_fit(ys: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to ``ys`` in weighted least squares (pool adjacent violators)."""
    w = [1.0] * len(ys) if weights is None else [as_real(x, "weight", lo=0.0, lo_open=True) for x in weights]
    if len(w) != len(ys):
        raise ValueError(f"isotonic_fit needs one weight per value, got {len(w)} weights for {len(ys)} values")
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, wi in zip(ys, w, strict=True):
        blocks.append([float(y), wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


def linear_fit(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, float]:
    """``(a, b)`` minimising sum w (y - a - b x)^2; needs two distinct x."""
    w = [1.0] * len(xs) if weights is None else [float(x) for x in weights]
    if not len(xs) == len(ys) == len(w):
        raise ValueError(f"linear_fit needs as many x, y and weights, got {len(xs)}, {len(ys)}, {len(w)}")
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs, strict=True)) / sw
    my = sum(wi * y for wi, y in zip(w, ys, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs, strict=True))
    if sxx <= 0:
        raise ValueError("linear_fit needs at least two distinct x values (runs at two K or more)")
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys, strict=True)) / sxx
    return my - b * mx, b


def _key(r: Mapping) -> str:
    return r["label"]


def pool_stats(runs: Iterable[Mapping]) -> dict:
    """The runs' counters and times summed (``verify_hist`` merged), plus ``runs``, ``new_tokens``, ``prompt_tokens``."""
    out: dict = defaultdict(float)
    hist: dict[int, list[float]] = {}
    for r in runs:
        s = r["stats"]
        for f in _COUNTS + TIME_FIELDS:
            out[f] += s[f]
        out["runs"] += 1
        out["new_tokens"] += r["new_tokens"]
        out["prompt_tokens"] += r["prompt_tokens"]
        out["wall_s"] += r["wall_s"]
        for m, counts in (s.get("verify_hist") or {}).items():
            acc = hist.setdefault(int(m), [0.0] * len(counts))
            for i, c in enumerate(counts):
                acc[i] += c
    out = dict(out)
    out["verify_hist"] = hist
    return out


@dataclass
class RunCosts:
    """In-run costs of one machine (seconds).  ``verify_points`` {n: (time_verify / row_steps, row_steps)} is raw,
    ``verify_fit`` {n: T(n)} its isotonic fit; ``draft`` {K: seconds per step}; ``draft_fit`` (a, b) or None."""

    t_plain: float
    verify_points: dict[int, tuple[float, float]]
    verify_fit: dict[int, float]
    draft: dict[int, float]
    draft_fit: tuple[float, float] | None
    draft_per_forward: dict[str, float] = field(default_factory=dict)
    overhead: dict[str, float] = field(default_factory=dict)
    prefill_per_token: dict[str, float] = field(default_factory=dict)
    prefill_share: dict[str, float] = field(default_factory=dict)

    def T(self, n: float) -> float:
        """T(n) from the monotone fit: linear between fitted n, the last two points' slope beyond either end."""
        ns = sorted(self.verify_fit)
        if n in self.verify_fit:
            return self.verify_fit[n]
        if len(ns) == 1:
            return self.verify_fit[ns[0]]
        lo = max([m for m in ns if m < n], default=ns[0])
        hi = min([m for m in ns if m > n], default=None)
        if hi is None:
            lo, hi = ns[-2], ns[-1]
        elif lo >= hi:
            lo, hi = ns[0], ns[1]
        t_lo, t_hi = self.verify_fit[lo], self.verify_fit[hi]
        return t_lo + (t_hi - t_lo) * (n - lo) / (hi - lo)

    def draft_cost(self, k: int) -> float:
        """Seconds of drafting per step at K: a + b (K - 1) when fitted, else the measured K's mean."""
        k = as_int(k, "k", lo=1)
        if self.draft_fit is not None:
            return self.draft_fit[0] + self.draft_fit[1] * (k - 1)
        if k not in self.draft:
            raise ValueError(f"no chain runs at K = {k} and no draft fit (runs at one K only: {sorted(self.draft)})")
        return self.draft[k]

    def to_dict(self) -> dict:
        return {"t_plain": self.t_plain, "T1": self.verify_fit.get(1),
                "verify_points": {str(n): {"T": t, "steps": w} for n, (t, w) in sorted(self.verify_points.items())},
                "verify_fit": {str(n): t for n, t in sorted(self.verify_fit.items())},
                "verify_ratio_fit": {str(n): t / self.t_plain for n, t in sorted(self.verify_fit.items())},
                "draft_per_step": {str(k): d for k, d in sorted(self.draft.items())},
                "draft_fit": None if self.draft_fit is None else {"a": self.draft_fit[0], "b": self.draft_fit[1]},
                "draft_per_forward": self.draft_per_forward, "overhead_per_step": self.overhead,
                "prefill_per_prompt_token": self.prefill_per_token, "prefill_share_of_wall": self.prefill_share}


def _engine_runs(runs: Iterable[Mapping], exclude: Iterable[tuple[str, str]] = ()) -> list[Mapping]:
    skip = set(exclude)
    return [r for r in runs if r.get("stats") and r["stats"].get("row_steps", 0) > 0
            and (r["task"], r["prompt_id"]) not in skip]


def in_run_costs(runs: Iterable[Mapping], exclude: Iterable[tuple[str, str]] = ()) -> RunCosts:
    """The costs of one machine from its runs (``results["runs"]``), leaving out the (task, prompt_id) in ``exclude``."""
    by_label: dict[str, list[Mapping]] = defaultdict(list)
    for r in _engine_runs(runs, exclude):
        by_label[_key(r)].append(r)
    if "ar" not in by_label:
        raise ValueError("the runs hold no 'ar' run with stats: the plain decode step needs one (bench --methods ar,...)")
    pooled = {lab: pool_stats(rs) for lab, rs in by_label.items()}
    ar = pooled["ar"]
    t_plain = (ar["time_verify"] + ar["time_other"]) / ar["row_steps"]
    points = {1: (ar["time_verify"] / ar["row_steps"], ar["row_steps"])}
    chain: dict[int, dict] = {}
    for lab, rs in by_label.items():
        if rs[0]["method"] == "chain":
            chain[int(rs[0]["k"])] = pooled[lab]
    for k, p in chain.items():
        points[k + 1] = (p["time_verify"] / p["row_steps"], p["row_steps"])
    ns = sorted(points)
    fit = isotonic_fit([points[n][0] for n in ns], [points[n][1] for n in ns])
    draft = {k: p["time_draft"] / p["row_steps"] for k, p in chain.items()}
    draft_fit = None
    if len(chain) >= 2:  # per run: x = K - 1, y = time_draft / row_steps, weight row_steps
        crs = [r for rs in by_label.values() if rs[0]["method"] == "chain" for r in rs]
        draft_fit = linear_fit([r["k"] - 1 for r in crs], [r["stats"]["time_draft"] / r["stats"]["row_steps"] for r in crs],
                               [r["stats"]["row_steps"] for r in crs])
    costs = RunCosts(t_plain, points, dict(zip(ns, fit, strict=True)), dict(sorted(draft.items())), draft_fit)
    for lab, p in sorted(pooled.items()):
        costs.overhead[lab] = p["time_other"] / p["row_steps"]
        costs.prefill_per_token[lab] = p["time_prefill"] / p["prompt_tokens"]
        costs.prefill_share[lab] = p["time_prefill"] / p["wall_s"]
        if p["draft_forwards"] > 0:
            costs.draft_per_forward[lab] = p["time_draft"] / p["draft_forwards"]
    return costs


def step_cost(costs: RunCosts, label: str, method: str, k: int, pooled: Mapping | None = None) -> float:
    """Seconds of one speculative step of ``label``: chain from K alone; other methods from the run's proposal
    lengths (``verify_hist``) and draft forwards per step (``pooled``, see :func:`pool_stats`)."""
    if label not in costs.overhead:
        raise ValueError(f"no calibration runs of {label!r}: calibrate on runs that include it")
    if method == "chain":
        return costs.draft_cost(k) + costs.T(k + 1) + costs.overhead[label]
    if pooled is None or not pooled["verify_hist"]:
        raise ValueError(f"{label!r} is not a chain: its cost needs the run's verify_hist (pass pooled=pool_stats(runs))")
    steps = sum(sum(c) for c in pooled["verify_hist"].values())
    verify = sum(sum(c) * costs.T(m + 1) for m, c in pooled["verify_hist"].items()) / steps
    draft = costs.draft_per_forward.get(label, 0.0) * pooled["draft_forwards"] / pooled["row_steps"]
    return draft + verify + costs.overhead[label]


def predict(costs: RunCosts, runs: Sequence[Mapping], ar_runs: Sequence[Mapping]) -> dict:
    """Predicted speedup of ``runs`` (one label, e.g. one prompt's repeats) over ``ar_runs`` (the same prompt's
    ``ar``) from ``costs`` and the runs' acceptance counters only (none of their timings):
    ``predicted`` from the measured tokens per step tau, ``predicted_iid`` (chain) from the i.i.d. closed form at
    alpha, each with the prefill counted on both sides, and ``predicted_decode_only`` (no prefill: tau t_plain / step)."""
    if not runs or not ar_runs:
        raise ValueError("predict needs the method's runs and the same prompt's ar runs")
    label, method, k = runs[0]["label"], runs[0]["method"], int(runs[0]["k"])
    p, a = pool_stats(runs), pool_stats(ar_runs)
    step = step_cost(costs, label, method, k, p)
    tau = p["emitted"] / p["row_steps"]
    n_tok, n_ar = p["new_tokens"] / p["runs"], a["new_tokens"] / a["runs"]
    prompt = p["prompt_tokens"] / p["runs"]
    wall_ar = costs.prefill_per_token["ar"] * prompt + n_ar * costs.t_plain
    pre = costs.prefill_per_token[label] * prompt

    def with_prefill(tokens_per_step: float) -> float:
        return (n_tok / (pre + n_tok / tokens_per_step * step)) / (n_ar / wall_ar)

    out = {"label": label, "k": k, "tokens_per_step": tau, "step_s": step, "predicted": with_prefill(tau),
           "predicted_decode_only": tau * costs.t_plain / step, "alpha": None, "predicted_iid": None}
    if method == "chain" and p["accepted"] + p["rejections"] > 0:
        alpha = p["accepted"] / (p["accepted"] + p["rejections"])
        out["alpha"], out["predicted_iid"] = alpha, with_prefill(expected_tokens(alpha, k))
    return out


def alpha_for_speedup(target: float, costs: RunCosts, ks: Iterable[int], label_of=lambda k: f"chain-k{k}",
                      tol: float = 1e-6) -> dict:
    """The smallest alpha whose decode-only speedup theory.speedup(alpha, K, c_K, r_K) reaches ``target`` at some K
    in ``ks``, with c_K = draft(K) / (K t_plain) and r_K = (T(K + 1) + overhead) / t_plain (overhead: the label's
    when calibrated, else the mean over the chain labels).  Returns {"alpha", "k", "per_k": {K: alpha}}."""
    target = as_real(target, "target speedup", lo=1.0, lo_open=True)
    chain_o = [o for lab, o in costs.overhead.items() if lab.startswith("chain")]
    o_mean = sum(chain_o) / len(chain_o) if chain_o else 0.0
    per_k: dict[int, float | None] = {}
    for k in ks:
        c = costs.draft_cost(k) / (k * costs.t_plain)
        r = (costs.T(k + 1) + costs.overhead.get(label_of(k), o_mean)) / costs.t_plain
        if speedup(1.0, k, c, r) < target:
            per_k[k] = None  # unreachable even at alpha = 1
            continue
        lo, hi = 0.0, 1.0
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if speedup(mid, k, c, r) >= target else (mid, hi)
        per_k[k] = hi
    ok = {k: a for k, a in per_k.items() if a is not None}
    best = min(ok, key=lambda k: (ok[k], k)) if ok else None
    return {"target": target, "alpha": ok.get(best), "k": best, "per_k": per_k}
