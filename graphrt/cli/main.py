"""The `graphrt` command line.

Each command's module is imported only when that command runs (or its --help is asked for):
`graphrt --help` lists them from COMMANDS without importing torch, which takes seconds.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import NoReturn

import click

from graphrt import __version__
from graphrt.errors import GraphrtError, first_line

# name -> (module, attribute, the help `graphrt --help` lists: the command's own, cut to SHORT_HELP)
SHORT_HELP = 58  # characters of a command's help that `graphrt --help` lists
COMMANDS = {
    "analyze": ("graphrt.cli.analyze_command", "analyze", "Per-step launches, launch delay, launch CPU time and..."),
    "bench": ("graphrt.cli.bench_command", "bench", "Sweep a scenario (a TOML file, or the name of one in..."),
    "info": ("graphrt.cli.info_command", "info", "Versions, the device, and whether Nsight Systems is on..."),
    "lint": ("graphrt.cli.lint_command", "lint", "Lint a model's decode step as `run` does before..."),
    "plan": ("graphrt.cli.plan_command", "plan", "Choose the batch sizes to capture as CUDA graphs for a..."),
    "run": ("graphrt.cli.run_command", "run", "Decode a prompt batch through each mode and print a..."),
    "trace": ("graphrt.cli.trace_command", "trace", "Record the decode steps after warmup under Nsight..."),
}


class _Group(click.Group):
    """Turns a GraphrtError anywhere below into one line on stderr and exit status 1, and a
    usage error (a bad option value) into one line and exit status 2.

    One rank of a tensor-parallel run reports any failure in one line: when a rank dies the
    others fail in their next collective ("connection closed by peer"). Under graphrt's own
    launcher (`--tp N`) the ranks hand their lines to it, and it prints the line of the rank that
    failed first, once; under torchrun each rank prints its own, saying which rank it is."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, without importing them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][2]) for name in self.list_commands(ctx)])

    def invoke(self, ctx: click.Context):
        rank = ""
        if "RANK" in os.environ:  # maybe one rank of a tensor-parallel run: only then import torch
            from graphrt.parallel import ranks

            rank = f"rank {ranks.launched_rank()}: " if ranks.launched() else ""
        try:
            return super().invoke(ctx)
        except GraphrtError as e:
            _fail(rank, str(e))
        except click.UsageError as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(2)
        except Exception as e:  # noqa: BLE001 (a rank's failure, in one line)
            if not rank:
                raise
            _fail(rank, f"{type(e).__name__}: {first_line(e)}")


def _fail(rank: str, message: str) -> NoReturn:
    """Exit 1 with `message` in one line on stderr; a rank graphrt's launcher started hands it to
    the launcher instead, which prints the line of the rank that failed first, once."""
    if rank:
        from graphrt.parallel import ranks

        if ranks.hand_error_to_launcher(message):
            sys.exit(1)
    click.echo(f"error: {rank}{message}", err=True)
    sys.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="graphrt")
def main() -> None:
    """Show, measure and explain what CUDA Graph replay removes from LLM decoding."""
