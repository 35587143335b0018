"""Checks of user input shared by the command lines (demo, bench, distill) and ``notebook.setup``.

Each check raises one ``UsageError`` (a ``ValueError``) whose message names the argument, the value it
got and what it takes, so a command line can print it as one line before any long work starts.
``OneLineParser`` makes argparse's own errors (unknown flag, ``--k abc``) the same single line.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

__all__ = ["UsageError", "OneLineParser", "max_threads", "check_int", "check_float", "check_threads", "check_seed",
           "check_output_file", "check_writable_dir", "same_file"]

SEED_LIMIT = 2**63  # torch.Generator.manual_seed takes up to 2**64 - 1; numpy up to 2**32 - 1 (setup reduces it)


class UsageError(ValueError):
    """Bad user input: the message says what is wrong and how to fix it."""


class OneLineParser(argparse.ArgumentParser):
    """argparse without the usage dump: an error raises ``UsageError`` (the caller prints one line)."""

    def error(self, message: str):
        raise UsageError(message)


def max_threads() -> int:
    """The most torch threads a check accepts: the number of logical CPUs (more only oversubscribes, and
    a huge count crashes the process at the next matmul)."""
    return os.cpu_count() or 1


def check_int(value, name: str, *, lo: int | None = None, hi: int | None = None, allow_none: bool = False) -> int | None:
    """``value`` as an int in ``[lo, hi]`` (bools and floats refused), else UsageError naming ``name``."""
    if value is None and allow_none:
        return None
    span = f" in {lo}..{hi}" if lo is not None and hi is not None else f" >= {lo}" if lo is not None else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer{span}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise UsageError(f"{name} must be an integer{span}, got {value}")
    return value


def check_float(value, name: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), else UsageError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value!r}")
    low_bad = lo is not None and (value <= lo if lo_open else value < lo)
    if low_bad or (hi is not None and value > hi):
        left = f"> {lo}" if lo_open else f">= {lo}"
        rng = f"{left} and <= {hi}" if lo is not None and hi is not None else left if lo is not None else f"<= {hi}"
        raise UsageError(f"{name} must be {rng}, got {value!r}")
    return float(value)


def check_threads(value, name: str = "threads", *, allow_none: bool = True) -> int | None:
    """A torch thread count: an int in 1..os.cpu_count()."""
    return check_int(value, name, lo=1, hi=max_threads(), allow_none=allow_none)


def check_seed(value, name: str = "seed") -> int:
    """A seed: an int in 0..2**63-1 (None, floats and negatives refused, before anything is seeded)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise UsageError(f"{name} must be an integer >= 0 (below 2**63), got {value!r}")
    return value


def _probe(folder: Path) -> None:
    """Create and remove a file in ``folder``: the only test that is right for root, ACLs and read-only mounts."""
    fd, tmp = tempfile.mkstemp(prefix=".write-test-", dir=folder)
    os.close(fd)
    os.unlink(tmp)


def check_writable_dir(folder: str | Path, name: str, *, create: bool = True) -> Path:
    """``folder`` exists (made if ``create``), is a folder, and a file can be written in it; else UsageError."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{name} {str(folder)!r} is a file, not a folder; choose a folder path")
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise UsageError(f"{name} {str(folder)!r} does not exist; create it first or choose another folder")
        _probe(folder)
    except OSError as exc:
        raise UsageError(f"{name} {str(folder)!r} is not writable ({exc.strerror or exc}); choose a writable folder") from None
    return folder


def check_output_file(path: str | Path, name: str, *, make_parent: bool = False) -> Path:
    """An output file path that can be written: not a folder, its folder exists (made if ``make_parent``)
    and is writable.  Checked before any long work, so a finished run is never lost to a bad path."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UsageError(f"{name} {str(path)!r} is a folder; give a file path such as {str(path / 'results.json')!r}")
    parent = path.parent
    if not parent.exists() and not make_parent:
        raise UsageError(f"{name} {str(path)!r}: the folder {str(parent)!r} does not exist; "
                         f"create it (mkdir -p {parent}) or choose another path")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{name} {str(path)!r}: {str(parent)!r} is a file, not a folder; choose another path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _probe(parent)
    except OSError as exc:
        raise UsageError(f"{name} {str(path)!r}: cannot write in {str(parent)!r} ({exc.strerror or exc}); "
                         "choose a writable path") from None
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same file: ``os.path.samefile`` where both exist (hard and symbolic links,
    ``..``), else their resolved paths are equal.  An output equal to an input is refused with this."""
    a, b = Path(a).expanduser(), Path(b).expanduser()
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()
