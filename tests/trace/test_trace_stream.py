"""Reading a Chrome trace as a stream: batches cut anywhere read as the whole file does, a trace
grown from a real one gives the same steps, and a broken file is one line naming where it broke."""

from __future__ import annotations

import gzip
import zlib
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.analysis.steps import analyze
from graphrt.trace.read import json_stream

REPO = Path(__file__).resolve().parents[2]
V100 = REPO / "tests" / "data" / "torch" / "hta-v100-graph-launches.json.gz"
GROW = runpy.run_path(str(REPO / "scripts" / "bench_trace.py"))["grow"]


def _rows(trace) -> list:
    return [list(table) for table in (trace.ranges, trace.kernels, trace.api_calls, trace.cpu_ops)]


def _x(n: int, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": f"op{n}", "pid": 1, "tid": 1, "ts": 10 * n, "dur": 5, "args": args}


def test_batches_cut_at_any_size_read_as_the_whole_file_does(tmp_path, monkeypatch):
    """Events whose args hold objects in a list (a `}` then `,` inside an event) are where a cut
    can fall inside an event: those cuts fail and an earlier one is taken."""
    events = [_x(n, shapes=[{"a": 1}, {"b": [2, {"c": 3}]}], note="},{") for n in range(40)]
    events += [_x(40, cat="cuda_runtime", correlation=7), _x(41, cat="kernel", correlation=7, device=0)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x"}, indent=2))
    whole = load_trace(path)
    assert len(whole.cpu_ops) == 40 and whole.kernels[0].launch == 0 and whole.meta == {"schema": "1"}
    for chunk in (64, 200, 333, 1000):
        monkeypatch.setattr(json_stream, "CHUNK", chunk)
        assert _rows(load_trace(path)) == _rows(whole), chunk


@pytest.mark.slow
def test_a_trace_grown_from_a_real_one_gives_the_same_steps(tmp_path):
    grown = tmp_path / "grown.json"
    GROW(V100, 3, grown)
    original, bigger = analyze(load_trace(V100)), analyze(load_trace(grown))
    (steps,), (grown_steps,) = original.step_groups, bigger.step_groups
    assert len(grown_steps.steps) == 3 * len(steps.steps)
    assert grown_steps.medians == steps.medians
    assert bigger.counts["kernels"] == 3 * original.counts["kernels"]


def _broken(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(GraphrtError) as refused:
        load_trace(path)
    return str(refused.value)


def _trace_bytes(events: list) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


def test_a_truncated_file_says_how_far_it_got(tmp_path):
    whole = _trace_bytes([_x(n) for n in range(50)])
    message = _broken(tmp_path, "cut.json", whole[:len(whole) // 2])
    assert message.startswith(f"{tmp_path / 'cut.json'}: not a readable Chrome-trace JSON (it ends inside "
                              "traceEvents, after ")
    assert "events and" in message and "bytes: cut short?)" in message


def test_a_cut_gzip_is_named_a_truncated_stream_after_the_bytes_it_inflated(tmp_path):
    json_bytes = _trace_bytes([_x(n) for n in range(5000)])
    packed = gzip.compress(json_bytes)
    message = _broken(tmp_path, "cut.json.gz", packed[: len(packed) - 40])
    assert message.startswith(f"{tmp_path / 'cut.json.gz'}: a truncated gzip stream: it ends after ")
    inflated = int(message.split("ends after ")[1].split(" ")[0].replace(",", ""))
    assert 0 < inflated < len(json_bytes) and json_bytes.startswith(json_bytes[:inflated])


def test_a_gzip_with_a_wrong_checksum_names_the_bytes_inflated_before_it_broke(tmp_path):
    json_bytes = _trace_bytes([_x(n) for n in range(5000)])
    packed = bytearray(gzip.compress(json_bytes))
    packed[-8] ^= 0xFF  # the CRC-32 of the whole JSON, checked once it is all inflated
    message = _broken(tmp_path, "bad.json.gz", bytes(packed))
    assert message == (f"{tmp_path / 'bad.json.gz'}: a gzip that breaks after {len(json_bytes):,} inflated bytes of "
                       f"JSON (CRC check failed 0x{zlib.crc32(json_bytes) ^ 0xFF:08x} != 0x{zlib.crc32(json_bytes):08x})")


def test_malformed_json_names_the_byte(tmp_path):
    text = _trace_bytes([_x(n) for n in range(3)]).replace(b'"dur": 5, "args": {}}, {', b'"dur": 5,, "args": {}}, {', 1)
    message = _broken(tmp_path, "bad.json", text)
    at = text.index(b",,") + 1
    assert message.startswith(f"{tmp_path / 'bad.json'}: not a readable Chrome-trace JSON (at byte {at:,}, in "
                              "traceEvents[0]: JSON is malformed")


def test_bytes_after_the_document_are_refused_at_their_byte_in_the_file(tmp_path):
    text = _trace_bytes([_x(n) for n in range(3)]) + b" x"
    message = _broken(tmp_path, "after.json", text)
    assert message == (f"{tmp_path / 'after.json'}: not a readable Chrome-trace JSON (at byte {len(text) - 1:,}, "
                       "after traceEvents: Extra data)")


def test_a_break_between_two_events_is_named_by_the_event_after_it(tmp_path):
    text = _trace_bytes([_x(n) for n in range(3)]).replace(b"{}}, {", b"{}}; {", 1)
    at = text.index(b";")
    message = _broken(tmp_path, "between.json", text)
    assert message.startswith(f"{tmp_path / 'between.json'}: not a readable Chrome-trace JSON (at byte {at:,}, in "
                              "traceEvents[1]:")


@pytest.mark.parametrize("event, where", [
    ({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 1}, "(traceEvents[2]: KeyError"),  # no ts
    ({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", "dur": 1}, "(traceEvents[2].ts: Expected"),
    ({"ph": "X", "cat": "kernel", "ts": 1, "dur": 1}, "(traceEvents[2]: KeyError('name')"),
    # fields left out before the refused one (no name, no cat) do not hide it
    ({"ph": "X", "ts": "soon", "dur": 1}, "(traceEvents[2].ts: Expected"),
    ({"ph": "X", "ts": {"at": 1}, "dur": 1}, "(traceEvents[2].ts: Expected `int | float | null`, got `object`)"),
    # args that are no object: refused as the whole field, with the types the field takes
    ({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": 5},
     "(traceEvents[2].args: Expected `object | null`, got `int`)"),
])
def test_an_event_missing_a_field_is_named_by_its_index(tmp_path, event, where):
    message = _broken(tmp_path, "e.json", _trace_bytes([_x(0), _x(1), event, _x(3)]))
    assert f"a Chrome-trace event lacks a usable field {where}" in message


def test_a_non_object_in_trace_events_is_named_by_its_index(tmp_path):
    message = _broken(tmp_path, "n.json", _trace_bytes([_x(0), _x(1), _x(2), 17, _x(4)]))
    assert message.endswith("(traceEvents[3]: Expected `object`, got `int`)")


@pytest.mark.processes
def test_the_cli_says_where_a_trace_broke_in_one_line_and_exits_1(tmp_path):
    path = tmp_path / "cut.json"
    path.write_bytes(_trace_bytes([_x(n) for n in range(50)])[:900])
    done = subprocess.run([sys.executable, "-m", "graphrt", "analyze", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: not a readable Chrome-trace JSON (it ends inside traceEvents")


def test_a_read_that_ends_anywhere_inside_a_value_reads_as_the_whole_file_does(tmp_path, monkeypatch):
    """Reads of every size from 40 bytes on end inside literals, numbers, escapes and multi-byte
    characters of the fields no event keeps: none of them reads as a break."""
    events = [_x(n, finished=n % 2 == 0, none=None, ratio=-1.5e-3 * n, note="caf\u00e9 \u20ac \\ \"q\" \U0001F600")
              for n in range(12)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, ensure_ascii=False), encoding="utf-8")
    whole = _rows(load_trace(path))
    for chunk in range(40, 400):
        monkeypatch.setattr(json_stream, "CHUNK", chunk)
        assert _rows(load_trace(path)) == whole, chunk
