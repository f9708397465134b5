"""Where `make mutate` leaves lines alone, and how it sees which lines run.

The rules live in setup.cfg's [mutmut] section, not in the code: mutmut mutates only the lines
the tests run (CUDA-only code runs on no CPU), and leaves the lines that match a pattern
(the CUDA questions a CPU always answers the same way, and the equivalent mutants).
"""

from __future__ import annotations

import configparser
import fnmatch
import importlib.util
import os
import re
from pathlib import Path

from mutation_plugin import statement_lines

ROOT = Path(__file__).resolve().parents[1]


def _mutmut_setting(key: str) -> list[str]:
    """A list setting of [mutmut], read as mutmut reads setup.cfg (comment lines dropped)."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return [line for line in parser.get("mutmut", key).split("\n") if line]


def _mutated_modules() -> list[Path]:
    only, never = _mutmut_setting("only_mutate"), _mutmut_setting("do_not_mutate")
    paths = sorted((ROOT / "graphrt").rglob("*.py"))
    return [path for path in paths
            if any(fnmatch.fnmatch(str(path.relative_to(ROOT)), glob) for glob in only)
            and not any(fnmatch.fnmatch(str(path.relative_to(ROOT)), glob) for glob in never)]


def test_a_message_split_over_lines_runs_whole_when_its_first_line_ran():
    source = 'def f():\n    raise ValueError("one half, "\n                     "the other")\n'
    assert statement_lines(source, {1, 2}) == {1, 2, 3}


def test_a_multi_line_header_runs_whole_but_its_body_does_not():
    source = "if (a and\n        b):\n    c = 1\n    d = (2,\n         3)\n"
    assert statement_lines(source, {1}) == {1, 2}


def test_a_statement_whose_first_line_did_not_run_adds_nothing():
    source = "x = 1\ny = (2,\n     3)\n"
    assert statement_lines(source, {1}) == {1}


def test_a_comment_between_statements_begins_none():
    source = "x = 1\n# a comment\ny = [2,\n     3]\n"
    assert statement_lines(source, {1, 3}) == {1, 3, 4}


def test_every_pattern_still_matches_a_line_mutmut_mutates():
    """A pattern that matches nothing has lost its line (renamed or rewritten), and that line's
    mutants are back in the run."""
    lines = [line for path in _mutated_modules() for line in path.read_text().splitlines()]
    unmatched = [pattern for pattern in _mutmut_setting("do_not_mutate_patterns")
                 if not any(re.search(pattern, line) for line in lines)]
    assert _mutated_modules() and not unmatched


def test_a_pragma_left_in_the_code_is_one_setup_cfg_explains():
    """Which lines mutation runs leave alone is setup.cfg's to say, with the reason beside it; a
    pragma stays only where a pattern cannot say it, and setup.cfg names its place and why."""
    explained = " ".join(line for line in (ROOT / "setup.cfg").read_text().splitlines()
                         if line.lstrip().startswith("#"))
    held = {str(path.relative_to(ROOT / "graphrt")) for path in (ROOT / "graphrt").rglob("*.py")
            if "pragma: no mutate" in path.read_text()}
    assert {place for place in held if f"{place}, " not in explained} == set()


def _mutate_script():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, text: str, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_a_copy_older_than_its_module_is_dropped_so_mutmut_copies_the_module_anew(tmp_path):
    changed = _write(tmp_path / "graphrt" / "a.py", "x = 2\n", mtime=2_000)
    unchanged = _write(tmp_path / "graphrt" / "sub" / "b.py", "y = 1\n", mtime=1_000)
    stale = _write(tmp_path / "mutants" / "graphrt" / "a.py", "x = 1  # mutated\n", mtime=1_500)
    current = _write(tmp_path / "mutants" / "graphrt" / "sub" / "b.py", "y = 1  # mutated\n", mtime=1_500)
    meta = _write(tmp_path / "mutants" / "graphrt" / "a.py.meta", "{}", mtime=1_500)
    _mutate_script().drop_stale_copies(tmp_path)
    assert not stale.exists() and current.exists() and meta.exists()
    assert changed.exists() and unchanged.exists()
