"""Collectives a captured step may hold: functional collectives (`torch.ops._c10d_functional`),
issued and waited inside the step.

A functional collective dispatches as an op that returns a fresh tensor whose value is ready
only after `wait_tensor` on it: `_c10d_functional.all_reduce(x, "sum", group)` then
`wait_tensor`. Both reach a TorchDispatchMode, so a tape records the collective and a CUDA capture
holds its kernel (NCCL). A wait that lies outside the capture is a bug on every backend: on CUDA
the graph ends with the collective in flight (pytorch#192000), on a tape the replayed value would
be read before it arrived. `PendingCollectives` finds it; `describe` says what a collective is,
so ranks can compare the collectives their steps issue (graphs/agree.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves

from graphrt.measure.collective_share import NAMESPACE
from graphrt.measure.opcount import storage_key

WAIT = f"{NAMESPACE}::wait_tensor"


def is_collective(func: torch._ops.OpOverload) -> bool:
    """A functional collective that starts communication (not the wait that ends it)."""
    return func.namespace == NAMESPACE and func._schema.name != WAIT


def is_wait(func: torch._ops.OpOverload) -> bool:
    return func._schema.name == WAIT


@dataclass(frozen=True)
class Collective:
    """One collective as a step issues it: what every rank must issue alike, in the same order."""

    op: str  # e.g. "_c10d_functional.all_reduce.default"
    group: str  # the process group's name
    shape: tuple[int, ...]
    dtype: str
    reduce_op: str | None  # "sum", "avg", ...; None for collectives that reduce nothing

    def __str__(self) -> str:
        reduce = f"{self.reduce_op}, " if self.reduce_op else ""
        return f"{self.op}({reduce}{list(self.shape)} {self.dtype}, group {self.group})"


def _argument(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else kwargs.get(name, a.default_value)
    return None


def describe(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Collective:
    """The collective `func(*args, **kwargs)` issues (its first argument is the tensor sent)."""
    sent = args[0] if isinstance(args[0], torch.Tensor) else args[0][0]  # a tensor or a list of them
    return Collective(str(func), str(_argument(func, args, kwargs, "group_name")), tuple(sent.shape),
                      str(sent.dtype).removeprefix("torch."), _argument(func, args, kwargs, "reduce_op"))


def replay_call(func: Callable[..., Any], args: tuple, kwargs: dict, out: torch.Tensor) -> Callable[[], None]:
    """A tape's replay of a functional collective into the tensor `out` it returned at capture:
    issue it again, wait for it, copy the result in.

    Waiting here rather than at the step's own `wait_tensor` (which replays nothing: it is not an
    op that does work) changes no value, since a tape runs one op after another anyway; copying
    only after the wait is what matters, or the copy would read a result still in flight.
    """
    wait = torch.ops._c10d_functional.wait_tensor.default

    def call() -> None:
        out.copy_(wait(func(*args, **kwargs)))

    return call


class PendingCollectives:
    """The collectives issued and not yet waited, by the storage of the tensor(s) they returned.

    Each pending result's storage is held until its wait: a result dropped unwaited would
    otherwise free its storage for the next collective's result, whose wait would then pass for
    the first one's, and the collective left in flight would go unnamed."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Collective, torch.UntypedStorage]] = {}

    def note(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> None:
        """Called with every op that ran, and its result."""
        if is_collective(func):
            issued = describe(func, args, kwargs)
            for t in tree_leaves(out):  # one result, or a list of them (the coalesced collectives)
                if isinstance(t, torch.Tensor):
                    self.pending[storage_key(t)] = (issued, t.untyped_storage())
        elif is_wait(func):
            self.pending.pop(storage_key(args[0]), None)

    def unwaited_error(self) -> str | None:
        """The refusal for the first collective still in flight, or None if all were waited."""
        if not self.pending:
            return None
        first, _ = next(iter(self.pending.values()))
        return (f"{first} is not waited inside the step: call wait_tensor on its result before the "
                f"step returns (a graph that ends with a collective in flight replays a result that "
                f"has not arrived)")
