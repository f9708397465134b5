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
where the replay first differs: the state is put back where the comparison started and the very
same sequence (graphrt.graphs.sequence: the same inputs, `next_inputs` between replays as
between eager steps, the capture at the same point) runs again with a probe on every module;
in the step that differed, the first module whose output differs beyond its dtype's tolerance
is named (graphrt.graphs.localize), or the line says the re-run did not reproduce the
difference. `localize(step, states)` gives that verdict as data for any step.

State: the eager run is undone before the graph runs (`graphrt.graphs.restore.preserved`: the
tensors it wrote, the module attributes, the RNG), so both start from the same state; the graph
run's writes stay, as a real one's would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from graphrt.errors import GraphrtError
from graphrt.graphs import LintReport, graph_kind, lint_step
from graphrt.graphs.lint import owning_module, step_device
from graphrt.graphs.localize import Localization
from graphrt.graphs.restore import preserved
from graphrt.graphs.sequence import Check, Sequence as Steps, run_sequence
from graphrt.graphs.tolerance import Tolerances, tolerances_for

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


def _advance(next_inputs: Callable[..., Any] | None) -> Callable[[int, Any, tuple], tuple]:
    """The caller's between-step action as the sequence runs it: `next_inputs(output, *inputs)`
    gives the next step's inputs (the same inputs every step without it)."""
    if next_inputs is None:
        return lambda i, out, args: args
    return lambda i, out, args: _args(next_inputs(out, *args))


def _check(atol: float, rtol: float) -> Check:
    """The comparison of one replayed step: its inputs exactly, then its outputs within
    `atol + rtol * |eager|`."""
    def check(eager_args: tuple, args: tuple, eager_out: Any, out: Any) -> tuple[str | None, float]:
        differs, _ = first_difference(eager_args, args)
        if differs is not None:
            return f"its inputs differ from eager's ({differs.replace('output', 'input')})", 0.0
        return first_difference(eager_out, out, atol, rtol)
    return check


def _compare(step: Callable[..., Any], inputs: Any, steps: int, next_inputs: Callable[..., Any] | None,
             atol: float, rtol: float, model: nn.Module | None, warmup: int,
             probes: Tolerances | None = None) -> Steps:
    model = model if model is not None else owning_module(step)
    return run_sequence(step, _args(inputs), steps, _advance(next_inputs), model=model, warmup=warmup,
                        check=_check(atol, rtol), probes=probes)


def compare_replay(step: Callable[..., Any], inputs: Any, *, steps: int = 8,
                   next_inputs: Callable[..., Any] | None = None, atol: float = 0.0,
                   rtol: float = 0.0, model: nn.Module | None = None,
                   warmup: int = 2) -> ReplayComparison:
    """Run `step(*inputs)` `steps` times eagerly, then as one captured graph replayed `steps`
    times; compare step by step. `next_inputs(output, *inputs)` gives the next step's inputs
    (the same inputs every step without it); it runs between replays as between eager steps.
    The step is warmed up `warmup` times before the capture, and those calls are undone too
    (graphrt.graphs.sequence)."""
    found = _compare(step, inputs, steps, next_inputs, atol, rtol, model, warmup)
    return ReplayComparison(steps, found.divergence, found.max_abs_diff)


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
    of it replays like eager for `steps` steps (see `compare_replay`). A failure says where:
    the state is put back where the comparison started and the very same sequence runs again
    with probes, each module judged within its dtype's tolerance (`localize`)."""
    model = model if model is not None else owning_module(step)
    if lint:
        first = _args(inputs)
        with preserved(model):
            second = _args(next_inputs(step(*first), *first)) if next_inputs else first
        assert_lint_clean(step, [first, second], model=model)
    found = _compare(step, inputs, steps, next_inputs, atol, rtol, model, warmup=2)
    result = ReplayComparison(steps, found.divergence, found.max_abs_diff)
    if not result.matches:
        found.start.rewind()
        device = step_device(model, _args(inputs))
        probed = _compare(step, inputs, steps, next_inputs, atol, rtol, model, warmup=2,
                          probes=tolerances_for(graph_kind(device)))
        raise AssertionError(f"{result.describe()}\n{probed.localization.explaining(result.divergence).describe()}")
    return result


def localize(step: Callable[..., Any], states: Sequence[Any], *, model: nn.Module | None = None,
             before_step: Callable[[int], None] | None = None, tolerances: Tolerances | None = None,
             warmup: int = 2) -> Localization:
    """Where a graph of `step` first replays differently from eager: run `step(*states[i])`
    eagerly for every state, then capture it once with a probe on every module and replay it
    for the same states (copied into its static inputs), comparing each replay's probes with
    the eager step's in call order (graphrt.graphs.localize). The first step whose own inputs
    or output differ is localized: the first probe in it that differs.

    `before_step(i)`, where given, sets up the world of step i: it runs before step i in both
    runs, and before the capture as for step 0. It is what a caller does between steps: rebind
    a module's tensor, replace a tensor the step reads. `tolerances`: (atol, rtol) per floating
    dtype, relative to each value's size (graphrt.graphs.tolerance); by default exact on a
    tape, `graphrt.graphs.tolerance.LAST_BITS` for a CUDA graph. State as in `compare_replay`:
    the eager run, the warmup and a tape's capture are undone, the replays' writes stay.
    """
    if warmup < 1:
        raise GraphrtError(f"localize needs warmup >= 1 (its first call sizes the probes), got {warmup}")
    if not states:
        raise GraphrtError("localize needs at least one input state")
    model = model if model is not None else owning_module(step)
    calls = [_args(state) for state in states]
    kind = graph_kind(step_device(model, calls[0]))
    found = run_sequence(step, calls[0], len(calls), lambda i, out, args: calls[min(i + 1, len(calls) - 1)],
                         model=model, warmup=warmup, check=None, before_step=before_step,
                         probes=tolerances if tolerances is not None else tolerances_for(kind))
    return found.localization
