"""The stream takes msgspec's errors by their types and positions, not their wording: read
through a decoder whose every error says something else (as a msgspec release might), a trace
reads to the same rows, and a broken one is refused at the same byte, event and field."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import msgspec
import pytest

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.read import json_stream

HEAD = b'{"schemaVersion": 1, "traceEvents": [\n'
DECODER = msgspec.json.Decoder  # the real one, which the tests replace with _Reworded


class _Reworded:
    """msgspec's JSON decoder, each of its errors of the same type with other words: the same
    words for the same error, so that two errors still read equal only where they are."""

    def __init__(self, type: type) -> None:
        self._decoder = DECODER(type)
        self.type = type

    def decode(self, data):
        try:
            return self._decoder.decode(data)
        except msgspec.MsgspecError as error:
            raise type(error)(f"reworded {hashlib.sha1(str(error).encode()).hexdigest()[:12]}") from None


def _event(n: int, **fields) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{n}", "pid": 1, "tid": 1, "ts": 10 * n, "dur": 5,
            "args": {"shapes": [{"a": 1}, {"b": 2}], "note": "},{"}, **fields}


def _trace(events: list[bytes]) -> bytes:
    return HEAD + b",\n".join(events) + b"\n]}"


def _said(path: Path) -> str:
    with pytest.raises(GraphrtError) as refused:
        load_trace(path)
    return str(refused.value)


def _rows(trace) -> list:
    return [list(table) for table in (trace.ranges, trace.kernels, trace.api_calls, trace.cpu_ops)]


EVENTS = [json.dumps(_event(n)).encode() for n in range(30)]
BROKEN = {
    "malformed": [*EVENTS[:17], EVENTS[17].replace(b'"dur": 5,', b'"dur": 5,,'), *EVENTS[18:]],
    "not utf-8": [*EVENTS[:9], EVENTS[9].replace(b'"op', b'"o\xffp'), *EVENTS[10:]],
    "a field's type": [*EVENTS[:20], json.dumps(_event(20, ts="soon")).encode(), *EVENTS[21:]],
    "an args field's type": [*EVENTS[:5], json.dumps({**_event(5), "args": {"stream": [7]}}).encode(), *EVENTS[6:]],
    "not an object": [*EVENTS[:3], b"17", *EVENTS[4:]],
    "junk between events": [*EVENTS[:12], b"\0\0", *EVENTS[12:]],
    "nested too deep": [*EVENTS[:7], EVENTS[7].replace(b'"args": {', b'"args": {"deep": ' + b"[" * 5000 + b"]" * 5000
                                                        + b", "), *EVENTS[8:]],
}


@pytest.mark.parametrize("chunk", [97, 1 << 20])
def test_a_trace_reads_to_the_same_rows_whatever_msgspec_s_errors_say(tmp_path, monkeypatch, chunk):
    """Cuts inside events (a `}` then `,` in a nested object or a string) fail to decode, and
    are told from a break by where they fail."""
    path = tmp_path / "t.json"
    path.write_bytes(_trace(EVENTS))
    monkeypatch.setattr(json_stream, "CHUNK", chunk)
    as_it_is = _rows(load_trace(path))
    monkeypatch.setattr(json_stream.msgspec.json, "Decoder", _Reworded)
    assert _rows(load_trace(path)) == as_it_is and len(as_it_is[3]) == len(EVENTS)


@pytest.mark.parametrize("chunk", [97, 1 << 20])
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_trace_is_refused_at_the_same_byte_event_and_field_whatever_msgspec_s_errors_say(
        tmp_path, monkeypatch, broken, chunk):
    path = tmp_path / "t.json"
    path.write_bytes(_trace(BROKEN[broken]))
    monkeypatch.setattr(json_stream, "CHUNK", chunk)
    as_it_is = _said(path)
    monkeypatch.setattr(json_stream.msgspec.json, "Decoder", _Reworded)
    reworded = _said(path)
    # up to the colon after the event (and its field): the file, the byte, the event, the field
    where = as_it_is[:as_it_is.index(": ", as_it_is.index("traceEvents["))]
    if broken == "nested too deep":  # how deep a decoder goes depends on the Python stack below it
        where, reworded = (re.sub(r"at byte [\d,]+", "at byte N", line) for line in (where, reworded))
    assert reworded.startswith(where + ": ")
    if "at byte" not in where:  # a field refused: what msgspec expects of it, told field by field
        assert reworded == as_it_is
