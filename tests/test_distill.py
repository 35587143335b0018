"""The distilled draft: fast-mode training, resume, the drafter's law and cache, exactness, data hygiene."""

from __future__ import annotations

import shutil

import pytest
import torch

from specdec_lesson.distill import run_gen, run_train
from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import SamplingConfig
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.stats import chi2_sf


@pytest.fixture(scope="module")
def fast_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill")
    assert run_gen(out, n_code=24, n_math=0, batch=8, max_new=16, seed=0, fast=True, progress=False) == 3
    return out


def test_corpus_is_resumable_and_teacher_forced_rows_match_single_passes(tmp_path):
    from specdec_lesson.distill import run_corpus
    from specdec_lesson.distill.teacher import teacher_forced_rows

    assert run_corpus(tmp_path, n=20, seed=0, shard_size=8, budget=40, fast=True, progress=False) == 3
    assert run_corpus(tmp_path, n=20, seed=0, shard_size=8, budget=40, fast=True, progress=False) == 0
    rows = torch.load(tmp_path / "data" / "shard_tf0_00000.pt")
    assert len(rows) == 8 and all(r["feats"].shape == (len(r["tokens"]) - 1, 32) for r in rows)
    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]
    batched = teacher_forced_rows(target, seqs, [2, 1, 3])  # right-padded batch
    for s, r in zip(seqs, batched):
        alone = teacher_forced_rows(target, [s], [1])[0]
        assert torch.equal(r["tokens"], alone["tokens"])
        torch.testing.assert_close(r["feats"].float(), alone["feats"].float(), atol=2e-3, rtol=0)


def _copy_data(src, dst):
    shutil.copytree(src / "data", dst / "data")
    return dst


def test_gen_is_resumable_and_complete(fast_data):
    shards = sorted((fast_data / "data").glob("shard_*.pt"))
    assert len(shards) == 3 and not list((fast_data / "data").glob(".*tmp*"))
    assert run_gen(fast_data, n_code=24, n_math=0, batch=8, max_new=16, seed=0, fast=True, progress=False) == 0
    row = torch.load(shards[0])[0]
    assert row["feats"].shape == (len(row["tokens"]) - 1, 32)


def test_fast_training_loss_falls(fast_data, tmp_path):
    out = _copy_data(fast_data, tmp_path)
    res = run_train(out, total_steps=40, budget=256, lr=3e-3, n_sub=64, unroll=2, fast=True, progress=False,
                    ckpt_every=20, val_every=20)
    losses = [e["loss"] for e in res["log"]]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.05, losses
    assert (out / "ckpt.pt").exists() and not list(out.glob(".*tmp*"))


def test_resume_equals_uninterrupted(fast_data, tmp_path):
    kw = dict(total_steps=12, budget=256, lr=3e-3, n_sub=64, unroll=2, fast=True, progress=False, ckpt_every=4, val_every=6)
    a = run_train(_copy_data(fast_data, tmp_path / "a"), **kw)
    out_b = _copy_data(fast_data, tmp_path / "b")
    part = run_train(out_b, stop_after=5, **kw)  # "interrupted" after 5 of 12 steps
    assert part["step"] == 5
    b = run_train(out_b, **kw)
    assert b["step"] == 12 and [e["loss"] for e in a["log"]] == [e["loss"] for e in b["log"]]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


def _tiny_draft(target, n_sub=48, seed=0):
    torch.manual_seed(seed)
    V = target.get_input_embeddings().weight.shape[0]
    d2t = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n_sub].sort().values
    d2t[0] = 2  # keep EOS in the subset
    d2t = d2t.unique()
    model = EagleDraft(EagleConfig.from_target(target, len(d2t)), *_target_tables(target), d2t=d2t)
    with torch.no_grad():
        model.head.mul_(4.0)  # sharper laws than the random init gives
    return model.eval()


