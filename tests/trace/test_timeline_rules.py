"""How ranges nest and what a step's timeline holds, on traces built by hand: every figure below
follows from the few spans each test lays out, not from the code under test.
"""

from __future__ import annotations

from graphrt.trace.analysis.membership import NONE, Membership
from graphrt.trace.analysis.timeline import WHOLE_TRACE, step_timelines, whole_trace
from graphrt.trace.read.events import ApiCall, CpuOp, Kernel, Range, Trace

PID, TID = 7, 1


def rng(name: str, start: int, end: int) -> Range:
    return Range(name, start, end, PID, TID)


def call(name: str, start: int, end: int, correlation: int) -> ApiCall:
    return ApiCall(name, start, end, PID, TID, correlation)


def kernel(name: str, start: int, end: int, launch: int | None) -> Kernel:
    return Kernel(name, start, end, device=0, stream=7, correlation_id=-1 if launch is None else launch,
                  launch=launch)


def test_of_two_ranges_that_start_together_the_longer_is_the_parent_whichever_comes_first():
    ranges = [rng("inner", 100, 200), rng("outer", 100, 500)]  # listed inner first
    assert Membership.of(Trace("t", "chrome", ranges=ranges)).parent == [1, None]


def test_a_range_that_ends_with_its_parent_is_still_inside_it():
    ranges = [rng("outer", 100, 500), rng("inner", 300, 500)]
    assert Membership.of(Trace("t", "chrome", ranges=ranges)).parent == [None, 0]


def test_a_call_made_before_any_range_on_its_thread_belongs_to_none():
    trace = Trace("t", "chrome", ranges=[rng("decode_step[eager]", 1_000, 2_000)],
                  api_calls=[call("cudaLaunchKernel", 500, 600, 1)],
                  kernels=[kernel("early", 700, 800, 0)])
    att = Membership.of(trace)
    assert att.kernel_home.tolist() == [NONE]
    assert att.kernels == [[]] and att.launches == [[]]


def eager_trace() -> Trace:
    """One eager step: a kernel launched in the step outside any module, then two in `mlp`;
    a kernel launched before the step, and one without a launch call."""
    ranges = [rng("decode_step[eager]", 1_000, 5_000), rng("mlp (Qwen2MLP)", 2_000, 4_000)]
    calls = [call("cudaLaunchKernel", 500, 550, 1),  # before the step
             call("cudaLaunchKernel", 1_100, 1_200, 2),  # in the step, in no module
             call("cudaMemcpyAsync", 1_300, 1_400, 3),  # not a launch
             call("cudaLaunchKernelExC", 2_200, 2_300, 4),
             call("cudaLaunchKernel", 2_500, 2_600, 5)]
    kernels = [kernel("before", 560, 900, 0), kernel("embed", 1_250, 1_500, 1),
               kernel("gate_up", 2_350, 2_700, 3), kernel("down", 2_700, 3_100, 4),
               kernel("orphan", 3_200, 3_300, None)]
    return Trace("t", "nsys", ranges=ranges, api_calls=calls, kernels=kernels)


def test_a_step_holds_the_launches_and_kernels_made_inside_it_with_their_stacks():
    [step] = step_timelines(eager_trace())
    assert (step.name, step.group, step.start_ns, step.end_ns, step.unit) == (
        "decode_step[eager]", "decode_step[eager]", 1_000, 5_000, "kernel")
    assert [(l.name, l.kind, l.start_ns, l.end_ns) for l in step.launches] == [
        ("cudaLaunchKernel", "kernel", 1_100, 1_200), ("cudaLaunchKernelExC", "kernel", 2_200, 2_300),
        ("cudaLaunchKernel", "kernel", 2_500, 2_600)]
    assert [(w.name, w.start_ns, w.end_ns, w.launch, w.stack, w.home) for w in step.work] == [
        ("embed", 1_250, 1_500, 0, (), None),  # issued in the step itself: no module, no home
        ("gate_up", 2_350, 2_700, 1, ("mlp (Qwen2MLP)",), 1),
        ("down", 2_700, 3_100, 2, ("mlp (Qwen2MLP)",), 1)]


def test_steps_come_in_the_order_they_started():
    trace = Trace("t", "nsys", ranges=[rng("decode_step[eager]", 9_000, 9_500),
                                       rng("decode_step[eager]", 1_000, 1_500)])
    assert [s.start_ns for s in step_timelines(trace)] == [1_000, 9_000]


def test_a_trace_without_steps_is_one_timeline_of_every_launched_kernel():
    whole = whole_trace(eager_trace())
    # it spans the work and the calls (the orphan kernel ends last), not the ranges
    assert (whole.name, whole.start_ns, whole.end_ns, whole.unit) == (WHOLE_TRACE, 500, 3_300, "kernel")
    assert [l.start_ns for l in whole.launches] == [500, 1_100, 2_200, 2_500]
    assert [(w.name, w.launch, w.stack) for w in whole.work] == [
        ("before", 0, ()), ("embed", 1, ("decode_step[eager]",)),
        ("gate_up", 2, ("decode_step[eager]", "mlp (Qwen2MLP)")),
        ("down", 3, ("decode_step[eager]", "mlp (Qwen2MLP)"))]  # the orphan has no launch call


def test_a_cpu_trace_without_steps_is_one_timeline_of_its_top_level_ops():
    ops = [CpuOp("aten::linear", 100, 400, PID, TID), CpuOp("aten::addmm", 150, 350, PID, TID),
           CpuOp("aten::silu", 500, 600, PID, TID)]
    whole = whole_trace(Trace("t", "chrome", cpu_ops=ops))
    assert (whole.start_ns, whole.end_ns, whole.unit) == (100, 600, "op")
    assert [w.name for w in whole.work] == ["aten::linear", "aten::silu"]


def test_an_empty_trace_is_an_empty_timeline_at_zero():
    whole = whole_trace(Trace("t", "chrome"))
    assert (whole.start_ns, whole.end_ns, whole.work, whole.launches) == (0, 0, [], [])


def test_a_profiler_step_also_holds_the_top_level_ops_its_process_ran_on_other_threads_meanwhile():
    # ProfilerStep#3 on thread 1 spans 100..200. Thread 2 of the same process runs ops as it
    # starts, inside it, as it ends and after it; another process runs one inside it.
    step = Range("ProfilerStep#3", 100, 200, PID, TID)
    ops = [CpuOp("aten::add", 100, 110, PID, 2),  # 0: at its start
           CpuOp("aten::mm", 120, 130, PID, TID),  # 1: on its own thread
           CpuOp("aten::mul", 150, 160, PID, 2),  # 2: inside
           CpuOp("aten::div", 150, 160, PID + 1, 2),  # 3: another process
           CpuOp("aten::relu", 200, 210, PID, 2),  # 4: at its end
           CpuOp("aten::sub", 230, 240, PID, 2)]  # 5: after it
    # its own thread's op, then the other thread's, in order
    assert Membership.of(Trace("t", "chrome", ranges=[step], cpu_ops=ops)).ops == [[1, 0, 2, 4]]
