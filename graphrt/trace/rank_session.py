"""`graphrt trace --tp N`, on each rank: every rank records its own steps under torch.profiler
into `rank<r>/` of one new directory, a trace directory of its own (Chrome traces and
summary.json, as `graphrt trace` writes them), so `graphrt analyze DIR/rank<r>` reads one rank
as it reads any trace. Rank 0 names the directory and publishes it once every rank is done; a
rank that fails stops them all (the launcher), and the hidden directory goes with the next
recording under the same `--out` (`session._remove_stale_scratch`).

Nsight Systems is left out: it would wrap each rank's process, which the launcher starts.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch.distributed as dist

from graphrt import runner
from graphrt.config import resolve
from graphrt.parallel.ranks import Ranks
from graphrt.runner import RunSpec
from graphrt.trace.session import (MadeTraces, Say, _record_with_torch, _scratch_dir, publish,
                                   trace_name, write_summary)


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
        _, model, device, _ = runner.load(spec, ranks)
        made = _record_with_torch(spec, config, model, device, mine, say)
        del model
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
