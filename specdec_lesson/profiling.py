"""Measuring this machine: memory bandwidth, matmul FLOP/s, and the verify-cost curve T(n).

Speculative decoding pays off when one target forward over n = K+1 new tokens costs little more
than a forward over one token: T(n)/T(1) close to 1.  Decoding is memory-bound (every weight is
read once per forward whatever n is), so the roofline of a decode step is
``weight_bytes / bandwidth``, and n only starts to cost once ``2 * params * n / flops`` catches
up.  These functions measure the three numbers the course's roofline and latency simulator use.

Conventions: bandwidth and FLOP/s are the BEST of ``repeats`` timed runs (what the machine can
do, as STREAM reports it); the verify curve a benchmark reports is the MEDIAN (what a decoding loop
sees), while the probes that feed the cost model keep each width's FASTEST round (:func:`probe_cost`:
another process on the cores only ever adds time).  Warm-up runs are never timed.  Timings on a shared
machine are noisy: rerun on a quiet one before quoting them.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from collections.abc import Iterable, Sequence

import torch

__all__ = [
    "crop_to", "measure_bandwidth", "measure_matmul_flops", "measure_verify_curve", "measure_framework_overhead", "wall_ms",
    "count_parameters", "tune_dispatch", "noisy_probe_note", "probe_cost", "relative_spread", "needs_more_rounds",
    "verify_curve_rounds",
]


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def wall_ms(fn, repeats: int = 5, warmup: int = 1, quantile: float = 0.5) -> float:
    """Milliseconds of one call of ``fn()``: the ``quantile`` (0.5 = the median, 0 = the best) of ``repeats``
    timed calls after ``warmup`` untimed ones.  Wall clock: pin the thread count and use a quiet machine."""
    _check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1], got {quantile!r}")
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[round(quantile * (len(ts) - 1))]


def count_parameters(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``module``, each shared tensor counted once."""
    seen: set[int] = set()
    total = 0
    for prm in module.parameters():
        if id(prm) in seen or (trainable_only and not prm.requires_grad):
            continue
        seen.add(id(prm))
        total += prm.numel()
    return total


def measure_bandwidth(size_mb: float = 256, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s: the best of ``repeats`` STREAM-style copy (a = b) and triad
    (a = b + s*c) passes over fp32 arrays of ``size_mb`` MB each (three arrays are allocated).

    Bytes are counted as STREAM does (copy: read b + write a; triad: read b, c + write a), without
    the write-allocate traffic, so the figure is comparable to published STREAM numbers.  Arrays
    must be much larger than the last-level cache for this to measure DRAM (256 MB is)."""
    if not (isinstance(size_mb, (int, float)) and size_mb > 0):
        raise ValueError(f"size_mb must be a positive number, got {size_mb!r}")
    _check_positive_int("repeats", repeats)
    numel = max(1, int(size_mb * 2**20) // 4)
    a = torch.empty(numel, dtype=torch.float32)
    b = torch.ones(numel, dtype=torch.float32)
    c = torch.full((numel,), 2.0, dtype=torch.float32)
    nbytes = numel * 4
    best = 0.0
    a.copy_(b)  # warm-up: touch every page
    torch.add(b, c, alpha=3.0, out=a)
    for _ in range(repeats):
        t0 = time.perf_counter()
        a.copy_(b)
        t1 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)  # triad
        t2 = time.perf_counter()
        best = max(best, 2 * nbytes / (t1 - t0), 3 * nbytes / (t2 - t1))
    return best


def measure_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    """fp32 matmul throughput in FLOP/s: the best of ``repeats`` timed [n, n] @ [n, n] products
    (2 n^3 floating-point operations each), with the current ``torch.get_num_threads()``."""
    _check_positive_int("n", n)
    _check_positive_int("repeats", repeats)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g)  # [n, n]
    y = torch.randn(n, n, generator=g)  # [n, n]
    out = torch.empty(n, n)  # [n, n]
    torch.mm(x, y, out=out)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(x, y, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def _forward(model, ids: torch.Tensor, cache, start: int) -> torch.Tensor:
    """One forward of ids [1, n] at positions start..start+n-1 onto ``cache``; logits [1, n, V]."""
    n = ids.shape[1]
    pos = torch.arange(start, start + n, device=ids.device).unsqueeze(0)  # [1, n]
    return model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True).logits


def crop_to(cache, length: int) -> None:
    """Crop a Hugging Face cache back to ``length`` tokens (``DynamicCache.crop`` takes the count to
    remove, as a negative number) and check that it holds exactly ``length`` afterwards."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} tokens to {length}: it is shorter")
    if extra:
        cache.crop(-extra)
    if cache.get_seq_length() != length:
        raise RuntimeError(f"the KV cache holds {cache.get_seq_length()} tokens after crop, expected {length}")


