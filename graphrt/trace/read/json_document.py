"""The parts of a Chrome-trace document around its event list, read with a bounded cost.

A trace is `{..., "traceEvents": [event, event, ...], ...}` or a bare list of events. The bytes
before the list (the head: schemaVersion, deviceProperties, ...) are scanned as they arrive for
the list's `[` (`ListStart`: each byte once, however the head is cut); the head and the bytes
after the list's `]` (the tail) are then parsed as one document with the list left empty
(`head_and_tail`). Neither may pass HELD_MAX bytes: a document whose head or tail is bigger than
any profiler writes (a gzip that inflates to far more than the disk, say) gets one line.

Where a document nests deeper than Python's parsers go, or breaks where a parser cannot say
which byte, `first_to_fail` finds the byte where it gives up, in a few parses of its prefixes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphrt.errors import GraphrtError

HELD_MAX = 64 << 20  # the most bytes held whole: an event, the document's head, its tail
_BLANKS = re.compile(rb"[ \t\r\n]*(?:\xef\xbb\xbf)?[ \t\r\n]*")  # before a document: blanks, a BOM
_PUNCTUATION = re.compile(rb'["{}\[\],:]')  # where the next token that shapes the head begins
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*')  # a string's bytes up to its closing quote

NOT_A_TRACE = ("JSON but not a Chrome trace; expected a list of events with a 'ph' field, or an "
               "object holding one in 'traceEvents'")
TOO_DEEP = "values nested deeper than can be read"


class ListStart:
    """Finds where the event list's first event may begin in a document's head (just after its
    `[`), the head given again with more bytes each time (`find`); bytes already scanned are not
    scanned again."""

    def __init__(self) -> None:
        self.pos = 0  # the next byte to scan
        self.depth = 0  # objects and lists open at `pos`
        self.key: bytes | None = None  # the key of the top-level value at `pos`, if it is one's
        self.string: int | None = None  # where the string `pos` is in began, if it is in one
        self.bare: bool | None = None  # whether the document is a bare list, once known

    def find(self, head: bytes | bytearray) -> int | None:
        """The index in `head` after the list's `[`, or None if `head` does not reach it yet."""
        if self.bare is None and (start := self._bare_list(head)) is not None:
            return start
        while self.pos < len(head):
            if self.string is not None:
                end = _STRING_REST.match(head, self.pos).end()  # type: ignore[union-attr]: always matches
                if end >= len(head) or head[end] != ord('"'):  # the string goes on past `head`
                    self.pos = end
                    return None
                if self.depth == 1:  # a key, then the string value after its colon
                    self.key = bytes(head[self.string:end + 1]) if self.key is None else None
                self.pos, self.string = end + 1, None
                continue
            token = _PUNCTUATION.search(head, self.pos)
            if token is None:
                self.pos = len(head)
                return None
            t, self.pos = token.group(), token.end()
            if t == b'"':
                self.string = token.start()
            elif t in (b"{", b"["):
                if self.depth == 1 and t == b"[" and self.key == b'"traceEvents"':
                    return self.pos
                self.depth, self.key = self.depth + 1, None
            elif t in (b"}", b"]"):
                self.depth -= 1
            elif t == b",":
                self.key = None
        return None

    def _bare_list(self, head: bytes | bytearray) -> int | None:
        """After the `[` that opens a bare list of events; None where the document is not one (or
        `head` holds nothing but blanks yet)."""
        end = _BLANKS.match(head, self.pos).end()  # type: ignore[union-attr]: always matches
        self.pos = end
        if end == len(head):
            return None
        self.bare = head[end] == ord("[")
        return end + 1 if self.bare else None


def parse(path: Path, document: bytes, where: Callable[[int], str]) -> Any:
    """The JSON `document` (a head and a tail, or what a file holds where it has no event list);
    GraphrtError where it is none, `where(i)` naming the byte of the file that `document[i]` is."""
    try:
        text = document.decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (at {where(e.start)}: not UTF-8)") from None
    except json.JSONDecodeError as e:  # e.pos counts characters of `text`; where() takes bytes
        at = len(text[:e.pos].encode())
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (at {where(at)}: {e.msg})") from None
    except RecursionError:
        at = first_to_fail(lambda n: json.loads(document[:n]), len(document), too_deep)
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (at {where(at)}: {TOO_DEEP})") from None


def head_and_tail(path: Path, head: bytes, tail: bytes, tail_at: int) -> Any:
    """The document with its event list left empty: its schemaVersion and the rest. `head` ends
    with the list's `[`, `tail` starts after its `]`, at byte `tail_at` of the file's JSON."""
    def where(i: int) -> str:
        byte = i if i < len(head) else tail_at + i - len(head) - 1
        return f"byte {byte:,}, {'before' if i < len(head) else 'after'} traceEvents"

    return parse(path, head + b"]" + tail, where)


def first_to_fail(parse_prefix: Callable[[int], Any], size: int, fails: Callable[[Exception], bool]) -> int:
    """The index of the byte where a parser starts to fail as `fails` says (nesting too deep, a
    string that is not UTF-8), given that it does on the first `size` bytes: `parse_prefix(n)`
    parses the first n bytes, failing so where they reach that byte (and in any other way, or
    not at all, where they stop short of it)."""
    lo, hi = 0, size  # parsing lo bytes does not fail so; parsing hi bytes does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            parse_prefix(mid)
        except Exception as e:  # a prefix cut anywhere is broken JSON, in any of many ways
            if fails(e):
                hi = mid
                continue
        lo = mid
    return hi - 1


def too_deep(error: Exception) -> bool:
    return isinstance(error, RecursionError)
