"""`graphrt info`: versions, the device and its peaks, and what this machine can record."""

from __future__ import annotations

import click
from tabulate import tabulate

from graphrt.measure import host
from graphrt.units import MISSING


@click.command()
@click.option("--measure", is_flag=True, help="Ask torch: also measure copy bandwidth and matmul FLOP/s "
              "here (a few seconds), name the device's datasheet peaks and, on CUDA, what graph-node "
              "records a capture and a trace can hold.")
def info(measure: bool) -> None:
    """Versions, the device, and whether Nsight Systems is on PATH."""
    facts = _asked_of_torch(measure) if measure else _told_without_torch()
    click.echo(tabulate([(k, MISSING if v is None else v) for k, v in facts.items()]))


def _told_without_torch() -> dict:
    """The facts a CUDA torch would give, from its version file and the driver: importing a
    CUDA torch maps gigabytes of libraries, and a second of start-up even on a CPU-only one."""
    build, driver = host.torch_build(), None
    if build.cuda is not None:  # a CPU-only torch sees no GPU whatever the driver shows
        driver = host.cuda_driver()
    if host.cuda_usable(build, driver):
        return host.describe("cuda", driver.devices[0], cuda_available=True)
    return host.describe("cpu", host.cpu_name(), cuda_available=False)


def _asked_of_torch(measure: bool) -> dict:
    """What only torch can say: the device as torch sees it, what it does, and, on CUDA, what a
    capture and a trace can say of graph nodes there."""
    from graphrt.measure import hardware
    from graphrt.run.machine import machine, resolve_device, resolve_dtype

    device = resolve_device("auto")
    facts = machine(device)
    if measure:
        facts.update(hardware.measured_facts(hardware.measure(device, resolve_dtype("auto", device))))
    return facts
