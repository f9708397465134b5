"""What this machine and its packages are, told without importing torch (which takes a second):
`graphrt info` and every command's --help start at once (docs/design.md, "Start-up")."""

from __future__ import annotations

import ctypes
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


@dataclass(frozen=True)
class CudaDriver:
    version: tuple[int, int]  # the CUDA version the driver supports, e.g. (13, 0)
    devices: tuple[str, ...]  # the names of the devices it shows this process (CUDA_VISIBLE_DEVICES)


def cuda_driver(library: str = "libcuda.so.1") -> CudaDriver | None:
    """The CUDA driver and its devices, asked of the driver's own library (tens of MB, where
    importing a CUDA torch maps gigabytes); None where there is no driver or it fails to start."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return None
    number, count = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) or cuda.cuDriverGetVersion(ctypes.byref(number)) or \
            cuda.cuDeviceGetCount(ctypes.byref(count)):
        return None
    names = []
    for ordinal in range(count.value):
        device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) or cuda.cuDeviceGetName(name, len(name), device):
            return None
        names.append(name.value.decode(errors="replace"))
    return CudaDriver((number.value // 1000, number.value % 1000 // 10), tuple(names))


def cuda_usable(build: TorchBuild, driver: CudaDriver | None) -> bool:
    """Whether torch would see a GPU: a CUDA build, a device, and a driver of at least the
    build's major CUDA version (a newer minor runs on an older driver of the same major)."""
    if build.cuda is None or driver is None or not driver.devices:
        return False
    return driver.version[0] >= int(build.cuda.split(".")[0])


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
