"""Piecewise capture of any step: graphs between the calls of chosen modules, each such call left
eager between the graphs' replays. vLLM splits its compiled graph at the attention op the same
way; here the breaks are modules, found in the module tree (`attention_modules`).

    graphs, breaks, out = capture_pieces(step, attention_modules(model), device=..., pool=...)
    # a replay: graphs[0].replay(); breaks[0][1](); graphs[1].replay(); ... graphs[-1].replay()

While the step is captured, each break module's `forward` is swapped for one that ends the graph
being captured, runs the module eagerly, copies what it returned into hand-off tensors (made
then, outside any graph, so the next graph reads them at fixed addresses) and begins the next
graph. A break's replay calls the module again with the very arguments it got at capture:
tensors the graph before it rewrites in place on every replay, and whatever Python objects (a
cache) it was handed. The graphs share one pool; they are replayed in capture order, one at a
time, which is what makes sharing it safe.

On CUDA every piece is warmed up and captured on the pool's side stream, as `capture_cuda` does
(the side stream waits for the caller's work first, the caller's waits for the side stream's
last, even after a failure), and replayed, like its breaks, on the caller's stream: a graph
launches into whichever stream is current, and one stream keeps pieces and breaks in order.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from graphrt.errors import first_line
from graphrt.graphs.cuda import CudaGraph, capture_error_mode, set_up_capture
from graphrt.graphs.guard import GraphCaptureError, HostReadGuard
from graphrt.graphs.pool import Graph, GraphPool, device_bytes_taken
from graphrt.graphs.tape import CaptureMode, TapeRecording

T = TypeVar("T")

# the names under which a module's forward takes a KV cache (transformers 5 and 4.x, Mamba-style)
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "cache_params")


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The innermost modules whose `forward` takes the KV cache: where attention runs, in any
    model, whatever its family calls them (a decoder layer takes the cache too, to pass it on)."""
    def takes_cache(module: nn.Module) -> bool:
        parameters = inspect.signature(type(module).forward).parameters
        return any(name in parameters for name in CACHE_ARGUMENTS)

    takers = [m for m in model.modules() if takes_cache(m)]
    inner = [m for m in takers if not any(d is not m and takes_cache(d) for d in m.modules())]
    return inner


class _TapePiece:
    def __init__(self, device: torch.device):
        self.device = device

    def begin(self) -> None:
        self.recording = TapeRecording(self.device)
        self.recording.begin()

    def end(self) -> Graph:
        return self.recording.end(None)

    def abort(self, error: BaseException) -> BaseException:
        """Leave the capture after the step raised `error`; what the capture raises for it: the
        refusal, where the step swallowed one and failed later."""
        self.recording.abort()
        return self.recording.mode.refused or error


class _CudaPiece:
    """One `torch.cuda.CUDAGraph`, begun and ended by hand on the current (side) stream, with
    what `torch.cuda.graph` does around a capture (and `capture_cuda` around its window)."""

    def __init__(self, device: torch.device, pool: GraphPool):
        self.device, self.pool = device, pool

    open = False

    def begin(self) -> None:
        # Nothing pending and nothing cached, as torch.cuda.graph starts a capture: the warmup's and
        # the last break's released blocks go back to the device, for the pool to take, rather than
        # staying reserved outside it; the memory figures then read this capture only.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.reserved = torch.cuda.memory_reserved(self.device)
        self.free, _ = torch.cuda.mem_get_info(self.device)
        self.graph = torch.cuda.CUDAGraph()
        self.guard = CaptureMode(record=False, allow_random=True)
        self.stack = contextlib.ExitStack()
        self.graph.capture_begin(pool=self.pool.handle, capture_error_mode=capture_error_mode())
        self.open = True
        self.stack.enter_context(HostReadGuard())
        self.stack.enter_context(self.guard)

    def end(self) -> Graph:
        self.guard.end_of_step()
        self.stack.close()
        self.open = False
        try:
            self.graph.capture_end()
        except RuntimeError as error:
            raise self.guard.refused or GraphCaptureError(f"CUDA graph capture failed: {first_line(error)}") from error
        if self.guard.refused is not None:
            raise self.guard.refused
        torch.cuda.synchronize(self.device)
        taken = torch.cuda.memory_reserved(self.device) - self.reserved
        free, _ = torch.cuda.mem_get_info(self.device)
        return CudaGraph(self.graph, self.device, taken, device_bytes_taken(self.free, free))

    def abort(self, error: BaseException) -> BaseException:
        """Leave an open capture after the step raised `error`; what the capture raises for it.
        CUDA refuses an op inside a capture (a sync, a copy from pageable memory) with a
        RuntimeError, and our own refusal, swallowed by the step, can surface as one too: either
        is the capture's failure, in one line, as `capture_cuda` says it."""
        if not self.open:
            return error
        self.stack.close()
        self.open = False
        with contextlib.suppress(RuntimeError):  # ending an invalidated capture raises
            self.graph.capture_end()
        if self.guard.refused is not None:
            return self.guard.refused
        if isinstance(error, RuntimeError):
            return GraphCaptureError(f"CUDA graph capture failed: {first_line(error)}")
        return error


