"""`graphrt lint`: the lint `run` does before capture, on a model's decode step alone; findings
by module, an experts table for a model with experts, an exit status for scripts and CI."""

from __future__ import annotations

import click

from graphrt.cli.options import model_options
from graphrt.io import check_writable, write_json
from graphrt.run.lint_report import report_lines, to_dict
from graphrt.run.spec import RunSpec

MIN_SEQ_LEN = 4  # a prompt of two, then the two positions the lint captures the step at


@click.command()
@model_options
@click.option("--batch", type=int, default=RunSpec.batch, show_default=True,
              help="Rows of the step linted, and of its KV cache.")
@click.option("--max-seq-len", type=click.IntRange(min=MIN_SEQ_LEN), default=RunSpec().seq_len,
              show_default=True, help="KV-cache length; the step is linted in its middle.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the findings (and the experts table) here.")
def lint(json_path: str | None, max_seq_len: int, **options) -> None:
    """Lint a model's decode step as `run` does before capturing it: what a graph would replay
    differently from eager, by module. For a model with experts, each experts implementation
    transformers offers: whether a graph captures the step, and what it launches. Exit status
    0 when the step `run` would capture is clean and a graph captures it, 1 otherwise."""
    # the cache holds a prompt and the steps, half of it each, so that RunSpec checks it as `run`'s
    prompt = max_seq_len // 2
    spec = RunSpec(**options, max_seq_len=max_seq_len, prompt_len=prompt, steps=max_seq_len - prompt)
    if json_path:
        check_writable(json_path)
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.run.footprint import check_fits
    from graphrt.run.model_lint import lint_model

    if fit := check_fits(spec):  # before anything is allocated
        click.echo(fit, err=True)
    result = lint_model(spec)
    for line in report_lines(result):
        click.echo(line)
    if json_path:
        write_json(json_path, to_dict(spec.model, result))
        click.echo(f"wrote {json_path}")
    if not result.chosen.captured:
        click.get_current_context().exit(1)