def test_drafter_law_is_valid_and_is_what_it_samples():
    """Repeated propose(k=1) from one state are iid draws from the q it returns (propose with k=1 feeds nothing).
    Chi-square over the tokens with expected count >= 5, 6000 draws, reject at p < 1e-3 (false alarm 0.1%)."""
    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=1, dtype=torch.float32)
    drafter = EagleDrafter(_tiny_draft(target))
    B, L = 2, 7
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 96, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :2] = False
    drafter.begin(ids, mask, torch.randn(B, L - 1, 32, generator=g))
    sampling = SamplingConfig(temperature=1.3, top_k=20)
    toks, q = drafter.propose(3, sampling, g)
    assert toks.shape == (B, 3) and q.shape == (B, 3, 96)
    assert torch.allclose(q.sum(-1), torch.ones(B, 3), atol=1e-5) and bool((q >= 0).all())
    outside = torch.ones(96, dtype=torch.bool)
    outside[drafter.d2t] = False
    assert set(ids[mask].tolist()) <= set(drafter.d2t.tolist())  # the prompts' tokens join the draft vocabulary
    assert float(q[..., outside].abs().max()) == 0.0  # tokens outside the subset have q = 0 exactly
    assert bool((q.gather(-1, toks[..., None]) > 0).all())
    n = 6000
    counts = torch.zeros(B, 96)
    first_q = None
    for _ in range(n):
        t, qq = drafter.propose(1, sampling, g)
        first_q = qq[:, 0] if first_q is None else first_q
        assert torch.equal(qq[:, 0], first_q)  # same state, same law
        counts[torch.arange(B), t[:, 0]] += 1
    for b in range(B):
        keep = first_q[b] * n >= 5
        exp = first_q[b][keep] * n
        obs = counts[b][keep]
        rest_o, rest_e = counts[b].sum() - obs.sum(), n - exp.sum()
        stat = float(((obs - exp) ** 2 / exp).sum()) + (float((rest_o - rest_e) ** 2 / rest_e) if rest_e >= 5 else 0.0)
        assert chi2_sf(stat, int(keep.sum()) - (0 if rest_e >= 5 else 1)) > 1e-3


def test_commit_equals_fresh_begin_on_ragged_batch():
    """After begin/propose/commit with rows accepting different counts, each row's draft state (next draft law)
    equals a fresh single-row begin over that row's committed sequence with the same features."""
    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=2, dtype=torch.float32)
    model = _tiny_draft(target, seed=1)
    g = torch.Generator().manual_seed(1)
    B, L, K = 3, 6, 4
    ids = torch.randint(3, 96, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    hidden = torch.randn(B, L - 1, 32, generator=g)
    d = EagleDrafter(model, add_prompt_tokens=False)  # same vocabulary for the batch and the single rows
    d.begin(ids, mask, hidden)
    greedy = SamplingConfig(0.0)
    seqs, feats = [ids[b].tolist() for b in range(B)], [hidden[b] for b in range(B)]
    for n_acc in ([0, 2, 4], [3, 0, 1]):
        drafts, _ = d.propose(K, greedy, g)
        vh = torch.randn(B, K + 1, 32, generator=g)
        nxt = torch.randint(3, 96, (B,), generator=g)
        d.commit(torch.tensor(n_acc), nxt, vh)
        for b, n in enumerate(n_acc):
            feats[b] = torch.cat([feats[b], vh[b, : n + 1]])
            seqs[b] = seqs[b] + drafts[b, :n].tolist() + [int(nxt[b])]
    after, _ = d.propose(K, greedy, g)
    for b in range(B):
        single = EagleDrafter(model, add_prompt_tokens=False)
        single.begin(torch.tensor([seqs[b]]), torch.ones(1, len(seqs[b]), dtype=torch.bool), feats[b][None])
        assert torch.allclose(single.g_last[0], d.g_last[b], atol=1e-5)
        assert torch.equal(single.propose(K, greedy, g)[0][0], after[b])


def test_greedy_speculative_with_eagle_equals_target_tiny():
    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=3, dtype=torch.float32, eos_token_id=2)
    prompts = [[5, 9, 11, 40, 7], [3, 4], [60, 61, 62, 63, 64, 65, 66, 67]]
    ref, _ = autoregressive_generate(target, prompts, 24)
    out, stats = speculative_generate(target, EagleDrafter(_tiny_draft(target, seed=3)), prompts, 24, k=3)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert stats.target_forwards > 0


