"""`graphrt bench` end to end on the CPU: the baseline scenario's JSON and plot, comparing two
results, and what an interrupted sweep leaves behind."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from children import interruptible, sigint_ignored
from click.testing import CliRunner

from graphrt.bench.scenario import load_scenario
from graphrt.bench.sweep import Sweep
from graphrt.cli.main import main
from graphrt.measure import nvtx
from graphrt.measure.roofline import step_cost
from graphrt.model.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "scenarios" / "baseline.toml"
HAS_TRANSFORMERS = True
try:
    import transformers  # noqa: F401
except ImportError:
    HAS_TRANSFORMERS = False

# Many short points, so a sweep is reliably still running when it is interrupted.
LONG_SWEEP = """
models = ["tiny"]
modes = ["eager", "graph"]
batch_sizes = [1, 2, 3, 4, 5, 6, 7, 8]
context_lengths = [16, 32, 48]
steps = 40
warmup = 1
repeats = 1
peer = false
threads = 1
"""


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The shipped baseline scenario, cut to 3 timed steps and 1 repeat; (result, its JSON path)."""
    out = tmp_path_factory.mktemp("results")
    result = CliRunner().invoke(main, ["bench", str(BASELINE), "--out", str(out),
                                       "--steps", "3", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    (path,) = out.glob("baseline-*.json")
    return result, path


@pytest.mark.slow  # a benchmark sweep of its own, or the shared baseline's
def test_baseline_json_holds_every_point_and_mode(baseline):
    _, path = baseline
    doc = json.loads(path.read_text())
    assert doc["format"] == "graphrt-bench/1" and doc["partial"] is False and doc["stopped_at"] is None
    assert doc["scenario"]["overridden"] == ["steps", "repeats"] and doc["scenario"]["steps"] == 3
    assert doc["machine"]["device"] == "cpu" and doc["machine"]["measured"]["copy_bandwidth"] > 0
    expected_modes = ["eager", "piecewise", "graph", *(["hf"] if HAS_TRANSFORMERS else [])]
    assert doc["modes"] == expected_modes
    config = PRESETS["tiny"]
    assert [(p["batch"], p["context"]) for p in doc["points"]] == [
        (1, 64), (4, 64), (16, 64), (1, 512), (4, 512), (16, 512)]
    for p in doc["points"]:
        assert p["max_seq_len"] == p["context"] + 4 + 3  # warmup + timed steps fit
        assert list(p["modes"]) == expected_modes
        for mode, m in p["modes"].items():
            t = m["step_ms"]
            assert t["n"] == 3 == len(m["samples_ms"]) and m["host_ms"]["n"] == 3
            assert 0 < t["p10"] <= t["median"] <= t["p90"]
            assert m["ops_per_step"] > 0
            cost = step_cost(config, p["batch"], p["max_seq_len"], 4)
            assert m["roofline"]["bytes"] == cost.bytes and m["roofline"]["flops"] == cost.flops
            assert m["roofline"]["bound"] in ("memory", "compute")
        assert p["modes"]["eager"]["speedup_vs_eager"] == 1.0
        assert p["modes"]["graph"]["same_tokens_as_eager"] is True
        assert p["modes"]["piecewise"]["same_tokens_as_eager"] is True
        if HAS_TRANSFORMERS:  # it keeps its own positions: comparable only from the prompt's end
            assert p["modes"]["hf"]["same_tokens_as_eager"] is None
        # the cache holds the largest graph bucket's rows: the batch itself for powers of two
        kv = 2 * config.num_hidden_layers * p["batch"] * config.num_key_value_heads \
            * p["max_seq_len"] * config.head_dim * 4
        assert p["memory"]["cache_bytes"] == kv
        assert p["memory"]["note"] == "CPU allocator peaks are not measured"


@pytest.mark.slow  # a benchmark sweep of its own, or the shared baseline's
def test_baseline_prints_the_table_and_writes_a_plot(baseline):
    result, path = baseline
    lines = result.stdout.splitlines()
    assert lines[0].startswith("baseline · ") and "float32" in lines[0]
    assert any(line.split()[:5] == ["tiny", "1", "16", "512", "graph"] for line in lines)
    assert "aten ops" in result.stdout and "bound" in result.stdout
    assert f"wrote {path}" in result.stdout
    assert path.with_suffix(".png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "bench baseline" in result.stderr  # the progress bar's label, on stderr


@pytest.mark.slow  # a benchmark sweep of its own, or the shared baseline's
def test_compare_shows_the_change_point_by_point(baseline, tmp_path, cli):
    _, path = baseline
    doc = json.loads(path.read_text())
    slower = copy.deepcopy(doc)
    for p in slower["points"]:
        p["modes"]["graph"]["step_ms"]["median"] *= 2
        del p["tp"]  # as results written before tp was swept: their points are tp 1
    del slower["points"][-1]
    other = tmp_path / "slower.json"
    other.write_text(json.dumps(slower))
    result = cli("bench", "--compare", path, other)
    assert result.exit_code == 0, result.output
    rows = {tuple(line.split()[:5]): line.split() for line in result.stdout.splitlines()
            if line.startswith("tiny ")}
    assert rows[("tiny", "1", "1", "64", "graph")][7].startswith("+100.0%")
    assert rows[("tiny", "1", "1", "64", "eager")][7] == "+0.0%"
    assert rows[("tiny", "1", "16", "512", "eager")][6:8] == ["-", "-"]  # missing from B


def test_compare_refuses_a_file_that_is_not_a_result(tmp_path, cli):
    bogus = tmp_path / "x.json"
    bogus.write_text('{"points": []}')
    result = cli("bench", "--compare", bogus, bogus)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {bogus}: not a graphrt bench result (expected format 'graphrt-bench/1')"


@pytest.mark.slow
def test_an_interrupt_keeps_the_finished_points_and_says_where(tmp_path):
    path = tmp_path / "long.toml"
    path.write_text(LONG_SWEEP)
    measured = []

    def stop_at_the_fourth(label):  # point 1: eager, graph; point 2: eager, then Ctrl-C
        measured.append(label)
        if len(measured) == 4:
            raise KeyboardInterrupt

    doc = Sweep(load_scenario(path)).run(on_measure=stop_at_the_fourth)
    assert doc["partial"] is True and doc["finished_at"] is None
    assert [(p["batch"], p["context"]) for p in doc["points"]] == [(1, 16)]
    assert doc["stopped_at"] == {"point": 2, "of": 24, "label": "tiny batch 2 context 16",
                                 "mode": "graph"}


SHORT_SWEEP = """
models = ["tiny"]
modes = ["eager", "graph"]
batch_sizes = [1, 2, 3]
context_lengths = [16]
steps = 3
warmup = 1
repeats = 1
peer = false
"""


@pytest.mark.slow
def test_every_point_is_timed_before_any_point_is_counted(tmp_path):
    # counting opens a profiler session on CUDA, and CUPTI stays attached after it, taxing every
    # later eager launch: no point may be timed once one is counted (each timed decode begins
    # with its prefill)
    path = tmp_path / "short.toml"
    path.write_text(SHORT_SWEEP)
    sweep = Sweep(load_scenario(path))
    heard = []
    with nvtx.record_to([]) as events:
        doc = sweep.run(on_measure=heard.append)
    pushes = [name for kind, name in events if kind == "push"]
    prefills = [i for i, name in enumerate(pushes) if name == "prefill"]
    counts = [name for name in pushes if name.startswith("count[")]
    assert len(prefills) == 3 * 2 and max(prefills) < pushes.index("count[eager]")
    assert counts == ["count[eager]", "count[graph]"] * 3
    for point in doc["points"]:
        eager, graph = point["modes"]["eager"], point["modes"]["graph"]
        assert eager["ops_per_step"] > 0 and graph["ops_per_step"] >= eager["ops_per_step"]
    assert len(heard) == sweep.total and heard[-1] == "tiny batch 3 context 16: counting launches"


@pytest.mark.slow
def test_a_sweep_stopped_while_counting_keeps_its_timed_points_with_launches_unknown(tmp_path):
    path = tmp_path / "short.toml"
    path.write_text(SHORT_SWEEP)

    def stop_at_the_second_count(label):
        if label == "tiny batch 2 context 16: counting launches":
            raise KeyboardInterrupt

    doc = Sweep(load_scenario(path)).run(on_measure=stop_at_the_second_count)
    assert doc["partial"] is True and len(doc["points"]) == 3
    assert [p["modes"]["eager"]["ops_per_step"] is None for p in doc["points"]] == [False, True, True]
    assert doc["stopped_at"]["label"] == "tiny batch 2 context 16: counting launches"


def _points_saved(out, earlier) -> int:
    """Points in the sweep's JSON so far (written whole, then renamed: never read half-written)."""
    written = [p for p in out.glob("long-*.json") if p != earlier]
    return len(json.loads(written[0].read_text())["points"]) if written else 0


@pytest.mark.processes
@pytest.mark.slow  # a benchmark sweep of its own, or the shared baseline's
def test_sigint_mid_sweep_leaves_earlier_files_and_writes_a_partial_result(tmp_path):
    scenario = tmp_path / "long.toml"
    scenario.write_text(LONG_SWEEP)
    out = tmp_path / "results"
    out.mkdir()
    earlier = out / "long-20000101-000000.json"
    earlier.write_text('{"an": "earlier run"}\n')
    # the child imports this checkout's graphrt and runs in its root, where `make mutate`'s
    # config (setup.cfg) is found by the mutated copy's trampolines
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with sigint_ignored():  # as when the suite runs as a background job: the child must still hear it
        proc = interruptible([sys.executable, "-m", "graphrt", "bench", str(scenario), "--out", str(out)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _points_saved(out, earlier) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "two points did not finish in two minutes"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # after two points were saved, long before the last
    stdout, stderr = proc.communicate(timeout=120)

    assert proc.returncode == 130, stderr
    assert earlier.read_text() == '{"an": "earlier run"}\n'
    (written,) = [p for p in out.glob("long-*.json") if p != earlier]
    assert not list(out.glob(".*.tmp"))  # no half-written file left behind
    doc = json.loads(written.read_text())
    assert doc["partial"] is True and 1 <= len(doc["points"]) < 24
    at = doc["stopped_at"]
    assert at["of"] == 24
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"interrupted at point {at['point']} of 24 (tiny batch ")
    assert last.endswith(f"{len(doc['points'])} of 24 points finished")
    assert f"wrote {written} (partial)" in stdout
    # the plot is drawn from the points that finished: a cut sweep still has its picture
    assert written.with_suffix(".png").stat().st_size > 0
    assert "Traceback" not in stderr
