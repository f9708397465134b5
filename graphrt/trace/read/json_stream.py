"""The events of a Chrome-trace JSON (plain or gzip), a batch at a time, never the whole file.

    for first, batch in stream_events(path, Event, progress):   # batch: list[Event], decoded by msgspec
        ...                                                      # first: the index of batch[0]

A trace is `{..., "traceEvents": [event, event, ...], ...}` or a bare list of events. The bytes
before the list and after it (the head and the tail: schemaVersion, deviceProperties, ...) are
kept and parsed as one object with the list left empty (`head_and_tail`). The list itself is cut
into batches of about CHUNK bytes at an event's closing brace, each decoded by msgspec into the
caller's `Struct` (which names only the fields it needs: msgspec skips the rest without making
them). A cut is only tried at a `}` followed by `,` or `]`; one that falls inside an event (a
nested object followed by another) or past the list's end fails to decode, and an earlier one
is tried (before the byte the decoder stopped at, where it says).

A gzip file is inflated on a second thread (zlib releases the GIL) while this one decodes.
Where the input breaks, the GraphrtError names the file and the byte (of the inflated JSON, for
a gzip) or the event.
"""

from __future__ import annotations

import gzip
import json
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from graphrt.errors import GraphrtError
from graphrt.trace.read.events import Progress

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 4 << 20  # bytes per read and per decoded batch: ~13k kineto events
_CUT_TRIES = 8  # cuts tried, latest first, before a batch is taken to be broken
_WHITESPACE = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
# the tokens that shape a JSON document's head: strings (skipped whole) and punctuation
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]')
_AT_BYTE = re.compile(r"\(byte (\d+)\)")
_AT_EVENT = re.compile(r"at `\$\[(\d+)\](.*)`$")  # at `$[12]`, or at `$[12].args.stream`
LACKS_A_FIELD = "a Chrome-trace event lacks a usable field"
EXPECTED_FIELDS = "expected name, ts and dur on every complete ('X') event"

E = TypeVar("E")

NOT_A_TRACE = ("JSON but not a Chrome trace; expected a list of events with a 'ph' field, or an "
               "object holding one in 'traceEvents'")


def _chunks(path: Path, stop: threading.Event) -> Iterator[tuple[bytes, int]]:
    """(bytes of the JSON, bytes of the file read so far); a gzip is inflated on a thread."""
    with path.open("rb") as f:
        if f.read(2) != GZIP_MAGIC:
            f.seek(0)
            while chunk := f.read(CHUNK):
                yield chunk, f.tell()
            return
    inflated: queue.Queue = queue.Queue(maxsize=4)

    def inflate() -> None:
        def put(item: Any) -> None:
            while not stop.is_set():
                try:
                    return inflated.put(item, timeout=0.1)
                except queue.Full:
                    continue

        try:
            with path.open("rb") as raw, gzip.GzipFile(fileobj=raw) as g:
                while (chunk := g.read(CHUNK)) and not stop.is_set():
                    put((chunk, raw.tell()))
            put(None)
        except (OSError, EOFError, zlib.error) as e:
            put(e)

    threading.Thread(target=inflate, name="graphrt-inflate", daemon=True).start()
    inflated_bytes = 0
    while (item := inflated.get()) is not None:
        if isinstance(item, BaseException):
            raise GraphrtError(f"{path}: a gzip that breaks after {inflated_bytes:,} bytes of JSON ({item})")
        inflated_bytes += len(item[0])
        yield item


def _events_start(head: bytes) -> int | None:
    """Where the event list's first event may begin in `head` (after its `[`), or None if `head`
    does not reach it yet."""
    stripped = head.lstrip(_WHITESPACE)
    if stripped.startswith(_BOM):
        stripped = stripped[len(_BOM):].lstrip(_WHITESPACE)
    if stripped[:1] == b"[":
        return len(head) - len(stripped) + 1
    depth, key = 0, None
    for token in _TOKEN.finditer(head):
        t = token.group()
        if t in (b"{", b"["):
            if depth == 1 and t == b"[" and key == b'"traceEvents"':
                return token.end()
            depth, key = depth + 1, None
        elif t in (b"}", b"]"):
            depth -= 1
        elif t[:1] == b'"' and depth == 1:
            key = t if key is None else None  # a key, then the string value after its colon
        elif t == b",":
            key = None
    return None


def head_and_tail(path: Path, head: bytes, tail: bytes) -> Any:
    """The document with its event list left empty: its schemaVersion and the rest. `head` ends
    with the list's `[`, `tail` starts after its `]`."""
    try:
        return json.loads(head + b"]" + tail)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON ({e})") from None


def _next_cut(buf: bytes | bytearray, before: int) -> int:
    """The end of the latest `}` before `before` that a `,` or `]` follows, or -1."""
    i = buf.rfind(b"}", 0, before)
    while i >= 0:
        j = i + 1
        while j < len(buf) and buf[j] in _WHITESPACE:
            j += 1
        if j < len(buf) and buf[j] in b",]":
            return i + 1
        i = buf.rfind(b"}", 0, i)
    return -1


