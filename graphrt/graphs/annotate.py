"""Graph-node annotations: the graphrt ranges open when each node of a CUDA graph was captured.

Under replay no range fires, but PyTorch can tag the nodes of a graph while capturing it
(`torch.cuda.graph_annotations`, private `torch.cuda._graph_annotations` before): every kernel or
memcpy node captured inside a
`mark_kernels(tag)` scope is tagged, keyed by the node's toolsId (the exec graph's id << 32 | the
node's id). torch.profiler writes the same number on a replayed kernel as `args["graph node id"]`,
so a replay trace can be attributed by looking each kernel up (graphrt.trace.analysis.modules).

    annotations = NodeAnnotations(requested=True)
    with torch.cuda.graph(graph, **annotations.graph_options()):   # asks before capture_begin
        with annotations.capturing():      # each graphrt range opened here becomes a scope
            out = fn()
    ranges = annotations.finish(graph)     # {toolsId: ("(Qwen2ForCausalLM)", ..., "... (Linear)")}
    annotations.reason                     # why `ranges` is empty, or None

How they are asked for depends on the torch (feature-detected, never by version number): where
`torch.cuda.graph` takes `enable_annotations=`, that keyword, and torch itself resolves the scopes
and remaps them to the exec graph when the capture ends; on a torch whose module has only the
module-level `enable_annotations()`, that call before the capture begins, and `finish` resolves and
remaps. Either way before `capture_begin`, which stamps the capture's root: enabled later, nothing
is recorded.

Each range opened during the capture is one scope, tagged with the whole stack open, outermost
first; the capture as a whole is one more, tagged with the empty stack, so a node issued outside
every module is known as such rather than missing. A node inside nested scopes is tagged once per
scope; torch merges its tags key by key, first kept, in the order the scopes closed (innermost
first), so each node keeps the stack of the innermost range around it.

Needs `cuda.bindings` >= 13.1 and a driver with cudaGraphNodeGetToolsId (CUDA 13.1+); without
them `mark_kernels` silently does nothing, so availability is probed first and `reason` says what
is missing. Nothing here may fail a capture: any error turns this capture's annotations off, with
the error as the reason (graphrt.graphs.cuda captures again without them if torch's own handling,
under the keyword, fails the capture).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import json
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from graphrt.errors import GraphrtError, first_line
from graphrt.io import write_json
from graphrt.measure import nvtx

NEEDS = "graph-node annotations need cuda.bindings >= 13.1 and a CUDA 13.1+ driver"
NOT_REQUESTED = "graph-node annotations were not requested"
TAG = "graphrt.ranges"  # the key of graphrt's tag among a node's annotations

NodeRanges = dict[int, tuple[str, ...]]  # toolsId -> the ranges open at the node's capture


def said(error: BaseException) -> str:
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


MODULES = ("torch.cuda.graph_annotations", "torch.cuda._graph_annotations")  # newest first


@dataclass(frozen=True)
class AnnotationApi:
    """What this torch offers for graph-node annotations."""

    module: ModuleType  # mark_kernels, get_kernel_annotations, clear_kernel_annotations, ...
    graph_keyword: bool  # torch.cuda.graph(..., enable_annotations=True) exists


def _graph_takes_keyword() -> bool:
    try:
        return "enable_annotations" in inspect.signature(torch.cuda.graph).parameters
    except (TypeError, ValueError):
        return False


def find_api() -> AnnotationApi | None:
    """torch's annotation module (the public one where it exists) and whether `torch.cuda.graph`
    takes the keyword; None where torch has no such module."""
    for name in MODULES:
        try:
            return AnnotationApi(importlib.import_module(name), _graph_takes_keyword())
        except ImportError:
            continue
    return None


NO_NODE_IDS = ("this torch's profiler writes no `graph node id` on replayed kernels (kineto added it after "
               "torch 2.11): node ranges cannot be looked up in its traces")


TORCH_LIBRARIES = Path(torch.__file__).parent / "lib"


def _node_id_cache(libraries: Path) -> Path:
    """Where the answer for one torch's `libraries` is kept: the user's cache directory."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "graphrt" / f"profiler-node-ids-{hashlib.sha1(str(libraries).encode()).hexdigest()[:12]}.json"


def _scan_for_node_ids(files: list[Path]) -> str:
    """Read every library for the Chrome-trace field names kineto writes on a replayed kernel."""
    names = {b"graph node id": False, b"graph id": False}
    for library in files:
        try:
            with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for name in names:
                    names[name] = names[name] or data.find(b'"' + name + b'"') >= 0
        except (OSError, ValueError):  # unreadable, or empty
            continue
        if all(names.values()):
            break
    if not names[b"graph node id"]:
        return NO_NODE_IDS
    if names[b"graph id"]:
        return "`graph node id` (lower 32 bits) and `graph id` on replayed kernels"
    return "`graph node id` (the node's toolsId) on replayed kernels"


