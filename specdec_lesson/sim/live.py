"""Predict, then measure: the cost model's speedup beside a measured one, on this machine (notebook 06's lab).

* :func:`predicted_speedups` - S(K) = E[tokens | K] x T(1) / cost(K) from measured step costs
  (:class:`~specdec_lesson.drafters.adaptive_policy.StepCosts`, made by
  :func:`~specdec_lesson.drafters.adaptive.measure_step_costs`) and an alpha;
* :func:`paired_speedup` - a measured speedup made the way the benchmark makes it: for each repeat, every prompt
  decoded plainly and speculatively one after the other (interleaved), each run's tokens divided by its own
  seconds; the speedup is the median over repeats of (speculative tokens/s) / (plain tokens/s) pooled over the
  prompts, and alpha is pooled from the runs' counters.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from ..drafters.adaptive_policy import StepCosts, expected_tokens_of

__all__ = ["predicted_speedups", "paired_speedup"]


def predicted_speedups(costs: StepCosts, alpha: float, ks: Sequence[int]) -> dict[int, float]:
    """``{K: predicted speedup over plain decoding}`` at per-token acceptance ``alpha`` (the same at every depth);
    K = 0 is plain decoding (1.0)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    return {k: expected_tokens_of([alpha] * k) * costs.T(1) / costs.step(k) for k in ks}


def paired_speedup(target, make_drafter: Callable[[], object], prompts: Sequence[Sequence[int]], k: int,
                   max_new_tokens: int, *, repeats: int = 2, batch: int = 1, temperature: float = 0.0,
                   seed: int = 0) -> dict:
    """Measure speculative against plain decoding of ``prompts`` (token id lists), ``repeats`` interleaved rounds.
    ``make_drafter()`` builds a fresh drafter per run; ``batch`` > 1 decodes each prompt as ``batch`` identical
    rows (a batch of requests).  Returns ``{"speedup", "per_repeat", "alpha", "tau", "plain_tok_s", "spec_tok_s"}``."""
    from ..speculative import autoregressive_generate, speculative_generate

    if repeats < 1 or batch < 1 or k < 1 or not prompts:
        raise ValueError(f"need repeats, batch and k >= 1 and at least one prompt; got repeats={repeats}, "
                         f"batch={batch}, k={k}, {len(prompts)} prompts")
    per_repeat, acc, rej, emitted, steps = [], 0, 0, 0, 0
    plain_rates, spec_rates = [], []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(repeats):
        tok = {"plain": 0, "spec": 0}
        sec = {"plain": 0.0, "spec": 0.0}
        for ids in prompts:
            x = torch.tensor([list(ids)] * batch)  # [batch, L]
            t0 = time.perf_counter()
            outs, _ = autoregressive_generate(target, x, max_new_tokens, temperature=temperature, generator=gen)
            sec["plain"] += time.perf_counter() - t0
            tok["plain"] += sum(len(o) for o in outs)
            t0 = time.perf_counter()
            outs, st = speculative_generate(target, make_drafter(), x, max_new_tokens, k=k, temperature=temperature,
                                            generator=gen)
            sec["spec"] += time.perf_counter() - t0
            tok["spec"] += sum(len(o) for o in outs)
            acc, rej = acc + st.accepted, rej + st.rejections
            emitted, steps = emitted + st.emitted, steps + st.row_steps
        plain_rates.append(tok["plain"] / sec["plain"])
        spec_rates.append(tok["spec"] / sec["spec"])
        per_repeat.append(spec_rates[-1] / plain_rates[-1])
    return {"speedup": statistics.median(per_repeat), "per_repeat": per_repeat,
            "alpha": acc / max(1, acc + rej), "tau": emitted / max(1, steps),
            "plain_tok_s": statistics.median(plain_rates), "spec_tok_s": statistics.median(spec_rates)}
