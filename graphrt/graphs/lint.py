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
import difflib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphrt import nvtx
from graphrt.errors import GraphrtError
from graphrt.graphs.guard import HostReadGuard
from graphrt.graphs.record import (OpRecorder, Origin, RecordedOp, TensorUse, attribute_names,
                                   show_tensor, static_names)
from graphrt.graphs.restore import AttributeSnapshot, preserved
from graphrt.opcount import storage_key

# What a finding is about (`Finding.kind`).
KINDS = ("refused", "python-value", "python-tensor", "shape", "control-flow", "tensor",
         "outside-tensor", "host-tensor", "attribute")
OUTSIDE_MODULES = "the step, outside any module"
# What `torch.tensor(data)` dispatches to make its tensor: the ops that use it are the ones to name.
_BUILDS_TENSOR = frozenset({"aten.lift_fresh.default", "aten.detach_.default"})


@dataclass(frozen=True)
class Finding:
    """One thing a graph of the step would replay differently from eager, as one line."""

    kind: str  # one of KINDS
    op: str | None  # the aten overload; None for an attribute
    module: str  # the innermost module range it ran in, or OUTSIDE_MODULES
    message: str  # what differs and what replay would do

    def __str__(self) -> str:
        if self.op is None:
            return f"{self.module}: {self.message}"
        return f"{self.op} in {self.module}: {self.message}"


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


def _show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} {list(value.shape)} tensor"
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return f"a {type(value).__name__} of {len(value)} tensors"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN
    return type(a) is type(b) and a == b


def _module(op: RecordedOp) -> str:
    return op.ranges[-1] if op.ranges else OUTSIDE_MODULES


