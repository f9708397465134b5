"""This process's place among the ranks of a tensor-parallel run, on torch.distributed.

Every rank is started by torch.distributed's launcher (`torchrun`, or `graphrt run --tp N`
through the same elastic agent), which sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous
address in the environment. gloo carries the collectives on the CPU, NCCL on CUDA with one GPU
per rank.
"""

from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# Imported before any group exists, never after: torch.distributed.nn.functional takes
# `group=group.WORLD` as its functions' default, read when it is first imported (torch._dynamo and
# the profiler import it). First imported after `join`, it would hold the group for good: `leave`
# could not free it, and gloo's threads would run on through the interpreter's exit, while the
# other ranks exit and close their sockets.
import torch.distributed.nn.functional  # noqa: F401  isort: skip

from graphrt.errors import GraphrtError

# Set by graphrt.parallel.launch in the ranks it starts: their launcher prints a failed rank's line.
LAUNCHED_BY_GRAPHRT = "GRAPHRT_LAUNCHER"
# How long a collective may wait for the other ranks before it fails instead of hanging (a rank
# that died is normally noticed sooner, by the launcher, which then stops every rank).
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


@dataclass(frozen=True)
class Ranks:
    """Where this process stands: rank `rank` of `world`, its device, its process group's name."""

    rank: int
    world: int
    device: torch.device
    group: str  # the name functional collectives take (`dist.group.WORLD.group_name`)

    @property
    def leader(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether this process was started by torch.distributed's launcher."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_rank() -> int:
    """This process's rank as the launcher numbered it; 0 in a single-process run."""
    return int(os.environ.get("RANK", 0))


def hand_error_to_launcher(line: str) -> bool:
    """For a rank graphrt's own launcher started: write the one line that says why this rank
    fails into the error file torch's elastic agent gives each worker (TORCHELASTIC_ERROR_FILE,
    the file a `record`ed function's exception goes to), so that the launcher prints the line of
    the rank that failed first, once, instead of every rank printing its own. False where no
    such launcher reads it (under torchrun the rank says it on stderr)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.environ.get(LAUNCHED_BY_GRAPHRT) != "1":
        return False
    with open(path, "w") as f:  # the agent reads it once this process has exited
        json.dump({"message": line, "timestamp": int(time.time())}, f)
    return True


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def launched_device(device_type: str) -> torch.device:
    """The device of this process's rank: GPU `LOCAL_RANK` on CUDA (0 outside a launch), else the CPU."""
    if device_type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device(device_type)


def join(device_type: str) -> Ranks:
    """Join the process group the launcher set up: NCCL and GPU `LOCAL_RANK` on CUDA, gloo on CPU."""
    world, device = int(os.environ["WORLD_SIZE"]), launched_device(device_type)
    if device_type == "cuda":
        if torch.cuda.device_count() <= device.index:
            raise GraphrtError(f"--tp {world}: one GPU per rank, and this machine has "
                               f"{torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device_type), timeout=COLLECTIVE_TIMEOUT,
                                device_id=device if device_type == "cuda" else None)
    return Ranks(dist.get_rank(), dist.get_world_size(), device, dist.group.WORLD.group_name)


def leave() -> None:
    """Leave the process group. Graphs that use the communicator must be gone first: NCCL 2.26+
    hangs in `destroy_process_group` while a CUDA graph holding its kernels is alive, so the
    caller drops every reference to its graphs before, and what is left is collected here."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
