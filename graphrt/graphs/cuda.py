"""CudaGraph: `torch.cuda.CUDAGraph` capture, warmed up on a side stream, into a shared pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

import torch

from graphrt.graphs.guard import GraphCaptureError, HostReadGuard
from graphrt.graphs.tape import CaptureMode

if TYPE_CHECKING:
    from graphrt.graphs import GraphPool

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class CudaGraph:
    """A `torch.cuda.CUDAGraph` and what it cost to capture."""

    graph: torch.cuda.CUDAGraph
    device: torch.device
    # Growth of the CUDA allocator's reserved memory during capture. With a shared pool, later
    # (smaller) captures mostly reuse what the first one reserved and report ~0.
    memory_bytes: int

    def replay(self) -> None:
        self.graph.replay()


def capture_cuda(
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
        guard = CaptureMode(record=False, allow_random=True)
        try:
            with torch.cuda.graph(graph, pool=None if pool is None else pool.handle):
                with HostReadGuard(), guard:
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

