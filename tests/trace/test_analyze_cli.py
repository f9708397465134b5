"""`graphrt analyze`: the step and range figures, the eager-vs-graph comparison, the JSON it
writes, and one clear line for each kind of bad input."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from graphrt.trace.analysis.comparisons import compare_steps
from graphrt.trace.analysis.steps import analyze
from graphrt.trace.read.chrome import read_chrome_trace
from graphrt.trace.read.events import ApiCall, Kernel, Range, Trace
from graphrt.trace.read.nsys_sqlite import SQLITE_MAGIC

US = 1000  # ns


def _decode_trace() -> Trace:
    """Three eager steps and two graph replays on one thread, with hand-placed times.

    Eager step (100 µs): attention range launches one kernel, mlp range two; the third step
    launches a fourth kernel outside both. Kernels at +30..40, +65..70, +75..85 µs: 25 µs busy,
    idle gaps of 25 and 5 µs. Replay (30 µs): one cudaGraphLaunch, three kernels sharing its
    correlation id at +15..25, +25..30, +32..40: 23 µs busy, one 2 µs gap.
    """
    ranges, calls, kernels = [], [], []

    def launch(name: str, at: int, dur: int, kernel_spans: list[tuple[int, int]]) -> None:
        calls.append(ApiCall(name, at, at + dur, pid=1, tid=1, correlation_id=len(calls)))
        for start, end in kernel_spans:
            kernels.append(Kernel("k", start, end, device=0, stream=7,
                                  correlation_id=len(calls) - 1, launch=len(calls) - 1))

    for step in range(3):
        t = step * 1000 * US
        ranges += [Range(name, t + start * US, t + end * US, 1, 1, "graphrt") for name, start, end in (
            ("decode_step[eager]", 0, 100),
            ("model.layers.0.self_attn (Qwen2Attention)", 10, 40),
            ("model.layers.0.mlp (Qwen2MLP)", 50, 80))]
        launch("cudaLaunchKernel", t + 20 * US, 5 * US, [(t + 30 * US, t + 40 * US)])
        launch("cudaLaunchKernel", t + 60 * US, 5 * US, [(t + 65 * US, t + 70 * US)])
        launch("cudaLaunchKernelExC", t + 70 * US, 5 * US, [(t + 75 * US, t + 85 * US)])
        if step == 2:
            launch("cudaLaunchKernel", t + 90 * US, 5 * US, [(t + 95 * US, t + 99 * US)])
    for step in range(2):
        t = (5 + step) * 1000 * US
        ranges.append(Range("replay[bs=1]", t, t + 30 * US, 1, 1, "graphrt"))
        launch("cudaGraphLaunch", t + 5 * US, 8 * US,
               [(t + 15 * US, t + 25 * US), (t + 25 * US, t + 30 * US), (t + 32 * US, t + 40 * US)])
    calls.append(ApiCall("cudaStreamSynchronize", 9000 * US, 9001 * US, 1, 1, 999))  # no step's
    return Trace(source="decode.sqlite", kind="nsys", ranges=ranges, kernels=kernels, api_calls=calls)


def test_steps_count_their_launches_and_gpu_time():
    eager, replay = analyze(_decode_trace()).step_groups
    assert (eager.name, len(eager.steps), replay.name, len(replay.steps)) == (
        "decode_step[eager]", 3, "replay[bs=1]", 2)
    first = eager.steps[0]
    assert (first.kernels, first.kernel_launches, first.kernel_launch_ns, first.graph_launches) == (
        3, 3, 15 * US, 0)
    assert (first.gpu_busy_ns, first.gpu_idle_ns, first.idle_gaps, first.median_gap_ns) == (
        25 * US, 30 * US, 2, 15 * US)
    assert [s.kernels for s in eager.steps] == [3, 3, 4]
    assert eager.medians["kernels"] == 3 and eager.medians["wall_ns"] == 100 * US

    graph = replay.steps[0]
    assert (graph.kernels, graph.kernel_launches, graph.graph_launches, graph.graph_launch_ns) == (
        3, 0, 1, 8 * US)
    assert (graph.gpu_busy_ns, graph.gpu_idle_ns, graph.idle_gaps) == (23 * US, 2 * US, 1)


def test_ranges_by_kind_count_each_kernel_once_where_it_was_launched():
    report = analyze(_decode_trace())
    kinds = {f.key: (f.count, f.total_ns, f.kernels, f.gpu_ns) for f in report.by_kind}
    assert kinds == {"attention": (3, 90 * US, 3, 30 * US), "mlp": (3, 90 * US, 6, 45 * US)}
    by_name = {f.key: f.kernels for f in report.by_name}
    assert by_name["decode_step[eager]"] == 10 and by_name["replay[bs=1]"] == 6


def test_the_second_step_group_is_set_against_the_first():
    (comparison,) = compare_steps([analyze(_decode_trace())])
    assert (comparison.baseline, comparison.other) == ("decode_step[eager]", "replay[bs=1]")
    rows = {key: (a, b) for key, _, a, b in comparison.rows}
    assert rows["launches"] == (3, 1)
    assert rows["launch_ns"] == (15 * US, 8 * US)
    assert rows["gpu_idle_ns"] == (30 * US, 2 * US)
    assert "cpu_ops" not in rows  # zero on both sides


def test_graphs_traced_whole_are_called_out():
    trace = _decode_trace()
    assert not any("--cuda-graph-trace" in n for n in analyze(trace).notes)
    trace.meta["cuda_graph_trace"] = "Graph"
    assert any("--cuda-graph-trace=node" in n for n in analyze(trace).notes)


# ---------------------------------------------------------------------------------------------
# The command


def _chrome_cuda_trace(graph: bool, steps: int = 3) -> dict:
    """A torch.profiler-style CUDA trace: per step three kernels, launched one by one (eager)
    or by one cudaGraphLaunch (graph). Times in µs, as Chrome traces have them."""
    events, correlation = [], 0

    def event(cat, name, ts, dur, pid, tid, **args):
        events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                       "pid": pid, "tid": tid, "args": args})

    for s in range(steps):
        t = 1000.0 * s
        event("user_annotation", "replay[bs=1]" if graph else "decode_step[eager]", t, 50.0, 3, 3)
        if graph:
            correlation += 1
            event("cuda_runtime", "cudaGraphLaunch", t + 10, 6.0, 3, 3, correlation=correlation)
            for m in range(3):
                event("kernel", "k", t + 20 + 3 * m, 2.0, 0, 7, device=0, stream=7, correlation=correlation)
        else:
            for j in range(3):
                correlation += 1
                event("cuda_runtime", "cudaLaunchKernel", t + 10 + 10 * j, 4.0, 3, 3, correlation=correlation)
                event("kernel", "k", t + 15 + 10 * j, 2.0, 0, 7, device=0, stream=7, correlation=correlation)
    return {"schemaVersion": 1, "traceEvents": events}


def _graph_kernels_mislinked(trace: dict, correlation) -> dict:
    """`trace` with every graph kernel's correlation id set by `correlation(old id)`: what CUPTI
    13.0 writes in a profiler session after a process's first."""
    launches = {e["args"]["correlation"] for e in trace["traceEvents"] if e["name"] == "cudaGraphLaunch"}
    for e in trace["traceEvents"]:
        if e["cat"] == "kernel" and e["args"]["correlation"] in launches:
            e["args"]["correlation"] = correlation(e["args"]["correlation"])
    return trace


