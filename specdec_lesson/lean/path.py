"""Which forward the engines run for a model, and what it costs on this machine.

The engines pick their forward in :func:`~specdec_lesson.lean.slots.make_cache`: the lean one for a supported
Llama when asked (``lean=True``) or by default (``LEAN_BY_DEFAULT``), else Hugging Face's.  Whatever measures
the engine's costs (the load-time dispatch probe, the adaptive drafter's T(n), the simulator's calibration) must
time that same forward, or it feeds the cost model the costs of another program.  This module says which one
runs (:func:`uses_lean`) and measures it (:func:`engine_verify_curve`, :func:`tune_engine_dispatch`).
"""

from __future__ import annotations

import torch

from . import slots
from .model import UnsupportedModelError, lean_model, lean_verify_curve, tune_lean_dispatch

__all__ = ["uses_lean", "engine_verify_curve", "tune_engine_dispatch", "engine_plain_rows"]


def uses_lean(model: torch.nn.Module, lean: bool | None = None) -> bool:
    """True when ``make_cache(model, ..., lean=lean)`` would run the lean forward (paged caches aside)."""
    if not (slots.LEAN_BY_DEFAULT if lean is None else lean):
        return False
    try:
        lean_model(model)
    except UnsupportedModelError:
        return False
    return True


def engine_plain_rows(model: torch.nn.Module) -> int:
    """The widest forward (batch x new tokens) that the engines run through ``model``'s plain weights rather than its
    pre-packed ones (0: pre-packed at every width), as the forward the engines run has it now: the lean copy's
    threshold, else the largest of the Hugging Face modules' (``fastcpu.PackedLinear.plain_rows_max``)."""
    from ..fastcpu import plain_rows

    if slots.LEAN_BY_DEFAULT:  # as uses_lean(model), building the lean copy once
        try:
            return lean_model(model).plain_rows_max
        except UnsupportedModelError:
            pass
    return plain_rows(model)


def engine_verify_curve(model: torch.nn.Module, ns: list[int], context: int = 128, repeats: int = 3,
                        lean: bool | None = None, max_repeats: int | None = None) -> dict[int, float]:
    """Seconds of one forward over n new tokens (batch 1, all n logits, after a ``context``-token cache) for each n
    in ``ns``, on the forward the engines run (:func:`uses_lean`): the fastest of the interleaved rounds
    (``profiling.probe_cost``: what the cost model reads; a shared machine's noise only adds time).  ``repeats``
    rounds, then more, up to ``max_repeats`` (default 4 x repeats) in all, when they disagree
    (``profiling.relative_spread`` above ``NOISY_SPREAD``) or read a wider forward more than 2% faster than one
    token (it reads the same weights and does more work: the one-token rounds were slowed): on a busy host the
    fastest of 3 rounds can still read a flat curve, and a flat curve makes every tree look free
    (``benchmarks/results/probe_noise_amd_f26_m2.json``): ``profiling.needs_more_rounds``."""
    from ..profiling import _status, needs_more_rounds, probe_cost, verify_curve_rounds

    top = 4 * repeats if max_repeats is None else max(int(max_repeats), repeats)
    fast = uses_lean(model, lean)

    def take(count: int, first: bool) -> dict[int, list[float]]:
        if fast:
            return lean_verify_curve(model, ns, context, rounds=count, warmup=first)
        return verify_curve_rounds(model, ns, context, count)

    times = take(repeats, True)
    why = needs_more_rounds(times)
    if why and top > repeats:
        _status(f"the verify-curve probe's {repeats} rounds {why}: taking {top - repeats} more and keeping each "
                "width's fastest ...")
        more = take(top - repeats, False)
        times = {n: ts + more[n] for n, ts in times.items()}
    return {n: probe_cost(ts) for n, ts in times.items()}


def tune_engine_dispatch(model: torch.nn.Module, repeats: int = 3, *, verbose: bool = True) -> dict:
    """The plain / pre-packed choice per forward width, measured on this machine for the forward the engines
    run: ``profiling.tune_dispatch`` (Hugging Face's forward, which the Hugging Face methods keep using), then,
    when the engines run the lean forward, :func:`~specdec_lesson.lean.model.tune_lean_dispatch` on it.  Returns
    the engine forward's profile (``plain_ms``, ``packed_ms``, ``plain_rows_max``, ``best_ms``, ``spread``,
    ``noisy``) with ``forward`` ("lean" or "hf") and, for the lean forward, ``hf`` (Hugging Face's profile)."""
    from ..profiling import tune_dispatch

    hf = tune_dispatch(model, repeats=repeats, verbose=verbose)
    if not uses_lean(model):
        return {**hf, "forward": "hf"}
    return {**tune_lean_dispatch(model, repeats=repeats), "forward": "lean", "hf": hf}
