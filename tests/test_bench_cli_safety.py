"""The benchmark command line never loses or overwrites work: the HTML report never replaces a results file, the
results never replace the prompts, a second run with the same --out fails at once, an existing results file needs
--force, SIGTERM keeps the measured runs like Ctrl-C, a killed run's runs survive in its journal, and conflicting or
late-checked flags are refused before any model is loaded (each case failed, or lost data, before its fix)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from specdec_lesson.bench.__main__ import main
from specdec_lesson.bench.journal import journal_path, read_journal
from specdec_lesson.bench.runner import load_results, write_results

TINY = ["--pair", "tiny", "--task", "math", "--limit", "1", "--max-new-tokens", "2", "--method", "ar,chain", "--k", "2",
        "--warmup", "0", "--no-progress"]  # 2 repeats x 2 labels = 4 runs with --repeats 2


def _error(capsys, argv, fragment) -> str:
    rc = main([str(x) for x in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("specdec-bench: error:") and fragment in lines[0], err
    return lines[0]


@pytest.fixture
def no_loading(monkeypatch):
    """The models must not be loaded: every case here is refused first."""
    from specdec_lesson.bench import runner

    def refuse(*a, **k):
        raise AssertionError("the models were loaded before the bad input was reported")

    monkeypatch.setattr(runner, "load_models", refuse)


def _complete(**extra) -> dict:
    row = {"task": "math", "label": "ar", "prompts": 1, "tokens_per_s": 10.0, "speedup": 1.0, "speedup_median": 1.0,
           "speedup_ci": [1.0, 1.0], "alpha": None, "tau": None, "target_forwards_per_token": 1.0, "accuracy": None,
           "pass_at_1": None, "equal_ar_rate": 1.0}
    return {"format": "specdec-bench/1", "complete": True, "per_task": [dict(row, **extra)], "labels": [{"label": "ar"}],
            "pair": {}, "machine": {}, "settings": {"max_new_tokens": 1, "temperature": 0.0, "repeats": 1}}


# --------------------------------------------------------------------------------------- the report
def test_report_html_never_replaces_a_results_file(tmp_path, capsys):
    res = tmp_path / "r.json"
    write_results(_complete(), res)
    before = res.read_bytes()
    _error(capsys, ["--report", res, "--html", res], "is the results file itself")
    (tmp_path / "sub").mkdir()
    _error(capsys, ["--report", res, "--html", tmp_path / "sub" / ".." / "r.json"], "is the results file itself")
    (tmp_path / "link.json").symlink_to(res)
    _error(capsys, ["--report", res, "--html", tmp_path / "link.json"], "is the results file itself")
    other = tmp_path / "other.json"
    write_results(_complete(), other)
    _error(capsys, ["--report", res, "--html", other], "is a benchmark results file")
    assert res.read_bytes() == before and load_results(other)["complete"]
    assert main(["--report", str(res)]) == 0 and (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def test_write_html_is_atomic(tmp_path, monkeypatch):
    """An interruption while the page is written leaves the old page whole and no temporary file."""
    from specdec_lesson.bench import report

    page = tmp_path / "r.html"
    page.write_text("old page")
    res = load_results(write_results(_complete(), tmp_path / "r.json"))

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_html(res, page)
    assert page.read_text() == "old page" and sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]


@pytest.mark.parametrize("change, field", [
    ({"speedup_ci": [1.2]}, "field 'speedup_ci' must be a [low, high] pair of numbers"),
    ({"speedup": "fast"}, "field 'speedup' must be a number or null, got 'fast'"),
    ({"prompts": None}, "field 'prompts' must be an integer"),
    ({"label": 3}, "field 'label' must be a string"),
])
def test_report_of_a_hand_edited_file_names_file_and_field(tmp_path, capsys, change, field):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_complete(**change)))
    line = _error(capsys, ["--report", path], field)
    assert str(path) in line and "per_task row 0" in line


def test_report_refuses_a_run_journal(tmp_path, capsys):
    path = tmp_path / "r.partial.jsonl"
    path.write_text('{"journal": "specdec-bench-journal/1", "pid": 1}\n')
    _error(capsys, ["--report", path], "is the run journal of an unfinished or killed benchmark run")


# ------------------------------------------------------------------------------------ the results path
def test_out_is_never_the_prompts_file(tmp_path, capsys, no_loading):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    _error(capsys, ["--pair", "tiny", "--prompts", prompts, "--out", prompts], "is the --prompts file")
    _error(capsys, ["--pair", "tiny", "--prompts", prompts, "--out", tmp_path / "." / "p.jsonl", "--force"],
           "is the --prompts file")
    assert prompts.read_text() == '{"prompt": "hello"}\n' and sorted(os.listdir(tmp_path)) == ["p.jsonl"]


def test_existing_results_need_force(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    _error(capsys, [*TINY, "--repeats", "1", "--out", out], "exists (a finished results file?); add --force")
    assert out.read_text() == "{}" and not journal_path(out).exists()
    assert main([*TINY, "--repeats", "1", "--out", str(out), "--force"]) == 0
    assert len(load_results(out)["runs"]) == 2 and not journal_path(out).exists()


def test_a_second_run_with_the_same_out_fails_at_once(tmp_path, capsys, monkeypatch):
    from specdec_lesson.bench import runner

    out = tmp_path / "r.json"
    real, inner = runner._run_one, []

    def run_one(*a, **k):
        if not inner:  # while the first run measures, a second one starts with the same --out
            inner.append(main([*TINY, "--repeats", "1", "--out", str(out), "--force"]))
            inner.append(capsys.readouterr().err)
        return real(*a, **k)

    monkeypatch.setattr(runner, "_run_one", run_one)
    assert main([*TINY, "--repeats", "1", "--out", str(out)]) == 0
    assert inner[0] == 2 and f"is writing {out}: its journal" in inner[1] and "choose another --out" in inner[1]
    assert len(load_results(out)["runs"]) == 2 and sorted(os.listdir(tmp_path)) == ["r.json"]


def test_default_names_of_runs_started_together_differ(tmp_path, capsys, monkeypatch):
    from datetime import UTC, datetime

    from specdec_lesson.bench import __main__ as cli

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

    monkeypatch.setattr(cli, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    argv = ["--pair", "tiny", "--task", "math", "--limit", "1", "--max-new-tokens", "2", "--method", "ar", "--repeats",
            "1", "--warmup", "0", "--no-progress"]
    assert main(argv) == 0 and main(argv) == 0
    names = sorted(os.listdir(tmp_path / "benchmarks" / "results"))
    assert names == ["bench_tiny_20260102T030405_678901Z-2.json", "bench_tiny_20260102T030405_678901Z.json"]


def test_pair_is_checked_before_any_path_is_made(tmp_path, capsys, monkeypatch, no_loading):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    escape = "/".join(["x", *[".."] * 4, "dir", "y"])  # four ".." hops: spelt out so no file seems to name a path
    _error(capsys, ["--pair", escape, "--no-progress"], f"unknown pair '{escape}'")
    assert os.listdir(cwd) == [] and sorted(os.listdir(tmp_path)) == ["cwd"]


# ------------------------------------------------------------------------------- signals and kills
def test_sigterm_keeps_the_measured_runs_like_ctrl_c(tmp_path, capsys, monkeypatch):
    from specdec_lesson.bench import runner

    class Killed(Exception):
        pass

    def ours(signum, frame):  # stands in for the default action (ending the test process) if main installs none
        raise Killed

    real, calls = runner._run_one, []

    def run_one(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(runner, "_run_one", run_one)
    out = tmp_path / "r.json"
    old = signal.signal(signal.SIGTERM, ours)
    try:
        rc = main([*TINY, "--repeats", "2", "--out", str(out)])
        assert signal.getsignal(signal.SIGTERM) is ours  # restored
    finally:
        signal.signal(signal.SIGTERM, old)
    lines = capsys.readouterr().err.strip().splitlines()
    partial = tmp_path / "r.partial.json"
    assert rc == 143 and lines == [f"specdec-bench: terminated (SIGTERM); 2 runs kept in {partial} (marked incomplete)"]
    assert sorted(os.listdir(tmp_path)) == ["r.partial.json"]  # no journal left, no results file
    assert len(json.loads(partial.read_text())["runs"]) == 2
    with pytest.raises(ValueError, match="interrupted"):
        load_results(partial)
    # a second interrupted run never replaces the first one's partial file
    calls.clear()
    signal.signal(signal.SIGTERM, ours)
    try:
        assert main([*TINY, "--repeats", "2", "--out", str(out)]) == 143
    finally:
        signal.signal(signal.SIGTERM, old)
    assert sorted(os.listdir(tmp_path)) == ["r.partial-2.json", "r.partial.json"]


def test_a_killed_run_keeps_its_runs_in_the_journal(tmp_path, capsys, monkeypatch):
    """SIGKILL (an out-of-memory kill) runs no handler: the runs finished before it are on disk all the same."""
    from specdec_lesson.bench import runner

    out = tmp_path / "r.json"
    real, calls = runner._run_one, []

    def run_one(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)

    monkeypatch.setattr(runner, "_run_one", run_one)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            main([*TINY, "--repeats", "2", "--out", str(out)])
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    kept = read_journal(journal_path(out))
    assert len(kept["runs"]) == 3 and kept["owner"]["pid"] == pid and kept["settings"]["ks"] == [2]
    assert not out.exists()
    line = _error(capsys, [*TINY, "--out", out], "holds the 3 measured runs of a run of")
    assert "that was killed" in line and "move it away to keep them" in line
    assert len(read_journal(journal_path(out))["runs"]) == 3  # still there


def test_an_error_mid_run_keeps_the_runs(tmp_path, capsys, monkeypatch):
    from specdec_lesson.bench import runner

    real, calls = runner._run_one, []

    def run_one(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA out of memory")
        return real(*a, **k)

    monkeypatch.setattr(runner, "_run_one", run_one)
    out = tmp_path / "r.json"
    _error(capsys, [*TINY, "--repeats", "2", "--out", out],
           f"CUDA out of memory; the 2 runs measured so far are kept in {journal_path(out)}")
    assert len(read_journal(journal_path(out))["runs"]) == 2


# ---------------------------------------------------------------------- flags refused before loading
@pytest.mark.parametrize("argv, fragment", [
    (["--top-k", "5"], "--top-k shapes sampling, and --temperature 0 decodes greedily"),
    (["--temperature", "0", "--top-p", "0.9"], "--top-p shapes sampling"),
    (["--k", "1,2,4", "--method", "ar,tree"], "--k 1,2,4 sets the drafts per step of the K methods"),
    (["--k", "auto", "--method", "ar,tree"], "--k auto sets the drafts per step"),
    (["--k", "4", "--method", "ar,hf"], "none of ar,hf is one: drop --k"),
    (["--target-device-map", "auto"], "--target-device-map shards a large target"),
])
def test_conflicting_flags_are_refused_before_loading(capsys, no_loading, tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    _error(capsys, ["--pair", "tiny", "--no-progress", *argv], fragment)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv", [["--method", "ar,vllm"], ["--method", "vllm-ngram", "--engine", "native"]])
def test_the_vllm_venv_is_checked_before_loading(tmp_path, capsys, monkeypatch, no_loading, argv):
    """A vLLM method without the vLLM venv used to be refused only after the models' load and timing probe."""
    monkeypatch.setenv("SPECDEC_VLLM_PYTHON", str(tmp_path / "nope" / "bin" / "python"))
    _error(capsys, ["--pair", "tiny", "--no-progress", "--out", tmp_path / "r.json", *argv], "setup_vllm.sh")
    assert sorted(os.listdir(tmp_path)) == []


