"""The rank pool (tests/rank_pool.py): a job that raises on one rank stops the pool there, its
test fails with that rank's own error, the jobs before it keep their results and those after it
say which job stopped them; the peer left waiting in a collective does not hang the launch."""

from __future__ import annotations

import pickle

import pytest
import ranks
from rank_pool import STOPPED, Pool, launch_pool

# slowest_of_steps' figures on two ranks (tests/bench/test_bench_tp.py asserts them too)
SLOWEST = [3.0, 5.0, 2.0]


@pytest.fixture(scope="module")
def stopped_pool(tmp_path_factory) -> Pool:
    """A pool whose second job raises on rank 1 while rank 0 waits for it in a barrier."""
    made = tmp_path_factory.mktemp("stopped-pool")
    jobs = [("slowest_of_steps", []), ("raises_on", [1]), ("tape_of_all_reduce", [])]
    launch_pool(made, jobs)
    return Pool(made, jobs)


@pytest.mark.processes
def test_the_jobs_before_a_failed_one_keep_their_results(stopped_pool):
    assert stopped_pool.results("slowest_of_steps") == {0: SLOWEST, 1: SLOWEST}


@pytest.mark.processes
def test_a_failed_job_fails_its_test_with_the_raising_ranks_own_error(stopped_pool):
    with pytest.raises(pytest.fail.Exception) as failed:
        stopped_pool.results("raises_on")
    said = str(failed.value)
    assert said.startswith("rank pool: raises_on failed; rank 1 of 2: ValueError: planted on rank 1")
    assert "rank 1: Traceback" in said and "ValueError: planted on rank 1" in said


@pytest.mark.processes
def test_a_job_after_a_failed_one_fails_naming_the_job_that_stopped_the_pool(stopped_pool):
    with pytest.raises(pytest.fail.Exception, match="^rank pool: tape_of_all_reduce did not run, "
                                                    "the pool stopped at raises_on$"):
        stopped_pool.results("tape_of_all_reduce")


def test_the_job_that_raised_is_blamed_though_a_rank_was_stopped_before_keeping_an_earlier_result(tmp_path):
    # as the launcher leaves it when rank 0 raises in B while rank 1 still writes A's result:
    # A kept on rank 0 only (rank 1's cut short, never renamed into place), B's traceback on rank 0
    jobs = [("A", []), ("B", []), ("C", [])]
    ranks.pool_file(tmp_path, "A", 0, "result").write_bytes(pickle.dumps("a"))
    ranks.pool_file(tmp_path, "A", 1, "result.part").write_bytes(pickle.dumps("a")[:3])
    ranks.pool_file(tmp_path, "B", 0, "failed").write_text("Traceback: ValueError: in B")
    (tmp_path / STOPPED).write_text("rank 0 of 2: ValueError: in B")
    pool = Pool(tmp_path, jobs)
    with pytest.raises(pytest.fail.Exception, match="^rank pool: B failed; rank 0 of 2: ValueError: in B\nrank 0: "):
        pool.results("B")
    with pytest.raises(pytest.fail.Exception,
                       match="^rank pool: A did not return on every rank, the pool stopped at B$"):
        pool.results("A")
    with pytest.raises(pytest.fail.Exception, match="^rank pool: C did not run, the pool stopped at B$"):
        pool.results("C")
