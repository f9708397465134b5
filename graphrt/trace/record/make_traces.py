"""`graphrt trace`: record the decode steps of each mode into a new directory under `traces/`.

    made = make_traces(spec, profiler="auto", out=Path("traces"), overhead_steps=120)
    made.path                  # traces/20250101-120000-qwen2-0.5b-both/
    made.files["eager"]        # {"report": "eager.nsys-rep", "sqlite": "eager.sqlite"} or {"chrome": "eager.json"}
    made.summary               # what summary.json holds

The directory is filled under a temporary name beside it and renamed when every file is there, so
a failed or interrupted run leaves no half-written trace behind and never touches existing ones.
A name that is taken gets a suffix (`-2`, `-3`, ...); `made.wanted` keeps the name first chosen.

Each mode is recorded in a process of its own, `python -m graphrt.trace.record.child`, which loads the
model, warms up and opens the recording window (graphrt.trace.record.record_modes). Under Nsight Systems
`nsys profile` runs it, and the report is then exported to SQLite. Under torch.profiler the window
is that process's first profiler session: CUPTI 13.0 gives graph launches and their kernels wrong
correlation ids in every later one (graphrt.measure.profiling).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import graphrt
from graphrt.backends.choices import expand_modes
from graphrt.errors import GraphrtError
from graphrt.io import write_json
from graphrt.model.config import ModelConfig
from graphrt.model.resolve import resolve
from graphrt.run import execute
from graphrt.run.machine import machine, resolve_device
from graphrt.run.spec import RunSpec
from graphrt.trace.record import nsys_profile
from graphrt.trace.record.overhead import MIN_STEPS as MIN_OVERHEAD_STEPS, NvtxOverhead, measure_nvtx_overhead
from graphrt.trace.record.record_modes import RecordedMode

Say = Callable[[str], None]
Recorded = tuple[list[RecordedMode], dict[str, dict[str, str]], dict[str, Any]]  # + files, profiler facts


@dataclass
class MadeTraces:
    path: Path  # the directory written
    wanted: Path  # the name first chosen (differs from `path` when that was taken)
    profiler: str  # "nsys" or "torch"
    files: dict[str, dict[str, str]]  # mode -> {what: file name inside `path`}
    summary: dict[str, Any]
    overhead: NvtxOverhead | None = None

    def analysis_file(self, mode: str) -> Path:
        """The file `graphrt analyze` reads for `mode`: the SQLite export or the Chrome trace."""
        files = self.files[mode]
        return self.path / files.get("sqlite", files.get("chrome", ""))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove_stale_scratch(out: Path) -> None:
    """Remove the hidden directories of recordings whose process is gone (killed with SIGKILL,
    which no cleanup survives); a live recording's directory is left alone."""
    for path in out.glob(".*.partial"):
        pid = path.name.rsplit(".", 2)[-2]
        if path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _scratch_dir(out: Path, name: str) -> Path:
    """A new hidden directory inside `out` (made if missing); GraphrtError if `out` cannot be written."""
    scratch = out / f".{name}.{os.getpid()}.partial"  # mkdir, not mkdtemp: the umask's permissions
    try:
        out.mkdir(parents=True, exist_ok=True)
        _remove_stale_scratch(out)
        scratch.mkdir()
        return scratch
    except OSError as e:
        raise GraphrtError(f"{out}: cannot write traces here ({e.strerror}); pass --out DIR "
                           "with a directory you can write") from None


def publish(scratch: Path, wanted: Path) -> Path:
    """Rename `scratch` to `wanted`, or to `wanted-2`, `wanted-3`, ... when that name is taken."""
    for n in itertools.count(1):
        target = wanted if n == 1 else wanted.with_name(f"{wanted.name}-{n}")
        if target.exists() or target.is_symlink():
            continue
        try:
            os.rename(scratch, target)  # refuses a non-empty directory that appeared meanwhile
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                continue
            raise GraphrtError(f"{target}: cannot move the finished traces here ({e.strerror})") from None
        return target
    raise AssertionError("unreachable")


