"""CudaGraph: `torch.cuda.CUDAGraph` capture, warmed up and captured on the device's side stream;
the process's one-off capture set-up, done and timed apart; the capture's error mode."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

import torch
import torch.distributed as dist

from graphrt.errors import first_line
from graphrt.graphs.annotate import NOT_REQUESTED, NodeAnnotations, NodeRanges, said
from graphrt.graphs.guard import GraphCaptureError, HostReadGuard
from graphrt.graphs.pool import device_bytes_taken, side_stream
from graphrt.graphs.tape import CaptureMode

if TYPE_CHECKING:
    from graphrt.graphs.pool import GraphPool

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class CudaGraph:
    """A `torch.cuda.CUDAGraph` and what it cost to capture."""

    graph: torch.cuda.CUDAGraph
    device: torch.device
    # Growth of the CUDA allocator's reserved memory during capture: what the graph's pool took.
    # With a shared pool, later (smaller) captures mostly reuse what the first one reserved.
    memory_bytes: int
    # Drop of the device's free memory (`torch.cuda.mem_get_info`) over warmup and capture: the
    # pool plus what lives outside the allocator (cuBLAS workspaces, the graph's own buffers);
    # None where free memory rose instead (graphrt.graphs.pool.device_bytes_taken)
    device_bytes: int | None
    # Per kernel (and memcpy) node, by its toolsId (what a profiler calls its graph node id): the
    # graphrt ranges open when it was captured, outermost first (graphrt.graphs.annotate).
    node_ranges: NodeRanges = field(default_factory=dict)
    node_ranges_missing: str | None = NOT_REQUESTED  # why node_ranges is empty; None when recorded

    def replay(self) -> None:
        self.graph.replay()


def capture_error_mode() -> str:
    """The cudaStreamCaptureMode every capture runs under.

    torch's default, "global", fails a capture when any thread of the process makes a call that
    is unsafe during one. With a process group live, NCCL's watchdog thread queries the events of
    earlier collectives at any moment (`cudaEventQuery`): under "global" that query, not the step,
    would fail the capture. So a capture then refuses unsafe calls on its own thread only
    ("thread_local"), where the step runs; without a group no other thread of graphrt's touches
    CUDA, and the stricter default stays."""
    return "thread_local" if dist.is_available() and dist.is_initialized() else "global"


_SET_UP: set[torch.device] = set()  # the devices whose capture set-up this process has done


def set_up_capture(device: torch.device) -> float | None:
    """Once per process and CUDA `device`, what its first capture would otherwise pay for: the side
    stream's cuBLAS handle and workspace (cuBLAS keeps one per stream; a small matmul in each
    dtype a step may use), and the driver's and torch's first capture, instantiation and replay
    (a one-kernel graph, dropped). Its seconds, so that no bucket's `capture_s` holds them and
    buckets compare; None where it was done already. The workspace it allocates is no graph's."""
    if device in _SET_UP:
        return None
    with torch.cuda.device(device):
        start = time.perf_counter()
        side, caller = side_stream(device), torch.cuda.current_stream(device)
        side.wait_stream(caller)
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        dtypes = (torch.float32, torch.float16, *((torch.bfloat16,) if bf16 else ()))
        with torch.cuda.stream(side):
            for dtype in dtypes:
                square = torch.ones(64, 64, device=device, dtype=dtype)
                square @ square
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side, capture_error_mode=capture_error_mode()):
                square.add_(1)
            graph.replay()
        caller.wait_stream(side)
        torch.cuda.synchronize(device)
        del graph, square
        _SET_UP.add(device)
        return time.perf_counter() - start


def _capture(fn: Callable[[], T], side: torch.cuda.Stream, caller: torch.cuda.Stream, pool: GraphPool | None,
             annotations: NodeAnnotations, guard: CaptureMode) -> tuple[torch.cuda.CUDAGraph, T]:
    """One capture of `fn` on `side`, watched by `guard`: the graph and its output."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=None if pool is None else pool.handle, stream=side,
                              capture_error_mode=capture_error_mode(), **annotations.graph_options()):
            with HostReadGuard(), guard, annotations.capturing():
                out = fn()
                guard.end_of_step()
    except RuntimeError as error:
        annotations.discard()
        # Our refusal can surface as CUDA's own error: ending an invalidated capture
        # raises, and so does a sync after a step that swallowed our exception.
        if guard.refused is not None:
            raise guard.refused from error
        raise GraphCaptureError(f"CUDA graph capture failed: {first_line(error)}") from error
    finally:
        # When `capture_end` raises, torch.cuda.graph never restores the stream it made
        # current: put the caller's back, or every later op would queue on the side stream.
        torch.cuda.set_stream(caller)
    return graph, out


def capture_cuda(
    fn: Callable[[], T], device: torch.device, pool: GraphPool | None, warmup: int, annotate: bool = False
) -> tuple[CudaGraph, T]:
    """Warm up and capture `fn` (see graphrt.graphs.capture); with `annotate`, also record the
    ranges open at each node's capture where the machine can (`CudaGraph.node_ranges`)."""
    with torch.cuda.device(device):
        set_up_capture(device)  # done first by the caller where its cost is reported apart
        # The device's free memory is read with nothing pending and nothing cached: blocks the
        # allocator cached earlier (an eager step's prefill logits, a larger capture's warmup)
        # would otherwise be released inside the window by the empty_cache below and make the
        # graph's drop small or negative.
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free_before, _ = torch.cuda.mem_get_info(device)
        # Warm up and capture on one side stream (the device's, shared by every pool), so lazy
        # initialisation (cuBLAS handles and workspaces, autotuning) and the allocator's first
        # blocks happen outside the capture, and once per process rather than per bucket or pool.
        side = pool.stream if pool is not None and pool.stream is not None else side_stream(device)
        caller = torch.cuda.current_stream(device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        caller.wait_stream(side)
        torch.cuda.synchronize(device)

        # `torch.cuda.graph` empties the allocator's cache as it starts; do it first, or the
        # warmup's released blocks would show up as negative graph memory.
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved(device)
        annotations = NodeAnnotations(requested=annotate)
        through_graph = annotations.asked_through_graph
        guard = CaptureMode(record=False, allow_random=True)
        try:
            graph, out = _capture(fn, side, caller, pool, annotations, guard)
        except Exception as error:
            if not through_graph or guard.refused is not None:
                raise
            # torch's own annotation code ran inside the capture (the keyword): an optional
            # path may not cost the capture, so capture once more without it; a step that
            # cannot be captured fails this one too
            annotations = NodeAnnotations(requested=False)
            annotations.reason = f"graph-node annotations failed the capture ({said(error)})"
            guard = CaptureMode(record=False, allow_random=True)
            graph, out = _capture(fn, side, caller, pool, annotations, guard)
        node_ranges = annotations.finish(graph)
        if guard.refused is not None:
            raise guard.refused
        torch.cuda.synchronize(device)
        memory = torch.cuda.memory_reserved(device) - reserved_before
        free_after, _ = torch.cuda.mem_get_info(device)
    return CudaGraph(graph, device, memory, device_bytes_taken(free_before, free_after), node_ranges,
                     annotations.reason), out
