"""The Chrome-trace reader's rules one by one: small traces written out here in torch.profiler's
layout (plain json, figures worked out by hand) and the real A100/V100 traces in tests/data/torch,
read again with plain json."""

import gzip
import json
import zlib
from pathlib import Path

import pytest

from graphrt.errors import GraphrtError
from graphrt.trace.read.chrome import read_chrome_trace

TORCH_DATA = Path(__file__).parents[1] / "data" / "torch"
A100 = TORCH_DATA / "hta-a100-alexnet-eager.json.gz"
V100 = TORCH_DATA / "hta-v100-graph-launches.json.gz"


def _write(tmp_path: Path, events: list[dict], **header) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({**header, "traceEvents": events} if header else events))
    return path


def _x(cat: str, name: str, ts, dur=None, pid=1, tid=1, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "args": args}
    return event if dur is None else {**event, "dur": dur}


def test_timestamps_convert_to_nanoseconds_exactly(tmp_path):
    epoch_us = 1_695_835_535_123_456.75  # microseconds since 1970, as torch writes them
    # times 1000 in floating point this lands 18 ns off: the whole microseconds must scale as integers
    assert int(epoch_us * 1000) != 1_695_835_535_123_456_750
    trace = read_chrome_trace(_write(tmp_path, [
        _x("cpu_op", "aten::mm", 100, 4), _x("cpu_op", "aten::add", 1.75, 0.75),
        _x("cpu_op", "aten::relu", epoch_us, 2.25)]))
    assert [(op.start_ns, op.end_ns) for op in trace.cpu_ops] == [
        (1_750, 2_500), (100_000, 104_000), (1_695_835_535_123_456_750, 1_695_835_535_123_459_000)]


def test_a_complete_event_without_a_duration_ends_where_it_starts(tmp_path):
    trace = read_chrome_trace(_write(tmp_path, [_x("user_annotation", "decode_step[eager]", 10.5)]))
    assert [(r.start_ns, r.end_ns) for r in trace.ranges] == [(10_500, 10_500)]


def test_a_thread_is_the_file_s_numbers_and_a_label_gets_a_stable_number(tmp_path):
    trace = read_chrome_trace(_write(tmp_path, [
        _x("user_annotation", "a", 1, 1, pid=7, tid=8), _x("user_annotation", "b", 2, 1, pid="7", tid="8"),
        _x("user_annotation", "c", 3, 1, pid="Spawned thread", tid=8)]))
    assert [(r.pid, r.tid) for r in trace.ranges] == [(7, 8), (7, 8), (zlib.crc32(b"Spawned thread"), 8)]


def test_the_schema_version_and_the_writing_rank_are_kept_and_a_bare_event_list_reads_too(tmp_path):
    raw = json.loads(gzip.decompress(A100.read_bytes()))
    assert read_chrome_trace(A100).meta == {"schema": str(raw["schemaVersion"]),
                                            "rank": str(raw["distributedInfo"]["rank"])} == {"schema": "1", "rank": "0"}
    ranked = _write(tmp_path, [], distributedInfo={"rank": 3, "world_size": 4})
    assert read_chrome_trace(ranked).meta == {"rank": "3", "world_size": "4"}
    events = [_x("cpu_op", "aten::mm", 1, 1)]
    bare = read_chrome_trace(_write(tmp_path, events))  # the format's other form: no object around it
    assert ([op.name for op in bare.cpu_ops], bare.meta) == (["aten::mm"], {})


def test_kernels_are_ordered_by_start_whatever_order_the_file_lists_them_in(tmp_path):
    # on two streams: `zeta` starts first and ends last; the file lists `alpha` first
    trace = read_chrome_trace(_write(tmp_path, [
        _x("kernel", "alpha", 20, 5, device=0, stream=8, correlation=2),
        _x("kernel", "zeta", 10, 20, device=0, stream=7, correlation=1)]))
    assert [k.name for k in trace.kernels] == ["zeta", "alpha"]