def test_training_prompts_disjoint_from_evaluation():
    """Every training source of the shipped draft (gen prompts of seeds 0 and 1, the teacher-forced corpus) and of
    the shipped answer corpus (its own prompts, rebuilt from its settings) against all three benchmark styles."""
    from specdec_lesson.bench.requests import function_requests
    from specdec_lesson.bench.tasks import code_problems, math_problems
    from specdec_lesson.distill.data import code_corpus, training_prompts
    from specdec_lesson.drafters.suffix import ANSWER_FILES, load_answer_corpus

    train = training_prompts(1200, 500, seed=0) + training_prompts(600, 600, seed=1)
    assert len(train) == 2900
    for path in ANSWER_FILES:  # the shipped answer files:
        if path.exists():  # their prompts are training prompts of a recorded seed
            rows, meta = load_answer_corpus(path)
            train += training_prompts(meta["n_code"], meta["n_math"], meta["seed"])
            assert len(rows) == meta.get("answers", len(rows)) <= meta["n_code"] + meta["n_math"]  # a prefix of them
    corpus = code_corpus(100_000, seed=0)
    text = "\n".join([t for _, t in train] + [u + "\n" + a for u, a in corpus])
    assert len(corpus) > 4000
    for r in function_requests():  # the free-form requests: neither the request, its name nor its task description
        assert r["text"] not in text and f"def {r['name']}(" not in text, r["id"]
        what = r["text"].split(" that ", 1)[-1].split(" It ", 1)[-1].rstrip(".")
        assert len(what) > 20 and what not in text, r["id"]
    for p in code_problems("eval"):
        assert p["prompt"].strip() not in text, p["task_id"]
        sig = next(line for line in p["prompt"].splitlines() if line.startswith(f"def {p['entry_point']}("))
        assert sig not in text, p["task_id"]  # the evaluation function's exact signature line
    for p in math_problems("eval") + math_problems("train"):
        assert p["question"].strip() not in text


def test_shipped_draft_greedy_exact_on_real_target():
    from specdec_lesson.distill.data import CODE_TEMPLATE, MATH_TEMPLATE, chat_text
    from specdec_lesson.drafters.pair import load_default_pair

    target, drafter, tok = load_default_pair()
    texts = [CODE_TEMPLATE.format(prompt="def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n"),
             MATH_TEMPLATE.format(question="Ana has 3 pens and buys 4 more. How many pens does she have?")]
    prompts = [tok(chat_text(tok, t), add_special_tokens=False)["input_ids"] for t in texts]
    ref, _ = autoregressive_generate(target, prompts, 24, eos_token_id=tok.eos_token_id)
    out, stats = speculative_generate(target, drafter, prompts, 24, k=4, eos_token_id=tok.eos_token_id)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert stats.alpha > 0.05  # accepted / proposed at k=4; a random draft over 49152 tokens accepts ~0



def test_widened_mlp_computes_the_same_function_and_trains_from_a_narrower_init(fast_data, tmp_path):
    """``widen_mlp_state`` grows the draft's MLP with units whose output starts at zero: the widened draft's unrolled
    predictions equal the narrow one's (fp32 sums in another order: within 1e-5); ``run_train(intermediate=...)``
    starts from a narrower ``init`` that way, and the wider shape is what it trains and records."""
    from specdec_lesson.drafters.eagle_model import widen_mlp_state

    target = tiny_llama(vocab_size=96, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    narrow = _tiny_draft(target)
    cfg = EagleConfig(narrow.cfg, intermediate=3 * narrow.cfg["intermediate"])
    wide = EagleDraft(cfg, *_target_tables(target), d2t=narrow.d2t).eval()
    state = widen_mlp_state(narrow.state_dict(), cfg["intermediate"], torch.Generator().manual_seed(1))
    wide.load_state_dict(state)
    with torch.no_grad():
        wide.head.copy_(narrow.head)
    g = torch.Generator().manual_seed(2)
    feats, tokens = torch.randn(2, 9, 32, generator=g), torch.randint(0, 96, (2, 9), generator=g)
    with torch.no_grad():
        for a, b in zip(narrow.forward_train(feats, tokens, 3), wide.forward_train(feats, tokens, 3)):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    assert state["gate_up.weight"][narrow.cfg["intermediate"]:2 * narrow.cfg["intermediate"]].abs().sum() > 0
    with pytest.raises(ValueError, match="cannot narrow"):
        widen_mlp_state(state, narrow.cfg["intermediate"], torch.Generator())

    kw = dict(total_steps=4, budget=256, lr=3e-3, n_sub=64, unroll=2, fast=True, progress=False, ckpt_every=2, val_every=2)
    small = run_train(_copy_data(fast_data, tmp_path / "narrow"), **kw)
    init = tmp_path / "narrow" / "ckpts" / "draft_000004.pt"
    inter = small["draft"].cfg["intermediate"]
    res = run_train(_copy_data(fast_data, tmp_path / "wide"), init=init, intermediate=2 * inter, **kw)
    assert res["model"]["down.weight"].shape[1] == 2 * inter and res["draft"].cfg["intermediate"] == 2 * inter
    assert torch.load(tmp_path / "wide" / "ckpt.pt")["made"]["intermediate"] == 2 * inter
    wide_init = tmp_path / "wide" / "ckpts" / "draft_000004.pt"  # continuing a wide draft without the flag: named
    with pytest.raises(ValueError, match=f"pass --intermediate {2 * inter}"):
        run_train(_copy_data(fast_data, tmp_path / "again"), init=wide_init, **kw)
