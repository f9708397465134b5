"""Piecewise graphs: every stretch of the step between attention cores is a graph, the cores
run eagerly between replays (vLLM's default capture).

For L layers a bucket's step is L+1 graphs around L eager attention cores:

    piece 0      embedding, mask, rotary, layer 0's input norm, q/k/v projections and rotary
    core i       layer i's attention core: the K/V cache writes and one attention op (eager)
    piece i      layer i-1's o_proj, residual, MLP; layer i's norm, q/k/v and rotary (0 < i < L)
    piece L      layer L-1's o_proj, residual, MLP; the final norm and lm_head

The graphs are the graph backend's: the same buckets, static inputs and one memory pool for
every piece of every bucket. A core reads the q/k/v its piece left in graph memory and writes
its result into one static hand-off buffer, which the next piece reads: a graph reads only
fixed addresses, and the cores run in the order the pieces need them, so one buffer serves
every layer.

On transformers' own forward, whose seams graphrt does not write, the breaks are its attention
modules, found in its module tree (graphrt.graphs.segments; `ModulePiecewiseBackend`). Unlike
graphrt's own step, where only the attention core (cache write and attention) is eager, the break
there is the whole attention module: its q/k/v and o projections run eagerly too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graphrt.backends.graph import GraphBackend
from graphrt.graphs import Graph, GraphPool, capture
from graphrt.graphs.segments import attention_modules, capture_pieces
from graphrt.measure.nvtx import nvtx_range
from graphrt.model.decoder import Qwen2DecoderLayer


@dataclass(frozen=True, eq=False)
class Pieces:
    """One bucket's step: `graphs[i]` replays, then `cores[i]` runs, ..., then `graphs[-1]`."""

    graphs: tuple[Graph, ...]  # L + 1, in step order
    cores: tuple[Callable[[], None], ...]  # L: layer i's attention core, into the hand-off buffer
    # NVTX range names, made once rather than at every step. The whole step is one
    # `decode_step[...]` range (what `graphrt analyze` takes for a step); pieces and cores
    # are ranges inside it, named so that none of them reads as a step of its own.
    step_range: str
    graph_ranges: tuple[str, ...]
    core_ranges: tuple[str, ...]


class PiecewiseBackend(GraphBackend):
    """L+1 graphs per bucket around L eager attention cores; see the module docstring.

    `graphs[bs]` is `(Pieces, static logits [bs, V])`.
    """

    name = "piecewise"

    def _allocate_inputs(self, rows: int, device: torch.device) -> None:
        super()._allocate_inputs(rows, device)
        # the attention core's output [rows, 1, H*D] (a tensor-parallel rank's H heads): what
        # each piece after the first reads
        heads = self.model.model.layers[0].self_attn.o_proj.in_features
        self.attended = torch.zeros(rows, 1, heads,
                                    dtype=self.model.lm_head.weight.dtype, device=device)

    def _capture_bucket(self, bs: int, pool: GraphPool) -> None:
        model, layers = self.model, list(self.model.model.layers)
        tokens, positions, attended = self.tokens[:bs], self.positions[:bs].unsqueeze(1), self.attended[:bs]

        def grab(fn: Callable[[], tuple], last: bool = False) -> tuple:
            probed = self._probed(bs, fn, first=not graphs, last=last)
            graph, out = capture(probed, device=pool.device, pool=pool)
            graphs.append(graph)
            return out

        def first() -> tuple[torch.Tensor, ...]:
            x, mask, cos, sin = model.embed(tokens, positions)
            return (x, mask, cos, sin, *layers[0].qkv(x, cos, sin))

        def middle(x: torch.Tensor, done: Qwen2DecoderLayer, layer: Qwen2DecoderLayer
                   ) -> tuple[torch.Tensor, ...]:
            x = done.finish(x, attended)
            return (x, *layer.qkv(x, cos, sin))

        graphs: list[Graph] = []
        x, mask, cos, sin, *qkv = grab(first)
        cores = [self._core(layers[0], qkv, positions, mask, attended)]
        for done, layer in zip(layers, layers[1:]):
            x, *qkv = grab(lambda x=x, done=done, layer=layer: middle(x, done, layer))
            cores.append(self._core(layer, qkv, positions, mask, attended))
        logits = grab(lambda x=x: model.head(layers[-1].finish(x, attended))[:, -1], last=True)
        self.graphs[bs] = (Pieces(
            tuple(graphs), tuple(cores), f"decode_step[piecewise,bs={bs}]",
            tuple(f"piece[bs={bs},i={i}]" for i in range(len(graphs))),
            tuple(f"attend[bs={bs},layer={i}]" for i in range(len(cores)))), logits)

    @staticmethod
    def _core(layer: Qwen2DecoderLayer, qkv: list[torch.Tensor], positions: torch.Tensor,
              mask: torch.Tensor, attended: torch.Tensor) -> Callable[[], None]:
        q, k, v = qkv

        def core() -> None:
            attended.copy_(layer.self_attn.attend(q, k, v, positions, mask))

        return core

    def _bucket_graphs(self, bs: int) -> tuple[Graph, ...]:
        return self.graphs[bs][0].graphs

    def _run_bucket(self, bs: int) -> torch.Tensor:
        pieces, logits = self.graphs[bs]
        with nvtx_range(pieces.step_range):
            for graph, name, core, core_name in zip(pieces.graphs, pieces.graph_ranges, pieces.cores,
                                                    pieces.core_ranges):
                with nvtx_range(name):
                    graph.replay()
                with nvtx_range(core_name):
                    core()
            with nvtx_range(pieces.graph_ranges[-1]):
                pieces.graphs[-1].replay()
        return logits


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
