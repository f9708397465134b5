"""What graphrt says of the machine without importing torch is what the packages and the system
say of themselves."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from graphrt.errors import GraphrtError
from graphrt.measure import host


def test_the_facts_are_the_installed_packages_versions_and_this_machines():
    facts = host.describe("cpu", "a CPU", cuda_available=False)
    assert facts == {"graphrt": version("graphrt"), "torch": str(torch.__version__), "nvtx": version("nvtx"),
                     "python": platform.python_version(), "device": "cpu", "device_name": "a CPU",
                     "cpu_count": os.cpu_count(), "cuda_available": False, "cuda": torch.version.cuda,
                     "nsys": shutil.which("nsys")}


def _cpuinfo_names_a_model() -> bool:
    try:
        return "model name" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.processes
@pytest.mark.skipif(shutil.which("lscpu") is None or not _cpuinfo_names_a_model(),
                    reason="needs lscpu and a Linux /proc/cpuinfo that names the CPU model")
def test_the_cpu_is_named_as_lscpu_names_it():
    said = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
    model = next(line.split(":", 1)[1].strip() for line in said.splitlines() if line.startswith("Model name:"))
    assert host.cpu_name() == model


def test_without_torch_installed_the_facts_say_so_in_one_line(monkeypatch):
    monkeypatch.setattr(host.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GraphrtError, match=r"^torch is not installed: pip install torch$"):
        host.torch_build()


def test_meminfo_figures_are_read_in_bytes_and_a_missing_one_is_none(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:         1024 kB\nMemAvailable:   20480000 kB\n")
    assert host.meminfo("MemTotal", str(meminfo)) == 24576000 * 1024
    assert host.meminfo("MemAvailable", str(meminfo)) == 20480000 * 1024
    assert host.meminfo("HugePages_Total", str(meminfo)) is None
    assert host.meminfo("MemTotal", str(tmp_path / "absent")) is None


@pytest.mark.parametrize("build_cuda, driver, usable", [
    ("13.0", host.CudaDriver((13, 0), ("NVIDIA H100 80GB HBM3",)), True),
    ("12.8", host.CudaDriver((13, 1), ("NVIDIA H100 80GB HBM3",)), True),  # a newer driver runs an older build
    ("13.0", host.CudaDriver((12, 9), ("NVIDIA H100 80GB HBM3",)), False),  # too old a driver for the build
    ("13.0", host.CudaDriver((13, 0), ()), False),  # a driver that shows this process no device
    ("13.0", None, False),  # no driver
    (None, host.CudaDriver((13, 0), ("NVIDIA H100 80GB HBM3",)), False),  # a CPU-only torch
])
def test_torch_sees_a_gpu_where_its_build_has_cuda_and_the_driver_shows_a_device_and_is_new_enough(
        build_cuda, driver, usable):
    assert host.cuda_usable(host.TorchBuild("2.13.0", build_cuda), driver) is usable


def test_a_machine_without_the_cuda_driver_library_has_no_driver():
    assert host.cuda_driver("libcuda-that-is-not-here.so.1") is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_driver_names_the_device_torch_names():
    driver = host.cuda_driver()
    assert driver is not None and host.cuda_usable(host.torch_build(), driver)
    assert driver.devices[0] == torch.cuda.get_device_name(0)
    assert len(driver.devices) == torch.cuda.device_count()
