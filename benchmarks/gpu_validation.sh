#!/usr/bin/env bash
# Validation on a CUDA machine, step by step, each step with its own time limit and its whole
# output in a file under $WORK (default /tmp/kj-work); $OUT/results.tgz (default $OUT=/tmp/kj-out)
# packs $WORK again after every step and every 20 s, so that a run cut short loses little.
# Steps (pick with STEPS="latency gpu_tier ..."; default: all, in this order):
#   build_times     benchmarks/build_times.py: plain vs parallel nvcc, side by side
#   latency         benchmarks/verdict_latency.py (cold verdicts one at a time, quiet machine)
#   reference_times benchmarks/reference_times.py (eager and torch.compile of every problem)
#   builds          every CUDA example and GPU adversarial candidate, built ahead of the tests
#   gpu_tier        pytest -m gpu tests/gpu (examples, recovery after faults)
#   seed_verdicts   seed 002's kernel judged three times from the command line (JSON verdicts)
#   suite_bundled   `kerneljudge suite run bundled -c examples` (every example, CUDA ones too),
#                   stored in $WORK/results.sqlite and reported to $WORK/report.html
#   env_tier        pytest -m gpu tests/env tests/agent, then the 002 transcript replayed
#   adversarial     tests/adversarial/run_suite.py --gpu --no-cpu
#   lint_public     `kerneljudge problems lint -s public --device cuda`
# and, only when named in STEPS:
#   compare_cost    benchmarks/compare_cost.py: one output's comparison, CPU vs GPU, 1-1024 MiB
#   kernelbench     benchmarks/kernelbench_side_by_side.py over KB_PROBLEMS (default: its list)
#                   against the KernelBench checkout at $KERNELBENCH (needs its wheels on
#                   PYTHONPATH: pydantic and python-dotenv), KB_TIMEOUT s per side (default 300),
#                   KB_SIDES its sides (default kb,kj; kb,kj-served: one judge host for every
#                   problem), KB_ARGS more arguments (e.g. --again); KB_MEMORY=1 keeps each
#                   worker's device memory per request in $WORK/worker_profiles/*.mem
#   graph_latency   benchmarks/verdict_latency.py --separate ${SEPARATE:-10}: repeated verdicts from
#                   fresh `eval` processes, launched and graph-replay speedups side by side
#   kb_builds       benchmarks/build_times.py --compare kernelbench --plain-cuda-host (cold
#                   verdicts beside KernelBench's harness; $KERNELBENCH and its wheels as for
#                   `kernelbench`; KB_BUILDS_ARGS: more arguments, e.g. candidates)
#   kb_suite        KernelBench level ${KB_LEVEL:-3} of $KERNELBENCH through `suite run`, the
#                   identity candidates (each problem with `Model` renamed `ModelNew`), KernelBench's
#                   tolerance, 3 trials, a 0.5 s timing budget, into the store $KB_STORE (default
#                   $WORK/kb_suite.sqlite; a store that already holds the run continues it with
#                   --resume, so a store carried from a call cut short judges only the rest: the
#                   run's stored paths, so $KERNELBENCH and $WORK must be where they were), then
#                   `results show`, `results metrics` and the report; KB_SUITE_TIMEOUT s (default 540)
#   size_scaling    benchmarks/size_scaling.py --device cuda at SIZES MiB (default 1,64,1024,8192)
#                   for SCALING_PROBLEMS (default elementwise,reduction)
#   memory          benchmarks/supervisor_memory.py --device cuda --mib ${MEMORY_MIB:-1024}
#                   --configs ${MEMORY_CONFIGS:-default,all_sets,episode}
#   worker_start    benchmarks/worker_start.py --device cuda --record-ops, with an empty kernel
#                   cache per round and with the cache a worker inherits (WORKER_ROUNDS, default 3)
#   throughput      benchmarks/throughput.py on the CPU slots ${THROUGHPUT_SLOTS:-1,2,4,7,8}, weak
#                   scaling (--jobs-per-slot ${JOBS_PER_SLOT:-11} --cold ${THROUGHPUT_COLD:-1}),
#                   THROUGHPUT_TIMEOUT s (default 400)
#   oracle_8g       benchmarks/verdict_profile.py --workers on size_scaling.py's elementwise
#                   problem at ${ORACLE_MIB:-8192} MiB (its float64 oracles and where they ran:
#                   the verdict's reductions), PROFILE_TIMEOUT s (default 300)
# LOAD=1 keeps every CPU core busy (one spinner per core, and a memory-bandwidth hog) for the
# whole run, so the judge's timing rules are checked on a loaded host; each step says so.
#   usage: STEPS="latency builds" bash benchmarks/gpu_validation.sh
# ADV_REPEAT=N judges the adversarial suite N times (default 1) within ADV_TIMEOUT s (default 450);
# GPU_TESTS="tests/gpu/x.py ..." limits gpu_tier to those tests, GPU_TIMEOUT s (default 450).
# PROBLEMS="a,b" limits reference_times, lint_public and graph_latency to those bundled problems.
set -u
OUT=${OUT:-/tmp/kj-out}
WORK=${WORK:-/tmp/kj-work}
STEPS=${STEPS:-"build_times latency reference_times builds gpu_tier seed_verdicts suite_bundled env_tier adversarial lint_public"}
ADV_REPEAT=${ADV_REPEAT:-1}
ADV_TIMEOUT=${ADV_TIMEOUT:-450}
GPU_TESTS=${GPU_TESTS:-tests/gpu}
GPU_TIMEOUT=${GPU_TIMEOUT:-450}
PROBLEMS=${PROBLEMS:-}
LOAD=${LOAD:-0}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KERNELJUDGE_CACHE_DIR=/tmp/kj-cache KERNELJUDGE_TEST_CACHE=/tmp/kj-cache
want() { [[ " $STEPS " == *" $1 "* ]]; }
pack() { tar czf "$OUT/results.tmp.tgz" -C "$WORK" . 2>/dev/null \
    && mv "$OUT/results.tmp.tgz" "$OUT/results.tgz"; }
