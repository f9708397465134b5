"""Piecewise graphs of any model: graphs between the calls of its attention modules, found in its
module tree (graphrt.graphs.segments), each such module run eagerly between replays. What the
piecewise mode runs on transformers' own forward, whose seams graphrt does not write.

Unlike graphrt's own step, where only the attention core (cache write and attention) is eager,
the break here is the whole attention module: its q/k/v and o projections run eagerly too.
"""

from __future__ import annotations

import torch

from graphrt.backends.graph import GraphBackend
from graphrt.backends.piecewise import Pieces, PiecewiseBackend
from graphrt.graphs import GraphPool
from graphrt.graphs.segments import attention_modules, capture_pieces


class ModulePiecewiseBackend(PiecewiseBackend):
    """L+1 graphs per bucket around L eager attention modules; `graphs[bs]` is
    `(Pieces, static logits [bs, V])`, replayed as PiecewiseBackend replays its own."""

    def _allocate_inputs(self, rows: int, device: torch.device) -> None:
        GraphBackend._allocate_inputs(self, rows, device)  # a module's outputs are its own hand-off

    def _capture_bucket(self, bs: int, pool: GraphPool) -> None:
        step = self._probed(bs, lambda: self.model.decode_step(self.tokens[:bs], self.positions[:bs]),
                            first=True, last=True)
        graphs, calls, logits = capture_pieces(step, attention_modules(self.model), device=pool.device,
                                               pool=pool)
        names = {module: name for name, module in self.model.named_modules()}
        self.graphs[bs] = (Pieces(
            tuple(graphs), tuple(call for _, call in calls), f"decode_step[piecewise,bs={bs}]",
            tuple(f"piece[bs={bs},i={i}]" for i in range(len(graphs))),
            tuple(f"attend[bs={bs},{names[module]}]" for module, _ in calls)), logits)
