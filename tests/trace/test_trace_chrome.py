"""Reading torch.profiler Chrome traces: a real CPU trace made here, and the CUDA events a GPU
trace holds (written out in torch's layout, since this machine has no GPU)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.analysis.steps import analyze

STEPS = 4
OPS_PER_STEP = ("aten::mm", "aten::relu", "aten::sum")  # each calls further aten ops inside


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A torch.profiler CPU trace of STEPS decode steps, each running OPS_PER_STEP."""
    path = tmp_path_factory.mktemp("chrome") / "cpu.json"
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            with record_function("decode_step[eager]"):
                torch.sum(torch.relu(torch.mm(x, w)))
    prof.export_chrome_trace(str(path))
    return path


def test_record_function_ranges_and_aten_ops_are_read(cpu_trace):
    trace = load_trace(cpu_trace)
    assert trace.kind == "chrome"
    assert [r.name for r in trace.ranges] == ["decode_step[eager]"] * STEPS
    assert trace.kernels == [] and trace.api_calls == []
    names = {op.name for op in trace.cpu_ops}
    assert set(OPS_PER_STEP) <= names
    assert len(trace.cpu_ops) > STEPS * len(OPS_PER_STEP)  # the nested calls are there too


def test_each_step_counts_the_top_level_ops_it_ran(cpu_trace):
    report = analyze(load_trace(cpu_trace))
    (group,) = report.step_groups
    assert group.name == "decode_step[eager]"
    assert [s.cpu_ops for s in group.steps] == [len(OPS_PER_STEP)] * STEPS
    assert all(0 < s.cpu_op_ns <= s.wall_ns for s in group.steps)
    assert report.notes == ["no CUDA kernels in this trace: CPU ops and record_function ranges only"]


def test_a_gzipped_trace_reads_the_same(cpu_trace, tmp_path):
    zipped = tmp_path / "cpu.json.gz"
    zipped.write_bytes(gzip.compress(cpu_trace.read_bytes()))
    plain, packed = load_trace(cpu_trace), load_trace(zipped)
    assert (packed.ranges, packed.cpu_ops) == (plain.ranges, plain.cpu_ops)


def _event(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# What a CUDA trace from torch.profiler holds for one step with two launches: host-side
# runtime calls and the kernels they launched (GPU pid/tid = device/stream), tied by
# args.correlation; the step's annotation is drawn twice, on the CPU thread and on the GPU.
CUDA_EVENTS = [
    _event("user_annotation", "decode_step[eager]", 100.0, 50.0, pid=7, tid=7),
    _event("cuda_runtime", "cudaLaunchKernel", 110.0, 4.0, pid=7, tid=7, correlation=21),
    _event("cuda_runtime", "cudaLaunchKernel", 120.0, 4.0, pid=7, tid=7, correlation=22),
    _event("cuda_runtime", "cudaDeviceSynchronize", 130.0, 60.0, pid=7, tid=7, correlation=23),
    _event("kernel", "gemm", 125.0, 10.0, pid=0, tid=7, device=0, stream=7, correlation=21),
    _event("kernel", "softmax", 137.5, 2.5, pid=0, tid=7, device=0, stream=7, correlation=22),
    _event("gpu_user_annotation", "decode_step[eager]", 125.0, 15.0, pid=0, tid=7, device=0),
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 21, "pid": 7, "tid": 7, "ts": 110.0},
]


def test_kernels_link_to_their_runtime_calls_by_correlation(tmp_path):
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": CUDA_EVENTS}))
    trace = load_trace(path)
    assert [(k.name, trace.api_calls[k.launch].correlation_id) for k in trace.kernels] == [
        ("gemm", 21), ("softmax", 22)]
    assert [(k.start_ns, k.end_ns, k.device, k.stream) for k in trace.kernels] == [
        (125_000, 135_000, 0, 7), (137_500, 140_000, 0, 7)]
    assert [r.name for r in trace.ranges] == ["decode_step[eager]"]  # not its GPU copy

    (step,) = analyze(trace).step_groups[0].steps
    assert (step.kernels, step.kernel_launches, step.kernel_launch_ns) == (2, 2, 8_000)
    assert (step.gpu_busy_ns, step.gpu_idle_ns, step.idle_gaps) == (12_500, 2_500, 1)


