"""Where a Chrome trace breaks, one line names the byte and the event, wherever the break falls:
in the first batch the stream decodes or a later one, on either side of the cut between two
batches, plain or gzip. Hostile shapes (nesting deeper than a parser goes, an event, head or
tail bigger than any profiler writes, a gzip that inflates to junk) each get one line, after
reading no more than they must."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from itertools import accumulate
from pathlib import Path

import pytest

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.read.json_document import HELD_MAX
from graphrt.trace.read.json_stream import CHUNK

HEAD = b'{"schemaVersion": 1, "traceEvents": [\n'
SEPARATOR = b",\n"


def _event(n: int) -> bytes:
    """An event whose args hold objects in a list: a `}` then `,` inside it, where a cut fails."""
    return json.dumps({"ph": "X", "cat": "cpu_op", "name": f"op{n}", "pid": 1, "tid": 1, "ts": 10 * n, "dur": 5,
                       "args": {"shapes": [{"a": 1}, {"b": 2}]}}).encode()


EVENTS = [_event(n) for n in range(3 * CHUNK // len(_event(0)))]  # three batches' worth
STARTS = list(accumulate((len(e) + len(SEPARATOR) for e in EVENTS[:-1]), initial=len(HEAD)))  # each event's byte
# the last event the first read holds whole: the first batch ends with it, the second begins after
CUT = max(n for n, start in enumerate(STARTS) if start + len(EVENTS[n]) < CHUNK)


def _file(tmp_path: Path, content: bytes, packed: bool) -> Path:
    path = tmp_path / ("trace.json.gz" if packed else "trace.json")
    path.write_bytes(gzip.compress(content, 1) if packed else content)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(GraphrtError) as refused:
        load_trace(path)
    return str(refused.value)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("n", [0, CUT - 1, CUT, CUT + 1, 2 * CUT + 1, len(EVENTS) - 1])
def test_malformed_json_names_its_byte_and_event_in_any_batch(tmp_path, n, packed):
    events = list(EVENTS)
    events[n] = events[n].replace(b'"dur": 5,', b'"dur": 5,,')
    at = STARTS[n] + events[n].index(b",,") + 1
    message = _refusal(_file(tmp_path, HEAD + SEPARATOR.join(events) + b"\n]}", packed))
    assert f"not a readable Chrome-trace JSON (at byte {at:,}, in traceEvents[{n}]: JSON is malformed" in message


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("n", [CUT, CUT + 1, len(EVENTS) - 1])
def test_a_field_of_the_wrong_type_names_its_event_in_any_batch(tmp_path, n, packed):
    events = list(EVENTS)
    events[n] = events[n].replace(b'"ts": ', b'"ts": "at ', 1).replace(b', "dur"', b'", "dur"', 1)
    message = _refusal(_file(tmp_path, HEAD + SEPARATOR.join(events) + b"\n]}", packed))
    assert f"a Chrome-trace event lacks a usable field (traceEvents[{n}].ts: Expected `int | float | null`" in message


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("n", [CUT, CUT + 1, 2 * CUT + 3])
def test_a_name_that_is_not_utf8_names_its_event_and_the_byte_its_string_ends_at(tmp_path, n, packed):
    events = list(EVENTS)
    events[n] = events[n].replace(b'"op', b'"o\xffp', 1)
    ends = STARTS[n] + events[n].index(b'"', events[n].index(b"\xff"))  # msgspec checks a string as it closes
    message = _refusal(_file(tmp_path, HEAD + SEPARATOR.join(events) + b"\n]}", packed))
    assert message.endswith(f"(at byte {ends:,}, in traceEvents[{n}]: Invalid UTF-8 encoded string)")


def test_junk_where_an_event_should_begin_names_its_byte_at_once(tmp_path):
    events = HEAD + SEPARATOR.join(EVENTS[:CUT + 2]) + SEPARATOR
    message = _refusal(_file(tmp_path, events + b"\0" * (4 * CHUNK), packed=True))
    assert f"(at byte {len(events):,}, in traceEvents[{CUT + 2}]: JSON is malformed: invalid character)" in message


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("where, document, said", [
    ("after", HEAD + SEPARATOR.join(EVENTS[:3]) + b'\n], "deep": ' + DEEP + b"}", "after traceEvents"),
    ("before", b'{"deep": ' + DEEP + b', "traceEvents": [' + b",".join(EVENTS[:3]) + b"]}", "before traceEvents"),
    ("inside", HEAD + SEPARATOR.join([*EVENTS[:CUT + 1], EVENTS[CUT + 1].replace(b'"args": {', b'"args": {"deep": '
                                                                             + DEEP + b", "), *EVENTS[CUT + 2:]]) + b"\n]}", ""),
])
def test_nesting_deeper_than_a_parser_goes_is_one_line_naming_where_it_starts_to_fail(tmp_path, where, document, said):
    message = _refusal(_file(tmp_path, document, packed=False))
    at = re.search(r"not a readable Chrome-trace JSON \(at byte ([\d,]+), (.*): values nested deeper than can be "
                   r"read\)$", message)
    byte = int(at.group(1).replace(",", ""))
    assert document[byte:byte + 1] == b"["  # the bracket that opens one level too many
    deep_from = document.index(b"[[[")
    assert deep_from < byte < deep_from + len(DEEP) // 2
    assert at.group(2) == (said or f"in traceEvents[{CUT + 1}]")


@pytest.mark.processes
def test_the_cli_refuses_a_trace_nested_too_deep_after_its_events_in_one_line(tmp_path):
    path = _file(tmp_path, HEAD + SEPARATOR.join(EVENTS[:3]) + b'\n], "deep": ' + DEEP + b"}", packed=False)
    done = subprocess.run([sys.executable, "-m", "graphrt", "analyze", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: not a readable Chrome-trace JSON (at byte ")
    assert line.endswith(", after traceEvents: values nested deeper than can be read)")


@pytest.mark.parametrize("content, said", [
    (HEAD + b'{"ph": "X", "name": "' + b"a" * (HELD_MAX + CHUNK) + b'"}]}',
     f"(traceEvents[0], from byte {len(HEAD):,}, runs past {HELD_MAX >> 20} MiB: no event is that long)"),
    (b'{"note": "' + b"a" * (HELD_MAX + CHUNK) + b'", "traceEvents": []}',
     f"(no event list in its first {HELD_MAX >> 20} MiB)"),
    (b'{"traceEvents": [], "note": "' + b"a" * (HELD_MAX + CHUNK) + b'"}',
     f"(more than {HELD_MAX >> 20} MiB after traceEvents, from byte 18: no profiler writes that)"),
])
def test_a_gzip_that_inflates_to_more_than_any_profiler_writes_is_refused_in_one_line(tmp_path, content, said):
    assert _refusal(_file(tmp_path, content, packed=True)).endswith(said)


def test_blanks_between_events_are_read_past_however_many(tmp_path):
    content = HEAD + EVENTS[0] + SEPARATOR + b" " * (HELD_MAX + CHUNK) + EVENTS[1] + b"\n]}"
    assert [op.name for op in load_trace(_file(tmp_path, content, packed=True)).cpu_ops] == ["op0", "op1"]
