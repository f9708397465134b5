"""Checks for your own step function, for pytest: does a graph of it replay like eager?

    from graphrt.testing import assert_replays_like_eager

    def test_my_decoder_replays_like_eager():
        assert_replays_like_eager(
            model.eval(), (token, position), steps=16,
            next_inputs=lambda logits, token, position: (logits.argmax(-1), position + 1))

`assert_replays_like_eager` first lints the step (`graphrt.graphs.lint_step`, from the inputs of
its first two steps), then runs it `steps` times eagerly, then captures it once (a CUDA graph on
CUDA, a TapeGraph elsewhere) and replays it for the same steps, copying each step's inputs into
the static buffers as a graph runner does. Outputs must match: integer and boolean outputs
exactly, floating ones within `atol + rtol * |eager|` (0 and 0 by default: bitwise, which a tape
gives). The first difference fails the test with its step, output and size, and under it
where the replay first differs: `localize(step, states)` captures the step once more with a
probe on every module and names the first module whose replayed output differs from eager's
(graphrt.graphs.localize); it also gives that verdict as data for any step.

State: the eager run is undone before the graph runs (`graphrt.graphs.restore.preserved`: the
tensors it wrote, the module attributes, the RNG), so both start from the same state; the graph
run's writes stay, as a real one's would.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from graphrt.errors import GraphrtError
from graphrt.graphs import Graph, LintReport, TapeGraph, capture, graph_kind, lint_step, new_pool
from graphrt.graphs.lint import module_ranges, owning_module, step_device
from graphrt.graphs.localize import (Localization, StepComparer, Tolerances, record_step, tape_ops,
                                     tolerances_for, uniform_tolerance)
from graphrt.graphs.probe import ProbeSet
from graphrt.graphs.restore import preserved

__all__ = ["assert_lint_clean", "assert_replays_like_eager", "compare_replay", "ReplayComparison",
           "first_difference", "localize", "Localization"]


@dataclass(frozen=True)
class ReplayComparison:
    steps: int
    divergence: str | None  # the first difference, in words; None when every step matched
    max_abs_diff: float  # over the floating outputs of the steps that matched

    @property
    def matches(self) -> bool:
        return self.divergence is None

    def describe(self) -> str:
        if self.divergence is None:
            return f"replay matches eager over {self.steps} steps (max |Δ| {self.max_abs_diff:.3g})"
        return f"replay differs from eager: {self.divergence}"


def _args(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _kept(out: Any) -> Any:
    """A copy of every tensor in `out`: a graph overwrites its output on the next replay."""
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


def first_difference(eager: Any, other: Any, atol: float = 0.0, rtol: float = 0.0
                     ) -> tuple[str | None, float]:
    """Where `other` first differs from `eager` (pytrees of tensors and Python values), in
    words, or None; and the largest |Δ| over their floating tensors."""
    leaves, spec = tree_flatten(eager)
    others, other_spec = tree_flatten(other)
    if spec != other_spec:
        return f"the output's structure is {other_spec}, eager's {spec}", 0.0
    largest = 0.0
    for i, (a, b) in enumerate(zip(leaves, others)):
        where = f"output {i}" if len(leaves) > 1 else "the output"
        if not isinstance(a, torch.Tensor):
            if a != b:
                return f"{where} is {b!r}, eager's {a!r}", largest
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where} is {b.dtype} {list(b.shape)}, eager's {a.dtype} {list(a.shape)}", largest
        if not a.is_floating_point():
            if not torch.equal(a, b):
                index = tuple((a != b).nonzero()[0].tolist())
                return f"{where} at {index} is {b[index].item()}, eager's {a[index].item()}", largest
            continue
        diff = (a.double() - b.double()).abs()
        excess = diff - (atol + rtol * a.double().abs())
        largest = max(largest, diff.max().item() if diff.numel() else 0.0)
        if excess.numel() and (excess.max() > 0 or excess.isnan().any()):
            worst = excess.nan_to_num(nan=math.inf).argmax()
            index = tuple(int(k) for k in torch.unravel_index(worst, a.shape))
            message = (f"{where} at {index} is {b[index].item():.6g}, eager's {a[index].item():.6g} "
                       f"(|Δ| {diff[index].item():.3g} > atol {atol:g} + rtol {rtol:g} × |eager|)")
            return message, largest
    return None, largest


def _eager_run(step: Callable[..., Any], first: tuple, steps: int,
               next_inputs: Callable[..., Any] | None) -> tuple[list[tuple], list[Any]]:
    inputs, outputs, args = [], [], first
    for _ in range(steps):
        out = step(*args)
        inputs.append(args)
        outputs.append(_kept(out))
        args = _args(next_inputs(out, *args)) if next_inputs else args
    return inputs, outputs


def _statics(args: tuple) -> list[Any]:
    """The static input buffers a graph of the step reads: a copy of each tensor argument."""
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def _capture_undone(call: Callable[[], Any], model: nn.Module | None, device: torch.device,
                    warmup: int) -> tuple[Graph, Any]:
    """Warm `call` up `warmup` times and capture it, every run of it undone (a tape capture
    runs it once more); `(graph, static output)`."""
    # Warm up here rather than in `capture`, so the warmup can be undone; on CUDA on the pool's
    # side stream, the one the capture runs on (lazy cuBLAS set-up is per stream).
    pool = new_pool(device)
    side = contextlib.nullcontext()
    if pool.stream is not None:  # pragma: no mutate block (CUDA only)
        side = torch.cuda.stream(pool.stream)
        torch.cuda.synchronize(device)  # the eager run, on the caller's stream, is done
    with side, preserved(model):
        for _ in range(warmup):
            call()
    if pool.stream is not None:  # pragma: no mutate block (CUDA only)
        torch.cuda.synchronize(device)  # and so are the warmup and its undoing
    # A tape capture runs the step once more (a CUDA capture runs nothing): undo that call too.
    undo = preserved(model) if pool.kind == "tape" else contextlib.nullcontext()  # pragma: no mutate (CUDA only)
    with undo:
        return capture(call, device=device, pool=pool, warmup=0)  # pragma: no mutate (CUDA only)


def compare_replay(step: Callable[..., Any], inputs: Any, *, steps: int = 8,
                   next_inputs: Callable[..., Any] | None = None, atol: float = 0.0,
                   rtol: float = 0.0, model: nn.Module | None = None,
                   warmup: int = 2) -> ReplayComparison:
    """Run `step(*inputs)` `steps` times eagerly, then as one captured graph replayed `steps`
    times; compare step by step. `next_inputs(output, *inputs)` gives the next step's inputs
    (the same inputs every step without it). The step is warmed up `warmup` times before the
    capture, and those calls are undone too."""
    model = model if model is not None else owning_module(step)
    first = _args(inputs)
    with preserved(model):
        eager_inputs, eager_outputs = _eager_run(step, first, steps, next_inputs)
    statics = _statics(first)
    graph, static_out = _capture_undone(lambda: step(*statics), model, step_device(model, first), warmup)
    args, largest = first, 0.0
    for i in range(steps):
        differs, _ = first_difference(eager_inputs[i], args)
        if differs is not None:
            return ReplayComparison(steps, f"step {i}: its inputs differ from eager's "
                                           f"({differs.replace('output', 'input')})", largest)
        for static, value in zip(statics, args):
            if isinstance(static, torch.Tensor):
                static.copy_(value)
        graph.replay()
        out = _kept(static_out)
        differs, diff = first_difference(eager_outputs[i], out, atol, rtol)
        if differs is not None:
            return ReplayComparison(steps, f"step {i}: {differs}", largest)
        largest = max(largest, diff)
        args = _args(next_inputs(out, *args)) if next_inputs else args
    return ReplayComparison(steps, None, largest)


def assert_lint_clean(step: Callable[..., Any], states: list[Any], *,
                      model: nn.Module | None = None) -> LintReport:
    """Fail, listing every finding, unless `lint_step(step, states)` finds nothing."""
    report = lint_step(step, states, model=model)
    if not report.clean:
        raise AssertionError(f"a graph of this step would not replay like eager\n{report}")
    return report


def assert_replays_like_eager(step: Callable[..., Any], inputs: Any, *, steps: int = 8,
                              next_inputs: Callable[..., Any] | None = None, atol: float = 0.0,
                              rtol: float = 0.0, model: nn.Module | None = None,
                              lint: bool = True) -> ReplayComparison:
    """Fail unless the step is lint-clean (from the inputs of its first two steps) and a graph
    of it replays like eager for `steps` steps (see `compare_replay`)."""
    model = model if model is not None else owning_module(step)
    if lint:
        first = _args(inputs)
        with preserved(model):
            second = _args(next_inputs(step(*first), *first)) if next_inputs else first
        assert_lint_clean(step, [first, second], model=model)
    result = compare_replay(step, inputs, steps=steps, next_inputs=next_inputs, atol=atol,
                            rtol=rtol, model=model)
    if not result.matches:
        with preserved(model):
            states, _ = _eager_run(step, _args(inputs), steps, next_inputs)
        where = localize(step, states, model=model, tolerances=uniform_tolerance(atol, rtol))
        raise AssertionError(f"{result.describe()}\n{where.describe()}")
    return result


def _named(args: tuple) -> dict[str, torch.Tensor]:
    return {str(i): a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}


def localize(step: Callable[..., Any], states: Sequence[Any], *, model: nn.Module | None = None,
             before_step: Callable[[int], None] | None = None, tolerances: Tolerances | None = None,
             warmup: int = 2) -> Localization:
    """Where a graph of `step` first replays differently from eager: run `step(*states[i])`
    eagerly for every state, then capture it once with a probe on every module and replay it
    for the same states (copied into its static inputs), comparing each replay's probes with
    the eager step's in call order (graphrt.graphs.localize). Stops at the first difference.

    `before_step(i)`, where given, sets up the world of step i: it runs before step i in both
    runs, and before the capture as for step 0. It is what a caller does between steps: rebind
    a module's tensor, replace a tensor the step reads. `tolerances`: (atol, rtol) per floating
    dtype; by default exact on a tape, `graphrt.graphs.localize.LAST_BITS` for a CUDA
    graph. State as in `compare_replay`: the eager run, the warmup and a tape's capture are
    undone, the replays' writes stay.
    """
    if warmup < 1:
        raise GraphrtError(f"localize needs warmup >= 1 (its first call sizes the probes), got {warmup}")
    if not states:
        raise GraphrtError("localize needs at least one input state")
    model = model if model is not None else owning_module(step)
    before = before_step or (lambda i: None)
    calls = [_args(state) for state in states]
    device = step_device(model, calls[0])
    kind = graph_kind(device)
    eager_probes, eager_ops = [], []
    with module_ranges(model):
        with preserved(model):
            for i, args in enumerate(calls):
                before(i)
                _, probes, ops = record_step(lambda: step(*args), model, _named(args), ops=kind == "tape")
                eager_probes.append(probes)
                eager_ops.append(ops)
        before(0)
        statics = _statics(calls[0])
        probe_set = ProbeSet(model, _named(tuple(statics)))
        graph, _ = _capture_undone(probe_set.wrap(lambda: step(*statics)), model, device, warmup)
        comparer = StepComparer(eager_probes, eager_ops, tolerances if tolerances is not None else tolerances_for(kind))
        skip = probe_set.storages()
        for i, args in enumerate(calls):
            if comparer.done:
                break
            before(i)
            for static, value in zip(statics, args):
                if isinstance(static, torch.Tensor):
                    static.copy_(value)
            graph.replay()
            read_ops = (lambda: tape_ops([graph], skip)) if isinstance(graph, TapeGraph) else None
            comparer.compare(probe_set.values(), probe_set.copies, probe_set.bytes, read_ops)
    return comparer.result()
