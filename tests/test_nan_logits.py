"""Damaged weights (a NaN in the cached weights) must stop every engine path with one clear error naming the model
and the step, never emit garbage tokens silently (greedy decoding of NaN logits repeats token 0)."""

from __future__ import annotations

import pytest
import torch

from specdec_lesson.drafters import ModelDrafter
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import NonFiniteLogitsError, SamplingConfig, check_logits
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.tree import DynamicTree, StaticTree, tree_generate

PROMPT = [[3, 5, 7, 11]]


def _damaged(**kw) -> torch.nn.Module:
    """A tiny model whose final norm holds a NaN: every logit comes out NaN, as with a damaged weights file."""
    model = tiny_llama(**kw)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    return model


def _target() -> torch.nn.Module:
    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=0)


def _draft(seed: int = 1) -> torch.nn.Module:
    return tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=seed)


def _damaged_draft() -> torch.nn.Module:
    return _damaged(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)


def _message_ok(exc: pytest.ExceptionInfo, model: str) -> None:
    text = str(exc.value)
    assert f"the {model} model's logits hold NaN" in text and "decoding step 1" in text
    assert "SPECDEC_CACHE" in text and "~/.cache/specdec_lesson" in text  # the fix
    assert "\n" not in text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_autoregressive_refuses_nan_logits(temperature):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(NonFiniteLogitsError) as exc:
        autoregressive_generate(_damaged(), PROMPT, 4, temperature, generator=g)
    _message_ok(exc, "target")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("verify", ["token", "block"])
def test_speculative_names_a_damaged_target(temperature, verify):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(NonFiniteLogitsError) as exc:
        speculative_generate(_damaged(), _draft(), PROMPT, 4, k=2, temperature=temperature, generator=g, verify=verify)
    _message_ok(exc, "target")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_names_a_damaged_draft(temperature):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(NonFiniteLogitsError) as exc:
        speculative_generate(_target(), _damaged_draft(), PROMPT, 4, k=2, temperature=temperature, generator=g)
    _message_ok(exc, "draft")
    with pytest.raises(NonFiniteLogitsError, match="draft model"):  # a drafter object: the same
        speculative_generate(_target(), ModelDrafter(_damaged_draft()), PROMPT, 4, k=2, temperature=temperature, generator=g)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tree", [StaticTree((2, 1), "sample"), StaticTree((2, 1), "topk"), DynamicTree(2, 2, 3)])
def test_tree_names_the_damaged_model(temperature, tree):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(NonFiniteLogitsError) as exc:
        tree_generate(_damaged(), _draft(), PROMPT, 4, tree, temperature, generator=g)
    _message_ok(exc, "target")
    with pytest.raises(NonFiniteLogitsError) as exc:
        tree_generate(_target(), _damaged_draft(), PROMPT, 4, tree, temperature, generator=g)
    _message_ok(exc, "draft")


def test_check_logits_allows_masked_tokens_only():
    ok = torch.tensor([[0.0, float("-inf"), 2.0]])  # a masked token (EAGLE's sub-vocabulary, padding): fine
    check_logits(ok)
    SamplingConfig(1.0).probs(ok)
    for bad in ([[0.0, float("nan"), 2.0]], [[0.0, float("inf"), 2.0]], [[float("-inf")] * 3]):
        with pytest.raises(NonFiniteLogitsError, match="a model's logits hold NaN or infinite values: its weights"):
            SamplingConfig(0.0).probs(torch.tensor(bad))


def test_healthy_models_still_run():
    g = torch.Generator().manual_seed(0)
    out, _ = speculative_generate(_target(), _draft(), PROMPT, 6, k=2, temperature=1.0, generator=g)
    ref, _ = autoregressive_generate(_target(), PROMPT, 6)
    tree_out, _ = tree_generate(_target(), _draft(), PROMPT, 6)
    assert len(out[0]) == 6 and torch.equal(tree_out[0], ref[0])