def probe_cost(rounds: Iterable[float]) -> float:
    """The cost that a probe feeding the cost model reports for one forward width: the FASTEST of its interleaved
    rounds, not their median.  What another process does to a forward on a shared machine only ever adds time, so
    the fastest round is the best estimate of the forward's own cost.  Measured with a neighbour streaming memory on
    one core (``benchmarks/results/probe_noise_amd_f26_m2.json``, 12 probes): T(4)/T(1) read 0.50-2.58 by the median
    of 3 rounds, 0.90-2.46 by their fastest, 0.96-1.30 by the fastest once the probe takes more rounds when the
    first ones disagree (:func:`needs_more_rounds`; quiet reference 1.12).  Benchmarks that report a speed keep the
    median of their interleaved repeats."""
    return min(rounds)


def relative_spread(rounds: Iterable[Sequence[float]]) -> float:
    """How much a probe's repeats disagree: the median over its widths (and paths) of (slowest - fastest) / median of
    that width's rounds.  About 0.02-0.03 on a quiet 2-core machine; above ``NOISY_SPREAD`` the probe is noisy."""
    return statistics.median((max(v) - min(v)) / statistics.median(v) for v in rounds)


NOISY_SPREAD = 0.15  # median relative spread of the probe's repeats above which tune_dispatch warns
DIP = 0.98  # a wider forward's fastest round below this times T(1)'s: the one-token rounds were slowed, probe more


def needs_more_rounds(times: dict[int, list[float]]) -> str | None:
    """Why a verify-curve probe's rounds ``{n: [seconds per round]}`` cannot be trusted yet (None: they can): they
    disagree (``profiling.relative_spread`` above ``NOISY_SPREAD``), or a wider forward's fastest round is under
    ``DIP`` times the one-token forward's."""
    spread = relative_spread(times.values())
    if spread > NOISY_SPREAD:
        return f"varied by {spread:.0%} (a quiet machine: 2-3%)"
    if 1 in times and any(probe_cost(ts) < DIP * probe_cost(times[1]) for n, ts in times.items() if n > 1):
        return "read a wider forward faster than one token"
    return None


def verify_curve_rounds(model, ns: Iterable[int], context: int = 128, rounds: int = 1) -> dict[int, list[float]]:
    """Seconds of ONE forward of ``model`` (Hugging Face's) over n new tokens after a ``context``-token KV cache,
    ``{n: [seconds per round]}`` for n in ``ns``.  The context is ``context`` fixed pseudo-random token ids (seed 0)
    prefilled once into a ``DynamicCache``; after every call the cache is cropped back to ``context`` tokens so each
    call sees the same cache.  All logits of the n positions are computed (as a verify step needs them).  Every n
    gets one untimed warm-up call; the timed calls are interleaved across n (``rounds`` rounds over all n), so load
    drift on a shared machine spreads evenly over the curve.  Runs under ``torch.inference_mode``."""
    from transformers import DynamicCache

    _check_positive_int("context", context)
    _check_positive_int("rounds", rounds)
    ns = [int(n) for n in ns]
    if not ns or any(n < 1 for n in ns):
        raise ValueError(f"ns must be a non-empty list of positive token counts, got {ns!r}")
    param = next(model.parameters())
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g).to(param.device)  # [1, context]
    new = torch.randint(0, vocab, (1, max(ns)), generator=g).to(param.device)  # [1, n_max]
    sync = torch.cuda.synchronize if param.device.type == "cuda" else (lambda: None)
    times: dict[int, list[float]] = {n: [] for n in ns}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        _forward(model, prompt, cache, 0)
        for n in ns:  # warm-up, untimed
            _forward(model, new[:, :n], cache, context)
            crop_to(cache, context)
        for _ in range(rounds):
            for n in ns:
                sync()
                t0 = time.perf_counter()
                _forward(model, new[:, :n], cache, context)
                sync()
                times[n].append(time.perf_counter() - t0)
                crop_to(cache, context)
    return times


def measure_verify_curve(
    model, n_max: int = 16, context: int = 128, repeats: int = 5, ns: Iterable[int] | None = None
) -> dict[int, float]:
    """Median seconds of ONE forward of ``model`` over n new tokens after a ``context``-token KV cache, ``{n:
    seconds}`` for n in ``ns`` (default 1..n_max), over ``repeats`` interleaved rounds (:func:`verify_curve_rounds`)."""
    _check_positive_int("n_max", n_max)
    _check_positive_int("repeats", repeats)
    ns = list(range(1, n_max + 1)) if ns is None else [int(n) for n in ns]
    times = verify_curve_rounds(model, ns, context, repeats)
    return {n: statistics.median(ts) for n, ts in times.items()}


