"""One capture as a lint sees it: every aten op a step dispatches (views too), with the module
range it ran in, its Python arguments, and where each of its tensors came from.

Where a tensor comes from is what decides whether a graph can replay it:

- INPUT: one of the step's static input buffers (what a graph backend copies each step into);
- STATIC: a parameter or buffer of the model (weights, the KV cache, rotary tables);
- MADE: the result of an earlier op of the same step (the graph owns it);
- PYTHON: built from Python data inside the step (`torch.tensor([pos])`): a constant to a graph;
- OUTSIDE: anything else that existed before the step: the graph reads it at its address, and
  nothing but the step's own ops updates it on replay;
- STATE: an outside tensor the step writes in place (any view of its storage, by an op whose
  schema marks the argument written: `index_copy_`, `add_`, `copy_`, `out=`): a KV cache and its
  counters, passed in or held by a plain object. The step keeps it up to date itself, as it does
  a registered buffer, so a graph replays it rightly wherever it is read, before the write too.
  Known only once the whole capture is recorded (`OpRecorder.recorded`).

Captures compare by these, not by tensor identity: two captures make different tensors, but
op 12's result is op 12's result in both.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt.graphs.guard import NEW_MEMORY, refusal, run_watching_writes, written_tensors
from graphrt.measure.opcount import storage_key

# A tensor this small that a graph would freeze is shown by its values; a larger one by shape.
SHOWN_VALUES = 16
OUTSIDE_MODULES = "the step, outside any module"


class Origin(enum.Enum):
    INPUT = "input"
    STATIC = "static"
    MADE = "made"
    PYTHON = "python"
    OUTSIDE = "outside"
    STATE = "state"


@dataclass(frozen=True)
class TensorUse:
    """One tensor argument of one op."""

    origin: Origin
    ref: Any  # INPUT: argument index; STATIC: its name; MADE/PYTHON: index of the op that made it;
    #           OUTSIDE: the module attribute that holds it, or None;
    #           STATE: (that attribute or None, "op in module" of its first write)
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    values: torch.Tensor | None = None  # PYTHON: a copy of small contents, as read
    storage: int | None = None  # OUTSIDE and STATE: its storage identity (state is compared by it)

    def describe(self) -> str:
        if self.origin is Origin.INPUT:
            return f"input {self.ref} of the step"
        if self.origin is Origin.STATIC:
            return self.ref  # its name
        if self.origin is Origin.MADE:
            return f"the result of op #{self.ref}"
        if self.origin is Origin.PYTHON:
            return f"a tensor built from Python data in the step holding {show_tensor(self)}"
        meta = f"{_dtype(self.dtype)} {list(self.shape)} on {self.device.type}"
        if self.origin is Origin.STATE:
            held, writer = self.ref
            return f"{held + ', ' if held else ''}the step's state ({meta}), written in place by {writer}"
        what = f"{self.ref}, a plain tensor attribute" if self.ref else "a tensor"
        return f"{what} ({meta})"


def show_tensor(use: TensorUse) -> str:
    if use.values is None:
        return f"{_dtype(use.dtype)} {list(use.shape)}"
    return str(use.values.tolist())


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class RecordedOp:
    """One op of a capture; its number (what MADE and PYTHON uses refer to) is its place in the
    capture's list."""

    name: str  # the overload, e.g. "aten.slice.Tensor"
    ranges: tuple[str, ...]  # graphrt ranges open when it ran, outermost first
    args: tuple[tuple[str, Any], ...]  # (schema argument name, TensorUse or Python value)
    out_shapes: tuple[tuple[int, ...], ...]
    refusal: str | None  # why a graph capture would refuse it, if it would

    @property
    def module(self) -> str:
        """The innermost module range it ran in."""
        return self.ranges[-1] if self.ranges else OUTSIDE_MODULES


def static_names(model: nn.Module | None) -> dict[int, str]:
    """Storage identity -> name, for every parameter and buffer of `model`."""
    if model is None:
        return {}
    named = [*model.named_parameters(), *model.named_buffers()]
    return {storage_key(t): name for name, t in reversed(named)}  # the first name wins (tied weights)


