"""The document around a Chrome trace's event list: the list's `[` found at the top level however
the head arrives, and a head or tail that cannot be read refused naming the file and the byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrt.errors import GraphrtError
from graphrt.trace.read.json_document import ListStart, head_and_tail

# a number cut anywhere, a nested "traceEvents" after a closed inner value, a string value: only
# the top-level key's list is the event list
HEAD = (b'{"schemaVersion": 1234, "meta": {"a": {"b": []}, "traceEvents": [1]}, "note": "x",'
        b' "traceEvents": [')


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(HEAD)])
def test_the_event_list_is_found_after_the_top_level_key_however_the_head_is_cut(step):
    document, start = HEAD + b'{"ph": "X"}]}', ListStart()
    found = next(at for n in range(step, len(document) + step, step) if (at := start.find(document[:n])) is not None)
    assert found == len(HEAD)


@pytest.mark.parametrize("head", [b'{"meta": {"a": "x"}, "traceEvents": [', b'{"a": ["x"], "traceEvents": ['])
def test_a_string_just_before_a_closing_bracket_leaves_the_bracket_counted(head):
    assert ListStart().find(head + b'{"ph": "X"}]}') == len(head)


DEEP = b"[" * 100_000 + b"]" * 100_000


def _refusal(head: bytes, tail: bytes, tail_at: int) -> str:
    with pytest.raises(GraphrtError) as refused:
        head_and_tail(Path("trace.json"), head, tail, tail_at)
    return str(refused.value)


def _byte(message: str, where: str) -> int:
    prefix = "trace.json: not a readable Chrome-trace JSON (at byte "
    assert message.startswith(prefix)
    said, rest = message[len(prefix):].split(", ", 1)
    assert rest == f"{where} traceEvents: values nested deeper than can be read)"
    return int(said.replace(",", ""))


def test_nesting_too_deep_is_named_at_the_same_bracket_before_the_events_or_after_them():
    # the same value under a top-level key, once in the head and once in the tail: a parser gives
    # up at the same bracket of it, which lies at tail_at + its place in the tail
    head = b'{"deep": ' + DEEP + b', "traceEvents": ['
    before = _byte(_refusal(head, b"}", 40), "before") - head.index(b"[")
    tail, tail_at = b', "deep": ' + DEEP + b"}", 123_456
    after = _byte(_refusal(b'{"traceEvents": [', tail, tail_at), "after") - tail_at - tail.index(b"[")
    assert 0 < before == after < len(DEEP) // 2


def test_a_tail_that_is_not_json_is_refused_naming_the_file_and_its_byte():
    # the tail starts at byte 40 of the file; its `}` where a value belongs is its 8th byte
    message = _refusal(b'{"traceEvents": [', b', "x": }', 40)
    assert message == "trace.json: not a readable Chrome-trace JSON (at byte 47, after traceEvents: Expecting value)"


def test_a_byte_after_characters_of_several_bytes_is_counted_in_bytes():
    # "é" is two bytes of UTF-8: the `]` where a value belongs is byte 17 of the head, character 16
    message = _refusal(b'{"x": "\xc3\xa9", "y": ], "traceEvents": [', b"}", 40)
    assert message == "trace.json: not a readable Chrome-trace JSON (at byte 17, before traceEvents: Expecting value)"


def test_a_head_that_is_not_utf8_is_refused_at_its_first_bad_byte():
    message = _refusal(b'{"x": "\xff", "traceEvents": [', b"}", 40)
    assert message == "trace.json: not a readable Chrome-trace JSON (at byte 7, before traceEvents: not UTF-8)"
