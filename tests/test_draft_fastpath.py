"""The EAGLE drafter's cheap paths compute what its general paths compute: RoPE from tables, a one-token step without
a mask when the run has no holes, and trees built from the run's subset logits (``SubsetLogits``) rather than
full-vocabulary ones."""

from __future__ import annotations

import torch

from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import SamplingConfig, SubsetLogits
from specdec_lesson.speculative import autoregressive_generate
from specdec_lesson.tree.generate import tree_generate
from specdec_lesson.tree.structure import DynamicTree, StaticTree, build_tree, expand_of

CTX = torch.tensor([[4, 8, 15, 16, 23, 42, 7]])


def _drafter(target, n_sub: int = 24) -> EagleDrafter:
    torch.manual_seed(3)
    model = EagleDraft(EagleConfig.from_target(target, n_sub), *_target_tables(target, torch.float64),
                       d2t=torch.arange(5, 5 + 2 * n_sub, 2)).to(torch.float64).eval()
    return EagleDrafter(model)


def _begin(drafter: EagleDrafter, target) -> None:
    feats = torch.randn(1, CTX.shape[1] - 1, target.config.hidden_size, generator=torch.Generator().manual_seed(0),
                        dtype=torch.float64)
    drafter.begin(CTX, torch.ones_like(CTX, dtype=torch.bool), feats)


@torch.inference_mode()
def test_unmasked_one_token_steps_equal_masked_ones():
    target = tiny_llama(vocab_size=128, dtype=torch.float32, seed=0)
    fast, masked = _drafter(target), _drafter(target)
    for d in (fast, masked):
        _begin(d, target)
    assert fast.dense
    masked.dense = False  # the general path: the [B, M, S] mask built every step
    outs = []
    for d in (fast, masked):
        g = d.g_last
        gs = []
        for tok in (9, 30, 51):  # three drafted tokens fed one at a time, as propose feeds them
            g = d._step(g[:, None], torch.tensor([[tok]]), torch.ones(1, 1, dtype=torch.bool))[:, 0]
            d.cursor += 1
            gs.append(g)
        outs.append(torch.stack(gs))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    # and the tables give what the model's own RoPE gives
    pos = torch.tensor([[0, 5, 17]])
    for a, b in zip(fast._rope(pos), fast.model.rope(pos)):
        assert torch.equal(a, b)


def test_a_padded_row_keeps_the_mask():
    target = tiny_llama(vocab_size=128, dtype=torch.float32, seed=0)
    d = _drafter(target)
    mask = torch.ones_like(CTX, dtype=torch.bool)
    mask[0, 0] = False  # a left-padded prompt: a hole the mask must hide
    d.begin(CTX, mask, torch.zeros(1, CTX.shape[1] - 1, target.config.hidden_size, dtype=torch.float64))
    assert not d.dense


@torch.inference_mode()
def test_trees_from_subset_logits_equal_trees_from_full_logits():
    target = tiny_llama(vocab_size=128, dtype=torch.float32, seed=0)
    greedy = SamplingConfig(0.0)
    for spec in (DynamicTree(depth=3, topk=3, num_nodes=7), StaticTree((3, 2, 1))):
        trees = []
        for expand in ("tree_expand", "tree_expand_subset"):
            d = _drafter(target)
            _begin(d, target)
            trees.append(build_tree(spec, 7, getattr(d, expand), greedy))
        assert trees[0].tokens == trees[1].tokens and trees[0].parents == trees[1].parents, spec
    d = _drafter(target)
    _begin(d, target)
    assert expand_of(d) == d.tree_expand_subset
    sub = d.tree_expand_subset(build_tree(DynamicTree(1, 1, 1), 7, d.tree_expand, greedy), [0])
    assert isinstance(sub, SubsetLogits) and sub.values.shape == (1, len(d.d2t))
    assert torch.equal(sub.full()[:, d.d2t], sub.values) and torch.isinf(sub.full()).sum() == 128 - len(d.d2t)
    # greedy tree decoding through the subset path is still the target's own greedy output
    ref, _ = autoregressive_generate(target, CTX.tolist(), 16)
    out, _ = tree_generate(target, _drafter(target), CTX.tolist(), 16, tree=DynamicTree(depth=3, topk=3, num_nodes=6))
    assert torch.equal(out[0], ref[0])