def attribute_names(model: nn.Module | None) -> dict[int, str]:
    """Storage identity -> `qualname.attribute`, for tensors held as plain module attributes."""
    names: dict[int, str] = {}
    for qualname, module in model.named_modules() if model is not None else ():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                names.setdefault(storage_key(value), f"{qualname}.{key}" if qualname else key)
    return names


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's arguments or results: nested tuples and lists are all aten uses
    (a faster walk than pytree's, which matters at thousands of ops per capture)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _named_args(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(name, value) per argument; a list of tensors (cat's, index's) as `name[i]` per item."""
    positional = zip((a.name for a in func._schema.arguments), args)  # a call never outnumbers its schema
    flat: list[tuple[str, Any]] = []
    for name, value in [*positional, *kwargs.items()]:
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            flat += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        else:
            flat.append((name, tuple(value) if isinstance(value, list) else value))
    return flat


class OpRecorder(TorchDispatchMode):
    """Runs every op unchanged and appends a `RecordedOp` for each to `ops`.

    It keeps every tensor an op returns alive until it is dropped, so that while the capture
    lasts no later tensor takes the storage identity of one the step made; and every outside
    tensor as long as it lives itself (`outside`), so that state compares by identity across
    captures even where the step drops the one it wrote.
    """

    def __init__(self, inputs: dict[int, int], statics: dict[int, str], attributes: dict[int, str],
                 open_ranges: list[str]) -> None:
        super().__init__()
        self.inputs, self.statics, self.attributes = inputs, statics, attributes
        self.open_ranges = open_ranges
        self.ops: list[RecordedOp] = []
        self.made: dict[int, int] = {}  # storage -> index of the op that made it
        self.python: dict[int, int] = {}  # storage -> index of the op that lifted Python data
        self.outside: dict[int, torch.Tensor] = {}  # storage -> a tensor of it, from outside the step
        self.written: dict[int, int] = {}  # outside storage -> index of the first op writing it in place
        self._alive: list[torch.Tensor] = []

    def _use(self, t: torch.Tensor) -> TensorUse:
        key = storage_key(t)
        meta = (tuple(t.shape), t.dtype, t.device)
        if key in self.inputs:
            return TensorUse(Origin.INPUT, self.inputs[key], *meta)
        if key in self.statics:
            return TensorUse(Origin.STATIC, self.statics[key], *meta)
        if key in self.made:
            return TensorUse(Origin.MADE, self.made[key], *meta)
        if key in self.python:  # lifted from host data by torch.tensor (never on meta): it has values
            values = t.detach().clone() if t.numel() <= SHOWN_VALUES else None
            return TensorUse(Origin.PYTHON, self.python[key], *meta, values=values)
        self.outside.setdefault(key, t)
        return TensorUse(Origin.OUTSIDE, self.attributes.get(key), *meta, storage=key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = len(self.ops)
        reason = refusal(func, args, kwargs)
        if func._schema.name == "aten::lift_fresh":  # torch.tensor(...): Python data becomes a tensor
            self.python[storage_key(args[0])] = index
        named = [(name, self._use(v) if isinstance(v, torch.Tensor) else v)
                 for name, v in _named_args(func, args, kwargs)]
        if func._schema.is_mutable:
            for key in {storage_key(t) for t in written_tensors(func, args, kwargs)} & self.outside.keys():
                self.written.setdefault(key, index)
        out, moved = run_watching_writes(func, args, kwargs)
        if moved:
            reason = reason or NEW_MEMORY
        results = list(_tensors(out))
        read = {storage_key(t) for t in _tensors((args, kwargs))}
        for key in {storage_key(t) for t in results} - read:  # new memory: this op made it
            self.made.setdefault(key, index)
        self._alive += results
        self.ops.append(RecordedOp(str(func), tuple(self.open_ranges), tuple(named),
                                   tuple(tuple(t.shape) for t in results), reason))
        return out

    def recorded(self) -> list[RecordedOp]:
        """The capture's ops, each outside tensor the step writes in place anywhere in it turned
        into the step's STATE at every use (reads before the first write included)."""
        if not self.written:
            return self.ops
        writers = {key: f"{self.ops[i].name} in {self.ops[i].module}" for key, i in self.written.items()}

        def classified(value: Any) -> Any:
            if not isinstance(value, TensorUse) or value.storage not in writers:
                return value
            return replace(value, origin=Origin.STATE, ref=(value.ref, writers[value.storage]))

        return [op if not any(isinstance(v, TensorUse) and v.storage in writers for _, v in op.args)
                else replace(op, args=tuple((name, classified(v)) for name, v in op.args))
                for op in self.ops]

    def host_read(self, name: str, reason: str) -> None:
        """A host read that never reached the dispatcher (`HostReadGuard(report=...)`)."""
        self.ops.append(RecordedOp(name, tuple(self.open_ranges), (), (), reason))

