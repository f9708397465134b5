"""What torch.compile needs besides torch, one rule for the compile mode, the device check and the
tests that compile (graphrt.backends.toolchain)."""

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from graphrt.backends.toolchain import missing_for_compile

REPO = Path(__file__).resolve().parents[2]


def test_without_a_compiler_or_python_h_each_is_named_and_triton_too_on_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})  # no Python.h here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no triton
    assert missing_for_compile("cpu") == ["a C++ compiler (g++, c++ or clang++) on PATH", "Python.h (python3-dev)"]
    assert missing_for_compile("cuda") == ["Triton (pip install triton)", "a C compiler (cc, gcc or clang) on PATH",
                                           "Python.h (python3-dev)"]


def test_a_compiler_named_besides_the_usual_ones_counts(monkeypatch, tmp_path):
    compiler = tmp_path / "my-cxx"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert any("C++ compiler" in m for m in missing_for_compile("cpu"))
    assert not any("C++ compiler" in m for m in missing_for_compile("cpu", also=("my-cxx",)))


@pytest.mark.processes
@pytest.mark.slow  # a pytest of its own
def test_a_test_that_compiles_is_skipped_with_the_reason_on_a_machine_without_a_compiler():
    test = "tests/backends/test_compile_backend.py::test_a_whole_compile_run_timing_and_counting_compiles_the_step_once"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PATH": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "torch.compile on cpu needs a C++ compiler (g++, c++ or clang++) on PATH" in done.stdout
