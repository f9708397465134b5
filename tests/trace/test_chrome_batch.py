"""The bulk path is the Chrome reader: a trace's tables are what a plain `json.load` of the same
events gives, walked here by the rules as torch.profiler's layout states them (times scaled to
ns exactly, labels for threads, ids of any shape a file writes, toolsIds put together), whatever
the shapes mixed in a batch and wherever the batches are cut; a value the rules refuse is named
by the first event that holds one (graphrt.trace.read.chrome_batch)."""

from __future__ import annotations

import json
import zlib
from dataclasses import astuple
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from graphrt.errors import GraphrtError
from graphrt.trace.read import json_stream
from graphrt.trace.read.chrome import read_chrome_trace
from graphrt.trace.read.chrome_batch import add_batch
from graphrt.trace.read.chrome_events import MODULE_FRAME, TABLE_OF, Event, Into
from graphrt.trace.read.events import Trace

RUNNER = "vllm/v1/worker/gpu_model_runner.py(3380): execute_model"
TABLES = ("ranges", "kernels", "api_calls", "cpu_ops", "frames")

# times as profilers write them (µs: ints, or floats with up to 3 decimals), and ints past 2**53
times = st.integers(-(2**52), 2**52) | st.integers(-(10**15), 10**15).map(lambda n: n / 1000) | \
    st.integers(2**53, 2**53 + 2**40)
durations = st.none() | st.integers(0, 2**40) | st.integers(0, 10**12).map(lambda n: n / 1000)
ids = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**50), 2**50).map(float) | \
    st.integers(0, 10**6).map(str)  # an integral float or a number spelt as a string is still the id
threads = ids | st.sampled_from(["main thread", "Spawned thread 3"])  # a label gets a stable number
names = st.sampled_from(["aten::mm", "cudaLaunchKernel", "gemm", "decode_step[eager]"])
kernel_args = st.fixed_dictionaries({}, optional={
    "correlation": ids, "device": st.integers(0, 7) | st.just(3.0), "stream": ids.filter(lambda v: v != -(2**63)),
    "graph node id": st.integers(0, 2**40), "graph id": st.integers(0, 2**31 - 1)})
call_args = st.fixed_dictionaries({}, optional={"correlation": ids, "kernel": st.sampled_from(["", "gemm"])})


def _event(cat: st.SearchStrategy, name: st.SearchStrategy, args: st.SearchStrategy = st.just({})):
    return st.fixed_dictionaries(
        {"ph": st.sampled_from(["X", "X", "X", "i", "f"]), "cat": cat, "name": name, "ts": times, "pid": threads,
         "tid": threads, "args": args},
        optional={"dur": durations})


EVENTS = st.one_of(
    _event(st.sampled_from(["cpu_op", "user_annotation", "gpu_memcpy", "gpu_user_annotation"]), names),
    _event(st.just("python_function"), st.sampled_from([f"{MODULE_FRAME}Qwen2MLP_0", RUNNER, "torch/nn.py(1): f"])),
    _event(st.sampled_from(["cuda_runtime", "cuda_driver"]), names, call_args),
    _event(st.just("kernel"), names, kernel_args))


def _ns(microseconds) -> int:
    return microseconds * 1000 if isinstance(microseconds, int) else round(Fraction(microseconds) * 1000)


def _thread(value) -> int:
    if isinstance(value, str):
        return int(value) if value.lstrip("-").isdigit() else zlib.crc32(value.encode())
    return int(value)


def _expected(events: list[dict]) -> dict[str, list[tuple]]:
    """Each table's rows as the format's rules make them, from the events as json.load gives them."""
    out: dict[str, list[tuple]] = {table: [] for table in TABLES}
    for e in events:
        if e["ph"] != "X":
            continue
        start = _ns(e["ts"])
        end, args, cat, name = start + _ns(e.get("dur") or 0), e["args"], e["cat"], e["name"]
        thread = (_thread(e["pid"]), _thread(e["tid"]))
        if cat == "cpu_op":
            out["cpu_ops"].append((name, start, end, *thread))
        elif cat == "user_annotation":
            out["ranges"].append((name, start, end, *thread, ""))
        elif cat == "python_function" and name.startswith(MODULE_FRAME):
            out["frames"].append((name, start, end, *thread, "python"))
        elif cat == "python_function" and name == RUNNER:
            out["ranges"].append((name, start, end, *thread, "python"))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            out["api_calls"].append((name, start, end, *thread, int(args["correlation"]), args.get("kernel", "")))
        elif cat == "kernel":
            node, graph = args.get("graph node id", 0), args.get("graph id", 0)
            tools = None if not node else (graph << 32) | (node & 0xFFFF_FFFF) if graph else node
            out["kernels"].append((name, start, end, int(args.get("device", 0)),
                                   None if "stream" not in args else int(args["stream"]),
                                   int(args.get("correlation", -1)), tools))
    return {table: sorted(rows, key=lambda row: row[1]) for table, rows in out.items()}  # stable: file order kept


def _read(trace: Trace) -> dict[str, list[tuple]]:
    rows = {table: [astuple(row) for row in getattr(trace, table)] for table in TABLES}
    rows["kernels"] = [(k.name, k.start_ns, k.end_ns, k.device, k.stream, k.correlation_id, k.graph_node_id)
                       for k in trace.kernels]
    return rows


