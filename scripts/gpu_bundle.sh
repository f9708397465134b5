#!/usr/bin/env bash
# Downloads, on a machine that reaches the package registry, the wheels scripts/gpu_check.sh installs
# on a device machine that has no network: into .whl/ (git-ignored), for the device's Python 3.12
# on x86-64 and for this machine's python (the rehearsal). Idempotent; a few MB.
#
#   scripts/gpu_bundle.sh          then hand .whl/ to the device run (see docs/device-check.md)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
dest=.whl
# What the device image lacks (nvtx, msgspec; transformers at graphrt's pin, its own 5.17 being older
# than setup.cfg's hf floor), and the rest of graphrt's core in case an image lacks it.
packages=(nvtx msgspec click tabulate safetensors transformers)
pins=()
for p in "${packages[@]}"; do pins+=("$(grep -E "^$p==" constraints.txt || echo "$p")"); done
mkdir -p "$dest"
download() { "$py" -m pip download -q --no-deps --only-binary=:all: -d "$dest" "$@" "${pins[@]}"; }
download --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any
download  # this machine's interpreter, for `scripts/gpu_check.sh --rehearse`
ls "$dest"