@pytest.mark.parametrize("correlation", [
    lambda old: old + 1000,  # matches no launch: each replay would show 0 kernels
    lambda old: 1,  # all on the first launch: one step would show three replays' kernels
], ids=["matching-no-launch", "all-on-one-launch"])
def test_graph_kernels_not_linked_to_their_launch_are_reported_as_such_never_as_figures(
        cli, tmp_path, correlation):
    eager, graph, out = tmp_path / "eager.json", tmp_path / "graph.json", tmp_path / "figures.json"
    eager.write_text(json.dumps(_chrome_cuda_trace(graph=False)))
    graph.write_text(json.dumps(_graph_kernels_mislinked(_chrome_cuda_trace(graph=True), correlation)))
    result = cli("analyze", eager, graph, "--json", out)
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    replay, eager_figures = figures["traces"][1], figures["traces"][0]
    assert any(note.startswith("graph kernels not linked to their launch: this trace cannot say per-step "
                               "GPU figures for replay") for note in replay["notes"])
    (group,) = replay["step_groups"]
    assert {step["kernels"] for step in group["per_step"]} == {None}
    assert [group["medians"][key] for key in ("kernels", "gpu_busy_ns", "gpu_idle_ns", "idle_gaps")] == [None] * 4
    assert group["medians"]["graph_launches"] == 1  # what the CPU side says still stands
    assert not any("not linked" in note for note in eager_figures["notes"])
    metrics = {m["metric"]: m for m in figures["comparisons"][0]["metrics"]}
    assert (metrics["kernels"]["baseline"], metrics["kernels"]["other"], metrics["kernels"]["removed"]) == (3, None, None)
    assert [(f["key"], f["kernels"], f["gpu_ns"]) for f in replay["by_name"]] == [("replay[bs=1]", None, None)]
    assert "unknown" in result.stdout


