"""What `torch.compile` needs on this machine besides torch, told without importing torch.

Inductor writes C++ on the CPU and Triton on CUDA; either way its generated code is built here:
the CPU's kernels with a C++ compiler, each loaded through Python bindings built against
`Python.h`; Triton's launchers with a C compiler and the same header. The compile mode refuses
to start without them (graphrt.backends.compiled), the device check skips its compile step
(scripts/gpu_prereqs.py), and the tests that compile are skipped with the reason
(tests/conftest.py): one rule for all three.
"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
from collections.abc import Iterable
from pathlib import Path

# the compilers each device's generated code is built with, any one of them on PATH
COMPILERS = {"cpu": ("C++", ("g++", "c++", "clang++")), "cuda": ("C", ("cc", "gcc", "clang"))}


def missing_for_compile(device_type: str, also: Iterable[str] = ()) -> list[str]:
    """What `torch.compile` of a step lacks on `device_type` ("cpu" or "cuda"), each as a
    phrase ("a C++ compiler (g++, c++ or clang++) on PATH", "Python.h (python3-dev)", "Triton
    (pip install triton)"); empty when nothing is. `also`: other compiler names that would do
    (Inductor's configured one)."""
    missing = []
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        missing.append("Triton (pip install triton)")
    language, names = COMPILERS["cuda" if device_type == "cuda" else "cpu"]
    if not any(shutil.which(name) for name in (*also, *names) if name):
        missing.append(f"a {language} compiler ({', '.join(names[:-1])} or {names[-1]}) on PATH")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        missing.append("Python.h (python3-dev)")
    return missing