def _spec_dict(spec: RunSpec) -> dict[str, Any]:
    return {**asdict(spec), "buckets": list(spec.buckets) if spec.buckets else None}


def spec_from_dict(data: dict[str, Any]) -> RunSpec:
    buckets = data.get("buckets")
    return RunSpec(**{**data, "buckets": tuple(buckets) if buckets else None})


def _child_env() -> dict[str, str]:
    """The recorded process imports the very graphrt this process runs, installed or not."""
    root = str(Path(graphrt.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _record_in_child(spec: RunSpec, scratch: Path, timeout_s: float, what: str,
                     wrap: Callable[[list[str]], list[str]] = list, chrome: Path | None = None
                     ) -> list[RecordedMode]:
    """Record `spec` (one mode) in a process of its own (graphrt.trace.record.child), its command
    wrapped by `wrap` (`nsys profile ...`); return what that process says it did."""
    mode = spec.mode
    spec_path, facts_path = scratch / f".{mode}.spec.json", scratch / f".{mode}.recorded.json"
    write_json(spec_path, _spec_dict(spec))
    child = [sys.executable, "-m", "graphrt.trace.record.child", str(spec_path), str(facts_path),
             *([str(chrome)] if chrome else [])]
    done = nsys_profile.run_bounded(wrap(child), timeout_s, env=_child_env())
    if done.returncode != 0 or not facts_path.is_file():
        raise GraphrtError(f"{what} of the {mode} decode failed (exit status "
                           f"{done.returncode}): {done.last_line()}")
    recorded = [RecordedMode(**facts) for facts in json.loads(facts_path.read_text())]
    spec_path.unlink()
    facts_path.unlink()
    return recorded


def _nsys_one(nsys: str, spec: RunSpec, cuda: bool, scratch: Path, timeout_s: float) -> list[RecordedMode]:
    """Record `spec` (one mode) under `nsys profile` into scratch/MODE.nsys-rep, export that to
    scratch/MODE.sqlite; return what the recorded process says it did."""
    mode = spec.mode
    recorded = _record_in_child(spec, scratch, timeout_s, "nsys profile",
                                lambda child: nsys_profile.profile_command(nsys, scratch / mode, child, cuda))
    report = scratch / f"{mode}.nsys-rep"
    if not report.is_file():
        raise GraphrtError(f"nsys profile of the {mode} decode wrote no report (the recorded "
                           "range never opened?)")
    sqlite = scratch / f"{mode}.sqlite"
    exported = nsys_profile.run_bounded(nsys_profile.export_command(nsys, report, sqlite), timeout_s)
    if exported.returncode != 0 or not sqlite.is_file():
        raise GraphrtError(f"nsys export of {report.name} failed: {exported.last_line()}")
    return recorded


def _record_with_nsys(spec: RunSpec, device: torch.device, scratch: Path, timeout_s: float,
                      say: Say) -> Recorded:
    """Each mode in a process of its own, started by `nsys profile`."""
    nsys = nsys_profile.find_nsys()
    cuda = device.type == "cuda"
    recorded, files = [], {}
    for mode in expand_modes(spec.mode):
        say(f"recording {mode} under Nsight Systems…")
        recorded += _nsys_one(nsys, dataclasses.replace(spec, mode=mode), cuda, scratch, timeout_s)
        files[mode] = {"report": f"{mode}.nsys-rep", "sqlite": f"{mode}.sqlite"}
    profiler = {
        "name": "nsys", "version": nsys_profile.nsys_version(nsys),
        "flags": nsys_profile.profile_flags(cuda),
        "recorded_window": ("cudaProfilerStart/Stop around the steps after warmup" if cuda else
                            f"NVTX capture range {nsys_profile.CAPTURE_RANGE} around the steps after warmup"),
    }
    return recorded, files, profiler


def _record_with_torch(spec: RunSpec, device: torch.device, scratch: Path, timeout_s: float,
                       say: Say) -> Recorded:
    """Each mode in a process of its own, whose first torch.profiler session records it: CUPTI
    13.0 links graph kernels to their launches in a process's first session only."""
    recorded, files = [], {}
    for mode in expand_modes(spec.mode):
        say(f"recording {mode} under torch.profiler…")
        recorded += _record_in_child(dataclasses.replace(spec, mode=mode), scratch, timeout_s,
                                     "the torch.profiler recording", chrome=scratch / f"{mode}.json")
        files[mode] = {"chrome": f"{mode}.json"}
    activities = ["CPU", *(["CUDA"] if device.type == "cuda" else [])]
    profiler = {"name": "torch.profiler", "version": torch.__version__, "activities": activities,
                "recorded_window": "torch.profiler.profile around the steps after warmup, the first "
                                   "session of a process of their own, record_function ranges "
                                   "mirroring graphrt's NVTX ranges"}
    return recorded, files, profiler


def trace_name(started: time.struct_time, config: ModelConfig, spec: RunSpec) -> str:
    """`20250101-120000-qwen2-0.5b-both`: the directory a recording is published under."""
    return f"{time.strftime('%Y%m%d-%H%M%S', started)}-{_slug(config.name)}-{spec.mode}"


def write_summary(directory: Path, started: time.struct_time, config: ModelConfig, spec: RunSpec,
                  device: torch.device, made: Recorded, **more: Any) -> dict[str, Any]:
    """summary.json beside the traces: what was recorded, how, where; returns what it holds."""
    recorded, files, facts = made
    summary = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", started),
        "model": config.name,
        "spec": _spec_dict(spec),
        "profiler": facts,
        "machine": machine(device),
        "modes": {r.mode: {**asdict(r), "files": files[r.mode]} for r in recorded},
        **more,
    }
    write_json(directory / "summary.json", summary)
    return summary


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While open, SIGTERM (what `timeout` and most supervisors send) raises SystemExit, so the
    partial directory is removed on the way out instead of being left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def make_traces(spec: RunSpec, profiler: str = "auto", out: Path = Path("traces"),
                overhead_steps: int = 0, timeout_s: float = nsys_profile.DEFAULT_TIMEOUT_S,
                say: Say = lambda line: None) -> MadeTraces:
    """Record every mode of `spec` with `profiler` into a new directory under `out`.

    `overhead_steps` > 0 first measures what the NVTX ranges cost an eager step (that many steps
    on and off, no profiler attached; graphrt.trace.record.overhead). `say` is told what is happening.
    Raises GraphrtError for bad input, a missing nsys, an unwritable `out`, or a failed recording,
    before anything is written under `out` or after removing what was.
    """
    if 0 < overhead_steps < MIN_OVERHEAD_STEPS:
        raise GraphrtError(f"--overhead must be at least {MIN_OVERHEAD_STEPS} steps, got {overhead_steps}")
    chosen = nsys_profile.choose_profiler(profiler)
    config, _ = resolve(spec.model)
    device = resolve_device(spec.device)
    started = time.localtime()
    name = trace_name(started, config, spec)
    with _terminate_as_exit():
        scratch = _scratch_dir(out, name)
        try:
            overhead = None
            if overhead_steps:
                say(f"measuring NVTX overhead: {overhead_steps} eager steps with ranges on, as many off…")
                overhead = measure_nvtx_overhead(execute.load(spec)[1], spec.batch, spec.prompt_len,
                                                 overhead_steps, spec.seed)
            # the recording processes load their own models
            record = _record_with_torch if chosen == "torch" else _record_with_nsys
            recorded, files, facts = record(spec, device, scratch, timeout_s, say)
            summary = write_summary(scratch, started, config, spec, device, (recorded, files, facts),
                                    nvtx_overhead=overhead.to_dict() if overhead else None)
            wanted = out / name
            path = publish(scratch, wanted)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return MadeTraces(path, wanted, chosen, files, summary, overhead)