@pytest.mark.parametrize("content, where", [
    ('{"displayTimeUnit": "ms"}', ""),  # no traceEvents
    ('[{"name": "x"}]', " (traceEvents[0]: Object missing required field `ph`)"),
    ('{"traceEvents": [{"ph": "M"}, 5]}', " (traceEvents[1]: Expected `object`, got `int`)"),
    ('{"traceEvents": 5}', ""),  # traceEvents not a list
])
def test_json_that_is_not_a_chrome_trace_is_refused_naming_the_event(tmp_path, content, where):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(GraphrtError) as refused:
        load_trace(path)
    assert str(refused.value) == (f"{path}: JSON but not a Chrome trace; expected a list of events with "
                                  f"a 'ph' field, or an object holding one in 'traceEvents'{where}")


def test_a_complete_event_without_a_timestamp_is_refused(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 1}]}))
    with pytest.raises(GraphrtError, match=r"broken\.json: a Chrome-trace event lacks a usable field"):
        load_trace(path)


def test_a_replayed_kernel_carries_the_graph_node_it_came_from(tmp_path):
    """Kineto gives each kernel a graph replay ran `args["graph node id"]` (the node's toolsId:
    exec graph id << 32 | node id); 0, or no such arg, is a kernel launched on its own."""
    node = (3 << 32) | 17
    events = [
        _event("cuda_runtime", "cudaGraphLaunch", 100.0, 5.0, pid=7, tid=7, correlation=1),
        _event("kernel", "gemm", 110.0, 3.0, pid=0, tid=7, device=0, stream=7, correlation=1,
               **{"graph id": 3, "graph node id": node}),
        _event("cuda_runtime", "cudaLaunchKernel", 120.0, 4.0, pid=7, tid=7, correlation=2),
        _event("kernel", "fill", 126.0, 1.0, pid=0, tid=7, device=0, stream=7, correlation=2,
               **{"graph id": 0, "graph node id": 0}),
        _event("kernel", "copy", 130.0, 1.0, pid=0, tid=7, device=0, stream=7, correlation=2),
    ]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert [(k.name, k.graph_node_id) for k in load_trace(path).kernels] == [
        ("gemm", node), ("fill", None), ("copy", None)]


@pytest.mark.parametrize("graph", [2**31 - 1, 2**31])
def test_a_graph_id_too_large_for_a_toolsid_is_refused_by_its_event_never_wrapped(tmp_path, graph):
    """A toolsId holds the exec graph's id above the node's 32 bits in 64: an id of 2**31 or more
    does not fit, and is refused naming its event rather than read as some other node."""
    events = [_event("cuda_runtime", "cudaGraphLaunch", 100.0, 5.0, pid=7, tid=7, correlation=1),
              _event("kernel", "gemm", 110.0, 3.0, pid=0, tid=7, device=0, stream=7, correlation=1,
                     **{"graph id": graph, "graph node id": 17})]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"traceEvents": events}))
    if graph < 2**31:
        assert [k.graph_node_id for k in load_trace(path).kernels] == [(graph << 32) | 17]
    else:
        with pytest.raises(GraphrtError) as refused:
            load_trace(path)
        assert str(refused.value) == (f"{path}: a Chrome-trace event lacks a usable field (traceEvents[1] `gemm`: graph "
                                      f"id 2147483648 does not fit a toolsId: expected one below 2**31)")


def test_a_node_given_as_its_lower_32_bits_and_its_graph_is_keyed_by_both(tmp_path):
    """Newer kinetos write `graph node id` as the node's lower 32 bits with the exec graph's id
    apart: two graphs' node 17 are different nodes, each known by its whole toolsId."""
    events = [
        _event("cuda_runtime", "cudaGraphLaunch", 100.0, 5.0, pid=7, tid=7, correlation=1),
        _event("kernel", "gemm", 110.0, 3.0, pid=0, tid=7, device=0, stream=7, correlation=1,
               **{"graph id": 3, "graph node id": 17}),
        _event("cuda_runtime", "cudaGraphLaunch", 120.0, 5.0, pid=7, tid=7, correlation=2),
        _event("kernel", "gemm", 130.0, 3.0, pid=0, tid=7, device=0, stream=7, correlation=2,
               **{"graph id": 4, "graph node id": 17}),
    ]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert [k.graph_node_id for k in load_trace(path).kernels] == [(3 << 32) | 17, (4 << 32) | 17]
