#!/usr/bin/env bash
# The real engine on a CUDA machine, in one go, in under 8 minutes (compiles included):
#   environment  nvidia-smi and torch.cuda must both work (versions printed)
#   install      the project, offline: pip install --no-deps --no-index --no-build-isolation -e .,
#                else a path setup (PYTHONPATH to a folder mapping slora_vtc_kernels to kernels/);
#                a stand-in for tqdm if it is missing
#   kernel_bench decode attention bandwidth as a fraction of the H200's 4.8 TB/s (target >= 0.60),
#                prefill attention tokens/s (python -m slora_vtc_kernels.bench)
#   model_bench  decode and prefill tokens/s of a 7B dummy model on the Triton kernels (scripts/bench_model.py)
#   kernel_tests tests/kernels and tests/real/test_real_triton.py, compiled, on CUDA
#   profile      a cost profile of the GPU in the profile format (slora-vtc profile)
#   run_vtc, run_fcfs   a short real run of the overload suite under VTC and under FCFS (slora-vtc run)
#   sim_from_profile    the simulator refitted to that profile (a quick check that it reads it)
#
#   scripts/gpu_check.sh [--dry-run] [RESULT_DIR]     # RESULT_DIR default: $OUT if set, else gpu_results/
#
# RESULT_DIR ends up with at most 8 files, none in a subfolder: summary.json, summary.txt,
# logs.txt (every step's output), kernel_bench.json, model_bench.json, profile.json, run_vtc.jsonl,
# run_fcfs.jsonl; the summary is rewritten after every step, so a killed check still leaves one.
# Each step has a time limit (the smaller of its own and what is left of the budget); a failing step
# is recorded and the later steps still run. Exit status: 0 if every step passed, 1 if one failed,
# 2 when there is no GPU (said on stderr, after a few seconds) or on bad usage.
#
# --dry-run: every step at tiny sizes on the CPU (the torch backend and the tiny model; the Triton
# kernels in the interpreter), no nvidia-smi needed, the path setup instead of pip (the shared .venv
# is left alone): the check's plumbing, tested in CI (tests/real/test_gpu_check.py).
#
# Environment: PYTHON (default .venv/bin/python if there is one, else python3), GPU_CHECK_BUDGET_S
# (450 on a GPU), GPU_CHECK_SKIP (step names; not environment or install), GPU_CHECK_INSTALL (auto | pip | path),
# GPU_CHECK_PEAK_GBPS (4800), GPU_CHECK_BACKEND / _MODEL / _DTYPE, and GPU_CHECK_BENCH_ARGS,
# GPU_CHECK_KERNEL_BENCH_ARGS, GPU_CHECK_PROFILE_ARGS, GPU_CHECK_RUN_ARGS (replace a step's sizes).
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
DRY=0
DEST=
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "gpu_check: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "gpu_check: one result folder at most (see --help)" >&2; exit 2; }; DEST=$arg ;;
    esac
done
DEST=${DEST:-${OUT:-gpu_results}}
mkdir -p "$DEST" && DEST=$(cd "$DEST" && pwd) || { echo "gpu_check: cannot create $DEST" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
case $PY in /*) ;; */*) PY=$REPO/$PY ;; esac
command -v "$PY" > /dev/null || { echo "gpu_check: no python at $PY (set PYTHON)" >&2; exit 2; }
HELPER=("$PY" "$REPO/scripts/gpu_check_helper.py")
PEAK=${GPU_CHECK_PEAK_GBPS:-4800}
SKIP=" ${GPU_CHECK_SKIP:-} "

if ((DRY)); then
    BUDGET=${GPU_CHECK_BUDGET_S:-300}
    INSTALL=${GPU_CHECK_INSTALL:-path}
    MODEL_ARGS=(--backend "${GPU_CHECK_BACKEND:-torch}" --model "${GPU_CHECK_MODEL:-tiny}" --dtype "${GPU_CHECK_DTYPE:-float32}")
    BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:---quick}
    KERNEL_BENCH_ARGS=${GPU_CHECK_KERNEL_BENCH_ARGS:-}
    PROFILE_ARGS=${GPU_CHECK_PROFILE_ARGS:---pool-tokens 200 --inputs 8,16 --outputs 1,3}
    RUN_ARGS=${GPU_CHECK_RUN_ARGS:---suite overload --duration 3 --time-scale 30 --pool-tokens 3000}
    DRY_FLAG=(--dry-run)
    export TRITON_INTERPRET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
    BUDGET=${GPU_CHECK_BUDGET_S:-450}
    INSTALL=${GPU_CHECK_INSTALL:-auto}
    MODEL_ARGS=(--backend "${GPU_CHECK_BACKEND:-triton}" --model "${GPU_CHECK_MODEL:-llama-7b}" --dtype "${GPU_CHECK_DTYPE:-float16}")
    BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:---batches 1,16,64 --prompt 512 --steps 32 --prefill-tokens 8192}
    KERNEL_BENCH_ARGS=${GPU_CHECK_KERNEL_BENCH_ARGS:---no-sweep}
    PROFILE_ARGS=${GPU_CHECK_PROFILE_ARGS:---inputs 8,64,256 --outputs 1,64}
    RUN_ARGS=${GPU_CHECK_RUN_ARGS:---suite overload --duration 20}
    DRY_FLAG=()
    export TRITON_INTERPRET=0
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1

