"""`graphrt trace`: what the traces it writes hold, checked against what the same decode step does
with no profiler watching; the directory it makes; one clear line for each kind of bad input; and
that no process it starts outlives it."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import nsys_runs
import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_RECORDED_STEPS as RECORDED_STEPS
from conftest import TINY_TRACE_ARGS as TINY

from graphrt.backends.eager import EagerBackend
from graphrt.cli.main import main
from graphrt.errors import GraphrtError
from graphrt.measure import nvtx
from graphrt.measure.opcount import op_names
from graphrt.run import execute
from graphrt.run.spec import RunSpec
from graphrt.trace import Range, Trace, load_trace
from graphrt.trace.analysis.steps import analyze
from graphrt.trace.record.make_traces import publish
from graphrt.trace.record.nsys_profile import choose_profiler, run_bounded

needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="needs the Nsight Systems CLI on PATH")


def _invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def eager_step() -> tuple[list[str], list[str]]:
    """One eager step of `tiny`, run with no profiler: the module ranges it pushes, in order, and
    the ops it dispatches as `graphrt run` counts them (graphrt.measure.opcount: views left out)."""
    _, model, _, _ = execute.load(RunSpec(model="tiny", device="cpu"))
    model.setup_cache(1, 16)
    backend = EagerBackend(model)
    tokens, positions = torch.zeros(1, 1, dtype=torch.long), torch.full((1,), 8)
    with torch.inference_mode(), nvtx.attach(model):
        with nvtx.record_to([]) as events:
            backend.step(tokens, positions)
        ops = op_names(lambda: backend.step(tokens, positions))
    modules = [name for kind, name in events if kind == "push" and name != "decode_step[eager]"]
    return modules, ops


def _inside(trace: Trace, outer: Range, items):
    """The items on `outer`'s thread that lie within it (itself left out)."""
    return [x for x in items if x != outer and (x.pid, x.tid) == (outer.pid, outer.tid)
            and outer.start_ns <= x.start_ns and x.end_ns <= outer.end_ns]


def _steps(trace: Trace) -> list[Range]:
    return [r for r in trace.ranges if r.name == "decode_step[eager]"]


def _only_dir(parent: Path) -> Path:
    (made,) = parent.iterdir()  # and no scratch directory left beside it
    return made


# ---------------------------------------------------------------------------------------------
# Nsight Systems


@pytest.fixture(scope="module")
def nsys_eager(tmp_path_factory) -> tuple[Path, str]:
    """`graphrt trace --profiler nsys --mode eager` of tiny: the trace directory and what it printed."""
    out = tmp_path_factory.mktemp("traces")
    with nsys_runs.one_at_a_time():
        result = _invoke("trace", "--profiler", "nsys", "--mode", "eager", *TINY, "--out", out)
    assert result.exit_code == 0, result.output
    return _only_dir(out), result.output


@pytest.mark.nsys
@pytest.mark.slow
@needs_nsys
def test_nsys_trace_holds_one_range_per_module_call_in_each_recorded_step(nsys_eager, eager_step):
    made, output = nsys_eager
    modules, _ = eager_step
    assert made.name.endswith("-tiny-eager")
    assert sorted(p.name for p in made.iterdir()) == ["eager.nsys-rep", "eager.sqlite", "summary.json"]
    assert f"wrote {made}/" in output and "graphrt analyze" in output and "File > Open" in output

    trace = load_trace(made / "eager.sqlite")
    steps = _steps(trace)
    assert len(steps) == RECORDED_STEPS  # the warmup step is outside the recording
    for step in steps:
        assert sorted(r.name for r in _inside(trace, step, trace.ranges)) == sorted(modules)
    # prefill and warmup ran before the capture range opened
    assert {r.name for r in trace.ranges} == {"record", "decode_step[eager]", *modules}

    summary = json.loads((made / "summary.json").read_text())
    assert summary["profiler"]["name"] == "nsys"
    assert summary["modes"]["eager"]["recorded_steps"] == RECORDED_STEPS
    assert summary["spec"]["model"] == "tiny" and summary["machine"]["device"] == "cpu"