def _save_tiny(folder: Path) -> str:
    """A tiny target (context 512) with a whitespace word tokenizer, saved like a hub model."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specdec_lesson.models import tiny_llama

    tiny_llama(vocab_size=64, seed=0, dtype=torch.float32).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(folder)
    return str(folder)


def test_a_prompt_longer_than_the_context_is_refused_before_loading(tmp_path, capsys, no_loading):
    path = _save_tiny(tmp_path / "tiny")
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": " ".join(["t1"] * 600), "id": "long"}) + "\n")
    _error(capsys, ["--target", path, "--draft", path, "--prompts", prompts, "--method", "ar", "--out",
                    tmp_path / "r.json"], "prompt 'long' (prompts) has 600 tokens")
    assert not (tmp_path / "r.json").exists() and not journal_path(tmp_path / "r.json").exists()


def test_a_long_prompt_for_the_default_pair_is_refused_before_loading(tmp_path, capsys, no_loading):
    from specdec_lesson.models import default_target_cache_dir

    if not (default_target_cache_dir() / "config.json").is_file():
        pytest.skip("the default target is not converted yet (its first load converts it)")
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "word " * 9000, "id": "long"}) + "\n")
    _error(capsys, ["--pair", "default", "--prompts", prompts, "--method", "ar", "--out", tmp_path / "r.json"],
           "exceeds the target's context of 8192 positions")
