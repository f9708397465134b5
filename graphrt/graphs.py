"""Capture a step once, replay it many times: CUDA graphs, and a tape with the same rules.

`capture(fn, device=...)` runs `fn` a few times to warm up, captures one more call and
returns `(graph, static_output)`. After that, `graph.replay()` recomputes `static_output` in
place from whatever the tensors `fn` reads hold at that moment. That is the whole contract a
graph backend needs: keep static input buffers, copy each step's inputs into them, replay,
read the static output (and clone what must outlive the next replay).

Two implementations share it:

- `CudaGraph` wraps `torch.cuda.CUDAGraph`. Several captures can share one memory pool
  (`new_pool`), which is how batch buckets are captured largest first.
- `TapeGraph` gives the same semantics on any device. Capture runs `fn` once under a dispatch
  mode that records every aten op with its tensors by identity; replay re-runs the recorded
  ops into the very tensors capture created. As with CUDA graphs, Python code does not run on
  replay, Python scalars are frozen at capture, and a host sync during capture raises
  `GraphCaptureError` naming the op. It is a correctness tool, not a speed claim.

Unlike a CUDA capture, which only records kernels, a tape capture *executes* `fn` once more
than the warmup did; a step that writes a KV cache writes it during capture too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, TypeVar, runtime_checkable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from graphrt.errors import GraphrtError
from graphrt.opcount import OpKind, classify, does_work, storage_key

__all__ = [
    "GraphCaptureError",
    "Graph",
    "GraphPool",
    "CudaGraph",
    "TapeGraph",
    "graph_kind",
    "new_pool",
    "capture",
]

T = TypeVar("T")
Kind = Literal["cuda", "tape"]


class GraphCaptureError(GraphrtError):
    """The captured function did something a graph cannot replay (a host sync, a
    data-dependent shape, ...). The message names the op."""


@runtime_checkable
class Graph(Protocol):
    """One captured call of a step, at fixed shapes and fixed memory."""

    @property
    def device(self) -> torch.device: ...

    @property
    def memory_bytes(self) -> int:
        """Memory the graph holds for itself (intermediates and static outputs), in bytes."""
        ...

    def replay(self) -> None:
        """Recompute the static output in place from the current contents of the inputs."""
        ...


@dataclass(frozen=True)
class GraphPool:
    """Memory shared by graphs captured into it.

    On CUDA, `handle` is a `torch.cuda.graph_pool_handle()`: captures into one pool reuse each
    other's memory (safe as long as they are replayed one at a time). A tape keeps its own
    tensors, so for `kind == "tape"` the pool is only a token and `handle` is None.
    """

    device: torch.device
    kind: Kind
    handle: Any = None


def _normalize_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def graph_kind(device: torch.device | str, kind: Literal["auto", "cuda", "tape"] = "auto") -> Kind:
    """The implementation `capture` uses: "cuda" on a CUDA device, "tape" elsewhere, unless
    asked for explicitly (a tape also works on CUDA, which is useful to compare the two)."""
    device = torch.device(device)
    if kind == "auto":
        return "cuda" if device.type == "cuda" else "tape"
    if kind == "tape":
        return "tape"
    if kind == "cuda":
        if device.type != "cuda" or not torch.cuda.is_available():
            raise GraphrtError(f"graph kind 'cuda' needs a CUDA device, got device {str(device)!r}")
        return "cuda"
    raise GraphrtError(f"graph kind {kind!r} is not one of 'auto', 'cuda', 'tape'")


def new_pool(device: torch.device | str, kind: Literal["auto", "cuda", "tape"] = "auto") -> GraphPool:
    """A memory pool for `capture(..., pool=...)` on `device`."""
    device = _normalize_device(device)
    resolved = graph_kind(device, kind)
    handle = torch.cuda.graph_pool_handle() if resolved == "cuda" else None
    return GraphPool(device=device, kind=resolved, handle=handle)


def capture(
    fn: Callable[[], T],
    *,
    device: torch.device | str,
    pool: GraphPool | None = None,
    warmup: int = 3,
    kind: Literal["auto", "cuda", "tape"] = "auto",
) -> tuple[Graph, T]:
    """Warm `fn` up `warmup` times, capture one call, return `(graph, static_output)`.

    `fn` takes no arguments: it reads its inputs from tensors it closes over (the static
    buffers), and those are what a replay reads. `static_output` is what the captured call
    returned; every replay overwrites it in place.
    """
    device = _normalize_device(device)
    resolved = graph_kind(device, kind)
    if warmup < 0:
        raise GraphrtError(f"warmup must be >= 0, got {warmup}")
    if pool is not None and (pool.kind != resolved or pool.device != device):
        raise GraphrtError(
            f"pool is for a {pool.kind} graph on {pool.device}, but this capture is a {resolved} graph on {device}"
        )
    if resolved == "cuda":
        return _capture_cuda(fn, device, pool, warmup)
    return _capture_tape(fn, device, warmup)


# --- what a capture refuses ---------------------------------------------------------------

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
_NEW_MEMORY = (
    "operation not permitted while capturing a tape (it moves a tensor to new memory); "
    "captured tensors must keep their memory"
)

# Tensor methods that read data on the host without dispatching an aten op on CPU.
_HOST_READS = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy"}


def _arg(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    """Value of argument `name` as the op received it (positional, keyword or default)."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return kwargs.get(name, a.default_value)
    raise KeyError(name)


