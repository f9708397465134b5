"""What `make mutate` adds to pytest: it makes each mutant's run short and says where time went.

mutmut runs every mutant's selected tests in a process forked from one that has collected the
suite, and stops at the first failure (-x). So a killed mutant costs the tests that run before
its killer, and a surviving one costs all of them. This plugin, active only under mutmut (which
sets MUTANT_UNDER_TEST), orders each mutant's tests:

1. tests that have already killed another mutant of the same function: the mutants of one
   function tend to fall to the same few tests;
2. then the others; within each, the cheapest first, by what each test cost in the stats run,
   shared fixtures included (`mutmut-test-seconds.json`, below).

Every mutant's run appends a line to `mutmut-times.tsv` (mutant, seconds, tests run, the test
that killed it or nothing), and every kill a line to `mutmut-killers.tsv` (function, test).
Both live in mutmut's working directory, `mutants/`, where pytest runs; two mutants run at once,
so each line is written with one append.

In mutmut's coverage run (`mutate_only_covered_lines`: a line no test runs gets no mutants),
`CoverageRun` counts every line of a statement that ran, as coverage.py's reports do, not only
the lines whose bytecode ran (below).

In mutmut's stats run, which decides the tests each mutant runs by the functions each test
calls, a fixture shared by several tests (module or session scope) is built once, inside the
first test that asks for it, and mutmut credits what it calls to that test alone. Yet under a
mutant it is built anew for whichever of its tests runs, and any of them may be the one that
notices. `StatsRun` credits a shared fixture's calls to every test that uses it, and charges
each test the full cost of the shared fixtures it uses (a mutant's run builds them again for
whichever of their tests runs first): what it writes to `mutmut-test-seconds.json`.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import time
import tokenize
from collections import Counter
from collections.abc import Collection
from functools import cache
from pathlib import Path

import pytest

KILLERS = Path("mutmut-killers.tsv")
TIMES = Path("mutmut-times.tsv")
TEST_SECONDS = Path("mutmut-test-seconds.json")


def function_of(mutant: str) -> str | None:
    """graphrt.measure.timing.x_percentile__mutmut_3 -> graphrt.measure.timing.x_percentile; None for mutmut's
    own runs (the stats run, the clean run, the forced failure)."""
    match = re.fullmatch(r"(.+)__mutmut_\d+", mutant)
    return match.group(1) if match else None


def _read_seconds() -> dict[str, float]:
    return json.loads(TEST_SECONDS.read_text()) if TEST_SECONDS.is_file() else {}


@cache
def seconds_by_test() -> dict[str, float]:
    """Each test's cost in the stats run: read once, in the process mutants fork from."""
    return _read_seconds()


def killers_of(function: str) -> set[str]:
    if not KILLERS.is_file():
        return set()
    lines = (line.split("\t") for line in KILLERS.read_text().splitlines())
    return {test for fn, test in lines if fn == function}


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
        self.calls: dict[pytest.FixtureDef, set[str]] = {}  # what each shared fixture called
        self.setup_seconds: Counter = Counter()  # what building each shared fixture took
        self.shared: dict[str, list[pytest.FixtureDef]] = {}  # test -> the shared fixtures it uses
        self.seconds: Counter = Counter()  # test -> its phases' time, less shared fixtures built in it
        self.building = 0.0  # shared-fixture time spent inside the running test

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef):
        if fixturedef.scope == "function":
            yield
            return
        outer, self.state._stats = self.state._stats, set()
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.setup_seconds[fixturedef] += spent
            self.building += spent
            inner = self.state._stats
            self.calls.setdefault(fixturedef, set()).update(inner)
            self.state._stats = outer | inner

    @pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook reads the calls
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        active = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()]
        self.shared[item.nodeid] = [d for d in active if d.scope != "function"]
        for fixturedef in self.shared[item.nodeid]:
            self.state._stats.update(self.calls.get(fixturedef, ()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.when == "teardown":
            self.seconds[report.nodeid] -= self.building
            self.building = 0.0

    def pytest_sessionfinish(self) -> None:
        seconds = _read_seconds()  # a stats run of new tests only adds to what is there
        for test, own in self.seconds.items():
            shared = self.shared.get(test, [])
            seconds[test] = max(own, 0.0) + sum(self.setup_seconds[d] for d in shared)
        TEST_SECONDS.write_text(json.dumps(seconds))


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
        killers = killers_of(self.function)
        items.sort(key=lambda item: (item.nodeid not in killers, seconds.get(item.nodeid, float("inf"))))

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



def statement_lines(source: str, ran: Collection[int]) -> set[int]:
    """`ran`, with every other line of each statement (or compound statement's header) that
    begins on a line in it. A line holding only constants, such as the second half of a message
    split over two lines, has no bytecode of its own, so coverage.py never records it running."""
    lines, first = set(ran), None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NEWLINE:  # the end of a statement, or of a header at its colon
            if first in lines:
                lines.update(range(first, token.end[0] + 1))
            first = None
        elif first is None and token.string.strip() and token.type != tokenize.COMMENT:
            first = token.start[0]
    return lines


class CoverageRun:
    """The plugin for mutmut's coverage run (MUTANT_UNDER_TEST=mutant_generation): mutmut then
    mutates only the lines coverage.py saw run, so it adds each such statement's other lines
    (`statement_lines`) to the data being collected, for graphrt's modules."""

    def pytest_sessionfinish(self) -> None:
        import coverage

        cov = coverage.Coverage.current()
        if cov is None:  # mutate_only_covered_lines is off: mutmut measures nothing
            return
        data = cov.get_data()
        package = Path.cwd() / "graphrt"
        data.add_lines({path: statement_lines(Path(path).read_text(), data.lines(path) or ())
                        for path in data.measured_files() if Path(path).is_relative_to(package)})


def plugin_for(mutant: str) -> StatsRun | CoverageRun | MutantRun:
    """The plugin for a run whose MUTANT_UNDER_TEST is `mutant`."""
    if mutant == "stats":
        return StatsRun()
    if mutant == "mutant_generation":
        return CoverageRun()
    return MutantRun(mutant)
