#!/usr/bin/env bash
# The one prepared check for a CUDA machine (an H100/H200 with no network), within 330 s of wall
# time: a device session has 15 minutes in all, its start and a second try included.
#
# Steps run in the order of PLAN below, cheapest and most telling first, each under its own
# limit, cut to what is left of GPU_CHECK_BUDGET (default 330 s) after the kill grace and a reserve
# for the summary, so no step can push the check past its budget. A step that runs out of time is
# interrupted (SIGINT, then killed GRACE seconds later) and keeps what it measured: a run writes
# its JSON mode by mode, a cut sweep keeps its points and draws its PNG from them. A failing step
# is reported and the next one runs. Each step's files are packed into the results the moment it
# ends, so a check cut short from outside still brings back every finished step; whatever else
# happens, the check ends by writing the summary.
#
# Into $RESULTS (default $OUT where that is set, else results/gpu-check), at most 8 files of at most
# 16 MiB each (what a device run can bring back):
#   gpu-check.log      everything printed
#   gpu-summary.json   every figure of every step, read back from the steps' own files
#   raw.tar.gz         those files: runs, sweep, probe, localizer, tensor-parallel run, analysis
#   steps.png          the trace's eager step above its replay; sweep.png the batch sweep;
#   plan.png           the plan's frontier
#   traces.tar.gz      the raw torch.profiler traces, only when they fit
#
#   scripts/gpu_check.sh              on the device machine (python3 with a CUDA torch)
#   scripts/gpu_check.sh --rehearse   every step on this CPU (tiny model, few steps), in a fresh
#                                     virtualenv holding only the device image's packages (or
#                                     REHEARSAL_PYTHON), within GPU_CHECK_BUDGET (default 900 s)
#
# Packages the device image lacks come from .whl/ (scripts/gpu_bundle.sh makes it), unpacked
# into a temporary directory on PYTHONPATH (no pip needed); this checkout is on PYTHONPATH too.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
rehearse=0
[ "${1:-}" = "--rehearse" ] && rehearse=1
results=${RESULTS:-${OUT:-results/gpu-check}}
mkdir -p "$results"
BUDGET=330       # seconds of wall time for the whole check on the GPU
GRACE=3          # seconds between a cut step's SIGINT and its SIGKILL
RESERVE=10       # seconds kept for the summary and the last packing (~3 s)
SETUP=5          # seconds the prerequisites take before the first step: an import of torch
MAX_FILE=$((16 << 20))

# -- the plan: each step's limit in seconds on an H200, and why that many -----------------------
# The limits add up to at most BUDGET - SETUP - RESERVE - GRACE; the packing after each step
# (~1 s, the traces' a few) runs outside them. The rehearsal checks the sum before it runs anything.
declare -A limit
PLAN=(info run-b1 run-qwen3-b1 run-hf compile-b1 cuda-tests probe trace-eager trace-graph analyze
      localize tp1 plan sweep)
limit[info]=5           # no torch: versions from their files, the GPU from the driver (~1 s)
limit[run-b1]=35        # qwen2-0.5b bf16: random weights on the GPU (~3 s), 64 eager steps,
                        # 25 piecewise graphs + 1 full graph captured, lint, HF's step counted:
                        # the first GPU figures, eager against graph (~20 s)
limit[run-qwen3-b1]=20  # qwen3-0.6b eager and graph: the lean step on the second family (~15 s)
limit[run-hf]=14        # transformers' own forward and StaticCache: a tiny mistral (full attention)
                        # made on the spot (~3 s), then eager and graph, 8 steps each, lint and
                        # capture, counted (~8 s)
limit[compile-b1]=55    # torch.compile reduce-overhead: Dynamo + Inductor cold, 24 layers (~45 s)
limit[cuda-tests]=55    # pytest -m cuda: collection imports transformers (~8 s), ~30 small tests,
                        # one torchrun NCCL rank (~15 s), one CUDA trace (~40 s in all)
