"""The sandbox that runs model-written code for ``bench --check-code`` (HumanEval pass@1).

``check_code_reply(problem, reply)`` runs the reply's first Python block with the problem's tests in a
fresh process (``sandbox_child.py`` run as a script: standard library only, neither the package nor
torch is imported there) and counts it passed only when the tests ran to the end.  Layers, each where
the operating system allows it (``SandboxResult.protections`` names those applied; a warning, once, and
``missing_protections_note`` say which are missing):

* a new process session with a minimal environment (nothing inherited: no secrets), a private
  temporary working folder, HOME and TMPDIR, removed afterwards; stdin is /dev/null;
* new user, network and PID namespaces (unprivileged ``unshare``): no network at all, no capability
  outside the namespace even when the bench runs as root, and every process left dies with the check;
* a seccomp filter: no new processes (threads are fine) and no ``exec``, root included;
* Landlock (Linux >= 5.13): files are read only under Python's own folders and the system's library
  folders, written only in the private folder; TCP bind/connect refused; no signals to processes outside;
* resource limits: 1 GiB of address space, CPU time just above the timeout, 16 MiB per written file;
* before the reply's code runs (its own imports still work), ``os.system``, ``os.fork``, ``os.kill``, the
  ``exec``/``spawn`` family, file removal and renaming, ``shutil.rmtree``, ``subprocess.Popen``, ... are
  disabled, as HumanEval's ``reliability_guard`` does;
* output capped: stdout and stderr go to a file; ``print`` keeps the first 64 KiB and drops the rest, a
  raw write stops at the file-size limit, the bench reads at most 64 KiB;
* at the end, success included, the whole process group is killed before the exit is reaped.

pass@1: the parent hands the child a random nonce through a pipe that the wrapper reads and closes
before the reply's code runs; the wrapper writes it back on another pipe only after ``check(...)``
returned.  An early ``sys.exit(0)``/``os._exit(0)``, a crash or a kill leaves no nonce: not passed.
Residual risk: the reply's code runs in the wrapper's own interpreter, so code written to cheat can
still dig the nonce out of memory (``gc``, frames) and forge a pass, or monkeypatch what the tests use;
this guards against accidents and sloppy code, not against an adversary.  Where a layer is missing (no
namespaces: the network is reachable; no seccomp: a process that calls setsid can outlive the check; no
Landlock: every file the user may read or write is reachable) the code runs with more of the user's
rights.  Even with every layer this is not a hardened sandbox (kernel bugs, side channels, CPU and
memory shared with the bench): run ``--check-code`` on a machine you can afford to lose, or in a VM.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache

from .sandbox_child import OUTPUT_KEEP, PROTECTIONS

__all__ = ["SandboxResult", "check_code_reply", "missing_protections_note", "reply_program", "run_reply"]

_warned = False


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # the tests ran to the end: the wrapper's nonce came back and the process exited 0 in time
    reason: str  # "passed", "timed out after 2 s", "exited before the tests finished", "AssertionError", ...
    timed_out: bool = False
    returncode: int | None = None
    output: str = ""  # the first OUTPUT_KEEP bytes of stdout + stderr
    output_truncated: bool = False
    protections: tuple[str, ...] = ()  # the layers of PROTECTIONS applied (the child's own report)


def reply_program(problem: dict, reply: str) -> str:
    """The reply's first Python code block (or the whole reply), after the prompt when it lacks the
    entry point's ``def``, followed by the problem's tests (``check`` is called by the wrapper)."""
    import re

    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", reply, flags=re.DOTALL)
    code = blocks[0] if blocks else reply
    if f"def {problem['entry_point']}" not in code:
        code = problem["prompt"] + code
    return f"{code}\n\n{problem['test']}\n"


def check_code_reply(problem: dict, reply: str, timeout: float = 10.0) -> bool:
    """HumanEval pass@1 for one reply, run in the sandbox (module docstring).  This executes model-written
    code: it is opt-in (``--check-code``)."""
    return run_reply(problem, reply, timeout).passed


def run_reply(problem: dict, reply: str, timeout: float = 10.0) -> SandboxResult:
    """``check_code_reply`` with the details: why it failed, output, the protections applied."""
    root = tempfile.mkdtemp(prefix="specdec-sandbox-")
    try:
        return _run(reply_program(problem, reply), problem["entry_point"], timeout, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@lru_cache(maxsize=1)
def missing_protections_note() -> str | None:
    """One line for the results' notes naming the sandbox layers this machine lacks (None: all applied)."""
    probe = {"prompt": "", "entry_point": "f", "test": "def check(candidate):\n    assert candidate() == 1\n"}
    return _note(run_reply(probe, "def f():\n    return 1\n", timeout=30.0).protections)


