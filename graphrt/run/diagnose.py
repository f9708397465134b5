"""Where a graph mode of `graphrt run` first replays differently from eager: one extra probed
capture of that mode, and the run's own decode loop (graphrt.run.decode.decode: the same prefill,
the same greedy token and position step between steps) up to the step where the run saw the
difference, eagerly and through the probed graph, compared module by module.

Only modes that capture graphs (graph, piecewise) are probed, and only when they differ from
eager as the run's equivalence line judges (graphrt.run.equivalence: tokens diverge, or logits
beyond the dtype's rounding). A step is blamed only where it differs by that same rule; where
the re-run does not reproduce the run's difference, the localization says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from graphrt.backends.base import Backend
from graphrt.backends.factory import make_backend
from graphrt.backends.graph import GraphBackend
from graphrt.graphs import TapeGraph
from graphrt.graphs.lint import module_ranges
from graphrt.graphs.localize import Localization, OpValue, StepComparer, record_step, tape_ops
from graphrt.graphs.probe import Probe
from graphrt.graphs.restore import preserved
from graphrt.graphs.tolerance import tolerances_for
from graphrt.model.decoder import Qwen2ForCausalLM, greedy
from graphrt.run.decode import Generation, decode
from graphrt.run.equivalence import compare, logits_differ
from graphrt.vocab import Mode

PROBED_MODES = (Mode.GRAPH, Mode.PIECEWISE)
STEPS = 4  # decode steps compared where no run says which step differs


class _RecordingEager(Backend):
    """Eager decode steps, each one's logits, probes (and, for a tape, ops) kept."""

    name = "eager"

    def __init__(self, model: Qwen2ForCausalLM, ops: bool) -> None:
        super().__init__(model)
        self.ops = ops
        self.probes: list[list[Probe]] = []
        self.op_values: list[list[OpValue] | None] = []
        self.logits: list[torch.Tensor] = []

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits, probes, ops = record_step(lambda: self.model.decode_step(tokens, positions), self.model,
                                          {"tokens": tokens, "positions": positions}, ops=self.ops)
        self.probes.append(probes)
        self.op_values.append(ops)
        self.logits.append(logits.clone())
        return logits


def step_difference(eager: torch.Tensor, replay: torch.Tensor, dtype: torch.dtype) -> str | None:
    """How one replayed step's logits [B, V] differ from eager's by the run's rule, in words:
    its tokens diverge, or its logits differ beyond `dtype`'s rounding; None where neither."""
    tokens, eager_tokens = greedy(replay), greedy(eager)
    rows = (tokens != eager_tokens).flatten().nonzero()
    if len(rows):
        row = int(rows[0])
        return f"its tokens diverge: sequence {row} gets {int(tokens[row])}, eager {int(eager_tokens[row])}"
    found = logits_differ(eager, replay, dtype)
    return None if found is None else f"its logits differ beyond {str(dtype).removeprefix('torch.')} rounding ({found.describe()})"


class _ComparedReplay(Backend):
    """A probed graph backend's steps, each judged by the run's rule against eager's logits and,
    where it differs, localized by its probes as soon as it has run."""

    def __init__(self, backend: GraphBackend, comparer: StepComparer, eager_logits: list[torch.Tensor]) -> None:
        super().__init__(backend.model)
        self.name, self.backend, self.comparer, self.eager_logits = backend.name, backend, comparer, eager_logits

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = self.backend.step(tokens, positions)
        if self.comparer.done:
            return logits
        bs = self.backend.bucket(tokens.shape[0])
        probes = self.backend.probes[bs]
        graphs = self.backend._bucket_graphs(bs)
        skip = set().union(*(p.storages() for p in probes))
        read_ops = None
        if all(isinstance(graph, TapeGraph) for graph in graphs):
            read_ops = lambda: tape_ops(graphs, skip)  # noqa: E731
        differs = step_difference(self.eager_logits[self.comparer.compared], logits,
                                  self.model.lm_head.weight.dtype)
        self.comparer.compare(self.backend.probe_values(bs), sum(p.copies for p in probes),
                              sum(p.bytes for p in probes), read_ops, differs)
        return logits


def locate(mode: str, model: Qwen2ForCausalLM, prompt: torch.Tensor, *, steps: int = STEPS,
           buckets: tuple[int, ...] | None = None, lengths: torch.Tensor | None = None,
           expected: str | None = None) -> Localization:
    """Capture `mode` once more with probes, decode `steps` steps eagerly and then through it
    from the same state, and say where its first step that differs first differs. `expected`:
    the run's difference this explains (said again where the re-run does not reproduce it).
    What the graph's decode writes into the KV cache stays there, as after any decode."""
    backend = make_backend(mode, model, buckets, lint=False, probe=True)
    batch = prompt.shape[0]
    with module_ranges(model):
        backend.prepare(batch)
        eager = _RecordingEager(model, ops=backend.kind == "tape")
        with preserved(model):
            decode(eager, prompt, steps, warmup=1, keep_logits=False, lengths=lengths)
        padded = backend.bucket(batch) != batch
        comparer = StepComparer(eager.probes, eager.op_values, tolerances_for(backend.kind, padded), rows=batch)
        decode(_ComparedReplay(backend, comparer, eager.logits), prompt, steps, warmup=1,
               keep_logits=False, lengths=lengths)
    found = comparer.result()
    return found if expected is None else found.explaining(expected)


def locate_differences(generations: Mapping[str, Generation], model: Qwen2ForCausalLM, dtype: torch.dtype,
                       prompt: torch.Tensor, buckets: tuple[int, ...] | None, lengths: torch.Tensor | None
                       ) -> dict[str, Localization]:
    """A localization for each graph mode among `generations` that differs from eager's (the
    equivalence line's rule), re-decoding `prompt` up to the first step that differs."""
    eager = generations.get("eager")
    found = {}
    for mode, gen in generations.items():
        if eager is None or mode not in PROBED_MODES:
            continue
        equivalence = compare(eager, gen, dtype)
        if equivalence.differs:
            found[mode] = locate(mode, model, prompt, steps=equivalence.first_step + 1,
                                 buckets=buckets, lengths=lengths,
                                 expected=f"the run's {equivalence.describe()}")
    return found
