"""One launch of two gloo ranks shared by the rank tests that do not test launching itself.

The ranks join their group once, run each pooled function of tests/ranks.py in turn on it (a
launch costs seconds; a rank joining a second time under the elastic launcher times out in
gloo), and leave. conftest.py's `rank_pool` launches the shared pool once per test run; each test
reads what its function returned, or fails with the error that stopped the pool.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import ranks
import torch
from conftest import FAMILY_CONFIGS, save_reference

from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS
from graphrt.parallel.launch import launch

WORLD = 2
# what the launcher said when the pool failed (kept: the pool is not launched again)
STOPPED = "stopped.txt"

# tp_decode's decode: 6 greedy steps after a [2, 5] prompt
STEPS = 6
PROMPT = torch.randint(0, PRESETS["tiny"].vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
# A HF checkpoint per family, every parameter random: Qwen2 with one KV head (fewer than ranks,
# so each rank holds a copy of it) and tied embeddings; Qwen3 (no bias, a norm per head); Llama 3.
CHECKPOINTS = {
    "qwen2-one-kv-head": replace(PRESETS["tiny"], name="one-kv-head", num_key_value_heads=1,
                                 tie_word_embeddings=True),
    "qwen3": FAMILY_CONFIGS["qwen3"],
    "llama3": FAMILY_CONFIGS["llama3"],
}


def decoded_models(made: Path) -> dict[str, str]:
    """tp_decode's models by name: tiny's random weights, then each checkpoint's directory in `made`."""
    return {"tiny": "tiny", **{name: str(made / name) for name in CHECKPOINTS}}


def shared_jobs(made: Path) -> list[tuple[str, list]]:
    """The pooled functions of tests/ranks.py and their arguments, in the order they run."""
    return [("tape_of_all_reduce", []), ("refusals", []), ("slowest_of_steps", []),
            ("tp_decode", [list(decoded_models(made).values()), PROMPT, STEPS])]


def launch_pool(made: Path, jobs: list[tuple[str, list]]) -> None:
    """Run `jobs` on one launch of two ranks, each rank keeping its results in `made`. A failed
    launch is kept too (STOPPED), not raised: `made_once` then counts the pool made, and the
    tests read the failure instead of each launching the pool again."""
    try:
        launch(ranks.pool, [jobs, str(made)], WORLD)
    except GraphrtError as e:
        (made / STOPPED).write_text(str(e))


def make_shared(made: Path) -> None:
    """The shared pool: tp_decode's checkpoints saved in `made` by transformers, then every job
    of `shared_jobs`; without transformers (a test reference only) tp_decode is left out, and
    kept as skipped with the reason."""
    try:
        for name, config in CHECKPOINTS.items():
            save_reference(config, made / name)
    except pytest.skip.Exception as e:
        _skipped(made, "tp_decode").write_text(e.msg)
    launch_pool(made, [job for job in shared_jobs(made) if not _skipped(made, job[0]).exists()])


def _skipped(made: Path, job: str) -> Path:
    return made / f"{job}.skipped"


@dataclass(frozen=True)
class Pool:
    """A launched pool: its directory and the jobs it was given, in order."""

    made: Path
    jobs: list[tuple[str, list]]

    def _finished(self, job: str) -> bool:
        return all(ranks.pool_file(self.made, job, rank, "result").exists() for rank in range(WORLD))

    def _failed(self, job: str) -> dict[int, Path]:
        """The ranks on which `job` raised, and where each kept its traceback."""
        found = {rank: ranks.pool_file(self.made, job, rank, "failed") for rank in range(WORLD)}
        return {rank: path for rank, path in found.items() if path.exists()}

    def results(self, job: str) -> dict[int, Any]:
        """What `job` returned, by rank. Where the pool stopped before it returned on every rank,
        the test fails: at the job that stopped it (the first that raised on a rank, else the
        first without a result on every rank) with the launcher's line and each rank's
        traceback, at another job naming the one that stopped it."""
        if (skipped := _skipped(self.made, job)).exists():
            pytest.skip(skipped.read_text())
        names = [name for name, _ in self.jobs if not _skipped(self.made, name).exists()]
        stop = next((name for name in names if self._failed(name)),
                    next((name for name in names if not self._finished(name)), None))
        if self._finished(job) and (stop is None or names.index(job) < names.index(stop)):
            return {rank: pickle.loads(ranks.pool_file(self.made, job, rank, "result").read_bytes())
                    for rank in range(WORLD)}
        if job != stop:  # after it, or before it but cut short on a rank the launcher stopped
            ran = "did not run" if names.index(job) > names.index(stop) else "did not return on every rank"
            pytest.fail(f"rank pool: {job} {ran}, the pool stopped at {stop}", pytrace=False)
        # the launcher's line names the rank that failed first; a peer's own error may follow from it
        stopped = self.made / STOPPED
        said = [stopped.read_text() if stopped.exists() else "the launch ended without its result on every rank"]
        said += [f"rank {rank}: {path.read_text()}" for rank, path in self._failed(job).items()]
        pytest.fail(f"rank pool: {job} failed; " + "\n".join(said), pytrace=False)
