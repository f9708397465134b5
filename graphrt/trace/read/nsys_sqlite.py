"""Read an Nsight Systems SQLite export (`nsys export --type sqlite`) into a `Trace`.

The export's schema changes between Nsight Systems releases (2022.2 writes schema 2.9.1 and
`EXPORT_META_DATA`, 2026.2 schema 3.25.0 and `META_DATA_EXPORT`; columns come and go, and
tables with no rows may be left out), so every query is built from what `sqlite_master` and
`PRAGMA table_info` say is there. What is read:

- kernels (`CUPTI_ACTIVITY_KIND_KERNEL`), names through `StringIds`; a replayed graph node's
  `graphNodeId` where the column is there (NULL for a kernel launched on its own);
- CUDA runtime calls (`CUPTI_ACTIVITY_KIND_RUNTIME`), names without their `_vNNNN` suffix. Only
  `eventClass` 0/1 rows are kept: some releases also write a second row per call (class 67)
  with the same correlation id, which would count every call twice;
- NVTX ranges (`NVTX_EVENTS`): push/pop (event type 59) and start/end (60), text from `text`
  or, for registered strings, `StringIds` via `textId`; domain names from the domain-create rows
  (type 75). Ranges never closed (no end time) are left out.

A `.nsys-rep` report is exported to SQLite first with `nsys` (see `read_nsys_report`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from graphrt.errors import GraphrtError
from graphrt.trace.read.events import ApiCalls, Kernels, Progress, Ranges, Trace, link_launches
from graphrt.trace.record.nsys_profile import export_command, run_bounded

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: what releases before 2021.4 wrote

ROWS = 1 << 16  # rows fetched at a time
EXPORT_TIMEOUT_S = 600  # a large report exports in tens of seconds; a hung nsys is killed

NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTX_DOMAIN_CREATE = 75

_VERSION_SUFFIX = re.compile(r"_v\d+$")
_META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # newer name first


def split_global_tid(global_tid: int) -> tuple[int, int]:
    """nsys packs (pid, tid) into one integer: pid in bits 24..47, tid in bits 0..23."""
    return (global_tid >> 24) & 0xFFFFFF, global_tid & 0xFFFFFF


def api_name(raw: str) -> str:
    """`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`."""
    return _VERSION_SUFFIX.sub("", raw)


class _Schema:
    """Which tables and columns this export has."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.tables = {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        """The table's columns; none for a table the export does not have (PRAGMA lists none)."""
        if table not in self._columns:
            self._columns[table] = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
        return self._columns[table]


def _connect(path: Path) -> sqlite3.Connection:
    """Open read-only; a file that is not SQLite or not an nsys export is a GraphrtError."""
    with path.open("rb") as f:
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise GraphrtError(f"{path}: not an SQLite file; expected an Nsight Systems export "
                               "(nsys export --type sqlite)")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise GraphrtError(f"{path}: cannot read this SQLite file ({e})") from None
    return db


def _meta(schema: _Schema) -> dict[str, str]:
    """Who wrote the export and, where the export says (META_DATA_CAPTURE, newer releases), how
    CUDA graphs were traced: "Node" (each kernel) or "Graph" (one span per graph launch)."""
    wanted = {"EXPORT_PRODUCT_VERSION": "nsys_version", "EXPORT_SCHEMA_VERSION": "schema",
              "CUDA_GRAPH_TRACE_OPTIONS:MODE": "cuda_graph_trace"}
    meta = {}
    for table in (*_META_TABLES, "META_DATA_CAPTURE"):
        if {"name", "value"} <= schema.columns(table):
            for name, value in schema.db.execute(f"SELECT name, value FROM {table}"):
                if name in wanted and value is not None:
                    meta.setdefault(wanted[name], str(value))
    return meta


def _rows(db: sqlite3.Connection, sql: str, progress: Progress | None, done: list[int]) -> Iterator[list[tuple]]:
    """The query's rows a batch at a time, in the table's own (rowid) order: sorting them is left
    to numpy, which is far quicker than SQLite's sorter on tables without indexes."""
    cursor = db.execute(sql)
    while rows := cursor.fetchmany(ROWS):
        yield rows
        done[0] += len(rows)
        if progress:
            progress(0, done[0])