def _has_bool_index(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    indices = _arg(func, args, kwargs, "indices")
    return any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices)


def _refusal(func: torch._ops.OpOverload, args: tuple, kwargs: dict, allow_random: bool) -> str | None:
    """Why `func` may not run inside a capture, or None if it may. Checked before it runs."""
    tags = func.tags
    name = func._schema.name
    if torch.Tag.data_dependent_output in tags:
        return _HOST_SYNC
    if torch.Tag.dynamic_output_shape in tags:
        # x[idx] with integer indices has a static shape; only a boolean mask makes it dynamic.
        if not (name == "aten::index" and not _has_bool_index(func, args, kwargs)):
            return _DYNAMIC_SHAPE
    if name in ("aten::index_put", "aten::index_put_", "aten::_index_put_impl_") and _has_bool_index(
        func, args, kwargs
    ):
        return _DYNAMIC_SHAPE  # x[mask] = v finds the mask's nonzeros first
    if not allow_random and torch.Tag.nondeterministic_seeded in tags:
        # Fused attention ops carry the tag for their dropout; without dropout they are exact.
        if not any(a.name == "dropout_p" for a in func._schema.arguments) or _arg(func, args, kwargs, "dropout_p"):
            return _RANDOM
    if name == "aten::_to_copy":
        target = kwargs.get("device")
        if target is not None and torch.device(target).type == "cpu" and args[0].device.type != "cpu":
            return _TO_HOST
    if name == "aten::copy_" and args[0].device.type == "cpu" and args[1].device.type != "cpu":
        return _TO_HOST
    return None


