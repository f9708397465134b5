"""`graphrt run` times every mode before it counts anything, and keeps each mode as it finishes.

Counting a step's launches opens torch.profiler on CUDA, and CUPTI stays attached after it: every
later launch pays for it, and an eager step has a thousand launches where a replay has one. So the
timed steps of all modes come first, and one extra step per mode is counted afterwards, all in one
profiler session.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from children import interruptible

from graphrt.backends import peer
from graphrt.measure import nvtx
from graphrt.measure.profiling import sessions_opened
from graphrt.run import execute
from graphrt.run.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]


def _steps_and_counts(events):
    """The step ranges outside any count range, and the count ranges, as indices into pushes."""
    steps, counts, inside = [], [], 0
    for i, (kind, name) in enumerate(events):
        if name.startswith("count["):
            inside += 1 if kind == "push" else -1
            if kind == "push":
                counts.append((i, name))
        elif kind == "push" and name.startswith(("decode_step[", "replay[")) and not inside:
            steps.append(i)
    return steps, counts


def test_launches_are_counted_after_every_mode_is_timed():
    with nvtx.record_to([]) as events:
        result = execute.run(RunSpec(model="tiny", device="cpu", steps=6, mode="both"))
    steps, counts = _steps_and_counts(events)
    # and HF's step, for the table's reference row, counted last (where transformers is installed)
    reference = [] if peer.unavailable() else ["count[hf]"]
    assert [name for _, name in counts] == ["count[eager]", "count[graph]", *reference]
    # every decode step of both modes, then one more step each that runs before the count
    # (whatever a step does once stays out of it), none of them inside a count range
    assert len(steps) == 2 * 6 + 2 + len(reference)
    assert max(steps) < min(i for i, _ in counts)
    eager, graph = result.generations["eager"], result.generations["graph"]
    assert eager.launches.ops > 0 and graph.launches.ops >= eager.launches.ops


@pytest.mark.processes
@pytest.mark.inductor
def test_a_run_stopped_in_a_later_mode_keeps_the_modes_that_finished(tmp_path):
    # The run is stopped (as a timeout would) once its last mode, compile, has started: the
    # rows and the JSON of the three modes before it are already out.
    out = tmp_path / "run.json"
    child = interruptible(
        [sys.executable, "-m", "graphrt", "run", "--model", "tiny", "--device", "cpu",
         "--steps", "4", "--mode", "all", "--json", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in child.stderr:
            if line.startswith("running compile"):
                break
        child.send_signal(signal.SIGTERM)
        stdout, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode != 0
    finished = ["eager", "piecewise", "graph"]
    rows = [line.split()[0] for line in stdout.splitlines() if line.split()[:1] in ([m] for m in finished)]
    assert rows == finished
    written = json.loads(out.read_text())
    assert list(written["modes"]) == finished
    assert written["modes"]["graph"]["generated_ids"] == written["modes"]["eager"]["generated_ids"]
    assert written["modes"]["piecewise"]["generated_ids"] == written["modes"]["eager"]["generated_ids"]


def test_a_mode_that_cannot_run_here_fails_before_any_mode_runs(cli, monkeypatch):
    monkeypatch.setenv("PATH", "")  # no C++ compiler: compile cannot run on this CPU
    result = cli("run", "--model", "tiny", "--device", "cpu", "--steps", "4", "--mode", "all")
    assert result.exit_code == 1
    assert "needs a C++ compiler" in result.stderr
    assert "running eager" not in result.stderr and result.stdout == ""


@pytest.mark.inductor
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_counts_every_mode_in_one_profiler_session():
    # CUPTI 13.0 mis-links graph launches in every session after a process's first: one session
    # for all modes keeps each mode's replays in the same session, the first of a fresh process
    opened = sessions_opened()
    result = execute.run(RunSpec(model="tiny", device="cuda", steps=4, mode="all"))
    sessions = {gen.launches.profiler_session for gen in result.generations.values()}
    assert sessions == {opened + 1} == {sessions_opened()}
    graph, eager = result.generations["graph"].launches, result.generations["eager"].launches
    assert (graph.graph_launches, eager.graph_launches) == (1, 0)
    assert graph.copies >= 2 and graph.ops >= eager.ops  # tokens and positions copied in
