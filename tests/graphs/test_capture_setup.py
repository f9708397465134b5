"""What every CUDA capture shares in a process: one side stream per device, a one-off set-up
paid apart from every bucket, and the error mode a capture runs under beside a process group."""

from __future__ import annotations

import pytest
import ranks
import torch

from graphrt.backends.graph import GraphBackend
from graphrt.graphs import capture, new_pool
from graphrt.graphs import cuda as cuda_graphs
from graphrt.graphs.cuda import capture_error_mode
from graphrt.model.config import PRESETS
from graphrt.model.weights import build_model
from graphrt.parallel.launch import launch

MIB = 1 << 20
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_without_a_process_group_a_capture_fails_on_an_unsafe_call_from_any_thread():
    assert capture_error_mode() == "global"


@pytest.mark.processes
def test_with_a_process_group_live_a_capture_refuses_unsafe_calls_on_its_own_thread_only():
    # NCCL's watchdog thread queries earlier collectives' events during a capture: under the
    # global mode that query, not the step, would fail the capture
    assert launch(ranks.capture_error_mode_in_a_group, [], 1)[0] == "thread_local"


@pytest.mark.cuda
@needs_cuda
def test_every_pool_of_a_device_captures_on_the_devices_one_side_stream():
    assert new_pool("cuda").stream is new_pool("cuda").stream


@pytest.mark.cuda
@needs_cuda
def test_sizes_captured_alone_in_fresh_pools_take_no_cublas_workspace_each():
    # cuBLAS keeps a workspace per stream (32 MiB on Hopper): a stream per pool would take one
    # per size of a grid, and charge it to that size's graph
    weight = torch.randn(256, 256, device="cuda")
    taken = []
    for batch in (8, 4, 2, 1):
        x = torch.randn(batch, 256, device="cuda")
        graph, _ = capture(lambda: x @ weight, device="cuda", pool=new_pool("cuda"))
        taken.append(graph.device_bytes)
    assert all(t is not None and t < 16 * MIB for t in taken[1:]), taken


@pytest.mark.cuda
@needs_cuda
def test_the_process_capture_set_up_is_paid_once_by_the_first_graph_backend_and_in_no_bucket(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_SET_UP", set())  # as in a fresh process
    model = build_model(PRESETS["tiny"], torch.device("cuda"), torch.float32)
    model.setup_cache(4, 32)
    first = GraphBackend(model, (1, 2, 4), lint=False).prepare(4)
    second = GraphBackend(model, (1, 2, 4), lint=False).prepare(4)
    assert first.capture_setup_seconds is not None and first.capture_setup_seconds > 0
    assert second.capture_setup_seconds is None
    # paid inside the first backend's prepare, outside its buckets' captures
    assert first.seconds >= first.capture_setup_seconds + sum(first.capture_seconds.values())
