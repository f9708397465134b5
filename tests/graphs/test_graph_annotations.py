"""Graph-node annotations at CUDA capture (graphrt.graphs.annotate): an optional path that must
never change the capture. Where the machine lacks them the reason names what would record them;
the attribution they make possible is tested in test_replay_attribution.py (CUDA) and
test_node_attribution.py (hand-built traces)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

import pytest
import torch

from graphrt.graphs import capture
from graphrt.graphs.annotate import (NEEDS, NO_NODE_IDS, NOT_REQUESTED, AnnotationApi, NodeAnnotations,
                                     find_api, profiler_node_ids, unavailable)
from graphrt.measure import nvtx
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model


def _has_bindings() -> bool:
    try:
        version("cuda-bindings")
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(_has_bindings(), reason="cuda.bindings is installed here")
def test_without_cuda_bindings_the_reason_names_what_would_record_them():
    assert unavailable() == f"{NEEDS} (this process has no cuda.bindings)"
    assert "cuda.bindings >= 13.1" in NEEDS and "CUDA 13.1+ driver" in NEEDS
    assert NodeAnnotations(requested=True).reason == unavailable()


def test_annotations_not_asked_for_say_so_and_leave_the_ranges_alone():
    annotations = NodeAnnotations(requested=False)
    assert annotations.reason == NOT_REQUESTED
    with nvtx.record_to([]) as events, annotations.capturing(), nvtx.nvtx_range("copy_in"):
        pass
    assert events == [("push", "copy_in"), ("pop", "copy_in")]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_capture_without_annotations_available_is_the_capture_it_always_was(monkeypatch):
    """Asked for where the machine cannot record them (as on a CUDA 13.0 driver; where it can,
    torch's own probe result is set to "cannot"), the capture replays the same logits as one
    never asked, keeps no node ranges, says why, and leaves torch's annotation state empty."""
    api = find_api()
    graph_annotations = api.module if api else None  # None: a torch before them, unavailable too
    if unavailable() is None:
        monkeypatch.setattr(graph_annotations, "_tools_id_available", False)
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.float32, seed=0)
    model.setup_cache(1, 16)
    tokens = torch.full((1, 1), 5, dtype=torch.long, device="cuda")
    positions = torch.full((1,), 3, dtype=torch.long, device="cuda")
    with torch.inference_mode(), nvtx.attach(model):
        plain, plain_out = capture(lambda: model.decode_step(tokens, positions), device="cuda")
        asked, asked_out = capture(lambda: model.decode_step(tokens, positions), device="cuda", annotate=True)
        plain.replay()
        asked.replay()
    torch.cuda.synchronize()
    assert torch.equal(plain_out, asked_out)
    assert plain.node_ranges == asked.node_ranges == {}
    assert plain.node_ranges_missing == NOT_REQUESTED
    assert asked.node_ranges_missing == unavailable() and asked.node_ranges_missing.startswith(NEEDS)
    if graph_annotations is not None:
        assert not graph_annotations.get_kernel_annotations()
        assert not getattr(graph_annotations, "_pending_scopes", None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_trace_keeps_the_node_ranges_and_analyze_says_what_it_attributed_from(cli, tmp_path):
    """`graphrt trace` on CUDA captures with annotations asked for: where the machine records them
    summary.json holds them and analyze looks every replayed kernel up; where it cannot, the graph
    mode's notes say why and analyze aligns the replay with the eager step."""
    out, figures = tmp_path / "traces", tmp_path / "figures.json"
    traced = cli("trace", "--profiler", "torch", "--model", "tiny", "--device", "cuda", "--steps", "4", "--out", out)
    assert traced.exit_code == 0, traced.output
    (made,) = out.iterdir()
    graph = json.loads((made / "summary.json").read_text())["modes"]["graph"]
    analysed = cli("analyze", made, "--json", figures)
    assert analysed.exit_code == 0, analysed.output
    (found,) = json.loads(figures.read_text())["replay_modules"]
    if reason := unavailable():
        assert graph["node_ranges"] == {} and any(note.startswith(reason) for note in graph["notes"])
        assert "aligned with the eager step" in found["method"]
    else:
        assert graph["node_ranges"]["replay[bs=1]"] and not any(NEEDS in note for note in graph["notes"])
        assert "graph-node annotations" in found["method"] and found["attributed_share"] == 1.0


# ---------------------------------------------------------------------------------------------
# Each torch's way of asking for them. Stand-ins for torch versions not installed here, each
# keeping torch's order: `torch.cuda.graph` stamps the capture's root at capture_begin, so a
# scope tags nodes only if annotations were on by then.


class _TorchStandIn:
    """An annotation module of one API shape, and a capture that behaves as that torch's
    `torch.cuda.graph` does. Nodes are captured as 1, 2, ... and become 7 << 32 | 101, 102, ...
    in the exec graph."""

    EXEC_GRAPH = 7

    def __init__(self, name: str, module_enable: bool, graph_keyword: bool) -> None:
        self.module = ModuleType(name)
        self.graph_keyword = graph_keyword
        m, self._issued, self._root_stamped, self._pending = self.module, 0, False, []
        m._annotations_enabled, m._kernel_annotations = False, {}
        m._is_tools_id_unavailable = lambda: False
        if module_enable:
            m.enable_annotations = lambda: setattr(m, "_annotations_enabled", True)
        m.disable_annotations = lambda: setattr(m, "_annotations_enabled", False)
        m.mark_kernels = self._mark_kernels
        m.resolve_pending_annotations = self._resolve
        m.remap_to_exec_graph = self._remap
        m.get_kernel_annotations = lambda: dict(m._kernel_annotations)
        m.clear_kernel_annotations = m._kernel_annotations.clear

    @contextlib.contextmanager
    def _mark_kernels(self, tag):
        first = self._issued
        yield
        if self.module._annotations_enabled and self._root_stamped:
            self._pending += [(node, tag) for node in range(first + 1, self._issued + 1)]

    def _resolve(self):
        for node, tag in self._pending:
            self.module._kernel_annotations.setdefault(node, []).append(tag)
        self._pending.clear()

    def _remap(self, graph):
        """Capture-graph node ids to the exec graph's toolsIds; an id of neither is an error."""
        m = self.module
        exec_ids = {node: (self.EXEC_GRAPH << 32) | (100 + node) for node in range(1, self._issued + 1)}
        remapped = {exec_ids[node]: tags for node, tags in m._kernel_annotations.items()}
        m._kernel_annotations.clear()
        m._kernel_annotations.update(remapped)

    def issue(self) -> None:
        """The captured step issues one kernel node."""
        self._issued += 1

    @contextlib.contextmanager
    def graph(self, enable_annotations: bool = False):
        """torch.cuda.graph(...): the keyword turns annotations on before capture_begin, and
        resolves and remaps when the capture ends."""
        if enable_annotations:
            assert self.graph_keyword, "this torch's torch.cuda.graph takes no enable_annotations="
            self.module._annotations_enabled = True
        self._root_stamped = self.module._annotations_enabled  # capture_begin
        yield
        if enable_annotations:
            self._resolve()
            self._remap(None)

    def capture(self, annotations: NodeAnnotations) -> dict:
        """A capture as graphrt.graphs.cuda makes it: embed outside every module, then a linear
        inside one; returns `finish`'s node ranges."""
        with self.graph(**annotations.graph_options()):
            with annotations.capturing():
                self.issue()
                with nvtx.nvtx_range("model.layers.0.mlp (Qwen2MLP)"):
                    self.issue()
        return annotations.finish(None)

    @property
    def api(self) -> AnnotationApi:
        return AnnotationApi(self.module, self.graph_keyword)


EXPECTED = {(7 << 32) | 101: (), (7 << 32) | 102: ("model.layers.0.mlp (Qwen2MLP)",)}
SHAPES = {
    # the private module with its module-level switch, before torch.cuda.graph took the keyword
    "module switch only": dict(name="torch.cuda._graph_annotations", module_enable=True, graph_keyword=False),
    # both (torch 2.13): the keyword, so torch stamps the root and remaps itself
    "module switch and keyword": dict(name="torch.cuda._graph_annotations", module_enable=True, graph_keyword=True),
    # the newest: a public module without the switch; only the keyword asks
    "public module, keyword only": dict(name="torch.cuda.graph_annotations", module_enable=False, graph_keyword=True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_api_shape_records_each_nodes_ranges(shape):
    torch_like = _TorchStandIn(**SHAPES[shape])
    annotations = NodeAnnotations(requested=True, api=torch_like.api)
    assert annotations.reason is None
    assert torch_like.capture(annotations) == EXPECTED and annotations.reason is None
    assert torch_like.module.get_kernel_annotations() == {}  # torch's global map is left empty
    assert torch_like.module._annotations_enabled is False  # and switched off again


def test_annotations_switched_on_after_the_capture_began_would_tag_nothing():
    # what asking inside the capture did: the root was stamped before, so no scope tags a node
    torch_like = _TorchStandIn(**SHAPES["module switch only"])
    annotations = NodeAnnotations(requested=True, api=torch_like.api)
    with torch_like.graph():
        torch_like.module.enable_annotations()
        with annotations.capturing():
            torch_like.issue()
    assert annotations.finish(None) == {}
    assert annotations.reason == "graph-node annotations: the capture tagged no graph node"


def test_a_torch_with_no_way_to_ask_says_so():
    torch_like = _TorchStandIn("torch.cuda.graph_annotations", module_enable=False, graph_keyword=False)
    reason = unavailable(torch_like.api)
    assert reason.startswith(NEEDS) and "has no enable_annotations() and torch.cuda.graph takes no " \
                                         "enable_annotations=" in reason
    annotations = NodeAnnotations(requested=True, api=torch_like.api)
    assert annotations.reason == reason and annotations.graph_options() == {}


@pytest.mark.parametrize("broken", ["enable_annotations", "mark_kernels", "resolve_pending_annotations",
                                    "get_kernel_annotations"])
def test_an_annotation_call_that_fails_never_fails_the_capture(broken):
    torch_like = _TorchStandIn(**SHAPES["module switch only"])

    def fails(*args, **kwargs):
        raise RuntimeError(f"{broken} broke")

    setattr(torch_like.module, broken, fails)
    annotations = NodeAnnotations(requested=True, api=torch_like.api)
    assert torch_like.capture(annotations) == {}
    assert annotations.reason == f"graph-node annotations failed (RuntimeError: {broken} broke)"


def test_the_public_module_is_preferred_to_the_private_one(monkeypatch):
    public, private = ModuleType("torch.cuda.graph_annotations"), ModuleType("torch.cuda._graph_annotations")
    monkeypatch.setitem(sys.modules, "torch.cuda.graph_annotations", public)
    monkeypatch.setitem(sys.modules, "torch.cuda._graph_annotations", private)
    assert find_api().module is public
    monkeypatch.setitem(sys.modules, "torch.cuda.graph_annotations", None)  # an import of it fails
    assert find_api().module is private
    monkeypatch.setitem(sys.modules, "torch.cuda._graph_annotations", None)
    assert find_api() is None
    assert unavailable() == f"{NEEDS}, and torch.cuda.graph_annotations (torch {torch.__version__} has none)"


NEWER = "2.12.0+cu130"  # a torch whose profiler may write graph node ids: its libraries tell


@pytest.mark.parametrize("held, said", [
    ([], NO_NODE_IDS),
    ([b'"graph node id": {}'], "`graph node id` (the node's toolsId) on replayed kernels"),
    ([b'"graph node id": {}', b'"graph id": {}'], "`graph node id` (lower 32 bits) and `graph id` on replayed kernels"),
])
def test_which_node_records_a_torchs_profiler_writes_is_read_from_its_libraries(tmp_path, monkeypatch, held, said):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    libraries = tmp_path / "lib"
    libraries.mkdir()
    (libraries / "libtorch_cuda.so").write_bytes(b"\0".join([b"ELF", *held, b"end"]))
    (libraries / "libempty.so").write_bytes(b"")  # nothing to map: skipped
    assert profiler_node_ids(libraries, NEWER) == said


def test_a_torchs_libraries_are_read_once_and_again_only_when_one_changes(tmp_path, monkeypatch):
    # a CUDA build's libraries are gigabytes: a later process (the in-process cache cleared)
    # takes the answer kept on disk while the libraries' names, sizes and times are unchanged
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    libraries = tmp_path / "lib"
    libraries.mkdir()
    library = libraries / "libtorch_cpu.so"
    library.write_bytes(b'ELF "graph node id": {} end')
    assert profiler_node_ids(libraries, NEWER) == "`graph node id` (the node's toolsId) on replayed kernels"
    stat = library.stat()
    library.write_bytes(b"ELF " + b"x" * (stat.st_size - 4))  # the field gone, the size the same
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    profiler_node_ids.cache_clear()
    assert profiler_node_ids(libraries, NEWER) == "`graph node id` (the node's toolsId) on replayed kernels"  # not read
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a reinstalled torch
    profiler_node_ids.cache_clear()
    assert profiler_node_ids(libraries, NEWER) == NO_NODE_IDS
    # where nothing can be kept, the libraries are read every time, and still answer
    monkeypatch.setenv("XDG_CACHE_HOME", str(library))  # a file: no directory can be made under it
    profiler_node_ids.cache_clear()
    assert profiler_node_ids(libraries, NEWER) == NO_NODE_IDS


@pytest.mark.parametrize("older", ["2.11.0+cu130", "2.4.1", "1.13.0"])
def test_a_torch_older_than_the_first_to_write_node_ids_is_answered_without_reading_its_libraries(
        tmp_path, monkeypatch, older):
    # `graphrt info` is the device check's first step: a CUDA build's libraries are gigabytes,
    # and a torch whose kineto predates the field needs none of them read
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    libraries = tmp_path / "lib"
    libraries.mkdir()
    (libraries / "libtorch_cpu.so").write_bytes(b'ELF "graph node id": {} end')
    assert profiler_node_ids(libraries, older) == NO_NODE_IDS
    assert not (tmp_path / "cache").exists()  # nothing read, nothing kept
    assert profiler_node_ids(libraries, "2.12.0.dev20260101") == "`graph node id` (the node's toolsId) on replayed kernels"
