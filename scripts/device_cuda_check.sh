#!/usr/bin/env bash
# The real backend's CUDA path, end to end, on a machine with an NVIDIA GPU, in one short run:
#   1. the hardware tests (pinning an aligned host buffer in place with cudaHostRegister);
#   2. `flashsim bench compute --device cuda --quick` (dense and sparse GEMV, DRAM and host-to-device
#      bandwidth on the GPU: real/bench/bench_cuda.py), printed as JSON;
#   3. a shape-mode weight store and a synthetic trace of one model, then `flashsim real run` of the
#      same presets on --device cpu and --device cuda (bytes read must match; latency per token is what
#      the GPU changes);
#   4. `flashsim calibrate --quick --device cuda --modes shape` into a profile file (not the repo's).
# Every output lands in $OUT (default /tmp/flashsim-cuda-check); each step has its own time limit so
# one slow step cannot take the others' time. Nothing here is needed by the tests or CI.
#
#   OUT=/tmp/out SHAPE=llama-3.2-1b TOKENS=32 bash scripts/device_cuda_check.sh
set -u
OUT=${OUT:-/tmp/flashsim-cuda-check}
SHAPE=${SHAPE:-llama-3.2-1b}
TOKENS=${TOKENS:-32}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
WORK=${WORK:-$(mktemp -d /tmp/flashsim-cuda.XXXXXX)}
STEP_S=${STEP_S:-150}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
FS=("$PY" -m "${FLASHSIM_MODULE:-flashsim}")

step() {  # step NAME COMMAND...: stdout to $OUT/NAME.out, stderr to $OUT/NAME.err, timed
    local name=$1; shift
    local t0=$SECONDS
    timeout "$STEP_S" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
}

{ date -u; uname -a; nproc; nvidia-smi -L 2>&1; df -h /tmp | tail -1
  "$PY" -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__)"
} >"$OUT/env.txt" 2>&1

step hardware_tests "$PY" -m pytest -q -p no:cacheprovider -m hardware tests/real/test_device.py
step bench_compute "${FS[@]}" bench compute --device "$DEVICE" --quick --no-write --json
step convert "${FS[@]}" real convert --shape "$SHAPE" --random --seed 0 --layout both --out "$WORK/store" --json
step synth "${FS[@]}" trace synth --model "$SHAPE" --tokens "$TOKENS" --seed 0 --out "$WORK/trace" \
    --active-fraction 0.1 --overlap 0.7 --hot-skew 0.3 --json
for preset in naive llm-in-a-flash; do
    for dev in cpu "$DEVICE"; do
        step "run_${preset}_$dev" "${FS[@]}" real run --store "$WORK/store" --trace "$WORK/trace" \
            --preset "$preset" --device "$dev" --tokens "$TOKENS" --json
    done
done
STEP_S=${CALIBRATE_S:-200} step calibrate "${FS[@]}" calibrate --path "$WORK" --quick --device "$DEVICE" \
    --modes shape --name gpu-host --out "$OUT/gpu-host.yaml" --json
rm -rf "$WORK"