def _note(protections: tuple[str, ...]) -> str | None:
    missing = [p for p in PROTECTIONS if p not in protections]
    if not missing:
        return None
    net = "" if "network-namespace" in protections else "; without a network namespace the code can reach the network"
    return (f"--check-code ran model code without these sandbox layers, which this machine refused: {', '.join(missing)}"
            f"{net} (specdec_lesson/bench/sandbox.py)")


def _run(program: str, entry_point: str, timeout: float, root: str) -> SandboxResult:
    work = os.path.join(root, "work")
    for sub in ("work", "home", "tmp"):
        os.mkdir(os.path.join(root, sub))
    with open(os.path.join(root, "check.py"), "w") as f:
        f.write(program)
    nonce = secrets.token_hex(16).encode()
    nonce_r, nonce_w = os.pipe()
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    result_r, result_w = os.pipe()
    env = {"PATH": "/usr/bin:/bin", "HOME": os.path.join(root, "home"), "TMPDIR": os.path.join(root, "tmp"),
           "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
    cmd = [sys.executable, "-I", child, str(nonce_r), str(result_w), root, entry_point, str(int(timeout) + 1)]
    try:
        with open(os.path.join(root, "output"), "wb+") as out:
            try:
                proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        pass_fds=(nonce_r, result_w), start_new_session=True)
            finally:
                os.close(nonce_r)
                os.close(result_w)
            try:
                exited = _wait_unreaped(proc.pid, timeout)
            finally:  # the whole group, success included, while the exited leader still holds its id
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            size = os.fstat(out.fileno()).st_size
            out.seek(0)
            output = out.read(OUTPUT_KEEP).decode("utf-8", "replace")
        os.set_blocking(result_r, False)
        try:
            lines = os.read(result_r, 4096).split(b"\n")
        except BlockingIOError:
            lines = []
    finally:
        os.close(result_r)
    global _warned
    report = next((x[2:].decode() for x in lines if x.startswith(b"P ")), None)  # None: the child died before it
    protections = tuple(p for p in (report or "").split(",") if p)
    if report is not None and "network-namespace" not in protections and not _warned:
        _warned = True
        warnings.warn(_note(protections), RuntimeWarning, stacklevel=3)
    rc = proc.returncode
    passed = exited and rc == 0 and b"N " + nonce in lines
    if passed:
        reason = "passed"
    elif not exited:
        reason = f"timed out after {timeout:g} s"
    elif rc == 0:
        reason = "exited before the tests finished (no completion marker)"
    elif rc < 0 or rc > 128:
        sig = -rc if rc < 0 else rc - 128
        reason = f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig} (a resource limit?)"
    else:
        reason = next((x[2:].decode("utf-8", "replace") for x in lines if x.startswith(b"F ")), f"exit code {rc}")
    return SandboxResult(passed, reason, not exited, rc, output, size > OUTPUT_KEEP, protections)


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the child to exit without reaping it (its id stays taken): True if it did."""
    deadline, delay = time.monotonic() + timeout, 0.001
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(2 * delay, 0.02)
    return True
