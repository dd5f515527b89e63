#!/usr/bin/env bash
# Validation on a CUDA machine, in one go: verdict latency (cold and warm), builds of every CUDA
# example and GPU adversarial candidate, the GPU test tiers (judge, environment), the adversarial
# suite and the verdict of the 002 agent's submission. Output is also written under $OUT.
#   usage: bash benchmarks/gpu_validation.sh
set -u
OUT=${OUT:-/tmp/kj-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
export KERNELJUDGE_CACHE_DIR=/tmp/kj-cache KERNELJUDGE_TEST_CACHE=/tmp/kj-cache
LAST=$(( $(nproc) - 1 ))
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
    | tee "$OUT/machine.txt"
echo "== builds (background, off the timing core $LAST)"
( ls examples/*/cuda_*.py examples/causal_gqa/seed002_submission.py tests/adversarial/gpu/*.py \
    | xargs -P 10 -I{} taskset -c 0-$((LAST - 1)) timeout 300 python3 -m kerneljudge build {} \
    > "$OUT/builds.txt" 2>&1 ) &
BUILDS=$!
echo "== verdict latency"
timeout 330 python3 benchmarks/verdict_latency.py --baselines eager --parallel-cold \
    --json "$OUT/latency.json" 2>&1 | tail -6 | tee "$OUT/latency.txt"
wait $BUILDS
grep -c "^built" "$OUT/builds.txt"
echo "== GPU test tiers"
timeout 200 python3 -m pytest -q -m gpu tests/gpu tests/env tests/agent -p no:cacheprovider --continue-on-collection-errors \
    -rA 2>&1 | grep -E "passed|failed|FAILED|PASSED|Error|assert|candidate median" \
    | tail -40 | tee "$OUT/pytest_gpu.txt"
echo "== adversarial suite (GPU)"
timeout 100 python3 tests/adversarial/run_suite.py --gpu --no-cpu --cache-dir /tmp/kj-cache --json "$OUT/adversarial.json" 2>&1 \
    | tail -70 > "$OUT/adversarial.txt"; tail -30 "$OUT/adversarial.txt"
echo "== 002 submission, replayed through the agent environment"
timeout 90 python3 -m kerneljudge episode --replay examples/transcripts/causal_gqa_seed002.jsonl \
    --out "$OUT/replay" --baselines eager --json > "$OUT/replay_summary.json" 2>&1
tail -c 800 "$OUT/replay_summary.json"