@pytest.mark.nsys
@pytest.mark.slow
@needs_nsys
def test_analyze_of_the_nsys_trace_agrees_with_nsys_stats(nsys_eager, eager_step):
    made, _ = nsys_eager
    modules, _ = eager_step
    sqlite = made / "eager.sqlite"
    by_name = {(f.domain, f.key): f for f in analyze(load_trace(sqlite)).by_name}
    for name in set(modules):
        assert by_name[("graphrt", name)].count == RECORDED_STEPS * modules.count(name)

    table = nsys_runs.nvtx_sums(sqlite)
    nvtxsum = {row["Range"]: row for row in csv.DictReader(table.splitlines()) if row["Range"]}
    assert set(nvtxsum) == {f"{domain}:{name}" for domain, name in by_name}
    for (domain, name), figures in by_name.items():
        row = nvtxsum[f"{domain}:{name}"]
        assert (int(row["Instances"]), int(row["Total Time (ns)"])) == (figures.count, figures.total_ns)


@pytest.mark.nsys
@pytest.mark.slow
@needs_nsys
def test_a_failing_recorded_process_is_one_line_and_leaves_nothing(tmp_path):
    # the graph backend refuses batch 3 with buckets up to 2, in the process nsys started
    with nsys_runs.one_at_a_time():
        result = _invoke("trace", "--profiler", "nsys", "--mode", "graph", *TINY, "--batch", 3,
                         "--buckets", "1,2", "--out", tmp_path)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (
        "error: nsys profile of the graph decode failed (exit status 1): error: batch 3 exceeds "
        "the largest graph bucket 2 (--buckets 1,2); add a bucket of at least 3")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# torch.profiler


def _is_view(op: str) -> bool:
    """True for an aten op declared to return a view of an input (`aten::view`, `aten::to`, ...)."""
    packet = getattr(torch.ops.aten, op.removeprefix("aten::"))
    return any(getattr(packet, overload).is_view for overload in packet.overloads())


def _top_level(ops):
    """The ops not called from inside another op (aten::linear, not the addmm it runs)."""
    ops = sorted(ops, key=lambda op: (op.start_ns, -op.end_ns))
    top, end = [], None
    for op in ops:
        if end is None or op.start_ns >= end:
            top.append(op)
            end = op.end_ns
    return top


def test_torch_trace_of_each_step_holds_the_ops_the_run_counts(tiny_torch_recording, eager_step):
    made, _ = tiny_torch_recording
    modules, ops = eager_step
    summary = json.loads((made / "summary.json").read_text())
    assert summary["modes"]["eager"]["ops_per_step"] == len(ops)  # the run's own count

    trace = load_trace(made / "eager.json")
    steps = _steps(trace)
    assert len(steps) == RECORDED_STEPS
    run_ops = Counter("aten::" + name.split(".")[1] for name in ops)  # aten.mul.Tensor -> aten::mul
    for step in steps:
        top = [op.name for op in _top_level(_inside(trace, step, trace.cpu_ops))]
        # the profiler also shows view ops, which the run's count leaves out as doing no work
        assert Counter(name for name in top if not _is_view(name)) == run_ops
        # record_function ranges mirror the NVTX ranges
        assert sorted(r.name for r in _inside(trace, step, trace.ranges)) == sorted(modules)
    # what analyze calls a step's CPU ops is the top-level ops, views included
    (group,) = analyze(trace).step_groups
    assert [s.cpu_ops for s in group.steps] == [len(_top_level(_inside(trace, s, trace.cpu_ops)))
                                               for s in steps]


def test_torch_both_records_two_traces_and_sets_them_side_by_side(tiny_torch_recording):
    made, output = tiny_torch_recording
    assert made.name.endswith("-tiny-both")
    assert sorted(p.name for p in made.iterdir()) == ["eager.json", "graph.json", "summary.json"]
    graph = load_trace(made / "graph.json")
    # a replay runs no Python: no module range in the recorded graph steps
    assert Counter(r.name for r in graph.ranges) == {
        "record": 1, "copy_in": RECORDED_STEPS, "replay[bs=1]": RECORDED_STEPS}
    assert "graph.json: replay[bs=1] against eager.json: decode_step[eager]" in output
    assert f"graphrt analyze {made}" in output
    summary = json.loads((made / "summary.json").read_text())
    assert summary["profiler"]["name"] == "torch.profiler"
    assert summary["modes"]["graph"]["files"] == {"chrome": "graph.json"}
    assert summary["nvtx_overhead"] is None


@pytest.mark.processes
def test_overhead_is_measured_and_kept_in_the_summary(tmp_path, eager_step):
    result = _invoke("trace", "--profiler", "torch", "--mode", "eager", *TINY, "--overhead", 8,
                     "--out", tmp_path)
    assert result.exit_code == 0, result.output
    overhead = json.loads((_only_dir(tmp_path) / "summary.json").read_text())["nvtx_overhead"]
    assert overhead["on_ms"]["n"] == overhead["off_ms"]["n"] == 8
    modules, _ = eager_step
    assert overhead["ranges"] == len(modules) + 1  # every module call and the step
    assert "NVTX ranges on vs off: median eager step" in result.output


