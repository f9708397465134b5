"""Graph-node annotations at CUDA capture (graphrt.graphs.annotate): an optional path that must
never change the capture. Where the machine lacks them the reason names what would record them;
the attribution they make possible is tested in test_replay_attribution.py (CUDA) and
test_node_attribution.py (hand-built traces)."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

from graphrt import nvtx
from graphrt.config import PRESETS
from graphrt.graphs import capture
from graphrt.graphs.annotate import NEEDS, NOT_REQUESTED, NodeAnnotations, unavailable
from graphrt.weights import build_model


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
    try:
        from torch.cuda import _graph_annotations as graph_annotations
    except ImportError:  # a torch before them: unavailable too
        graph_annotations = None
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
        assert not graph_annotations.get_kernel_annotations() and not graph_annotations._pending_scopes


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
