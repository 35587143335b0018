"""Shared test settings."""

import pytest
import torch

import specdec_lesson  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before anything imports triton)

# The unit tests run tiny models: one thread avoids thread start-up overhead and contention.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _transformers_weight_tying_left_on():
    """transformers switches weight tying off process-wide inside ``from_pretrained`` (not thread-safe): a test that
    loads models from two threads can leave it off, and every later tied model then loads half-empty."""
    from transformers.modeling_utils import PreTrainedModel

    before = PreTrainedModel.tie_weights
    yield
    assert PreTrainedModel.tie_weights is before, "a test left transformers' weight tying switched off"
