"""Reading Nsight Systems SQLite exports: two real exports of different schema versions, checked
against SQL written here, and (where nsys is installed) a trace recorded on this machine checked
against `nsys stats`."""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3
import textwrap
from contextlib import closing
from pathlib import Path

import nsys_runs
import pytest

from graphrt.errors import GraphrtError
from graphrt.trace import load_trace
from graphrt.trace.analysis.markers import MARKERS
from graphrt.trace.analysis.steps import analyze

# Real exports from GPU machines (tests/data/nsys/README.md names their sources)
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nsys"
OLD = FIXTURES / "pipit-saxpy-mpi-cuda-nsys2022.2.sqlite"  # schema 2.9.1, 1 GPU, MPI + NVTX
NEW = FIXTURES / "nsysai-h100-2gpu-nsys2026.2.sqlite"  # schema 3.25.0, 2 GPUs, 16,782 ranges


def sql(path: Path, query: str, *args, setup: str = "") -> list[tuple]:
    """Run `query` on the export (read-only); `setup` may first build temporary tables."""
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as db:
        db.executescript(setup)
        return db.execute(query, args).fetchall()


@pytest.fixture(scope="module", params=[OLD, NEW], ids=["nsys2022.2", "nsys2026.2"])
def export(request):
    path = request.param
    trace = load_trace(path)
    return path, trace, analyze(trace)


def test_both_schema_versions_are_read_with_their_metadata():
    assert load_trace(OLD).meta == {"nsys_version": "2022.2.1.31", "schema": "2.9.1"}
    # the newer export also says how CUDA graphs were traced
    assert load_trace(NEW).meta == {"nsys_version": "2026.2.1.210", "schema": "3.25.0",
                                           "cuda_graph_trace": "Graph"}


def test_kernel_count_and_time_per_device_match_sql(export):
    path, _, report = export
    expected = {device: (count, total) for device, count, total in sql(
        path, "SELECT deviceId, COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
              "GROUP BY deviceId")}
    assert {d.device: (d.kernels, d.kernel_ns) for d in report.devices} == expected


def test_ranges_are_the_closed_push_pop_and_start_end_events(export):
    path, trace, _ = export
    (expected,) = sql(path, "SELECT COUNT(*) FROM NVTX_EVENTS "
                            "WHERE eventType IN (59, 60) AND end IS NOT NULL")
    assert len(trace.ranges) == expected[0]


