#!/usr/bin/env bash
# The one prepared check for a CUDA machine, under 5 minutes on an H100/H200:
#   1. the CUDA-marked tests (CUDA Graph replay against eager, one pool across buckets),
#   2. `graphrt run --mode all` for qwen2-0.5b in bfloat16 at batch 1 and 8,
#   3. a torch.profiler trace of eager and graph steps, read back by `graphrt analyze`.
# It uses the python that holds a CUDA build of torch (PYTHON, default python3) and graphrt
# from this checkout. Results land in $RESULTS (default: results/).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
results=${RESULTS:-results}
mkdir -p "$results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$py" - <<'PY' || exit 1
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: this python's torch {torch.__version__} sees no CUDA device")
for module in ("nvtx", "click", "tabulate", "safetensors"):
    try:
        __import__(module)
    except ImportError:
        sys.exit(f"gpu_check: python package {module!r} is missing: pip install -e . first")
print(f"torch {torch.__version__} · CUDA {torch.version.cuda} · {torch.cuda.get_device_name()}")
PY

status=0
echo "== graphrt info"
"$py" -m graphrt info || status=1
echo "== CUDA tests"
timeout 150 "$py" -m pytest -q -m cuda -p no:cacheprovider tests || status=1
for batch in 1 8; do
  echo "== graphrt run --mode all --batch $batch (qwen2-0.5b, bfloat16)"
  timeout 60 "$py" -m graphrt run --model qwen2-0.5b --dtype bfloat16 --batch "$batch" \
    --mode all --steps 64 --prompt-len 128 --json "$results/gpu-check-b$batch.json" || status=1
done
echo "== graphrt trace --mode both --profiler torch (qwen2-0.5b, bfloat16, batch 1)"
timeout 90 "$py" -m graphrt trace --model qwen2-0.5b --dtype bfloat16 --mode both \
  --profiler torch --out "$results/traces" || status=1
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
