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

from graphrt.errors import GraphrtError
from graphrt.trace.model import ApiCall, Kernel, Range, Trace, calls_by_key, launch_index
from graphrt.trace.nsys_profile import export_command, run_bounded

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: what releases before 2021.4 wrote

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


def _api_calls(schema: _Schema) -> list[ApiCall]:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    cols = schema.columns(table)
    if not {"start", "end", "globalTid", "correlationId", "nameId"} <= cols:
        return []
    where = "WHERE r.eventClass IN (0, 1)" if "eventClass" in cols else ""
    rows = schema.db.execute(
        f"SELECT s.value, r.start, r.end, r.globalTid, r.correlationId FROM {table} r "
        f"LEFT JOIN StringIds s ON s.id = r.nameId {where} ORDER BY r.start")
    calls = []
    for name, start, end, global_tid, correlation in rows:
        pid, tid = split_global_tid(global_tid)
        calls.append(ApiCall(api_name(name or "?"), start, end, pid, tid, correlation))
    return calls


def _kernels(schema: _Schema, api_calls: list[ApiCall]) -> list[Kernel]:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    cols = schema.columns(table)
    if not {"start", "end", "deviceId", "correlationId"} <= cols:
        return []
    # a kernel's short name (`saxpy`) reads better in tables than the demangled signature
    names = [c for c in ("shortName", "demangledName") if c in cols]
    joins = "".join(f" LEFT JOIN StringIds s{i} ON s{i}.id = k.{c}" for i, c in enumerate(names))
    name_expr = f"COALESCE({', '.join(f's{i}.value' for i in range(len(names)))}, '?')" if names else "'?'"
    extra = ", ".join(f"k.{c}" if c in cols else "NULL" for c in ("streamId", "globalPid", "graphId", "graphNodeId"))
    rows = schema.db.execute(
        f"SELECT {name_expr}, k.start, k.end, k.deviceId, k.correlationId, {extra} "
        f"FROM {table} k{joins} ORDER BY k.start")
    # correlation ids restart per process: join on (pid, id)
    by_key = calls_by_key(api_calls, lambda c: (c.pid, c.correlation_id))
    kernels = []
    for name, start, end, device, correlation, stream, global_pid, graph_id, node_id in rows:
        pid = split_global_tid(global_pid)[0] if global_pid is not None else None
        launch = launch_index(api_calls, by_key, (pid, correlation), start)
        kernels.append(Kernel(name, start, end, device, stream, correlation, launch, graph_id, node_id or None))
    return kernels


def _ranges(schema: _Schema) -> list[Range]:
    table = "NVTX_EVENTS"
    cols = schema.columns(table)
    if not {"start", "end", "eventType", "globalTid"} <= cols:
        return []
    text_parts = (["n.text"] if "text" in cols else []) + (["s.value"] if "textId" in cols else [])
    text = f"COALESCE({', '.join(text_parts)}, '')" if text_parts else "''"
    join = " LEFT JOIN StringIds s ON s.id = n.textId" if "textId" in cols else ""
    domain = "n.domainId" if "domainId" in cols else "0"
    select = f"SELECT n.eventType, {text}, n.start, n.end, n.globalTid, {domain} FROM {table} n{join}"

    # domain ids are handed out per process; the default domain (0) has no name
    domains: dict[tuple[int, int], str] = {}
    for _, name, _, _, global_tid, domain_id in schema.db.execute(
            f"{select} WHERE n.eventType = {NVTX_DOMAIN_CREATE}"):
        domains[(split_global_tid(global_tid)[0], domain_id)] = name
    ranges = []
    for _, name, start, end, global_tid, domain_id in schema.db.execute(
            f"{select} WHERE n.eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) "
            "AND n.end IS NOT NULL ORDER BY n.start"):
        pid, tid = split_global_tid(global_tid)
        ranges.append(Range(name, start, end, pid, tid, domains.get((pid, domain_id), "")))
    return ranges


def read_nsys_sqlite(path: str | Path) -> Trace:
    """Read an `nsys export --type sqlite` file. Raises GraphrtError if it is not one."""
    path = Path(path)
    db = _connect(path)
    try:
        schema = _Schema(db)
        if "StringIds" not in schema.tables:
            raise GraphrtError(f"{path}: an SQLite file but not an Nsight Systems export (no "
                               "StringIds table); expected the output of nsys export --type sqlite")
        api_calls = _api_calls(schema)
        return Trace(source=str(path), kind="nsys", ranges=_ranges(schema),
                     kernels=_kernels(schema, api_calls), api_calls=api_calls, meta=_meta(schema))
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