step() {
    pack
    echo "== $1 ($(date -u +%T))"
}
# Packed every 20 s as well: a run killed in the middle of a step keeps that step's output.
( while sleep 20; do pack; done ) &
PACKER=$!
# The runnable threads every 5 s (what the verdicts' run-queue readings counted).
( while sleep 5; do date -u +%T; ps -eLo stat,pid,tid,comm | awk '$1 ~ /^R/'; done ) \
    > "$WORK/runnable.txt" 2>&1 &
SAMPLER=$!
LOADERS=()
if [ "$LOAD" = 1 ]; then
    # Spinners and a bandwidth hog end by themselves after an hour if this script is killed.
    for _ in $(seq "$(nproc)"); do
        timeout 3600 sh -c 'while :; do :; done' & LOADERS+=($!)
    done
    timeout 3600 python3 -c "
import numpy as np
a = np.ones(64 << 20); b = np.empty_like(a)
while True: np.copyto(b, a)" & LOADERS+=($!)
    echo "load: $(nproc) spinners and a memory-bandwidth hog" | tee "$WORK/load.txt"
fi
trap 'kill $PACKER $SAMPLER "${LOADERS[@]}" 2>/dev/null; pack' EXIT

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; nproc; } \
    > "$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"

if want build_times; then
    step build_times
    timeout 200 python3 benchmarks/build_times.py examples/causal_gqa/cuda_fused.py \
        --json "$WORK/build_times.json" > "$WORK/build_times.txt" 2>&1
    cat "$WORK/build_times.txt"
fi
if want latency; then
    step latency
    # GPU clocks, power and utilisation once a second beside it, to explain slow verdicts.
    nvidia-smi dmon -s pucm -d 1 -o T > "$WORK/dmon_latency.txt" 2>&1 &
    DMON=$!
    timeout 420 python3 benchmarks/verdict_latency.py --baselines eager --repeats 5 --pause 3 \
        --json "$WORK/latency.json" > "$WORK/latency.txt" 2>&1
    kill "$DMON" 2>/dev/null
    tail -9 "$WORK/latency.txt"
fi
if want reference_times; then
    step reference_times
    timeout 400 python3 benchmarks/reference_times.py --jobs 8 --max-time 1 \
        --compile-timeout 120 --problems "$PROBLEMS" --json "$WORK/reference_times.json" \
        > "$WORK/reference_times.txt" 2>&1
    cat "$WORK/reference_times.txt"