def _broken(path: Path, error: msgspec.MsgspecError, offset: int, first: int) -> GraphrtError:
    """One line for a batch that would not decode: `offset` is the byte of the JSON the batch
    began at, `first` the index of its first event."""
    message = str(error)
    if (at := _AT_EVENT.search(message)) is not None:
        what, where = message.split(" - at ")[0], f"traceEvents[{first + int(at.group(1))}]{at.group(2)}"
        if at.group(2):  # a field of the event
            return GraphrtError(f"{path}: {LACKS_A_FIELD} ({where}: {what}); {EXPECTED_FIELDS}")
        return GraphrtError(f"{path}: {NOT_A_TRACE} ({where}: {what})")
    if (at := _AT_BYTE.search(message)) is not None:
        byte = offset + int(at.group(1)) - 1  # less the "[" the batch was given
        return GraphrtError(f"{path}: not a readable Chrome-trace JSON (at byte {byte:,}, in or after "
                            f"traceEvents[{first}]: {_AT_BYTE.sub('', message).strip()})")
    return GraphrtError(f"{path}: not a readable Chrome-trace JSON ({message} in traceEvents[{first}] "
                        f"or after it, from byte {offset:,})")


def _document_without_events(path: Path, chunks: Iterator[tuple[bytes, int]]) -> tuple[bytes, int]:
    """(the bytes up to and with the event list's `[`, where in them its first event may begin);
    GraphrtError where the file has no event list."""
    buf = b""
    for chunk, _ in chunks:
        buf += chunk
        if (start := _events_start(buf)) is not None:
            return buf, start
    try:
        json.loads(buf)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON ({e})") from None
    raise GraphrtError(f"{path}: {NOT_A_TRACE}")


def stream_events(path: Path, event: type[E], progress: Progress | None = None,
                  out: dict | None = None) -> Iterator[tuple[int, list[E]]]:
    """The file's events as (index of the first, batch), each batch decoded into `event`.
    `out["document"]` is set, at the end, to the document without its events (`head_and_tail`)."""
    decoder = msgspec.json.Decoder(list[event])
    stop = threading.Event()
    chunks = _chunks(path, stop)
    try:
        buf, offset = _document_without_events(path, chunks)  # offset: the byte buf[0] is at
        head, buf = buf[:offset], buf[offset:]
        first = 0  # the index of the next event
        while True:
            stripped = buf.lstrip(_WHITESPACE + b",")
            offset, buf = offset + len(buf) - len(stripped), stripped
            if buf[:1] == b"]":
                break
            batch, cut = _decode_batch(path, decoder, buf, offset, first)
            if batch is None:
                chunk = next(chunks, None)
                if chunk is None:  # the rest of the file is the last batch, or broken
                    batch, cut = _last_batch(path, decoder, buf, offset, first)
                else:
                    buf += chunk[0]
                    if progress:
                        progress(chunk[1], first)
                    continue
            yield first, batch
            first, offset, buf = first + len(batch), offset + cut, buf[cut:]
        tail = buf[1:] + b"".join(c for c, _ in chunks)
        if out is not None:
            out["document"] = head_and_tail(path, head, tail)
    finally:
        stop.set()


def _decode_batch(path: Path, decoder: msgspec.json.Decoder, buf: bytes, offset: int,
                  first: int) -> tuple[list | None, int]:
    """(the events of `buf` up to the latest cut that decodes, the cut's end), or (None, 0)
    where no cut of the last few does: more bytes are needed, or the JSON is broken there."""
    cut = len(buf)
    for _ in range(_CUT_TRIES):
        if (cut := _next_cut(buf, cut)) <= 0:
            break
        try:
            return decoder.decode(b"[" + buf[:cut] + b"]"), cut
        except msgspec.ValidationError as e:  # the events before the cut are whole: this one is wrong
            raise _broken(path, e, offset, first) from None
        except msgspec.DecodeError as e:  # a cut inside an event, or past the list's end
            at = _AT_BYTE.search(str(e))
            cut = min(cut - 1, int(at.group(1)) - 1) if at else cut - 1
    return None, 0


def _last_batch(path: Path, decoder: msgspec.json.Decoder, buf: bytes, offset: int,
                first: int) -> tuple[list, int]:
    """The events left at the end of the file, up to the list's closing `]`."""
    end = buf.rfind(b"]")
    if end < 0:
        raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (it ends inside traceEvents, "
                           f"after {first:,} events and {offset + len(buf):,} bytes: cut short?)")
    try:
        return decoder.decode(b"[" + buf[:end] + b"]"), end
    except msgspec.MsgspecError as e:
        raise _broken(path, e, offset, first) from None
