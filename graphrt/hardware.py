"""What the machine is: device, versions, and (for the roofline) the device's peaks."""

from __future__ import annotations

import os
import platform
import shutil
from importlib.metadata import version

import torch

import graphrt


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux names the CPU model here; platform.processor() is often empty
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device) -> dict:
    """Facts that make a result comparable with another machine's."""
    facts = {
        "graphrt": graphrt.__version__,
        "torch": torch.__version__,
        "nvtx": version("nvtx"),
        "python": platform.python_version(),
        "device": device.type,
        "device_name": device_name(device),
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "nsys": shutil.which("nsys"),
    }
    if device.type == "cpu":
        facts["torch_threads"] = torch.get_num_threads()
    return facts
