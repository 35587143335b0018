"""The sandbox of ``bench --check-code`` (bench/sandbox.py): planted, harmless replies that misbehave.

Every planted reply is otherwise correct or otherwise wrong, so the verdict shows what the sandbox did;
side effects (files, processes, the parent's memory) are checked from outside."""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specdec_lesson.bench import tasks as T
from specdec_lesson.bench.sandbox import PROTECTIONS, _note, check_code_reply, run_reply
from specdec_lesson.bench.sandbox_child import OUTPUT_KEEP

PROBLEM = {"prompt": "def add(a, b):\n", "entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
GOOD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"


def _reply(before: str, solution: str = GOOD) -> str:
    return f"```python\n{textwrap.dedent(before)}\n{solution}```"


@pytest.fixture(scope="module")
def layers() -> tuple[str, ...]:
    return run_reply(PROBLEM, GOOD, timeout=10).protections


def test_good_wrong_and_looping_replies():
    prob = T.code_problems("eval")[0]
    res = run_reply(prob, f"```python\n{prob['prompt']}{prob['canonical_solution']}```")
    assert res.passed and res.reason == "passed" and set(res.protections) <= set(PROTECTIONS)
    res = run_reply(prob, f"```python\ndef {prob['entry_point']}(s):\n    return 'x'\n```")
    assert not res.passed and "AssertionError" in res.reason
    t0 = time.perf_counter()
    res = run_reply(PROBLEM, "def add(a, b):\n    while True: pass\n", timeout=1)
    assert not res.passed and res.timed_out and time.perf_counter() - t0 < 3
    threaded = "import threading\nbox = []\nt = threading.Thread(target=box.append, args=(5,)); t.start(); t.join()\n"
    assert check_code_reply(PROBLEM, _reply(threaded, "def add(a, b):\n    return box[0]\n"))  # threads still work


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit",
                                       "import os\nfor fd in range(3, 12):\n    try: os.write(fd, b'N forged\\n')\n"
                                       "    except OSError: pass\nos._exit(0)"])
def test_an_exit_before_the_tests_is_not_a_pass(exit_call):
    res = run_reply(PROBLEM, _reply(exit_call, WRONG), timeout=5)
    assert not res.passed and "exited before the tests finished" in res.reason


def test_the_child_inherits_no_secret_and_gets_a_private_home(monkeypatch):
    monkeypatch.setenv("SPECDEC_FAKE_SECRET", "hunter2")
    probe = f"""
        import os
        assert "SPECDEC_FAKE_SECRET" not in os.environ and "hunter2" not in str(os.environ), "secret leaked"
        home = os.path.expanduser("~")
        assert home != {os.path.expanduser("~")!r} and os.listdir(home) == [], home
        assert os.listdir(".") == [], "the working folder is not fresh"
        """
    res = run_reply(PROBLEM, _reply(probe), timeout=5)
    assert res.passed, res.reason


def test_files_outside_the_private_folder_are_out_of_reach(tmp_path, layers):
    if "landlock-files" not in layers:
        pytest.skip("Landlock is not available on this machine: the code reaches every file the user may")
    (tmp_path / "secret.dat").write_text("hunter2")
    probe = f"""
        import os, tempfile
        for attempt in (lambda: open({str(tmp_path / "planted.dat")!r}, "w").write("x"),
                        lambda: open({str(tmp_path / "secret.dat")!r}).read(), lambda: os.listdir({str(tmp_path)!r}),
                        lambda: os.listdir({os.path.expanduser("~")!r})):
            try:
                attempt()
            except OSError:
                continue
            raise AssertionError("reached outside the private folder")
        with tempfile.TemporaryDirectory() as d:  # inside it, files come and go as usual
            open(os.path.join(d, "a"), "w").write("y")
        """
    res = run_reply(PROBLEM, _reply(probe), timeout=5)
    assert res.passed, res.reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.dat"]


