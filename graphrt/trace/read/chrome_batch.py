"""A batch of decoded Chrome-trace events into a trace's columns at once: each field taken from
the batch's events as one list, its numbers made integers by numpy, instead of a Python call per
event.

The rules are graphrt.trace.read.chrome_events'. A batch whose fields have the usual shapes
(integers, or finite floats for times; a name on every event read) is put in here with the
same figures `add_event` gives; one where any field has another shape (a missing name or
timestamp, a thread given as a label, a number out of int64's reach) is left to `add_event`,
event by event, which says which event and field are wrong.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np

from graphrt.trace.read.chrome_events import (GRAPH_ID_BOUND, NO_ARGS, TABLE_OF, Event, Into, UnusableField,
                                              python_kind, thread)
from graphrt.trace.read.columns import ABSENT, Table
from graphrt.trace.read.events import PYTHON_DOMAIN, Trace

_INT64 = np.dtype(np.int64)
_EXACT = float(2**53)  # below it a float holds every integer: an int read as one is exact


class _Irregular(Exception):
    """A field of the batch has a shape `add_event` must read event by event."""


def add_batch(trace: Trace, batch: list[Event], names: dict[str, str], kinds: dict[str | None, Into]) -> bool:
    """Put the batch's complete events into the trace's columns and return True; or return False,
    having put nothing in, where a field has a shape other than the usual. `names` interns each
    distinct name; `kinds` is each python function's `python_kind`, by name."""
    try:
        columns = _columns(trace, [e for e in batch if e.ph == "X"], names, kinds)
    except _Irregular:
        return False
    for table, fields in columns:
        table.extend(**fields)
    return True


def _columns(trace: Trace, complete: list[Event], names: dict[str, str],
             kinds: dict[str | None, Into]) -> list[tuple[Table, dict[str, Any]]]:
    """Each table's new rows as columns, in the order of the file."""
    if not complete:
        return []
    start = _ns([e.ts for e in complete])
    durations = [e.dur for e in complete]
    length = _ns(durations) if None not in durations else _ns([d or 0 for d in durations])
    if np.any(length < 0):
        raise _Irregular  # the event-by-event rules refuse a negative duration by its event
    end = start + length
    category = np.fromiter(map(TABLE_OF.get, [e.cat for e in complete], repeat(Into.NONE)), np.int8, len(complete))
    table = _python_kept(category, complete, kinds)
    out = []
    for into in (Into.RANGE, Into.FRAME, Into.OP, Into.API, Into.KERNEL):
        rows = np.flatnonzero(table == into)
        if not len(rows):
            continue
        events = [complete[i] for i in rows.tolist()]
        times = {"start_ns": start[rows], "end_ns": end[rows]}
        if into == Into.KERNEL:
            out.append((trace.kernels, _kernels(events, times, names)))
        elif into == Into.API:
            out += _api_calls(trace, events, times, names)
        else:
            fields = {**times, **_threads(events), "name": _interned([e.name for e in events], names)}
            if into == Into.OP:
                out.append((trace.cpu_ops, fields))
            else:  # a range: a record_function's, or a python function's
                domains = ["" if c == Into.RANGE else PYTHON_DOMAIN for c in category[rows].tolist()]
                out.append((trace.ranges if into == Into.RANGE else trace.frames, {**fields, "domain": domains}))
    return out


def _python_kept(category: np.ndarray, complete: list[Event], kinds: dict[str | None, Into]) -> np.ndarray:
    """The table of each event (an `Into`): its category's, where a python function's is the
    one its name says (`python_kind`)."""
    table = category.copy()
    rows = np.flatnonzero(category == Into.PYTHON)
    names = [complete[i].name for i in rows.tolist()]
    found = list(map(kinds.get, names))
    if None in found:  # names not seen before: each told once
        kinds.update((name, python_kind(name) if name is not None else Into.NONE) for name in set(names) - kinds.keys())
        found = list(map(kinds.get, names))
    table[rows] = np.array(found, dtype=np.int8)
    return table


