"""benchmarks/draft_vocab.py: the shipped draft re-headed over another vocabulary subset (its trained weights do not
depend on the subset) drafts exactly as before over the shipped subset, and only inside a smaller one."""

from __future__ import annotations

import runpy
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
    with_subset = runpy.run_path(str(SCRIPT), run_name="draft_vocab")["with_subset"]  # the script's own function
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
