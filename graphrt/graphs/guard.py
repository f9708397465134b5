"""What a graph capture refuses: host syncs, data-dependent shapes, copies to the host,
random ops (in a tape), and ops that move a captured tensor to new memory. Each refusal is a
`GraphCaptureError` that names the op, the analogue of CUDA's "operation not permitted when
stream is capturing"."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from graphrt.errors import GraphrtError
from graphrt.measure.opcount import storage_key


class GraphCaptureError(GraphrtError):
    """The captured function did something a graph cannot replay (a host sync, a
    data-dependent shape, ...). The message names the op."""


_HOST_SYNC = (
    "operation not permitted while capturing (a host sync: .item(), .tolist(), int(tensor)); "
    "keep step inputs as device tensors"
)
_DYNAMIC_SHAPE = (
    "operation not permitted while capturing (its output shape depends on tensor data); "
    "keep every shape in the step static"
)
_TO_HOST = (
    "operation not permitted while capturing (it copies device data to the host); "
    "keep the step's values on the device"
)
_RANDOM = (
    "random ops are not supported by TapeGraph (replay would repeat the captured random numbers); "
    "keep dropout and sampling out of the step"
)
NEW_MEMORY = (
    "operation not permitted while capturing a tape (it moves a tensor to new memory); "
    "captured tensors must keep their memory"
)

# Tensor methods that read data on the host without dispatching an aten op on CPU.
_HOST_READS = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy"}
# Ops that hand tensor data to Python as a bool without the data_dependent_output tag: on the CPU
# they read it directly (no `_local_scalar_dense` follows), so `if x.sum() > 0:` would pass.
_TO_PYTHON_BOOL = frozenset({"aten::is_nonzero", "aten::equal", "aten::allclose"})


def _arg(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    """Value of argument `name` as the op received it (positional, keyword or default)."""
    position, argument = next((i, a) for i, a in enumerate(func._schema.arguments) if a.name == name)
    return args[position] if position < len(args) else kwargs.get(name, argument.default_value)


# the dropouts F.dropout and its kin call: (input, p, train)
_DROPOUTS = ("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout")


def _has_bool_index(args: tuple) -> bool:
    """Whether an index or index_put op's indices (its second argument, which the dispatcher
    always passes by position) hold a mask."""
    return any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in args[1])


def _without_dropout(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """An op tagged random for its dropout, called with none, is exact: fused attention with
    dropout_p 0, or `dropout` itself outside training (what an eval-mode nn.Dropout calls)."""
    names = {a.name for a in func._schema.arguments}
    if "dropout_p" in names:
        return not _arg(func, args, kwargs, "dropout_p")
    if func._schema.name in _DROPOUTS:
        return not _arg(func, args, kwargs, "train") or not _arg(func, args, kwargs, "p")
    return False


def refusal(func: torch._ops.OpOverload, args: tuple, kwargs: dict, allow_random: bool = False) -> str | None:
    """Why `func` may not run inside a capture, or None if it may. Checked before it runs."""
    tags = func.tags
    name = func._schema.name
    if torch.Tag.data_dependent_output in tags or name in _TO_PYTHON_BOOL:
        return _HOST_SYNC
    if torch.Tag.dynamic_output_shape in tags:
        # x[idx] with integer indices has a static shape; only a boolean mask makes it dynamic.
        if not (name == "aten::index" and not _has_bool_index(args)):
            return _DYNAMIC_SHAPE
    if name in ("aten::index_put", "aten::index_put_", "aten::_index_put_impl_") and _has_bool_index(args):
        return _DYNAMIC_SHAPE  # x[mask] = v finds the mask's nonzeros first
    if not allow_random and torch.Tag.nondeterministic_seeded in tags and not _without_dropout(func, args, kwargs):
        return _RANDOM
    if name == "aten::_to_copy":
        target = kwargs.get("device")
        if target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu":
            return _TO_HOST
    if name == "aten::copy_" and args[0].device.type == "cpu" and args[1].device.type != "cpu":
        return _TO_HOST
    return None


class HostReadGuard(TorchFunctionMode):
    """Refuses the host reads that never reach the dispatcher (`.tolist()` of a CPU tensor).

    With `report`, it hands the refusal's text to `report(name, reason)` and lets the read
    happen instead (a lint goes on to find more).
    """

    def __init__(self, report: Callable[[str, str], None] | None = None) -> None:
        super().__init__()
        self.report = report

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            if self.report is None:
                raise GraphCaptureError(f"{_HOST_READS[func]}: {_HOST_SYNC}")
            self.report(_HOST_READS[func], _HOST_SYNC)
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=None)
def _written_args(func: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    """(position, name) of every argument the op writes into."""
    return tuple(
        (i, a.name)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def written_tensors(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors the op writes into (in-place or out= arguments)."""
    written = [args[i] if i < len(args) else kwargs.get(name) for i, name in _written_args(func)]
    return [t for t in tree_leaves(written) if isinstance(t, torch.Tensor)]


def _memory_of_written(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[int, int]]:
    """(storage identity, data address) of each tensor the op writes into."""
    return [(storage_key(t), t.untyped_storage().data_ptr()) for t in written_tensors(func, args, kwargs)]


def run_watching_writes(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """Run the op; also say whether a tensor it writes into now lies in new memory (a resize,
    which a replay would not repeat: see NEW_MEMORY)."""
    before = _memory_of_written(func, args, kwargs)
    out = func(*args, **kwargs)
    return out, _memory_of_written(func, args, kwargs) != before
