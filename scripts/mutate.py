"""`make mutate [MODULE=graphrt/measure/timing.py]`: mutation testing of graphrt's core with mutmut 3.

Runs `mutmut run` (every core module listed under [mutmut] in setup.cfg, or those MODULE
names, separated by spaces),
then prints, per module, how many mutants the tests killed and the score. mutmut keeps its
work in mutants/: a later run without MODULE only tests the mutants that have no result yet,
and one with MODULE tests that module's mutants again. `mutmut show NAME` prints one mutant's
diff, `mutmut results` lists the survivors. tests/MUTATION.md records the scores and why
each surviving mutant is left.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

MUTMUT = str(Path(sys.executable).parent / "mutmut")  # its console script: `python -m mutmut` re-imports itself
KILLED = {"killed", "timeout", "segfault", "caught by type check"}  # the tests noticed it


def mutant_glob(module: str) -> str:
    """graphrt/measure/timing.py -> graphrt.measure.timing.*; graphrt/graphs/ -> graphrt.graphs.*"""
    path = Path(module)
    if path.suffix != ".py" and not path.is_dir():
        sys.exit(f"error: MODULE={module}: expected a .py file or a package directory under graphrt/")
    if path.suffix == ".py" and not path.is_file():
        sys.exit(f"error: MODULE={module}: no such file")
    parts = path.with_suffix("").parts if path.suffix else path.parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) + ".*"


def module_of(mutant: str) -> str:
    """graphrt.measure.timing.x_percentile__mutmut_3 -> graphrt.measure.timing (class methods: xǁClassǁname)."""
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def results() -> dict[str, Counter]:
    listed = subprocess.run([MUTMUT, "results", "--all", "true"],
                            capture_output=True, text=True, check=True).stdout
    by_module: dict[str, Counter] = defaultdict(Counter)
    for line in listed.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            by_module[module_of(name)][status] += 1
    return by_module


def test_seconds() -> Counter:
    """Seconds of test runs per module, summed over its mutants, from the log the test suite
    keeps under mutmut (tests/mutation_plugin.py): mutants/mutmut-times.tsv."""
    seconds: Counter = Counter()
    times = Path("mutants/mutmut-times.tsv")
    for line in times.read_text().splitlines() if times.is_file() else []:
        mutant, spent, *_ = line.split("\t")
        seconds[module_of(mutant)] += float(spent)
    return seconds


def print_scores(by_module: dict[str, Counter], seconds: Counter, only: list[str]) -> None:
    rows = []
    total: Counter = Counter()
    for module, counts in sorted(by_module.items()):
        if only and not any((module + ".").startswith(g.removesuffix("*")) for g in only):
            continue
        rows.append((module, counts, seconds[module]))
        total += counts
    rows.append(("all", total, sum(row[2] for row in rows)))
    width = max(len(row[0]) for row in rows)
    print(f"{'module':<{width}}  tested  killed   score  tests s  not killed")
    for module, counts, spent in rows:
        tested = sum(n for status, n in counts.items() if status != "not checked")
        killed = sum(counts[s] for s in KILLED)
        score = f"{100 * killed / tested:.1f}%" if tested else "-"
        left = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED)
        print(f"{module:<{width}}  {tested:>6}  {killed:>6}  {score:>6}  {spent:>7.0f}  {left or '-'}")


def drop_stale_copies(root: Path = Path(".")) -> None:
    """Remove mutmut's copy of every module changed since mutmut copied it. mutmut copies a
    source file into mutants/ only when no copy is there, then measures which lines run on that
    copy: a changed module's old copy would give it the old file's line numbers. Without the copy
    mutmut copies the module anew, and keeps the results of its functions that did not change
    (the .meta file beside it)."""
    for source in (root / "graphrt").rglob("*.py"):
        copy = root / "mutants" / source.relative_to(root)
        if copy.is_file() and source.stat().st_mtime > copy.stat().st_mtime:
            copy.unlink()


def main(argv: list[str]) -> int:
    globs = [mutant_glob(module) for module in argv]
    drop_stale_copies()
    # Two mutants run at once on two cores: torch's OpenMP threads, two per process, would spin
    # against each other and stretch a mutant's tests past their timeout.
    start = time.monotonic()
    run = subprocess.run([MUTMUT, "run", *globs], env={**os.environ, "OMP_NUM_THREADS": "1"})
    minutes, seconds = divmod(round(time.monotonic() - start), 60)
    print_scores(results(), test_seconds(), globs)
    print(f"mutmut run: {minutes} min {seconds:02d} s")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
