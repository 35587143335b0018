"""The run journal: the checkpoint of a running benchmark (``python -m specdec_lesson.bench``).

``RunJournal`` (``<out>.partial.jsonl`` beside the results path) is created exclusively (``O_CREAT | O_EXCL``)
before the models are loaded, so a second run with the same ``--out`` fails at once instead of overwriting the
first one's results; every measured run is appended to it as one JSON line, flushed and fsynced as the run
finishes, so that even a SIGKILL (an out-of-memory kill) keeps the finished runs (``read_journal`` reads them
back).  The complete results file is written at the end and the journal removed.

``sigterm_as_interrupt`` turns SIGTERM (kill, timeout, a scheduler) into a ``KeyboardInterrupt`` while the command
line runs, so it saves the runs like Ctrl-C; ``free_name`` gives a partial file a name no earlier one has.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path

from .results import JOURNAL_FORMAT, _clean

__all__ = ["RunJournal", "journal_path", "read_journal", "free_name", "sigterm_as_interrupt", "Terminated"]


def journal_path(out: str | Path) -> Path:
    """The journal of a run writing ``out``: ``<out without .json>.partial.jsonl`` beside it."""
    out = Path(out)
    return out.with_name((out.stem if out.suffix == ".json" else out.name) + ".partial.jsonl")


def _alive(pid, host) -> bool:
    """Whether the process that wrote a journal may still run (another machine's process: assumed so)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user
        return True
    return True


def read_journal(path: str | Path) -> dict:
    """The runs of a journal as a results dict marked incomplete (``complete`` false, ``interrupted`` true), with
    ``owner`` (pid, host, start time, out) and the run's header when it was written; a torn last line (the process
    was killed while writing it) is skipped.  ValueError if ``path`` is not a journal."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a readable run journal ({exc})") from None
    objs = []
    for i, line in enumerate(lines):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # the line being written when the process died
            raise ValueError(f"{path}:{i + 1} is not valid JSON: a damaged run journal") from None
    if not objs or not isinstance(objs[0], dict) or objs[0].get("journal") != JOURNAL_FORMAT:
        raise ValueError(f"{path} is not a {JOURNAL_FORMAT} run journal")
    header = next((o["header"] for o in objs[1:2] if isinstance(o, dict) and "header" in o), {})
    runs = [o["run"] for o in objs if isinstance(o, dict) and "run" in o]
    return dict(header, complete=False, interrupted=True, runs=runs, owner=objs[0])


class RunJournal:
    """The checkpoint of one running benchmark: ``<out>.partial.jsonl``, created exclusively (its existence
    reserves ``out``), then one JSON line per measured run, each flushed and fsynced as the run finishes.

    Line 1: ``{"journal": JOURNAL_FORMAT, "out", "pid", "host", "started"}``; line 2: ``{"header": ...}`` (the
    results file's settings, labels, machine); then ``{"run": ...}`` per run (a snapshot: the first repeat's
    records still carry their ``tokens``, and no ``equal_ar`` yet)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd, self.count = path, fd, 0

    @classmethod
    def create(cls, out: str | Path) -> RunJournal:
        """Create the journal of ``out`` exclusively; FileExistsError if it exists (another run, or a killed one)."""
        out = Path(out)
        path = journal_path(out)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        journal = cls(path, fd)
        try:
            journal._write({"journal": JOURNAL_FORMAT, "out": str(out), "pid": os.getpid(), "host": socket.gethostname(),
                            "started": datetime.now(UTC).isoformat(timespec="microseconds")})
        except BaseException:
            journal.discard()
            raise
        return journal

    @classmethod
    def reserve(cls, out: str | Path, *, force: bool = False, flag: str = "--out") -> RunJournal:
        """``create``, with one UsageError naming the fix when ``out`` is taken: a run writing it now, the journal
        of a killed run holding measured runs, or (without ``force``) a finished file already there.  A journal of
        a dead process that holds no run (killed while loading) is replaced."""
        from ..cli_args import UsageError

        out = Path(out)
        for attempt in range(2):
            try:
                journal = cls.create(out)
                break
            except FileExistsError:
                path = journal_path(out)
                try:
                    old = read_journal(path)
                except (ValueError, OSError):
                    old = None
                owner = (old or {}).get("owner", {})
                if old is None or _alive(owner.get("pid"), owner.get("host")):
                    who = f" (pid {owner['pid']} on {owner.get('host')})" if old is not None else ""
                    raise UsageError(f"another benchmark run{who} is writing {out}: its journal {path} exists; choose "
                                     f"another {flag}, or wait for that run to finish") from None
                if old["runs"] or attempt:
                    raise UsageError(f"{path} holds the {len(old['runs'])} measured runs of a run of {out} that was "
                                     f"killed (pid {owner.get('pid')}); move it away to keep them (or delete it), or "
                                     f"choose another {flag}") from None
                path.unlink(missing_ok=True)  # killed before measuring anything: nothing to keep
        if out.exists() and not force:
            journal.discard()
            raise UsageError(f"{flag} {out} exists (a finished results file?); add --force to overwrite it, or choose "
                             f"another {flag}")
        return journal

    @classmethod
    def reserve_free(cls, out: Path) -> tuple[Path, RunJournal]:
        """A default results name: ``out``, or ``<stem>-2.json``, ``-3``, ... the first whose results file and
        journal are both free, with its journal created exclusively (two runs never get the same name)."""
        for n in range(1, 1000):
            cand = out if n == 1 else out.with_name(f"{out.stem}-{n}{out.suffix}")
            if cand.exists() or journal_path(cand).exists():
                continue
            try:
                return cand, cls.create(cand)
            except FileExistsError:
                continue
        from ..cli_args import UsageError

        raise UsageError(f"no free results name {out.with_name(out.stem)}-N{out.suffix}; choose one with --out")

    def _write(self, obj: dict) -> None:
        data = (json.dumps(_clean(obj), allow_nan=False) + "\n").encode()
        while data:
            data = data[os.write(self._fd, data):]
        os.fsync(self._fd)

    def start(self, header: dict) -> None:
        """Record the run's header (settings, labels, pair, machine)."""
        self._write({"header": {k: v for k, v in header.items() if k != "runs"}})

    def add(self, run: dict) -> None:
        """Append one measured run, on disk before this returns."""
        self._write({"run": run})
        self.count += 1

    def close(self) -> None:
        """Close the journal, keeping the file (the runs it holds are not saved elsewhere)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Close and remove the journal (the results were written, or nothing was measured)."""
        self.close()
        self.path.unlink(missing_ok=True)


def free_name(path: Path) -> Path:
    """``path``, or ``<stem>-2<suffix>``, ``-3``, ... the first that does not exist: a partial file never replaces
    the partial file of an earlier interrupted run."""
    n, cand = 1, path
    while cand.exists():
        n += 1
        cand = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return cand


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C (so the runs measured so far are saved)."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside: the first SIGTERM raises ``Terminated`` (later ones are ignored while the results are saved);
    yields the list of signals received.  The previous handler is restored on exit."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
