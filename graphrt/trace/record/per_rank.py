"""`graphrt trace --tp N`, on each rank: every rank records its own steps under torch.profiler
into `rank<r>/` of one new directory, a trace directory of its own (Chrome traces and
summary.json, as `graphrt trace` writes them), so `graphrt analyze DIR/rank<r>` reads one rank
as it reads any trace. Rank 0 names the directory and publishes it once every rank is done; a
rank that fails stops them all (the launcher), and the hidden directory goes with the next
recording under the same `--out` (`session._remove_stale_scratch`).

Nsight Systems is left out: it would wrap each rank's process, which the launcher starts. Each
rank records its modes one after another in its own process (a single-process `graphrt trace`
gives every mode a process of its own), so on CUDA 13.0 only the first mode's profiler session
links graph kernels to their launches (CUPTI's second-session bug, docs/design.md, "torch.profiler and CUPTI"): trace graph replays with
`--mode graph` there.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from graphrt.backends.factory import expand_modes
from graphrt.model.config import resolve
from graphrt.parallel.ranks import Ranks
from graphrt.run import execute
from graphrt.run.spec import RunSpec
from graphrt.trace.record.make_traces import MadeTraces, Say, _scratch_dir, publish, trace_name, write_summary
from graphrt.trace.record.record_modes import record_modes, torch_window


def _from_leader(value: object) -> object:
    """Rank 0's `value`, on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def make_rank_traces(spec: RunSpec, ranks: Ranks, out: Path, say: Say) -> MadeTraces | None:
    """Record this rank's share of every mode of `spec` into rank<r>/ of one new directory under
    `out`; rank 0 gets what was made (its own rank's files), the others None."""
    config, _ = resolve(spec.model)
    started = time.localtime()
    name = _from_leader(f"{trace_name(started, config, spec)}-tp{ranks.world}")
    scratch = _from_leader(_scratch_dir(out, name) if ranks.leader else None)
    mine = scratch / f"rank{ranks.rank}"
    try:
        mine.mkdir()
        _, model, device, _ = execute.load(spec, ranks)
        say(f"recording {spec.mode} on {ranks.world} ranks under torch.profiler…")
        recorded = record_modes(spec, config, model, window=lambda mode: torch_window(device, mine / f"{mode}.json"),
                                count=device.type != "cuda")
        del model
        files = {mode: {"chrome": f"{mode}.json"} for mode in expand_modes(spec.mode)}
        facts = {"name": "torch.profiler", "version": torch.__version__,
                 "activities": ["CPU", *(["CUDA"] if device.type == "cuda" else [])],
                 "recorded_window": "torch.profiler.profile around the steps after warmup, the "
                                    "modes one after another in each rank's process"}
        made = (recorded, files, facts)
        summary = write_summary(mine, started, config, spec, device, made, rank=ranks.rank,
                                world=ranks.world)
        dist.barrier()  # every rank's files are there
        path = publish(scratch, out / name) if ranks.leader else None
    except BaseException:
        if ranks.leader:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    if not ranks.leader:
        return None
    return MadeTraces(path / mine.name, out / name / mine.name, "torch", made[1], summary)
