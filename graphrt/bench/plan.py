"""`graphrt plan`: which batch sizes to capture, from measured steps and a server's traffic.

Read the traffic; measure every size up to the largest any list needs (a grid, the rest
interpolated); choose the exact optimum under the budget (graphrt.bench.optimize); set it against
the engines' defaults; capture it for real and time a sample of the traffic through it; print
the table and the exports, write the JSON and the frontier's PNG. `graphrt.cli` adds the command.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from graphrt import hardware
from graphrt.backends.graph import parse_buckets
from graphrt.bench import engines, measure_sizes, plan_check, plan_plot, plan_report
from graphrt.bench.optimize import Budget, choose, evaluate
from graphrt.bench.results import versions
from graphrt.bench.traffic import Traffic, describe, read_traffic
from graphrt.config import PRESETS
from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json
from graphrt.runner import RunSpec, load

FORMAT = "graphrt-plan/1"


def _lists(traffic: Traffic, max_batch: int, checks: tuple[tuple[int, ...], ...]
           ) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, sizes, padding) of every list the plan is set against."""
    lists = [(name, sizes, name != engines.TRTLLM) for name, sizes in engines.defaults(max_batch).items()]
    return lists + [(f"--check {','.join(map(str, c))}", c, True) for c in checks]


def _covers(traffic: Traffic, lists: list[tuple[str, tuple[int, ...], bool]]) -> list[int]:
    """The traffic's largest batch, and the size each padded list runs it as: the sizes a
    comparison cannot do without (the largest of them is the largest size measured)."""
    largest = max(traffic)
    return [largest, *(next((s for s in sorted(sizes) if s >= largest), largest)
                       for _, sizes, padded in lists if padded)]


