"""`graphrt trace --tp N`: every rank records its own steps under torch.profiler into `rank<r>/`
of one new directory, a trace directory of its own (Chrome traces and summary.json, as `graphrt
trace` writes them), so `graphrt analyze DIR/rank<r>` reads one rank as it reads any trace. The
process that starts the ranks names the directory and publishes it once every mode is recorded;
a rank that fails stops them all (the launcher), and the directory is removed.

Nsight Systems is left out: it would wrap each rank's process, which the launcher starts. Each
mode is recorded by ranks started for it alone, as a single-process `graphrt trace` gives every
mode a process of its own: each profiler session is its process's first, the only one in which
CUDA 13.0 links graph kernels to their launches (CUPTI's second-session bug, docs/design.md,
"torch.profiler and CUPTI").
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from graphrt.backends.choices import expand_modes
from graphrt.model.resolve import resolve
from graphrt.parallel.launch import launch
from graphrt.parallel.ranks import leave
from graphrt.run import execute
from graphrt.run.spec import RunSpec
from graphrt.trace.record.make_traces import MadeTraces, Say, _scratch_dir, publish, trace_name, write_summary
from graphrt.trace.record.record_modes import RecordedMode, record_modes, torch_window


def make_rank_traces(spec: RunSpec, world: int, out: Path, say: Say) -> MadeTraces:
    """Record every mode of `spec` on `world` ranks into rank<r>/ of one new directory under
    `out`, each mode by ranks started for it alone; what was made, as rank 0's directory."""
    config, _ = resolve(spec.model)
    started = time.localtime()
    name = f"{trace_name(started, config, spec)}-tp{world}"
    scratch = _scratch_dir(out, name)
    modes = expand_modes(spec.mode)
    recorded: dict[int, list[RecordedMode]] = {rank: [] for rank in range(world)}
    try:
        for mode in modes:
            say(f"recording {mode} on {world} ranks under torch.profiler…")
            for rank, (mine, device) in launch(_record_mode, [replace(spec, mode=mode), scratch], world).items():
                recorded[rank] += mine
        files = {mode: {"chrome": f"{mode}.json"} for mode in modes}
        facts = {"name": "torch.profiler", "version": torch.__version__,
                 "activities": ["CPU", *(["CUDA"] if device.type == "cuda" else [])],
                 "recorded_window": "torch.profiler.profile around the steps after warmup, each mode "
                                    "on ranks started for it alone"}
        summary = {rank: write_summary(scratch / f"rank{rank}", started, config, spec, device,
                                       (recorded[rank], files, facts), rank=rank, world=world)
                   for rank in range(world)}
        path = publish(scratch, out / name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return MadeTraces(path / "rank0", out / name / "rank0", "torch", files, summary[0])


def _record_mode(spec: RunSpec, scratch: Path) -> tuple[list[RecordedMode], torch.device]:
    """On one rank: record `spec`'s one mode into rank<r>/ of `scratch`."""
    ranks = execute.join_ranks(spec)
    mine = scratch / f"rank{ranks.rank}"
    mine.mkdir(exist_ok=True)
    config, model, device, _ = execute.load(spec, ranks)
    recorded = record_modes(spec, config, model, window=lambda mode: torch_window(device, mine / f"{mode}.json"),
                            count=device.type != "cuda")
    del model
    leave()
    return recorded, device
