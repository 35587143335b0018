"""The candidate draft committed under benchmarks/candidates/ (trained further, not shipped) is a working draft, and
what its record and benchmarks/results/draft_styles.json say of it agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CANDIDATE = REPO / "benchmarks" / "candidates" / "stage6"
STYLES = ("code", "requests", "math", "chat", "all")


def _meta() -> dict:
    return json.loads((CANDIDATE / "eagle_smollm2.json").read_text())


def test_candidate_files_are_whole_and_small():
    from safetensors.torch import load_file

    meta = _meta()
    sd = load_file(str(CANDIDATE / "eagle_smollm2.safetensors"))
    assert meta["config"]["n_sub"] == len(sd["d2t"]) == meta["subset"]["n"] == 2048
    assert len(set(sd["d2t"].tolist())) == 2048
    assert sum(f.stat().st_size for f in CANDIDATE.iterdir()) < 40e6  # the shipped weights' limit


def test_candidate_alpha_is_what_draft_styles_measured():
    ds = json.loads((REPO / "benchmarks" / "results" / "draft_styles.json").read_text())
    rows = [d for d in ds["drafts"].values() if Path(d["folder"]) == Path("benchmarks/candidates/stage6")]
    assert len(rows) == 1, "draft_styles.json has no row for the candidate: rerun benchmarks/draft_styles.py"
    recorded = _meta()["training"]["heldout_offline_alpha_k4"]
    for s in STYLES:
        assert rows[0]["offline"][s]["alpha_tok"] == pytest.approx(recorded[s]["alpha_tok"], abs=2e-3), s
    shipped = next(d for d in ds["drafts"].values() if d["folder"] == "specdec_lesson/data")
    # the reason it is kept: higher held-out alpha than the shipped draft on every style
    assert all(rows[0]["offline"][s]["alpha_tok"] > shipped["offline"][s]["alpha_tok"] for s in STYLES)


def test_candidate_greedy_exact_on_real_target():
    from specdec_lesson.distill.data import MATH_TEMPLATE, chat_text
    from specdec_lesson.drafters.eagle import EagleDrafter, load_draft
    from specdec_lesson.models import load_default_target
    from specdec_lesson.speculative import autoregressive_generate, speculative_generate

    target, tok = load_default_target(verbose=False)
    texts = ["Explain in two sentences why the sky is blue.",
             MATH_TEMPLATE.format(question="Ana has 3 pens and buys 4 more. How many pens does she have?")]
    prompts = [tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for t in texts]
    ref, _ = autoregressive_generate(target, prompts, 24, eos_token_id=tok.eos_token_id)
    drafter = EagleDrafter(load_draft(target, CANDIDATE))
    out, stats = speculative_generate(target, drafter, prompts, 24, k=4, eos_token_id=tok.eos_token_id)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert stats.alpha > 0.05  # a random draft over 2048 tokens accepts about none
