"""A batch of Chrome-trace events put into a trace's columns at once gives, row for row, what the
rules give event by event (graphrt.trace.read.chrome_events.add_event); a batch with a field of
another shape is left to those rules whole, nothing of it put in."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st

from graphrt.trace.read.chrome_batch import add_batch
from graphrt.trace.read.chrome_events import MODULE_FRAME, TABLE_OF, Args, Event, Into, add_event
from graphrt.trace.read.events import Trace

RUNNER = "vllm/v1/worker/gpu_model_runner.py(3380): execute_model"
TABLES = ("ranges", "kernels", "api_calls", "cpu_ops", "frames")

usual_time = st.one_of(st.integers(-(2**52), 2**52), st.floats(-1e15, 1e15, allow_nan=False))
usual_duration = st.one_of(st.integers(0, 2**52), st.floats(0, 1e15, allow_nan=False))  # no profiler's is negative
usual_id = st.integers(-(2**62), 2**62)
kernel_args = st.builds(
    Args, correlation=st.none() | usual_id, device=st.none() | st.integers(0, 7), stream=st.none() | usual_id,
    graph_node=st.none() | st.integers(0, 2**40), graph=st.none() | st.integers(0, 2**31 - 1), kernel=st.none())
call_args = st.builds(Args, correlation=st.none() | usual_id, kernel=st.none() | st.sampled_from(["", "gemm"]))


def _events(names: st.SearchStrategy, times: st.SearchStrategy, durations: st.SearchStrategy,
            ids: st.SearchStrategy) -> st.SearchStrategy:
    """Events of every category graphrt reads and some it does not, of every phase."""
    common = {"ph": st.sampled_from(["X", "X", "X", "i", "f"]), "ts": times, "dur": st.none() | durations,
              "pid": ids, "tid": ids}
    return st.one_of(
        st.builds(Event, name=names, cat=st.sampled_from(["cpu_op", "user_annotation", "gpu_memcpy"]), **common),
        st.builds(Event, name=st.none() | st.sampled_from([f"{MODULE_FRAME}Qwen2MLP_0", RUNNER, "torch/nn.py(1): f"]),
                  cat=st.just("python_function"), **common),
        st.builds(Event, name=names, cat=st.sampled_from(["cuda_runtime", "cuda_driver"]), args=st.none() | call_args,
                  **common),
        st.builds(Event, name=names, cat=st.just("kernel"), args=st.none() | kernel_args, **common))


USUAL = _events(st.sampled_from(["aten::mm", "cudaLaunchKernel", "gemm"]), usual_time, usual_duration, usual_id)
# what else a file may hold where these fields are: a missing name or time, labels, huge numbers, a negative duration
odd_time = st.none() | usual_time | st.sampled_from([2**70, 2**60, math.inf, math.nan, 1e17])
ODD = _events(st.none() | st.sampled_from(["aten::mm", "gemm"]), odd_time, odd_time | st.sampled_from([-1, -0.5]),
              usual_id | st.sampled_from(["main thread", "7", 2.5, 2**70]))


def _one_by_one(events: list[Event]) -> Trace | None:
    """The trace the rules make of the events, event by event; None where they refuse one."""
    trace, names = Trace("t", "chrome"), {}
    for e in events:
        if e.ph == "X":
            try:
                add_event(trace, e, names)
            except (KeyError, TypeError, ValueError, OverflowError):
                return None
    return trace


def _rows(trace: Trace) -> list[list]:
    return [list(getattr(trace, table)) for table in TABLES]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(USUAL, max_size=40))
def test_a_batch_of_usual_events_gives_the_rows_the_rules_give_one_by_one(events):
    trace = Trace("t", "chrome")
    assert add_batch(trace, events, {}, {})
    assert _rows(trace) == _rows(_one_by_one(events))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(USUAL, ODD), max_size=40))
def test_a_batch_with_any_field_of_another_shape_is_put_in_as_the_rules_say_or_not_at_all(events):
    trace = Trace("t", "chrome")
    if add_batch(trace, events, {}, {}):
        assert _rows(trace) == _rows(_one_by_one(events))
    else:
        assert _rows(trace) == [[]] * len(TABLES)


def test_one_string_is_kept_for_each_distinct_name():
    events = [Event("X", name=str.join("", ["aten::", "mm"]), cat="cpu_op", ts=n, dur=1, pid=1, tid=1)
              for n in range(3)]
    trace = Trace("t", "chrome")
    assert add_batch(trace, events, {}, {})
    first, *rest = trace.cpu_ops.strings("name")
    assert all(name is first for name in rest) and len({id(e.name) for e in events}) == 3


def test_each_table_the_reader_fills_has_a_number_no_other_table_has():
    # an Into given another's number would become its alias: two tables read as one
    assert len(Into.__members__) == len({int(into) for into in Into.__members__.values()})
    assert set(TABLE_OF.values()) | {Into.NONE, Into.FRAME} == set(Into)


def test_a_module_s_frame_and_a_runner_s_step_go_to_frames_and_ranges_never_to_each_other():
    events = [Event("X", name=f"{MODULE_FRAME}Qwen2MLP_0", cat="python_function", ts=1, dur=1, pid=1, tid=1),
              Event("X", name=RUNNER, cat="python_function", ts=2, dur=1, pid=1, tid=1),
              Event("X", name="decode_step[eager]", cat="user_annotation", ts=3, dur=1, pid=1, tid=1)]
    trace = Trace("t", "chrome")
    assert add_batch(trace, events, {}, {})
    assert [(r.name, r.domain) for r in trace.frames] == [(f"{MODULE_FRAME}Qwen2MLP_0", "python")]
    assert [(r.name, r.domain) for r in trace.ranges] == [(RUNNER, "python"), ("decode_step[eager]", "")]
