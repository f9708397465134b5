"""TapeGraph: CUDA-graph semantics on any device.

Capture runs the step under a dispatch mode that records every aten op that does work, with
its tensors by identity; replay re-runs the recorded ops into the very tensors capture made
(functional ops through their out= overload where that gives the same bits). Python does not
run on replay, and Python scalars are frozen at capture.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from graphrt.graphs import collectives
from graphrt.graphs.guard import NEW_MEMORY, GraphCaptureError, HostReadGuard, refusal, run_watching_writes
from graphrt.measure import nvtx
from graphrt.measure.opcount import OpKind, classify, does_work, storage_key

T = TypeVar("T")


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
    ranges: tuple[str, ...]  # the graphrt ranges open when it was dispatched (TapeGraph.op_ranges)


class CaptureMode(TorchDispatchMode):
    """Runs every op unchanged, refuses those a graph cannot replay, and (if `record`) keeps
    the ops that do work, in order, with their tensors."""

    def __init__(self, *, record: bool, allow_random: bool = False, open_ranges: Sequence[str] = ()) -> None:
        super().__init__()
        self.record = record
        self.open_ranges = open_ranges  # read as ops arrive: the caller's live stack of ranges
        self.allow_random = allow_random
        self.entries: list[_Entry] = []
        self.created: set[int] = set()  # storages that ops allocated during the capture
        self.refused: GraphCaptureError | None = None
        self.collectives = collectives.PendingCollectives()

    def _refuse(self, func: torch._ops.OpOverload, reason: str) -> GraphCaptureError:
        where = f" in {self.open_ranges[-1]}" if self.open_ranges else ""
        error = GraphCaptureError(f"{func}{where}: {reason}")
        # Kept so that a step which catches the exception still fails its capture.
        self.refused = self.refused or error
        return error

    def end_of_step(self) -> None:
        """Called as the captured call returns: a collective it issued and did not wait for
        is refused (it would still be in flight as the graph ends)."""
        reason = self.collectives.unwaited_error()
        if reason is not None:
            self.refused = self.refused or GraphCaptureError(reason)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = refusal(func, args, kwargs, self.allow_random)
        if reason is not None:
            raise self._refuse(func, reason)
        if not self.record:
            out = func(*args, **kwargs)
            self.collectives.note(func, args, kwargs, out)
            return out

        out, moved = run_watching_writes(func, args, kwargs)
        self.collectives.note(func, args, kwargs, out)
        if moved:
            raise self._refuse(func, NEW_MEMORY)
        kind = classify(func, args, kwargs, out)
        if kind in (OpKind.COMPUTE, OpKind.ALLOC):
            self.created.update(storage_key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        if does_work(kind):
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            layouts = {id(t): _layout(t) for t in tensors}
            out_kwargs = _try_out_variant(func, args, kwargs, out) if kind is OpKind.COMPUTE else None
            self.entries.append(_Entry(func, kind, args, kwargs, out, layouts, out_kwargs,
                                       tuple(self.open_ranges)))
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

    call.copies = 1  # what a replay dispatches besides the op: `TapeGraph.replay_op_names`
    return call


def _copy_back_many(func: Callable, args: tuple, kwargs: dict, targets: list) -> Callable[[], None]:
    def call() -> None:
        for target, result in zip(targets, tree_leaves(func(*args, **kwargs))):
            if target is not None:
                target.copy_(result)

    call.copies = sum(target is not None for target in targets)
    return call


@dataclass(frozen=True, eq=False)
class TapeGraph:
    """A recorded list of aten ops replayed into the tensors they wrote at capture.

    Replay needs no Python beyond one loop: each op is bound to its arguments at capture.
    An in-place or out= op is re-run as recorded; a functional op is re-run through its out=
    overload into the tensor it produced at capture, or, where it has none, re-run and its
    result copied into that tensor. Views are not re-run: they alias memory that stays put.
    """

    device: torch.device
    calls: tuple[Callable[[], Any], ...]  # one closure per recorded op, arguments bound
    op_names: tuple[str, ...]  # overload names, in order; comparable with `opcount.op_names`
    # Per op, the graphrt ranges (modules, named ranges) opened inside the capture and open when
    # it was recorded, outermost first: which module issued it, known exactly. Empty tuples
    # where no ranges are attached.
    op_ranges: tuple[tuple[str, ...], ...]
    # Bytes of the storages allocated during capture that the tape keeps alive (each storage
    # once, however many views of it it holds). Weights and inputs are not counted; unlike a
    # CUDA graph, a tape reuses no memory between its intermediates.
    memory_bytes: int
    # Per op, what it wrote (its result, or the arguments it wrote in place): after a replay,
    # that replay's values (graphrt.graphs.localize compares them with eager's).
    op_outputs: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self.calls)

    def replay_op_names(self) -> list[tuple[int, str]]:
        """(index of the recorded op, name) of each op a replay dispatches, in order: the
        recorded op, then the `copy_` of each result an op without an out= form copies back
        (a composite op recorded whole in inference mode, `rms_norm` or attention)."""
        names = []
        for i, (call, name) in enumerate(zip(self.calls, self.op_names)):
            names += [(i, name)] + [(i, "aten.copy_.default")] * getattr(call, "copies", 0)
        return names

    def replay(self) -> None:
        # Inference mode: replay computes values only, and captured tensors may be inference
        # tensors, which only accept in-place writes inside it.
        with torch.inference_mode():
            for call in self.calls:
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
    if collectives.is_collective(entry.func):
        return collectives.replay_call(_callable(entry.func), args, kwargs, out)
    if entry.kind is OpKind.MUTATE and not any(r.alias_info is None for r in entry.func._schema.returns):
        # its results (if any) are the arguments it wrote: re-running it is all
        return functools.partial(_callable(entry.func), *args, **kwargs)
    if out_kwargs is not None:  # a functional op with an out= overload that writes the same bits
        out_func, _ = _out_variant(entry.func)
        return functools.partial(_callable(out_func), *args, **kwargs, **out_kwargs)
    # Re-run, its results copied back. This also serves an op that writes an argument *and*
    # returns new tensors (training batch norm: its running statistics): a result that is an
    # argument it wrote is copied onto itself, which changes nothing.
    if isinstance(out, torch.Tensor):
        return _copy_back_one(_callable(entry.func), args, kwargs, out)
    targets = [t if isinstance(t, torch.Tensor) else None for t in tree_leaves(out)]
    return _copy_back_many(_callable(entry.func), args, kwargs, targets)


def _held_bytes(tensors: list[torch.Tensor], created: set[int]) -> int:
    """Bytes of the distinct storages among `tensors` that were allocated during capture."""
    sizes = {storage_key(t): t.untyped_storage().nbytes() for t in tensors if storage_key(t) in created}
    return sum(sizes.values())


class TapeRecording:
    """One tape capture, begun and ended by hand: `capture_tape`'s capture, unrolled, so that one
    call of a step can end a capture and begin another (graphrt.graphs.segments)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stack: contextlib.ExitStack | None = None

    def begin(self) -> None:
        self._stack = contextlib.ExitStack()
        ranges = self._stack.enter_context(nvtx.open_ranges())
        self.mode = CaptureMode(record=True, open_ranges=ranges)
        self._stack.enter_context(HostReadGuard())
        self._stack.enter_context(self.mode)

    def abort(self) -> None:
        """Leave the capture, keeping nothing (a step that raised)."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def end(self, out: Any) -> TapeGraph:
        """The graph of what ran since `begin`; `out` is what the captured call returned."""
        self.mode.end_of_step()
        self.abort()
        mode = self.mode
        if mode.refused is not None:
            raise mode.refused
        calls = [_replay_call(e) for e in mode.entries]
        held = [t for e in mode.entries for t in tree_leaves((e.args, e.kwargs, e.out)) if isinstance(t, torch.Tensor)]
        held += [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return TapeGraph(self.device, tuple(calls), tuple(str(e.func) for e in mode.entries),
                         tuple(e.ranges for e in mode.entries), _held_bytes(held, mode.created),
                         tuple(e.out for e in mode.entries))


def capture_tape(fn: Callable[[], T], device: torch.device, warmup: int) -> tuple[TapeGraph, T]:
    for _ in range(warmup):
        fn()
    recording = TapeRecording(device)
    recording.begin()
    try:
        out = fn()
    except BaseException:
        recording.abort()
        raise
    return recording.end(out), out
