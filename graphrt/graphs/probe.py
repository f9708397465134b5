"""Probes: every module's output of one step, copied into buffers that a capture records.

A replay runs no Python, so nothing can be asked of it afterwards but the tensors it wrote.
A probed step writes more of them: before it runs, its inputs are copied into buffers; after
each module returns, its output is copied into that module's buffer; at the end, the step's
output. The copies are ordinary ops of the step, so a capture records them (kernels of a CUDA
graph, entries of a tape) and every replay leaves each module's output of that replay behind,
to compare with the same module's output in an eager run (graphrt.graphs.localize).

    probes = ProbeSet(model, inputs={"tokens": static_tokens})
    graph, out = capture(probes.wrap(step), device=device)   # its first warmup call sizes them
    graph.replay()
    probes.values()   # [("input tokens", ...), ("model.embed_tokens (Embedding)", ...), ...]

The step's own ops are unchanged; only copies are added (`copies`, `bytes`). Modules are named
as their graphrt ranges are (`model.layers.3.mlp (Qwen2MLP)`) and found through
`named_modules()`; a module returns after its children, so its probe comes after theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from graphrt import nvtx
from graphrt.errors import GraphrtError

T = TypeVar("T")
Probe = tuple[str, torch.Tensor]  # (name, value): "input NAME", a module range name or "output"
Action = Callable[[str, torch.Tensor], None]


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _each(name: str, value: Any, action: Action) -> None:
    """`action` on every tensor in `value`; several are told apart as `name[i]`."""
    leaves = _tensor_leaves(value)
    for i, t in enumerate(leaves):
        action(name if len(leaves) == 1 else f"{name}[{i}]", t)


@contextlib.contextmanager
def _on_module_outputs(model: nn.Module | None, action: Action) -> Iterator[None]:
    """While open, `action(range name, tensor)` on every tensor a module of `model` returns.

    A forward hook runs after the module's `forward` (and its graphrt range) has returned, in
    its caller's range. Hooks are on only while the probed step runs.
    """
    handles = []
    for qualname, module in model.named_modules() if model is not None else ():
        name = nvtx.module_range_name(qualname, module)
        handles.append(module.register_forward_hook(
            lambda module, args, out, name=name: _each(name, out, action)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def observe(fn: Callable[[], T], model: nn.Module | None, inputs: Mapping[str, torch.Tensor],
            action: Action, output: bool = True) -> T:
    """Call `fn()`, with `action` on each input first, on each module output as the module
    returns, then (if `output`) on what `fn` returned: the probes of one step, in order."""
    for name, tensor in inputs.items():
        action(f"input {name}", tensor)
    with _on_module_outputs(model, action):
        out = fn()
    if output:
        _each("output", out, action)
    return out


def record(fn: Callable[[], T], model: nn.Module | None, inputs: Mapping[str, torch.Tensor],
           output: bool = True) -> tuple[T, list[Probe]]:
    """Run `fn()` eagerly; its result and a copy of each of its probes, in order."""
    probes: list[Probe] = []
    out = observe(fn, model, inputs, lambda name, t: probes.append((name, t.detach().clone())), output)
    return out, probes


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
        return sum(buffer.numel() * buffer.element_size() for _, buffer in self.buffers)

    def storages(self) -> set[int]:
        """The probe buffers' storages (`opcount.storage_key`): what the copies write."""
        return {buffer.untyped_storage()._cdata for _, buffer in self.buffers}

    def wrap(self, fn: Callable[[], T]) -> Callable[[], T]:
        def probed() -> T:
            if not self._sized:
                self._sized = True
                return observe(fn, self.model, self.inputs, self._allocate, self.output)
            order = iter(self.buffers)
            return observe(fn, self.model, self.inputs, lambda name, t: self._copy(order, name, t),
                           self.output)

        return probed

    def _allocate(self, name: str, tensor: torch.Tensor) -> None:
        self.buffers.append((name, torch.empty_like(tensor, requires_grad=False)))

    def _copy(self, order: Iterator[Probe], name: str, tensor: torch.Tensor) -> None:
        expected, buffer = next(order, ("nothing", None))
        if expected != name or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            raise GraphrtError(
                f"probe {name} ({str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}): "
                f"the step's first call had {expected} here; a probed step must run the same "
                f"modules in the same order with the same shapes at every call")
        with torch.no_grad():
            buffer.copy_(tensor.detach())

    def values(self) -> list[Probe]:
        """A copy of every probe as the last run (or replay) left it, in order."""
        return [(name, buffer.clone()) for name, buffer in self.buffers]
