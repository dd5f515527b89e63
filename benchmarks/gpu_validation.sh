#!/usr/bin/env bash
# Judge validation on a CUDA machine, in one go: verdict latency (cold builds first, on a quiet
# machine), builds of every CUDA example, the GPU test tier, and the verdict of the 002 agent's
# submission. Everything it prints is also written under $OUT (default /tmp/kj-out).
#   usage: bash benchmarks/gpu_validation.sh
set -u
OUT=${OUT:-/tmp/kj-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
export KERNELJUDGE_CACHE_DIR=/tmp/kj-cache KERNELJUDGE_TEST_CACHE=/tmp/kj-cache
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; } \
    | tee "$OUT/machine.txt"
echo "== verdict latency"
timeout 300 python3 benchmarks/verdict_latency.py --baselines eager --parallel-cold \
    --json "$OUT/latency.json" 2>&1 | tail -8 | tee "$OUT/latency.txt"
echo "== builds"
ls examples/*/cuda_*.py examples/causal_gqa/seed002_submission.py \
    | xargs -P 8 -I{} timeout 300 python3 -m kerneljudge build {} 2>&1 | tee "$OUT/builds.txt"
echo "== GPU test tier"
timeout 200 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x 2>&1 \
    | tail -25 | tee "$OUT/pytest_gpu.txt"
echo "== 002 submission"
timeout 150 python3 -m kerneljudge eval -p causal_gqa examples/causal_gqa/seed002_submission.py \
    --json > "$OUT/seed002_verdict.json"
python3 - "$OUT/seed002_verdict.json" <<'PY' | tee "$OUT/seed002.txt"
import json, sys
v = json.load(open(sys.argv[1]))
print(v["status"], v["reason"], "trials", sum(t["passed"] for t in v["check"]["trials"]))
for s in v["timing"]["speedups"]:
    print(f"speedup vs {s['baseline']}: {s['median']:.2f}x (95% CI {s['ci95'][0]:.2f}-{s['ci95'][1]:.2f})")
PY
