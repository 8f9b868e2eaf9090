#!/usr/bin/env bash
# The real engine on a CUDA machine, in one go (under 8 minutes on one GPU):
#   kernel tests on the GPU, the model on the compiled kernels against the torch ops (tiny, fp32),
#   the kernel benchmark, decode/prefill throughput of a 7B dummy model
#   (and the decode attention kernel's bandwidth), a short real experiment, and a cost profile
#   (then the simulator calibrated with it).
#
#   scripts/gpu_check.sh [OUT_DIR]        # default: gpu_results/
#
# Every step writes OUT_DIR/<step>.log (and its result files); a step that fails or runs past its
# time limit is recorded in OUT_DIR/summary.txt and the next step still runs. Exit status: 0 if
# every step passed, 1 otherwise. Overrides (environment): PYTHON, GPU_CHECK_BACKEND (triton),
# GPU_CHECK_MODEL (llama-7b), GPU_CHECK_DTYPE (float16), GPU_CHECK_BUDGET_S (450, all steps
# together), GPU_CHECK_SKIP (step names), GPU_CHECK_BENCH_ARGS, GPU_CHECK_EXPERIMENT_ARGS,
# GPU_CHECK_PROFILE_ARGS (replace each step's size arguments).
set -u

cd "$(dirname "$0")/.." || exit 1
OUT=${1:-gpu_results}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
BACKEND=${GPU_CHECK_BACKEND:-triton}
MODEL=${GPU_CHECK_MODEL:-llama-7b}
DTYPE=${GPU_CHECK_DTYPE:-float16}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
SKIP=" ${GPU_CHECK_SKIP:-} "
BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:---batches 1,16,64 --prompt 512 --steps 32 --prefill-tokens 8192}
EXPERIMENT_ARGS=${GPU_CHECK_EXPERIMENT_ARGS:---suite overload --duration 30}
PROFILE_ARGS=${GPU_CHECK_PROFILE_ARGS:---inputs 8,64,256 --outputs 1,64}
MODEL_ARGS=(--backend "$BACKEND" --model "$MODEL" --dtype "$DTYPE")
export HF_HUB_OFFLINE=1 TRITON_INTERPRET=0 MPLBACKEND=Agg PYTHONUNBUFFERED=1

START=$(date +%s)
SUMMARY="$OUT/summary.txt"
FAILED=0
{
    echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)  git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "backend $BACKEND, model $MODEL, dtype $DTYPE, budget ${BUDGET}s"
} > "$SUMMARY"

# step NAME MAX_SECONDS COMMAND...: run with a time limit (the smaller of MAX_SECONDS and the
# budget left), output to OUT/NAME.log, status to the summary.
step() {
    local name=$1 cap=$2
    shift 2
    if [[ $SKIP == *" $name "* ]]; then
        printf '%-18s skipped\n' "$name" >> "$SUMMARY"
        return
    fi
    local left=$((BUDGET - ($(date +%s) - START)))
    local limit=$((cap < left ? cap : left))
    if ((limit < 5)); then
        printf '%-18s not run (time budget spent)\n' "$name" >> "$SUMMARY"
        FAILED=1
        return
    fi
    local t0=$(date +%s) rc status
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/$name.log"
    timeout --kill-after=10 "$limit" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        status=ok
    elif ((rc == 124 || rc == 137)); then
        status="TIMEOUT after ${limit}s"
    else
        status="FAILED (exit $rc)"
    fi
    ((rc == 0)) || FAILED=1
    printf '%-18s %-26s %4ss\n' "$name" "$status" "$(($(date +%s) - t0))" | tee -a "$SUMMARY"
}

step environment 30 bash -c "nvidia-smi; $PY -c 'import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))'"
step kernel_tests 100 "$PY" -m pytest -q -rs tests/kernels/test_kernels.py --junitxml="$OUT/kernel_tests.xml"
step model_tests 60 "$PY" -m pytest -q -rs tests/real/test_real_triton.py --junitxml="$OUT/model_tests.xml"
if [ -f kernels/bench.py ]; then
    step kernel_bench 60 "$PY" kernels/bench.py --out "$OUT/kernel_bench.json"
else
    printf '%-18s not run (kernels/bench.py is missing)\n' kernel_bench >> "$SUMMARY"
    FAILED=1
fi
# shellcheck disable=SC2086  # the *_ARGS strings are word-split on purpose
step model_bench 100 "$PY" scripts/bench_model.py "${MODEL_ARGS[@]}" $BENCH_ARGS --out "$OUT/model_bench.json"
# shellcheck disable=SC2086
step experiment 130 "$PY" -m slora_vtc run "${MODEL_ARGS[@]}" --scheduler vtc $EXPERIMENT_ARGS --out "$OUT/experiment_vtc.jsonl"
# shellcheck disable=SC2086
step profile 90 "$PY" -m slora_vtc profile "${MODEL_ARGS[@]}" $PROFILE_ARGS --out "$OUT/profile.json"
if [ -f "$OUT/profile.json" ]; then
    step sim_from_profile 30 "$PY" -m slora_vtc run --backend sim --profile "$OUT/profile.json" --suite overload --scheduler vtc --duration 60 --out "$OUT/sim_from_profile.jsonl"
fi

echo "total $(($(date +%s) - START))s" | tee -a "$SUMMARY"
exit $FAILED
