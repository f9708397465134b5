"""The `graphrt` command line."""

from __future__ import annotations

import sys

import click

from graphrt import __version__
from graphrt.errors import GraphrtError


class _Group(click.Group):
    """Turns a GraphrtError anywhere below into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except GraphrtError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="graphrt")
def main() -> None:
    """Show, measure and explain what CUDA Graph replay removes from LLM decoding."""
