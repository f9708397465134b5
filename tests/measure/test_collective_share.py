"""The share of a step in collectives (graphrt.measure.collective_share): which kernels are collectives,
and on CUDA the GPU time of NCCL's kernels over the step's GPU time, checked on a real trace
(tests/data/torch/README.md) against figures worked out from its raw Chrome JSON."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from graphrt.measure.collective_share import is_collective_kernel, kernel_time, share
from graphrt.trace import load_trace
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.rank_steps import RankGroup, collective_time
from graphrt.trace.analysis.steps import analyze
from graphrt.trace.read.events import CpuOp, Range, Trace

DATA = Path(__file__).parents[1] / "data" / "torch"
V100 = DATA / "hta-v100-graph-launches.json.gz"  # 64 NCCL kernels: all-reduces and send/recvs
LAUNCHES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch")


@pytest.mark.parametrize("name, collective", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", True),  # NCCL before 2.19 (the V100 trace)
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", True),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),  # 2.19 on
    ("ncclDevKernel_Generic", True),
    ("void ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", True),
    ("nccl:all_reduce", False),  # torch's CPU-side range around a collective, not a kernel's name
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, ...)", False),
    ("my_ncclKernel_copy", False),
    ("ncclKernelish", False),
])
def test_nccl_kernels_are_collectives_and_no_other_kernel_is(name, collective):
    assert is_collective_kernel(name) is collective


def test_a_steps_share_is_the_union_of_its_nccl_kernels_over_its_first_kernel_start_to_last_end():
    # two NCCL kernels overlapping on [10, 30) and [20, 40): 30 ns of collectives in a 100 ns step
    kernels = [("gemm", 0, 10), ("ncclKernel_AllReduce", 10, 30), ("ncclDevKernel_AllReduce", 20, 40),
               ("gemm", 40, 100)]
    assert kernel_time(kernels) == (30, 100)
    assert share(*kernel_time(kernels)) == 0.3
    assert kernel_time([("gemm", 5, 25)]) == (0, 20)  # kernels but no collective: a share of 0
    assert kernel_time([]) is None  # no kernel: nothing to tell
    assert share(0, 0) is None


def _raw_nccl_steps(path: Path) -> list[float]:
    """Each ProfilerStep's share in NCCL kernels, from the raw events by another route than
    graphrt's: a step's kernels are those whose launch call (same correlation) began inside the
    step, on any thread of its process."""
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    kernels = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernels.setdefault(e["args"]["correlation"], []).append(e)
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"].startswith(LAUNCHES)]
    shares = []
    for step in (e for e in events if e["name"].startswith("ProfilerStep#")):
        mine = [k for c in calls if c["pid"] == step["pid"] and step["ts"] <= c["ts"] <= step["ts"] + step["dur"]
                for k in kernels.get(c["args"]["correlation"], ())]
        nccl = sorted((k["ts"], k["ts"] + k["dur"]) for k in mine if k["name"].startswith("ncclKernel_"))
        covered, end = 0.0, float("-inf")
        for s, e in nccl:
            covered += max(0.0, e - max(s, end))
            end = max(end, e)
        span = max(k["ts"] + k["dur"] for k in mine) - min(k["ts"] for k in mine)
        shares.append(covered / span)
    return shares


def test_the_share_on_a_real_trace_with_nccl_kernels_is_their_gpu_time_in_each_step():
    trace = load_trace(V100)
    membership = Membership.of(trace)
    (group,) = analyze(trace, membership).step_groups
    figures = RankGroup(0, group, collective_time(trace, membership)[group.name])
    want = _raw_nccl_steps(V100)
    assert len(want) == 6 and all(0.2 < s < 0.5 for s in want)  # every step all-reduces and sends
    assert figures.measure == "gpu"
    assert figures.shares == pytest.approx(want, abs=1e-6)
    assert figures.collective_share == pytest.approx(statistics.median(want), abs=1e-6)


def test_on_a_cpu_a_steps_collective_time_is_the_union_of_its_all_reduce_ranges_and_ops():
    # a step of 100 ns: an AllReduce module's range on [10, 30), a functional all_reduce op on
    # [20, 45) (overlapping it), another on [60, 70); an op that is no collective on [80, 90)
    pid, tid = 1, 1
    ranges = [Range("decode_step[eager]", 0, 100, pid, tid),
              Range("model.layers.0.mlp.down_proj (AllReduce)", 10, 30, pid, tid)]
    ops = [CpuOp("_c10d_functional::all_reduce", 20, 45, pid, tid),
           CpuOp("_c10d_functional::all_reduce", 60, 70, pid, tid), CpuOp("aten::mm", 80, 90, pid, tid)]
    trace = Trace("t", "chrome", ranges=ranges, cpu_ops=ops)
    (spent,) = collective_time(trace, Membership.of(trace))["decode_step[eager]"]
    assert (spent.collective_ns, spent.step_ns, spent.measure) == (45, 100, "cpu")
