"""Exercises of notebook 00 (the memory wall): the bytes a decode step reads, the batch where a GPU turns compute
bound, and the context where the KV cache outweighs the weights.  Ground truth: the simulator's roofline
(:func:`specdec_lesson.sim.forward_cost`) and the presets' shapes (:mod:`specdec_lesson.sim.presets`)."""

from __future__ import annotations

import math
from fractions import Fraction

from ..sim import HARDWARE, MODELS, PRECISION_BYTES, forward_cost
from ._core import Exercise, call, fail, passed

__all__ = ["check_memory_time", "check_compute_bound_batch", "check_kv_crossover", "EXERCISES"]

_PRECISIONS = ("bf16", "int4", "fp32")


def _kv_bytes(precision: str) -> float:
    return 4.0 if precision == "fp32" else 2.0  # the KV cache stays 16-bit under weight-only int8 / int4


def check_memory_time(fn) -> None:
    """``fn(hardware, model, precision, batch, context)`` -> seconds of the memory part of one decode step; compared
    with ``forward_cost(...).memory_s`` (relative 1e-9) on every preset hardware and model, three precisions, batch
    1 and 32, context 0, 1024 and 32768."""
    ex = "0.1"
    for hw in HARDWARE.values():
        for m in MODELS.values():
            for prec in _PRECISIONS:
                for batch in (1, 32):
                    for context in (0, 1024, 32768):
                        want = forward_cost(hw, m, prec, 1, batch, context).memory_s
                        got = call(ex, fn, hw, m, prec, batch, context, what=f"memory_time({hw.name!r}, {m.name!r}, "
                                   f"{prec!r}, batch={batch}, context={context})")
                        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9):
                            no_kv = m.streamed_bytes(prec) / hw.bandwidth
                            hint = (" You left out the KV cache: every row reads (context + 1) x kv_bytes_per_token." if
                                    isinstance(got, (int, float)) and math.isclose(got, no_kv, rel_tol=1e-9) else
                                    " Weights: model.streamed_bytes(precision) (an untied embedding table is looked up,"
                                    " not streamed); KV: batch x (context + 1) x model.kv_bytes_per_token(2 bytes, 4 in"
                                    " fp32); divide by hardware.bandwidth.")
                            fail(ex, f"{hw.name}, {m.name} {prec}, batch {batch}, context {context}: expected "
                                     f"{want * 1e3:.6g} ms, got {got!r} s.{hint}")
    t = forward_cost("H200", "Llama-3-8B", "bf16", 1, 1, 1024).memory_s
    passed(ex, f"an H200 needs at least {t * 1e3:.2f} ms per Llama-3-8B bf16 token at batch 1 (1k context), so at most "
               f"{1 / t:.0f} tokens/s, however many FLOP/s it has.")


def first_compute_bound_batch(hardware, model, precision: str = "bf16", context: int = 0, max_batch: int = 4096):
    """The smallest batch in 1..max_batch whose decode step the roofline calls compute bound, or None (bisection:
    FLOPs / bytes = B f / (W + B a) grows with the batch B, so the first compute-bound batch is well defined)."""
    def compute(b: int) -> bool:
        return forward_cost(hardware, model, precision, 1, b, context).bound == "compute"

    if not compute(max_batch):
        return None
    lo, hi = 0, max_batch  # compute(lo) false (or lo = 0), compute(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute(mid) else (mid, hi)
    return hi


def check_compute_bound_batch(fn) -> None:
    """``fn(hardware, model, precision, context, max_batch)`` -> the first compute-bound batch or None; compared with
    :func:`first_compute_bound_batch` on every preset hardware, Llama-3-8B and -70B, bf16 and int4, context 0 and
    1024, max_batch 4096."""
    ex = "0.2"
    for hw in HARDWARE.values():
        for name in ("Llama-3-8B", "Llama-3-70B"):
            for prec in ("bf16", "int4"):
                for context in (0, 1024):
                    want = first_compute_bound_batch(hw, name, prec, context, 4096)
                    got = call(ex, fn, hw, MODELS[name], prec, context, 4096,
                               what=f"compute_bound_batch({hw.name!r}, {name!r}, {prec!r}, context={context})")
                    if got != want:
                        why = ("" if want is not None else " No batch up to 4096 is compute bound here: the KV cache "
                               "grows with the batch as fast as the FLOPs do, so return None.")
                        fail(ex, f"{hw.name}, {name} {prec}, context {context}: expected {want}, got {got!r}.{why} The "
                                 "step is compute bound when forward_cost(...).compute_s > memory_s.")
    b0, b1 = (first_compute_bound_batch("H200", "Llama-3-8B", "bf16", c) for c in (0, 1024))
    passed(ex, f"an H200 decoding Llama-3-8B (bf16) turns compute bound at batch {b0} with an empty cache, and "
               f"{'never (up to 4096)' if b1 is None else f'at batch {b1}'} at a 1k context: below that, K drafts "
               "verified in one forward cost little more than one token.")


def kv_crossover_context(model, precision: str, batch: int) -> int:
    """Smallest context c with batch * c * KV bytes per token >= the streamed weight bytes (exact arithmetic)."""
    weights = Fraction(model.matmul_params) * Fraction(PRECISION_BYTES[precision])
    kv = batch * model.n_layers * 2 * model.n_kv_heads * model.head_dim * Fraction(_kv_bytes(precision))
    assert float(kv / batch) == model.kv_bytes_per_token(_kv_bytes(precision))  # the preset's own formula
    return math.ceil(weights / kv)


