"""The events of a Chrome-trace JSON (plain or gzip), a batch at a time, never the whole file.

    for first, batch in stream_events(path, Event, progress):   # batch: list[Event], decoded by msgspec
        ...                                                      # first: the index of batch[0]

The document around the event list is read by graphrt.trace.read.json_document. The list itself
is read CHUNK bytes at a time into one buffer and cut into batches at an event's closing brace,
each decoded by msgspec, in place, into the caller's `Struct` (which names only the fields it
needs: msgspec skips the rest without making them). A cut is only tried at a `}` followed by `,`
or `]`. One inside an event (a nested object followed by another) fails to decode at the cut or
runs out of input there, one past the list's end fails after the list has closed, and an earlier
one is tried; a batch that fails anywhere else is broken there. Where a decode fails is found
from msgspec's errors by their types and positions, not their wording
(graphrt.trace.read.stream_breaks). Where no cut decodes (an event longer than the
buffer), more bytes are read, and tried once the buffer has doubled: an event of n bytes costs
O(n) whatever is inside it, and one of more than HELD_MAX bytes is refused.

A gzip file is inflated on a second thread (zlib releases the GIL) while this one decodes.
Where the input breaks, the GraphrtError names the file, the byte (of the inflated JSON, for a
gzip) and the event.
"""

from __future__ import annotations

import gzip
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar, get_args

import msgspec

from graphrt.errors import GraphrtError
from graphrt.trace.read.events import Progress
from graphrt.trace.read.json_document import HELD_MAX, NOT_A_TRACE, TOO_DEEP, ListStart, head_and_tail, parse
from graphrt.trace.read.stream_breaks import break_at, event_at, ran_out, value_up_to, wrong_field

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 20  # bytes per read, and about per decoded batch (~4k kineto events)
_CUT_TRIES = 8  # cuts tried, latest first, before more bytes are read
_BLANKS = re.compile(rb"[ \t\r\n]*")
_WORD = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-\\"  # a number's, a literal's, an escape's
LACKS_A_FIELD = "a Chrome-trace event lacks a usable field"
EXPECTED_FIELDS = "expected name, ts and dur on every complete ('X') event"
_OPEN, _CLOSE = ord("["), ord("]")

E = TypeVar("E")


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
                # read1, not read: a read that meets the stream's cut end raises and drops what it
                # inflated, so a gzip cut short would seem to break bytes before it does
                while (chunk := g.read1(CHUNK)) and not stop.is_set():
                    put((chunk, raw.tell()))
            put(None)
        except (OSError, EOFError, zlib.error) as e:
            put(e)

    threading.Thread(target=inflate, name="graphrt-inflate", daemon=True).start()
    inflated_bytes = 0
    while (item := inflated.get()) is not None:
        if isinstance(item, EOFError):  # the stream ends before its end-of-stream marker
            raise GraphrtError(f"{path}: a truncated gzip stream: it ends after {inflated_bytes:,} inflated bytes "
                               "of JSON, before its end-of-stream marker (a copy cut short?)")
        if isinstance(item, BaseException):
            raise GraphrtError(f"{path}: a gzip that breaks after {inflated_bytes:,} inflated bytes of JSON ({item})")
        inflated_bytes += len(item[0])
        yield item
    if not inflated_bytes:
        raise GraphrtError(f"{path}: an empty gzip: it inflates to 0 bytes, no trace in it")


def _head(path: Path, chunks: Iterator[tuple[bytes, int]]) -> tuple[bytearray, int]:
    """(the bytes read so far, the index in them just after the event list's `[`); GraphrtError
    where the file has no event list."""
    buf, start = bytearray(), ListStart()
    for chunk, _ in chunks:
        buf += chunk
        if (found := start.find(buf)) is not None:
            return buf, found
        if len(buf) > HELD_MAX:
            raise GraphrtError(f"{path}: {NOT_A_TRACE} (no event list in its first {HELD_MAX >> 20} MiB)")
    parse(path, bytes(buf), lambda i: f"byte {i:,}")
    raise GraphrtError(f"{path}: {NOT_A_TRACE}")