def _load_measurements(path: str, model: str, device: str, dtype: str) -> list[dict]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GraphrtError(f"--measurements {path}: cannot read a plan's JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphrtError(f"--measurements {path}: not a `graphrt plan --json` result ({FORMAT})")
    theirs = (doc.get("model"), doc.get("device"), doc.get("dtype"))
    if theirs != (model, device, dtype):
        raise GraphrtError(f"--measurements {path}: measured {' · '.join(map(str, theirs))}, "
                           f"this plan is for {model} · {device} · {dtype}")
    return doc.get("per_size", [])


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


def make_plan(options: dict[str, Any], say: Callable[[int, int, str], None] = lambda *_: None) -> dict[str, Any]:
    """The plan document (see the README's `graphrt plan`); `say(done, total, label)` hears of
    the measuring as it goes."""
    traffic = read_traffic(options["traffic"])
    lists = _lists(traffic, options["engine_max_batch"] or max(traffic), options["check"])
    top = max(_covers(traffic, lists))
    spec = RunSpec(model=options["model"], device=options["device"], dtype=options["dtype"], batch=top,
                   prompt_len=options["prompt_len"], steps=options["steps"], warmup=options["warmup"],
                   seed=options["seed"])
    config, model, device, dtype = load(spec)
    dtype_name = str(dtype).removeprefix("torch.")
    if options["measurements"]:
        measured = measure_sizes.from_records(
            _load_measurements(options["measurements"], config.name, device.type, dtype_name),
            options["measurements"])
    else:
        sizes = measure_sizes.grid(top, options["grid"], _covers(traffic, lists))
        measured = measure_sizes.measure(model, sizes, spec.steps, spec.warmup, spec.prompt_len,
                                         spec.seed, on_measure=say)
    figures = measure_sizes.interpolate(measured, top)
    problem = plan_report.problem_for(figures, traffic)
    budget = Budget(options["max_graphs"],
                    None if options["memory"] is None else round(options["memory"] * plan_report.MIB),
                    None if options["capture_seconds"] is None else round(options["capture_seconds"] * 1e6))
    said = " ".join(f"--{name.replace('_', '-')} {options[name]:g}" for name in ("max_graphs", "memory", "capture_seconds")
                    if options[name] is not None)
    chosen, frontier = choose(problem, budget, said or None)
    rows = [plan_report.Row("chosen", chosen),
            *(plan_report.baseline(problem, name, sizes, max(traffic), padded) for name, sizes, padded in lists),
            plan_report.Row("all eager", evaluate(problem, ()))]
    doc: dict[str, Any] = {
        "format": FORMAT, "model": config.name, "device": device.type, "dtype": dtype_name,
        "machine": hardware.describe(device), "versions": versions(),
        "graphs": "cuda" if device.type == "cuda" else "tape",
        "timing": {"steps": spec.steps, "warmup": spec.warmup, "prompt_len": spec.prompt_len},
        "traffic": {str(b): n for b, n in traffic.items()},
        "budget": {"max_graphs": options["max_graphs"], "memory_mib": options["memory"],
                   "capture_seconds": options["capture_seconds"]},
        "engine_max_batch": options["engine_max_batch"] or max(traffic),
        "per_size": measure_sizes.to_records(figures),
        "chosen": plan_report.row_dict(rows[0]),
        "baselines": [plan_report.row_dict(r) for r in rows[1:]],
        "frontier": plan_report.frontier_dicts(frontier),
        "export": engines.exports(chosen.sizes),
        "check": None,
    }
    if options["verify"]:
        model.setup_cache(top, spec.prompt_len + spec.steps)
        doc["check"] = plan_check.check(model, figures, chosen.sizes, chosen.memory_bytes, traffic,
                                        options["verify_steps"], spec.prompt_len, spec.seed).as_dict()
    return doc


def print_plan(doc: dict[str, Any], traffic_line: str) -> None:
    measured = sum(f["measured"] for f in doc["per_size"])
    click.echo(f"{doc['model']} · {doc['machine']['device_name']} ({doc['device']}) · {doc['dtype']} · "
               f"traffic: {traffic_line}")
    click.echo(f"{len(doc['per_size'])} sizes, {measured} measured ({doc['timing']['steps']} steps each, "
               f"{doc['timing']['warmup']} warmup), the rest interpolated; engines' defaults for a "
               f"largest batch of {doc['engine_max_batch']}")
    click.echo(plan_report.table([doc["chosen"], *doc["baselines"]]))
    click.echo("\nfrontier (best plan per number of graphs):")
    click.echo(plan_report.frontier_table(doc["frontier"]))
    click.echo("\nthe chosen sizes, as each engine takes them:")
    for line in plan_report.export_lines(doc["export"]):
        click.echo(f"  {line}")
    if doc["check"]:
        click.echo(plan_check.Check(**{k: tuple(v) if isinstance(v, list) else v
                                       for k, v in doc["check"].items() if k != "agrees"}).describe())
    if doc["graphs"] == "tape":
        click.echo("note: TapeGraphs here: the figures are the CPU's, with CUDA-graph semantics "
                   "and no launch overhead to remove; plan on the GPU that serves")
    eager = next(r for r in doc["baselines"] if r["name"] == "all eager")
    if eager["expected_ms"] < doc["chosen"]["expected_ms"]:
        click.echo("note: all eager beats every plan with graphs here: no graph pays for itself "
                   "on these figures")


def _buckets(ctx, param, values: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(parse_buckets(v) for v in values)


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
@click.option("--memory", type=click.FloatRange(min=0), help="At most this much graph memory, MiB.")
@click.option("--capture-seconds", type=click.FloatRange(min=0), help="At most this much capture time.")
@click.option("--grid", default="auto", show_default=True,
              help="Sizes to measure: all, auto (1..8, multiples of 8, the baselines' sizes) or a "
                   "comma list; the others are interpolated.")
@click.option("--measurements", type=click.Path(dir_okay=False),
              help="Reuse the per-size figures of an earlier `graphrt plan --json` instead of measuring.")
@click.option("--check", multiple=True, callback=_buckets,
              help="A capture list in use, e.g. 1,2,4,8, set against the plan (repeatable).")
@click.option("--engine-max-batch", type=click.IntRange(min=1),
              help="The engines' largest batch for their default lists [default: the traffic's largest].")
@click.option("--steps", type=click.IntRange(min=2), default=16, show_default=True,
              help="Decode steps per size and mode.")
@click.option("--warmup", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--prompt-len", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Capture the chosen plan and time a sample of the traffic through it.")
@click.option("--verify-steps", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the plan's JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG of the frontier (mean step against graphs and memory) here.")
def plan(json_path: str | None, plot_path: str | None, **options: Any) -> None:
    """Choose the batch sizes to capture as CUDA graphs for a traffic: measured eager and replayed
    steps per size, the exact optimum under a graph, memory and capture-time budget, set against
    vLLM's, SGLang's and TensorRT-LLM's defaults, checked by capturing it."""
    for path in (json_path, plot_path):
        if path:
            check_writable(path)
    traffic_line = describe(read_traffic(options["traffic"]))  # a bad file fails before any loading
    progress = _Progress()
    try:
        doc = make_plan(options, say=progress)
    finally:
        progress.close()
    print_plan(doc, traffic_line)
    if json_path:
        write_json(json_path, doc)
        click.echo(f"wrote {json_path}")
    if plot_path:
        click.echo(plan_plot.write_plot(doc, plot_path))
