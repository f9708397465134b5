"""A batch of decoded Chrome-trace events into a trace's columns at once: each field taken from
the batch's events as one list, its numbers made integers by numpy, instead of a Python call per
event. This is how every Chrome trace is read.

The rules are graphrt.trace.read.chrome_events'. A value of the usual shape (an int that fits
64 bits; for a time, a finite number below 2**53 µs) is taken with the rest of its column; one of
another (a label for a thread, an integral float for an id, an int timestamp past 2**53, a graph
id past a toolsId's reach) goes through its field's rule alone, which reads it or refuses it.
A batch with a refused value puts nothing in: `Refused` names its first refused event and why.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from graphrt.trace.read.chrome_events import (GRAPH_ID_BOUND, INT64, NO_ARGS, TABLE_OF, Args, Event, Into,
                                              UnusableField, graph_node, python_kind, span, stated, thread,
                                              whole)
from graphrt.trace.read.columns import ABSENT, Table
from graphrt.trace.read.events import PYTHON_DOMAIN, Trace

_INT64 = np.dtype(np.int64)
_EXACT = float(2**53)  # below it a float holds every integer: an int read as one is exact


class Refused(Exception):
    """An event the rules refuse: `row`, its index in the batch; `error`, an UnusableField saying
    what was expected, or a KeyError naming the field it lacks."""

    def __init__(self, row: int, error: UnusableField | KeyError) -> None:
        super().__init__(row, error)
        self.row, self.error = row, error


def add_batch(trace: Trace, batch: list[Event], names: dict[str, str], kinds: dict[str | None, Into]) -> None:
    """Put the batch's complete events into the trace's columns. `names` interns each distinct
    name; `kinds` is each python function's `python_kind`, by name. Refused, with nothing put in,
    where the rules refuse an event: the first one, by its first field the rules refuse."""
    at = [n for n, e in enumerate(batch) if e.ph == "X"]
    complete = [batch[n] for n in at]
    try:
        columns = _columns(trace, complete, names, kinds)
    except Refused as refused:
        first = _first_refused(trace, complete, names, kinds, refused)
        raise Refused(at[first.row], first.error) from None
    for table, fields in columns:
        table.extend(**fields)


def _first_refused(trace: Trace, complete: list[Event], names: dict[str, str], kinds: dict[str | None, Into],
                   refused: Refused) -> Refused:
    """The refusal of the first refused event. Columns are read one after another, so a column
    read early may refuse a later event than one read after it would: the events before the one
    refused are read again, until none of them is. Each column is read in the order the rules
    check an event's fields, so of an event's refused fields the first is named."""
    while True:
        try:
            _columns(trace, complete[:refused.row], names, kinds)
        except Refused as earlier:
            refused = earlier
        else:
            return refused


def _columns(trace: Trace, complete: list[Event], names: dict[str, str],
             kinds: dict[str | None, Into]) -> list[tuple[Table, dict[str, Any]]]:
    """Each table's new rows as columns, in the order of the file."""
    if not complete:
        return []
    start, end = _spans(complete)
    category = np.fromiter(map(TABLE_OF.get, [e.cat for e in complete], repeat(Into.NONE)), np.int8, len(complete))
    table = _python_kept(category, complete, kinds)
    out = []
    for into in (Into.RANGE, Into.FRAME, Into.OP, Into.API, Into.KERNEL):
        rows = np.flatnonzero(table == into)
        if not len(rows):
            continue
        events = [complete[i] for i in rows.tolist()]
        times = {"start_ns": start[rows], "end_ns": end[rows]}
        try:
            if into == Into.KERNEL:
                out.append((trace.kernels, _kernels(events, times, names)))
            elif into == Into.API:
                out += _api_calls(trace, events, times, names)
            else:
                fields = {**times, "name": _interned([e.name for e in events], names), **_threads(events)}
                if into == Into.OP:
                    out.append((trace.cpu_ops, fields))
                else:  # a range: a record_function's, or a python function's
                    domains = ["" if c == Into.RANGE else PYTHON_DOMAIN for c in category[rows].tolist()]
                    out.append((trace.ranges if into == Into.RANGE else trace.frames, {**fields, "domain": domains}))
        except Refused as refused:  # its row is one of this table's events: which of the batch's
            refused.row = int(rows[refused.row])
            raise
    return out


def _spans(complete: list[Event]) -> tuple[np.ndarray, np.ndarray]:
    """Each event's start and end in ns (`span`): at once where its ts and dur are usual, one by
    one where not (or where its duration is negative, or its end passes 64 bits)."""
    durations = [e.dur for e in complete]
    start, usual_start = _usual_ns([e.ts for e in complete])
    length, usual_length = _usual_ns(durations if None not in durations else [d or 0 for d in durations])
    end = start + length  # numpy wraps an int64 past its reach: such a row is taken one by one
    odd = ~(usual_start & usual_length) | (length < 0) | (end < start)
    for row in np.flatnonzero(odd).tolist():
        start[row], end[row] = _ruled(row, span, complete[row].ts, complete[row].dur)
    return start, end