class _HostReadGuard(TorchFunctionMode):
    """Refuses the host reads that never reach the dispatcher (`.tolist()` of a CPU tensor)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            raise GraphCaptureError(f"{_HOST_READS[func]}: {_HOST_SYNC}")
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=None)
def _written_args(func: torch._ops.OpOverload) -> tuple[tuple[int, str], ...]:
    """(position, name) of every argument the op writes into."""
    return tuple(
        (i, a.name)
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _memory_of_written(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[int, int]]:
    """(storage identity, data address) of each tensor the op writes into."""
    written = [args[i] if i < len(args) else kwargs.get(name) for i, name in _written_args(func)]
    return [(storage_key(t), t.untyped_storage().data_ptr()) for t in tree_leaves(written) if isinstance(t, torch.Tensor)]


# --- the tape -----------------------------------------------------------------------------


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset())


@dataclass
class _Entry:
    """One recorded op that does work, with the layout each of its tensors had at the time."""

    func: torch._ops.OpOverload
    kind: OpKind
    args: tuple
    kwargs: dict
    out: Any
    layouts: dict[int, tuple]  # id(tensor) -> (shape, stride, storage_offset) when dispatched
    out_kwargs: dict[str, Any] | None  # for a functional op: its out= overload's out arguments


class _CaptureMode(TorchDispatchMode):
    """Runs every op unchanged, refuses those a graph cannot replay, and (if `record`) keeps
    the ops that do work, in order, with their tensors."""

    def __init__(self, *, record: bool, allow_random: bool) -> None:
        super().__init__()
        self.record = record
        self.allow_random = allow_random
        self.entries: list[_Entry] = []
        self.created: set[int] = set()  # storages that ops allocated during the capture
        self.refused: GraphCaptureError | None = None

    def _refuse(self, func: torch._ops.OpOverload, reason: str) -> GraphCaptureError:
        error = GraphCaptureError(f"{func}: {reason}")
        # Kept so that a step which catches the exception still fails its capture.
        self.refused = self.refused or error
        return error

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _refusal(func, args, kwargs, self.allow_random)
        if reason is not None:
            raise self._refuse(func, reason)
        if not self.record:
            return func(*args, **kwargs)

        before = _memory_of_written(func, args, kwargs) if func._schema.is_mutable else None
        out = func(*args, **kwargs)
        if before is not None and _memory_of_written(func, args, kwargs) != before:
            raise self._refuse(func, _NEW_MEMORY)
        kind = classify(func, args, kwargs, out)
        if kind in (OpKind.COMPUTE, OpKind.ALLOC):
            self.created.update(storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        if does_work(kind):
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            layouts = {id(t): _layout(t) for t in tensors}
            out_kwargs = _try_out_variant(func, args, kwargs, out) if kind is OpKind.COMPUTE else None
            self.entries.append(_Entry(func, kind, args, kwargs, out, layouts, out_kwargs))
        return out


@functools.lru_cache(maxsize=None)
def _out_variant(func: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, tuple[str, ...]] | None:
    """The out= overload of a functional op and the names of its out arguments, in the order
    of the functional op's results; None if there is no exact counterpart.

    e.g. `aten.max.dim` -> (`aten.max.dim_max`, ("max", "max_values")).
    """
    signature = [(a.name, str(a.type), a.kwarg_only) for a in func._schema.arguments]
    results = [str(r.type) for r in func._schema.returns]
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        written = [a for a in candidate._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        rest = [
            (a.name, str(a.type), a.kwarg_only)
            for a in candidate._schema.arguments
            if a.alias_info is None or not a.alias_info.is_write
        ]
        if written and rest == signature and all(a.kwarg_only for a in written):
            if [str(a.type) for a in written] == results:
                return candidate, tuple(a.name for a in written)
    return None


def _try_out_variant(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> dict[str, Any] | None:
    """The out arguments for re-running `func` through its out= overload into `out`, or None.

    The overload is tried once right here, before anything else has seen `out`: a schema can
    exist without a kernel for this device, and that must show now, not on the first replay.
    It must also rewrite the very same bits, or replay would not be eager's step: `linear.out`
    with a bias, for one, takes another BLAS path than `linear` at some shapes (an 8x896 input
    differs in the last bits). Where the bits differ, `out` is restored and None returned, so
    the op replays functionally and copies its result in.
    """
    variant = _out_variant(func)
    if variant is None:
        return None
    out_func, out_names = variant
    targets = (out,) if len(out_names) == 1 else tuple(out)
    before = [t.clone() for t in targets]
    try:
        out_func(*args, **kwargs, **dict(zip(out_names, targets)))
    except RuntimeError:  # e.g. "could not run 'aten::...out' with arguments from the 'CPU' backend"
        return None
    if not all(_same_bits(a, b) for a, b in zip(before, targets)):
        for target, value in zip(targets, before):
            target.copy_(value)
        return None
    return dict(zip(out_names, targets))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs included), whatever the dtype."""
    as_bytes = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def _copy_back_one(func: Callable, args: tuple, kwargs: dict, target: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        target.copy_(func(*args, **kwargs))

    return call


def _copy_back_many(func: Callable, args: tuple, kwargs: dict, targets: list) -> Callable[[], None]:
    def call() -> None:
        for target, result in zip(targets, tree_leaves(func(*args, **kwargs))):
            if target is not None:
                target.copy_(result)

    return call


class TapeGraph:
    """A recorded list of aten ops replayed into the tensors they wrote at capture.

    Replay needs no Python beyond one loop: each op is bound to its arguments at capture.
    An in-place or out= op is re-run as recorded; a functional op is re-run through its out=
    overload into the tensor it produced at capture, or, where it has none, re-run and its
    result copied into that tensor. Views are not re-run: they alias memory that stays put.
    """

    def __init__(self, device: torch.device, calls: list[Callable[[], Any]], names: list[str], memory_bytes: int):
        self._device = device
        self._calls = tuple(calls)
        self._names = tuple(names)
        self._memory_bytes = memory_bytes

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def memory_bytes(self) -> int:
        """Bytes of the storages allocated during capture that the tape keeps alive (each
        storage once, however many views of it it holds). Weights and inputs are not counted;
        unlike a CUDA graph, a tape reuses no memory between its intermediates."""
        return self._memory_bytes

    @property
    def op_names(self) -> tuple[str, ...]:
        """Overload names of the recorded ops, in order; comparable with `opcount.op_names`."""
        return self._names

    def __len__(self) -> int:
        return len(self._calls)

    def replay(self) -> None:
        # Inference mode: replay computes values only, and captured tensors may be inference
        # tensors, which only accept in-place writes inside it.
        with torch.inference_mode():
            for call in self._calls:
                call()


def _pin(tree: Any, layouts: dict[int, tuple]) -> Any:
    """`tree` with every tensor whose shape/stride/offset has changed since it was recorded
    (an in-place view op like `unsqueeze_`) replaced by an alias with the recorded layout."""

    def pin(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or _layout(x) == layouts[id(x)]:
            return x
        shape, stride, offset = layouts[id(x)]
        return x.as_strided(shape, stride, offset)

    with torch.no_grad():
        return tree_map(pin, tree)


def _callable(func: torch._ops.OpOverload) -> Callable[..., Any]:
    # The C++ callable behind an OpOverload: calling it directly skips one Python frame per
    # op on every replay.
    return getattr(func, "_op", func)


def _replay_call(entry: _Entry) -> Callable[[], Any]:
    args, kwargs, out, out_kwargs = _pin((entry.args, entry.kwargs, entry.out, entry.out_kwargs), entry.layouts)
    if entry.kind is OpKind.MUTATE:
        fresh = [r.alias_info is None for r in entry.func._schema.returns]
        if not any(fresh):  # results (if any) are the arguments it wrote: re-running is all
            return functools.partial(_callable(entry.func), *args, **kwargs)
        # e.g. training batch norm: writes its running stats *and* returns new tensors.
        results = (out,) if len(fresh) == 1 else tuple(out)
        kept = [r if is_fresh else tree_map(lambda _: None, r) for r, is_fresh in zip(results, fresh)]
        targets = [t if isinstance(t, torch.Tensor) else None for t in tree_leaves(kept)]
        return _copy_back_many(_callable(entry.func), args, kwargs, targets)
    if out_kwargs is not None:
        out_func, _ = _out_variant(entry.func)
        return functools.partial(_callable(out_func), *args, **kwargs, **out_kwargs)
    if isinstance(out, torch.Tensor):
        return _copy_back_one(_callable(entry.func), args, kwargs, out)
    targets = [t if isinstance(t, torch.Tensor) else None for t in tree_leaves(out)]
    return _copy_back_many(_callable(entry.func), args, kwargs, targets)


def _held_bytes(tensors: list[torch.Tensor], created: set[int]) -> int:
    """Bytes of the distinct storages among `tensors` that were allocated during capture."""
    sizes = {storage_key(t): t.untyped_storage().nbytes() for t in tensors if storage_key(t) in created}
    return sum(sizes.values())


def _capture_tape(fn: Callable[[], T], device: torch.device, warmup: int) -> tuple[TapeGraph, T]:
    for _ in range(warmup):
        fn()
    mode = _CaptureMode(record=True, allow_random=False)
    with _HostReadGuard(), mode:
        out = fn()
    if mode.refused is not None:
        raise mode.refused
    calls = [_replay_call(e) for e in mode.entries]
    held = [t for e in mode.entries for t in tree_leaves((e.args, e.kwargs, e.out)) if isinstance(t, torch.Tensor)]
    held += [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    graph = TapeGraph(device, calls, [str(e.func) for e in mode.entries], _held_bytes(held, mode.created))
    return graph, out


# --- CUDA graphs ----------------------------------------------------------------------------


class CudaGraph:
    """A `torch.cuda.CUDAGraph` and what it cost to capture."""

    def __init__(self, graph: torch.cuda.CUDAGraph, device: torch.device, memory_bytes: int):
        self._graph = graph
        self._device = device
        self._memory_bytes = memory_bytes

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def memory_bytes(self) -> int:
        """Growth of the CUDA allocator's reserved memory during capture. With a shared pool,
        later (smaller) captures mostly reuse what the first one reserved and report ~0."""
        return self._memory_bytes

    def replay(self) -> None:
        self._graph.replay()


def _capture_cuda(
    fn: Callable[[], T], device: torch.device, pool: GraphPool | None, warmup: int
) -> tuple[CudaGraph, T]:
    with torch.cuda.device(device):
        # Warm up on a side stream, so lazy initialisation (cuBLAS handles, autotuning) and
        # the allocator's first blocks happen outside the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

        # `torch.cuda.graph` empties the allocator's cache as it starts; do it first, or the
        # warmup's released blocks would show up as negative graph memory.
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        guard = _CaptureMode(record=False, allow_random=True)
        try:
            with torch.cuda.graph(graph, pool=None if pool is None else pool.handle):
                with _HostReadGuard(), guard:
                    out = fn()
        except RuntimeError as error:
            # Our refusal can surface as CUDA's own error: ending an invalidated capture
            # raises, and so does a sync after a step that swallowed our exception.
            if guard.refused is not None:
                raise guard.refused from error
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise GraphCaptureError(f"CUDA graph capture failed: {first_line}") from error
        if guard.refused is not None:
            raise guard.refused
        torch.cuda.synchronize()
        memory = torch.cuda.memory_reserved() - before
    return CudaGraph(graph, device, memory), out
