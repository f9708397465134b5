"""`capture`: warm a step up, capture one call of it, and hand back the graph and its static output."""

from __future__ import annotations

from typing import Callable, Literal, TypeVar

import torch

from graphrt.errors import GraphrtError
from graphrt.graphs.cuda import capture_cuda
from graphrt.graphs.pool import Graph, GraphPool, graph_kind, normalize_device
from graphrt.graphs.tape import capture_tape

T = TypeVar("T")


def capture(
    fn: Callable[[], T],
    *,
    device: torch.device | str,
    pool: GraphPool | None = None,
    warmup: int = 3,
    kind: Literal["auto", "cuda", "tape"] = "auto",
    annotate: bool = False,
) -> tuple[Graph, T]:
    """Warm `fn` up `warmup` times, capture one call, return `(graph, static_output)`.

    `fn` takes no arguments: it reads its inputs from tensors it closes over (the static
    buffers), and those are what a replay reads. `static_output` is what the captured call
    returned; every replay overwrites it in place.

    `annotate` asks a CUDA capture for the ranges open at each graph node's capture, where the
    machine offers graph-node annotations (`CudaGraph.node_ranges`; `node_ranges_missing` says
    why not otherwise). A tape always knows them per entry (`TapeGraph.op_ranges`).
    """
    device = normalize_device(device)
    resolved = graph_kind(device, kind)
    if warmup < 0:
        raise GraphrtError(f"warmup must be >= 0, got {warmup}")
    if pool is not None and (pool.kind != resolved or pool.device != device):
        raise GraphrtError(
            f"pool is for a {pool.kind} graph on {pool.device}, but this capture is a {resolved} graph on {device}"
        )
    if resolved == "cuda":
        return capture_cuda(fn, device, pool, warmup, annotate)
    return capture_tape(fn, device, warmup)

