"""Reading a traffic for `graphrt plan`: every format, and each bad entry refused in one line."""

from __future__ import annotations

import json

import pytest

from graphrt.plan.traffic import read_traffic
from graphrt.errors import GraphrtError


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_json_histogram_a_csv_histogram_and_a_list_of_sizes_read_alike(tmp_path):
    expected = {1: 2, 3: 1, 8: 3}
    histogram = _write(tmp_path, "h.json", json.dumps({"8": 3, "1": 2, "3": 1}))
    csv = _write(tmp_path, "h.csv", "batch,count\n1,2\n3,1\n8,3\n")
    listed = _write(tmp_path, "sizes.txt", "8\n1\n3\n8\n\n1\n8\n")
    json_list = _write(tmp_path, "sizes.json", "[8, 1, 3, 8, 1, 8]")
    for path in (histogram, csv, listed, json_list):
        traffic = read_traffic(path)
        assert traffic == expected and list(traffic) == sorted(traffic), path.name


def test_a_run_json_and_a_trace_summary_give_their_steps_at_their_batch(tmp_path):
    run = _write(tmp_path, "run.json", json.dumps({"model": "tiny", "batch": 4, "steps": 32, "modes": {}}))
    summary = _write(tmp_path, "summary.json", json.dumps({"spec": {"batch": 2, "steps": 8}, "modes": {}}))
    assert read_traffic(run) == {4: 32}
    assert read_traffic(summary) == {2: 8}


@pytest.mark.parametrize("name, text, said", [
    ("neg.json", '{"1": 3, "2": -1}', "entry '2': count -1 for batch 2 is not a non-negative integer"),
    ("frac.json", '{"1": 2.5}', "entry '1': count 2.5 for batch 1 is not a non-negative integer"),
    ("zero.json", '{"0": 4}', "entry '0': batch size '0' is not a positive integer"),
    ("word.json", '{"one": 4}', "entry 'one': batch size 'one' is not a positive integer"),
    ("neg.csv", "batch,count\n1,2\n4,-3\n", "line 3: count '-3' for batch 4 is not a non-negative integer"),
    ("zero.txt", "1\n0\n", "line 2: batch size '0' is not a positive integer"),
    ("wide.csv", "1,2,3\n", "line 1: '1,2,3': expected `batch,count` or one batch size"),
    ("empty.json", '{"3": 0}', "the traffic holds no decode step"),
    ("broken.json", '{"1": 2', "not valid JSON"),
])
def test_each_bad_entry_is_refused_naming_the_file_and_the_entry(tmp_path, name, text, said):
    path = _write(tmp_path, name, text)
    with pytest.raises(GraphrtError) as refused:
        read_traffic(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and said in message and "\n" not in message


def test_a_count_of_zero_and_an_integral_float_are_accepted(tmp_path):
    path = _write(tmp_path, "ok.json", '{"1": 0, "2": 3.0}')
    assert read_traffic(path) == {1: 0, 2: 3}


def test_a_missing_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(GraphrtError, match="cannot read the traffic"):
        read_traffic(tmp_path / "absent.json")