# ---------------------------------------------------------------------------------------------
# The directory, bad input


def test_a_taken_name_gets_a_suffix_and_existing_traces_stay(tmp_path):
    wanted = tmp_path / "20250101-120000-tiny-eager"
    wanted.mkdir()
    (wanted / "eager.json").write_text("mine")
    (tmp_path / f"{wanted.name}-2").mkdir()  # an empty directory is taken too
    scratch = tmp_path / ".scratch"
    scratch.mkdir()
    (scratch / "summary.json").write_text("{}")
    assert publish(scratch, wanted) == tmp_path / f"{wanted.name}-3"
    assert (wanted / "eager.json").read_text() == "mine"
    assert (tmp_path / f"{wanted.name}-3" / "summary.json").is_file() and not scratch.exists()


def test_auto_takes_nsys_only_where_it_is_on_path(tmp_path, monkeypatch):
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert choose_profiler("auto") == "torch"
    nsys.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert choose_profiler("auto") == "nsys"


def test_nsys_asked_for_but_not_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = _invoke("trace", "--profiler", "nsys", *TINY, "--out", tmp_path / "traces")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --profiler nsys: no nsys (Nsight Systems CLI) on PATH; "
                                    "install it with scripts/install-nsys.sh PREFIX")
    assert not (tmp_path / "traces").exists()


def test_a_traces_directory_that_cannot_be_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = _invoke("trace", "--profiler", "torch", *TINY, "--out", blocker / "traces")
    assert result.exit_code == 1
    assert result.stderr == (f"error: {blocker / 'traces'}: cannot write traces here (Not a directory); "
                             "pass --out DIR with a directory you can write\n")


@pytest.mark.parametrize("args, message", [
    (("--mode", "compile"), "Invalid value for '--mode'"),
    (("--profiler", "perf"), "Invalid value for '--profiler'"),
    (("--steps", "1"), "--steps must be at least 2"),
    (("--overhead", "3"), "--overhead must be at least 8 steps"),
    (("--model", "no-such-model"), "unknown model 'no-such-model'"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    result = _invoke("trace", *TINY, *args, "--out", tmp_path)
    assert result.exit_code in (1, 2)
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Processes


def _gone(pid: int, within_s: float = 10) -> bool:
    """True once `pid` has ended (a SIGKILL takes effect when the process is next scheduled)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state == "Z":  # a zombie has ended; only its exit status is left
            return True
        time.sleep(0.05)
    return False


# Starts what `nsys profile` starts: a process in a session of its own below it (the profiled
# program) and a detached agent named after its pid; prints both pids, then hangs or returns.
_FAKE_NSYS = """
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
app = subprocess.Popen(sleep, **quiet)
agent = subprocess.Popen(sleep + ["--start-agent", f"--session-name=profile-python-{os.getpid()}"], **quiet)
print(app.pid, agent.pid, flush=True)
if sys.argv[1] == "hang":
    time.sleep(120)
"""


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_timeout_kills_everything_the_command_started(tmp_path):
    script = tmp_path / "fake_nsys.py"
    script.write_text(_FAKE_NSYS)
    pids = tmp_path / "pids"
    # the pids go to a file: the output pipe is not read back after a kill
    wrapper = f"import subprocess, sys; subprocess.run([sys.executable, {str(script)!r}, 'hang'], stdout=open({str(pids)!r}, 'w'))"
    with pytest.raises(GraphrtError, match="did not finish within 4 s and was killed"):
        run_bounded([sys.executable, "-c", wrapper], timeout_s=4)
    app, agent = map(int, pids.read_text().split())
    # the agent is named after the fake nsys's pid, not the wrapper's: found by the tree walk
    assert _gone(app) and _gone(agent)


@pytest.mark.processes
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_an_agent_left_after_a_finished_run_is_killed(tmp_path):
    script = tmp_path / "fake_nsys.py"
    script.write_text(_FAKE_NSYS)
    done = run_bounded([sys.executable, str(script), "return"], timeout_s=60)
    app, agent = map(int, done.stdout.split())
    assert done.returncode == 0
    assert _gone(agent)
    os.kill(app, signal.SIGKILL)  # the profiled program is nsys's to end; here nobody would