# kineto first wrote `graph node id` after torch 2.11 (docs/design.md, "torch.profiler and CUPTI")
NODE_IDS_FROM = (2, 12)


def _release(torch_version: str) -> tuple[int, int]:
    """(major, minor) of a torch version such as "2.11.0+cu130" or "2.12.0.dev20260101"."""
    major, minor = torch_version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


@functools.cache
def profiler_node_ids(libraries: Path = TORCH_LIBRARIES, torch_version: str = torch.__version__) -> str:
    """Which graph-node records this torch's profiler writes on a replayed kernel, read from the
    Chrome-trace field names its shared `libraries` hold (kineto is built into them): the node's
    whole toolsId as `graph node id`, or its lower 32 bits with a separate `graph id` (newer
    kineto), or none.

    A torch older than NODE_IDS_FROM writes none, and is answered from its version without a
    read. Otherwise the libraries are read once per installed torch, not in every process (a
    CUDA build's are gigabytes): the answer is kept in the user's cache directory under the
    libraries' names, sizes and modification times, and read again only when one of them
    changes."""
    if _release(torch_version) < NODE_IDS_FROM:
        return NO_NODE_IDS
    files = sorted(libraries.glob("*.so*"))
    key = [str(libraries), *([f.name, st.st_size, st.st_mtime_ns] for f in files for st in [f.stat()])]
    kept = _node_id_cache(libraries)
    try:
        cached = json.loads(kept.read_text())
        if cached["key"] == key:
            return cached["answer"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: read the libraries
        pass
    answer = _scan_for_node_ids(files)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_json(kept, {"key": key, "answer": answer})
    except (OSError, GraphrtError):  # a read-only home: read the libraries again next time
        pass
    return answer


def unavailable(api: AnnotationApi | None = None) -> str | None:
    """Why graph-node annotations cannot be recorded in this process (with `api`, by default the
    one this torch offers); None when they can."""
    api = api or find_api()
    if api is None:
        return f"{NEEDS}, and torch.cuda.graph_annotations (torch {torch.__version__} has none)"
    if not api.graph_keyword and not hasattr(api.module, "enable_annotations"):
        return (f"{NEEDS}, and a way to ask for them: torch {torch.__version__}'s {api.module.__name__} "
                "has no enable_annotations() and torch.cuda.graph takes no enable_annotations=")
    probe = getattr(api.module, "_is_tools_id_unavailable", None)  # probes cudaGraphNodeGetToolsId once
    if probe is None:
        return None  # a module without the probe: `finish` says so if nothing was tagged
    try:
        missing = probe()
    except Exception as error:  # a broken cuda.bindings, a probe that fails
        return f"{NEEDS}; probing for cudaGraphNodeGetToolsId failed ({said(error)})"
    return f"{NEEDS} (this process has {_found()})" if missing else None


def _stack_of(tags: list[Any]) -> tuple[str, ...] | None:
    """graphrt's stack among one node's annotations (others may have tagged it too)."""
    for tag in tags:
        if isinstance(tag, dict) and TAG in tag:
            return tuple(tag[TAG])
    return None


class NodeAnnotations:
    """One capture's graph-node annotations, recorded where the machine offers them."""

    def __init__(self, requested: bool, api: AnnotationApi | None = None) -> None:
        """`api`: what torch offers (by default found in this process; tests pass stand-ins)."""
        api = (api or find_api()) if requested else None
        self.reason: str | None = unavailable(api) if requested else NOT_REQUESTED
        self._api: ModuleType | None = None
        self._keyword = False  # asked for through torch.cuda.graph's keyword
        self._was_enabled = False
        if self.reason is None and api is not None:
            self._api, self._keyword = api.module, api.graph_keyword
            self._was_enabled = bool(getattr(api.module, "_annotations_enabled", False))

    def graph_options(self) -> dict[str, Any]:
        """Keyword arguments for `torch.cuda.graph`, called just before it: annotations are asked
        for here, before the capture begins. `{}` when they are unavailable, not requested, or
        enabled here through the module (an older torch)."""
        if self._api is None:
            return {}
        if self._keyword:
            return {"enable_annotations": True}
        try:
            self._api.enable_annotations()
        except Exception as error:
            self._give_up(error)
            self.discard()
        return {}

    @property
    def asked_through_graph(self) -> bool:
        """Did `graph_options` hand torch the keyword (so torch's own code ran in the capture)?"""
        return self._api is not None and self._keyword

    def _give_up(self, error: BaseException) -> None:
        if self.reason is None:
            self.reason = f"graph-node annotations failed ({said(error)})"

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
                if not self._keyword:  # under the keyword torch has done both as the capture ended
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
            if not self._was_enabled and hasattr(api, "disable_annotations"):
                api.disable_annotations()
