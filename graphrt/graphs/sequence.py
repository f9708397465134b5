"""One sequence of steps, run eagerly and then replayed from one capture, compared step by step:
what `graphrt.testing`'s comparison checks and, with probes, what its localizer explains.

Both run this one function, so the localizer re-runs exactly what the comparison ran:

    eager, undone afterwards:   before_step(i); out = step(*args); args = advance(i, out, args)
    then:                       before_step(0); capture once from the first inputs
    replayed:                   before_step(i > 0); copy args into the static inputs; replay;
                                check step i; args = advance(i, out, args)

`advance` is what the caller does between steps (`next_inputs`: the next inputs, and anything
it changes on the way, such as a module's tensor); `before_step(i)` sets up the world of step i.
Both run between replays exactly as between eager steps, and the capture happens at the same
point of the sequence every time. With probes (graphrt.graphs.probe) the eager steps record
each module's inputs and output, the capture holds the probe copies, and each replayed step the
check finds different is localized (graphrt.graphs.localize).

State: the eager run is undone before the capture (its writes, the model's attributes, the
RNG), and so are the warmup and a tape's capture; the replays' writes stay, as a real run's
would. `Sequence.start.rewind()` puts back the state the sequence started from, so a second,
probed run starts where the first did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from graphrt.graphs import Graph, TapeGraph, capture, graph_kind, new_pool
from graphrt.graphs.lint import module_ranges, step_device
from graphrt.graphs.localize import Localization, StepComparer, record_step, tape_ops
from graphrt.graphs.probe import ProbeSet
from graphrt.graphs.restore import Start, preserved, rewound
from graphrt.graphs.tolerance import Tolerances

# (eager's inputs, the replay's inputs, eager's output, the replay's output) of one step ->
# (how the replay differs, in words, or None; the largest |Δ| of its floating outputs)
Check = Callable[[tuple, tuple, Any, Any], tuple[str | None, float]]
Advance = Callable[[int, Any, tuple], tuple]  # (step, its output, its inputs) -> the next inputs


@dataclass(frozen=True)
class Sequence:
    steps: int  # steps compared (up to the first that differs)
    divergence: str | None  # "step i: ..." where the check first found a difference
    max_abs_diff: float  # over the floating outputs of the steps that matched
    localization: Localization | None  # with probes
    start: Start  # the state the sequence started from


def kept(out: Any) -> Any:
    """A copy of every tensor in `out`: a graph overwrites its output on the next replay."""
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


def statics(args: tuple) -> list[Any]:
    """The static input buffers a graph of the step reads: a copy of each tensor argument."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def _named(args: tuple) -> dict[str, torch.Tensor]:
    return {str(i): a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}


def capture_undone(call: Callable[[], Any], model: nn.Module | None, device: torch.device,
                   warmup: int) -> tuple[Graph, Any]:
    """Warm `call` up `warmup` times and capture it, every run of it undone (a tape capture
    runs it once more); `(graph, static output)`."""
    # Warm up here rather than in `capture`, so the warmup can be undone; on CUDA on the pool's
    # side stream, the one the capture runs on (lazy cuBLAS set-up is per stream).
    pool = new_pool(device)
    side = contextlib.nullcontext()
    if pool.stream is not None:
        side = torch.cuda.stream(pool.stream)
        torch.cuda.synchronize(device)  # the eager run, on the caller's stream, is done
    with side, preserved(model):
        for _ in range(warmup):
            call()
    if pool.stream is not None:
        torch.cuda.synchronize(device)  # and so are the warmup and its undoing
    # A tape capture runs the step once more (a CUDA capture runs nothing): undo that call too.
    undo = preserved(model) if pool.kind == "tape" else contextlib.nullcontext()
    with undo:
        return capture(call, device=device, pool=pool, warmup=0)


def run_sequence(step: Callable[..., Any], first: tuple, steps: int, advance: Advance, *,
                 model: nn.Module | None, warmup: int, check: Check | None,
                 before_step: Callable[[int], None] | None = None,
                 probes: Tolerances | None = None) -> Sequence:
    """Run `steps` steps of `step` from the inputs `first` eagerly, then replay them from one
    capture, checking each replayed step with `check` (see the module's order); stop at the
    first that differs. With `probes` (the probes' tolerances per dtype), localize it: the
    first probe beyond its tolerance in that step. Without `check` the step is judged by its
    own probes (its inputs and output)."""
    before = before_step or (lambda i: None)
    device = step_device(model, first)
    ops = probes is not None and graph_kind(device) == "tape"
    eager_inputs, eager_outputs, eager_probes, eager_ops = [], [], [], []
    ranges = module_ranges(model) if probes is not None else contextlib.nullcontext()
    with ranges:
        with rewound(model) as start:
            args = first
            for i in range(steps):
                before(i)
                if probes is None:
                    out = step(*args)
                else:
                    out, recorded, op_values = record_step(lambda: step(*args), model, _named(args), ops=ops)
                    eager_probes.append(recorded)
                    eager_ops.append(op_values)
                eager_inputs.append(args)
                eager_outputs.append(kept(out))
                args = advance(i, out, args)
        before(0)
        buffers = statics(first)
        call = lambda: step(*buffers)  # noqa: E731
        probe_set = None
        if probes is not None:
            probe_set = ProbeSet(model, _named(tuple(buffers)))
            call = probe_set.wrap(call)
        graph, static_out = capture_undone(call, model, device, warmup)
        comparer = StepComparer(eager_probes, eager_ops, probes) if probes is not None else None
        args, largest, divergence, compared = first, 0.0, None, 0
        for i in range(steps):
            if i:
                before(i)
            for buffer, value in zip(buffers, args):
                if isinstance(buffer, torch.Tensor):
                    buffer.copy_(value)
            graph.replay()
            out = kept(static_out)
            compared += 1
            differs, diff = (None, 0.0) if check is None else check(eager_inputs[i], args, eager_outputs[i], out)
            if comparer is not None:
                read_ops = (lambda: tape_ops([graph], probe_set.storages())) if isinstance(graph, TapeGraph) else None
                comparer.compare(probe_set.values(), probe_set.copies, probe_set.bytes, read_ops,
                                 *(() if check is None else (differs,)))
                if check is None and comparer.stopped_at is not None:
                    differs = comparer.step_difference
            if differs is not None:
                divergence = f"step {i}: {differs}"
                break
            largest = max(largest, diff)
            args = advance(i, out, args)
    return Sequence(compared, divergence, largest, comparer and comparer.result(), start)