def _check_rows(schema: _Schema, path: Path, table: str, required: tuple[str, ...], where: str = "") -> None:
    """GraphrtError naming the first row of `table` (of those `where` keeps) with a value no
    export holds: a `required` column that is no integer, an optional id column (stream, graph,
    process) that is neither an integer nor NULL, or an end before its start. Such a row would
    be a time of 2**63 ns or a negative one, or break the reader, so the export is refused; the
    check is one scan in SQLite's own C, beside the read."""
    cols = schema.columns(table)
    optional = [c for c in ("streamId", "globalPid", "graphId", "graphNodeId", "domainId", "textId") if c in cols]
    wrong = [f"typeof({c}) != 'integer'" for c in required] + \
        [f"typeof({c}) NOT IN ('integer', 'null')" for c in optional] + ["end < start"]
    sql = f"SELECT rowid, {', '.join((*required, *optional))} FROM {table} WHERE {where or '1'} AND ({' OR '.join(wrong)}) LIMIT 1"
    row = schema.db.execute(sql).fetchone()
    if row is None:
        return
    values = dict(zip((*required, *optional), row[1:]))
    bad = next((c for c in required if type(values[c]) is not int), None) or \
        next((c for c in optional if values[c] is not None and type(values[c]) is not int), None)
    what = (f"{bad} {values[bad]!r:.40} is not an integer" if bad else
            f"end {values['end']} is before start {values['start']}")
    raise GraphrtError(f"{path}: {table} row {row[0]}: {what}; expected integer nanoseconds and ids, each span "
                       "ending at or after its start, as nsys export writes them")


def _strings(schema: _Schema) -> dict[int, str]:
    """StringIds: every name and text in the export, by id (one Python string each)."""
    return dict(schema.db.execute("SELECT id, value FROM StringIds"))


def _api_calls(schema: _Schema, path: Path, strings: dict[int, str], progress: Progress | None,
               done: list[int]) -> ApiCalls:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    cols = schema.columns(table)
    calls = ApiCalls()
    if not {"start", "end", "globalTid", "correlationId", "nameId"} <= cols:
        return calls
    where = "WHERE eventClass IN (0, 1)" if "eventClass" in cols else ""
    _check_rows(schema, path, table, ("start", "end", "globalTid", "correlationId"), where[6:])
    names: dict[int | None, str] = {}  # nameId -> the call's name without its version suffix
    for rows in _rows(schema.db, f"SELECT nameId, start, end, globalTid, correlationId FROM {table} {where}",
                      progress, done):
        name_ids, starts, ends, global_tids, correlations = zip(*rows)
        for n in set(name_ids) - names.keys():
            names[n] = api_name(strings.get(n) or "?")
        tids = np.array(global_tids, dtype=np.int64)
        calls.extend(name=[names[n] for n in name_ids], start_ns=starts, end_ns=ends,
                     pid=(tids >> 24) & 0xFFFFFF, tid=tids & 0xFFFFFF, correlation_id=correlations,
                     kernel=[""] * len(starts))  # a CUDA runtime row names no kernel
    calls.sorted_by_start()
    return calls


def _kernels(schema: _Schema, path: Path, strings: dict[int, str], calls: ApiCalls, progress: Progress | None,
             done: list[int]) -> Kernels:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    cols = schema.columns(table)
    kernels = Kernels()
    if not {"start", "end", "deviceId", "correlationId"} <= cols:
        return kernels
    _check_rows(schema, path, table, ("start", "end", "deviceId", "correlationId"))
    # a kernel's short name (`saxpy`) reads better in tables than the demangled signature
    named = [c if c in cols else "NULL" for c in ("shortName", "demangledName")]
    extra = ", ".join(c if c in cols else "NULL" for c in ("streamId", "globalPid", "graphId", "graphNodeId"))
    pids = []  # per kernel, its process (-1: unknown, which no call has)
    for rows in _rows(schema.db, f"SELECT {', '.join(named)}, start, end, deviceId, correlationId, {extra} "
                      f"FROM {table}", progress, done):
        short, demangled, starts, ends, devices, correlations, streams, global_pids, graphs, nodes = zip(*rows)
        kernels.extend(name=[strings.get(a) or strings.get(b) or "?" for a, b in zip(short, demangled)],
                       start_ns=starts, end_ns=ends, device=devices, stream=streams,
                       correlation_id=correlations, launch=[None] * len(rows), graph_id=graphs,
                       graph_node_id=[n or None for n in nodes])
        pids += [-1 if g is None else (g >> 24) & 0xFFFFFF for g in global_pids]
    order = kernels.sorted_by_start()
    # correlation ids restart per process: join on (pid, id)
    kernel_pids = np.array(pids, dtype=np.int64)[order] if len(kernels) else np.zeros(0, np.int64)
    kernels.set_ints("launch", link_launches(
        np.stack([calls.ints("pid"), calls.ints("correlation_id")], axis=1), calls.ints("start_ns"),
        np.stack([kernel_pids, kernels.ints("correlation_id")], axis=1), kernels.ints("start_ns")))
    return kernels


