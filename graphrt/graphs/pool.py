"""What every captured graph is (`Graph`), the memory pool captures share, and which kind of
graph a device gets."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from graphrt.errors import GraphrtError

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
    other's memory (safe as long as they are replayed one at a time), and `stream` is the side
    stream every capture warms up and captures on: the device's one (`side_stream`), shared by
    every pool. One stream matters: cuBLAS keeps a workspace per (handle, stream), so a fresh
    stream per capture, or per pool, would strand one workspace (32 MiB on Hopper) per bucket, or
    per pool of a grid that captures each size alone, and charge it to the graph. A tape keeps its
    own tensors, so for `kind == "tape"` the pool is only a token and `handle`, `stream` are None.
    """

    device: torch.device
    kind: Kind
    handle: Any = None
    stream: Any = None  # torch.cuda.Stream


@functools.cache
def side_stream(device: torch.device) -> Any:
    """The one side stream of CUDA `device` (a `torch.cuda.Stream`) that every capture in this
    process warms up and captures on, whatever its pool."""
    return torch.cuda.Stream(device)


def device_bytes_taken(free_before: int, free_after: int) -> int | None:
    """What a capture took from the device: the drop in its free memory over the capture, or
    None where free memory rose instead. A rise means something outside the capture released
    memory inside its window (another process, or blocks cached before it): the drop then says
    nothing of the graph, and a negative figure is never reported as its memory."""
    taken = free_before - free_after
    return taken if taken >= 0 else None


def normalize_device(device: torch.device | str) -> torch.device:
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
    device = normalize_device(device)
    resolved = graph_kind(device, kind)
    if resolved != "cuda":
        return GraphPool(device=device, kind=resolved)
    handle, stream = torch.cuda.graph_pool_handle(), side_stream(device)
    return GraphPool(device=device, kind=resolved, handle=handle, stream=stream)
