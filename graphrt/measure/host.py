"""What this machine and its packages are, told without importing torch (which takes a second):
`graphrt info` and every command's --help start at once (docs/design.md, "Start-up")."""

from __future__ import annotations

import importlib.util
import os
import platform
import runpy
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import graphrt
from graphrt.errors import GraphrtError


@dataclass(frozen=True)
class TorchBuild:
    version: str  # torch.__version__, e.g. "2.13.0+cpu"
    cuda: str | None  # torch.version.cuda: the CUDA it was built for; None for a CPU-only build


def torch_build() -> TorchBuild:
    """The installed torch's version and CUDA, read from its `torch/version.py` (a generated file
    of constants) without importing torch."""
    spec = importlib.util.find_spec("torch")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise GraphrtError("torch is not installed: pip install torch")
    constants = runpy.run_path(str(Path(spec.submodule_search_locations[0]) / "version.py"))
    return TorchBuild(constants["__version__"], constants["cuda"])


def cpu_name() -> str:
    try:  # Linux names the CPU model here; platform.processor() is often empty
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def meminfo(field: str, path: str = "/proc/meminfo") -> int | None:
    """A figure of Linux's /proc/meminfo in bytes (`MemTotal`, `MemAvailable`), or None where
    the machine has no such file or figure."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == field:
                    return int(value.split()[0]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def describe(device: str, device_name: str, cuda_available: bool) -> dict:
    """Versions and the machine's facts around a device the caller names."""
    build = torch_build()
    return {
        "graphrt": graphrt.__version__,
        "torch": build.version,
        "nvtx": version("nvtx"),
        "python": platform.python_version(),
        "device": device,
        "device_name": device_name,
        "cpu_count": os.cpu_count(),
        "cuda_available": cuda_available,
        "cuda": build.cuda,
        "nsys": shutil.which("nsys"),
    }
