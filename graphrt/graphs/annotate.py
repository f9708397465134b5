"""Graph-node annotations: the graphrt ranges open when each node of a CUDA graph was captured.

Under replay no range fires, but PyTorch can tag the nodes of a graph while capturing it
(`torch.cuda._graph_annotations`): every kernel or memcpy node captured inside a
`mark_kernels(tag)` scope is tagged, keyed by the node's toolsId (the exec graph's id << 32 | the
node's id). torch.profiler writes the same number on a replayed kernel as `args["graph node id"]`,
so a replay trace can be attributed by looking each kernel up (graphrt.trace.modules).

    annotations = NodeAnnotations(requested=True)
    with torch.cuda.graph(graph):
        with annotations.capturing():      # each graphrt range opened here becomes a scope
            out = fn()
    ranges = annotations.finish(graph)     # {toolsId: ("(Qwen2ForCausalLM)", ..., "... (Linear)")}
    annotations.reason                     # why `ranges` is empty, or None

Each range opened during the capture is one scope, tagged with the whole stack open, outermost
first; the capture as a whole is one more, tagged with the empty stack, so a node issued outside
every module is known as such rather than missing. A node inside nested scopes is tagged once per
scope; torch merges its tags key by key, first kept, in the order the scopes closed (innermost
first), so each node keeps the stack of the innermost range around it.

Needs `cuda.bindings` >= 13.1 and a driver with cudaGraphNodeGetToolsId (CUDA 13.1+); without
them `mark_kernels` silently does nothing, so availability is probed first and `reason` says what
is missing. Nothing here may fail a capture: any error turns this capture's annotations off, with
the error as the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Any

import torch

from graphrt import nvtx
from graphrt.errors import first_line

NEEDS = "graph-node annotations need cuda.bindings >= 13.1 and a CUDA 13.1+ driver"
NOT_REQUESTED = "graph-node annotations were not requested"
TAG = "graphrt.ranges"  # the key of graphrt's tag among a node's annotations

NodeRanges = dict[int, tuple[str, ...]]  # toolsId -> the ranges open at the node's capture


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line(error)}"


def _found() -> str:
    """What this process has of the two: the bindings' version and the driver's CUDA version."""
    try:
        bindings = version("cuda-bindings")
    except PackageNotFoundError:
        return "no cuda.bindings"
    try:
        from cuda.bindings import runtime

        _, driver = runtime.cudaDriverGetVersion()  # e.g. 13000 for 13.0
        return f"cuda.bindings {bindings} and a CUDA {driver // 1000}.{driver % 1000 // 10} driver"
    except Exception:
        return f"cuda.bindings {bindings}"


def unavailable() -> str | None:
    """Why graph-node annotations cannot be recorded in this process; None when they can."""
    try:
        from torch.cuda import _graph_annotations
    except ImportError:
        return f"{NEEDS}, and torch.cuda._graph_annotations (torch {torch.__version__} has none)"
    try:
        missing = _graph_annotations._is_tools_id_unavailable()  # probes cudaGraphNodeGetToolsId once
    except Exception as error:  # a broken cuda.bindings, a probe that fails
        return f"{NEEDS}; probing for cudaGraphNodeGetToolsId failed ({_said(error)})"
    return f"{NEEDS} (this process has {_found()})" if missing else None


def _stack_of(tags: list[Any]) -> tuple[str, ...] | None:
    """graphrt's stack among one node's annotations (others may have tagged it too)."""
    for tag in tags:
        if isinstance(tag, dict) and TAG in tag:
            return tuple(tag[TAG])
    return None


class NodeAnnotations:
    """One capture's graph-node annotations, recorded where the machine offers them."""

    def __init__(self, requested: bool) -> None:
        self.reason: str | None = unavailable() if requested else NOT_REQUESTED
        self._api: ModuleType | None = None
        self._was_enabled = False
        if self.reason is None:
            from torch.cuda import _graph_annotations

            self._api = _graph_annotations
            self._was_enabled = bool(getattr(_graph_annotations, "_annotations_enabled", False))

    def _give_up(self, error: BaseException) -> None:
        if self.reason is None:
            self.reason = f"graph-node annotations failed ({_said(error)})"

    @contextlib.contextmanager
    def _scope(self, stack: tuple[str, ...]) -> Iterator[None]:
        """One `mark_kernels` scope tagged with `stack`; after a failure, none."""
        scope = None
        if self.reason is None:
            try:
                scope = self._api.mark_kernels({TAG: stack})  # type: ignore[union-attr]
                scope.__enter__()
            except Exception as error:
                self._give_up(error)
                scope = None
        yield
        if scope is not None and self.reason is None:
            try:
                scope.__exit__(None, None, None)
            except Exception as error:
                self._give_up(error)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Around the captured call, inside `torch.cuda.graph(...)`: every graphrt range opened
        in the block is mirrored into a scope. Does nothing when annotations are unavailable."""
        if self._api is None:
            yield
            return
        self._api.enable_annotations()
        try:
            with self._scope(()), nvtx.mirror_ranges(self._scope):
                yield
        except BaseException:
            self.discard()
            raise

    def finish(self, graph: torch.cuda.CUDAGraph) -> NodeRanges:
        """After the capture ended: per toolsId of `graph`'s exec graph, the ranges open when the
        node was captured, outermost first. Empty, with `reason` set, when none were recorded."""
        if self._api is None:
            return {}
        ranges: NodeRanges = {}
        try:
            if self.reason is None:
                self._api.resolve_pending_annotations()
                self._api.remap_to_exec_graph(graph)  # capture-graph ids -> the exec graph's
                for tools_id, tags in self._api.get_kernel_annotations().items():
                    if (stack := _stack_of(tags)) is not None:
                        ranges[int(tools_id)] = stack
        except Exception as error:
            self._give_up(error)
        finally:
            self.discard()
        if self.reason is not None:
            return {}
        if not ranges:
            self.reason = "graph-node annotations: the capture tagged no graph node"
        return ranges

    def discard(self) -> None:
        """Empty torch's annotation map and pending scopes (they are global; `finish` has copied
        graphrt's tags out by then) and switch annotations off again unless they were on before.
        What a failed capture calls; `finish` calls it too."""
        api, self._api = self._api, None
        if api is None:
            return
        with contextlib.suppress(Exception):
            api.clear_kernel_annotations()
            if not self._was_enabled:
                api.disable_annotations()