def _usual_ns(microseconds: list) -> tuple[np.ndarray, np.ndarray]:
    """(graphrt.trace.read.chrome_events.ns of each value where it is usual, and which are): a
    finite number below 2**53 is usual, since through a float an int that size is exact and its
    fraction 0, so one rule serves both. The others' ns are left as 0."""
    try:
        column = np.array(microseconds, dtype=np.float64)  # a None becomes NaN
    except OverflowError:  # an int past a float's reach: the whole column one by one
        return np.zeros(len(microseconds), np.int64), np.zeros(len(microseconds), bool)
    usual = np.abs(column) < _EXACT  # NaN fails it too
    column = np.where(usual, column, 0.0)
    whole_us = np.floor(column)
    return whole_us.astype(np.int64) * 1000 + np.rint((column - whole_us) * 1000).astype(np.int64), usual


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
    kept = None  # every call, or the rows of those kept
    if None in correlations:
        kept = np.flatnonzero([c is not None for c in correlations])
        events, args, called = ([column[i] for i in kept.tolist()] for column in (events, args, called))
        times = {field: column[kept] for field, column in times.items()}
        correlations = [a.correlation for a in args]
    if not events:
        return []
    try:
        fields = {**times, **_threads(events), "correlation_id": _ints(correlations, _correlation), "name": called,
                  "kernel": [names.setdefault(a.kernel, a.kernel) if a.kernel else "" for a in args]}
    except Refused as refused:  # its row is one of the calls kept: which of all
        refused.row = refused.row if kept is None else int(kept[refused.row])
        raise
    return [(trace.api_calls, fields)]


def _kernels(events: list[Event], times: dict[str, np.ndarray], names: dict[str, str]) -> dict[str, Any]:
    name = _interned([e.name for e in events], names)
    args = [e.args or NO_ARGS for e in events]
    streams, correlations = [a.stream for a in args], [a.correlation for a in args]
    return {**times, "name": name, "device": _ints([a.device or 0 for a in args], _device),
            "stream": _optional_ints(streams, _stream),
            "correlation_id": _ints([-1 if c is None else c for c in correlations] if None in correlations
                                    else correlations, _correlation),
            "graph_node_id": _graph_nodes(args),
            "launch": np.full(len(events), ABSENT), "graph_id": np.full(len(events), ABSENT)}


def _graph_nodes(args: list[Args]) -> np.ndarray:
    """Each kernel's toolsId (`graph_node`), ABSENT where it came from no graph: at once where
    its node and graph ids are ints that fit, the graph's below 2**31; one by one where not."""
    nodes, graphs = [a.graph_node or 0 for a in args], [a.graph or 0 for a in args]
    node, graph = _plain(nodes), _plain(graphs)
    odd = np.zeros(len(args), dtype=bool)
    if node is None or graph is None:
        odd = np.array([not (_fits(n) and _fits(g)) for n, g in zip(nodes, graphs)], dtype=bool)
        node, graph = (np.array([0 if o else v for v, o in zip(column, odd.tolist())], dtype=np.int64)
                       for column in (nodes, graphs))
    odd |= (node != 0) & ((graph >= GRAPH_ID_BOUND) | (graph <= -GRAPH_ID_BOUND))  # numpy would wrap the toolsId
    odd |= node == ABSENT  # refused, not read as a kernel from no graph
    tools = np.where(node == 0, ABSENT, np.where(graph != 0, (graph << 32) | (node & 0xFFFF_FFFF), node))
    for row in np.flatnonzero(odd).tolist():
        found = _ruled(row, graph_node, args[row])
        tools[row] = ABSENT if found is None else found
    return tools


def _threads(events: list[Event]) -> dict[str, np.ndarray]:
    """pid and tid: a label, or a number of another shape, by `thread`."""
    return {"pid": _ints([e.pid for e in events], _pid), "tid": _ints([e.tid for e in events], thread)}


def _pid(value: Any) -> int:
    return thread(value, "pid")


def _device(value: Any) -> int:
    return whole(value, "args.device", "a device's index")


def _stream(value: Any) -> int:
    # ABSENT marks a kernel that states no stream
    return stated(whole(value, "args.stream", "a stream's id"), "args.stream", "stream's id")


def _correlation(value: Any) -> int:
    return whole(value, "args.correlation", "a launch's correlation id")


def _ints(values: list, rule: Callable[[Any], int]) -> np.ndarray:
    """The values as int64: at once where every one is an int that fits, else each other one by
    `rule` (which gives an int that fits, or refuses the value)."""
    column = _plain(values)
    if column is None:
        column = np.array([v if _fits(v) else _ruled(row, rule, v) for row, v in enumerate(values)], dtype=np.int64)
    return column


def _optional_ints(values: list, rule: Callable[[Any], int]) -> np.ndarray:
    """A column that may be unstated: None as ABSENT; a value that is ABSENT itself (-2**63)
    goes to `rule`, which refuses it, so that it is never read as unstated."""
    column = _ints([ABSENT if v is None else v for v in values] if None in values else values, rule)
    for row in np.flatnonzero(column == ABSENT).tolist():
        if values[row] is not None:
            _ruled(row, rule, values[row])
    return column


def _plain(values: list) -> np.ndarray | None:
    """The values as int64 where every one is an int that fits; None where not."""
    try:
        column = np.array(values)
    except OverflowError:  # an int past 64 bits
        return None
    if len(values) and column.dtype != _INT64:
        return None
    return column.astype(np.int64, copy=False)


def _fits(value: Any) -> bool:
    return type(value) is int and -INT64 <= value < INT64


def _ruled(row: int, rule: Callable[..., Any], *values: Any) -> Any:
    """`rule` of one row's values; Refused naming the row where the rule refuses them."""
    try:
        return rule(*values)
    except (UnusableField, KeyError) as error:
        raise Refused(row, error) from None


def _interned(values: list[str | None], names: dict[str, str]) -> list[str]:
    """Each name as the one string `names` holds for it; Refused naming the first missing one."""
    interned = list(map(names.setdefault, values, values))
    if None in names:
        del names[None]  # type: ignore[arg-type]
        raise Refused(values.index(None), KeyError("name"))
    return interned
