"""`graphrt --help` and `graphrt analyze` start at once: the help lists the commands without importing
them, and reading a trace needs no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from graphrt.cli.main import COMMANDS, SHORT_HELP, main


def test_graphrt_help_in_a_fresh_interpreter_does_not_import_torch():
    probe = ("import sys; from graphrt.cli.main import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules, 'graphrt.cli.trace_command' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stderr.split() == ["False", "False"], done.stderr
    for name in COMMANDS:
        assert name in done.stdout


def test_the_help_listed_is_each_commands_own():
    for name, (_, _, listed) in COMMANDS.items():
        assert listed == main.get_command(None, name).get_short_help_str(limit=SHORT_HELP), name


def test_graphrt_analyze_in_a_fresh_interpreter_reads_a_trace_without_importing_torch(tmp_path):
    trace = Path(__file__).parents[1] / "data" / "torch" / "hta-v100-graph-launches.json.gz"
    out = tmp_path / "analysis.json"
    probe = ("import sys; from graphrt.cli.main import main\n"
             f"try:\n    main(['analyze', {str(trace)!r}, '--json', {str(out)!r}])\nexcept SystemExit as e:\n"
             "    assert not e.code, e.code\n"
             "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stderr.split()[-1:] == ["False"], done.stderr
    assert json.loads(out.read_text())["traces"][0]["step_groups"]  # it did read the trace
