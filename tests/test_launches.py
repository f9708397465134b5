"""What counts as a launch call, for `graphrt run`'s count and `graphrt analyze`'s alike."""

import pytest
import torch

from graphrt import nvtx
from graphrt.launches import CountedStep, StepLaunches, count_steps, launch_kind
from graphrt.opcount import op_names


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