class _Findings:
    """Findings in order, each line once; a line found at several ops says how many."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Finding, int]] = {}

    def add(self, kind: str, op: RecordedOp | None, message: str, module: str | None = None) -> None:
        finding = Finding(kind, op.name if op else None, module or _module(op), message)
        first, count = self.seen.get(str(finding), (finding, 0))
        self.seen[str(finding)] = (first, count + 1)

    def all(self) -> tuple[Finding, ...]:
        return tuple(f if n == 1 else Finding(f.kind, f.op, f.module, f"{f.message} ({n} ops)")
                     for f, n in self.seen.values())


def _refusal_message(op: RecordedOp, module: nn.Module | None) -> str:
    """The capture's refusal, and for a random op what CUDA would do and whether a module in
    training mode (dropout) is why it is there."""
    if "random" not in op.refusal:
        return op.refusal
    message = (f"{op.refusal}; a CUDA graph draws new numbers on each replay, but not eager's, "
               "so the step cannot be checked against eager")
    if module is not None and module.training:
        message += f"; {_module(op)} is in training mode: call .eval() on the model"
    return message


def _single_capture(ops: list[RecordedOp], device: torch.device, modules: dict[str, nn.Module],
                    found: _Findings) -> None:
    """What one capture shows on its own: refusals, host tensors, tensors from outside."""
    for op in ops:
        if op.refusal is not None:
            found.add("refused", op, _refusal_message(op, modules.get(_module(op))))
        for name, use in op.args:
            if not isinstance(use, TensorUse):
                continue
            if use.device.type != device.type and use.origin is not Origin.PYTHON:
                found.add("host-tensor", op, (
                    f"argument {name} is {use.describe()}, on the host while the step runs on "
                    f"{device.type}: a CUDA graph records no host work, so replay reads it as it "
                    f"was at capture; keep it on {device.type}"))
            elif use.origin is Origin.OUTSIDE:
                found.add("outside-tensor", op, (
                    f"argument {name} is {use.describe()}, neither a static input nor made inside "
                    "the step: replay uses it where it lies and sees no update made outside the "
                    "step; register it as a buffer or pass it in as an input"))


def _alignment(a: list[RecordedOp], b: list[RecordedOp]) -> tuple[list[tuple[int, int]], list[tuple]]:
    """Pairs of ops that match by name, and the blocks that do not (difflib opcodes)."""
    names_a, names_b = [op.name for op in a], [op.name for op in b]
    if names_a == names_b:
        return list(zip(range(len(a)), range(len(b)))), []
    head = 0
    while head < min(len(a), len(b)) and names_a[head] == names_b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and names_a[-1 - tail] == names_b[-1 - tail]:
        tail += 1
    matcher = difflib.SequenceMatcher(None, names_a[head:len(a) - tail], names_b[head:len(b) - tail],
                                      autojunk=False)
    pairs = [(i, i) for i in range(head)]
    blocks = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += [(head + i1 + k, head + j1 + k) for k in range(i2 - i1)]
        else:
            blocks.append((head + i1, head + i2, head + j1, head + j2))
    pairs += [(len(a) - tail + k, len(b) - tail + k) for k in range(tail)]
    return pairs, blocks


def _ops_text(ops: list[RecordedOp]) -> str:
    if not ops:
        return "nothing"
    names = ", ".join(op.name for op in ops[:3])
    return f"{len(ops)} op{'s' * (len(ops) != 1)} ({names}{', …' if len(ops) > 3 else ''})"


def _same_tensor(a: TensorUse, b: TensorUse, pairs: dict[int, int]) -> bool:
    if a.origin is not b.origin:
        return False
    if a.origin in (Origin.MADE, Origin.PYTHON):
        return pairs.get(a.ref) == b.ref
    return a.ref == b.ref or a.origin is Origin.OUTSIDE  # a new outside tensor: reported already


def _other_contents(a: TensorUse, b: TensorUse) -> bool:
    if a.values is None or b.values is None:
        return a.shape != b.shape  # too large to have been copied: its shape is what is known
    return a.values.shape != b.values.shape or not torch.equal(a.values, b.values)


def _compare_op(x: RecordedOp, y: RecordedOp, numbers: tuple[int, int], pairs: dict[int, int],
                found: _Findings) -> None:
    """Two matched ops of two captures: every difference a replay would freeze."""
    first, second = (f"in capture {n}" for n in numbers)
    if [name for name, _ in x.args] != [name for name, _ in y.args]:
        names = lambda op: ", ".join(n for n, _ in op.args)  # noqa: E731
        found.add("python-value", x, (
            f"takes arguments ({names(x)}) {first} and ({names(y)}) {second}: a list built in "
            f"Python; replay keeps capture {numbers[0]}'s"))
        return
    uses = [(n, a, b) for (n, a), (_, b) in zip(x.args, y.args) if isinstance(a, TensorUse)]
    # A shape that changed upstream changes Python values derived from it here (view sizes, ...):
    # the cause is reported where it arose, not again at every op it reaches.
    inherited = any(isinstance(b, TensorUse) and a.shape != b.shape for _, a, b in uses)
    for name, a, b in uses:
        if not isinstance(b, TensorUse) or not _same_tensor(a, b, pairs):
            found.add("tensor", x, (
                f"argument {name} is {a.describe()} {first} and "
                f"{b.describe() if isinstance(b, TensorUse) else _show(b)} {second}: "
                f"replay reads capture {numbers[0]}'s tensor forever"))
        elif a.origin is Origin.PYTHON and x.name not in _BUILDS_TENSOR and _other_contents(a, b):
            found.add("python-tensor", x, (
                f"argument {name} is a tensor built from Python data in the step (torch.tensor), "
                f"{show_tensor(a)} {first} and {show_tensor(b)} {second}: replay reads "
                f"{show_tensor(a)} forever; compute it on the device from a static input"))
    if inherited:
        return
    for (name, a), (_, b) in zip(x.args, y.args):
        if not isinstance(a, TensorUse) and not _same_value(a, b):
            found.add("python-value", x, (
                f"argument {name} is {_show(a)} {first} and {_show(b)} {second}: a Python value "
                f"read at capture; replay uses {_show(a)} forever; pass it in a static input tensor"))
            return
    if x.out_shapes != y.out_shapes:
        shape = lambda op: ", ".join(str(list(s)) for s in op.out_shapes)  # noqa: E731
        found.add("shape", x, (f"result shape {shape(x)} {first} and {shape(y)} {second}: "
                               f"replay keeps {shape(x)} forever"))


def compare_captures(a: list[RecordedOp], b: list[RecordedOp], numbers: tuple[int, int],
                     found: _Findings) -> None:
    """Two captures of one step (capture numbers `numbers`), op by op."""
    pairs, blocks = _alignment(a, b)
    for i1, i2, j1, j2 in blocks:
        where = a[i1] if i1 < len(a) else (b[j1] if j1 < len(b) else a[-1])
        found.add("control-flow", where, (
            f"capture {numbers[0]} runs {_ops_text(a[i1:i2])} where capture {numbers[1]} runs "
            f"{_ops_text(b[j1:j2])}: Python control flow on a value that changed; replay always "
            f"runs capture {numbers[0]}'s ops"))
    index = dict(pairs)
    for i, j in pairs:
        _compare_op(a[i], b[j], numbers, index, found)


def owning_module(step: Callable[..., Any]) -> nn.Module | None:
    """`step` itself if it is a module, the module of a bound method, else None."""
    if isinstance(step, nn.Module):
        return step
    owner = getattr(step, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


@contextlib.contextmanager
def module_ranges(model: nn.Module | None) -> Iterator[dict[str, nn.Module]]:
    """graphrt's module ranges on `model` for the block (range name -> module): the ones already
    attached, or attached for the block alone, even where NVTX ranges are switched off, since a
    finding names its module by them."""
    names = {nvtx.module_range_name(q, m): m for q, m in model.named_modules()} if model else {}
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


def _tensor_kind(value: Any) -> str | None:
    if not isinstance(value, torch.Tensor):
        return None
    return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"


def _inputs(states: Sequence[Any]) -> list[tuple]:
    calls = [s if isinstance(s, tuple) else (s,) for s in states]
    if len(calls) < 2:
        raise GraphrtError(f"lint needs at least two input states to compare, got {len(calls)}")
    for k, call in enumerate(calls[1:], 1):
        if len(call) != len(calls[0]):
            raise GraphrtError(f"state {k} has {len(call)} arguments, state 0 has {len(calls[0])}")
        for i, (a, b) in enumerate(zip(calls[0], call)):
            if _tensor_kind(a) != _tensor_kind(b):
                raise GraphrtError(
                    f"argument {i} is {_tensor_kind(a) or 'not a tensor'} in state 0 and "
                    f"{_tensor_kind(b) or 'not a tensor'} in state {k}: a graph is captured at "
                    "one shape and dtype per input")
    return calls


def lint_step(step: Callable[..., Any], states: Sequence[Any], *, model: nn.Module | None = None,
              warmup: int = 1, restore: bool = True) -> LintReport:
    """Capture `step(*state)` once per state and report what a graph would replay wrongly.

    `model` (default: `step` itself, or the module a bound method belongs to) names the modules
    in findings, defines the static tensors (its parameters and buffers) and has its attributes
    watched. `restore=False` leaves what the step wrote (for a caller that does not need it, like
    a graph backend before any prefill).
    """
    start = time.perf_counter()
    calls = _inputs(states)
    model = model if model is not None else owning_module(step)
    buffers = [a.detach().clone() if isinstance(a, torch.Tensor) else None for a in calls[0]]
    inputs = {storage_key(t): i for i, t in enumerate(buffers) if t is not None}
    device = next((p.device for p in model.parameters()), None) if model is not None else None
    device = device or next((t.device for t in buffers if t is not None), torch.device("cpu"))
    found = _Findings()
    captures: list[list[RecordedOp]] = []

    def load(values: tuple) -> Callable[[], Any]:
        """Copy a state's tensors into the static buffers; the call that reads them."""
        for buffer, value in zip(buffers, values):
            if buffer is not None:
                buffer.copy_(value)
        args = [buffer if buffer is not None else value for buffer, value in zip(buffers, values)]
        return lambda: step(*args)

    keeper = preserved(model, skip=set(inputs)) if restore else contextlib.nullcontext()
    with module_ranges(model) as modules, keeper:
        warm = load(calls[0])
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
                    f"attribute {name} changed during the step ({_show(was)} -> {_show(now)}): "
                    "a replay runs no Python, so it never changes again (and ops that read it "
                    "replay the captured value)"), module=name)
            captures.append(recorder.ops)
    _single_capture(captures[0], device, modules, found)
    for k, ops in enumerate(captures[1:], 1):
        compare_captures(captures[0], ops, (1, k + 1), found)
    return LintReport(found.all(), len(captures), len(captures[0]), time.perf_counter() - start)