def measure_framework_overhead(
    num_layers: int = 1, context: int = 128, repeats: int = 20, dtype: torch.dtype = torch.float32
) -> float:
    """Median seconds of a one-token cached forward of a tiny-width (hidden 16, vocab 64) Llama with
    ``num_layers`` layers: arithmetic is negligible, so this is the per-forward Python / Hugging Face
    / dispatch overhead.  Compare 1 and 30 layers for the per-layer share."""
    from .models import tiny_llama

    model = tiny_llama(vocab_size=64, hidden_size=16, num_layers=num_layers, num_heads=2, num_kv_heads=1, dtype=dtype)
    return measure_verify_curve(model, context=context, repeats=repeats, ns=[1])[1]


def noisy_probe_note(spread: float) -> str:
    """What a noisy dispatch probe measured and what it may mean (the warning and the bench's results note)."""
    return (f"the dispatch probe's repeats varied by {spread:.0%} (median relative spread; a quiet machine shows 2-3%), "
            "so the plain/pre-packed choice and the timings taken alongside may be unreliable: another process may be "
            "using the cores, or this machine is noisy; rerun on a quiet machine to be sure")


def _status(text: str) -> None:
    print(f"[specdec] {text}", file=sys.stderr, flush=True)


def tune_dispatch(model: torch.nn.Module, widths: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8), context: int = 128,
                  repeats: int = 5, *, verbose: bool = True) -> dict:
    """Measure one forward over n new tokens (batch 1, after a ``context``-token cache) with plain and with
    packed weights for each n in ``widths``, interleaved, and set ``plain_rows_max`` to the largest n such
    that plain is faster at every width up to n.  Returns ``{"plain_ms": {n: ms}, "packed_ms": {n: ms},
    "plain_rows_max": r, "best_ms": {n: ms}, "spread": s, "noisy": bool}``, each width's ms the fastest of the
    rounds (:func:`probe_cost`: the cost model reads them).  ``spread`` is the
    median over widths and paths of (slowest - fastest) / median of the repeats: about 0.02-0.03 on a quiet
    2-core machine, near 1 with another process on a core.  Above ``NOISY_SPREAD`` the probe warns, since its
    choice of weights (and every timing taken alongside) is then unreliable.  A model without packed
    linears is left alone.  ``verbose``: a status line on stderr before the probe and one per round (each round
    times every width with both weights), so that a slow probe on a busy machine is never silent."""
    from .fastcpu import count_packed, set_plain_rows

    if count_packed(model) == 0:
        return {"plain_ms": {}, "packed_ms": {}, "plain_rows_max": 0, "best_ms": {}, "spread": 0.0, "noisy": False}
    ns = sorted(set(widths))
    plain: dict[int, list[float]] = {n: [] for n in ns}
    packed: dict[int, list[float]] = {n: [] for n in ns}
    big = max(ns) + 1
    if verbose:
        _status(f"probing plain vs pre-packed weights at widths {ns[0]}..{ns[-1]} ({repeats} rounds; a few seconds on a "
                "quiet machine) ...")
    t_start = time.perf_counter()
    for i in range(repeats):  # interleaved: a slow moment of the machine hits both paths alike
        for rows, into in ((big, plain), (0, packed)):
            set_plain_rows(model, rows)
            curve = measure_verify_curve(model, context=context, repeats=1, ns=ns)
            for n in ns:
                into[n].append(curve[n] * 1e3)
        if verbose:
            spent = time.perf_counter() - t_start
            left = spent / (i + 1) * (repeats - i - 1)
            _status(f"probe round {i + 1}/{repeats} done after {spent:.1f} s" + (f" (about {left:.0f} s left)" if left else ""))
    plain_ms = {n: probe_cost(v) for n, v in plain.items()}
    packed_ms = {n: probe_cost(v) for n, v in packed.items()}
    r = 0
    for n in ns:  # the widths up to r all run faster plain
        if plain_ms[n] >= packed_ms[n]:
            break
        r = n
    set_plain_rows(model, r)
    best = {n: min(plain_ms[n], packed_ms[n]) if n <= r else packed_ms[n] for n in ns}
    spread = relative_spread(v for d in (plain, packed) for v in d.values())
    noisy = spread > NOISY_SPREAD  # one repeat has no spread: never noisy
    if noisy:
        warnings.warn(f"tune_dispatch: {noisy_probe_note(spread)}", stacklevel=2)
    return {"plain_ms": plain_ms, "packed_ms": packed_ms, "plain_rows_max": r, "best_ms": best,
            "spread": round(spread, 4), "noisy": noisy}
