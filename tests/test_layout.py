"""The layout docs/design.md describes holds: every package says its job, no module name is used
twice, no file passes 300 lines of code, imports point one way (between packages, and inside
trace/ from read to analysis to present), nothing cites a file the repository does not have, and
design.md's Layout names every module."""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "graphrt"
BASE = {"errors", "io", "quantiles", "units", "vocab"}
TOP = {"testing", "__main__"}  # the public entry points above every package

# what each package may import besides itself and the base (docs/design.md, "Layout")
MAY_IMPORT = {
    "engines": set(),  # torch-free: the command line and the trace readers use it
    "model": set(),
    "measure": {"model"},
    "graphs": {"measure"},
    "parallel": {"model"},
    "backends": {"graphs", "measure", "model"},
    "run": {"backends", "parallel", "graphs", "measure", "model"},
    "bench": {"run", "backends", "parallel", "graphs", "measure", "model"},
    "plan": {"engines", "run", "backends", "graphs", "measure", "model"},
    "trace": {"engines", "run", "backends", "parallel", "graphs", "measure", "model"},
    "cli": {"engines", "run", "bench", "plan", "trace", "backends", "parallel", "graphs", "measure", "model"},
}
MAX_CODE_LINES = 300
MAX_COMMAND_LINES = 130  # a command module parses options, calls, and prints; the work lives in its package
# inside trace/, a stage may import only the stages before it (docs/design.md, "The flow of analyze")
TRACE_STAGES = ("graphrt.trace.read", "graphrt.trace.analysis", "graphrt.trace.present")
TABLE_FORMATTERS = {"tabulate", "matplotlib"}  # what only trace/present may turn figures into text or pictures with


def _modules() -> dict[str, Path]:
    """Every module of graphrt by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """The graphrt modules `path` imports, anywhere in it (a function's lazy import included)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from graphrt.graphs import tape` depends on the module tape, not on the names of
            # the package's __init__ (which Python runs on the way, as for any submodule)
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name for name in modules if name in MODULES]
            if len(names) < len(modules):
                names.append(node.module)
        else:
            continue
        found.update(name for name in names if name in MODULES)
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _code_lines(path: Path) -> int:
    """Lines that hold code or a docstring: not blank, not only a comment."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def test_the_top_level_holds_only_entry_points_the_base_and_packages():
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top <= BASE | TOP, f"modules at the top of graphrt/ that belong in a package: {sorted(top - BASE - TOP)}"
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert packages == set(MAY_IMPORT), packages ^ set(MAY_IMPORT)


def test_every_package_says_its_job_in_its_docstring():
    for name, path in MODULES.items():
        if path.name == "__init__.py":
            doc = ast.get_docstring(ast.parse(path.read_text()))
            assert doc and len(doc.split()) >= 5, f"{name} has no docstring saying its job"


def test_no_module_or_package_name_is_used_twice():
    places = defaultdict(list)
    for name in MODULES:
        if name != "graphrt":
            places[name.rsplit(".", 1)[-1]].append(name)
    twins = {short: names for short, names in places.items() if len(names) > 1}
    assert not twins, twins


def test_no_file_passes_300_lines_of_code():
    long = {name: n for name, path in MODULES.items() if (n := _code_lines(path)) > MAX_CODE_LINES}
    assert not long, long


def test_no_command_module_passes_130_lines_of_code():
    commands = {name: path for name, path in MODULES.items() if name.startswith("graphrt.cli.") and
                name.endswith("_command")}
    assert commands, "no graphrt/cli/*_command.py found"
    long = {name: n for name, path in commands.items() if (n := _code_lines(path)) > MAX_COMMAND_LINES}
    assert not long, long


def test_packages_import_only_the_packages_below_them():
    wrong = []
    for name, path in MODULES.items():
        mine = _package(name)
        if mine in TOP | BASE or name == "graphrt":
            continue
        for imported in _imports(path):
            theirs = _package(imported)
            if theirs not in BASE | {mine} | MAY_IMPORT[mine] and imported != "graphrt":
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(wrong)


def _stage(module: str) -> int | None:
    return next((i for i, stage in enumerate(TRACE_STAGES) if module.startswith(stage + ".")), None)


def test_trace_reading_analysing_and_presenting_import_only_earlier_stages():
    wrong = []
    for name, path in MODULES.items():
        if (mine := _stage(name)) is None:
            continue
        for imported in _imports(path):
            if (theirs := _stage(imported)) is not None and theirs > mine:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(wrong)


def _outside_imports(path: Path) -> set[str]:
    """The top-level names of the packages outside graphrt that `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - {"graphrt"}


def test_trace_reading_and_analysing_format_no_tables_or_pictures():
    wrong = {name: sorted(used) for name, path in MODULES.items()
             if _stage(name) in (0, 1) and (used := _outside_imports(path) & TABLE_FORMATTERS)}
    assert not wrong, wrong


def test_every_table_analyze_prints_goes_through_the_one_that_cuts_long_names():
    # a trace's names are its program's: only graphrt.trace.present.text_table calls tabulate
    direct = [name for name, path in MODULES.items()
              if _stage(name) == 2 and "tabulate" in _outside_imports(path) and name != "graphrt.trace.present.text_table"]
    assert not direct, direct


def test_no_module_imports_itself_through_others():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    # a package's __init__ is imported on the way to each of its modules: only edges a module
    # writes count, and a cycle through a package's own __init__ and its modules is one too
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


CITED = re.compile(r"\b([\w./-]+\.md)\b")
MANUAL = {page.name for page in (ROOT / "docs").glob("*.md")}  # a page of docs/ may go by its name


def test_nothing_cites_a_file_the_repository_lacks():
    missing = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").glob("*"),
                 ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        if not path.is_file():
            continue
        for cited in CITED.findall(path.read_text(errors="replace")):
            if "/" not in cited and cited not in {"README.md", "MUTATION.md", *MANUAL}:
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
            elif "/" in cited and not (ROOT / cited).exists() and not cited.startswith(("http", "../")):
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "\n".join(missing)


DESIGN = ROOT / "docs" / "design.md"
NAMED_FILE = re.compile(r"[\w./*-]+\.(?:py|sh)\b")


def _layout_block() -> str:
    """The tree drawn under design.md's "## Layout", up to its closing fence."""
    text = DESIGN.read_text()
    start = text.index("```", text.index("\n## Layout\n")) + 3
    return text[start:text.index("```", start)]


def _named(name: str, patterns: set[str]) -> bool:
    """Whether a file called `name` is one of `patterns` (`segments.py`, `graphs/segments.py` or
    `*_command.py`): a name goes by its last part, as no module name is used twice."""
    return any(fnmatch.fnmatch(name, pattern.rsplit("/", 1)[-1]) for pattern in patterns)


def test_design_names_only_files_the_repository_has():
    have = {path.name for folder in ("graphrt", "tests", "scripts") for path in (ROOT / folder).rglob("*")}
    missing = [name for name in sorted(set(NAMED_FILE.findall(DESIGN.read_text())))
               if not any(_named(file, {name}) for file in have)]
    assert not missing, f"docs/design.md names files the repository lacks: {missing}"


def test_the_layout_in_design_names_every_module():
    named = set(NAMED_FILE.findall(_layout_block()))
    unnamed = sorted(str(path.relative_to(ROOT)) for path in MODULES.values()
                     if path.stem not in ("__init__", "__main__") and not _named(path.name, named))
    assert not unnamed, f"modules docs/design.md's Layout does not name: {unnamed}"