def test_graph_kernels_linked_to_their_launches_give_each_replay_its_own(tmp_path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(_chrome_cuda_trace(graph=True)))
    report = analyze(read_chrome_trace(path))
    assert report.counts["graph_launches_without_kernels"] == 0
    assert [s.kernels for s in report.step_groups[0].steps] == [3, 3, 3]
    assert not any("not linked" in note for note in report.notes)
    # the real V100 trace: 12 cudaGraphLaunch calls, each with the kernels of its replay
    real = analyze(read_chrome_trace(Path(__file__).parents[1] / "data" / "torch" / "hta-v100-graph-launches.json.gz"))
    assert (real.counts["graph_launches"], real.counts["graph_launches_without_kernels"]) == (12, 0)
    assert not any("not linked" in note for note in real.notes)


def _analyze_eager_and_graph(cli, tmp_path):
    """`graphrt analyze eager.json graph.json --json figures.json` on the traces above:
    (the result, the figures written)."""
    eager, graph, out = tmp_path / "eager.json", tmp_path / "graph.json", tmp_path / "figures.json"
    eager.write_text(json.dumps(_chrome_cuda_trace(graph=False)))
    graph.write_text(json.dumps(_chrome_cuda_trace(graph=True)))
    result = cli("analyze", eager, graph, "--json", out)
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def test_two_traces_print_side_by_side_and_write_json(cli, tmp_path):
    result, figures = _analyze_eager_and_graph(cli, tmp_path)
    assert "graph.json: replay[bs=1] against eager.json: decode_step[eager]" in result.stdout
    assert [t["step_groups"][0]["name"] for t in figures["traces"]] == ["decode_step[eager]", "replay[bs=1]"]
    metrics = {m["metric"]: (m["baseline"], m["other"], m["removed"])
               for m in figures["comparisons"][0]["metrics"]}
    assert metrics["launches"] == (3, 1, 2)
    assert metrics["launch_ns"] == (12_000, 6_000, 6_000)
    assert metrics["gpu_idle_ns"] == (16_000, 2_000, 14_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eager.json", "figures.json", "graph.json"]


def test_a_trace_directory_stands_for_its_traces_eager_first(cli, tmp_path):
    (tmp_path / "graph.json").write_text(json.dumps(_chrome_cuda_trace(graph=True)))
    (tmp_path / "eager.json").write_text(json.dumps(_chrome_cuda_trace(graph=False)))
    (tmp_path / "summary.json").write_text("{}")  # what graphrt trace writes beside them
    result = cli("analyze", tmp_path)
    assert result.exit_code == 0, result.output
    assert "graph.json: replay[bs=1] against eager.json: decode_step[eager]" in result.stdout


def test_a_directory_without_traces_is_named(cli, tmp_path):
    result = cli("analyze", tmp_path)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {tmp_path}: a directory with no trace in it (expected " \
        "*.sqlite, or Chrome-trace *.json or *.json.gz)"


def test_an_nsys_export_prints_kernels_per_device(cli, tmp_path):
    db = tmp_path / "tiny.sqlite"
    with closing(sqlite3.connect(db)) as con:  # the few tables a kernel-only export has
        con.executescript("""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,
                correlationId INT, globalPid INT, shortName INT);
            INSERT INTO StringIds VALUES (1, 'gemm');
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
                (1000, 4000, 0, 7, 1, 0, 1), (5000, 6000, 1, 7, 2, 0, 1);
        """)
    result = cli("analyze", db)
    assert result.exit_code == 0, result.output
    table = result.stdout[result.stdout.index("Kernels per device"):].splitlines()
    assert table[3].split() == ["0", "1", "3.0", "3.0", "3.0"]
    assert table[4].split() == ["1", "1", "1.0", "1.0", "1.0"]


def _write(tmp_path, name: str, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _sqlite_without_nsys_tables(tmp_path, name: str):
    path = tmp_path / name
    with closing(sqlite3.connect(path)) as con:
        con.execute("CREATE TABLE notes (x)")
        con.commit()
    return path


BAD_INPUTS = {
    "missing": (lambda d: d / "gone.sqlite", "gone.sqlite: no such file"),
    "neither SQLite nor JSON": (lambda d: _write(d, "junk.bin", b"\x00\x01 binary junk"),
                                "junk.bin: neither an Nsight Systems export"),
    "SQLite, not nsys": (lambda d: _sqlite_without_nsys_tables(d, "notes.sqlite"),
                         "notes.sqlite: an SQLite file but not an Nsight Systems export"),
    "corrupt SQLite": (lambda d: _write(d, "torn.sqlite", SQLITE_MAGIC + b"\xff" * 200),
                       "torn.sqlite: cannot read this SQLite file"),
    "JSON, not a trace": (lambda d: _write(d, "config.json", b'{"hidden_size": 896}'),
                          "config.json: JSON but not a Chrome trace"),
    "broken JSON": (lambda d: _write(d, "cut.json", b'{"traceEvents": [{"ph": "X"'),
                    "cut.json: not a readable Chrome-trace JSON"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_one_line_naming_the_file_and_exit_1(cli, tmp_path, case):
    make, message = BAD_INPUTS[case]
    result = cli("analyze", make(tmp_path), "--json", tmp_path / "out.json")
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
    assert not (tmp_path / "out.json").exists()


def test_a_report_without_nsys_on_path_says_how_to_get_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    report = _write(tmp_path, "run.nsys-rep", b"not read without nsys")
    result = cli("analyze", report)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert "run.nsys-rep: reading a report needs the Nsight Systems CLI (nsys) on PATH" in line


def test_graphrt_step_ranges_are_not_module_kinds():
    from graphrt.trace.analysis.steps import range_kind

    for name in ("record", "prefill", "decode_step[eager]", "replay[bs=8]", "capture[bs=8]", "copy_in"):
        assert range_kind(name) is None, name
    assert range_kind("model.layers.3.mlp (Qwen2MLP)") == "mlp"


def test_json_holds_launch_delays_the_idle_split_and_replay_per_module(cli, tmp_path):
    """In the synthetic traces above an eager kernel starts 1 µs after its 4 µs launch call ends
    and 8 µs after the previous kernel, launched only after that one ended: host waits. The
    replay's three kernels, 1 µs apart, all hang off one cudaGraphLaunch that began first:
    kernel waits, and one launch delay (4 µs) for all three."""
    result, figures = _analyze_eager_and_graph(cli, tmp_path)
    assert "Launches and GPU idle" in result.stdout
    eager_steps, graph_steps = (t["launch_idle"]["per_step"] for t in figures["traces"])
    assert len(eager_steps) == len(graph_steps) == 3
    for s in eager_steps:
        assert (s["delay_p50_ns"], s["kernel_launches"], s["graph_fanout"]) == (1_000, 3, [])
        assert s["idle_ns"] == {"host_wait": 16_000, "kernel_wait": 0, "other": 0}
    for s in graph_steps:
        assert (s["delay_p50_ns"], s["graph_launches"], s["graph_fanout"]) == (4_000, 1, [3])
        assert s["idle_ns"] == {"host_wait": 0, "kernel_wait": 2_000, "other": 0}
    (modules,) = figures["replay_modules"]
    assert (modules["eager"], modules["replay"]) == ("eager.json: decode_step[eager]", "graph.json: replay[bs=1]")
    assert (modules["items"], modules["attributed_share"]) == (3, 1.0)
    (row,) = modules["by_kind"]  # no module ranges in these traces
    assert row["key"] == "(no module)"
    assert (row["eager"]["gap_ns"], row["replay"]["gap_ns"], row["removed_ns"]) == (16_000, 2_000, 14_000)


def test_a_replay_alone_says_what_would_attribute_its_kernels(cli, tmp_path):
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(_chrome_cuda_trace(graph=True)))
    result = cli("analyze", graph)
    assert result.exit_code == 0, result.output
    assert ("note: replay[bs=1]: replayed kernels fire no module range; give an eager trace of the same "
            "model and batch beside it to attribute them") in result.stdout
