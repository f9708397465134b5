"""`graphrt info`: versions, the device and its peaks, and what this machine can record."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphrt.measure import hardware
from graphrt.run.machine import machine
from graphrt.run.spec import resolve_device, resolve_dtype


@click.command()
@click.option("--measure", is_flag=True, help="Also measure copy bandwidth and matmul FLOP/s "
              "here (a few seconds) and name the device's datasheet peaks.")
def info(measure: bool) -> None:
    """Versions, the device, and whether Nsight Systems is on PATH."""
    device = resolve_device("auto")
    facts = machine(device)
    if measure:
        facts.update(hardware.measured_facts(
            hardware.measure(device, resolve_dtype("auto", device))))
    click.echo(tabulate([(k, "-" if v is None else v) for k, v in facts.items()]))