def test_a_kernel_keeps_its_device_stream_and_correlation_and_defaults_where_args_lack_them(tmp_path):
    trace = read_chrome_trace(_write(tmp_path, [
        _x("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 2, correlation=5),
        _x("kernel", "on_gpu1", 10, 1, device=1, stream=13, correlation=5),
        _x("kernel", "bare", 20, 1)]))  # no device, stream or correlation: device 0, no stream, no call
    on_gpu1, bare = trace.kernels
    assert (on_gpu1.device, on_gpu1.stream, on_gpu1.correlation_id, on_gpu1.launch) == (1, 13, 5, 1)
    # -1 is no call's id (torch counts them from 1): the kernel is never paired with a call
    assert (bare.device, bare.stream, bare.correlation_id, bare.launch) == (0, None, -1, None)


def test_a_repeated_correlation_id_links_each_kernel_to_the_last_call_that_began_before_it(tmp_path):
    # ids repeat in real traces (they restart per profiler session and per process, and runtime
    # and driver calls share them): of the calls with a kernel's id, only one that began before
    # the kernel can have launched it, and the latest such one did
    trace = read_chrome_trace(_write(tmp_path, [
        _x("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=5),
        _x("kernel", "first", 10, 1, device=0, stream=7, correlation=5),
        _x("cuda_driver", "cuLaunchKernel", 50, 2, correlation=5),
        _x("kernel", "second", 60, 1, device=0, stream=7, correlation=5),
        _x("kernel", "third", 70, 1, device=0, stream=7, correlation=5),
        _x("cuda_runtime", "cudaGraphLaunch", 90, 2, correlation=6),
        _x("kernel", "before_any_call", 80, 1, device=0, stream=7, correlation=6)]))
    launched = {k.name: None if k.launch is None else trace.api_calls[k.launch].name for k in trace.kernels}
    assert launched == {"first": "cudaLaunchKernel", "second": "cuLaunchKernel", "third": "cuLaunchKernel",
                        "before_any_call": None}


@pytest.mark.slow
def test_real_kernels_keep_the_time_device_stream_and_correlation_the_file_gives(tmp_path):
    raw = [e for e in json.loads(gzip.decompress(V100.read_bytes()))["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "kernel"]
    expected = sorted((e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000, e["name"], e["args"]["device"],
                       e["args"]["stream"], e["args"]["correlation"]) for e in raw)
    got = [(k.start_ns, k.end_ns, k.name, k.device, k.stream, k.correlation_id)
           for k in read_chrome_trace(V100).kernels]
    assert sorted(got) == expected
    assert {device for _, _, _, device, _, _ in expected} == {1}  # this V100 trace ran on GPU 1


def test_an_event_with_an_unusable_field_is_refused_naming_the_file_and_what_is_expected(tmp_path):
    path = _write(tmp_path, [_x("cpu_op", "aten::mm", "soon", 1)])
    with pytest.raises(GraphrtError) as refused:
        read_chrome_trace(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: a Chrome-trace event lacks a usable field (")
    assert message.endswith("); expected name, ts and dur on every complete ('X') event")


@pytest.mark.parametrize("written, number, said", [
    ('"ts": 30', "1e400", ".ts: "), ('"dur": 103', "-1e400", ".dur: "),
    ('"correlation": 3}', "1e400}", ".args.correlation: "),
    ('"ts": 30', "1" + "0" * 5000, ".ts: ")])  # past a float's range; an integer of more digits than Python parses
def test_a_number_past_what_the_decoder_takes_is_refused_naming_its_field(tmp_path, written, number, said):
    events = [{"ph": "X", "cat": "kernel", "name": f"k{n}", "ts": 10 * n, "dur": 100 + n, "pid": 1, "tid": 2,
               "args": {"correlation": n}} for n in range(6)]
    text = json.dumps({"traceEvents": events})
    assert text.count(written) == 1  # the fourth event's
    text = text.replace(written, written.split(": ")[0] + ": " + number)
    path = tmp_path / "big.json"
    path.write_text(text)
    with pytest.raises(GraphrtError) as refused:
        read_chrome_trace(path)
    assert f"lacks a usable field (traceEvents[3]{said}" in str(refused.value)



@pytest.mark.parametrize("field, value, said", [
    ("ts", 2**62, f"ts {2**62} and dur 1 µs end past 64 bits of nanoseconds"),
    ("tid", 2**70, f"tid {2**70} is not a whole number that fits 64 bits: expected a process or thread id, or a label")])
def test_a_number_past_what_a_column_holds_is_refused_in_one_line_naming_the_event(tmp_path, field, value, said):
    event = {**_x("cpu_op", "aten::mm", 1, 1), field: value}
    with pytest.raises(GraphrtError) as refused:
        read_chrome_trace(_write(tmp_path, [_x("cpu_op", "aten::add", 0, 1), event]))
    assert f"a Chrome-trace event lacks a usable field (traceEvents[1] `aten::mm`: {said}" in str(refused.value)