def _next_cut(buf: bytearray, before: int) -> int:
    """The end of the latest `}` before `before` that a `,` or `]` follows, or -1."""
    i = buf.rfind(b"}", 0, before)
    while i >= 0:
        j = _BLANKS.match(buf, i + 1).end()  # type: ignore[union-attr]: always matches
        if j < len(buf) and buf[j] in b",]":
            return i + 1
        i = buf.rfind(b"}", 0, i)
    return -1


def _probe_end(buf: bytearray) -> int:
    """Where a decode of an unfinished buffer may end to find a break in what has come: not
    inside a number, a literal or an escape, which would read as broken there (0 where the
    buffer ends in a long one)."""
    end = len(buf) - 1
    while end > 1 and buf[end - 1] in _WORD and len(buf) - end < 64:
        end -= 1
    return 0 if buf[end - 1] in _WORD else end


class _Pending:
    """The bytes of the event list read and not yet decoded: `buf[0]` is a `[` (the list's own, or
    put in place of the comma after the last event decoded), and `buf[i]` is byte `base + i` of
    the JSON; `first` is the index of the first event in it."""

    def __init__(self, path: Path, decoder: msgspec.json.Decoder, buf: bytearray, base: int) -> None:
        self.path, self.decoder, self.buf, self.base, self.first = path, decoder, buf, base, 0
        self.ran_out = ran_out(decoder.decode)  # what the decoder says where its input ends

    def decode(self, end: int) -> list:
        """The events of buf[1:end], a `]` put at `end` while msgspec reads them in place."""
        buf = self.buf
        kept, buf[end] = buf[end], _CLOSE
        try:
            with memoryview(buf) as view, view[:end + 1] as events:
                return self.decoder.decode(events)
        finally:
            buf[end] = kept

    def _decode_prefix(self, n: int) -> list:
        """The first n bytes of the buffer decoded as they stand (unclosed, they break)."""
        with memoryview(self.buf) as view, view[:n] as part:
            return self.decoder.decode(part)

    def batch(self) -> list | None:
        """The events up to the latest cut that decodes, taken out of the buffer; None where no
        cut of the last few does. GraphrtError where the events break."""
        buf, cut = self.buf, len(self.buf)
        for _ in range(_CUT_TRIES):
            if (cut := _next_cut(buf, cut)) <= 1:
                if (end := _probe_end(buf)) > 1:  # no cut: decoded only to find a break in what has come
                    self._attempt(end)
                return None
            events, cut = self._attempt(cut)
            if events is not None:
                self.first += len(events)
                after = _BLANKS.match(buf, cut).end()  # type: ignore[union-attr]: the `,` or `]` after the cut
                self._drop(after if buf[after] == ord(",") else after - 1)  # the `]` stays, to be seen
                return events
        return None

    def _attempt(self, end: int) -> tuple[list | None, int]:
        """(the events of buf[1:end], end); (None, where to look for a cut next) where `end` falls
        inside an event or past the list's end; GraphrtError where they break before `end`."""
        try:
            return self.decode(end), end
        except (msgspec.MsgspecError, RecursionError) as error:
            at = self._break_at(error, end)
            if at < end and not self._list_ends_before(at):
                raise self._refusal(error, at) from None
            return None, min(end, at) - 1

    def _break_at(self, error: Exception, end: int) -> int:
        """The byte where decoding buf[1:end] (a `]` put at `end`) breaks as `error` says: before
        `end` where the events there break; `end` or past it where the cut is the cause (it falls
        inside an event, or the input runs out there)."""
        kept, self.buf[end] = self.buf[end], _CLOSE
        try:
            return break_at(error, self._decode_prefix, end + 1, self.ran_out)
        finally:
            self.buf[end] = kept

    def _list_ends_before(self, at: int) -> bool:
        """Whether the event list closes before byte `at` (a cut past its end: what follows it is
        the document's, not an event's)."""
        try:
            self._decode_prefix(at)
        except (msgspec.MsgspecError, RecursionError):
            return False
        return True

    def ended(self) -> bool:
        """Whether the list's `]` is all that is left of it, blanks aside (dropped)."""
        end = _BLANKS.match(self.buf, 1).end()  # type: ignore[union-attr]: always matches
        if end > 1:
            self._drop(end - 1)
        return len(self.buf) > 1 and self.buf[1] == _CLOSE

    def _drop(self, n: int) -> None:
        """Take the first n bytes out of the buffer, the byte that follows them becoming its `[`."""
        del self.buf[:n]
        self.base += n
        self.buf[0] = _OPEN

    def _refusal(self, error: Exception, at: int) -> GraphrtError:
        """One line for events that break at byte `at`: the event, and the byte or the field."""
        index, start = event_at(self.buf, at)
        where, path = f"traceEvents[{self.first + index}]", self.path
        if isinstance(error, msgspec.ValidationError):  # well-formed, but not what an event holds
            event = value_up_to(self.buf, start, at)
            field, what = wrong_field(event, get_args(self.decoder.type)[0]) if event is not None else ("", str(error))
            if field:
                return GraphrtError(f"{path}: {LACKS_A_FIELD} ({where}{field}: {what}); {EXPECTED_FIELDS}")
            return GraphrtError(f"{path}: {NOT_A_TRACE} ({where}: {what})")
        # msgspec's own account of a malformed byte, less where it says it is (this line says that)
        what = TOO_DEEP if isinstance(error, RecursionError) else str(error).removesuffix(f" (byte {at})")
        return GraphrtError(f"{path}: not a readable Chrome-trace JSON (at byte {self.base + at:,}, in {where}: {what})")

    def last_batch(self) -> list:
        """The events left at the end of the file, up to its last `]`: the list's end, or the
        file is broken (cut short, or where msgspec says)."""
        if (end := self.buf.rfind(b"]", 1)) > 0 and (events := self._attempt(end)[0]) is not None:
            self.first += len(events)
            self._drop(end - 1)
            return events
        raise GraphrtError(f"{self.path}: not a readable Chrome-trace JSON (it ends inside traceEvents, after "
                           f"{self.first:,} events and {self.base + len(self.buf):,} bytes: cut short?)")