def _write(directory: Path, events: list[dict]) -> Path:
    path = directory / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(EVENTS, max_size=40), chunk=st.sampled_from([64, 300, 1 << 20]))
def test_the_tables_are_what_a_plain_json_load_of_the_events_gives_whatever_their_shapes(tmp_path_factory, events,
                                                                                         chunk):
    path = _write(tmp_path_factory.mktemp("t"), events)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_stream, "CHUNK", chunk)  # batches cut anywhere, an odd value in any of them
        trace = read_chrome_trace(path)
    assert _read(trace) == _expected(json.loads(path.read_text())["traceEvents"])


# values the rules refuse, each with the words that name it, by the categories that read the field
PLANTS = [
    ("dur", -1, "dur -1 is negative", ("cpu_op", "cuda_runtime", "kernel")),
    ("ts", None, "KeyError('ts')", ("cpu_op", "cuda_runtime", "kernel")),
    ("name", None, "KeyError('name')", ("cpu_op", "cuda_runtime", "kernel")),
    ("tid", 2.5, "tid 2.5 is not a whole number", ("cpu_op", "cuda_runtime")),
    ("args.device", "gpu0", "args.device 'gpu0' is not a whole number", ("kernel",)),
    ("args.graph id", 2**31, "graph id 2147483648 does not fit a toolsId", ("kernel",)),
    # -2**63 marks a kernel that states no stream: one that states it is refused, never read as unstated
    ("args.stream", -(2**63), "args.stream -9223372036854775808 is no stream's id", ("kernel",)),
    ("args.graph node id", -(2**63), "graph node id -9223372036854775808 is no node's id", ("kernel",)),
]


def _usual(n: int, cat: str) -> dict:
    return {"ph": "X", "cat": cat, "name": f"e{n}", "ts": 10 * n, "dur": 5, "pid": 1, "tid": 2,
            "args": {"correlation": n, "device": 0, "graph node id": 17}}


def _plant(event: dict, field: str, value) -> None:
    held = event["args"] if field.startswith("args.") else event
    key = field.removeprefix("args.")
    if value is None:
        del held[key]
    else:
        held[key] = value


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), size=st.integers(2, 30))
def test_the_first_event_holding_a_refused_value_is_the_one_named(tmp_path_factory, data, size):
    """However the refused values lie across the tables and the columns, the refusal names the
    first event that holds one, by what is wrong with it."""
    cats = data.draw(st.lists(st.sampled_from(["cpu_op", "cuda_runtime", "kernel"]), min_size=size, max_size=size))
    events = [_usual(n, cat) for n, cat in enumerate(cats)]
    planted = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3, unique=True))
    said = {}
    for n in planted:
        field, value, words, _ = data.draw(st.sampled_from([p for p in PLANTS if cats[n] in p[3]]))
        _plant(events[n], field, value)
        said[n] = words
    path = _write(tmp_path_factory.mktemp("t"), events)
    with pytest.raises(GraphrtError) as refused:
        read_chrome_trace(path)
    first = min(planted)
    assert f"(traceEvents[{first}]" in str(refused.value) and said[first] in str(refused.value)


@pytest.mark.parametrize("field, value, words, cats", PLANTS, ids=[p[0] for p in PLANTS])
def test_each_refused_value_alone_is_named_by_its_event(tmp_path, field, value, words, cats):
    # the property test above draws the plants at random; here each is planted once, in the third event
    events = [_usual(n, cats[0]) for n in range(5)]
    _plant(events[2], field, value)
    with pytest.raises(GraphrtError) as refused:
        read_chrome_trace(_write(tmp_path, events))
    assert "(traceEvents[2]" in str(refused.value) and words in str(refused.value)


def test_of_two_refused_fields_of_one_event_the_one_the_rules_check_first_is_named(tmp_path):
    event = {**_usual(0, "kernel"), "dur": -1}
    event["args"]["device"] = "gpu0"  # a kernel's device is read after its time
    with pytest.raises(GraphrtError, match=r"traceEvents\[0\] `e0`: dur -1 is negative"):
        read_chrome_trace(_write(tmp_path, [event]))


def test_one_string_is_kept_for_each_distinct_name():
    events = [Event("X", name=str.join("", ["aten::", "mm"]), cat="cpu_op", ts=n, dur=1, pid=1, tid=1)
              for n in range(3)]
    trace = Trace("t", "chrome")
    add_batch(trace, events, {}, {})
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
    add_batch(trace, events, {}, {})
    assert [(r.name, r.domain) for r in trace.frames] == [(f"{MODULE_FRAME}Qwen2MLP_0", "python")]
    assert [(r.name, r.domain) for r in trace.ranges] == [(RUNNER, "python"), ("decode_step[eager]", "")]


@pytest.mark.parametrize("field, value, said", [
    ("dur", 8 * 10**15, "ts 8000000000000000 and dur 8000000000000000 µs end past 64 bits"),  # each below 2**53
    ("args.graph id", -(2**63), f"graph id {-(2**63)} does not fit a toolsId")])  # |-2**63| is no int64
def test_values_each_usual_whose_figure_passes_64_bits_are_refused_never_wrapped(tmp_path, field, value, said):
    event = {**_usual(0, "kernel"), "ts": 8 * 10**15}
    _plant(event, field, value)
    with pytest.raises(GraphrtError, match=rf"traceEvents\[0\] `e0`: {said}"):
        read_chrome_trace(_write(tmp_path, [event]))
