"""`graphrt --help` starts at once: it lists the commands without importing them (nor torch)."""

from __future__ import annotations

import subprocess
import sys

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
