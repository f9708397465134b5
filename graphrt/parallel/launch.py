"""Start N ranks through torch.distributed's elastic launcher (what `torchrun` runs).

`graphrt run --tp N` (and `graphrt trace --tp N`) re-runs its own command line as N worker
processes under the launcher's agent, which sets each one's RANK, WORLD_SIZE and LOCAL_RANK and a
rendezvous on this machine, watches them, and stops every rank as soon as one fails: a rank that
dies never leaves the others waiting in a collective.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from typing import Any, Callable

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from graphrt.errors import GraphrtError
from graphrt.model.config import ModelConfig
from graphrt.model.resolve import resolve
from graphrt.model.sharding import split
from graphrt.parallel.ranks import LAUNCHED_BY_GRAPHRT, launched


# Every rank runs on this machine: the rendezvous binds the loopback address on a port the OS
# picks free (0), and each node names itself by that address. Left to itself, the launcher names
# a node by its host name (socket.getfqdn), a lookup that fails or stalls on a box without DNS,
# and torchrun's default static rendezvous takes port 29500, which two runs at once both want.
LOCAL_ADDR = "127.0.0.1"
# the same for `python -m torch.distributed.run` (torchrun)
TORCHRUN_LOCAL = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOCAL_ADDR}:0", "--local-addr", LOCAL_ADDR)


def _config(ranks: int) -> LaunchConfig:
    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks, run_id=uuid.uuid4().hex,
                        rdzv_backend="c10d", rdzv_endpoint=f"{LOCAL_ADDR}:0", local_addr=LOCAL_ADDR,
                        max_restarts=0, monitor_interval=0.1)


def _said(failure: ProcessFailure) -> str | None:
    """What a failed rank wrote in its error file: a function's exception as torch records it, a
    graphrt command's one line (ranks.hand_error_to_launcher); None for a rank that wrote none."""
    if not os.path.isfile(failure.error_file):
        return None
    said = failure.error_file_data.get("message")
    return said.get("message") if isinstance(said, dict) else said


def _cause(failures: dict[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """The rank whose failure stopped the others. A rank killed by a signal (other than the SIGTERM
    the agent stops the rest with) before it could say why is the cause even where another rank's
    error was seen first: its peers fail in their next collective, and on a busy machine they may
    exit before the agent notices the dead one. (A peer that said its error and then aborted on
    the way out, as gloo does with a broken pair, saw the failure; it did not cause it.)
    Otherwise the first failure."""
    killed = {r: f for r, f in failures.items()
              if f.exitcode < 0 and f.exitcode != -signal.SIGTERM and _said(f) is None}
    found = killed or failures
    rank = min(found, key=lambda r: (found[r].timestamp, r))
    return rank, found[rank]


def launch(entrypoint: Callable[..., Any] | str, args: list[Any], ranks: int) -> dict[int, Any]:
    """Run `entrypoint(*args)` (a function, or an executable given by path) on `ranks` processes;
    the value each rank returned, by rank (None for an executable). A rank that fails stops all
    of them and raises GraphrtError with its own line, the one line said of the failure."""
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the agent's own account of a failure is a page long
    os.environ[LAUNCHED_BY_GRAPHRT] = "1"  # the ranks inherit it
    try:
        return elastic_launch(_config(ranks), entrypoint)(*args)
    except ChildFailedError as e:
        rank, failure = _cause(e.failures)
        if said := _said(failure):
            raise GraphrtError(f"rank {rank} of {ranks}: {said} (every rank was stopped)") from None
        raise GraphrtError(f"rank {rank} of {ranks} failed (exit code {failure.exitcode}); "
                           "every rank was stopped") from None
    finally:
        quiet.setLevel(level)
        os.environ.pop(LAUNCHED_BY_GRAPHRT, None)


def launch_command(argv: list[str], ranks: int) -> None:
    """`python -m graphrt <argv>` on `ranks` processes (each joins the group as it starts)."""
    launch(sys.executable, ["-m", "graphrt", *argv], ranks)


def relaunched(options: dict[str, Any]) -> bool:
    """For a command given `--tp N` (N > 1) that the launcher did not start: run this command
    line again on N ranks under the launcher, and say so (the command's work is done). What
    every rank would refuse alike is refused here first, in one line."""
    tp = options["tp"]
    if (tp or 1) <= 1 or launched():
        return False
    refuse_early(options)
    launch_command(sys.argv[1:], tp)  # the arguments this process was started with
    return True


def refuse_transformers(config: ModelConfig, tp: int) -> None:
    """--tp on a model that runs on transformers' forward: graphrt shards only its own step."""
    if tp > 1 and not config.lean:
        raise GraphrtError(f"--tp {tp}: {config.name} runs on transformers' own forward, which graphrt "
                           "does not shard (tensor parallelism is for the qwen2, qwen3 and llama "
                           "families on graphrt's step); leave out --tp")


def refuse_early(options: dict[str, Any]) -> None:
    """What every one of `--tp N` ranks would refuse alike, refused before any starts."""
    tp = options["tp"]
    config = resolve(options["model"], options.get("impl", "auto"))[0]
    refuse_transformers(config, tp)
    split(config, 0, tp)
    cuda = options["device"] == "cuda" or (options["device"] == "auto" and torch.cuda.is_available())
    if cuda and tp > (gpus := torch.cuda.device_count()):
        raise GraphrtError(f"--tp {tp}: one GPU per rank, and this machine has {gpus}")
