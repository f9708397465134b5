"""Every command starts at once: `graphrt --help` lists the commands without importing them, each
command's --help, `graphrt info` (without --measure, on any torch) and `graphrt analyze` import no
torch (a second of start-up; gigabytes of libraries on a CUDA build) and no matplotlib."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphrt.cli.main import COMMANDS, SHORT_HELP, main
from graphrt.measure import hardware, host


def _fresh(args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`graphrt ARGS` in a fresh interpreter, and which of torch and matplotlib it imported."""
    probe = ("import sys; from graphrt.cli.main import main\n"
             f"try:\n    main({args!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             "print('IMPORTED', *(m for m in ('torch', 'matplotlib') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    last = done.stderr.strip().splitlines()[-1:]
    assert last and last[0].startswith("IMPORTED"), done.stderr
    return done, set(last[0].split()[1:])


@pytest.mark.processes
def test_graphrt_help_in_a_fresh_interpreter_does_not_import_torch():
    probe = ("import sys; from graphrt.cli.main import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules, 'graphrt.cli.trace_command' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stderr.split() == ["False", "False"], done.stderr
    for name in COMMANDS:
        assert name in done.stdout


@pytest.mark.processes
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_in_a_fresh_interpreter_imports_neither_torch_nor_matplotlib(command):
    done, imported = _fresh([command, "--help"])
    assert imported == set()
    assert "--help" in done.stdout and "Usage: " in done.stdout


def _info_says_what_torch_would_without_importing_it(device: torch.device) -> None:
    done, imported = _fresh(["info"])
    assert imported == set()  # a CUDA torch's libraries are gigabytes: plain info maps none of them
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in done.stdout.splitlines()
                 if not line.startswith("-"))
    told_by_torch = hardware.describe(device)
    told_by_torch.pop("torch_threads", None)  # only torch knows its thread count
    assert shown == {k: "-" if v is None else str(v) for k, v in told_by_torch.items()}


@pytest.mark.processes
def test_graphrt_info_without_a_gpu_says_what_torch_would_without_importing_it():
    # on a CUDA build too: no device is visible to a test not marked cuda (tests/conftest.py)
    _info_says_what_torch_would_without_importing_it(torch.device("cpu"))


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphrt_info_on_a_gpu_says_what_torch_would_without_importing_it():
    _info_says_what_torch_would_without_importing_it(torch.device("cuda"))


def test_the_torch_build_read_from_its_version_file_is_the_imported_torchs():
    assert host.torch_build() == host.TorchBuild(str(torch.__version__), torch.version.cuda)


def test_the_help_listed_is_each_commands_own():
    for name, (_, _, listed) in COMMANDS.items():
        assert listed == main.get_command(None, name).get_short_help_str(limit=SHORT_HELP), name


@pytest.mark.processes
def test_graphrt_analyze_in_a_fresh_interpreter_reads_a_trace_without_importing_torch(tmp_path):
    trace = Path(__file__).parents[1] / "data" / "torch" / "hta-v100-graph-launches.json.gz"
    out = tmp_path / "analysis.json"
    _, imported = _fresh(["analyze", str(trace), "--json", str(out)])
    assert imported == set()
    assert json.loads(out.read_text())["traces"][0]["step_groups"]  # it did read the trace
