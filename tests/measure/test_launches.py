"""What counts as a launch call, for `graphrt run`'s count and `graphrt analyze`'s alike."""

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from graphrt.measure import nvtx
from graphrt.measure.launches import CountedStep, StepLaunches, count_steps, is_copy_call, launch_kind
from graphrt.measure.opcount import op_names


@pytest.mark.parametrize("api, kind", [
    # the runtime API, as torch.profiler names it
    ("cudaLaunchKernel", "kernel"),
    ("cudaLaunchKernelExC", "kernel"),
    ("cudaLaunchCooperativeKernel", "kernel"),
    ("cudaLaunchHostFunc", "kernel"),
    ("cudaGraphLaunch", "graph"),
    # Nsight Systems adds the API version
    ("cudaLaunchKernel_v7000", "kernel"),
    ("cudaGraphLaunch_v10000", "graph"),
    # the driver API (Triton's launcher calls it directly)
    ("cuLaunchKernel", "kernel"),
    ("cuLaunchKernelEx", "kernel"),
    ("cuGraphLaunch", "graph"),
    # ROCm's HIP runtime
    ("hipLaunchKernel", "kernel"),
    ("hipModuleLaunchKernel", "kernel"),
    ("hipExtModuleLaunchKernel", "kernel"),
    ("hipGraphLaunch", "graph"),
    # calls that put no work on the GPU, or that only copy
    ("cudaGraphInstantiate", None),
    ("cudaStreamBeginCapture", None),
    ("cudaMemcpyAsync", None),
    ("cudaEventRecord", None),
    ("hipMemcpyAsync", None),
    ("aten::mm", None),
])
def test_launch_kind_of_each_api(api, kind):
    assert launch_kind(api) == kind


def test_host_launches_add_kernel_and_graph_launches():
    assert StepLaunches(ops=90, kernel_launches=3, graph_launches=1).host_launches == 4
    assert StepLaunches(ops=90, kernel_launches=0, graph_launches=0).host_launches == 0
    assert StepLaunches(ops=90).host_launches is None  # the CPU: no launch calls to count


def test_each_cpu_step_counts_the_aten_ops_that_do_work_in_its_own_range():
    x, w = torch.randn(2, 8), torch.randn(8, 8)
    matmul = lambda: torch.relu(x @ w).t()  # noqa: E731  mm and relu do work; t is a view
    add = lambda: x + 1  # noqa: E731
    with nvtx.record_to([]) as events:
        counted = count_steps([CountedStep("matmul", matmul), CountedStep("add", add)], torch.device("cpu"))
    assert counted == {"matmul": StepLaunches(ops=2), "add": StepLaunches(ops=1)}
    assert op_names(matmul) == ["aten.mm.default", "aten.relu.default"]
    assert [name for kind, name in events if kind == "push"] == ["count[matmul]", "count[add]"]


def test_a_step_that_cannot_be_counted_on_the_cpu_still_runs():
    ran = []
    counted = count_steps([CountedStep("compiled", lambda: ran.append(torch.ones(3) * 2), countable_on_cpu=False)],
                          torch.device("cpu"))
    assert counted == {"compiled": StepLaunches(ops=None)} and ran[0].tolist() == [2.0, 2.0, 2.0]


TORCH_DATA = Path(__file__).parents[1] / "data" / "torch"


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["hta-a100-alexnet-eager.json.gz", "hta-v100-graph-launches.json.gz"])
def test_copy_calls_are_the_host_calls_whose_work_on_the_gpu_is_a_copy_or_a_fill(fixture):
    # Real GPU traces: what a call put on the GPU is the GPU-side events with its correlation id,
    # which the rule never looks at. A graph launch's replay holds copies too, but it launches kernels.
    events = json.loads(gzip.decompress((TORCH_DATA / fixture).read_bytes()))["traceEvents"]
    on_gpu: dict[int, set[str]] = defaultdict(set)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            on_gpu[e["args"]["correlation"]].add(e["cat"])
    calls = [(e["name"], on_gpu[e["args"]["correlation"]]) for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    copying = [name for name, work in calls if work and work <= {"gpu_memcpy", "gpu_memset"}]
    assert copying and all(is_copy_call(name) for name in copying)
    assert all(work <= {"gpu_memcpy", "gpu_memset"} for name, work in calls if is_copy_call(name))
    assert not any(is_copy_call(name) for name, work in calls if "kernel" in work)


@pytest.mark.parametrize("api", ["cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy2DAsync_v3020",
                                 "cuMemcpyHtoDAsync_v2", "cuMemsetD8Async", "hipMemcpyAsync"])
def test_copies_and_fills_from_every_api_are_copy_calls(api):
    assert is_copy_call(api) and launch_kind(api) is None


@pytest.mark.parametrize("api", ["cudaMalloc", "cudaMemGetInfo", "cudaLaunchKernel", "cudaGraphLaunch",
                                 "cudaStreamSynchronize", "aten::copy_"])
def test_calls_that_copy_nothing_on_the_gpu_are_not_copy_calls(api):
    assert not is_copy_call(api)
