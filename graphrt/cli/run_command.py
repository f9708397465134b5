"""`graphrt run` and `graphrt info`: decode through each mode, and say what this machine is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from graphrt.backends.choices import GROUPS, MODES
from graphrt.cli.options import decode_options
from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json
from graphrt.run.spec import RunSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MODE_CHOICES = (*MODES, *GROUPS)


@click.command()
@decode_options(steps=RunSpec.steps, steps_help="Decode steps; each generates one token per sequence.",
                warmup_help="Leading decode steps that run but are not timed")
@click.option("--max-seq-len", type=int, default=RunSpec.max_seq_len,
              help="KV-cache length [default: prompt-len + steps].")
@click.option("--mode", default=RunSpec.mode, show_default=True,
              help=f"One of {', '.join(MODE_CHOICES)}, or a comma list such as eager,piecewise,graph.")
@click.option("--nvtx/--no-nvtx", default=True, show_default=True,
              help="An NVTX range around every module call and every step.")
@click.option("--prompt", "prompts", multiple=True,
              help="Text to continue, encoded with the model directory's tokenizer.json; repeat "
                   "it for one row per prompt, or give one for all --batch rows [default: random ids].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every figure, the prompt and the generated ids (and text) here.")
def run(json_path: str | None, prompts: tuple[str, ...], **options) -> None:
    """Decode a prompt batch through each mode and print a table of step latency, throughput
    and ops per step, and whether each mode generates what eager does."""
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.parallel import launch

    tokenizer = _encode_prompts(prompts, options)  # a bad --prompt is refused before ranks start
    if launch.relaunched(options):
        return
    _run(json_path, tokenizer, options)


def _encode_prompts(prompts: tuple[str, ...], options: dict) -> Tokenizer | None:
    """--prompt's rows as token ids, into options["prompt_ids"]; the tokenizer (None without --prompt)."""
    if not prompts:
        return None
    if click.get_current_context().get_parameter_source("prompt_len") is not ParameterSource.DEFAULT:
        raise GraphrtError("--prompt-len and --prompt: the prompt's own tokens set its length; "
                           "give one of the two")
    from graphrt.run import text

    tokenizer = text.load_tokenizer(options["model"])
    options["prompt_ids"] = text.encode_rows(tokenizer, prompts, options["batch"])
    return tokenizer


def _run(json_path: str | None, tokenizer: Tokenizer | None, options: dict) -> None:
    from graphrt.measure.nvtx import check_recording
    from graphrt.parallel import ranks
    from graphrt.run import execute, report, text
    from graphrt.run.footprint import check_fits

    leader = ranks.launched_rank() == 0  # only rank 0 of a tensor-parallel run speaks
    echo = click.echo if leader else (lambda *args, **kwargs: None)
    spec = RunSpec(**options)
    if (fit := check_fits(spec)) and leader:  # before anything is allocated
        echo(fit, err=True)
    if json_path and leader:
        check_writable(json_path)
    if warning := check_recording():
        echo(f"warning: {warning}", err=True)

    def generated(result: execute.RunResult) -> dict:
        return {mode: gen.tokens for mode, gen in result.generations.items()}

    def document(result: execute.RunResult) -> dict:
        doc = report.to_dict(result)
        if tokenizer:
            text.add_text(doc, tokenizer, generated(result))
        return doc

    def mode_done(result: execute.RunResult, mode: str) -> None:
        if len(result.generations) == 1:
            echo(report.header(result))
            echo(report.timing_header())
        echo(report.timing_row(result, mode))
        if json_path and leader:  # after every mode: a later failure or a timeout keeps what ran
            write_json(json_path, document(result))

    result = execute.run(spec, on_mode=lambda m: echo(f"running {m}…", err=True), on_done=mode_done)
    echo(report.launches_table(result))
    if result.per_rank:
        echo(f"\n{result.ranks.world} ranks, each figure the slowest rank's unless per rank:")
        echo(report.ranks_table(result))
    for line in [*report.refused_lines(result), *report.summary_lines(result), *report.ranks_lines(result)]:
        echo(line)
    if tokenizer:
        echo("\n".join(text.continuation_lines(tokenizer, spec.prompt_ids, generated(result))))
    if json_path and leader:
        write_json(json_path, document(result))
        echo(f"wrote {json_path}")