@contextlib.contextmanager
def _side_stream(pool: GraphPool) -> Iterator[torch.cuda.Stream | None]:
    """On CUDA, the pool's side stream made current, ordered after the caller's work on entry and
    before the caller's later work on exit, whatever happened inside; the caller's stream is
    yielded (None for a tape)."""
    if pool.kind == "cuda":
        with torch.cuda.device(pool.device):
            caller = torch.cuda.current_stream(pool.device)
            pool.stream.wait_stream(caller)  # the static inputs, a seek's counters: written on the caller's
            try:
                with torch.cuda.stream(pool.stream):
                    yield caller
            finally:
                caller.wait_stream(pool.stream)
    else:
        yield None


def _hand_off(value: Any, replayed_on: torch.cuda.Stream | None) -> Any:
    """Static copies of a module's outputs (tensors cloned, anything else as it is). On CUDA they
    are made on the side stream and used on `replayed_on` at every replay: recorded there, so
    that their memory is not handed to other work before the last replay's use of it is done."""
    def copy(x: torch.Tensor) -> torch.Tensor:
        static = x.clone()
        if replayed_on is not None:
            static.record_stream(replayed_on)
        return static

    return tree_map(lambda x: copy(x) if isinstance(x, torch.Tensor) else x, value)


def _rerun(module: nn.Module, args: tuple, kwargs: dict, into: Any) -> Callable[[], None]:
    """A break's replay: the module called again as at capture, its outputs copied into `into`."""
    targets = [t for t in tree_leaves(into) if isinstance(t, torch.Tensor)]

    def run() -> None:
        results = [t for t in tree_leaves(module(*args, **kwargs)) if isinstance(t, torch.Tensor)]
        for target, result in zip(targets, results, strict=True):
            target.copy_(result)

    return run


def capture_pieces(fn: Callable[[], T], breaks: Sequence[nn.Module], *, device: torch.device,
                   pool: GraphPool, warmup: int = 3
                   ) -> tuple[list[Graph], list[tuple[nn.Module, Callable[[], None]]], T]:
    """Warm `fn` up, then capture it as graphs between the calls of the `breaks` modules
    (module docstring): the graphs in step order, each break called between them (the module
    and its replayable call), and `fn`'s static output, recomputed in place by a replay of them all."""
    if pool.kind == "cuda":
        set_up_capture(device)  # the process's one-off capture costs, kept out of the first piece
    with _side_stream(pool) as caller:
        for _ in range(warmup):
            fn()
        graphs: list[Graph] = []
        calls: list[tuple[nn.Module, Callable[[], None]]] = []
        piece = _CudaPiece(device, pool) if pool.kind == "cuda" else _TapePiece(device)
        swapped = [(module, vars(module).get("forward"), module.forward) for module in breaks]

        def at_break(module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
            def break_here(*args: Any, **kwargs: Any) -> Any:
                graphs.append(piece.end())
                out = _hand_off(forward(*args, **kwargs), caller)
                calls.append((module, _rerun(module, args, kwargs, out)))
                piece.begin()
                return out
            return break_here

        for module, _, forward in swapped:
            module.forward = at_break(module, forward)
        try:
            piece.begin()
            try:
                out = fn()
            except BaseException as error:
                raised = piece.abort(error)
                if raised is error:
                    raise
                raise raised from error
            graphs.append(piece.end())
        finally:
            for module, previous, _ in swapped:  # each module's forward as it was
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous
    return graphs, calls, out
