"""EagleDrafter(dispatch_like=target): the draft's linears pre-packed when the target's are, each width routed as the
target's engine forward routes it, and the output still the target's (greedy tokens equal plain decoding)."""

from __future__ import annotations

import pytest
import torch

from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
from specdec_lesson.fastcpu import PackedLinear, count_packed, packed_linear_available, prepack_linears, set_plain_rows
from specdec_lesson.lean.path import engine_plain_rows
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import SamplingConfig
from specdec_lesson.speculative import autoregressive_generate, speculative_generate

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="no pre-packed oneDNN linear in this build")

PROMPTS = [[3, 9, 27, 3, 9], [5, 17, 3, 44, 9, 2, 8]]


def _draft(target, seed: int = 0) -> EagleDraft:
    torch.manual_seed(seed)
    V = target.get_input_embeddings().weight.shape[0]
    return EagleDraft(EagleConfig.from_target(target, V), *_target_tables(target), d2t=torch.arange(V)).eval()


def _draft_rows(drafter: EagleDrafter) -> set[int]:
    return {m.plain_rows_max for m in drafter.model.modules() if isinstance(m, PackedLinear)}


def test_draft_is_packed_like_the_target_and_follows_its_dispatch():
    target = tiny_llama(vocab_size=64, dtype=torch.float32, seed=0)
    alone = [autoregressive_generate(target, [p], 20)[0][0] for p in PROMPTS]
    assert count_packed(EagleDrafter(_draft(target), dispatch_like=target).model) == 0  # plain target: plain draft
    prepack_linears(target)
    drafter = EagleDrafter(_draft(target), dispatch_like=target)
    assert count_packed(drafter.model) == 5  # fc, qkv, o, gate_up, down
    for rows in (0, 1, 3):
        set_plain_rows(target, rows)
        assert engine_plain_rows(target) == rows
        for p, ref in zip(PROMPTS, alone):
            out, stats = speculative_generate(target, drafter, [p], 20, k=3)
            assert torch.equal(out[0], ref)  # exact: the draft's arithmetic never changes the output
            assert _draft_rows(drafter) == {rows}  # begin() read the target's threshold for this run
            assert stats.draft_forwards > 0


def test_packed_draft_proposes_what_the_plain_draft_proposes():
    """Pre-packing changes the summation order only (fp32 rounding): on a fixed context the greedy proposals agree."""
    target = prepack_linears(tiny_llama(vocab_size=64, dtype=torch.float32, seed=1))
    plain, packed = EagleDrafter(_draft(target, 2)), EagleDrafter(_draft(target, 2), dispatch_like=target)
    ctx = torch.tensor([[4, 8, 15, 16, 23, 42, 7]])
    feats = torch.randn(1, 6, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    props = []
    for d in (plain, packed):
        d.begin(ctx, torch.ones_like(ctx, dtype=torch.bool), feats)
        props.append(d.propose(4, SamplingConfig(0.0), None)[0])
    assert count_packed(packed.model) == 5 and count_packed(plain.model) == 0
    assert packed.head_packed is not None and plain.head_packed is None  # the output rows too
    assert torch.equal(props[0], props[1])
