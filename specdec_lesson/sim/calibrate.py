"""Calibrating the simulator on measurements of a real pair, and predicting the speedup of a real run.

A :class:`Profile` holds what the prediction needs, all measured on the machine that runs the engine:

* ``verify_curve``: T(n), seconds of one target forward over n new tokens (n = 1..16) after a KV cache,
  from :func:`specdec_lesson.profiling.measure_verify_curve`;
* ``t_draft``: seconds per draft forward (one drafted token for all rows);
* ``alpha``: the per-token acceptance probability (Leviathan's alpha), the engine's
  :attr:`SpecStats.alpha <specdec_lesson.stats.SpecStats.alpha>` = accepted / (accepted + rejections): the
  parameter of the i.i.d. closed form below (``SpecStats.utilisation``, accepted / proposed, is not);
* ``overhead``: seconds per speculative step spent outside the draft and verify forwards (sampling,
  verification arithmetic, cache bookkeeping, Python);
* ``t_baseline`` (optional): seconds per token of plain decoding; T(1) when absent.

Prediction (chain, K drafts)::

    predicted = E[tokens](alpha, K) * t_baseline / (K * t_draft + T(K + 1) + overhead)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..stats import SpecStats
from ..theory import expected_tokens
from ..validate import as_int, as_prob, as_real

__all__ = ["Profile", "profile_from_stats", "predict_speedup", "measure_profile", "save_calibration", "load_calibration",
           "default_calibration_path", "tune_k"]


def _width(n) -> int:
    """A verify-curve key: a token count n >= 1 (JSON files store it as a string, "4")."""
    if isinstance(n, str) and n.strip().isdigit() or isinstance(n, float) and n.is_integer():
        n = int(n)
    return as_int(n, "a verify_curve key (tokens per forward)", lo=1)


@dataclass
class Profile:
    verify_curve: dict[int, float]
    t_draft: float
    alpha: float
    overhead: float = 0.0
    t_baseline: float | None = None
    notes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        curve = {_width(n): as_real(t, f"verify_curve[{n!r}]", lo=0.0, lo_open=True) for n, t in dict(self.verify_curve).items()}
        if 1 not in curve:
            raise ValueError(f"verify_curve needs T(1) and positive times, got {self.verify_curve!r}")
        self.verify_curve = dict(sorted(curve.items()))
        self.alpha = as_prob(self.alpha, "alpha")
        self.t_draft, self.overhead = as_real(self.t_draft, "t_draft", lo=0.0), as_real(self.overhead, "overhead", lo=0.0)
        if self.t_baseline is not None:
            self.t_baseline = as_real(self.t_baseline, "t_baseline", lo=0.0, lo_open=True)

    def T(self, n: int) -> float:
        """T(n), linearly interpolated between measured n (and extrapolated from the last two beyond)."""
        ns = list(self.verify_curve)
        if n in self.verify_curve:
            return self.verify_curve[n]
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        lo = max([m for m in ns if m < n], default=ns[0])
        hi = min([m for m in ns if m > n], default=None)
        if hi is None:
            if len(ns) == 1:
                return self.verify_curve[lo]
            lo, hi = ns[-2], ns[-1]
        t_lo, t_hi = self.verify_curve[lo], self.verify_curve[hi]
        return t_lo + (t_hi - t_lo) * (n - lo) / (hi - lo)

    @property
    def c(self) -> float:
        return self.t_draft / self.T(1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verify_curve"] = {str(n): t for n, t in self.verify_curve.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Profile:
        return cls(**{k: d[k] for k in ("verify_curve", "t_draft", "alpha", "overhead", "t_baseline", "notes") if k in d})


def predict_speedup(profile: Profile, k: int, alpha: float | None = None, tokens_per_step: float | None = None) -> float:
    """E[tokens] * t_baseline / (K * t_draft + T(K + 1) + overhead).

    E[tokens] is the closed form (1 - alpha^(K+1)) / (1 - alpha), which assumes every draft is
    accepted independently with the same probability alpha (the per-token ``SpecStats.alpha``; check
    the assumption with :func:`specdec_lesson.stats.acceptance_independence`); or ``tokens_per_step`` when given:
    the mean accepted length + 1 (tau) of the run's acceptance histogram, which keeps the
    correlation between positions (a draft that is right tends to stay right) that the
    i.i.d. closed form ignores."""
    k = as_int(k, "k", lo=1)
    a = profile.alpha if alpha is None else as_prob(alpha, "alpha")
    if tokens_per_step is not None:
        tokens_per_step = as_real(tokens_per_step, "tokens_per_step", lo=1.0)
    base = profile.t_baseline if profile.t_baseline is not None else profile.T(1)
    e = expected_tokens(a, k) if tokens_per_step is None else float(tokens_per_step)
    return e * base / (k * profile.t_draft + profile.T(k + 1) + profile.overhead)


def profile_from_stats(stats: SpecStats, verify_curve: Mapping[int, float], *, baseline: SpecStats | None = None,
                       t_draft: float | None = None, batch: int = 1, steps: int | None = None) -> Profile:
    """A profile from one speculative run's counters (``speculative_generate``) plus a measured verify curve.

    * alpha = ``stats.alpha``, the per-token acceptance accepted / (accepted + rejections) that the i.i.d. closed
      form (1 - alpha^(K+1)) / (1 - alpha) takes (not ``stats.utilisation`` = accepted / proposed);
    * t_draft = ``stats.time_draft / (stats.proposed / batch)``: seconds per decode-time draft forward
      (``proposed`` counts drafts per row; the draft's prompt prefill is in neither number), unless given;
    * overhead = ``stats.time_other / steps``, steps = ``stats.row_steps / batch`` unless given;
    * t_baseline = (time_verify + time_other) of a plain run (``autoregressive_generate``'s stats, ``baseline``)
      per emitted token of a row, times ``batch``: seconds per plain decode step; else None (T(1) is used).

    ``batch`` is the number of rows; the per-step figures are exact when every row stays active until the end
    (always for batch 1); otherwise pass ``steps`` / ``t_draft`` explicitly.
    """
    if stats.proposed == 0 or stats.row_steps == 0:
        raise ValueError("stats has no proposed drafts: pass the SpecStats of a speculative run")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    n_steps = steps if steps is not None else stats.row_steps / batch
    if n_steps <= 0:
        raise ValueError(f"steps must be > 0, got {n_steps}")
    if t_draft is None:
        t_draft = stats.time_draft / (stats.proposed / batch)
    t_base = None
    if baseline is not None:
        decode_time = baseline.time_draft + baseline.time_verify + baseline.time_other
        if baseline.emitted <= 0 or decode_time <= 0:
            raise ValueError("baseline stats hold no decode time or emitted tokens")
        t_base = decode_time * batch / baseline.emitted
    notes = {"k": stats.k, "steps": n_steps, "emitted": stats.emitted, "tau": stats.tau, "utilisation": stats.utilisation,
             "batch": batch, "time_verify_per_step": stats.time_verify / n_steps}
    return Profile(dict(verify_curve), float(t_draft), float(stats.alpha), stats.time_other / n_steps, t_base, notes)


def measure_profile(target, draft_seconds_per_token: float, alpha: float, *, n_max: int = 16, context: int = 128,
                    repeats: int = 5, ns=None, overhead: float = 0.0) -> Profile:
    """Measure the target's verify curve live (``profiling.measure_verify_curve``) and wrap it in a profile."""
    from ..profiling import measure_verify_curve  # written by the profiling module's owner

    kw = {"ns": ns} if ns is not None else {}
    curve = measure_verify_curve(target, n_max=n_max, context=context, repeats=repeats, **kw)
    return Profile(curve, draft_seconds_per_token, alpha, overhead, notes={"context": context, "repeats": repeats})


def default_calibration_path() -> Path:
    """``benchmarks/results/calibration.json`` of the repository (found from the package, not the cwd)."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "calibration.json"


def save_calibration(path: str | Path, profile: Profile, k: int, measured_speedup: float | None = None, **extra) -> dict:
    """Write ``{"profile": ..., "k": K, "predicted_speedup": ..., "measured_speedup": ..., **extra}`` as JSON."""
    record = {"profile": profile.to_dict(), "k": int(k), "predicted_speedup": predict_speedup(profile, k),
              "measured_speedup": measured_speedup, **extra}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2) + "\n")
    return record


def load_calibration(path: str | Path | None = None) -> dict | None:
    """The record written by :func:`save_calibration` (``profile`` rebuilt as a :class:`Profile`), or None."""
    p = Path(path) if path is not None else default_calibration_path()
    if not p.exists():
        return None
    record = json.loads(p.read_text())
    record["profile"] = Profile.from_dict(record["profile"])
    return record


def tune_k(target, draft, ids, probe_tokens: int = 32, probe_k: int = 4) -> tuple[int, str]:
    """``(K, why)``: the K that this cost model predicts fastest on this machine for ``draft`` (a Drafter or a causal
    LM) alone.  T(n) comes from the load-time dispatch probe (``target.dispatch_profile``, ``profiling.tune_dispatch``)
    or a short measurement; the draft's seconds per drafted token and alpha from one ``probe_tokens``-token run on
    ``ids`` [1, L].  ``why`` names the numbers the choice rests on (a few seconds of probing in all)."""
    from ..speculative import speculative_generate

    d = getattr(target, "dispatch_profile", None)
    if d and d.get("best_ms"):
        curve = {int(n): ms / 1e3 for n, ms in d["best_ms"].items()}
    else:
        from ..lean.path import engine_verify_curve

        curve = engine_verify_curve(target, list(range(1, 9)), context=128, repeats=3)
    speculative_generate(target, draft, ids, 8, k=probe_k)  # warm-up
    _, st = speculative_generate(target, draft, ids, probe_tokens, k=probe_k)
    if st.proposed == 0 or not st.time_draft > 0:
        return getattr(draft, "default_k", probe_k), "the probe drafted nothing, so the draft's default"
    alpha = st.alpha if st.alpha == st.alpha else 0.5  # nan when the probe saw no acceptance test
    prof = Profile(curve, st.time_draft / st.proposed, min(max(alpha, 0.0), 1.0))
    ks = [k for k in range(1, max(curve)) if k + 1 <= max(curve)]
    pred = {k: predict_speedup(prof, k) for k in ks}
    k = max(pred, key=lambda j: (pred[j], -j))
    return k, (f"T({k + 1})/T(1) = {prof.T(k + 1) / prof.T(1):.2f}, c = {prof.c:.3f}, alpha = {prof.alpha:.2f} -> "
               f"predicted {pred[k]:.2f}x for the draft alone (K = 1..{max(ks)}: "
               + " ".join(f"{pred[j]:.2f}" for j in ks) + ")")