limit[probe]=12         # 4 rounds of 60 eager/graph steps, 2 profiled sessions of 10 replays (~8 s)
limit[trace-eager]=17   # its own process: load, 4 + 12 profiled steps, 40+40 NVTX on/off (~12 s)
limit[trace-graph]=13   # its own process, so its replays are profiled in a first session (~10 s)
limit[analyze]=10       # both traces read once: ~40 k events (~5 s)
limit[localize]=12      # one probed capture, 3 replays against eager, twice (~8 s)
limit[tp1]=22           # torch.distributed.run, one NCCL rank: capture and teardown with the
                        # communicator live (one rank's all-reduce launches no NCCL kernel)
limit[plan]=20          # qwen2-0.5b for scenarios/plan-traffic.json: 6 sizes measured (each captured
                        # in one pool and alone, eager and replayed steps in 2 rounds), the optimum,
                        # the chosen list captured and 200 sampled steps with the sizes re-timed (~15 s)
limit[sweep]=22         # eager vs graph at batch 1..64, then each point's graphs captured again
                        # and its steps counted, after all timing; a cut sweep keeps its points (~17 s)

planned=0
for name in "${PLAN[@]}"; do planned=$((planned + limit[$name])); done

main() {
work=$(mktemp -d)
raw="$work/raw"
mkdir -p "$raw"
if [ $rehearse = 1 ]; then
  device=cpu model=tiny dtype=float32 steps=8 prompt=16 sweep_args="--max-points 2 --steps 2 --warmup 1 --repeats 1"
  probe_steps=10 overhead=20 budget=${GPU_CHECK_BUDGET:-900} slower=3  # a 2-core CPU takes longer over the real sweep
  py=${REHEARSAL_PYTHON:-$(scripts/rehearsal_venv.sh)} || { echo "gpu_check: FAILED to build the rehearsal virtualenv"; exit 1; }
else
  device=cuda model=qwen2-0.5b dtype=bfloat16 steps=64 prompt=128 sweep_args=""
  probe_steps=60 overhead=40 budget=${GPU_CHECK_BUDGET:-$BUDGET} slower=1
  py=${PYTHON:-python3}
fi
echo "== gpu_check $([ $rehearse = 1 ] && echo "rehearsal on the CPU" || echo "on $device") · $(date -u +%FT%TZ)"
echo "== plan: $(for n in "${PLAN[@]}"; do printf '%s %ss · ' "$n" "${limit[$n]}"; done)${planned}s of ${BUDGET}s; this run's budget ${budget}s"
room=$((BUDGET - SETUP - RESERVE - GRACE))
if [ "$planned" -gt "$room" ]; then
  echo "gpu_check: FAILED: the steps' limits add up to ${planned}s, over the ${room}s they may take"
  exit 1
fi

# -- packages the image lacks, from .whl/ ---------------------------------------------------------
site="$work/site"
missing=()
for module in nvtx msgspec click tabulate safetensors; do
  "$py" -c "import $module" 2>/dev/null || missing+=("$module")
done
if [ ${#missing[@]} != 0 ] && ! "$py" scripts/install_wheels.py .whl "$site" "${missing[@]}"; then
  # every step would be skipped: stop now rather than spend the device's minutes on nothing
  echo "gpu_check: FAILED: ${missing[*]} missing and not in .whl/ (make it with scripts/gpu_bundle.sh and carry .whl/ to this machine)"
  exit 1
fi
# transformers older than setup.cfg's hf floor (the image's 5.17 names the cache past_key_values):
# the one in .whl/ instead; without one only run-hf is skipped (the prerequisites say so)
"$py" scripts/gpu_prereqs.py --meets-floor transformers || "$py" scripts/install_wheels.py .whl "$site" transformers
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# -- prerequisites: one line each; a missing one skips its steps ----------------------------------
"$py" scripts/gpu_prereqs.py --device "$device" "$work/have.sh" || { echo "gpu_check: FAILED (prerequisites)"; exit 1; }
# shellcheck disable=SC1091
. "$work/have.sh"

status=0
declare -A outcome
touch -d @0 "$work/packed"  # older than any trace
# whatever stops the check from here on, it ends with the summary and the files to bring back
trap 'finish' EXIT
step() {  # step NAME HAVE COMMAND...: run COMMAND under NAME's planned limit, within the budget
  # what is left once the summary's reserve and a cut step's kill grace are set aside
  local name=$1 have=$2 left=$((budget - SECONDS - RESERVE - GRACE)) run_limit
  run_limit=$((limit[$name] * slower))
  shift 2
  [ "$left" -lt "$run_limit" ] && run_limit=$left
  if [ "$run_limit" -lt 5 ]; then
    echo "== $name: skipped (under 5 s of the ${budget}s budget left beside the summary's reserve)"; outcome[$name]="skipped: no time"
    status=1; return
  fi
  if [ "$have" != 1 ]; then
    echo "== $name: skipped (prerequisite missing, above)"; outcome[$name]=skipped
    [ $rehearse = 1 ] && status=1  # the rehearsal has every prerequisite, or the bundle lacks one
    return
  fi
  echo "== $name (limit ${run_limit}s)"
  local start=$SECONDS rc=0
  timeout --signal=INT --kill-after="$GRACE" "$run_limit" "$@" || rc=$?
  if [ $rc = 0 ]; then outcome[$name]="ok $((SECONDS - start))s"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then outcome[$name]="TIMEOUT ${run_limit}s"; status=1
  else outcome[$name]="FAILED rc=$rc $((SECONDS - start))s"; status=1
  fi
  pack  # before the outcome's line: once it is printed, the step's files are in the results
  echo "== $name: ${outcome[$name]}"
}
pack() {  # the steps' files so far into the results, each archive written under a temporary name
  cp "$work"/sweep/*.json "$raw/sweep.json" 2>/dev/null
  [ "$have_plot" = 1 ] && cp "$work"/sweep/*.png "$results/sweep.png" 2>/dev/null
  tar -czf "$results/.raw.tar.gz" -C "$raw" . && mv "$results/.raw.tar.gz" "$results/raw.tar.gz"
  # the traces only when a step has written some since they were last packed
  [ -d "$work/traces" ] && [ -n "$(find "$work/traces" -newer "$work/packed" -print -quit)" ] || return 0
  touch "$work/packed"
  tar -czf "$results/.traces.tar.gz" -C "$work/traces" .
  local size
  size=$(stat -c %s "$results/.traces.tar.gz")
  if [ "$size" -le $MAX_FILE ]; then mv "$results/.traces.tar.gz" "$results/traces.tar.gz"
  else
    rm -f "$results/.traces.tar.gz" "$results/traces.tar.gz"
    echo "== traces.tar.gz left out: $((size >> 20)) MiB, over the 16 MiB a result file may be"
  fi
}
finish() {
  trap - EXIT
  for name in "${PLAN[@]}"; do echo "$name=${limit[$name]}|${outcome[$name]:-not run}"; done >"$work/outcomes.txt"
  "$py" scripts/gpu_summary.py "$results" "$work" || status=1
  pack
  local files
  files=$(find "$results" -maxdepth 1 -type f | wc -l)
  if [ "$files" -gt 8 ] || find "$results" -maxdepth 1 -type f -size +16M | grep -q .; then
    echo "== results: $files files, some over 8 files or 16 MiB: not all can come back"; status=1
  fi
  echo "== results: $(cd "$results" && ls -s --block-size=K | tail -n +2 | tr -s ' \n' ' ')"
  echo "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in ${SECONDS}s"
  rm -rf "$work"
  exit $status
}
graphrt=("$py" -m graphrt)
common=(--device "$device" --dtype "$dtype" --prompt-len "$prompt" --steps "$steps")
second_model=$([ $rehearse = 1 ] && echo tiny || echo qwen3-0.6b)  # the rehearsal's CPU keeps to tiny

step info "$have_graphrt" "${graphrt[@]}" info
step run-b1 "$have_graphrt" "${graphrt[@]}" run --model "$model" "${common[@]}" --batch 1 \
  --mode eager,piecewise,graph --json "$raw/run-b1.json"
step run-qwen3-b1 "$have_graphrt" "${graphrt[@]}" run --model "$second_model" "${common[@]}" --batch 1 \
  --mode eager,graph --json "$raw/run-qwen3-b1.json"
# a tiny seeded mistral made here (no download), then eager against piecewise (graphs between its
# attention modules, graphs/segments.py) and graph on transformers' forward
step run-hf "$have_hf" bash -c '"$1" scripts/hf_checkpoint.py mistral "$2" >/dev/null && shift 2 && exec "$@"' _ \
  "$py" "$work/mistral" "${graphrt[@]}" run --model "$work/mistral" --device "$device" --dtype "$dtype" \
  --batch 2 --prompt-len 8 --steps 8 --mode eager,piecewise,graph --json "$raw/run-hf.json"
step compile-b1 "$have_compile" "${graphrt[@]}" run --model "$model" "${common[@]}" --batch 1 \
  --mode compile --json "$raw/compile-b1.json"
step cuda-tests "$have_tests" "$py" -m pytest -q -m cuda -p no:cacheprovider \
  --junitxml="$raw/cuda-tests.xml" tests
step probe "$have_graphrt" "$py" scripts/gpu_probe.py --model "$model" --device "$device" \
  --dtype "$dtype" --steps "$probe_steps" --out "$raw/probe.json"
# one mode per process: each records its steps in that process's first profiler session
trace=("${graphrt[@]}" trace --model "$model" "${common[@]}" --steps 16 --warmup 4 --batch 1
       --profiler torch --no-lint --out "$work/traces")  # the runs above lint
step trace-eager "$have_graphrt" "${trace[@]}" --mode eager --overhead "$overhead"
step trace-graph "$have_graphrt" "${trace[@]}" --mode graph
mapfile -t traced < <(ls -d "$work"/traces/*/ 2>/dev/null)
if [ ${#traced[@]} -gt 0 ]; then
  plot=()
  [ "$have_plot" = 1 ] && plot=(--plot "$results/steps.png")
  step analyze "$have_graphrt" "${graphrt[@]}" analyze "${traced[@]}" --json "$raw/analysis.json" "${plot[@]}"
  for dir in "${traced[@]}"; do cp "$dir/summary.json" "$raw/trace-$(basename "$dir").json" 2>/dev/null; done
fi
step localize "$have_graphrt" "$py" scripts/gpu_localize.py --model "$model" --device "$device" \
  --dtype "$dtype" --out "$raw/localize.json"
step tp1 "$have_graphrt" "$py" -m torch.distributed.run --nproc-per-node 1 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 -m graphrt run \
  --model "$model" "${common[@]}" --batch 1 --tp 1 --mode eager,graph --json "$raw/tp1.json"
echo "== tp: more than one rank needs one GPU per rank; this machine has one"
plan_plot=()
[ "$have_plot" = 1 ] && plan_plot=(--plot "$results/plan.png")
step plan "$have_graphrt" "${graphrt[@]}" plan --model "$model" --device "$device" --dtype "$dtype" \
  --traffic scenarios/plan-traffic.json --max-graphs 4 --grid 1,2,4,8,12,16 --steps 16 --warmup 4 \
  --prompt-len "$prompt" --verify-steps 200 --json "$raw/plan.json" "${plan_plot[@]}"
# shellcheck disable=SC2086
step sweep "$have_graphrt" "${graphrt[@]}" bench scenarios/gpu_check.toml --out "$work/sweep" $sweep_args
}

main 2>&1 | tee "$results/gpu-check.log"
exit "${PIPESTATUS[0]}"
