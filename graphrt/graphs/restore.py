"""Run a step and leave no trace of it: the tensors it wrote, the module attributes it changed,
the random-number state it advanced, all put back afterwards.

A tape capture executes its step (a KV cache gets written), and so does every eager run a check
makes before it compares; `preserved(model)` is what lets a check run a user's step and hand the
state back untouched:

    with preserved(model):
        model.decode_step(tokens, positions)   # writes the cache...
    # ...which holds again what it held before

Tensors are restored copy-on-first-write: a dispatch mode saves a copy of a tensor's storage
just before the first op that writes it in place, so only what the step writes costs memory
(for a decode step, one copy of the KV cache). Tensors the step makes itself are not saved.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graphrt.graphs.guard import written_tensors
from graphrt.measure.opcount import OpKind, classify, storage_key

# What every nn.Module keeps in its __dict__ for itself (parameters, hooks, ...): not state a
# step sets. `forward` is where graphrt's NVTX wrapper lives.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"forward"}


class WriteBackup(TorchDispatchMode):
    """Saves each storage that existed before the mode was entered, once, before the first op
    writes into it; `restore()` copies every saved storage back."""

    def __init__(self, skip: set[int] = frozenset()) -> None:
        super().__init__()
        self.saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self.made: set[int] = set(skip)  # storages allocated inside (nothing to restore), or skipped

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            for t in written_tensors(func, args, kwargs):
                key = storage_key(t)
                if key not in self.made and key not in self.saved:
                    storage = t.untyped_storage()
                    self.saved[key] = (storage, storage.clone())
        out = func(*args, **kwargs)
        if classify(func, args, kwargs, out) in (OpKind.COMPUTE, OpKind.ALLOC):
            self.made.update(storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out

    def restore(self) -> None:
        """Copy every saved storage back (as often as asked: the copies are kept)."""
        with torch.inference_mode():
            for storage, copy in self.saved.values():
                storage.copy_(copy)


def _copy_of(value: Any) -> Any:
    """A shallow copy of a list, dict or set (a step may append to one in place); else itself."""
    return type(value)(value) if type(value) in (list, dict, set) else value


def _same(a: Any, b: Any) -> bool:
    """Is `b` still what `a` was? Tensors by identity (in-place writes are WriteBackup's job),
    containers element by element, anything else by `==`."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or type(a) is not type(b):  # (so b is no tensor either)
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # an == that raises or returns something without a truth value
        return False


class AttributeSnapshot:
    """The plain attributes of every module of a model, as they were when the snapshot was
    taken; and which tensor or module each parameter, buffer and submodule name was bound to
    (restored, but not among the `changes`: rebinding one is what a caller does between
    steps, such as a weight reload that assigns instead of copying)."""

    def __init__(self, model: nn.Module | None) -> None:
        # name -> (module, attribute, value, a copy of a container's items)
        self.values: dict[str, tuple[nn.Module, str, Any, Any]] = {}
        self.modules = [] if model is None else [m for _, m in model.named_modules()]
        for qualname, module in model.named_modules() if model is not None else ():
            for key, value in vars(module).items():
                if key not in _MODULE_INTERNALS:
                    name = f"{qualname}.{key}" if qualname else key
                    self.values[name] = (module, key, value, _copy_of(value))
        self.bindings = [(table, dict(table)) for module in self.modules
                         for table in (module._parameters, module._buffers, module._modules)]

    def changes(self, later: AttributeSnapshot) -> list[tuple[str, Any, Any]]:
        """(name, value then, value in `later`) of every attribute that differs, or is new."""
        changed = []
        for name, (_, _, value, copy) in later.values.items():
            if name not in self.values:
                changed.append((name, None, value))
            else:
                before = self.values[name][3]
                if not _same(before, copy):
                    changed.append((name, before, value))
        return changed

    def restore(self) -> None:
        """Put every attribute back (an in-place edited list gets its old items back) and drop
        the ones added since; bind every parameter, buffer and submodule name as it was."""
        for table, bound in self.bindings:
            table.clear()
            table.update(bound)
        for module in self.modules:
            for key in [k for k in vars(module) if k not in _MODULE_INTERNALS]:
                del vars(module)[key]
        for module, key, value, copy in self.values.values():
            if isinstance(value, list):
                value[:] = copy
            elif isinstance(value, (dict, set)):
                value.clear()
                value.update(copy)
            vars(module)[key] = value


class Start:
    """The state a block starts from: the plain attributes of `model`'s modules, the
    random-number generators' state, and (`backup`, while it is entered) every pre-existing
    tensor written in place."""

    def __init__(self, model: nn.Module | None, skip: set[int] = frozenset()) -> None:
        self.attributes = AttributeSnapshot(model)
        self.cpu_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.backup = WriteBackup(skip)

    def rewind(self) -> None:
        """Put it all back, as often as asked: after the block, and again after whatever ran
        since that writes the same tensors (a graph replaying the block's step)."""
        self.backup.restore()
        self.attributes.restore()
        torch.random.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


@contextlib.contextmanager
def rewound(model: nn.Module | None, skip: set[int] = frozenset()) -> Iterator[Start]:
    """`preserved`, yielding the `Start` it puts back, which can put it back again later."""
    start = Start(model, skip)
    try:
        with start.backup:
            yield start
    finally:
        start.rewind()


@contextlib.contextmanager
def preserved(model: nn.Module | None, skip: set[int] = frozenset()) -> Iterator[WriteBackup]:
    """Run the block, then put back every pre-existing tensor it wrote in place, every plain
    attribute of `model`'s modules, and the random-number generators' state.

    `skip` names storages (by `opcount.storage_key`) not worth restoring.
    """
    with rewound(model, skip) as start:
        yield start.backup
