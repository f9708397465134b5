"""Several traces are read at once, one process each (`graphrt analyze --jobs`): the figures, the
text and the JSON are those of reading the same files one after another, and where a file is
broken the one line is the one reading them in order would give."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

TORCH = Path(__file__).parents[1] / "data" / "torch"
RANKS = [TORCH / "hta-nccl-rank0-sendrecv.json.gz", TORCH / "hta-nccl-rank1-sendrecv.json.gz"]


def _rank_directory(tmp_path: Path, world: int) -> Path:
    """One Chrome trace per rank, as engines write them: HTA's two real NCCL ranks, and copies of
    them as ranks 2, 3, ... (each file's distributedInfo says which rank of how many)."""
    made = tmp_path / "ranks"
    made.mkdir()
    for rank in range(world):
        document = json.loads(gzip.decompress(RANKS[rank % 2].read_bytes()))
        document["distributedInfo"].update(rank=rank, world_size=world)
        (made / f"rank_{rank}.json.gz").write_bytes(gzip.compress(json.dumps(document).encode()))
    return made


def _analyze(cli, tmp_path: Path, *args) -> tuple[str, dict]:
    out = tmp_path / "figures.json"
    result = cli("analyze", *args, "--json", out)
    assert result.exit_code == 0, result.output
    return result.stdout, json.loads(out.read_text())


@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_directory_read_a_process_a_file_gives_the_figures_of_reading_them_one_by_one(cli, tmp_path, world):
    made = _rank_directory(tmp_path, world)
    one_by_one = _analyze(cli, tmp_path, made, "--jobs", "1")
    at_once = _analyze(cli, tmp_path, made, "--jobs", str(world))
    assert at_once == one_by_one
    assert f"== {made}: {world} ranks" in at_once[0] and len(at_once[1]["ranks"]) == world


def test_files_given_one_by_one_read_at_once_come_back_in_the_order_given(cli, tmp_path):
    made = _rank_directory(tmp_path, 2)
    files = [made / "rank_1.json.gz", made / "rank_0.json.gz"]
    text, figures = _analyze(cli, tmp_path, *files, "--jobs", "2")
    assert (text, figures) == _analyze(cli, tmp_path, *files, "--jobs", "1")
    assert [Path(t["source"]).name for t in figures["traces"]] == ["rank_1.json.gz", "rank_0.json.gz"]


def test_a_broken_rank_among_several_gets_the_line_reading_them_in_order_gives(cli, tmp_path):
    made = _rank_directory(tmp_path, 4)
    for rank in (1, 3):  # two broken: the first in order is named
        (made / f"rank_{rank}.json.gz").write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "kernel"')
    results = [cli("analyze", made, "--jobs", jobs) for jobs in ("1", "4")]
    assert [r.exit_code for r in results] == [1, 1] and results[0].stderr == results[1].stderr
    assert results[1].stderr.startswith(f"error: {made / 'rank_1.json.gz'}: not a readable Chrome-trace JSON")