STEPS=environment,install,kernel_bench,model_bench,kernel_tests,profile,run_vtc,run_fcfs,sim_from_profile
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/logs"
for f in summary.json summary.txt logs.txt kernel_bench.json model_bench.json profile.json run_vtc.jsonl run_fcfs.jsonl; do
    rm -f "$DEST/$f"  # results of an earlier check
done
START=$(date +%s)
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
FAILED=0
LAST_RC=0

report() {
    "${HELPER[@]}" report --work "$WORK" --dest "$DEST" --steps "$STEPS" --started "$STARTED" --start-epoch "$START" \
        --budget "$BUDGET" --peak-gbps "$PEAK" "${DRY_FLAG[@]}" "$@" || echo "gpu_check: the report failed" >&2
}

record() {  # name status rc seconds limit
    printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$WORK/steps.tsv"
}

# step NAME MAX_SECONDS COMMAND...: run with a time limit (the smaller of MAX_SECONDS and the budget
# left), output to the step's log, status to the summary (rewritten after each step).
step() {
    local name=$1 cap=$2
    shift 2
    LAST_RC=0
    if [[ $SKIP == *" $name "* && $name != environment && $name != install ]]; then  # those two always run
        record "$name" skipped "" "" ""
        printf '%-18s skipped\n' "$name"
        return
    fi
    local left=$((BUDGET - ($(date +%s) - START)))
    local limit=$((cap < left ? cap : left))
    if ((limit < 5)); then
        record "$name" "not run (time budget spent)" "" "" ""
        printf '%-18s not run (time budget spent)\n' "$name"
        FAILED=1
        LAST_RC=124
        report
        return
    fi
    local t0 rc status
    t0=$(date +%s)
    printf '%-18s (limit %ss) %s\n' "$name" "$limit" "$*" > "$WORK/logs/$name.log"
    timeout --kill-after=10 "$limit" "$@" >> "$WORK/logs/$name.log" 2>&1 < /dev/null
    rc=$?
    LAST_RC=$rc
    if ((rc == 0)); then
        status=passed
    elif ((rc == 124 || rc == 137)); then
        status="TIMEOUT after ${limit}s"
    else
        status="FAILED (exit $rc)"
    fi
    ((rc == 0)) || FAILED=1
    record "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$limit"
    printf '%-18s %-26s %4ss\n' "$name" "$status" "$(($(date +%s) - t0))"
    report
}

echo "gpu_check: $( ((DRY)) && echo 'DRY RUN (CPU, tiny sizes)' || echo 'GPU run'), python $PY, results in $DEST, budget ${BUDGET}s"
step environment 30 "${HELPER[@]}" environment --record "$WORK/environment.json" "${DRY_FLAG[@]}"
if ((LAST_RC == 3)); then
    report --final --not-run "not run (no GPU)"
    echo "gpu_check: no GPU here: $(grep -h 'no GPU' "$WORK/logs/environment.log" | head -1 | sed 's/^gpu_check: no GPU: //')" >&2
    echo "gpu_check: run it on the GPU machine, or try the plumbing on a CPU with --dry-run (summary: $DEST/summary.txt)" >&2
    exit 2
fi

step install 90 "${HELPER[@]}" install --mode "$INSTALL" --shim "$WORK/shim" --record "$WORK/install.json"
if [ -s "$WORK/pythonpath" ]; then
    PYTHONPATH="$(cat "$WORK/pythonpath")${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONPATH
fi

# shellcheck disable=SC2086  # the *_ARGS strings are word-split on purpose
step kernel_bench 90 "${HELPER[@]}" kernel-bench --out "$DEST/kernel_bench.json" --peak-gbps "$PEAK" "${DRY_FLAG[@]}" -- $KERNEL_BENCH_ARGS
# shellcheck disable=SC2086
step model_bench 120 "$PY" scripts/bench_model.py "${MODEL_ARGS[@]}" $BENCH_ARGS --out "$DEST/model_bench.json"
step kernel_tests 150 "${HELPER[@]}" tests --junit "$WORK/kernel_tests.xml" --record "$WORK/kernel_tests.json" "${DRY_FLAG[@]}" \
    -- tests/kernels tests/real/test_real_triton.py
# shellcheck disable=SC2086
step profile 90 "$PY" -m slora_vtc profile "${MODEL_ARGS[@]}" $PROFILE_ARGS --out "$DEST/profile.json"
for scheduler in vtc fcfs; do
    # shellcheck disable=SC2086
    step "run_$scheduler" 75 "$PY" -m slora_vtc run "${MODEL_ARGS[@]}" --scheduler "$scheduler" $RUN_ARGS --out "$DEST/run_$scheduler.jsonl"
done
step sim_from_profile 20 "$PY" -m slora_vtc run --backend sim --profile "$DEST/profile.json" --suite overload --scheduler vtc \
    --duration 60 --out "$WORK/sim_from_profile.jsonl"

report --final
cat "$DEST/summary.txt"
exit $FAILED
