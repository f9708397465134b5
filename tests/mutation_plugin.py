"""What `make mutate` adds to pytest: it makes each mutant's run short and says where time went.

mutmut runs every mutant's selected tests in a process forked from one that has collected the
suite, and stops at the first failure (-x). So a killed mutant costs the tests that run before
its killer, and a surviving one costs all of them. This plugin, active only under mutmut (which
sets MUTANT_UNDER_TEST), orders each mutant's tests:

1. tests that have already killed another mutant of the same function, most kills first: the
   mutants of one function tend to fall to the same test;
2. then the quickest first, by the times mutmut measured in its stats run.

Every mutant's run appends a line to `mutmut-times.tsv` (mutant, seconds, tests run, the test
that killed it or nothing), and every kill a line to `mutmut-killers.tsv` (function, test).
Both live in mutmut's working directory, `mutants/`, where pytest runs; two mutants run at once,
so each line is written with one append.

In mutmut's stats run, which decides the tests each mutant runs by the functions each test
calls, a fixture shared by several tests (module or session scope) is built once, inside the
first test that asks for it, and mutmut credits what it calls to that test alone. Yet under a
mutant it is built anew for whichever of its tests runs, and any of them may be the one that
notices. `StatsRun` credits a shared fixture's calls to every test that uses it.
"""

from __future__ import annotations

import gc
import json
import os
import re
import time
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

KILLERS = Path("mutmut-killers.tsv")
TIMES = Path("mutmut-times.tsv")


def function_of(mutant: str) -> str | None:
    """graphrt.timing.x_percentile__mutmut_3 -> graphrt.timing.x_percentile; None for mutmut's
    own runs (the stats run, the clean run, the forced failure)."""
    match = re.fullmatch(r"(.+)__mutmut_\d+", mutant)
    return match.group(1) if match else None


@cache
def seconds_by_test() -> dict[str, float]:
    """Each test's time in mutmut's stats run: read once, in the process mutants fork from."""
    stats = Path("mutmut-stats.json")
    return json.loads(stats.read_text())["duration_by_test"] if stats.is_file() else {}


def kills_by_test(function: str) -> Counter:
    if not KILLERS.is_file():
        return Counter()
    lines = (line.split("\t") for line in KILLERS.read_text().splitlines())
    return Counter(test for fn, test in lines if fn == function)


def append_line(path: Path, *fields: object) -> None:
    """One write of one line, so that two processes appending at once do not interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, ("\t".join(map(str, fields)) + "\n").encode())
    finally:
        os.close(fd)


class StatsRun:
    """The plugin for mutmut's stats run (MUTANT_UNDER_TEST=stats). It reads and extends the
    set of functions mutmut's trampolines record for the running test (`state()._stats`, a
    private of mutmut 3.8, which constraints.txt pins)."""

    def __init__(self) -> None:
        from mutmut.state import state

        self.state = state()
        self.calls: dict[pytest.FixtureDef, set[str]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef):
        if fixturedef.scope == "function":
            yield
            return
        outer, self.state._stats = self.state._stats, set()
        try:
            yield
        finally:
            inner = self.state._stats
            self.calls.setdefault(fixturedef, set()).update(inner)
            self.state._stats = outer | inner

    @pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook reads the calls
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        for defs in item._fixtureinfo.name2fixturedefs.values():
            self.state._stats.update(self.calls.get(defs[-1], ()))


class MutantRun:
    """The plugin, registered by conftest.py for a run whose MUTANT_UNDER_TEST is `mutant`."""

    def __init__(self, mutant: str):
        self.mutant = mutant
        self.function = function_of(mutant)
        self.start = time.perf_counter()
        self.ran = 0
        self.killer = ""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        seconds = seconds_by_test()
        if self.function is None:
            return
        kills = kills_by_test(self.function)
        items.sort(key=lambda item: (-kills[item.nodeid], seconds.get(item.nodeid, float("inf"))))

    def pytest_collection_finish(self) -> None:
        # Freeze what collection made (torch, transformers, the test modules) out of the garbage
        # collector's sight. pytest ends every run with full collections: over this heap they
        # cost about 0.5 s a mutant, and touching every object copies the pages a fork shares.
        gc.freeze()

    def pytest_runtest_logstart(self) -> None:
        self.ran += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and not self.killer and self.function is not None:
            self.killer = report.nodeid
            append_line(KILLERS, self.function, report.nodeid)

    def pytest_sessionfinish(self) -> None:
        if self.function is not None:
            append_line(TIMES, self.mutant, f"{time.perf_counter() - self.start:.2f}", self.ran, self.killer)

