"""Figures as text (graphrt.units): each format as the tables and lines that use it show it, and an
unknown figure shown as missing, never as 0, spelled by units.MISSING alone."""

import ast
from pathlib import Path

import pytest

from graphrt.units import MISSING, format_bytes, format_count, format_us


def test_nanoseconds_are_shown_as_microseconds_to_a_tenth_grouped_by_thousands():
    assert format_us(1_234_567) == "1,234.6"
    assert format_us(50) == "0.1" and format_us(0) == "0.0"


def test_a_count_is_whole_where_it_is_whole_and_a_median_between_two_counts_to_a_tenth():
    assert format_count(12_345) == "12,345" and format_count(3.0) == "3"
    assert format_count(2.5) == "2.5"


def test_an_unknown_figure_is_shown_missing_not_as_zero():
    assert format_us(None) == format_count(None) == MISSING == "-"


@pytest.mark.parametrize("n, text", [(512, "0.5 KiB"), (3 << 20, "3.0 MiB"), (5 << 30, "5.0 GiB"),
                                     ((1 << 40) * 2, "2.0 TiB")])
def test_sizes_are_said_in_the_largest_unit_that_keeps_a_figure_of_at_least_one(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("n, text", [(8, "8 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (40_000, "39.1 KiB"),
                                     (3 << 20, "3.0 MiB")])
def test_sizes_of_a_few_tensors_go_down_to_whole_bytes(n, text):
    assert format_bytes(n, smallest="B") == text


def test_a_size_in_a_given_unit_keeps_that_unit_and_its_digits():
    assert format_bytes(3 << 20, "MiB", 3) == "3.000 MiB"
    assert format_bytes(1 << 19, "MiB", 3) == "0.500 MiB"
    assert format_bytes(80 << 30, "GiB") == "80.0 GiB"


def test_a_size_stops_at_the_largest_unit_it_is_given():
    # the localizer's probe cost is said in MiB however large, as a tensor's size is
    assert format_bytes(5000 << 20, smallest="B", largest="MiB") == "5000.0 MiB"
    assert format_bytes(5000 << 20) == "4.9 GiB"


def test_a_memory_estimate_keeps_thousands_apart():
    from graphrt.run.footprint import size_text

    assert size_text(1010 << 20) == format_bytes(1010 << 20, grouped=True) == "1,010.0 MiB"
    assert format_bytes(1010 << 20) == "1010.0 MiB"


def _dashes_standing_for_a_figure(tree: ast.AST) -> list[int]:
    """Lines where a literal "-" takes a figure's place: tabulate's missingval, the fallback of an
    `or`, a returned value, or the branch of a conditional whose other branch is a figure. A dash
    chosen between two literal strings (a sign: `"-" if n < 0 else ""`), an argument (a slug's
    separator) or a line style is no missing figure and is not counted."""
    def dash(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value == "-"

    def literal(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "missingval":
            places = [node.value]
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            places = node.values
        elif isinstance(node, ast.Return):
            places = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        elif isinstance(node, ast.IfExp):
            places = [a for a, b in ((node.body, node.orelse), (node.orelse, node.body)) if not literal(b)]
        else:
            continue
        found += [place.lineno for place in places if dash(place)]
    return found


def test_no_module_but_units_spells_a_missing_figure_as_its_own_dash():
    package = Path(__file__).resolve().parents[1] / "graphrt"
    spelled = {f"{path.relative_to(package)}:{line}"
               for path in sorted(package.rglob("*.py")) if path.name != "units.py"
               for line in _dashes_standing_for_a_figure(ast.parse(path.read_text()))}
    assert not spelled, f"a missing figure spelled as a literal dash, not units.MISSING: {sorted(spelled)}"


@pytest.mark.parametrize("source", ['tabulate(rows, missingval="-")', 'x = "-" if v is None else f"{v}"',
                                    'x = ", ".join(v) or "-"', 'def f():\n    return "-", "-"'])
def test_the_scan_finds_each_way_a_dash_can_stand_for_a_missing_figure(source):
    assert _dashes_standing_for_a_figure(ast.parse(source))


@pytest.mark.parametrize("source", ['sign = "-" if n < 0 else ""', 're.sub("[^a-z]+", "-", text).strip("-")',
                                    'STYLES = ("-", "--")', 'rule = "-" * width'])
def test_the_scan_leaves_a_dash_that_is_no_missing_figure(source):
    assert not _dashes_standing_for_a_figure(ast.parse(source))
