"""torch.profiler sessions: numbered per process, so each measurement says which session took it
(CUPTI 13.0 links graph kernels to their launches only in a process's first), and quiet: kineto's
progress lines never reach the user."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrt.measure.profiling import KINETO_PROGRESS, profiler_session, sessions_opened

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def test_sessions_are_numbered_in_the_order_the_process_opens_them():
    before = sessions_opened()
    with profiler_session(CPU) as first:
        torch.ones(2) + 1
    with profiler_session(CPU) as second:
        torch.ones(2) * 2
    assert (first.number, second.number) == (before + 1, before + 2) == (before + 1, sessions_opened())
    assert any(e.name == "aten::mul" for e in second.profile.events())


@pytest.mark.processes
def test_a_fresh_process_opens_session_one():
    code = ("import torch; from graphrt.measure.profiling import profiler_session\n"
            "with profiler_session(torch.device('cpu')) as s: pass\nprint(s.number)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout == "1\n"


@pytest.mark.processes
def test_a_session_leaves_kinetos_progress_lines_out_and_every_other_line_in():
    # kineto writes `USDT: ... profiler_start` to fd 2 from C++; a line written to fd 2 while the
    # session starts, and one printed inside it, still reach the user, in order
    code = ("import os, sys, torch\n"
            "from graphrt.measure import profiling\n"
            "start = torch.profiler.profile.start\n"
            "def loud_start(self):\n"
            "    os.write(2, b'a line of the start\\n')\n"
            "    start(self)\n"
            "torch.profiler.profile.start = loud_start\n"
            "with profiling.profiler_session(torch.device('cpu')):\n"
            "    print('a line of the block', file=sys.stderr, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stderr.splitlines() == ["a line of the start", "a line of the block"]


def test_kinetos_progress_lines_are_told_from_others():
    assert KINETO_PROGRESS.match("USDT:2026-12-05 00:18:14 5434:5434 SyncActivityProfilerHandler.cpp:52] profiler_start")
    assert KINETO_PROGRESS.match("STAGE:2024-01-21 17:27:31 1356:1356 ActivityProfilerController.cpp:312] "
                                 "Completed Stage: Warm Up")
    assert not KINETO_PROGRESS.match("[W collection.cpp:929] Warning: Failed to recover relationship")
    assert not KINETO_PROGRESS.match("error: USDT:2026-12-05 00:18:14 5434:5434 x.cpp:52] quoted")


@pytest.mark.processes
def test_trace_prints_nothing_but_its_own_lines(tmp_path):
    done = subprocess.run([sys.executable, "-m", "graphrt", "trace", "--profiler", "torch", "--model", "tiny",
                           "--steps", "4", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["recording eager under torch.profiler…", "recording graph under torch.profiler…"]


def test_each_mode_is_recorded_in_the_first_profiler_session_of_a_process_of_its_own(tiny_torch_traces):
    # this test process has opened sessions before: a mode recorded here would say so
    modes = json.loads((tiny_torch_traces / "summary.json").read_text())["modes"]
    assert {mode: m["profiler_session"] for mode, m in modes.items()} == {"eager": 1, "graph": 1}
    assert all(m["ops_per_step"] > 0 for m in modes.values())  # on the CPU, counted by dispatch


def test_a_session_records_the_gpu_only_on_cuda():
    # on CUDA the kernels, copies and their launches are the point; a CPU has only its ops
    from graphrt.measure.profiling import profiler_activities

    cpu, gpu = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
    assert profiler_activities(torch.device("cpu")) == [cpu]
    assert profiler_activities(torch.device("cuda")) == [cpu, gpu]
    assert profiler_activities(torch.device("meta")) == [cpu]
