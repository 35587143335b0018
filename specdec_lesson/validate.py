"""Argument checks shared by the library's public functions (the bottom of the dependency graph: no imports from
the package).  Each raises ONE ValueError naming the argument, the value it got and what is allowed, and returns
the value in a plain Python type, so callers check and convert in one line::

    k = as_int(k, "k", lo=1)                     # int, numpy / torch integer scalars; not 2.5, True or "3"
    c = as_real(c, "c", lo=0)                    # any finite real: float, int, numpy, torch, Fraction, sympy number
    alpha = as_prob(alpha, "alpha")              # a finite real in [0, 1]
    p = as_law(target_law, "target_law")         # non-negative finite floats summing to 1 (within a tolerance)
    eos = as_token_ids(eos, "eos_token_id", V)   # None, an id or a collection of ids, each in [0, V)

(The CLIs' own checks, which raise ``cli_args.UsageError`` naming a flag, live in :mod:`specdec_lesson.cli_args`.)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

__all__ = ["as_int", "as_real", "as_prob", "as_law", "as_token_ids", "LAW_TOLERANCE"]

LAW_TOLERANCE = 1e-6  # how far a law given as floats may sum from 1 (fp32 laws from torch: 1e-3)


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_boolish(value) -> bool:
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def as_int(value, name: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an ``int`` (Python, numpy or 0-dim torch integers), checked against ``lo <= value <= hi``.
    Floats (even 3.0), bools and strings are refused: a count or an index is never rounded."""
    if lo is not None and hi is not None:
        allowed = f"an integer in {lo}..{hi}"
    else:
        allowed = "an integer" + (f" >= {lo}" if lo is not None else "") + (f" <= {hi}" if hi is not None else "")
    if _is_boolish(value):
        raise ValueError(f"{name} must be {allowed}, got {_describe(value)}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {allowed}, got {_describe(value)} ({type(value).__name__})") from None
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise ValueError(f"{name} must be {allowed}, got {out}")
    return out


def as_real(value, name: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            hi_open: bool = False) -> float:
    """``value`` as a finite ``float`` in the given range (``lo_open`` / ``hi_open``: the bound itself is excluded).
    Accepts anything real with ``__float__`` (int, float, numpy and one-element torch scalars, Fraction, sympy numbers);
    refuses NaN, infinities, bools, strings and complex numbers."""
    lo_txt = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
    hi_txt = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
    allowed = " ".join(["a finite number", lo_txt, "and" if lo_txt and hi_txt else "", hi_txt]).replace("  ", " ").strip()
    if _is_boolish(value) or isinstance(value, (str, bytes, complex)):
        raise ValueError(f"{name} must be {allowed}, got {_describe(value)}")
    try:
        out = float(value)
    except (TypeError, ValueError, RuntimeError):  # a symbol, a tensor of many elements, None, ...
        raise ValueError(f"{name} must be {allowed}, got {_describe(value)} ({type(value).__name__})") from None
    bad = not math.isfinite(out) or (lo is not None and (out <= lo if lo_open else out < lo)) or (
        hi is not None and (out >= hi if hi_open else out > hi))
    if bad:
        raise ValueError(f"{name} must be {allowed}, got {_describe(value)}")
    return out


def as_prob(value, name: str) -> float:
    """A probability: a finite real in [0, 1] (0 and 1 included), as a float."""
    return as_real(value, name, lo=0.0, hi=1.0)


def as_law(values, name: str, *, tol: float | None = None) -> list[float]:
    """A probability law over a vocabulary: a non-empty sequence (or 1-D tensor / array) of finite, non-negative
    reals summing to 1 within ``tol`` (default ``LAW_TOLERANCE``, 1e-3 for a tensor or array in fp32 or less)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a sequence of probabilities summing to 1, got {_describe(values)}")
    dim = getattr(values, "ndim", None)
    if dim is not None and dim != 1:
        raise ValueError(f"{name} must be a 1-D law (one probability per token), got shape {tuple(values.shape)}")
    if tol is None:
        dtype = str(getattr(values, "dtype", "float64"))
        tol = LAW_TOLERANCE if "64" in dtype or "int" in dtype else 1e-3
    out = [as_real(v, f"{name}[{i}]", lo=0.0) for i, v in enumerate(values)]
    if not out:
        raise ValueError(f"{name} must be a non-empty law (one probability per token), got an empty sequence")
    total = math.fsum(out)
    if abs(total - 1.0) > tol:
        raise ValueError(f"{name} must sum to 1 (within {tol:g}), sums to {total!r}: normalise it")
    return out


def as_token_ids(value, name: str, vocab: int) -> list[int]:
    """``None`` (no ids), one token id or a collection of ids (list, tuple, set, 1-D tensor or array), each an
    integer in [0, vocab); returned as a list of ints."""
    if value is None:
        return []
    allowed = f"None, a token id or a list of token ids, each an integer in 0..{vocab - 1}"
    dim = getattr(value, "ndim", None)
    many = dim == 1 if dim is not None else isinstance(value, (list, tuple, set, frozenset))
    items = list(value) if many else [value]
    out = []
    for t in items:
        if _is_boolish(t):
            raise ValueError(f"{name} must be {allowed}, got {_describe(value)}")
        try:
            i = operator.index(t)
        except TypeError:
            raise ValueError(f"{name} must be {allowed}, got {_describe(value)} (holding a {type(t).__name__})") from None
        if not 0 <= i < vocab:
            raise ValueError(f"{name} must be {allowed} (the model's vocabulary), got {i}")
        out.append(i)
    return out
