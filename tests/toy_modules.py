"""Small modules the replay tests share."""

from __future__ import annotations

from torch import nn


class CountsCalls(nn.Module):
    """Returns, next to a tensor, how often it has run: a Python value, which a graph freezes."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2, self.calls