def _api_calls(trace: Trace, events: list[Event], times: dict[str, np.ndarray],
               names: dict[str, str]) -> list[tuple[Table, dict[str, Any]]]:
    """The runtime and driver calls that carry a correlation id (the others launch nothing)."""
    called = _interned([e.name for e in events], names)  # every call needs a name, kept or not
    args = [e.args or NO_ARGS for e in events]
    correlations = [a.correlation for a in args]
    if None in correlations:
        rows = np.flatnonzero([c is not None for c in correlations])
        events, args, called = ([column[i] for i in rows.tolist()] for column in (events, args, called))
        times = {field: column[rows] for field, column in times.items()}
        correlations = [a.correlation for a in args]
    if not events:
        return []
    return [(trace.api_calls, {**times, **_threads(events), "correlation_id": _ints(correlations), "name": called,
                               "kernel": [names.setdefault(a.kernel, a.kernel) if a.kernel else "" for a in args]})]


def _kernels(events: list[Event], times: dict[str, np.ndarray], names: dict[str, str]) -> dict[str, Any]:
    args = [e.args or NO_ARGS for e in events]
    streams, correlations = [a.stream for a in args], [a.correlation for a in args]
    node, graph = _ints([a.graph_node or 0 for a in args]), _ints([a.graph or 0 for a in args])
    if np.any(np.abs(graph) >= GRAPH_ID_BOUND):
        raise _Irregular  # the event-by-event rules refuse it by its event
    return {**times, "device": _ints([a.device or 0 for a in args]),
            "stream": _ints([ABSENT if s is None else s for s in streams] if None in streams else streams),
            "correlation_id": _ints([-1 if c is None else c for c in correlations] if None in correlations
                                    else correlations),
            "launch": np.full(len(events), ABSENT), "graph_id": np.full(len(events), ABSENT),
            "graph_node_id": np.where(node == 0, ABSENT,
                                      np.where(graph != 0, (graph << 32) | (node & 0xFFFF_FFFF), node)),
            "name": _interned([e.name for e in events], names)}


def _threads(events: list[Event]) -> dict[str, np.ndarray]:
    """pid and tid, labels given their stable numbers (`thread`)."""
    out = {}
    for field, values in (("pid", [e.pid for e in events]), ("tid", [e.tid for e in events])):
        try:
            out[field] = _ints(values)
        except _Irregular:
            try:
                out[field] = _ints([thread(v, field) for v in values])
            except UnusableField:
                raise _Irregular from None  # add_event refuses it, naming its event
    return out


def _ints(values: list) -> np.ndarray:
    """The values as int64, where every one is an int that fits."""
    try:
        column = np.array(values)
    except OverflowError:
        raise _Irregular from None
    if column.dtype != _INT64 and len(values):
        raise _Irregular
    return column.astype(np.int64, copy=False)


def _ns(microseconds: list) -> np.ndarray:
    """graphrt.trace.read.chrome_events.ns of each value, where all are finite numbers below
    2**53: through a float an int that size is exact, and its fraction 0, so one rule serves both."""
    try:
        column = np.array(microseconds, dtype=np.float64)  # a None becomes NaN
    except OverflowError:  # an int past a float's reach
        raise _Irregular from None
    if not np.all(np.abs(column) < _EXACT):  # NaN fails it too
        raise _Irregular
    whole = np.floor(column)
    return whole.astype(np.int64) * 1000 + np.rint((column - whole) * 1000).astype(np.int64)


def _interned(values: list[str | None], names: dict[str, str]) -> list[str]:
    """Each name as the one string `names` holds for it; _Irregular where one is missing."""
    interned = list(map(names.setdefault, values, values))
    if None in names:
        del names[None]  # type: ignore[arg-type]
        raise _Irregular
    return interned
