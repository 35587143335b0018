"""Shared test settings."""

import torch

import specdec_lesson  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before anything imports triton)

# The unit tests run tiny models: one thread avoids thread start-up overhead and contention.
torch.set_num_threads(1)
