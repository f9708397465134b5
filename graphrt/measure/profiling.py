"""torch.profiler sessions, numbered per process, started and stopped with kineto's chatter left out.

    with profiler_session(device) as session:
        step()
    session.number            # 1 for the first session this process opened, 2 for the next, ...
    session.profile.events()  # what it recorded

Every torch.profiler session graphrt opens goes through here, for two reasons:

- CUPTI 13.0 gives `cudaGraphLaunch` calls and their kernels wrong correlation ids in every
  profiler session after a process's first (fixed in CUDA 13.1 Update 1; kineto issue 1165).
  A graph kernel is tied to its launch, and so to its step, only by that id, so graphrt profiles
  graph replays in a process's first session only; `number` lets each measurement say which
  session it came from, and tests check the rule.
- kineto logs `USDT: ... profiler_start` / `profiler_stop` (and `STAGE:` lines) straight to file
  descriptor 2 when a session starts and stops; they are no business of graphrt's user, so the
  start and the stop run with fd 2 caught, and every other line caught there is passed on.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch

# kineto's progress lines: `USDT:2026-01-01 10:00:00 123:123 SyncActivityProfilerHandler.cpp:52] profiler_start`
KINETO_PROGRESS = re.compile(r"(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\]")

_opened = 0  # torch.profiler sessions this process has opened through `profiler_session`


def sessions_opened() -> int:
    """How many profiler sessions this process has opened so far."""
    return _opened


@dataclass(frozen=True)
class Session:
    number: int  # 1 for the process's first session
    profile: torch.profiler.profile


def profiler_activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    """What torch.profiler records on `device`: CPU ops and calls, and the GPU's work on CUDA."""
    cpu = [torch.profiler.ProfilerActivity.CPU]
    return cpu + [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else cpu


@contextlib.contextmanager
def kineto_progress_dropped() -> Iterator[None]:
    """Runs the block with fd 2 caught, then writes back every caught line but kineto's progress
    lines. For short calls only (a session's start or stop): what the block writes to stderr
    reaches it only when the block ends."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().splitlines(keepends=True)
                    if not KINETO_PROGRESS.match(line.decode(errors="replace"))]
            if kept:
                os.write(2, b"".join(kept))


@contextlib.contextmanager
def profiler_session(device: torch.device) -> Iterator[Session]:
    """A torch.profiler session (`profiler_activities(device)`) around the block, numbered in this process."""
    global _opened
    _opened += 1
    session = Session(_opened, torch.profiler.profile(activities=profiler_activities(device)))
    with kineto_progress_dropped():
        session.profile.start()
    try:
        yield session
    finally:
        with kineto_progress_dropped():
            session.profile.stop()
