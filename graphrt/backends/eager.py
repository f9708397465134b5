from __future__ import annotations

import torch

from graphrt.backends.base import Backend
from graphrt.measure.nvtx import nvtx_range


class EagerBackend(Backend):
    """The step as PyTorch runs it: every kernel launched from Python, every time."""

    name = "eager"

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with nvtx_range("decode_step[eager]"):
            return self.model.decode_step(tokens, positions)