def stream_events(path: Path, event: type[E], progress: Progress | None = None,
                  out: dict | None = None) -> Iterator[tuple[int, list[E]]]:
    """The file's events as (index of the first, batch), each batch decoded into `event`.
    `out["document"]` is set, at the end, to the document without its events (`head_and_tail`)."""
    stop = threading.Event()
    chunks = _chunks(path, stop)
    try:
        buf, start = _head(path, chunks)
        head = bytes(buf[:start])
        pending = _Pending(path, msgspec.json.Decoder(list[event]), buf[start - 1:], start - 1)
        del buf
        retry_at = 0  # decode again once the buffer is this long (it doubles after a failed try)
        while not pending.ended():
            if len(pending.buf) >= retry_at:
                first = pending.first
                if (batch := pending.batch()) is not None:
                    retry_at = 0
                    yield first, batch
                    continue
                retry_at = 2 * len(pending.buf)
            if (chunk := next(chunks, None)) is None:  # the rest of the file is the last batch, or broken
                first = pending.first
                yield first, pending.batch() or pending.last_batch()
                continue
            if len(pending.buf) > HELD_MAX:
                begins = pending.base + _BLANKS.match(pending.buf, 1).end()  # type: ignore[union-attr]: always matches
                raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (traceEvents[{pending.first:,}], from "
                                   f"byte {begins:,}, runs past {HELD_MAX >> 20} MiB: no event is that long)")
            pending.buf += chunk[0]
            if progress:
                progress(chunk[1], pending.first)
        tail = _tail(path, pending, chunks)
        if out is not None:
            out["document"] = head_and_tail(path, head, tail, pending.base + 2)
    finally:
        stop.set()


def _tail(path: Path, pending: _Pending, chunks: Iterator[tuple[bytes, int]]) -> bytes:
    """What follows the event list's `]`, at most HELD_MAX bytes of it."""
    tail = bytearray(pending.buf[2:])
    for chunk, _ in chunks:
        tail += chunk
        if len(tail) > HELD_MAX:
            raise GraphrtError(f"{path}: not a readable Chrome-trace JSON (more than {HELD_MAX >> 20} MiB after "
                               f"traceEvents, from byte {pending.base + 2:,}: no profiler writes that)")
    return bytes(tail)
