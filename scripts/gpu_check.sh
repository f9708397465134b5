#!/usr/bin/env bash
# The one prepared check for a CUDA machine (an H100/H200 with no network), within a 240 s budget:
#   prerequisites · graphrt info · the CUDA tests · qwen2-0.5b bf16 eager, piecewise and full graphs
#   at batch 1 and 8
#   · a batch sweep 1..64 with its PNG · compile (reduce-overhead) at batch 1 · a torch.profiler
#   trace of eager and graph with NVTX on vs off, per-module attribution of the replay and a picture
#   of one step · what a replay launches besides its graph and
#   what a profiler session costs later steps · one summary table and gpu-summary.json.
# Each step has its own time limit (cut to what is left of GPU_CHECK_BUDGET, default 240 s) and
# writes its results the moment it ends, into at most 8 files under $RESULTS (default
# results/gpu-check); a failing step is reported and the next one runs.
#
#   scripts/gpu_check.sh              on the device machine (python3 with a CUDA torch)
#   scripts/gpu_check.sh --rehearse   every step on this CPU (tiny model, few steps), in a fresh
#                                     virtualenv holding only the device image's packages
#
# Packages the device image lacks come from .whl/ (scripts/gpu_bundle.sh makes it), unpacked
# into a temporary directory on PYTHONPATH (no pip needed); this checkout is on PYTHONPATH too.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
results=${RESULTS:-results/gpu-check}
mkdir -p "$results"

main() {
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $rehearse = 1 ]; then
  device=cpu model=tiny dtype=float32 steps=8 prompt=16 sweep_args="--max-points 2 --steps 2 --warmup 1 --repeats 1"
  probe_steps=20 overhead=40 budget=900 slower=3  # a 2-core CPU takes longer over the real sweep
  py=$(scripts/rehearsal_venv.sh) || { echo "gpu_check: FAILED to build the rehearsal virtualenv"; exit 1; }
else
  device=cuda model=qwen2-0.5b dtype=bfloat16 steps=64 prompt=128 sweep_args=""
  probe_steps=200 overhead=200 budget=${GPU_CHECK_BUDGET:-240} slower=1
  py=${PYTHON:-python3}
fi
echo "== gpu_check $([ $rehearse = 1 ] && echo "rehearsal on the CPU" || echo "on $device") · $(date -u +%FT%TZ)"

# -- packages the image lacks, from .whl/ ---------------------------------------------------------
site="$work/site"
missing=()
for module in nvtx click tabulate safetensors; do
  "$py" -c "import $module" 2>/dev/null || missing+=("$module")
done
[ ${#missing[@]} = 0 ] || "$py" scripts/install_wheels.py .whl "$site" "${missing[@]}"
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# -- prerequisites: one line each; a missing one skips its steps ----------------------------------
"$py" scripts/gpu_prereqs.py --device "$device" "$work/have.sh" || { echo "gpu_check: FAILED (prerequisites)"; exit 1; }
# shellcheck disable=SC1091
. "$work/have.sh"

status=0
declare -A outcome
order=()
step() {  # step NAME SECONDS HAVE COMMAND...: run COMMAND under its own limit, within the budget
  local name=$1 limit=$(($2 * slower)) have=$3 left=$((budget - SECONDS))
  shift 3
  order+=("$name")
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "== $name: skipped (the check's ${budget}s budget is spent)"; outcome[$name]="skipped: no time"
    status=1; return
  fi
  if [ "$have" != 1 ]; then
    echo "== $name: skipped (prerequisite missing, above)"; outcome[$name]=skipped
    [ $rehearse = 1 ] && status=1  # the rehearsal has every prerequisite, or the bundle lacks one
    return
  fi
  echo "== $name (limit ${limit}s)"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  if [ $rc = 0 ]; then outcome[$name]="ok $((SECONDS - start))s"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then outcome[$name]="TIMEOUT ${limit}s"; status=1
  else outcome[$name]="FAILED rc=$rc"; status=1
  fi
  echo "== $name: ${outcome[$name]}"
}
graphrt=("$py" -m graphrt)
common=(--model "$model" --device "$device" --dtype "$dtype" --prompt-len "$prompt" --steps "$steps")

# most telling first: if the budget runs out, what is left undone matters least
step info 20 "$have_graphrt" "${graphrt[@]}" info
step cuda-tests 120 "$have_tests" "$py" -m pytest -q -m cuda -p no:cacheprovider \
  --junitxml="$work/cuda-tests.xml" tests
for batch in 1 8; do
  step "run-b$batch" 75 "$have_graphrt" "${graphrt[@]}" run "${common[@]}" --batch "$batch" \
    --mode eager,piecewise,graph --json "$results/run-b$batch.json"
done
step trace 45 "$have_graphrt" "${graphrt[@]}" trace "${common[@]}" --batch 1 --mode both \
  --profiler torch --overhead "$overhead" --no-lint --out "$work/traces"  # the runs lint
trace_dir=$(ls -d "$work"/traces/*/ 2>/dev/null | head -n 1)
if [ -n "$trace_dir" ]; then
  plot=()
  [ "$have_plot" = 1 ] && plot=(--plot "$trace_dir/steps.png")
  step analyze 20 "$have_graphrt" "${graphrt[@]}" analyze "$trace_dir" --json "$trace_dir/analysis.json" "${plot[@]}"
  tar -czf "$results/traces.tar.gz" -C "$work/traces" .
fi
step probe 45 "$have_graphrt" "$py" scripts/gpu_probe.py --model "$model" --device "$device" \
  --dtype "$dtype" --steps "$probe_steps" --out "$work/probe.json"
# shellcheck disable=SC2086
step sweep 60 "$have_graphrt" "${graphrt[@]}" bench scenarios/gpu_check.toml --out "$work/sweep" $sweep_args
cp "$work"/sweep/*.json "$results/sweep.json" 2>/dev/null
[ "$have_plot" = 1 ] && cp "$work"/sweep/*.png "$results/sweep.png" 2>/dev/null
step compile-b1 90 "$have_compile" "${graphrt[@]}" run "${common[@]}" --batch 1 --mode compile \
  --json "$results/compile-b1.json"

# -- one table and gpu-summary.json ---------------------------------------------------------------
for name in "${order[@]}"; do echo "$name=${outcome[$name]}"; done >"$work/outcomes.txt"
"$py" scripts/gpu_summary.py "$results" "$work" || status=1
echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED)"
return $status
}

main 2>&1 | tee "$results/gpu-check.log"
exit "${PIPESTATUS[0]}"
