"""Launches, graph fan-out, steps and the GPU idle split of real GPU traces, each set against a
computation done here on the raw Chrome-trace JSON (plain json and interval arithmetic, in the
file's own microseconds).

The V100 trace (tests/data/torch/README.md) holds six torch.profiler iterations, each with two
`cudaGraphLaunch` calls (one on the main thread, one on autograd's backward thread) fanning out
to 315 and 429 kernels, among hundreds of `cudaLaunchKernel` calls.
"""

import gzip
import json
import statistics
from pathlib import Path

import pytest

from graphrt.measure.launches import launch_kind
from graphrt.trace import load_trace
from graphrt.trace.analysis.idle import KERNEL_WAIT_NS, step_launch_idle
from graphrt.trace.analysis.membership import Membership
from graphrt.trace.analysis.steps import analyze
from graphrt.trace.analysis.timeline import step_timelines

V100 = Path(__file__).parents[1] / "data" / "torch" / "hta-v100-graph-launches.json.gz"


@pytest.fixture(scope="module")
def raw():
    return json.loads(gzip.decompress(V100.read_bytes()))["traceEvents"]


@pytest.fixture(scope="module")
def ours():
    trace = load_trace(V100)
    membership = Membership.of(trace)
    timelines = step_timelines(trace, membership)
    return analyze(trace, membership), {t.name: step_launch_idle(t) for t in timelines}


def _expected_steps(events):
    """Per ProfilerStep#N: the launch calls its process made while it was open (any thread),
    and the kernels each launched (same correlation, starting no earlier than the call)."""
    kernels_by_corr = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernels_by_corr.setdefault(e["args"]["correlation"], []).append(e)
    steps = {}
    for s in events:
        if s.get("cat") != "user_annotation" or not s["name"].startswith("ProfilerStep#"):
            continue
        calls = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                        and e["pid"] == s["pid"] and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]
                        and (e["name"].startswith(("cudaLaunch", "cuLaunch")) or e["name"] == "cudaGraphLaunch")),
                       key=lambda e: e["ts"])
        launched = [(c, sorted((k for k in kernels_by_corr.get(c["args"]["correlation"], []) if k["ts"] >= c["ts"]),
                               key=lambda k: k["ts"])) for c in calls]
        steps[s["name"]] = launched
    return steps


def test_steps_are_the_profiler_steps_and_group_as_one(raw, ours):
    report, per_step = ours
    names = sorted(e["name"] for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert sorted(per_step) == names and len(names) == 6
    (group,) = report.step_groups
    assert group.name == "ProfilerStep#*" and len(group.steps) == len(names)


def test_launch_counts_and_graph_fan_out_per_step(raw, ours):
    _, per_step = ours
    for name, launched in _expected_steps(raw).items():
        got = per_step[name]
        graphs = [kernels for call, kernels in launched if call["name"] == "cudaGraphLaunch"]
        assert got.graph_launches == len(graphs) == 2
        assert got.kernel_launches == len(launched) - len(graphs)
        assert got.graph_fanout == [len(k) for k in graphs] and sorted(got.graph_fanout) == [315, 429]
        assert got.kernels == sum(len(k) for _, k in launched)
        assert got.launch_cpu_ns / 1000 == pytest.approx(sum(c["dur"] for c, _ in launched), abs=0.01)


def test_launch_delay_is_one_per_launch_call_from_its_first_kernel(raw, ours):
    _, per_step = ours
    for name, launched in _expected_steps(raw).items():
        delays = [kernels[0]["ts"] - (call["ts"] + call["dur"]) for call, kernels in launched if kernels]
        deciles = statistics.quantiles(delays, n=10, method="inclusive")
        assert per_step[name].delay_p50_ns / 1000 == pytest.approx(statistics.median(delays), abs=0.01)
        assert per_step[name].delay_p90_ns / 1000 == pytest.approx(deciles[8], abs=0.01)


def test_idle_split_counts_gaps_inside_a_graph_as_device_time_not_host_waits(raw, ours):
    _, per_step = ours
    for name, launched in _expected_steps(raw).items():
        kernels = sorted(((k["ts"], k["ts"] + k["dur"], call["ts"]) for call, ks in launched for k in ks))
        split = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        busy_until = kernels[0][1]
        for start, end, launched_at in kernels[1:]:
            if start > busy_until:
                gap = start - busy_until
                kind = ("host_wait" if launched_at > busy_until else
                        "kernel_wait" if gap < KERNEL_WAIT_NS / 1000 else "other")
                split[kind] += gap
            busy_until = max(busy_until, end)
        got = per_step[name].idle_ns
        for kind, us in split.items():
            assert got[kind] / 1000 == pytest.approx(us, abs=0.01), (name, kind)
        assert sum(split.values()) > 0


def test_rocm_launch_calls_read_like_cuda_ones():
    assert [launch_kind(n) for n in ("hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                                     "hipGraphLaunch", "hipMemcpyAsync")] == ["kernel", "kernel", "kernel", "graph", None]
