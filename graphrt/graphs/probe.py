"""Probes: every module's inputs and output of one step, copied into buffers that a capture
records.

A replay runs no Python, so nothing can be asked of it afterwards but the tensors it wrote.
A probed step writes more of them: before it runs, its inputs are copied into buffers; as each
module is called, its tensor inputs; as it returns, its output; at the end, the step's output.
The copies are ordinary ops of the step, so a capture records them (kernels of a CUDA graph,
entries of a tape) and every replay leaves what each module saw and made in that replay behind,
to compare with the same module's in an eager run (graphrt.graphs.localize).

    probes = ProbeSet(model, inputs={"tokens": static_tokens})
    graph, out = capture(probes.wrap(step), device=device)   # its first warmup call sizes them
    graph.replay()
    probes.values()   # [Probe("the step", "input tokens", ...),
                      #  Probe("model.embed_tokens (Embedding)", "input 0", ...), ...]

The step's own ops are unchanged; only copies are added (`copies`, `bytes`). Modules are named
as their graphrt ranges are (`model.layers.3.mlp (Qwen2MLP)`) and found through
`named_modules()`; a module's output comes after its children's probes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from graphrt.errors import GraphrtError
from graphrt.measure import range_names
from graphrt.measure.opcount import storage_key

T = TypeVar("T")
STEP = "the step"  # where a step's own inputs and output are probed


class Probe(NamedTuple):
    """One tensor a step passed at one point: a step's input or output, a module's input or
    output."""

    where: str  # STEP, or the module's range name
    what: str  # "input tokens" (a step's), "input 0" (a module's), "output", "output 1"
    value: torch.Tensor
    # for a module's input: the module whose forward passed it (None: the step's own code)
    caller: str | None = None

    @property
    def name(self) -> str:
        """`output of model.norm (Qwen2RMSNorm)`, `input tokens of the step`."""
        return f"{self.what} of {self.where}"


SAME_CALLS = "a probed step must call the same modules in the same order with the same shapes every time"
Action = Callable[[Probe], None]  # told each probe with the tensor the step passed there


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _each(where: str, what: str, value: Any, action: Action, caller: str | None = None,
          numbered: bool = False) -> None:
    """`action` on every tensor in `value`; several (or any, if `numbered`) as `what i`."""
    leaves = tensor_leaves(value)
    for i, t in enumerate(leaves):
        action(Probe(where, f"{what} {i}" if numbered or len(leaves) > 1 else what, t, caller))


@contextlib.contextmanager
def _on_module_calls(model: nn.Module | None, action: Action) -> Iterator[None]:
    """While open, `action` on every tensor passed into or returned by a module of `model`.

    The hooks run just outside the module's `forward` (and its graphrt range). A module's inputs
    carry the module whose forward called it: if they differ while everything before matched,
    that caller's own code made them. Hooks are on only while the probed step runs.
    """
    calling: list[str] = []  # the modules inside their forward now, innermost last
    handles = []

    def enter(name: str, args: tuple, kwargs: dict) -> None:
        _each(name, "input", (args, kwargs), action, calling[-1] if calling else None, numbered=True)
        calling.append(name)

    def leave(name: str, out: Any) -> None:
        calling.pop()
        _each(name, "output", out, action)

    for qualname, module in model.named_modules() if model is not None else ():
        name = range_names.module_range_name(qualname, module)
        handles.append(module.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: enter(name, args, kwargs), with_kwargs=True))
        handles.append(module.register_forward_hook(
            lambda module, args, out, name=name: leave(name, out)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def observe(fn: Callable[[], T], model: nn.Module | None, inputs: Mapping[str, torch.Tensor],
            action: Action, output: bool = True) -> T:
    """Call `fn()`, with `action` on each of the step's inputs first, then on each module's
    inputs and output as it is called and returns, then (if `output`) on what `fn` returned:
    the probes of one step, in order."""
    for name, tensor in inputs.items():
        action(Probe(STEP, f"input {name}", tensor))
    with _on_module_calls(model, action):
        out = fn()
    if output:
        _each(STEP, "output", out, action)
    return out


class ProbeSet:
    """The probe buffers of one captured step (or one piece of a piecewise step).

    `wrap(fn)` is the step to capture. Its first call must run before the capture (a warmup
    does): it allocates one buffer per probe, shaped like what that call produced. Every later
    call copies each probe into its buffer, so the capture records the copies. A later call
    whose modules run in another order, or return other shapes, is refused: its probes would
    not say which module wrote them.
    """

    def __init__(self, model: nn.Module | None, inputs: Mapping[str, torch.Tensor] | None = None,
                 output: bool = True) -> None:
        self.model = model
        self.inputs = dict(inputs or {})
        self.output = output
        self.buffers: list[Probe] = []
        self._sized = False

    @property
    def copies(self) -> int:
        """Copies one step adds: one per probe."""
        return len(self.buffers)

    @property
    def bytes(self) -> int:
        """Bytes one step copies into probes (and the probes hold)."""
        return sum(p.value.numel() * p.value.element_size() for p in self.buffers)

    def storages(self) -> set[int]:
        """The probe buffers' storages (`opcount.storage_key`): what the copies write."""
        return {storage_key(p.value) for p in self.buffers}

    def wrap(self, fn: Callable[[], T]) -> Callable[[], T]:
        def probed() -> T:
            if not self._sized:
                self._sized = True
                return observe(fn, self.model, self.inputs, self._allocate, self.output)
            order = iter(self.buffers)
            out = observe(fn, self.model, self.inputs, lambda probe: self._copy(order, probe), self.output)
            left = next(order, None)
            if left is not None:
                raise GraphrtError(f"probe {left.name}: the step's first call had it, this one "
                                   f"ended before it; {SAME_CALLS}")
            return out

        return probed

    def _allocate(self, probe: Probe) -> None:
        self.buffers.append(probe._replace(value=torch.empty_like(probe.value, requires_grad=False)))

    def _copy(self, order: Iterator[Probe], probe: Probe) -> None:
        expected = next(order, None)
        tensor = probe.value
        if expected is None or expected[:2] != probe[:2] or expected.value.shape != tensor.shape \
                or expected.value.dtype != tensor.dtype:
            raise GraphrtError(
                f"probe {probe.name} ({str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}): "
                f"the step's first call had {'nothing' if expected is None else expected.name} here; "
                f"{SAME_CALLS}")
        with torch.no_grad():
            expected.value.copy_(tensor.detach())

    def values(self) -> list[Probe]:
        """A copy of every probe as the last run (or replay) left it, in order."""
        return [probe._replace(value=probe.value.clone()) for probe in self.buffers]
