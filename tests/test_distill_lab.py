"""distill.lab: notebook 08's lab on the real target, in seconds (tiny counts)."""

from __future__ import annotations

import math

import pytest
import torch

from specdec_lesson.distill.lab import lab_rows, train_lab


@pytest.fixture(scope="module")
def target():
    from specdec_lesson.models import load_default_target

    return load_default_target(verbose=False)[0]


@pytest.fixture(scope="module")
def rows(target):
    return lab_rows(target, 4, 2, max_len=64, seed=1)


def test_lab_rows_are_teacher_rows_disjoint_between_train_and_held(target, rows):
    train, held = rows
    assert len(train) == 4 and len(held) == 2
    H = target.config.hidden_size
    for r in train + held:
        n = len(r["tokens"])
        assert 10 <= n <= 64 and r["feats"].shape == (n - 1, H) and r["kind"] in ("chat", "magpie", "code", "math")
        assert 2 <= r["n_prompt"] < n
    assert not {tuple(r["tokens"].tolist()) for r in train} & {tuple(r["tokens"].tolist()) for r in held}
    again = lab_rows(target, 4, 2, max_len=64, seed=1)
    assert [r["tokens"].tolist() for r in again[0]] == [r["tokens"].tolist() for r in train]  # seeded


def test_train_lab_logs_loss_and_heldout_alpha(target, rows):
    train, held = rows
    seen = []
    res = train_lab(target, train, held, steps=3, unroll=2, n_sub=256, budget=256, eval_every=2,
                    progress=lambda s, n, e: seen.append(s))
    assert [e["step"] for e in res["log"]] == [1, 2, 3] and all(math.isfinite(e["loss"]) for e in res["log"])
    assert [e["step"] for e in res["evals"]] == [0, 2, 3] == seen
    assert all(0.0 <= e["alpha_tok"] <= 1.0 and e["tau"] >= 1.0 for e in res["evals"])
    assert res["settings"]["n_train"] == 4 and len(res["model"].d2t) == 256


def test_lab_bad_input_fails_before_work(target):
    with pytest.raises(ValueError, match="n_train and n_held"):
        lab_rows(target, 0, 2)
    with pytest.raises(ValueError, match="usable rows"):
        lab_rows(target, 10**7, 2)
    with pytest.raises(ValueError, match="steps, unroll"):
        train_lab(target, [{}], [{}], steps=0)
    with pytest.raises(ValueError, match="training rows and held-out rows"):
        train_lab(target, [], [{}])
    assert torch.get_num_threads() >= 1
