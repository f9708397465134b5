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

What no capture refuses but every replay gets wrong (a Python value read at capture, a tensor
built from Python data, control flow on Python state) is what `lint_step(fn, states)` finds:
it captures `fn` from several input states and compares the captures op by op (lint.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, TypeVar, runtime_checkable

import torch

from graphrt.errors import GraphrtError
from graphrt.graphs.cuda import CudaGraph, capture_cuda
from graphrt.graphs.guard import GraphCaptureError
from graphrt.graphs.lint import Finding, LintReport, lint_step
from graphrt.graphs.tape import TapeGraph, capture_tape

__all__ = [
    "GraphCaptureError",
    "Graph",
    "GraphPool",
    "CudaGraph",
    "TapeGraph",
    "graph_kind",
    "new_pool",
    "capture",
    "lint_step",
    "LintReport",
    "Finding",
]

T = TypeVar("T")
Kind = Literal["cuda", "tape"]


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
    """Memory (and, on CUDA, a stream) shared by the graphs captured into it.

    On CUDA, `handle` is a `torch.cuda.graph_pool_handle()`: captures into one pool reuse each
    other's memory (safe as long as they are replayed one at a time), and `stream` is the one
    side stream every capture into the pool warms up and captures on. One stream matters: cuBLAS
    keeps a workspace per (handle, stream), so a fresh stream per capture would strand one
    workspace (32 MiB on Hopper) per bucket and charge it to the graph. A tape keeps its own
    tensors, so for `kind == "tape"` the pool is only a token and `handle`, `stream` are None.
    """

    device: torch.device
    kind: Kind
    handle: Any = None
    stream: Any = None  # torch.cuda.Stream


def _normalize_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():  # pragma: no mutate block (CUDA only)
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
        if device.type != "cuda" or not torch.cuda.is_available():  # pragma: no mutate (true on every CPU)
            raise GraphrtError(f"graph kind 'cuda' needs a CUDA device, got device {str(device)!r}")
        return "cuda"  # pragma: no mutate (CUDA only)
    raise GraphrtError(f"graph kind {kind!r} is not one of 'auto', 'cuda', 'tape'")


def new_pool(device: torch.device | str, kind: Literal["auto", "cuda", "tape"] = "auto") -> GraphPool:
    """A memory pool for `capture(..., pool=...)` on `device`."""
    device = _normalize_device(device)
    resolved = graph_kind(device, kind)
    if resolved != "cuda":  # pragma: no mutate (CUDA only)
        return GraphPool(device=device, kind=resolved)
    handle, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(device)  # pragma: no mutate (CUDA only)
    return GraphPool(device=device, kind=resolved, handle=handle, stream=stream)  # pragma: no mutate (CUDA only)


def capture(
    fn: Callable[[], T],
    *,
    device: torch.device | str,
    pool: GraphPool | None = None,
    warmup: int = 3,
    kind: Literal["auto", "cuda", "tape"] = "auto",
    annotate: bool = False,  # pragma: no mutate (CUDA only: a tape knows every op's ranges regardless)
) -> tuple[Graph, T]:
    """Warm `fn` up `warmup` times, capture one call, return `(graph, static_output)`.

    `fn` takes no arguments: it reads its inputs from tensors it closes over (the static
    buffers), and those are what a replay reads. `static_output` is what the captured call
    returned; every replay overwrites it in place.

    `annotate` asks a CUDA capture for the ranges open at each graph node's capture, where the
    machine offers graph-node annotations (`CudaGraph.node_ranges`; `node_ranges_missing` says
    why not otherwise). A tape always knows them per entry (`TapeGraph.op_ranges`).
    """
    device = _normalize_device(device)
    resolved = graph_kind(device, kind)
    if warmup < 0:
        raise GraphrtError(f"warmup must be >= 0, got {warmup}")
    if pool is not None and (pool.kind != resolved or pool.device != device):
        raise GraphrtError(
            f"pool is for a {pool.kind} graph on {pool.device}, but this capture is a {resolved} graph on {device}"
        )
    if resolved == "cuda":  # pragma: no mutate block (CUDA only)
        return capture_cuda(fn, device, pool, warmup, annotate)
    return capture_tape(fn, device, warmup)

