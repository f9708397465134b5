"""Figures as text (graphrt.units): each format as the tables and lines that use it show it, and an
unknown figure shown as missing, never as 0."""

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