def _ranges(schema: _Schema, path: Path, strings: dict[int, str], progress: Progress | None,
            done: list[int]) -> Ranges:
    table = "NVTX_EVENTS"
    cols = schema.columns(table)
    ranges = Ranges()
    if not {"start", "end", "eventType", "globalTid"} <= cols:
        return ranges
    # a range never closed (no end) is left out, as the read below does
    _check_rows(schema, path, table, ("start", "end", "globalTid"),
                f"eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND end IS NOT NULL")
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    domain = "domainId" if "domainId" in cols else "0"
    select = f"SELECT {text}, {text_id}, start, end, globalTid, {domain} FROM {table}"

    def texts(rows: list[tuple]) -> list[str]:
        return [t if t is not None else strings.get(i) or "" for t, i, *_ in rows]

    # domain ids are handed out per process; the default domain (0) has no name
    domains: dict[tuple[int, int], str] = {}
    for rows in _rows(schema.db, f"{select} WHERE eventType = {NVTX_DOMAIN_CREATE}", None, [0]):
        for name, row in zip(texts(rows), rows):
            domains[(split_global_tid(row[4])[0], row[5])] = name
    for rows in _rows(schema.db, f"{select} WHERE eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) "
                      "AND end IS NOT NULL", progress, done):
        _, _, starts, ends, global_tids, domain_ids = zip(*rows)
        tids = np.array(global_tids, dtype=np.int64)
        pids = (tids >> 24) & 0xFFFFFF
        ranges.extend(name=texts(rows), start_ns=starts, end_ns=ends, pid=pids, tid=tids & 0xFFFFFF,
                      domain=[domains.get((p, d), "") for p, d in zip(pids.tolist(), domain_ids)])
    ranges.sorted_by_start()
    return ranges


def read_nsys_sqlite(path: str | Path, progress: Progress | None = None) -> Trace:
    """Read an `nsys export --type sqlite` file. `progress(0, rows so far)` is called as it goes.
    Raises GraphrtError if it is not one."""
    path = Path(path)
    db = _connect(path)
    try:
        schema = _Schema(db)
        if "StringIds" not in schema.tables:
            raise GraphrtError(f"{path}: an SQLite file but not an Nsight Systems export (no "
                               "StringIds table); expected the output of nsys export --type sqlite")
        strings, done = _strings(schema), [0]
        api_calls = _api_calls(schema, path, strings, progress, done)
        return Trace(source=str(path), kind="nsys", ranges=_ranges(schema, path, strings, progress, done),
                     kernels=_kernels(schema, path, strings, api_calls, progress, done), api_calls=api_calls,
                     meta=_meta(schema))
    except sqlite3.DatabaseError as e:
        raise GraphrtError(f"{path}: cannot read this Nsight Systems export ({e})") from None
    finally:
        db.close()


def _export(report: Path, out: Path) -> None:
    """`nsys export` the report to `out`, through a temporary name so `out` is never half-written."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise GraphrtError(
            f"{report}: reading a report needs the Nsight Systems CLI (nsys) on PATH to export it "
            "to SQLite; install it (NVIDIA's installer, or scripts/install-nsys.sh on Debian) or "
            f"pass the SQLite export instead (nsys export --type sqlite -o {out.name} {report.name})")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        done = run_bounded(export_command(nsys, report, tmp), timeout_s=EXPORT_TIMEOUT_S)
        if done.returncode != 0 or not tmp.is_file():
            said = (done.stderr or done.stdout).strip().splitlines()
            why = said[-1] if said else f"exit status {done.returncode}"
            raise GraphrtError(f"{report}: nsys export failed ({why})")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _exported(report: Path) -> Iterator[Path]:
    """The SQLite export of `report`: `X.sqlite` beside `X.nsys-rep`, made if missing or older
    than the report and kept for next time; in a temporary directory, removed afterwards, where
    the report's directory cannot be written."""
    beside = report.with_suffix(".sqlite")
    if beside.is_file() and beside.stat().st_mtime >= report.stat().st_mtime:
        yield beside
    elif os.access(report.parent, os.W_OK):
        _export(report, beside)
        yield beside
    else:
        with tempfile.TemporaryDirectory(prefix="graphrt-nsys-") as tmp:
            out = Path(tmp) / beside.name
            _export(report, out)
            yield out


def read_nsys_report(path: str | Path) -> Trace:
    """Read a `.nsys-rep` report by exporting it to SQLite with `nsys` first."""
    report = Path(path)
    with _exported(report) as sqlite_path:
        trace = read_nsys_sqlite(sqlite_path)
    trace.source = str(report)
    return trace
