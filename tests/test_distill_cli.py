"""The distill command line (``python -m specdec_lesson.distill``): every user error is one line before the
target is loaded (flags, missing or unreadable shards and checkpoints, a resume with other settings than the
checkpoint's, exporting a --fast checkpoint), Ctrl-C is one line, and an export never leaves a half-written draft."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from specdec_lesson.distill import run_gen, run_train
from specdec_lesson.models import tiny_llama


@pytest.fixture(scope="module")
def fast_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill_cli")
    assert run_gen(out, n_code=24, n_math=0, batch=8, max_new=16, seed=0, fast=True, progress=False) == 3
    return out


def _copy_data(src, dst):
    shutil.copytree(src / "data", dst / "data")
    return dst


def _cli(capsys, argv) -> tuple[int, list[str]]:
    from specdec_lesson.distill.cli import main

    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err.strip().splitlines()


def _expect(capsys, argv, fragment):
    rc, lines = _cli(capsys, argv)
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("python -m specdec_lesson.distill: error:") and fragment in lines[0], lines


@pytest.fixture
def no_target(monkeypatch):
    """The real target must not be loaded by any of these cases (they fail first)."""
    from specdec_lesson.distill import evaluate, teacher, train

    real = teacher._teacher

    def refuse(fast, seed):
        if not fast:
            raise AssertionError("the real target was loaded before the bad input was reported")
        return real(fast, seed)

    for mod in (teacher, train, evaluate):
        monkeypatch.setattr(mod, "_teacher", refuse)


def _fast_ckpt(fast_data, out, steps=2):
    _copy_data(fast_data, out)
    run_train(out, total_steps=steps, budget=256, lr=3e-3, n_sub=64, unroll=2, fast=True, progress=False, ckpt_every=2,
              val_every=2)
    return out


def test_cli_train_before_gen(tmp_path, capsys, no_target):
    _expect(capsys, ["train", "--out", tmp_path], "no teacher data under")
    _expect(capsys, ["export", "--out", tmp_path], f"no checkpoint {tmp_path / 'ckpt.pt'}: run train")


def test_cli_resume_of_a_fast_checkpoint_without_fast(fast_data, tmp_path, capsys, no_target):
    out = _fast_ckpt(fast_data, tmp_path / "run")
    _expect(capsys, ["train", "--out", out, "--steps", 4, "--budget", 256, "--n-sub", 64, "--lr", 3e-3],
            "was made with --fast (the tiny random target), and this run is without --fast; rerun with --fast")
    _expect(capsys, ["train", "--out", out, "--steps", 4, "--budget", 256, "--n-sub", 32, "--lr", 3e-3, "--fast"],
            "was made with --n-sub 64 (this run: 32)")
    rc, _ = _cli(capsys, ["train", "--out", out, "--steps", 4, "--budget", 256, "--n-sub", 64, "--lr", 3e-3, "--fast"])
    assert rc == 0 and torch.load(out / "ckpt.pt")["step"] == 4  # same settings (more steps): resumes


def test_cli_resume_of_an_older_checkpoint_compares_shapes(fast_data, tmp_path, capsys, monkeypatch):
    """A checkpoint written before the settings were recorded: the draft's shape is compared before loading it
    (no ``size mismatch`` from load_state_dict); the other target is a wider tiny model here."""
    from specdec_lesson.distill import train

    out = _fast_ckpt(fast_data, tmp_path / "run")
    ckpt = torch.load(out / "ckpt.pt")
    del ckpt["made"]
    torch.save(ckpt, out / "ckpt.pt")
    monkeypatch.setattr(train, "_teacher", lambda fast, seed: (tiny_llama(vocab_size=96, hidden_size=64, num_layers=2,
                                                                          dtype=torch.float32), None))
    _expect(capsys, ["train", "--out", out, "--steps", 4, "--budget", 256, "--n-sub", 64, "--lr", 3e-3],
            "was made for another target or draft shape (hidden 32 (this run: 64)")


def test_cli_truncated_shard_and_checkpoint(fast_data, tmp_path, capsys):
    out = _copy_data(fast_data, tmp_path / "run")
    shard = sorted((out / "data").glob("shard_*.pt"))[1]
    shard.write_bytes(shard.read_bytes()[:1000])
    _expect(capsys, ["train", "--fast", "--out", out, "--steps", 2],
            f"the teacher shard {shard} is unreadable, truncated or corrupt")
    _expect(capsys, ["train", "--fast", "--out", out, "--steps", 2], "delete it and rerun gen with the same arguments")
    out2 = _fast_ckpt(fast_data, tmp_path / "run2")
    (out2 / "ckpt.pt").write_bytes((out2 / "ckpt.pt").read_bytes()[:500])
    _expect(capsys, ["train", "--fast", "--out", out2, "--steps", 4],
            "the checkpoint " + str(out2 / "ckpt.pt") + " is unreadable, truncated or corrupt")


def test_cli_export_refuses_a_fast_checkpoint_and_a_missing_step(fast_data, tmp_path, capsys, monkeypatch, no_target):
    from specdec_lesson.drafters import eagle

    monkeypatch.setattr(eagle, "DEFAULT_DRAFT_DIR", tmp_path / "shipped")  # never the package's own draft
    out = _fast_ckpt(fast_data, tmp_path / "run")
    _expect(capsys, ["export", "--out", out, "--force"], "was trained with --fast on the tiny random target")
    ckpt = torch.load(out / "ckpt.pt")
    ckpt["made"]["fast"] = False
    torch.save(ckpt, out / "ckpt.pt")
    _expect(capsys, ["export", "--out", out, "--step", 7, "--force"], "no saved checkpoint for --step 7")
    _expect(capsys, ["export", "--out", out, "--step", 7, "--force"], "(saved steps: 2)")
    assert not (tmp_path / "shipped").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["train", "--lr", "nan"], "--lr must be a finite number"),
    (["train", "--lr", "-1"], "--lr must be > 0.0"),
    (["train", "--unroll", "0"], "--unroll must be"),
    (["train", "--ckpt-every", "0"], "--ckpt-every must be"),
    (["train", "--val-every", "0"], "--val-every must be"),
    (["train", "--budget", "0"], "--budget must be"),
    (["train", "--n-sub", "0"], "--n-sub must be"),
    (["gen", "--batch", "0"], "--batch must be"),
    (["gen", "--threads", "0"], "--threads must be an integer in 1.."),
    (["gen", "--threads", "1000000"], "--threads must be an integer in 1.."),
    (["gen", "--worker", "3", "--workers", "2"], "--worker must be an integer in 0..1, got 3"),
    (["gen", "--workers", "0"], "--workers must be"),
    (["gen", "--max-shards", "0"], "--max-shards must be"),
    (["gen", "--sample-every", "-1"], "--sample-every must be"),
    (["gen", "--max-new", "0"], "--max-new must be"),
    (["gen", "--n-code", "0", "--n-math", "0"], "--n-code + --n-math must be >= 1"),
    (["heldout", "--n-code", "0", "--n-math", "0"], "--n-code + --n-math + --n-requests + --n-chat must be >= 1"),
    (["heldout", "--n-chat", "-1"], "--n-chat"),
    (["gen", "--seed", "-1"], "--seed must be an integer >= 0 (below 2**63), got -1"),
    (["corpus", "--n", "0"], "--n must be"),
    (["corpus", "--shard-size", "0"], "--shard-size must be"),
    (["heldout", "--n-code", "-1"], "--n-code must be an integer >= 0, got -1"),
    (["heldout", "--fast"], "heldout always runs on the real target; --fast does not apply"),
    (["export", "--k", "0"], "--k must be"),
    (["train", "--decay", "0"], "--decay must be > 0.0"),
    (["train", "--aux-layers", "2,15"], "--aux-layers applies to --arch eagle3 only"),
    (["train", "--arch", "eagle3", "--intermediate", "64"], "--intermediate applies to --arch eagle only"),
    (["train", "--intermediate", "0"], "--intermediate must be"),
    (["train", "--arch", "eagle3", "--aux-layers", "0,3"], "--aux-layers must be layer indices >= 1"),
    (["train", "--arch", "eagle3", "--aux-layers", "none"], "an eagle3 draft needs fused layers"),
    (["train", "--init", "/nonexistent/draft"], "--init /nonexistent/draft does not exist"),
    (["features", "--aux-layers", "two"], "--aux-layers must be comma-separated layer indices"),
    (["features", "--answers", "/nonexistent/a.npz"], "--answers /nonexistent/a.npz does not exist"),
    (["features", "--shard-rows", "0"], "--shard-rows must be"),
    (["export", "--init-json", "/nonexistent/d.json"], "--init-json /nonexistent/d.json does not exist"),
    (["gen", "--steps", "3"], "unrecognized arguments: --steps 3"),
    (["gen", "--batch", "two"], "argument --batch: invalid int value: 'two'"),
    ([], "the following arguments are required: cmd"),
])
def test_cli_numeric_flags_are_checked_first(fast_data, tmp_path, capsys, no_target, argv, fragment):
    out = _copy_data(fast_data, tmp_path / "run")  # shards present: only the flag is wrong
    extra = [] if not argv else ["--out", out] + (["--fast"] if argv[0] in ("train", "gen", "corpus", "features") else [])
    _expect(capsys, argv + extra, fragment)


def test_cli_answers_max_batches_is_checked_first(capsys, no_target):
    _expect(capsys, ["answers", "--max-batches", "0"], "--max-batches must be")


def test_cli_out_that_is_a_file(tmp_path, capsys, no_target):
    (tmp_path / "afile").write_text("x")
    _expect(capsys, ["gen", "--fast", "--out", tmp_path / "afile"], "is a file, not a folder")


def test_cli_ctrl_c_is_one_line(tmp_path, capsys, monkeypatch):
    from specdec_lesson.distill import cli

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_gen", interrupt)
    rc, lines = _cli(capsys, ["gen", "--fast", "--out", tmp_path])
    assert rc == 130 and len(lines) == 1 and "interrupted; every finished shard and checkpoint is kept" in lines[0]


def test_checkpoint_records_the_settings_that_made_it(fast_data, tmp_path):
    ckpt = torch.load(_fast_ckpt(fast_data, tmp_path / "run") / "ckpt.pt")
    assert ckpt["made"] == {"fast": True, "n_sub": 64, "budget": 256, "lr": 3e-3, "unroll": 2, "seed": 0, "prompt_weight": 0.5}


def _exportable(fast_data, tmp_path, monkeypatch):
    """A --fast checkpoint passed off as a real one, with the tiny target standing in for the real target."""
    from specdec_lesson.distill import evaluate

    out = _fast_ckpt(fast_data, tmp_path / "run")
    ckpt = torch.load(out / "ckpt.pt")
    ckpt["made"]["fast"] = False
    torch.save(ckpt, out / "ckpt.pt")
    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    monkeypatch.setattr(evaluate, "_teacher", lambda fast, seed: (target, None))
    return out


def test_export_writes_the_draft_and_its_curve(fast_data, tmp_path, monkeypatch):
    from specdec_lesson.distill.evaluate import run_export

    out = _exportable(fast_data, tmp_path, monkeypatch)
    info = run_export(out, dest=tmp_path / "shipped")
    assert info["training"]["steps"] == 2
    assert sorted(p.name for p in (tmp_path / "shipped").iterdir()) == [
        "eagle_smollm2.json", "eagle_smollm2.safetensors", "eagle_smollm2_curve.json"]
    assert not list(tmp_path.glob(".shipped.export-*"))


def test_interrupted_export_leaves_the_shipped_draft_whole(fast_data, tmp_path, monkeypatch):
    """save_draft writes in place; the export used to run it on the shipped folder itself, so a Ctrl-C between
    the weights and the JSON left a draft that does not load."""
    from specdec_lesson.distill import evaluate
    from specdec_lesson.drafters import eagle

    out = _exportable(fast_data, tmp_path, monkeypatch)
    dest = tmp_path / "shipped"
    dest.mkdir()
    for name in ("eagle_smollm2.json", "eagle_smollm2.safetensors", "eagle_smollm2_curve.json"):
        (dest / name).write_text("old")
    real = eagle.save_draft

    def interrupted(model, folder, name, extra=None):
        real(model, folder, name, extra)
        raise KeyboardInterrupt  # after the weights, before the curve

    monkeypatch.setattr(eagle, "save_draft", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate.run_export(out, dest=dest, force=True)
    assert all(p.read_text() == "old" for p in dest.iterdir()) and len(list(dest.iterdir())) == 3
    assert not list(tmp_path.glob(".shipped.export-*"))


def test_export_rewrites_the_shipped_draft_only_with_force_and_backs_it_up(fast_data, tmp_path, capsys, monkeypatch):
    """export used to replace the shipped draft unasked; now it needs --force (or --dest) and keeps a backup."""
    import json

    from specdec_lesson.drafters import eagle

    out = _exportable(fast_data, tmp_path, monkeypatch)
    names = ("eagle_smollm2.json", "eagle_smollm2.safetensors", "eagle_smollm2_curve.json")
    shipped, other = tmp_path / "shipped", tmp_path / "other"
    for folder in (shipped, other):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(f"old {folder.name}")
    monkeypatch.setattr(eagle, "DEFAULT_DRAFT_DIR", shipped)
    _expect(capsys, ["export", "--out", out], "export would rewrite the shipped draft")
    _expect(capsys, ["export", "--out", out, "--dest", other], "already holds a draft")
    assert all(p.read_text() == f"old {p.parent.name}" for f in (shipped, other) for p in f.iterdir())
    fresh = tmp_path / "fresh"  # a new folder needs no --force, and the shipped draft stays as it was
    assert _cli(capsys, ["export", "--out", out, "--dest", fresh])[0] == 0
    assert json.loads((fresh / "eagle_smollm2.json").read_text())["training"]["steps"] == 2
    assert not list(out.glob("export-backup-*")) and all(p.read_text() == "old shipped" for p in shipped.iterdir())
    assert _cli(capsys, ["export", "--out", out, "--force"])[0] == 0
    (backup,) = out.glob("export-backup-*")
    assert {p.name: p.read_text() for p in backup.iterdir()} == {n: "old shipped" for n in names}
    assert json.loads((shipped / "eagle_smollm2.json").read_text())["training"]["steps"] == 2


# ----------------------------------------------------------------- files the package ships are never lost
@pytest.fixture
def fake_answers(monkeypatch):
    """``run_answers`` recording its call instead of loading the target."""
    from specdec_lesson.distill import answers

    calls = []

    def record(out, *a, force=False, **k):
        answers.check_answers_out(out, force)  # what the real one checks first
        calls.append((out, force))
        return {"answers": 0}

    monkeypatch.setattr(answers, "run_answers", record)
    return calls


def test_answers_without_file_never_writes_into_the_package(tmp_path, capsys, monkeypatch, fake_answers):
    """The default used to be the shipped corpus itself (a one-answer trial shrank it)."""
    from specdec_lesson.distill.answers import SHIPPED_DATA

    monkeypatch.chdir(tmp_path)
    rc, lines = _cli(capsys, ["answers", "--n-code", 1, "--n-math", 0])
    assert rc == 0 and fake_answers == [(Path("runs/distill/answers.npz"), False)], lines
    assert not (tmp_path / fake_answers[0][0]).resolve().is_relative_to(SHIPPED_DATA)


def test_answers_replaces_a_finished_or_shipped_file_only_with_force(tmp_path, capsys, monkeypatch, no_target,
                                                                      fake_answers):
    from specdec_lesson.drafters.suffix import DEFAULT_CORPUS

    monkeypatch.chdir(tmp_path)
    done = tmp_path / "mine.npz"
    done.write_bytes(b"finished")
    _expect(capsys, ["answers", "--file", done], "exists (a finished answers file): add --force")
    _expect(capsys, ["answers", "--file", DEFAULT_CORPUS], "(a shipped answer corpus): add --force")
    new = DEFAULT_CORPUS.parent / "answers_trial.npz"
    _expect(capsys, ["answers", "--file", new], "is inside the package's shipped data")
    assert not new.exists() and fake_answers == [] and done.read_bytes() == b"finished"
    assert _cli(capsys, ["answers", "--file", done, "--force"])[0] == 0
    (tmp_path / "resumed.partial.npz").write_bytes(b"half")  # an interrupted run resumes without --force
    assert _cli(capsys, ["answers", "--file", tmp_path / "resumed.npz"])[0] == 0
    assert fake_answers == [(done, True), (tmp_path / "resumed.npz", False)]


def test_run_answers_refuses_an_existing_file_before_loading(tmp_path, monkeypatch):
    from specdec_lesson import models
    from specdec_lesson.cli_args import UsageError
    from specdec_lesson.distill.answers import run_answers

    monkeypatch.setattr(models, "load_default_target", lambda *a, **k: pytest.fail("the target was loaded"))
    (tmp_path / "a.npz").write_bytes(b"finished")
    with pytest.raises(UsageError, match="add --force to replace it"):
        run_answers(tmp_path / "a.npz", 1, 0, 1, 4, 0, progress=False)


def test_resubset_rewrites_the_shipped_draft_only_with_force_and_keeps_a_backup(tmp_path, capsys, monkeypatch):
    """It used to rewrite the shipped draft with no backup, keeping beside the new head a held-out alpha measured
    with the old one."""
    import json

    from specdec_lesson.drafters import eagle

    shipped = tmp_path / "shipped"  # a copy standing in for the package's draft
    shipped.mkdir()
    for f in sorted(eagle.DEFAULT_DRAFT_DIR.glob(f"{eagle.DEFAULT_DRAFT_NAME}.*")):
        shutil.copy(f, shipped / f.name)
    monkeypatch.setattr(eagle, "DEFAULT_DRAFT_DIR", shipped)
    before = {f.name: f.read_bytes() for f in shipped.iterdir()}
    old_meta = json.loads(before[f"{eagle.DEFAULT_DRAFT_NAME}.json"])
    runs = tmp_path / "runs"
    _expect(capsys, ["resubset", "--n-sub", 1024, "--out", runs], "would rewrite the shipped draft")
    assert {f.name: f.read_bytes() for f in shipped.iterdir()} == before
    rc, _ = _cli(capsys, ["resubset", "--n-sub", 1024, "--out", runs, "--force"])
    assert rc == 0
    (backup,) = runs.glob("resubset-backup-*")
    assert {f.name: f.read_bytes() for f in backup.iterdir()} == before  # the replaced files, bit for bit
    meta = json.loads((shipped / f"{eagle.DEFAULT_DRAFT_NAME}.json").read_text())
    assert meta["config"]["n_sub"] == 1024 and "heldout_offline_alpha_k4" not in meta["training"]
    stale = meta["subset"]["replaced_head_heldout"]
    assert stale["heldout_offline_alpha_k4"] == old_meta["training"]["heldout_offline_alpha_k4"]
    assert f"replaced head of {old_meta['config']['n_sub']} tokens" in stale["note"]
    other = tmp_path / "other"  # --dest: the shipped draft stays as it is
    now = {f.name: f.read_bytes() for f in shipped.iterdir()}
    assert _cli(capsys, ["resubset", "--n-sub", 512, "--out", runs, "--dest", other])[0] == 0
    assert {f.name: f.read_bytes() for f in shipped.iterdir()} == now
    assert json.loads((other / f"{eagle.DEFAULT_DRAFT_NAME}.json").read_text())["config"]["n_sub"] == 512
    _expect(capsys, ["resubset", "--n-sub", 256, "--out", runs, "--dest", other], "already holds a draft")


def test_export_init_json_that_is_not_a_draft_record(fast_data, tmp_path, capsys, no_target):
    out = _fast_ckpt(fast_data, tmp_path / "run")
    for text, fragment in (("[1, 2]", "holds a JSON list, not a draft record"), ("{oops", "is not readable JSON"),
                           ('{"training": 3}', "holds a JSON dict, not a draft record")):
        (tmp_path / "init.json").write_text(text)
        _expect(capsys, ["export", "--out", out, "--init-json", tmp_path / "init.json"], fragment)


def test_train_removes_the_temporary_files_of_a_killed_run(fast_data, tmp_path):
    import os
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = proc.pid  # a pid that no longer runs
    out = _copy_data(fast_data, tmp_path / "run")
    (out / "ckpts").mkdir()
    stale = [out / f".ckpt.pt.tmp-{dead}", out / "ckpts" / f".draft_000002.pt.tmp-{dead}"]
    live = out / f".ckpt.pt.tmp-{os.getppid()}"  # a running process's file (its write may be under way)
    for p in [*stale, live]:
        p.write_bytes(b"half a checkpoint")
    run_train(out, total_steps=2, budget=256, lr=3e-3, n_sub=64, unroll=2, fast=True, progress=False, ckpt_every=2,
              val_every=2)
    assert not any(p.exists() for p in stale) and live.exists()
