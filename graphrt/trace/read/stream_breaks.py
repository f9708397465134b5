"""Where a batch of a Chrome trace's events breaks, and what is wrong there, found from msgspec's
errors by their types and positions, never by their wording (which a release may change).

msgspec reads a document front to back and stops at its first error, so decoding a longer prefix
of the same bytes gives the very same error, and a shorter one that stops before the offending
byte gives another (its input ran out) or none. `break_at` finds that byte by bisection, with
the error itself as the test; what an input that runs out gives is measured on `[` alone
(`ran_out`), not known as words. The event a byte falls in is counted by walking the events with
Python's own JSON parser (`event_at`), and the field an event's Struct refuses found by
decoding its fields one at a time with msgspec, by msgspec's own rules for numbers
(`wrong_field`), the event read as far as that byte (`value_up_to`). All of it runs only once a batch has failed to decode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, get_args

import msgspec

from graphrt.trace.read.json_document import first_to_fail, too_deep

_BLANKS = re.compile(r"[ \t\r\n]*")
_SEPARATOR = re.compile(r"[ \t\r\n]*,?[ \t\r\n]*")  # between two events
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')  # a string (maybe unclosed), or a bracket


def ran_out(decode: Callable[[bytes], Any]) -> str:
    """What `decode` says where its input ends inside the event list (decoding `[` alone)."""
    try:
        decode(b"[")
    except msgspec.MsgspecError as error:
        return str(error)
    raise AssertionError("a list that is never closed decoded")


def break_at(error: Exception, decode_prefix: Callable[[int], Any], size: int, ran_out_said: str) -> int:
    """The index of the byte at which decoding the first `size` bytes fails as `error` says,
    `decode_prefix(n)` decoding the first n of them; `size` where the input ran out (the bytes
    are all well-formed as far as they go)."""
    if isinstance(error, RecursionError):
        return first_to_fail(decode_prefix, size, too_deep)
    said = str(error)
    if said == ran_out_said:
        return size

    def fails_so(n: int) -> bool:  # whether the first n bytes fail as `error` says
        try:
            decode_prefix(n)
        except (msgspec.MsgspecError, RecursionError) as other:
            return isinstance(other, type(error)) and str(other) == said
        return False

    if not fails_so(size - 1):  # the last byte breaks it (as a cut inside an event does): one decode, not a bisection
        return size - 1
    return first_to_fail(decode_prefix, size - 1, lambda e: isinstance(e, type(error)) and str(e) == said)


def event_at(events: bytes | bytearray, at: int) -> tuple[int, int]:
    """(the index among `events` of the event byte `at` falls in, the byte where that event
    begins). `events` is a list's `[` and the events after it; a byte between two events counts
    as the next one's."""
    text = events.decode("latin-1")  # one character a byte, so an index is a byte's; JSON's syntax is ASCII
    parser, i, n = json.JSONDecoder(), _BLANKS.match(text, 1).end(), 0  # type: ignore[union-attr]
    while True:
        try:
            end = parser.raw_decode(text, i)[1]
        except (ValueError, RecursionError):  # broken, or nested too deep: the event `at` is in
            return n, i
        if end > at:
            return n, i
        following = _SEPARATOR.match(text, end).end()  # type: ignore[union-attr]: always matches
        if following > at:
            return n + 1, following
        i, n = following, n + 1


def value_up_to(events: bytes | bytearray, start: int, at: int) -> msgspec.Raw | None:
    """The value that begins at byte `start`, as far as byte `at` (a field's value a decoder
    refused ends there, and what follows it may not have come yet), its objects and lists closed
    there, as msgspec's raw JSON; None where that is not JSON either."""
    text = events[start:at + 1].decode("latin-1").rstrip(" \t\r\n,:")
    closers = []
    for token in _STRING_OR_BRACKET.findall(text):
        if token in "[{":
            closers.append("]" if token == "[" else "}")
        elif token in "]}" and closers:
            closers.pop()
    closed = (text + "".join(reversed(closers))).encode("latin-1")
    try:
        return msgspec.json.decode(closed, type=msgspec.Raw)  # well-formed, or None
    except (msgspec.MsgspecError, RecursionError):
        return None


def wrong_field(value: msgspec.Raw, struct: type[msgspec.Struct]) -> tuple[str, str]:
    """(the path of the field of `value` that `struct` refuses, such as `.args.stream`, and what
    msgspec expected there); ("", why) where it refuses the value as a whole (not an object, a
    required field missing). Each field is decoded from its own JSON by msgspec, whose rules for
    numbers (a float past 1e308, an integer past 64 bits) are the ones that refused it."""
    fields = _fields(value)
    if fields is not None:
        for field in msgspec.structs.fields(struct):
            if field.encode_name not in fields:
                continue
            inner = fields[field.encode_name]
            try:
                msgspec.json.decode(inner, type=field.type)
            except msgspec.ValidationError as error:
                nested = next((t for t in get_args(field.type) if isinstance(t, type) and
                               issubclass(t, msgspec.Struct)), None)
                if nested is not None and _fields(inner) is not None:
                    path, what = wrong_field(inner, nested)
                    return f".{field.encode_name}{path}", what
                return f".{field.encode_name}", str(error)
    try:
        msgspec.json.decode(value, type=struct)
    except msgspec.ValidationError as error:
        return "", str(error)
    return "", "refused by the JSON decoder, though each of its fields converts"


def _fields(value: msgspec.Raw) -> dict[str, msgspec.Raw] | None:
    """An object's fields, each as its raw JSON; None where `value` is no object."""
    try:
        return msgspec.json.decode(value, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        return None
