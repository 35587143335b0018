"""Bad input to the demo (``python -m specdec_lesson``), to ``notebook.setup`` and to the benchmark's files and
paths: one clear line (or one ValueError) before any model is loaded or anything is set; Ctrl-C is one line too.
(The benchmark's flag-by-flag cases are in test_bench.py, the distill command line's in test_distill.py.)"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from specdec_lesson import __main__ as demo
from specdec_lesson.bench import tasks as T
from specdec_lesson.bench.__main__ import main as bench_main
from specdec_lesson.bench.runner import BenchSettings, load_results
from specdec_lesson.notebook import setup


def _no_loading(monkeypatch):
    def refuse():
        raise AssertionError("the models were loaded before the bad input was reported")

    monkeypatch.setattr(demo, "_load", refuse)


@pytest.mark.parametrize("argv, fragment", [
    (["--max-new-tokens", "100000"], "--max-new-tokens must be an integer in 1..4096, got 100000"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer in 1..4096, got 0"),
    (["--max-new-tokens", "ten"], "argument --max-new-tokens: invalid int value: 'ten'"),
    (["--temperature", "nan"], "--temperature must be a finite number, got nan"),
    (["--temperature", "inf"], "--temperature must be a finite number, got inf"),
    (["--temperature", "-1"], "--temperature must be >= 0.0, got -1.0"),
    (["--threads", "0"], "--threads must be an integer in 1.."),
    (["--threads", "-1"], "--threads must be an integer in 1.."),
    (["--threads", "1000000"], "--threads must be an integer in 1.."),
    (["--k", "0"], "--k must be an integer in 1..64, got 0"),
    (["--k", "100000"], "--k must be an integer in 1..64, got 100000"),
    (["--seed", "-1"], "--seed must be an integer >= 0 (below 2**63), got -1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_demo_bad_input_is_one_line_before_loading(capsys, monkeypatch, argv, fragment):
    _no_loading(monkeypatch)
    threads = torch.get_num_threads()
    rc = demo.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("python -m specdec_lesson: error:") and fragment in lines[0], lines
    assert torch.get_num_threads() == threads


def _error_lines(err: str) -> list[str]:
    """stderr without the demo's progress lines (``[specdec] loading ...``): those say what a long step is doing,
    the rest must be the one error line."""
    return [line for line in err.strip().splitlines() if not line.startswith("[specdec] ")]


def test_demo_read_only_cache_is_one_line(capsys, monkeypatch, tmp_path):
    """The cache cannot be made (here: SPECDEC_CACHE under a file; a read-only mount raises PermissionError):
    one line saying to set SPECDEC_CACHE, before the conversion starts."""
    from specdec_lesson import models

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "afile" / "cache"))
    monkeypatch.setattr(models, "_gguf_dir", lambda: tmp_path)
    rc = demo.main(["--max-new-tokens", "2"])
    lines = _error_lines(capsys.readouterr().err)
    assert rc == 1 and len(lines) == 1 and "is not writable" in lines[0] and "set SPECDEC_CACHE" in lines[0], lines

    def denied():
        raise PermissionError(13, "Permission denied", "/ro/cache/x")

    monkeypatch.setattr(demo, "_load", denied)
    rc = demo.main(["--max-new-tokens", "2"])
    lines = _error_lines(capsys.readouterr().err)
    assert rc == 1 and len(lines) == 1 and "Permission denied" in lines[0], lines


def test_damaged_draft_file_is_one_line(capsys, monkeypatch):
    """A damaged shipped draft raises safetensors' own error (not a RuntimeError): the demo used to show a
    traceback, the benchmark's loader crashed instead of noting that the draft-based methods cannot run."""
    from safetensors import SafetensorError

    from specdec_lesson.bench.loading import _default_draft
    from specdec_lesson.drafters import eagle

    def damaged(*a, **k):
        raise SafetensorError("Error while deserializing header: HeaderTooLarge")

    monkeypatch.setattr(demo, "_load", damaged)
    assert demo.main(["--max-new-tokens", "2"]) == 1
    lines = _error_lines(capsys.readouterr().err)
    assert lines == ["python -m specdec_lesson: error: cannot load the default pair: SafetensorError: Error while "
                     "deserializing header: HeaderTooLarge"]
    monkeypatch.setattr(eagle, "load_default_draft", damaged)
    notes: list = []
    assert _default_draft(None, notes) == (None, None) and "SafetensorError: Error while deserializing" in notes[0]


def test_demo_ctrl_c_is_one_line(capsys, monkeypatch):
    def interrupt():
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_load", interrupt)
    assert demo.main(["--max-new-tokens", "2"]) == 130
    assert _error_lines(capsys.readouterr().err) == ["python -m specdec_lesson: interrupted"]