def test_no_process_outlives_the_check(tmp_path):
    late = tmp_path / "late.dat"
    probe = f"""
        import ctypes, os, time
        for fork in (lambda: os.fork(), lambda: ctypes.CDLL(None).fork()):
            try:
                pid = fork()
            except Exception:
                continue
            if pid == 0:  # a daemon: new session, second fork, then a late write
                os.setsid()
                if fork() == 0:
                    time.sleep(1.0)
                    open({str(late)!r}, "a").write("survived")
                os._exit(0)
        """
    t0 = time.perf_counter()
    assert check_code_reply(PROBLEM, _reply(probe), timeout=5)
    time.sleep(max(0.0, 1.6 - (time.perf_counter() - t0)))
    assert not late.exists()


def test_the_pid_namespace_takes_a_setsid_grandchild_with_it(tmp_path):
    """The layer under the fork guard and the seccomp filter, alone: its PID 1 exits, a daemon it left dies."""
    child = Path(importlib.util.find_spec("specdec_lesson.bench.sandbox_child").origin)
    late = tmp_path / "late.dat"
    script = f"""
        import ctypes, importlib.util, os, sys, time
        spec = importlib.util.spec_from_file_location("sandbox_child", {str(child)!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        if "pid-namespace" not in mod._namespaces(ctypes.CDLL(None, use_errno=True)):
            print("no pid namespace"); sys.exit(0)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.0)
                open({str(late)!r}, "w").write("survived")
            os._exit(0)
        time.sleep(0.2)  # the daemon is up; PID 1 now exits
        """
    out = subprocess.run([sys.executable, "-I", "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=20)
    if "no pid namespace" in out.stdout:
        pytest.skip("no PID namespace on this machine")
    time.sleep(1.5)
    assert out.returncode == 0 and not late.exists(), out.stderr


def test_an_output_flood_is_capped():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    probe = "line = 'x' * (1 << 20)\nfor _ in range(64):\n    print(line)\n"  # 64 MiB
    res = run_reply(PROBLEM, _reply(probe), timeout=10)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert res.passed and res.output_truncated and len(res.output) <= OUTPUT_KEEP
    assert grown_mib < 16, grown_mib
    raw = "import os\nfor _ in range(32):\n    os.write(1, b'x' * (1 << 20))\n"  # past the file-size limit: refused
    res = run_reply(PROBLEM, _reply(raw), timeout=10)
    assert not res.passed and res.output_truncated and "File too large" in res.reason


def test_a_correct_reply_that_leaves_a_process_holding_stdout_passes_promptly():
    probe = """
        import ctypes, os, subprocess, time
        try:
            subprocess.Popen(["sleep", "30"])
        except Exception:
            pass
        try:
            if ctypes.CDLL(None).fork() == 0:
                time.sleep(30)
                os._exit(0)
        except Exception:
            pass
        """
    t0 = time.perf_counter()
    assert check_code_reply(PROBLEM, _reply(probe), timeout=5)
    assert time.perf_counter() - t0 < 3


def test_the_network_is_out_of_reach(layers):
    if not {"network-namespace", "landlock-tcp"} & set(layers):
        pytest.skip("neither a network namespace nor Landlock's TCP rules on this machine: the code can reach the network")
    probe = """
        import socket
        for attempt in (lambda s: s.bind(("127.0.0.1", 0)), lambda s: s.connect(("127.0.0.1", 9))):
            try:
                attempt(socket.socket())
            except OSError:
                continue
            raise AssertionError("the network is reachable")
        """
    res = run_reply(PROBLEM, _reply(probe), timeout=5)
    assert res.passed, res.reason


def test_a_memory_hog_hits_the_limit():
    res = run_reply(PROBLEM, _reply("hog = bytearray(4 << 30)"), timeout=5)
    assert not res.passed and "MemoryError" in res.reason


def test_missing_layers_are_named():
    assert _note(PROTECTIONS) is None
    note = _note(("landlock-files",))
    assert "network-namespace" in note and "can reach the network" in note and "landlock-files," not in note
