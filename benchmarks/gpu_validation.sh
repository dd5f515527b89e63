#!/usr/bin/env bash
# Validation on a CUDA machine, step by step, each step with its own time limit and its whole
# output in a file under $OUT (default /tmp/kj-out), so that a step cut short loses nothing
# already written. Steps (pick with STEPS="latency gpu_tier ..."; default: all, in this order):
#   builds      every CUDA example and GPU adversarial candidate, in the background
#   latency     benchmarks/verdict_latency.py (cold builds first, on a quiet machine)
#   gpu_tier    pytest -m gpu tests/gpu (examples, recovery after faults)
#   env_tier    pytest -m gpu tests/env tests/agent, then the 002 transcript replayed
#   adversarial tests/adversarial/run_suite.py --gpu --no-cpu
#   problems    benchmarks/reference_times.py and `problems lint -s public` on the GPU
#   usage: bash benchmarks/gpu_validation.sh
set -u
OUT=${OUT:-/tmp/kj-out}
STEPS=${STEPS:-"builds latency gpu_tier env_tier adversarial problems"}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
export KERNELJUDGE_CACHE_DIR=/tmp/kj-cache KERNELJUDGE_TEST_CACHE=/tmp/kj-cache
LAST=$(( $(nproc) - 1 ))
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $1 ($(date -u +%T))"; }

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
    > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if want builds; then
    step "builds (background, off the timing core $LAST)"
    ( ls examples/*/cuda_*.py examples/causal_gqa/seed002_submission.py \
        tests/adversarial/gpu/*.py \
        | xargs -P 10 -I{} taskset -c 0-$((LAST - 1)) timeout 300 python3 -m kerneljudge build {} \
        > "$OUT/builds.txt" 2>&1 ) &
    BUILDS=$!
fi
if want latency; then
    step latency
    timeout 330 python3 benchmarks/verdict_latency.py --baselines eager --parallel-cold \
        --json "$OUT/latency.json" > "$OUT/latency.txt" 2>&1
    tail -6 "$OUT/latency.txt"
fi
if want builds; then wait "$BUILDS"; grep -c "^built" "$OUT/builds.txt"; fi
if want gpu_tier; then
    step gpu_tier
    timeout 240 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -rA \
        > "$OUT/pytest_gpu.txt" 2>&1
    grep -E "passed|failed|FAILED|candidate median" "$OUT/pytest_gpu.txt" | tail -25
fi
if want env_tier; then
    step env_tier
    timeout 200 python3 -m pytest -q -m gpu tests/env tests/agent -p no:cacheprovider -rA \
        --continue-on-collection-errors > "$OUT/pytest_env.txt" 2>&1
    tail -5 "$OUT/pytest_env.txt"
    timeout 150 python3 -m kerneljudge episode \
        --replay examples/transcripts/causal_gqa_seed002.jsonl --baselines eager \
        --out "$OUT/replay" --json > "$OUT/replay_summary.json" 2>&1
    tail -c 800 "$OUT/replay_summary.json"
fi
if want adversarial; then
    step adversarial
    timeout 200 python3 tests/adversarial/run_suite.py --gpu --no-cpu --cache-dir /tmp/kj-cache \
        --json "$OUT/adversarial.json" > "$OUT/adversarial.txt" 2>&1
    tail -20 "$OUT/adversarial.txt"
fi
if want problems; then
    step problems
    timeout 400 python3 benchmarks/reference_times.py --json "$OUT/reference_times.json" \
        > "$OUT/reference_times.txt" 2>&1
    tail -30 "$OUT/reference_times.txt"
    timeout 300 python3 -m kerneljudge problems lint -s public --device cuda \
        > "$OUT/lint_public.txt" 2>&1
    tail -5 "$OUT/lint_public.txt"
fi
