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

from graphrt.graphs.capture import capture
from graphrt.graphs.cuda import CudaGraph, set_up_capture
from graphrt.graphs.guard import GraphCaptureError
from graphrt.graphs.lint import Finding, LintReport, lint_step
from graphrt.graphs.pool import Graph, GraphPool, graph_kind, new_pool
from graphrt.graphs.tape import TapeGraph

__all__ = [
    "GraphCaptureError",
    "Graph",
    "GraphPool",
    "CudaGraph",
    "TapeGraph",
    "graph_kind",
    "new_pool",
    "set_up_capture",
    "capture",
    "lint_step",
    "LintReport",
    "Finding",
]
