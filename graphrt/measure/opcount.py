"""What counts as an op in a decode step, and how many an eager step dispatches.

An "op" here is an aten operator, as it reaches the dispatcher below autograd (composite ops
such as `linear` or `reshape` arrive already decomposed into `t`/`addmm`/`view`). Of those,
only ops that *do work* count: views and uninitialised allocations cost no kernel and have
nothing to re-run on replay. The same rule classifies the entries of a `TapeGraph`, so
"ops per eager step" (`count_ops`) and "ops in the tape" (`len(tape)`) are the same kind of
number and can be compared directly.
"""

from __future__ import annotations

import enum
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["OpKind", "classify", "does_work", "op_names", "count_ops", "storage_key"]


class OpKind(enum.Enum):
    VIEW = "view"  # result aliases an argument's memory (or only edits tensor metadata)
    ALLOC = "alloc"  # uninitialised allocation (empty*): no kernel, no value
    MUTATE = "mutate"  # writes into an argument: in-place (`add_`) or out= (`mm.out`)
    COMPUTE = "compute"  # fresh result in new memory (`mm`, `_softmax`, `zeros`)


# Allocators whose result holds no defined value; re-running them computes nothing.
_ALLOC_OPS = frozenset(
    f"aten::{name}"
    for name in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted")
)


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage behind `t` (shared by all its views), stable while it lives."""
    return t.untyped_storage()._cdata


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def classify(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> OpKind:
    """Kind of one dispatched op, given its arguments and the result it just produced."""
    if torch.Tag.inplace_view in func.tags:
        return OpKind.VIEW
    if func._schema.is_mutable:
        return OpKind.MUTATE
    if func._schema.name in _ALLOC_OPS:
        return OpKind.ALLOC
    results = _tensors(out)
    if results:
        # A view is an op whose result lies in its input's memory, whatever its schema says:
        # `_unsafe_view` is not declared a view but aliases; `to.dtype` is declared one (it
        # *may* alias) but returns new memory whenever it converts (bf16 -> fp32).
        inputs = {storage_key(t) for t in _tensors((args, kwargs))}
        if all(storage_key(t) in inputs for t in results):
            return OpKind.VIEW
    return OpKind.COMPUTE


def does_work(kind: OpKind) -> bool:
    """True for the kinds that count as ops (and that a tape re-runs on replay)."""
    return kind in (OpKind.MUTATE, OpKind.COMPUTE)


class _OpNames(TorchDispatchMode):
    """Runs every op unchanged and notes the name of each one that does work."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if does_work(classify(func, args, kwargs, out)):
            self.names.append(str(func))
        return out


def op_names(fn: Callable[[], Any]) -> list[str]:
    """Runs `fn()` once, eagerly, and returns the overload names of the ops that did work,
    in dispatch order (e.g. `["aten.addmm.default", "aten._softmax.default"]`)."""
    mode = _OpNames()
    with mode:
        fn()
    return mode.names


def count_ops(fn: Callable[[], Any]) -> int:
    """Number of ops (views and `empty` excluded) one eager call of `fn()` dispatches."""
    return len(op_names(fn))
