"""What every command's refusal of bad input looks like to a test."""

from __future__ import annotations


def one_line_error(result, *fragments: str, code: int = 1) -> None:
    """`result` (click's CliRunner) exited `code` with exactly one `error:` line on stderr, holding
    every one of `fragments`, and no traceback anywhere."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
