"""`make mutate [MODULE=graphrt/timing.py]`: mutation testing of graphrt's core with mutmut 3.

Runs `mutmut run` (every core module listed under [mutmut] in setup.cfg, or those MODULE
names, separated by spaces),
then prints, per module, how many mutants the tests killed and the score. mutmut keeps its
work in mutants/: a later run without MODULE only tests the mutants that have no result yet,
and one with MODULE tests that module's mutants again. `mutmut show NAME` prints one mutant's
diff, `mutmut results` lists the survivors. tests/MUTATION.md records the scores and why
each surviving mutant is left.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

MUTMUT = str(Path(sys.executable).parent / "mutmut")  # its console script: `python -m mutmut` re-imports itself
KILLED = {"killed", "timeout", "segfault", "caught by type check"}  # the tests noticed it


def mutant_glob(module: str) -> str:
    """graphrt/timing.py -> graphrt.timing.*; graphrt/graphs/ -> graphrt.graphs.*"""
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
    """graphrt.timing.x_percentile__mutmut_3 -> graphrt.timing (class methods: xǁClassǁname)."""
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


def print_scores(by_module: dict[str, Counter], only: list[str]) -> None:
    rows = []
    for module, counts in sorted(by_module.items()):
        if only and not any((module + ".").startswith(g.removesuffix("*")) for g in only):
            continue
        tested = sum(n for status, n in counts.items() if status != "not checked")
        killed = sum(counts[s] for s in KILLED)
        score = f"{100 * killed / tested:.1f}%" if tested else "-"
        left = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in KILLED)
        rows.append((module, tested, killed, score, left or "-"))
    width = max([len(r[0]) for r in rows] + [6])
    print(f"{'module':<{width}}  tested  killed  score   not killed")
    for module, tested, killed, score, left in rows:
        print(f"{module:<{width}}  {tested:>6}  {killed:>6}  {score:>6}  {left}")


def main(argv: list[str]) -> int:
    globs = [mutant_glob(module) for module in argv]
    run = subprocess.run([MUTMUT, "run", *globs])
    print_scores(results(), globs)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
