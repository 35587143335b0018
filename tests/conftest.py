"""Shared test settings."""

import torch

# The unit tests run tiny models: one thread avoids thread start-up overhead and contention.
torch.set_num_threads(1)
