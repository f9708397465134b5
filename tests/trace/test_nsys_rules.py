"""The nsys reader's rules one by one: exports written here with just the tables and columns a
rule needs (laid out as `nsys export --type sqlite` lays them), the real exports in
tests/data/nsys read again with SQL, and `nsys export` failing in the ways it can."""

import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import pytest

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.read import nsys_sqlite

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nsys"
EXPORTS = [FIXTURES / "pipit-saxpy-mpi-cuda-nsys2022.2.sqlite", FIXTURES / "nsysai-h100-2gpu-nsys2026.2.sqlite"]

RUNTIME, KERNEL, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"


def _tid(pid: int, tid: int) -> int:
    """nsys's global thread id: pid in bits 24..47, tid in bits 0..23, the host above them."""
    return (1 << 56) | (pid << 24) | tid


def _export(path: Path, strings: dict[int, str], **tables: tuple[list[str], list[tuple]]) -> Path:
    """An SQLite file holding StringIds and each table given as (columns, rows)."""
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", strings.items())
        for table, (columns, rows) in tables.items():
            db.execute(f"CREATE TABLE {table} ({', '.join(columns)})")
            db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})", rows)
        db.commit()
    return path


def test_an_export_with_only_the_columns_the_reader_needs_is_read(tmp_path):
    """No eventClass, kernel names, streams, processes, graphs, NVTX text or domains: what is
    there is read, the rest takes its blank."""
    path = _export(tmp_path / "minimal.sqlite", {1: "cudaLaunchKernel_v7000"}, **{
        RUNTIME: (["start", "end", "globalTid", "correlationId", "nameId"],
                  [(100, 200, _tid(10, 11), 1, 1), (300, 400, _tid(10, 11), 2, 99)]),  # 99: no such string
        KERNEL: (["start", "end", "deviceId", "correlationId"], [(250, 350, 0, 1)]),
        NVTX: (["start", "end", "eventType", "globalTid"], [(50, 500, 59, _tid(10, 11))])})
    trace = load_trace(path)
    assert trace.source == str(path)
    assert [(c.name, c.start_ns, c.end_ns, c.pid, c.tid, c.correlation_id) for c in trace.api_calls] == [
        ("cudaLaunchKernel", 100, 200, 10, 11, 1), ("?", 300, 400, 10, 11, 2)]
    # without globalPid a kernel's process is unknown, and a correlation id is unique only within
    # a process: no call is claimed as its launch
    assert [(k.name, k.start_ns, k.end_ns, k.device, k.stream, k.correlation_id, k.launch, k.graph_id)
            for k in trace.kernels] == [("?", 250, 350, 0, None, 1, None, None)]
    assert [(r.name, r.start_ns, r.end_ns, r.pid, r.tid, r.domain) for r in trace.ranges] == [
        ("", 50, 500, 10, 11, "")]


def test_a_graph_kernel_keeps_its_graph_id_and_joins_its_launch_in_its_own_process(tmp_path):
    # two processes reuse correlation id 7; the second kernel has no short name column to read
    path = _export(tmp_path / "graphs.sqlite", {1: "cudaGraphLaunch_v10000", 2: "cudaLaunchKernel_v7000",
                                                3: "void gemm<float>(int)", 4: "void softmax(float*)"}, **{
        RUNTIME: (["start", "end", "eventClass", "globalTid", "correlationId", "nameId"],
                  [(100, 200, 1, _tid(10, 10), 7, 1), (110, 210, 1, _tid(20, 21), 7, 2)]),
        KERNEL: (["start", "end", "deviceId", "correlationId", "streamId", "globalPid", "graphId", "demangledName"],
                 [(300, 400, 0, 7, 13, _tid(10, 0), 5, 3), (320, 420, 1, 7, 14, _tid(20, 0), None, 4)])})
    trace = load_trace(path)
    assert (trace.ranges, trace.meta) == ([], {})  # no NVTX_EVENTS or metadata table: none of either
    assert [(k.name, k.device, k.stream, k.graph_id, trace.api_calls[k.launch].name) for k in trace.kernels] == [
        ("void gemm<float>(int)", 0, 13, 5, "cudaGraphLaunch"), ("void softmax(float*)", 1, 14, None, "cudaLaunchKernel")]


def test_a_correlation_id_repeated_in_one_process_links_each_kernel_to_the_last_call_before_it(tmp_path):
    # process 10 uses id 7 twice (ids restart per profiler session); process 20's id 7 is another
    # call again: each kernel's launch is the call of its own process that began last before it
    path = _export(tmp_path / "repeated.sqlite", {1: "cudaLaunchKernel_v7000", 2: "cudaGraphLaunch_v10000",
                                                  3: "first", 4: "second", 5: "other", 6: "early"}, **{
        RUNTIME: (["start", "end", "globalTid", "correlationId", "nameId"],
                  [(100, 110, _tid(10, 10), 7, 1), (200, 210, _tid(10, 10), 7, 2), (150, 160, _tid(20, 20), 7, 1)]),
        KERNEL: (["start", "end", "deviceId", "correlationId", "globalPid", "shortName"],
                 [(120, 130, 0, 7, _tid(10, 0), 3), (220, 230, 0, 7, _tid(10, 0), 4),
                  (240, 250, 0, 7, _tid(20, 0), 5), (90, 95, 0, 7, _tid(10, 0), 6)])})
    trace = load_trace(path)
    launched = {k.name: None if k.launch is None else (trace.api_calls[k.launch].name, trace.api_calls[k.launch].pid)
                for k in trace.kernels}
    assert launched == {"first": ("cudaLaunchKernel", 10), "second": ("cudaGraphLaunch", 10),
                        "other": ("cudaLaunchKernel", 20), "early": None}


