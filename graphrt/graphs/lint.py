"""Find what a graph would freeze, before any GPU sees it: capture a step from several input
states and compare the captures op by op.

A graph replays what one capture saw. Whatever the step computes from Python state (a position
kept as an int, an attribute set in `forward`, a tensor built from a list) is a constant to it,
and the outputs drift with no error. Two captures from different states show exactly those
places: a Python argument that differs, a different op sequence, a shape that differs, a tensor
built from Python data with other values. A single capture already shows the rest: ops a capture
refuses (host syncs, random ops), tensors on the host, tensors that are neither a static input
nor made inside the step.

    report = lint_step(model.decode_step, [(tokens, positions), (tokens + 1, positions + 1)])
    for finding in report.findings:
        print(finding)   # aten.slice.Tensor in model.layers.0 (Block): argument end is 5 ...

Each state is the tuple of arguments of one call. Like a graph backend, the lint keeps one static
buffer per tensor argument and copies each state into it; Python arguments are passed as they
are. The step runs `warmup` times before the first capture (a graph is captured after warmup
too), then once per state, under the caller's autograd mode.

Side effects: the captures execute the step. With `restore=True` (the default) the lint puts back
what the step changed: the tensors it wrote in place (a KV cache; one copy each is kept while
linting), the plain attributes of the model's modules, and the random-number state.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphrt.errors import GraphrtError
from graphrt.graphs.capture_record import OpRecorder, RecordedOp, attribute_names, static_names
from graphrt.graphs.findings import Finding, Findings, check_capture, compare_captures, show_value
from graphrt.graphs.guard import HostReadGuard
from graphrt.graphs.restore import AttributeSnapshot, preserved
from graphrt.measure import nvtx, range_names
from graphrt.measure.opcount import storage_key


@dataclass(frozen=True)
class LintReport:
    findings: tuple[Finding, ...]
    captures: int
    ops: int  # ops the first capture recorded (views included)
    seconds: float  # the whole lint: warmup, captures, comparison

    @property
    def clean(self) -> bool:
        return not self.findings

    def __str__(self) -> str:
        head = (f"lint: {len(self.findings) or 'no'} finding{'s' * (len(self.findings) != 1)} over "
                f"{self.captures} captures of {self.ops} ops ({self.seconds:.2f} s)")
        return "\n".join([head, *(f"  {f}" for f in self.findings)])


def owning_module(step: Callable[..., Any]) -> nn.Module | None:
    """`step` itself if it is a module, the module of a bound method, else None."""
    if isinstance(step, nn.Module):
        return step
    owner = getattr(step, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def step_device(model: nn.Module | None, args: tuple) -> torch.device:
    """Where a step runs: its model's parameters' device, else its first tensor argument's."""
    for tensor in [*(model.parameters() if model is not None else ()), *args]:
        if isinstance(tensor, torch.Tensor):
            return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def module_ranges(model: nn.Module | None) -> Iterator[dict[str, nn.Module]]:
    """graphrt's module ranges on `model` for the block (range name -> module): the ones already
    attached, or attached for the block alone, even where NVTX ranges are switched off, since a
    finding names its module by them."""
    names = {range_names.module_range_name(q, m): m for q, m in model.named_modules()} if model else {}
    if model is None or nvtx.is_attached(model):
        yield names
        return
    was = nvtx.set_enabled(True)
    try:
        handle = nvtx.attach(model)
    finally:
        nvtx.set_enabled(was)
    with handle:
        yield names


def _inputs(states: Sequence[Any]) -> list[tuple]:
    calls = [s if isinstance(s, tuple) else (s,) for s in states]
    if len(calls) < 2:
        raise GraphrtError(f"lint needs at least two input states to compare, got {len(calls)}")
    for k, call in enumerate(calls[1:], 1):
        if len(call) != len(calls[0]):
            raise GraphrtError(f"state {k} has {len(call)} arguments, state 0 has {len(calls[0])}")
        for i, (a, b) in enumerate(zip(calls[0], call)):
            tensors = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
            if any(tensors) and (not all(tensors) or (a.shape, a.dtype) != (b.shape, b.dtype)):
                raise GraphrtError(
                    f"argument {i} is {show_value(a)} in state 0 and {show_value(b)} in state {k}: "
                    "a graph is captured at one shape and dtype per input")
    return calls


def lint_step(step: Callable[..., Any], states: Sequence[Any], *, model: nn.Module | None = None,
              warmup: int = 1, restore: bool = True) -> LintReport:
    """Capture `step(*state)` once per state and report what a graph would replay wrongly.

    `model` (default: `step` itself, or the module a bound method belongs to) names the modules
    in findings, defines the static tensors (its parameters and buffers) and has its attributes
    watched. Without one, tensors the step reads from outside are not judged: nothing tells its
    weights from stray state. `restore=False` leaves what the step wrote (for a caller that does not need it, like
    a graph backend before any prefill).
    """
    start = time.perf_counter()
    calls = _inputs(states)
    model = model if model is not None else owning_module(step)
    first = calls[0]  # _inputs checked that every state has its shapes and dtypes
    buffers = [torch.empty_like(a) if isinstance(a, torch.Tensor) else None for a in first]
    inputs = {storage_key(t): i for i, t in enumerate(buffers) if t is not None}
    device = step_device(model, first)
    found = Findings()
    captures: list[list[RecordedOp]] = []
    held: list[dict[int, torch.Tensor]] = []

    def load(values: tuple) -> Callable[[], Any]:
        """Copy a state's tensors into the static buffers; the call that reads them."""
        for buffer, value in zip(buffers, values):
            if buffer is not None:
                buffer.copy_(value)
        args = [buffer if buffer is not None else value for buffer, value in zip(buffers, values)]
        return lambda: step(*args)

    keeper = contextlib.nullcontext()
    if restore:
        keeper = preserved(model, skip=set(inputs))
    with module_ranges(model) as modules, keeper:
        warm = load(first)
        for _ in range(warmup):
            warm()
        statics, attributes = static_names(model), attribute_names(model)
        for k, values in enumerate(calls):
            call = load(values)
            before = AttributeSnapshot(model)
            with nvtx.open_ranges() as stack:
                recorder = OpRecorder(inputs, statics, attributes, stack)
                with HostReadGuard(report=recorder.host_read), recorder:
                    call()
            changes = before.changes(AttributeSnapshot(model)) if k == 0 else []
            for name, was, now in changes:
                found.add("attribute", None, (
                    f"attribute {name} changed during the step ({show_value(was)} -> {show_value(now)}): "
                    "a replay runs no Python, so it never changes again (and ops that read it "
                    "replay the captured value)"), module=name)
            captures.append(recorder.recorded())
            held.append(recorder.outside)  # state compares by identity: none may be freed and reused
    check_capture(captures[0], device, modules, found, judge_outside=model is not None)
    for k, ops in enumerate(captures[1:], 1):
        compare_captures(captures[0], ops, (1, k + 1), found)
    return LintReport(found.all(), len(captures), len(captures[0]), time.perf_counter() - start)
