"""`graphrt info`: versions, the device and its peaks, and what this machine can record."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphrt.measure import host


@click.command()
@click.option("--measure", is_flag=True, help="Also measure copy bandwidth and matmul FLOP/s "
              "here (a few seconds) and name the device's datasheet peaks.")
def info(measure: bool) -> None:
    """Versions, the device, and whether Nsight Systems is on PATH."""
    if measure or host.torch_build().cuda is not None:
        facts = _asked_of_torch(measure)
    else:  # a CPU-only torch sees no GPU: the facts need no torch, nor its second of start-up
        facts = host.describe("cpu", host.cpu_name(), cuda_available=False)
    click.echo(tabulate([(k, "-" if v is None else v) for k, v in facts.items()]))


def _asked_of_torch(measure: bool) -> dict:
    """What only torch can say: whether a CUDA build sees a GPU, and what that GPU does."""
    from graphrt.measure import hardware
    from graphrt.run.device import resolve_device, resolve_dtype
    from graphrt.run.machine import machine

    device = resolve_device("auto")
    facts = machine(device)
    if measure:
        facts.update(hardware.measured_facts(hardware.measure(device, resolve_dtype("auto", device))))
    return facts
