"""What the device check can run with this python: one line per prerequisite, and a shell file.

usage: python scripts/gpu_prereqs.py --device cuda|cpu SHELL_FILE
       python scripts/gpu_prereqs.py --meets-floor transformers

Each line says what is there, or what is missing and which steps of the check are skipped for it.
SHELL_FILE gets `have_graphrt=1`, `have_tests=0`, ... for scripts/gpu_check.sh to source. Exit 1
only when nothing graphrt can run (no torch, or no CUDA device where one was asked for), after
naming every other missing prerequisite too, so one look at the machine finds them all.
`--meets-floor` prints nothing and exits 0 when the package is there and no older than setup.cfg
states, 1 otherwise: the check then takes it from .whl/.
"""

from __future__ import annotations

import configparser
import importlib
import importlib.metadata
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout, installed or not
from graphrt.backends.toolchain import missing_for_compile  # noqa: E402 (torch-free)

# importable name -> what a missing one stops
STEPS = {
    "graphrt": "every graphrt step",
    "tests": "the CUDA tests",
    "compile": "the compile step",
    "plot": "the sweep's PNG",
    "hf": "the transformers-backed model's run",
}
NEEDS = {
    "graphrt": ("nvtx", "msgspec", "click", "tabulate", "safetensors"),
    "tests": ("pytest", "hypothesis"),
    "plot": ("matplotlib",),
    "hf": ("transformers",),
}


def _version(module: str) -> str | None:
    """The installed version of an importable module (its distribution has the same name), or
    None when it cannot be imported."""
    try:
        importlib.import_module(module)
    except Exception:  # an ImportError, or a package that fails as it loads
        return None
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def _floor(package: str, section: str, key: str, setup_cfg: Path) -> tuple[int, ...]:
    """The oldest `package` a setup.cfg requirement list admits (`torch>=2.5` -> (2, 5))."""
    config = configparser.ConfigParser()
    config.read(setup_cfg)
    (floor,) = re.findall(rf"^{package}>=([\d.]+)$", config[section][key], re.M)
    return tuple(int(part) for part in floor.split("."))


def torch_floor(setup_cfg: Path = REPO / "setup.cfg") -> tuple[int, ...]:
    """The oldest torch graphrt runs on, as setup.cfg's requirement states it (`torch>=2.5`)."""
    return _floor("torch", "options", "install_requires", setup_cfg)


def transformers_floor(setup_cfg: Path = REPO / "setup.cfg") -> tuple[int, ...]:
    """The oldest transformers whose forward graphrt runs, as setup.cfg's `hf` extra states it."""
    return _floor("transformers", "options.extras_require", "hf", setup_cfg)


# a package held to a floor of setup.cfg's beside torch's -> that floor
FLOORS = {"transformers": transformers_floor}


def _below(module: str, version: str | None) -> str | None:
    """`module >= floor` when `version` is older than its floor in setup.cfg, else None."""
    if module not in FLOORS or version is None:
        return None
    floor = FLOORS[module]()
    return f"{module} >= {'.'.join(map(str, floor))}" if _release(version) < floor else None


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: "2.11.0+cu130" -> (2, 11, 0)."""
    return tuple(int(part) for part in re.match(r"\d+(\.\d+)*", version).group().split("."))


def _torch(device: str) -> str | None:
    """One line on torch and the device it runs on; None when nothing graphrt can run. The
    checkout is on PYTHONPATH, not installed: pip never checked torch against graphrt's floor,
    so it is checked here."""
    torch_version = _version("torch")
    if torch_version is None:
        print("prereq: MISSING torch: nothing can run")
        return None
    floor = torch_floor()
    if _release(torch_version) < floor:
        print(f"prereq: MISSING torch >= {'.'.join(map(str, floor))} (this is torch {torch_version}, "
              "older than graphrt runs on): nothing can run")
        return None
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print(f"prereq: MISSING a CUDA device: torch {torch_version} sees none; nothing can run")
        return None
    where = torch.cuda.get_device_name() if device == "cuda" else "the CPU (rehearsal)"
    print(f"prereq: ok torch {torch_version} (CUDA {torch.version.cuda}) on {where}")
    return torch_version


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--meets-floor" and argv[1] in FLOORS:
        version = _version(argv[1])
        return 0 if version is not None and _below(argv[1], version) is None else 1
    if len(argv) != 3 or argv[0] != "--device" or argv[1] not in ("cuda", "cpu"):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    device, shell_file = argv[1], Path(argv[2])
    runnable = _torch(device) is not None  # and whatever else is missing is named all the same
    have: dict[str, bool] = {}
    for step, modules in NEEDS.items():
        versions = {m: _version(m) for m in modules}
        missing = [m for m, v in versions.items() if v is None]
        old = [f"{wanted} (this is {v})" for m, v in versions.items() if (wanted := _below(m, v))]
        have[step] = not missing and not old
        if missing or old:
            print(f"prereq: MISSING {', '.join(missing + old)}: skipping {STEPS[step]}")
        else:
            print(f"prereq: ok {', '.join(f'{m} {v}' for m, v in versions.items())}")
    lacking = missing_for_compile(device)
    have["compile"] = have["graphrt"] and not lacking
    print(f"prereq: MISSING {', '.join(lacking)}: skipping {STEPS['compile']}" if lacking
          else "prereq: ok compile toolchain")
    if not runnable:
        return 1
    have["tests"] = have["tests"] and have["graphrt"]
    have["hf"] = have["hf"] and have["graphrt"]
    shell_file.write_text("".join(f"have_{step}={int(ok)}\n" for step, ok in have.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
