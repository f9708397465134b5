"""The `graphrt` command line: one module per command, thin over the packages below.

`graphrt.cli.main` is the group; each command module reads options and prints tables and JSON."""

from graphrt.cli.main import main

__all__ = ["main"]