@pytest.mark.parametrize("path", EXPORTS, ids=["nsys2022.2", "nsys2026.2"])
def test_every_kernel_field_is_the_export_s_own(path):
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({KERNEL})")}
        graph = "k.graphId" if "graphId" in columns else "NULL"
        expected = db.execute(
            f"SELECT COALESCE(s.value, d.value), k.start, k.end, k.deviceId, k.streamId, k.correlationId, {graph} "
            f"FROM {KERNEL} k LEFT JOIN StringIds s ON s.id = k.shortName "
            "LEFT JOIN StringIds d ON d.id = k.demangledName").fetchall()
    got = [(k.name, k.start_ns, k.end_ns, k.device, k.stream, k.correlation_id, k.graph_id)
           for k in load_trace(path).kernels]
    assert sorted(got) == sorted(expected) and len(got) > 0
    assert [k[1] for k in got] == sorted(k[1] for k in got)  # by start


def test_a_domain_is_named_for_its_process_whichever_thread_created_it(tmp_path):
    # the domain is created on thread 12 of process 10 and used on thread 11; process 20's
    # domain 1 is another domain, which it never named
    main, worker, other = _tid(10, 11), _tid(10, 12), _tid(20, 20)
    path = _export(tmp_path / "domains.sqlite", {1: "registered"}, **{
        NVTX: (["start", "end", "eventType", "text", "textId", "globalTid", "domainId"],
               [(10, None, 75, "graphrt", None, worker, 1),
                (20, 30, 59, "decode_step[eager]", None, main, 1),
                (40, 50, 60, None, 1, main, 0),  # a registered string, in the default domain
                (60, 70, 59, "elsewhere", None, other, 1),
                (80, None, 59, "never closed", None, main, 1)])})
    assert [(r.name, r.domain) for r in load_trace(path).ranges] == [
        ("decode_step[eager]", "graphrt"), ("registered", ""), ("elsewhere", "")]


def _sqlite(path: Path, *statements: str) -> None:
    with closing(sqlite3.connect(path)) as db:
        for statement in statements:
            db.execute(statement)
        db.commit()


@pytest.mark.parametrize("make, said", [
    (lambda p: p.write_bytes(b"plain text"),
     "{path}: not an SQLite file; expected an Nsight Systems export (nsys export --type sqlite)"),
    (lambda p: p.write_bytes(b"SQLite format 3\0" + b"\xff" * 200),
     "{path}: cannot read this SQLite file (file is not a database)"),
    (lambda p: _sqlite(p, "CREATE TABLE t (x)"),
     "{path}: an SQLite file but not an Nsight Systems export (no StringIds table); expected the "
     "output of nsys export --type sqlite"),
    (lambda p: _sqlite(p, "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)",
                       f"CREATE VIEW {KERNEL} AS SELECT * FROM nowhere"),
     "{path}: cannot read this Nsight Systems export (no such table: main.nowhere)"),
], ids=["not-sqlite", "corrupt", "no-string-ids", "broken-table"])
def test_what_is_not_a_readable_export_is_refused_in_one_line_naming_it(tmp_path, make, said):
    path = tmp_path / "other.sqlite"
    make(path)
    with pytest.raises(GraphrtError) as refused:
        nsys_sqlite.read_nsys_sqlite(path)
    assert str(refused.value) == said.format(path=path)


def test_a_report_without_nsys_to_export_it_says_how_to_get_either(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    report = tmp_path / "decode.nsys-rep"
    report.write_bytes(b"a report")
    with pytest.raises(GraphrtError) as refused:
        load_trace(report)
    assert str(refused.value) == (
        f"{report}: reading a report needs the Nsight Systems CLI (nsys) on PATH to export it to "
        "SQLite; install it (NVIDIA's installer, or scripts/install-nsys.sh on Debian) or pass the "
        "SQLite export instead (nsys export --type sqlite -o decode.sqlite decode.nsys-rep)")


_FAKE_NSYS = """#!{python}
import pathlib, sys, time
out = pathlib.Path(sys.argv[sys.argv.index("-o") + 1])
{action}
"""


@pytest.mark.parametrize("action, said", [
    # nsys failed after writing part of its output: the file is not read
    ("out.write_bytes(b'SQLite format 3\\0 half'); print('Error: disk full', file=sys.stderr); sys.exit(3)",
     r"{report}: nsys export failed \(Error: disk full\)$"),
    ("sys.exit(0)", r"{report}: nsys export failed \(exit status 0\)$"),  # said it worked, wrote nothing
    ("time.sleep(20)", r"nsys export did not finish within 2 s and was killed"),  # hung: killed at the limit
], ids=["failed", "no-output", "hung"])
@pytest.mark.processes
@pytest.mark.slow
def test_a_failed_export_is_refused_and_leaves_no_sqlite_behind(tmp_path, monkeypatch, action, said):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(_FAKE_NSYS.format(python=sys.executable, action=action))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir), prepend=":")
    monkeypatch.setattr(nsys_sqlite, "EXPORT_TIMEOUT_S", 2)
    report = tmp_path / "decode.nsys-rep"
    report.write_bytes(b"a report")
    with pytest.raises(GraphrtError, match="^" + said.format(report=report)):
        load_trace(report)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "decode.nsys-rep"]
