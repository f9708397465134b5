#!/usr/bin/env bash
# Builds (once) the virtualenv the rehearsal of scripts/gpu_check.sh runs in: only the packages
# of scripts/device-image.txt, as on the device machine. Prints its python; progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.rehearse/venv
stamp="$venv/.image-$(sha256sum scripts/device-image.txt | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  rm -rf "$venv"
  echo "rehearsal: building $venv from scripts/device-image.txt" >&2
  "${PYTHON:-python3}" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q -r scripts/device-image.txt >&2
  touch "$stamp"
fi
echo "$PWD/$venv/bin/python"
