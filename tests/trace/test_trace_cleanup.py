"""A recording that is stopped leaves nothing half-written under traces/ (docs/design.md, Invariants, 7)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphrt.run.spec import RunSpec
from graphrt.trace.record.make_traces import make_traces

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.processes
def test_a_trace_stopped_with_sigterm_removes_its_partial_directory(tmp_path):
    out = tmp_path / "traces"
    child = subprocess.Popen(
        [sys.executable, "-m", "graphrt", "trace", "--model", "tiny", "--device", "cpu",
         "--profiler", "torch", "--mode", "eager", "--steps", "4000", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while not list(out.glob(".*.partial")):  # it has started writing
            assert child.poll() is None, child.stdout.read()
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode != 0
    assert list(out.iterdir()) == []


@pytest.mark.processes
def test_a_partial_directory_of_a_killed_recording_is_removed_by_the_next_one(tmp_path):
    out = tmp_path / "traces"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = out / f".20260101-000000-tiny-eager.{dead}.partial"
    live = out / f".20260101-000000-tiny-eager.{os.getpid()}.partial"  # a recording under way
    for d in (stale, live):
        d.mkdir(parents=True)
        (d / "eager.json").write_text("{")
    made = make_traces(RunSpec(model="tiny", device="cpu", steps=4, mode="eager"), "torch", out)
    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([live.name, made.path.name])
