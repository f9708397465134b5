"""What a graph of a step would replay wrongly, found in its recorded captures (`capture_record.py`):
one capture's refusals and tensors from outside, and the differences between two captures.

Each `Finding` is one line: the op, the module range it ran in, what differs and what a replay
would do. A difference is reported where it arises: a slice end read from Python is the
finding, not every shape downstream that follows from it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphrt.graphs.capture_record import Origin, RecordedOp, TensorUse, show_tensor

# What a finding is about (`Finding.kind`).
KINDS = ("refused", "python-value", "python-tensor", "shape", "control-flow", "tensor",
         "outside-tensor", "host-tensor", "attribute", "replaced-state")
# What `torch.tensor(data)` dispatches to make its tensor: the ops that use it are the ones to name.
_BUILDS_TENSOR = frozenset({"aten.lift_fresh.default", "aten.detach_.default"})


@dataclass(frozen=True)
class Finding:
    """One thing a graph of the step would replay differently from eager, as one line."""

    kind: str  # one of KINDS
    op: str | None  # the aten overload; None for an attribute
    module: str  # the innermost module range it ran in (RecordedOp.module)
    message: str  # what differs and what replay would do

    def __str__(self) -> str:
        if self.op is None:
            return f"{self.module}: {self.message}"
        return f"{self.op} in {self.module}: {self.message}"



def show_value(value: Any) -> str:
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


class Findings:
    """Findings in order, each line once; a line found at several ops says how many."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Finding, int]] = {}

    def add(self, kind: str, op: RecordedOp | None, message: str, module: str | None = None) -> None:
        finding = Finding(kind, op.name if op else None, module or op.module, message)
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
        message += f"; {op.module} is in training mode: call .eval() on the model"
    return message


def check_capture(ops: list[RecordedOp], device: torch.device, modules: dict[str, nn.Module],
                  found: Findings, judge_outside: bool) -> None:
    """What one capture shows on its own: refusals, host tensors, and (if `judge_outside`: only
    a model says which tensors are static) tensors from outside the step."""
    for op in ops:
        if op.refusal is not None:
            found.add("refused", op, _refusal_message(op, modules.get(op.module)))
        for name, use in op.args:
            if not isinstance(use, TensorUse):
                continue
            if use.device.type != device.type and use.origin is not Origin.PYTHON:
                found.add("host-tensor", op, (
                    f"argument {name} is {use.describe()}, on the host while the step runs on "
                    f"{device.type}: a CUDA graph records no host work, so replay reads it as it "
                    f"was at capture; keep it on {device.type}"))
            elif use.origin is Origin.OUTSIDE and judge_outside:
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


def _same_tensor(a: TensorUse, b: TensorUse, pairs: dict[int, int], states: dict[int, int]) -> bool:
    if a.origin is not b.origin:
        return False
    if a.origin in (Origin.MADE, Origin.PYTHON):
        return pairs.get(a.ref) == b.ref
    if a.origin is Origin.STATE:  # paired by order (_compare_states says where it was replaced)
        return states.get(a.storage) == b.storage
    return a.ref == b.ref or a.origin is Origin.OUTSIDE  # outside tensors are check_capture's to judge


def _other_contents(a: TensorUse, b: TensorUse) -> bool:
    if a.values is None or b.values is None:
        return a.shape != b.shape  # too large to have been copied: its shape is what is known
    return a.values.shape != b.values.shape or not torch.equal(a.values, b.values)


def _compare_op(x: RecordedOp, y: RecordedOp, numbers: tuple[int, int], pairs: dict[int, int],
                states: dict[int, int], found: Findings) -> None:
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
        if not isinstance(b, TensorUse) or not _same_tensor(a, b, pairs, states):
            found.add("tensor", x, (
                f"argument {name} is {a.describe()} {first} and "
                f"{b.describe() if isinstance(b, TensorUse) else show_value(b)} {second}: "
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
                f"argument {name} is {show_value(a)} {first} and {show_value(b)} {second}: a Python value "
                f"read at capture; replay uses {show_value(a)} forever; pass it in a static input tensor"))
            return
    if x.out_shapes != y.out_shapes:
        shape = lambda op: ", ".join(str(list(s)) for s in op.out_shapes)  # noqa: E731
        found.add("shape", x, (f"result shape {shape(x)} {first} and {shape(y)} {second}: "
                               f"replay keeps {shape(x)} forever"))


def _first_state_uses(ops: list[RecordedOp]) -> dict[int, tuple[RecordedOp, str, TensorUse]]:
    """Storage -> (op, argument, use) of each state tensor's first use, in order of first use."""
    first: dict[int, tuple[RecordedOp, str, TensorUse]] = {}
    for op in ops:
        for name, use in op.args:
            if isinstance(use, TensorUse) and use.origin is Origin.STATE:
                first.setdefault(use.storage, (op, name, use))
    return first


def _compare_states(a: list[RecordedOp], b: list[RecordedOp], numbers: tuple[int, int],
                    found: Findings) -> dict[int, int]:
    """Pair the state tensors of two captures by order of first use (storage of a -> of b), and
    report each pair that is not one tensor: the step's state was replaced, not written in place."""
    first_a, first_b = _first_state_uses(a), _first_state_uses(b)
    states = dict(zip(first_a, first_b))
    for key_a, key_b in states.items():
        if key_a != key_b:
            op, name, use = first_a[key_a]
            found.add("replaced-state", op, (
                f"argument {name} is {use.describe()}; capture {numbers[1]} has another tensor in its "
                f"place: the step's state was replaced between captures {numbers[0]} and {numbers[1]} "
                f"rather than written in place; a graph keeps reading and writing capture "
                f"{numbers[0]}'s tensor; copy the new values into it instead"))
    return states


def compare_captures(a: list[RecordedOp], b: list[RecordedOp], numbers: tuple[int, int],
                     found: Findings) -> None:
    """Two captures of one step (capture numbers `numbers`), op by op; the step's state tensor
    by tensor."""
    states = _compare_states(a, b, numbers, found)
    pairs, blocks = _alignment(a, b)
    for i1, i2, j1, j2 in blocks:
        where = a[i1] if i1 < len(a) else b[j1]  # a block is never empty in both
        found.add("control-flow", where, (
            f"capture {numbers[0]} runs {_ops_text(a[i1:i2])} where capture {numbers[1]} runs "
            f"{_ops_text(b[j1:j2])}: Python control flow on a value that changed; replay always "
            f"runs capture {numbers[0]}'s ops"))
    index = dict(pairs)
    for i, j in pairs:
        _compare_op(a[i], b[j], numbers, index, states, found)
