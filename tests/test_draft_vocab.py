"""benchmarks/draft_vocab.py and distill.subset: the shipped draft re-headed over another vocabulary subset (its trained
weights do not depend on the subset) drafts exactly as before over the shipped subset, and only inside a smaller one;
``distill resubset`` reproduces the shipped subset and rewrites a draft folder keeping its weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_vocab.py"


def test_with_subset_keeps_the_draft_and_restricts_its_proposals():
    from specdec_lesson.drafters.eagle import EagleDrafter
    from specdec_lesson.drafters.pair import load_default_pair
    from specdec_lesson.sampling import SamplingConfig

    target, drafter, _ = load_default_pair(tune=False)
    shipped = drafter.model
    from specdec_lesson.distill.subset import with_subset  # the function the script and distill resubset use

    same = with_subset(shipped, target, shipped.d2t.clone())
    small_ids = shipped.d2t[::8].clone()  # 1024 of the shipped tokens
    small = with_subset(shipped, target, small_ids)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, 40000, (1, 50), generator=gen)  # [1, 50]
    feats = torch.randn(1, 49, shipped.cfg["hidden"], generator=gen)  # [1, 49, H]
    proposals = []
    for m in (shipped, same, small):
        d = EagleDrafter(m, add_prompt_tokens=False)
        d.begin(ctx, torch.ones_like(ctx, dtype=torch.bool), feats)
        tokens, _ = d.propose(6, SamplingConfig(0.0), None)  # [1, 6]
        proposals.append(tokens[0])
    assert torch.equal(proposals[0], proposals[1])
    assert torch.isin(proposals[2], small_ids).all()


def test_bad_flags_fail_before_loading_models(tmp_path):
    for flags, message in ((["--heldout", str(tmp_path / "none.pt")], "distill heldout"),
                           (["--heldout", "x", "--sizes", "big"], "comma-separated integers"),
                           (["--heldout", "x", "--sizes", "0"], ">= 1")):
        proc = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_the_shipped_subset_is_the_one_resubset_chooses():
    """The shipped d2t is reproducible: ``distill resubset --n-sub N`` over the answer files its record names (the
    mixture grows after a draft ships) gives it back; they are shipped files, and a file more or less changes it."""
    import json

    from specdec_lesson.distill.answers import SHIPPED_DATA
    from specdec_lesson.distill.subset import answer_subset, data_name, subset_files
    from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR, DEFAULT_DRAFT_NAME
    from specdec_lesson.drafters.pair import load_default_pair

    target, drafter, tok = load_default_pair(tune=False)
    d2t = drafter.model.d2t  # [N]
    names = json.loads((DEFAULT_DRAFT_DIR / f"{DEFAULT_DRAFT_NAME}.json").read_text())["subset"]["files"]
    files = tuple(SHIPPED_DATA / n for n in names)  # names are relative to the package's data folder
    assert all(f.is_file() for f in files) and set(names) <= {data_name(f) for f in subset_files()}
    V = target.config.vocab_size
    assert torch.equal(d2t, answer_subset(len(d2t), V, tok.eos_token_id, files))
    assert not torch.equal(d2t, answer_subset(len(d2t), V, tok.eos_token_id, files[:-1]))  # the last shard counts
    assert tok.eos_token_id in d2t.tolist()


def test_resubset_rewrites_a_draft_folder_in_place(tmp_path):
    """run_resubset on a copy of the shipped draft: the trained weights are kept bit for bit, only d2t changes, and
    the record says which subset it carries and what it replaced."""
    import json
    import shutil

    from safetensors.torch import load_file

    from specdec_lesson.distill.subset import SUBSET_SOURCE, data_name, run_resubset, subset_files
    from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR, DEFAULT_DRAFT_NAME

    for suffix in (".safetensors", ".json"):
        shutil.copy(DEFAULT_DRAFT_DIR / f"{DEFAULT_DRAFT_NAME}{suffix}", tmp_path)
    before = load_file(str(tmp_path / f"{DEFAULT_DRAFT_NAME}.safetensors"))
    info = run_resubset(1024, dest=tmp_path)
    after = load_file(str(tmp_path / f"{DEFAULT_DRAFT_NAME}.safetensors"))
    meta = json.loads((tmp_path / f"{DEFAULT_DRAFT_NAME}.json").read_text())
    assert meta["config"]["n_sub"] == 1024 and after["d2t"].numel() == 1024
    assert meta["subset"] == info["subset"] and meta["subset"]["source"] == SUBSET_SOURCE
    assert meta["subset"]["files"] == [data_name(f) for f in subset_files()]  # every shipped answer file, by name
    assert meta["subset"]["replaced_n"] == before["d2t"].numel()
    assert meta["training"]["steps"] == json.loads((DEFAULT_DRAFT_DIR / f"{DEFAULT_DRAFT_NAME}.json").read_text())[
        "training"]["steps"]
    assert set(after) == set(before)
    assert all(torch.equal(after[k], before[k]) for k in before if k != "d2t")
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.export-*"))  # no temporary folder left behind


def test_resubset_bad_flags_fail_before_loading_models(tmp_path):
    for flags, message in ((["--n-sub", "0"], "--n-sub"),
                           (["--n-sub", "2048", "--heldout", str(tmp_path / "none.pt")], "distill heldout"),
                           (["--n-sub", "2048", "--fast"], "--fast does not apply")):
        proc = subprocess.run([sys.executable, "-m", "specdec_lesson.distill", "resubset", *flags], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
