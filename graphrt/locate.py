"""Where a graph mode of `graphrt run` first replays differently from eager: one extra probed
capture of that mode and a few decode steps, compared module by module with eager's.

Only modes that capture graphs (graph, piecewise) are probed, and only when their tokens or
logits differ from eager's: the capture and steps cost about what the mode's own did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from graphrt.backends import Backend
from graphrt.backends.factory import make_backend
from graphrt.backends.graph import GraphBackend
from graphrt.engine import decode
from graphrt.equivalence import compare
from graphrt.graphs import TapeGraph
from graphrt.graphs.lint import module_ranges
from graphrt.graphs.localize import (Localization, OpValue, StepComparer, record_step, tape_ops,
                                     tolerances_for)
from graphrt.graphs.restore import preserved
from graphrt.graphs.probe import Probe
from graphrt.model import Qwen2ForCausalLM

if TYPE_CHECKING:
    from graphrt.runner import RunResult

PROBED_MODES = ("graph", "piecewise")
STEPS = 4  # decode steps compared: a difference a run shows mostly shows within its first few


class _RecordingEager(Backend):
    """Eager decode steps, each one's probes (and, for a tape, its ops) kept."""

    name = "eager"

    def __init__(self, model: Qwen2ForCausalLM, ops: bool) -> None:
        super().__init__(model)
        self.ops = ops
        self.probes: list[list[Probe]] = []
        self.op_values: list[list[OpValue] | None] = []

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits, probes, ops = record_step(lambda: self.model.decode_step(tokens, positions), self.model,
                                          {"tokens": tokens, "positions": positions}, ops=self.ops)
        self.probes.append(probes)
        self.op_values.append(ops)
        return logits


class _ComparedReplay(Backend):
    """A probed graph backend's steps, each compared with eager's as soon as it has run."""

    def __init__(self, backend: GraphBackend, comparer: StepComparer) -> None:
        super().__init__(backend.model)
        self.name, self.backend, self.comparer = backend.name, backend, comparer

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = self.backend.step(tokens, positions)
        bs = self.backend.bucket(tokens.shape[0])
        probes = self.backend.probes[bs]
        graphs = self.backend._bucket_graphs(bs)
        skip = set().union(*(p.storages() for p in probes))
        read_ops = None
        if all(isinstance(graph, TapeGraph) for graph in graphs):
            read_ops = lambda: tape_ops(graphs, skip)  # noqa: E731
        self.comparer.compare(self.backend.probe_values(bs), sum(p.copies for p in probes),
                              sum(p.bytes for p in probes), read_ops)
        return logits


def locate(mode: str, model: Qwen2ForCausalLM, prompt: torch.Tensor, *, steps: int = STEPS,
           buckets: tuple[int, ...] | None = None, lengths: torch.Tensor | None = None) -> Localization:
    """Capture `mode` once more with probes, decode `steps` steps eagerly and then through it
    from the same state, and say where its first step that differs first differs. What the
    graph's decode writes into the KV cache stays there, as after any decode."""
    backend = make_backend(mode, model, buckets, lint=False, probe=True)
    batch = prompt.shape[0]
    with module_ranges(model):
        backend.prepare(batch)
        eager = _RecordingEager(model, ops=backend.kind == "tape")
        with preserved(model):
            decode(eager, prompt, steps, warmup=1, keep_logits=False, lengths=lengths)
        padded = backend.bucket(batch) != batch
        comparer = StepComparer(eager.probes, eager.op_values, tolerances_for(backend.kind, padded), rows=batch)
        decode(_ComparedReplay(backend, comparer), prompt, steps, warmup=1, keep_logits=False, lengths=lengths)
    return comparer.result()


def locate_differences(result: RunResult, model: Qwen2ForCausalLM, lengths: torch.Tensor | None
                       ) -> dict[str, Localization]:
    """A localization for each graph mode of the run whose tokens or logits differ from eager's."""
    eager = result.generations.get("eager")
    found = {}
    for mode, gen in result.generations.items():
        if eager is None or mode not in PROBED_MODES:
            continue
        equivalence = compare(eager, gen)
        if not equivalence.identical or (equivalence.max_abs_logit_diff or 0.0) > 0.0:
            found[mode] = locate(mode, model, result.prompt, steps=min(STEPS, result.spec.steps),
                                 buckets=result.spec.buckets, lengths=lengths)
    return found