def check_kv_crossover(fn) -> None:
    """``fn(model, precision, batch)`` -> the smallest context whose KV cache read (batch x context x KV bytes per
    token) reaches the streamed weight bytes; compared with :func:`kv_crossover_context` on every preset model, three
    precisions, batch 1, 8 and 64."""
    ex = "0.3"
    for m in MODELS.values():
        for prec in _PRECISIONS:
            for batch in (1, 8, 64):
                want = kv_crossover_context(m, prec, batch)
                got = call(ex, fn, m, prec, batch, what=f"kv_crossover({m.name!r}, {prec!r}, batch={batch})")
                if got != want:
                    mha = math.ceil(m.streamed_bytes(prec) / (batch * m.n_layers * 2 * m.n_heads * m.head_dim
                                                              * _kv_bytes(prec)))
                    hint = (" You used n_heads: with grouped-query attention only n_kv_heads heads are cached." if
                            got == mha else " KV bytes per token = n_layers x 2 (K and V) x n_kv_heads x head_dim x 2 "
                            "bytes (4 in fp32); weights = model.streamed_bytes(precision); round the context up.")
                    fail(ex, f"{m.name} {prec}, batch {batch}: expected a context of {want} tokens, got {got!r}.{hint}")
    c1, c64 = (kv_crossover_context(MODELS["Llama-3-8B"], "bf16", b) for b in (1, 64))
    passed(ex, f"Llama-3-8B bf16: the KV cache outweighs the weights from a {c1}-token context at batch 1, but from "
               f"{c64} tokens at batch 64, where every verified token re-reads a large cache.")


_P01 = """The roofline says one decode step costs at least *bytes read / bandwidth*. Write
`memory_time(hardware, model, precision, batch, context)`, the memory part of one decode step in seconds: the
matmul weights (`model.streamed_bytes(precision)`) plus, for each of the `batch` rows, the KV cache of
`context + 1` tokens (the cached ones and the new one), `model.kv_bytes_per_token(kv)` bytes each (kv = 2 bytes, 4
in fp32), over `hardware.bandwidth`. The check compares with the simulator on every preset."""

_S01 = '''from specdec_lesson.exercises import check_memory_time


def memory_time(hardware, model, precision, batch, context):
    """Seconds to read one decode step's weights and KV cache."""
    raise NotImplementedError


check_memory_time(memory_time)
'''

_A01 = '''from specdec_lesson.exercises import check_memory_time


def memory_time(hardware, model, precision, batch, context):
    """Seconds to read one decode step's weights and KV cache."""
    kv = 4.0 if precision == "fp32" else 2.0
    nbytes = model.streamed_bytes(precision) + batch * (context + 1) * model.kv_bytes_per_token(kv)
    return nbytes / hardware.bandwidth


check_memory_time(memory_time)
'''

_P02 = """Batching raises the FLOPs per byte: the weights are read once for the whole batch. Write
`compute_bound_batch(hardware, model, precision, context, max_batch)`: the smallest batch in 1..max_batch whose
decode step `forward_cost(hardware, model, precision, 1, batch, context)` calls compute bound (`.bound ==
"compute"`), or `None` if there is none. Predict first: where does an H200 turn compute bound for Llama-3-8B in
bf16, with an empty cache and with a 1k context?"""

_S02 = '''from specdec_lesson.exercises import check_compute_bound_batch
from specdec_lesson.sim import forward_cost


def compute_bound_batch(hardware, model, precision, context, max_batch):
    """The first batch at which one decode step is compute bound, or None."""
    raise NotImplementedError


check_compute_bound_batch(compute_bound_batch)
'''

_A02 = '''from specdec_lesson.exercises import check_compute_bound_batch
from specdec_lesson.sim import forward_cost


def compute_bound_batch(hardware, model, precision, context, max_batch):
    """The first batch at which one decode step is compute bound, or None."""
    def compute(b):
        return forward_cost(hardware, model, precision, 1, b, context).bound == "compute"

    if not compute(max_batch):
        return None
    lo, hi = 0, max_batch  # FLOPs per byte grow with the batch: bisect
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute(mid) else (mid, hi)
    return hi


check_compute_bound_batch(compute_bound_batch)
'''

_P03 = """The KV cache is read at every step too. Write `kv_crossover(model, precision, batch)`: the smallest context
(in tokens) at which the batch's KV cache, `batch x context x` KV bytes per token, is at least the streamed weight
bytes. Derive the KV bytes per token from the shape: `n_layers`, K and V, `n_kv_heads`, `head_dim`, 2 bytes per
value (4 in fp32; int4 / int8 quantise the weights only)."""

_S03 = '''import math

from specdec_lesson.exercises import check_kv_crossover


def kv_crossover(model, precision, batch):
    """Smallest context whose KV cache read reaches the weight read."""
    raise NotImplementedError


check_kv_crossover(kv_crossover)
'''

_A03 = '''import math

from specdec_lesson.exercises import check_kv_crossover


def kv_crossover(model, precision, batch):
    """Smallest context whose KV cache read reaches the weight read."""
    value_bytes = 4 if precision == "fp32" else 2
    per_token = model.n_layers * 2 * model.n_kv_heads * model.head_dim * value_bytes
    return math.ceil(model.streamed_bytes(precision) / (batch * per_token))


check_kv_crossover(kv_crossover)
'''

EXERCISES = [
    Exercise("0.1", "the floor of a decode step", check_memory_time, _P01, _S01, _A01),
    Exercise("0.2", "the batch at which a GPU turns compute bound", check_compute_bound_batch, _P02, _S02, _A02),
    Exercise("0.3", "when the KV cache outweighs the weights", check_kv_crossover, _P03, _S03, _A03),
]
