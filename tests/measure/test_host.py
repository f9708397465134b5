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
