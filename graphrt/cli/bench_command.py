"""`graphrt bench`: run a scenario with a progress bar, write its JSON and plot, print tables;
or compare two results files. `graphrt.cli.main` adds the command to the `graphrt` group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from graphrt.cli.option_types import MAX_TIMED_STEPS
from graphrt.errors import GraphrtError
from graphrt.io import check_writable, write_json

if TYPE_CHECKING:
    from graphrt.bench.sweep import Sweep

INTERRUPTED = 130  # the shell's status for a process stopped by SIGINT


def scenario_path(name: str) -> Path:
    """A path as given, or for a bare name such as `baseline`, `scenarios/baseline.toml`."""
    path = Path(name)
    shipped = Path("scenarios") / f"{name}.toml"
    if not path.exists() and not path.suffix and shipped.exists():
        return shipped
    return path


def run(scenario: str, out: str, **overrides: int | None) -> int:
    """Run `scenario`; returns the exit status: 0, or 130 when interrupted."""
    # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
    from graphrt.bench import results, sweep_plot
    from graphrt.bench.scenario import load_scenario, with_overrides
    from graphrt.bench.sweep import Sweep

    chosen = with_overrides(load_scenario(scenario_path(scenario)), **overrides)
    sweep = Sweep(chosen)
    json_path = results.default_path(out, chosen.name)
    check_writable(json_path)
    try:
        doc = _sweep_with_progress(sweep, json_path)
    except KeyboardInterrupt:  # before the sweep began: nothing measured, nothing written
        click.echo("interrupted before the first point; nothing written", err=True)
        return INTERRUPTED
    write_json(json_path, doc)
    for line in results.header(doc):
        click.echo(line)
    if doc["points"]:
        click.echo(results.table(doc))
        click.echo()
        click.echo(results.memory_table(doc))
        for line in results.notes(doc):
            click.echo(f"note: {line}")
        click.echo(sweep_plot.write_plot(doc, json_path.with_suffix(".png")))
    click.echo(f"wrote {json_path}" + (" (partial)" if doc["partial"] else ""))
    if stopped := results.stopped_line(doc):
        click.echo(stopped, err=True)
        return INTERRUPTED
    return 0


def _sweep_with_progress(sweep: Sweep, json_path: Path) -> dict[str, Any]:
    """The sweep with a progress bar on stderr, the finished points saved after each point."""
    with click.progressbar(length=sweep.total, label=f"bench {sweep.scenario.name}",
                           file=sys.stderr, show_pos=True,
                           item_show_func=lambda label: label) as bar:
        started = []

        def on_measure(label: str) -> None:
            bar.update(1 if started else 0, label)  # the previous measurement is done
            started.append(label)

        doc = sweep.run(on_measure=on_measure, on_point=lambda d: write_json(json_path, d))
        if doc["stopped_at"] is None:
            bar.update(1)
    return doc


@click.command()
@click.argument("scenario", required=False)
@click.option("--out", default="results", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the results JSON and PNG.")
@click.option("--compare", nargs=2, type=click.Path(dir_okay=False), metavar="A.json B.json",
              help="Print the change from A to B point by point, instead of running.")
@click.option("--steps", type=click.IntRange(min=2), help="Timed steps per repeat, instead of the scenario's.")
@click.option("--warmup", type=click.IntRange(min=1), help="Untimed steps before them, instead of the scenario's.")
@click.option("--repeats", type=click.IntRange(min=1, max=MAX_TIMED_STEPS),
              help="Repeats per point, instead of the scenario's.")
@click.option("--max-points", type=click.IntRange(min=1), help="Run only the first N points of the sweep.")
def bench(scenario: str | None, out: str, compare: tuple[str, str] | None,
          **overrides: int | None) -> None:
    """Sweep a scenario (a TOML file, or the name of one in scenarios/) over batch sizes and
    context lengths: step times, speedups, host time, work per step, roofline and memory for
    every mode, into results/<scenario>-<time>.json with a PNG plot beside it."""
    if compare and scenario:
        raise GraphrtError("give either a SCENARIO to run or --compare A.json B.json, not both")
    if compare:
        # torch: imported where the command runs, not for --help (docs/design.md, "Start-up")
        from graphrt.bench import results

        a, b = compare
        click.echo(results.compare(results.load_results(a), results.load_results(b), a, b))
        return
    if not scenario:
        raise GraphrtError("give a SCENARIO file to run (e.g. scenarios/baseline.toml), "
                           "or --compare A.json B.json")
    status = run(scenario, out, **overrides)
    if status:
        sys.exit(status)
