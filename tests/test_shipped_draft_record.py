"""The shipped draft (stage 7, output subset N = 2048) is the one benchmarks/results/draft_styles.json measured, its
weights are whole and small, and the benchmark records name it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR, draft_identity

REPO = Path(__file__).resolve().parents[1]
STYLES = ("code", "requests", "math", "chat", "all")


def _meta() -> dict:
    return json.loads((DEFAULT_DRAFT_DIR / "eagle_smollm2.json").read_text())


def _styles() -> dict:
    return json.loads((REPO / "benchmarks" / "results" / "draft_styles.json").read_text())["drafts"]


def test_shipped_files_are_whole_and_small():
    from safetensors.torch import load_file

    meta = _meta()
    sd = load_file(str(DEFAULT_DRAFT_DIR / "eagle_smollm2.safetensors"))
    n = meta["config"]["n_sub"]
    assert n == len(sd["d2t"]) == meta["subset"]["n"]
    assert len(set(sd["d2t"].tolist())) == n
    size = sum((DEFAULT_DRAFT_DIR / f"eagle_smollm2{s}").stat().st_size for s in (".safetensors", ".json", "_curve.json"))
    assert size < 40e6  # the shipped weights' limit


def test_shipped_alpha_is_what_draft_styles_measured():
    rows = [d for d in _styles().values() if Path(d["folder"]) == Path("specdec_lesson/data")]
    assert len(rows) == 1, "draft_styles.json has no row for the shipped draft: rerun benchmarks/draft_styles.py"
    # the row was measured on these very weights (the sha256 it records), and agrees with the draft's own record
    assert rows[0]["weights"] == draft_identity()
    recorded = _meta()["training"]["heldout_offline_alpha_k4"]
    for s in STYLES:
        assert rows[0]["offline"][s]["alpha_tok"] == pytest.approx(recorded[s]["alpha_tok"], abs=2e-3), s


def test_shipped_draft_beats_the_one_it_replaced():
    ds = _styles()
    new = next(d for d in ds.values() if d["folder"] == "specdec_lesson/data")
    old = ds["stage6-n2048"]  # shipped from 2026-12-06 until stage 7 that evening
    assert old["weights"] != new["weights"]
    assert all(new["offline"][s]["alpha_tok"] > old["offline"][s]["alpha_tok"] for s in STYLES)


def test_draft_identity_counts_the_whole_training_chain(tmp_path):
    meta = {"config": {"n_sub": 16}, "training": {"steps": 5, "init": {"steps": 7, "init": {"steps": 11}}}}
    (tmp_path / "d.json").write_text(json.dumps(meta))
    (tmp_path / "d.safetensors").write_bytes(b"abc")
    ident = draft_identity(tmp_path, "d")
    assert ident == {"sha256_16": "ba7816bf8f01cfea", "n_sub": 16, "steps_total": 23}
    assert draft_identity(tmp_path, "missing") == {"folder": str(tmp_path), "missing": True}


def test_draft_styles_stage7_rows_are_the_ones_shipped():
    """The stage-7 rows of draft_styles.json come from draft_styles_stage7.json, a run on a held-out set made again on
    another machine: that run's row for the stage-6 draft equals draft_styles.json's in every value, so the files
    compare, and its stage-7 row (measured in the candidate folder) is the shipped draft's."""
    run = json.loads((REPO / "benchmarks" / "results" / "draft_styles_stage7.json").read_text())["drafts"]
    ds = _styles()
    assert run["stage6-n2048-shipped"]["weights"] == ds["stage6-n2048"]["weights"]
    assert run["stage7-n2048"]["weights"] == ds["stage7-n2048"]["weights"] == draft_identity()
    for s in STYLES:
        assert run["stage6-n2048-shipped"]["offline"][s] == ds["stage6-n2048"]["offline"][s], s
        assert run["stage7-n2048"]["offline"][s] == ds["stage7-n2048"]["offline"][s], s
        assert run["stage7"]["offline"][s] == ds["stage7"]["offline"][s], s


def test_each_waiting_candidate_is_what_its_draft_styles_run_measured():
    """Every candidate in benchmarks/candidates/<name>/ (benchmarks/candidates/README.md): whole and small, measured by
    benchmarks/results/draft_styles_<name>.json on these very weights, in a run whose row for the shipped draft
    reproduces draft_styles.json's (the same held-out answers), so the two files compare."""
    from safetensors.torch import load_file

    shipped = next(d for d in _styles().values() if Path(d["folder"]) == Path("specdec_lesson/data"))
    for folder in sorted(p for p in (REPO / "benchmarks" / "candidates").iterdir() if p.is_dir()):
        meta = json.loads((folder / "eagle_smollm2.json").read_text())
        sd = load_file(str(folder / "eagle_smollm2.safetensors"))
        assert meta["config"]["n_sub"] == len(sd["d2t"]) == len(set(sd["d2t"].tolist())), folder.name
        assert (folder / "eagle_smollm2.safetensors").stat().st_size < 40e6
        run = json.loads((REPO / "benchmarks" / "results" / f"draft_styles_{folder.name}.json").read_text())["drafts"]
        cand = next(d for d in run.values() if Path(d["folder"]) == Path("benchmarks/candidates") / folder.name)
        assert cand["weights"] == draft_identity(folder)
        recorded = meta["training"]["heldout_offline_alpha_k4"]
        shipped_then = next(d for d in run.values() if Path(d["folder"]) == Path("specdec_lesson/data"))
        assert shipped_then["weights"] == shipped["weights"], "the run measured another shipped draft"
        for s in STYLES:
            assert cand["offline"][s]["alpha_tok"] == pytest.approx(recorded[s]["alpha_tok"], abs=2e-3), (folder.name, s)
            assert shipped_then["offline"][s]["alpha_tok"] == shipped["offline"][s]["alpha_tok"], (folder.name, s)
