#!/usr/bin/env bash
# GPU check: the GPU tests, then the benchmark on RANDOM-WEIGHT Llama-style models built from
# configs at realistic sizes (SmolLM2-135M, ~0.5B, ~8B). Throughput is meaningful; the answers are
# not (weights are random), but the three variants must still agree.
#
# Usage: scripts/gpu_check.sh [--device cpu] [--quick] [--configs "smollm2-135m llama-0.5b"]
# Writes JSON (and .md tables) to $OUT (default bench-results/). Budget: at most 2 + 6 x 100 s
# (BENCH_TIMEOUT per run), typically far less on one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-bench-results}
DEVICE=cuda
QUICK=""
CONFIGS="smollm2-135m llama-0.5b llama-8b"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --configs) CONFIGS=$2; shift 2 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
echo "gpu_check: device=$DEVICE configs=[$CONFIGS] out=$OUT"
echo "gpu_check: NOTE: benchmark models have RANDOM weights (speed only; answers are meaningless)"
status=0
if [ "$DEVICE" != cpu ]; then
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  timeout 180 $PY -m pytest -q -m gpu tests/test_kernels.py tests/test_prefix_cache.py tests/test_vision_models.py tests/test_train_numerics.py 2>&1 | tee "$OUT/gpu_tests.txt" || status=1
fi
DTYPE=bfloat16; [ "$DEVICE" = cpu ] && DTYPE=float32
# Per-benchmark limit: on a GPU 100 s each keeps 3 configs x 2 attention paths inside the 10-minute
# budget (never measured: no GPU was lent yet); --quick on the 2-core CPU needs up to ~3 min.
TIMEOUT=${BENCH_TIMEOUT:-100}; [ "$DEVICE" = cpu ] && TIMEOUT=${BENCH_TIMEOUT:-300}
for cfg in $CONFIGS; do
  for attn in sdpa flex; do
    [ "$DEVICE" = cpu ] && [ "$attn" = flex ] && continue  # flex attention is the CUDA path only
    echo "gpu_check: bench $cfg ($attn, $DTYPE, random weights)"
    timeout "$TIMEOUT" $PY -m noulengine.bench $QUICK --model-config "$cfg" --device "$DEVICE" --dtype "$DTYPE" \
      --attn "$attn" --output "$OUT/bench-$cfg-$attn.json"
    rc=$?
    if [ $rc -ne 0 ]; then
      [ $rc -eq 124 ] && echo "gpu_check: bench $cfg $attn ran past ${TIMEOUT} s (BENCH_TIMEOUT)"
      echo "gpu_check: bench $cfg $attn failed (exit $rc)"; status=1
    fi
  done
done
# Both prompt layouts (issue #32), warm and cold, interleaved in one run: random weights, so speed
# and prefix-cache hit rates only (accuracy columns are meaningless here).
for cfg in $CONFIGS; do
  echo "gpu_check: bench --layouts $cfg ($DTYPE, random weights)"
  timeout "$TIMEOUT" $PY -m noulengine bench --layouts $QUICK --model-config "$cfg" --device "$DEVICE" --dtype "$DTYPE" \
    --peer off --output "$OUT/layouts-$cfg.json" || { echo "gpu_check: bench --layouts $cfg failed"; status=1; }
done
echo "gpu_check: done (status $status); results in $OUT; weights were random"
exit $status
