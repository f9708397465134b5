"""`graphrt plan`: which batch sizes to capture for a traffic, with a progress bar over the
measuring, the table against the engines' defaults, JSON and a PNG of the frontier."""

from __future__ import annotations

import sys
from typing import Any

import click

from graphrt.backends.choices import parse_buckets
from graphrt.plan.engine_lists import Settings, parse_settings
from graphrt.plan.size_rounds import ROUNDS
from graphrt.plan.traffic import describe, read_traffic
from graphrt.cli.option_types import MAX_TIMED_STEPS, SEED, Amount, check_plot
from graphrt.io import check_writable, write_json
from graphrt.model.config import PRESETS


class _Progress:
    """A progress bar on stderr over the measuring, opened at its first report."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="plan", file=sys.stderr, show_pos=True,
                                         item_show_func=lambda shown: shown)
            self.bar.__enter__()
        self.bar.update(done - self.bar.pos, label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def print_plan(doc: dict[str, Any], traffic_line: str) -> None:
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.plan import check, summary

    measured = sum(f["measured"] for f in doc["per_size"])
    click.echo(f"{doc['model']} · {doc['machine']['device_name']} ({doc['device']}) · {doc['dtype']} · "
               f"traffic: {traffic_line}")
    timing = doc["timing"]
    click.echo(f"{len(doc['per_size'])} sizes, {measured} measured ({timing['steps']} steps each, "
               f"{timing['warmup']} warmup, in {timing['rounds']} interleaved rounds), the rest interpolated")
    for line in summary.rounds_lines(doc["per_size"], timing["rounds"]):
        click.echo(line)
    click.echo(f"engines' lists as their servers resolve them, served on {doc['served_on']['said']}:")
    for line in summary.engine_lines(doc["engines"]):
        click.echo(f"  {line}")
    verdict = doc["verdict"]
    click.echo(summary.table([doc["chosen"], *doc["baselines"]], verdict["noisy"]))
    if verdict["said"]:
        click.echo(f"{'no verdict' if verdict['noisy'] else 'note'}: {verdict['said']}")
    click.echo("\nfrontier (best plan per number of graphs):")
    click.echo(summary.frontier_table(doc["frontier"]))
    if not verdict["noisy"]:
        click.echo("\nthe chosen sizes, as each engine takes them:")
        for line in summary.export_lines(doc["export"]):
            click.echo(f"  {line}")
    if doc["check"]:
        click.echo(check.Check.from_dict(doc["check"]).describe())
    if doc["graphs"] == "tape":
        click.echo("note: TapeGraphs here: the figures are the CPU's, with CUDA-graph semantics "
                   "and no launch overhead to remove; plan on the GPU that serves")
    eager = next(r for r in doc["baselines"] if r["name"] == "all eager")["vs_chosen"]
    if eager["ratio"] < 0 and (eager["measurable"] or eager["interval"] is None) and not verdict["noisy"]:
        click.echo("note: all eager beats every plan with graphs here: no graph pays for itself "
                   "on these figures")


def _buckets(ctx, param, values: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(parse_buckets(v, "--check") for v in values)


def _settings(ctx, param, values: tuple[str, ...]) -> Settings:
    return parse_settings(values)


@click.command()
@click.option("--model", default="qwen2-0.5b", show_default=True,
              help=f"Preset ({', '.join(PRESETS)}) or a Hugging Face model directory.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--dtype", default="auto", show_default=True,
              help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16.")
@click.option("--traffic", required=True, type=click.Path(dir_okay=False),
              help="Decode steps per batch size: JSON {\"batch\": count}, CSV batch,count, one batch "
                   "size a line, or a graphrt run/trace JSON.")
@click.option("--max-graphs", type=click.IntRange(min=1), help="At most this many graphs.")
@click.option("--memory", type=Amount(min=0, quantum=2**-20, quantum_said="byte"),
              help="At most this much graph memory, MiB.")
@click.option("--capture-seconds", type=Amount(min=0, quantum=1e-6, quantum_said="microsecond"),
              help="At most this much capture time.")
@click.option("--grid", default="auto", show_default=True,
              help="Sizes to measure: all, auto (1..8, multiples of 8, the baselines' sizes) or a "
                   "comma list; the others are interpolated.")
@click.option("--measurements", type=click.Path(dir_okay=False),
              help="Reuse the per-size figures of an earlier `graphrt plan --json` instead of measuring.")
@click.option("--check", multiple=True, callback=_buckets,
              help="A capture list in use, e.g. 1,2,4,8, set against the plan (repeatable).")
@click.option("--engine-setting", multiple=True, callback=_settings, metavar="ENGINE.NAME=VALUE",
              help="A setting passed to an engine's server, as the engine spells it (vllm.max_num_seqs=256, "
                   "sglang.max_running_requests=64, tensorrt_llm.cuda_graph_config.enable_padding=true, ...): "
                   "its default list is resolved as that server would (repeatable).")
@click.option("--device-memory", type=Amount(min=0, min_open=True, quantum=2**-30, quantum_said="byte"),
              metavar="GiB",
              help="Resolve the engines' lists for a device of this much memory [default: the device planned on].")
@click.option("--steps", type=click.IntRange(min=2), default=16, show_default=True,
              help="Decode steps per size and mode, warmup included, over the rounds.")
@click.option("--rounds", type=click.IntRange(min=2), default=ROUNDS, show_default=True,
              help="Interleaved rounds the sizes are timed in (up to as many more for wide figures).")
@click.option("--warmup", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Capture the chosen plan and time a sample of the traffic through it.")
@click.option("--verify-steps", type=click.IntRange(min=1, max=MAX_TIMED_STEPS), default=200, show_default=True,
              help="Steps of the traffic sampled and timed through the captured plan.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the plan's JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG of the frontier (mean step against graphs and memory) here.")
def plan(json_path: str | None, plot_path: str | None, **options: Any) -> None:
    """Choose the batch sizes to capture as CUDA graphs for a traffic: measured eager and replayed
    steps per size, the exact optimum under a graph, memory and capture-time budget, set against
    vLLM's, SGLang's and TensorRT-LLM's defaults, checked by capturing it."""
    if json_path:
        check_writable(json_path)
    check_plot(plot_path)
    traffic_line = describe(read_traffic(options["traffic"]))  # a bad file fails before any loading
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.plan import frontier_plot
    from graphrt.plan.planner import make_plan

    progress = _Progress()
    try:
        doc = make_plan(options, say=progress, tell=lambda line: click.echo(line, err=True))
    finally:
        progress.close()
    print_plan(doc, traffic_line)
    if json_path:
        write_json(json_path, doc)
        click.echo(f"wrote {json_path}")
    if plot_path:
        click.echo(frontier_plot.write_plot(doc, plot_path))
