"""Running the Nsight Systems CLI: `nsys profile` around a command, `nsys export` to SQLite.

Every nsys process runs under a time limit and is cleaned up after, whatever happened. That takes
more than killing one process: `nsys profile` starts an agent (`nsys --start-agent
--session-name=profile-<program>-<pid of nsys profile>`) that detaches into a session of its own,
and the profiled program runs in yet another session under `nsys-launcher`. Neither is in the
process group of `nsys profile`, so on a timeout or an interrupt this module kills the whole tree
it can see (descendants by parent pid, taken before anything dies) and the agent (by its session
name). On nsys 2022.4 without a GPU an agent that samples CPUs or context switches never ends
and ignores SIGTERM, which is why `profile_command` always turns both off.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphrt.errors import GraphrtError

INSTALL_HINT = ("install it with scripts/install-nsys.sh PREFIX (Debian's package, no GPU needed) "
                "or NVIDIA's installer (https://developer.nvidia.com/nsight-systems), then put "
                "PREFIX/bin on PATH")

# The NVTX range the recorded process opens around the steps (graphrt.trace.record.record_modes) and, on a
# machine without CUDA, the capture range nsys waits for: `-p RANGE@DOMAIN`.
CAPTURE_RANGE = "record@graphrt"

PROFILERS = ("auto", "nsys", "torch")  # what `graphrt trace --profiler` takes
DEFAULT_TIMEOUT_S = 900.0  # seconds each nsys run may take


def find_nsys() -> str:
    """The path of `nsys` on PATH; GraphrtError saying how to get it when there is none."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise GraphrtError(f"--profiler nsys: no nsys (Nsight Systems CLI) on PATH; {INSTALL_HINT}")
    return nsys


def choose_profiler(name: str) -> str:
    """"nsys" or "torch"; auto picks nsys when it is on PATH. GraphrtError for nsys without nsys."""
    if name not in PROFILERS:
        raise GraphrtError(f"--profiler must be one of {', '.join(PROFILERS)}, got {name!r}")
    if name == "auto":
        return "nsys" if shutil.which("nsys") else "torch"
    if name == "nsys":
        find_nsys()
    return name


def nsys_version(nsys: str) -> str:
    """`2022.4.2.1` from `NVIDIA Nsight Systems version 2022.4.2.1-df9881f`; the whole line if
    it has another form."""
    line = run_bounded([nsys, "--version"], timeout_s=60).stdout.strip()
    found = re.search(r"version\s+(\S+?)(-\w+)?$", line)
    return found.group(1) if found else line


def profile_flags(cuda: bool) -> list[str]:
    """What `nsys profile` traces, and when it records: between the recorded process's markers.

    On CUDA the markers are cudaProfilerStart/Stop and nsys traces CUDA (every node of a replayed
    graph), NVTX and OS runtime calls. Without CUDA `-c cudaProfilerApi` would write no report at
    all, so the marker is the NVTX range `CAPTURE_RANGE` and only NVTX and OS runtime calls are
    traced. Either way recording ends with the range (`--capture-range-end=stop`), and CPU
    sampling and context-switch tracing stay off (see the module docstring).
    """
    if cuda:
        what = ["-t", "cuda,nvtx,osrt", "--cuda-graph-trace=node", "-c", "cudaProfilerApi"]
    else:
        what = ["-t", "nvtx,osrt", "-c", "nvtx", "-p", CAPTURE_RANGE]
    return [*what, "--capture-range-end=stop", "-s", "none", "--cpuctxsw=none"]


def profile_command(nsys: str, output: Path, command: Sequence[str], cuda: bool) -> list[str]:
    """`nsys profile` of `command`, its report written to `output`.nsys-rep (replacing one there)."""
    return [nsys, "profile", *profile_flags(cuda), "-o", str(output), "-f", "true", *command]


def export_command(nsys: str, report: Path, output: Path) -> list[str]:
    return [nsys, "export", "-t", "sqlite", "-q", "true", "-f", "true", "-o", str(output), str(report)]


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def last_line(self) -> str:
        """The last line the command said, stderr first (progress bars redraw with \\r)."""
        for text in (self.stderr, self.stdout):
            lines = [ln.strip() for ln in re.split(r"[\r\n]", text) if ln.strip()]
            if lines:
                return lines[-1]
        return f"exit status {self.returncode}, no output"


def run_bounded(cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> Finished:
    """Run `cmd` to the end or for `timeout_s` seconds, whichever is first; never leaves a
    process of it behind. A timeout or an interrupt kills the tree and raises (GraphrtError for
    the timeout); a non-zero exit status is returned, not raised."""
    proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.communicate()
        raise GraphrtError(f"{Path(cmd[0]).name} {cmd[1]} did not finish within {timeout_s:g} s and "
                           "was killed with everything it started") from None
    except BaseException:  # Ctrl-C: its processes are in sessions of their own and got no SIGINT
        _kill_tree(proc.pid)
        proc.communicate()
        raise
    finally:
        _kill_agents(proc.pid)
    return Finished(proc.returncode, stdout, stderr)


# ---------------------------------------------------------------------------------------------
# Finding and killing what nsys started (Linux: /proc)


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process we can see."""
    parents = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        # `pid (comm) state ppid ...`; comm may hold spaces and parentheses
        parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    return parents


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _agents(nsys_pid: int) -> list[int]:
    """The `nsys --start-agent` processes that the `nsys profile` with pid `nsys_pid` started."""
    session = re.compile(rf"--session-name=profile-.*-{nsys_pid}$")
    agents = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in args]
        if "--start-agent" in words and any(session.match(w) for w in words):
            agents.append(int(entry.name))
    return agents


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(root: int) -> None:
    """SIGKILL `root`, everything below it, and its nsys agents. The tree is read before the
    first kill: once a parent dies its children are re-parented and can no longer be told apart."""
    _kill([root, *_descendants(root), *_agents(root)])


def _kill_agents(nsys_pid: int) -> None:
    """After a run: an agent of ours that outlived `nsys profile` would spin for ever."""
    _kill(_agents(nsys_pid))