fi
if want builds; then
    step builds
    ls examples/*/cuda_*.py examples/causal_gqa/seed002_submission.py examples/*/cpp_*.py \
        $(grep -l load_inline tests/adversarial/gpu/*.py) \
        | xargs -P 8 -I{} timeout 300 python3 -m kerneljudge build {} > "$WORK/builds.txt" 2>&1
    grep -c "^built" "$WORK/builds.txt"
fi
if want gpu_tier; then
    step gpu_tier
    timeout "$GPU_TIMEOUT" python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider -rA --durations=8 \
        > "$WORK/pytest_gpu.txt" 2>&1
    grep -E "passed|failed|FAILED|candidate median|s call " "$WORK/pytest_gpu.txt" | tail -25
fi
if want seed_verdicts; then
    step seed_verdicts
    for i in 1 2 3; do
        timeout 150 python3 -m kerneljudge eval --problem causal_gqa \
            examples/causal_gqa/seed002_submission.py --json > "$WORK/seed002_$i.json" \
            2> "$WORK/seed002_$i.log"
        python3 -c "import json,sys; v=json.load(open(sys.argv[1])); \
t=v.get('timing') or {}; print(v['status'], v['reason'][:120], \
[(s['baseline'], round(s['median'], 2), [round(c, 2) for c in s['ci95']]) \
for s in t.get('speedups', [])])" "$WORK/seed002_$i.json" || tail -3 "$WORK/seed002_$i.json"
    done
fi
if want suite_bundled; then
    step suite_bundled
    timeout 600 python3 -m kerneljudge suite run bundled -c examples --run-id bundled-gpu \
        --store "$WORK/results.sqlite" --cache-dir /tmp/kj-cache > "$WORK/suite_bundled.txt" 2>&1
    echo "suite run exit $?" >> "$WORK/suite_bundled.txt"
    python3 -m kerneljudge results show bundled-gpu --store "$WORK/results.sqlite" \
        > "$WORK/suite_bundled_results.txt" 2>&1
    python3 -m kerneljudge report bundled-gpu --store "$WORK/results.sqlite" \
        --out "$WORK/report.html" > /dev/null 2>&1
    tail -25 "$WORK/suite_bundled.txt"
fi
if want env_tier; then
    step env_tier
    timeout 200 python3 -m pytest -q -m gpu tests/env tests/agent -p no:cacheprovider -rA \
        --continue-on-collection-errors > "$WORK/pytest_env.txt" 2>&1
    tail -5 "$WORK/pytest_env.txt"
    timeout 150 python3 -m kerneljudge episode \
        --replay examples/transcripts/causal_gqa_seed002.jsonl --baselines eager \
        --out "$WORK/replay" --json > "$WORK/replay_summary.json" 2>&1
    tail -c 800 "$WORK/replay_summary.json"
fi
if want adversarial; then
    step adversarial
    timeout "$ADV_TIMEOUT" python3 tests/adversarial/run_suite.py --gpu --no-cpu --cache-dir /tmp/kj-cache \
        --repeat "$ADV_REPEAT" \
        --json "$WORK/adversarial.json" > "$WORK/adversarial.txt" 2>&1
    tail -22 "$WORK/adversarial.txt"
fi
if want lint_public; then
    step lint_public
    if [ -z "$PROBLEMS" ]; then
        timeout 300 python3 -m kerneljudge problems lint -s public --device cuda \
            > "$WORK/lint_public.txt" 2>&1
    else
        for p in ${PROBLEMS//,/ }; do
            timeout 120 python3 -m kerneljudge problems lint "$p" -s public --device cuda
        done > "$WORK/lint_public.txt" 2>&1
    fi
    tail -6 "$WORK/lint_public.txt"
fi
if want compare_cost; then
    step compare_cost
    timeout 300 python3 benchmarks/compare_cost.py --max-mib 1024 \
        --json "$WORK/compare_cost.json" > "$WORK/compare_cost.txt" 2>&1
    cat "$WORK/compare_cost.txt"
fi
if want kernelbench; then
    step kernelbench
    kb_problems=()
    [ -n "${KB_PROBLEMS:-}" ] && kb_problems=(--problems "$KB_PROBLEMS")
    if [ -n "${KB_MEMORY:-}" ]; then
        mkdir -p "$WORK/worker_profiles"
        export KERNELJUDGE_WORKER_PROFILE="$WORK/worker_profiles"
    fi
    python3 benchmarks/kernelbench_side_by_side.py --kernelbench "${KERNELBENCH:?}" \
        "${kb_problems[@]}" --sides "${KB_SIDES:-kb,kj}" ${KB_ARGS:-} --requests \
        --timeout "${KB_TIMEOUT:-300}" \
        --json "$WORK/kernelbench.json" > "$WORK/kernelbench.txt" 2>&1
    unset KERNELJUDGE_WORKER_PROFILE
    rm -f "$WORK"/worker_profiles/*.prof
    tail -40 "$WORK/kernelbench.txt"
fi
if want graph_latency; then
    step graph_latency
    timeout "${LATENCY_TIMEOUT:-900}" python3 benchmarks/verdict_latency.py \
        --separate "${SEPARATE:-10}" --pause 2 --problems "${PROBLEMS:-causal_gqa,mla_kv_projection,triangle_attention}" \
        --json "$WORK/latency_separate.json" > "$WORK/latency_separate.txt" 2>&1
    grep -v "^  " "$WORK/latency_separate.txt" | tail -6
fi
if want kb_builds; then
    step kb_builds
    timeout "${KB_TIMEOUT:-900}" python3 benchmarks/build_times.py --compare kernelbench \
        --kernelbench "${KERNELBENCH:?}" --plain-cuda-host ${KB_BUILDS_ARGS:-} \
        --json "$WORK/kb_builds.json" > "$WORK/kb_builds.txt" 2>&1
    tail -20 "$WORK/kb_builds.txt"
fi
if want kb_suite; then
    step kb_suite
    level=${KB_LEVEL:-3}
    run_id=kb-level$level
    store=$WORK/kb_suite.sqlite
    # A carried store may be read-only (as what comes back from a call is): judged into a copy.
    if [ -n "${KB_STORE:-}" ] && [ "$KB_STORE" != "$store" ]; then
        cp "$KB_STORE" "$store" && chmod u+w "$store"
    fi
    cands="$WORK/kb_candidates_level$level"
    mkdir -p "$cands"
    for f in "${KERNELBENCH:?}/KernelBench/level$level"/*.py; do
        name=$(basename "$f" .py)
        sed 's/\bModel\b/ModelNew/g' "$f" \
            > "$cands/level_${level}_problem_${name%%_*}_sample_0_kernel.py"
    done
    if python3 -m kerneljudge results show "$run_id" --store "$store" > /dev/null 2>&1; then
        plan=(--resume "$run_id")  # with the options stored with the run
    else
        plan=("$KERNELBENCH/KernelBench/level$level" -c "$cands" --run-id "$run_id"
              --device cuda --tolerance allclose --trials 3 --max-time 0.5)
    fi
    timeout "${KB_SUITE_TIMEOUT:-540}" python3 -m kerneljudge suite run "${plan[@]}" \
        --store "$store" >> "$WORK/kb_suite.txt" 2>&1
    python3 -m kerneljudge results show "$run_id" --store "$store" > "$WORK/kb_suite_results.txt" 2>&1
    python3 -m kerneljudge results metrics "$run_id" --store "$store" \
        > "$WORK/kb_suite_metrics.txt" 2>&1
    python3 -m kerneljudge report "$run_id" --store "$store" --out "$WORK/kb_suite_report.html" \
        > /dev/null 2>&1
    tail -3 "$WORK/kb_suite.txt"; tail -12 "$WORK/kb_suite_metrics.txt"
fi
if want size_scaling; then
    step size_scaling
    timeout "${SCALING_TIMEOUT:-540}" python3 benchmarks/size_scaling.py --device cuda \
        --sizes "${SIZES:-1,64,1024,8192}" --problems "${SCALING_PROBLEMS:-elementwise,reduction}" \
        --json "$WORK/size_scaling.json" \
        > "$WORK/size_scaling.txt" 2>&1
    tail -20 "$WORK/size_scaling.txt"
fi
if want memory; then
    step memory
    timeout "${MEMORY_TIMEOUT:-540}" python3 benchmarks/supervisor_memory.py --device cuda \
        --mib "${MEMORY_MIB:-1024}" --configs "${MEMORY_CONFIGS:-default,all_sets,episode}" \
        --json "$WORK/memory.json" > "$WORK/memory.txt" 2>&1
    tail -20 "$WORK/memory.txt"
fi
if want worker_start; then
    step worker_start
    for cache in fresh inherit; do
        timeout 300 python3 benchmarks/worker_start.py --device cuda --record-ops \
            --rounds "${WORKER_ROUNDS:-3}" --kernel-cache "$cache" \
            --json "$WORK/worker_start_$cache.json" > "$WORK/worker_start_$cache.txt" 2>&1
        tail -9 "$WORK/worker_start_$cache.txt"
    done
fi
if want throughput; then
    step throughput
    timeout "${THROUGHPUT_TIMEOUT:-400}" python3 benchmarks/throughput.py \
        --slots "${THROUGHPUT_SLOTS:-1,2,4,7,8}" --jobs-per-slot "${JOBS_PER_SLOT:-11}" \
        --cold "${THROUGHPUT_COLD:-1}" \
        --cache /tmp/kj-cache/bench --json "$WORK/throughput.json" > "$WORK/throughput.txt" 2>&1
    tail -20 "$WORK/throughput.txt"
fi
if want oracle_8g; then
    step oracle_8g
    python3 - "$WORK" "${ORACLE_MIB:-8192}" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import size_scaling as s

work, mib = Path(sys.argv[1]), int(sys.argv[2])
src = s.problem_source("elementwise", mib)
(work / "oracle_problem.py").write_text(src)
(work / "oracle_candidate.py").write_text(src.replace("class Model(", "class ModelNew("))
PY
    timeout "${PROFILE_TIMEOUT:-300}" python3 benchmarks/verdict_profile.py --device cuda \
        --problem "$WORK/oracle_problem.py" --candidate "$WORK/oracle_candidate.py" \
        --verdicts 1 --workers --top 30 > "$WORK/oracle_8g.txt" 2>&1
    head -25 "$WORK/oracle_8g.txt"
fi
step done