def test_nvtx_text_comes_from_text_or_from_string_ids_and_domains_are_named():
    path = OLD
    trace = load_trace(path)
    # `saxpy` is inline text in the default domain; MPI_* are registered strings (textId) in
    # the domain the MPI wrappers created
    (saxpy,) = sql(path, "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59 AND text = 'saxpy'")
    (send,) = sql(path, "SELECT COUNT(*) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                        "WHERE n.eventType = 59 AND s.value = 'MPI_Send'")
    assert saxpy[0] == 5 and send[0] == 10
    assert [r.domain for r in trace.ranges if r.name == "saxpy"] == [""] * 5
    assert [r.domain for r in trace.ranges if r.name == "MPI_Send"] == ["MPI"] * 10


def test_runtime_calls_keep_one_row_per_call_without_version_suffix():
    path = OLD
    trace = load_trace(path)
    # this export writes each call twice: eventClass 0 (the call) and 67 (same correlation id)
    (rows,) = sql(path, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)")
    assert len(trace.api_calls) == rows[0] == 57
    assert len({c.correlation_id for c in trace.api_calls}) == 57
    launches = [c for c in trace.api_calls if c.name == "cudaLaunchKernel"]
    assert len(launches) == 5
    assert all(trace.api_calls[k.launch] in launches for k in trace.kernels)


# Each kernel joined to the runtime call that launched it: same process and correlation id, a
# call (eventClass 0/1) that started no later than the kernel. Indexed, so the range join is quick.
LAUNCHED_SQL = """
CREATE TEMP TABLE launched AS
SELECT k.rowid AS kernel, r.globalTid AS tid, r.start AS t, k.end - k.start AS d
FROM CUPTI_ACTIVITY_KIND_RUNTIME r
JOIN CUPTI_ACTIVITY_KIND_KERNEL k
  ON k.correlationId = r.correlationId AND k.globalPid = (r.globalTid >> 24) << 24 AND k.start >= r.start
WHERE r.eventClass IN (0, 1);
CREATE INDEX temp.launched_at ON launched (tid, t);
"""

# Kernels launched while each range (default domain) was open: the launching call ran on the
# range's thread and started inside it.
ATTRIBUTION_SQL = """
SELECT COALESCE(n.text, s.value) AS name, COUNT(l.t), COALESCE(SUM(l.d), 0)
FROM NVTX_EVENTS n
LEFT JOIN StringIds s ON s.id = n.textId
LEFT JOIN temp.launched l ON l.tid = n.globalTid AND l.t BETWEEN n.start AND n.end
WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL AND n.domainId = 0
GROUP BY name
"""


def test_kernels_are_attributed_to_the_range_around_their_launch_call(export):
    path, _, report = export
    # names that carry a per-call counter (`aten::mm, op_id = 314286`) are one group
    expected: dict[str, tuple[int, int]] = {}
    for name, count, total in sql(path, ATTRIBUTION_SQL, setup=LAUNCHED_SQL):
        key = name.split(", op_id = ")[0]
        before = expected.get(key, (0, 0))
        expected[key] = (before[0] + count, before[1] + total)
    got = {f.key: (f.kernels, f.gpu_ns) for f in report.by_name if f.domain == ""}
    assert got == expected
    assert sum(count for count, _ in expected.values()) > 0


def test_each_saxpy_range_holds_the_one_kernel_it_launched():
    report = analyze(load_trace(OLD))
    (saxpy,) = [f for f in report.by_name if f.key == "saxpy"]
    assert (saxpy.count, saxpy.kernels) == (5, 5)
    assert report.notes == [f"no step marker ({MARKERS}): whole-trace figures only"]


def test_kernels_whose_correlation_matches_no_earlier_call_are_counted_and_said(export):
    path, trace, report = export
    (linked,) = sql(path, "SELECT COUNT(DISTINCT kernel) FROM temp.launched", setup=LAUNCHED_SQL)
    unlinked = len(trace.kernels) - linked[0]
    assert report.counts["kernels_without_launch"] == unlinked
    assert any(f"{unlinked} of {len(trace.kernels)} kernels" in n for n in report.notes) == (unlinked > 0)


def test_sqlite_that_is_not_an_nsys_export_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    with closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    with pytest.raises(GraphrtError, match=r"other\.sqlite: an SQLite file but not an Nsight Systems export"):
        load_trace(other)


# ---------------------------------------------------------------------------------------------
# A trace recorded here, with nsys

NVTX_SCRIPT = textwrap.dedent("""
    import nvtx
    for step in range(4):
        nvtx.push_range("decode_step[eager]", domain="graphrt")
        for layer in range(2):
            nvtx.push_range(f"model.layers.{layer}.self_attn (Qwen2Attention)", domain="graphrt")
            nvtx.pop_range(domain="graphrt")
            nvtx.push_range(f"model.layers.{layer}.mlp (Qwen2MLP)", domain="graphrt")
            nvtx.pop_range(domain="graphrt")
        copy = nvtx.start_range("copy_in", domain="graphrt")
        nvtx.end_range(copy)
        nvtx.pop_range(domain="graphrt")
    nvtx.push_range("outside")
    nvtx.pop_range()
""")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """An NVTX-only trace of NVTX_SCRIPT: (report path, its SQLite export)."""
    if shutil.which("nsys") is None:
        pytest.skip("nsys (Nsight Systems CLI) not on PATH")
    tmp = tmp_path_factory.mktemp("nsys")
    script = tmp / "ranges.py"
    script.write_text(NVTX_SCRIPT)
    nsys_runs.profile(script, tmp / "ranges", "-t", "nvtx,osrt")
    report = tmp / "ranges.nsys-rep"
    export = nsys_runs.export(report, tmp / "exported.sqlite")
    return report, export


@pytest.mark.processes
@pytest.mark.nsys
def test_range_totals_agree_with_nsys_stats(recorded):
    _, export = recorded
    rows = list(csv.DictReader(io.StringIO(nsys_runs.nvtx_sums(export))))
    # nvtxsum names a range `domain:name`, or just `name` in the default domain
    expected = {row["Range"]: (int(row["Instances"]), int(row["Total Time (ns)"])) for row in rows}
    report = analyze(load_trace(export))
    got = {(f"{f.domain}:{f.key}" if f.domain else f.key): (f.count, f.total_ns) for f in report.by_name}
    assert got == expected
    assert expected["graphrt:decode_step[eager]"][0] == 4
    assert expected["graphrt:model.layers.1.mlp (Qwen2MLP)"][0] == 4


@pytest.mark.processes
@pytest.mark.nsys
def test_an_nvtx_only_trace_reports_steps_and_says_it_has_no_kernels(recorded):
    _, export = recorded
    report = analyze(load_trace(export))
    assert report.notes == ["no CUDA kernels in this trace: NVTX ranges only"]
    (group,) = report.step_groups
    assert (group.name, len(group.steps)) == ("decode_step[eager]", 4)
    kinds = {f.key: f.count for f in report.by_kind}
    assert kinds == {"attention": 8, "mlp": 8, "other": 1}  # `outside`; copy_in is a step range


@pytest.mark.processes
@pytest.mark.nsys
def test_a_report_is_exported_beside_itself_and_read(recorded):
    report_path, export = recorded
    with nsys_runs.one_at_a_time():  # exports the report with nsys
        from_report = load_trace(report_path)
    assert report_path.with_suffix(".sqlite").is_file()
    assert from_report.source == str(report_path)
    assert from_report.ranges == load_trace(export).ranges


@pytest.mark.parametrize("path", [OLD, NEW], ids=["nsys2022.2", "nsys2026.2"])
def test_a_global_thread_id_holds_the_pid_nsys_lists_for_its_process(path):
    from graphrt.trace.read.nsys_sqlite import split_global_tid

    processes = sql(path, "SELECT globalPid, pid FROM PROCESSES")
    assert processes and all(split_global_tid(global_pid)[0] == pid for global_pid, pid in processes)
    # pid in bits 24..47, tid in bits 0..23, above them the host's id
    assert split_global_tid((1 << 56) | (4242 << 24) | 4243) == (4242, 4243)


def test_kernels_are_named_by_their_short_name(export):
    path, trace, _ = export
    expected = [name for (name,) in sql(
        path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
              "ORDER BY k.start")]
    assert sorted(k.name for k in trace.kernels) == sorted(expected)


def test_kernels_carry_the_graph_node_the_export_gives_them(export):
    """Both releases write `graphNodeId` on every kernel; these recordings launched none from a
    graph node (NULL throughout), so no kernel claims one."""
    path, trace, _ = export
    (with_node,) = sql(path, "SELECT COUNT(graphNodeId) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId != 0")
    assert with_node == (0,) and len(trace.kernels) > 0
    assert all(k.graph_node_id is None for k in trace.kernels)


def test_a_replayed_graph_node_kernel_keeps_its_node_id(tmp_path):
    """An export shaped like the real ones, where two kernels came from graph nodes: their
    graphNodeId is read; NULL or 0 (a kernel launched on its own) is none."""
    node = (5 << 32) | 2
    db = tmp_path / "replay.sqlite"
    with closing(sqlite3.connect(db)) as con:
        con.executescript(f"""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,
                correlationId INT, globalPid INT, shortName INT, graphNodeId INT, graphId INT);
            INSERT INTO StringIds VALUES (1, 'gemm'), (2, 'fill');
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
                (1000, 2000, 0, 7, 1, 0, 1, {node}, 5), (2000, 2500, 0, 7, 1, 0, 1, {node + 1}, 5),
                (3000, 3100, 0, 7, 2, 0, 2, NULL, NULL), (4000, 4100, 0, 7, 3, 0, 2, 0, 0);
        """)
    assert [(k.name, k.graph_node_id, k.graph_id) for k in load_trace(db).kernels] == [
        ("gemm", node, 5), ("gemm", node + 1, 5), ("fill", None, None), ("fill", None, 0)]
