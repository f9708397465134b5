"""`graphrt bench` with a `tp` sweep: points with tp > 1 run on ranks the launcher starts (gloo on
the CPU), their results carry tp, and a tp that does not divide the heads is refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from graphrt.bench.results import memory_table, table
from graphrt.cli.main import main

TP_SWEEP = """
models = ["tiny"]
tp = [1, 2]
modes = ["eager", "graph"]
batch_sizes = [1, 2]
context_lengths = [16]
steps = 3
warmup = 1
repeats = 1
peer = false
threads = 1
"""


@pytest.fixture(scope="module")
def tp_sweep(tmp_path_factory) -> dict:
    """One sweep over tp 1 and 2, shared by the tests here."""
    out = tmp_path_factory.mktemp("results")
    scenario = out / "tp_sweep.toml"
    scenario.write_text(TP_SWEEP)
    result = CliRunner().invoke(main, ["bench", str(scenario), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (path,) = out.glob("tp_sweep-*.json")
    return json.loads(path.read_text())


@pytest.mark.processes
def test_tp_is_swept_like_batch_sizes_and_every_point_says_its_tp(tp_sweep):
    assert [(p["tp"], p["batch"]) for p in tp_sweep["points"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for p in tp_sweep["points"]:
        assert set(p["modes"]) == {"eager", "graph"}
        for mode in p["modes"].values():
            assert len(mode["samples_ms"]) == 3 and all(ms > 0 for ms in mode["samples_ms"])
        assert p["modes"]["graph"]["same_tokens_as_eager"] is True
    for text in (table(tp_sweep), memory_table(tp_sweep)):
        header, _, *rows = text.splitlines()
        assert header.split()[:2] == ["model", "tp"]
        assert [row.split()[1] for row in rows] == ["1"] * (len(rows) // 2) + ["2"] * (len(rows) // 2)


@pytest.mark.processes
def test_a_ranks_roofline_counts_the_bytes_that_rank_holds(tp_sweep):
    """Between tp 1 and tp 2 at one batch, the step's bytes drop by what a rank no longer holds:
    its share of the weights, and of the KV cache read whole and written one slot a step."""
    by_point = {(p["tp"], p["batch"]): p for p in tp_sweep["points"]}
    for batch in (1, 2):
        whole, share = by_point[1, batch], by_point[2, batch]
        fewer_params = whole["memory"]["parameter_bytes"] - share["memory"]["parameter_bytes"]
        fewer_cache = whole["memory"]["cache_bytes"] - share["memory"]["cache_bytes"]
        assert fewer_params > 0 and fewer_cache > 0  # each rank holds a share, not the model
        dropped = whole["modes"]["eager"]["roofline"]["bytes"] - share["modes"]["eager"]["roofline"]["bytes"]
        assert dropped == pytest.approx(fewer_params + fewer_cache * (1 + 1 / whole["max_seq_len"]))


def test_a_tp_that_does_not_divide_the_heads_is_refused_naming_file_and_value(cli, tmp_path):
    scenario = tmp_path / "odd.toml"
    scenario.write_text(TP_SWEEP.replace("tp = [1, 2]", "tp = [1, 3]"))
    result = cli("bench", scenario, "--out", tmp_path)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {scenario}: tp 3: ") and "not its 4 query heads" in line
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("value", ["[0]", "[2, 2]", "2"])
def test_a_tp_that_is_no_list_of_distinct_positive_integers_is_refused(cli, tmp_path, value):
    scenario = tmp_path / "bad.toml"
    scenario.write_text(TP_SWEEP.replace("tp = [1, 2]", f"tp = {value}"))
    result = cli("bench", scenario, "--out", tmp_path)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert f"{scenario}: tp " in line


@pytest.mark.processes
def test_a_tensor_parallel_step_takes_its_slowest_ranks_time_step_by_step(rank_pool):
    assert rank_pool.results("slowest_of_steps") == {0: [3.0, 5.0, 2.0], 1: [3.0, 5.0, 2.0]}