def test_demo_threads_flag_is_applied(capsys, monkeypatch):
    """``--threads 1`` used to be applied, ``--threads 0`` silently ignored; now 0 is an error and 1 is set."""
    seen = []

    def stop():
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_load", stop)
    before = torch.get_num_threads()
    try:
        assert demo.main(["--threads", "1"]) == 130 and seen == [1]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("module, argv, fragment", [
    ("specdec_lesson", ["--threads", "0"], "python -m specdec_lesson: error: --threads must be an integer in 1.."),
    ("specdec_lesson.distill", ["train", "--out", "{tmp}"], "python -m specdec_lesson.distill: error: no teacher data under"),
    ("specdec_lesson.bench", ["--task", ","], "specdec-bench: error: --task needs at least one value"),
])
def test_entry_points_print_one_line_and_exit_2(tmp_path, module, argv, fragment):
    proc = subprocess.run([sys.executable, "-m", module, *[a.format(tmp=tmp_path) for a in argv]], capture_output=True,
                          text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(fragment), proc.stderr


# ------------------------------------------------------------------------------------ notebook.setup
@pytest.mark.parametrize("kw, fragment", [
    ({"threads": 10**6}, "setup(threads=...) must be an integer in 1.."),
    ({"threads": 0}, "setup(threads=...) must be an integer in 1.."),
    ({"threads": "2"}, "setup(threads=...) must be an integer"),
    ({"threads": 2.0}, "setup(threads=...) must be an integer"),
    ({"seed": 1.5}, "setup(seed=...) must be an integer >= 0"),
    ({"seed": None}, "setup(seed=...) must be an integer >= 0"),
    ({"seed": -1}, "setup(seed=...) must be an integer >= 0 (below 2**63), got -1"),
    ({"seed": True}, "setup(seed=...) must be an integer"),
])
def test_setup_checks_before_acting(kw, fragment):
    """``threads=10**6`` used to crash the process at the next matmul; a bad seed failed after python's RNG was
    already reseeded.  Now nothing is set when an argument is bad."""
    state, torch_state, threads = random.getstate(), torch.random.get_rng_state(), torch.get_num_threads()
    with pytest.raises(ValueError) as info:
        setup(**kw)
    assert fragment in str(info.value)
    assert random.getstate() == state and torch.equal(torch.random.get_rng_state(), torch_state)
    assert torch.get_num_threads() == threads


def test_setup_good_arguments():
    threads, fmt = torch.get_num_threads(), warnings.formatwarning
    try:
        g = setup(seed=2**40, threads=1)  # above numpy's 2**32 limit: numpy gets it modulo 2**32
        assert torch.get_num_threads() == 1 and g.initial_seed() == 2**40
        assert setup(seed=0).initial_seed() == 0 and os.environ.get("TRITON_INTERPRET") in ("1", None)
    finally:
        torch.set_num_threads(threads)
        warnings.formatwarning = fmt


def test_setup_words_warnings_without_this_machines_paths():
    """A notebook's stored outputs must not carry the path of the machine that ran it: after setup, a warning is
    one line, its category and message (a fresh interpreter: pytest shows warnings its own way)."""
    code = ("import warnings\nfrom specdec_lesson.notebook import setup\nsetup(seed=0)\n"
            "warnings.warn('the probe was noisy', UserWarning, stacklevel=1)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "UserWarning: the probe was noisy\n", run.stderr


# ------------------------------------------------------------------------ benchmark: paths, files, Ctrl-C
def _bench_error(capsys, argv, fragment):
    rc = bench_main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("specdec-bench: error:") and fragment in lines[0], err


@pytest.mark.parametrize("argv, fragment", [
    (["--task", ","], "--task needs at least one value, got ','"),
    (["--method", ""], "--method needs at least one value, got ''"),
    (["--method", "ar,ar"], "--method lists 'ar' more than once"),
    (["--method", "chain,ar,chain"], "--method lists 'chain' more than once"),
    (["--k", "2,2"], "--k lists 2 more than once"),
    (["--task", "code,code"], "--task lists 'code' more than once"),
    (["--threads", "0"], "--threads must be an integer in 1.."),
    (["--threads", "1000000"], "--threads must be an integer in 1.."),
    (["--seed", "-1"], "--seed must be an integer >= 0 (below 2**63), got -1"),
    (["--limit", "-1"], "limit must be >= 1 (or not given: every prompt), got -1"),
    (["--warmup", "-1"], "warmup must be >= 0, got -1"),
    (["--html", "page.html"], "--html goes with --report"),
    (["--max-new-tokens", "100000", "--method", "ar"], "exceeds the target's context of 512 positions; use --max-new-tokens <= "),
    (["--target", "/nonexistent", "--draft", "/nonexistent"], "the target model folder '/nonexistent' does not exist"),
])
def test_bench_more_bad_flags(capsys, monkeypatch, tmp_path, argv, fragment):
    """Each used to run (pooling repeats, ignoring the flag), raise StopIteration, or segfault (--threads 10**6)."""
    monkeypatch.chdir(tmp_path)  # a case that wrongly ran would write its results here, not in the repository
    _bench_error(capsys, ["--pair", "tiny", "--no-progress", *argv], fragment)


def _minimal(**extra) -> dict:
    return {"format": "specdec-bench/1", "complete": True, "per_task": [], "labels": [], "pair": {}, "machine": {},
            "settings": {"max_new_tokens": 1, "temperature": 0.0, "repeats": 1}, **extra}


def _no_bench_loading(monkeypatch):
    from specdec_lesson.bench import runner

    def refuse(*a, **k):
        raise AssertionError("the models were loaded before the bad input was reported")

    monkeypatch.setattr(runner, "load_models", refuse)


def test_out_path_is_checked_before_any_model_is_loaded(tmp_path, capsys, monkeypatch):
    """A bad --out used to fail only after the whole run (every result lost), naming an internal temp file."""
    _no_bench_loading(monkeypatch)
    (tmp_path / "afile").write_text("x")
    base = ["--pair", "tiny", "--no-progress", "--out"]
    _bench_error(capsys, base + [str(tmp_path)], "is a folder; give a file path")
    _bench_error(capsys, base + [str(tmp_path / "missing" / "r.json")], "does not exist; create it (mkdir -p")
    _bench_error(capsys, base + [str(tmp_path / "afile" / "r.json")], "is a file, not a folder")
    assert not (tmp_path / "missing").exists()


def test_out_path_in_an_unwritable_folder(tmp_path, capsys, monkeypatch):
    import os
    import tempfile

    _no_bench_loading(monkeypatch)
    ro = Path("/sys")  # read-only even for root (sysfs); a chmod-ed folder would not stop root
    try:
        os.close(tempfile.mkstemp(dir=ro)[0])
        pytest.skip("/sys is writable here")
    except OSError:
        pass
    _bench_error(capsys, ["--pair", "tiny", "--no-progress", "--out", "/sys/r.json"], "cannot write in '/sys'")


def test_results_are_kept_when_the_final_write_fails(tmp_path, capsys, monkeypatch):
    from specdec_lesson.bench import runner

    real = runner.write_results
    out = tmp_path / "r.json"

    def disk_full(res, path):
        if Path(path) == out:
            raise OSError(28, "No space left on device")
        return real(res, path)

    monkeypatch.setattr(runner, "write_results", disk_full)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path / "spare"))
    (tmp_path / "spare").mkdir()
    rc = bench_main(["--pair", "tiny", "--task", "math", "--limit", "1", "--max-new-tokens", "2", "--repeats", "1",
                     "--method", "ar", "--warmup", "0", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0 and "could not write" in err and "No space left" in err
    assert load_results(tmp_path / "spare" / "r.json")["complete"]


@pytest.mark.parametrize("where", ["load", "warmup"])
def test_ctrl_c_before_measuring_is_one_line(tmp_path, capsys, monkeypatch, where):
    from specdec_lesson.bench import runner

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "load_models" if where == "load" else "_run_one", interrupt)
    rc = bench_main(["--pair", "tiny", "--limit", "1", "--max-new-tokens", "2", "--method", "ar",
                     "--out", str(tmp_path / "r.json"), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 130 and lines == ["specdec-bench: interrupted before any run was measured; nothing was written"]
    assert list(tmp_path.iterdir()) == []


def test_report_of_a_complete_file_without_per_task(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": "specdec-bench/1", "complete": True}))
    _bench_error(capsys, ["--report", str(path)], f"{path} is marked complete but has no 'per_task' list")
    path.write_text(json.dumps(_minimal(per_task=[{"task": "code"}])))
    _bench_error(capsys, ["--report", str(path)], "per_task row 0 lacks 'label'")


def test_load_prompts_folder_binary_and_repeated_ids(tmp_path):
    with pytest.raises(ValueError, match="is a folder; give a JSONL file"):
        T.load_prompts(tmp_path)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="bin.jsonl' is not UTF-8 text"):
        T.load_prompts(tmp_path / "bin.jsonl")
    (tmp_path / "dup.jsonl").write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    with pytest.raises(ValueError, match="dup.jsonl:2: id 'x' is used by an earlier line"):
        T.load_prompts(tmp_path / "dup.jsonl")
    (tmp_path / "blank.jsonl").write_text('{"prompt": "   "}\n')
    with pytest.raises(ValueError, match="blank.jsonl:1: expected a JSON object with a non-empty"):
        T.load_prompts(tmp_path / "blank.jsonl")


def test_settings_refuse_empty_lists_and_repeats():
    for kw, fragment in [({"tasks": []}, "tasks is empty"), ({"methods": ["ar", "ar"]}, "methods lists 'ar' more than once"),
                         ({"ks": [2, 2]}, "ks lists 2 more than once"), ({"tasks": ["math", "math"]}, "tasks lists 'math'")]:
        with pytest.raises(ValueError, match=fragment):
            BenchSettings(**kw).validate()
