"""Unpack wheels from a folder into a target directory for this interpreter, without pip.

usage: python scripts/install_wheels.py WHEEL_DIR TARGET NAME [NAME ...]

The device machine has no network and maybe no pip; a wheel is a zip archive whose contents go
on sys.path as they are, so unpacking the one that fits this interpreter (its CPython tag, abi3
or pure Python, and this machine's platform) is an install. One line per name; exit 1 if a name
has no wheel that fits.
"""

from __future__ import annotations

import platform
import sys
import zipfile
from pathlib import Path


def fits(wheel: Path) -> bool:
    """Does `wheel` (name-version-python-abi-platform.whl) run on this interpreter and machine?"""
    *_, python, abi, plat = wheel.stem.split("-")
    minor = sys.version_info.minor
    here = f"cp3{minor}"
    if plat != "any" and not (plat.endswith(platform.machine()) and sys.platform.startswith("linux")):
        return False
    if abi == "abi3":  # the stable ABI: built for cp3X, runs on 3.X and later
        return python.startswith("cp3") and int(python[3:]) <= minor
    return here in python.split(".") or (abi == "none" and python.startswith("py3"))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    wheel_dir, target, names = Path(argv[0]), Path(argv[1]), argv[2:]
    failed = 0
    for name in names:
        candidates = sorted(w for w in wheel_dir.glob(f"{name}-*.whl") if fits(w))
        if not candidates:
            print(f"no wheel of {name} in {wheel_dir}/ fits Python {platform.python_version()} "
                  f"on {platform.machine()}: run scripts/gpu_bundle.sh")
            failed = 1
            continue
        with zipfile.ZipFile(candidates[-1]) as archive:
            archive.extractall(target)
        print(f"installed {candidates[-1].name} from {wheel_dir}/")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
