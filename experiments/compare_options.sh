#!/usr/bin/env bash
# Experiment behind docs/results.md#readout-options-on-a-fixed-seed-sample-40-rows-per-suite-seed-0 ("Readout options on a fixed-seed sample (40 rows per suite, seed 0)"); reproduce: `bash experiments/compare_options.sh 40 runs/options`.
# Measure each readout option of the default model on a fixed-seed sample of accuracy-v1:
# none / permute / contextual / temperature / contextual + temperature (temperatures fitted on
# validation-v1 calibration rows only).
#   bash experiments/compare_options.sh [SAMPLE] [OUT]      (defaults: 40 rows per suite, runs/options)
# Writes one eval run folder per option and prints the comparison table (experiments/options_table.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
N=${1:-40}
OUT=${2:-runs/options}
TASKS=agnews,wildjailbreak,typed_decisions,toolace,jevbench_easy,jevbench_original
mkdir -p "$OUT"
for mode in none permute contextual; do
  $PY -m noulengine.eval --suite accuracy-v1 --tasks $TASKS --sample "$N" --seed 0 --debias $mode \
      --output "$OUT/$mode" --no-progress > "$OUT/$mode.log" 2>&1
done
$PY scripts/make_validation.py > "$OUT/validation.log" 2>&1
$PY -m noulengine.calibrate --validation benchmarks/validation-v1/prepared/agnews.jsonl \
    --validation benchmarks/validation-v1/prepared/wildjailbreak.jsonl --limit-per-role 100 \
    --output "$OUT/calibration.json" --no-progress > "$OUT/calibrate.log" 2>&1 || [ $? -eq 3 ]
$PY -m noulengine.eval --suite accuracy-v1 --tasks $TASKS --sample "$N" --seed 0 --calibration "$OUT/calibration.json" \
    --output "$OUT/temperature" --no-progress > "$OUT/temperature.log" 2>&1
# Contextual debiasing, then temperatures fitted on the debiased logits.
$PY -m noulengine.calibrate --validation benchmarks/validation-v1/prepared/agnews.jsonl \
    --validation benchmarks/validation-v1/prepared/wildjailbreak.jsonl --limit-per-role 100 --debias contextual \
    --output "$OUT/calibration_contextual.json" --no-progress > "$OUT/calibrate_contextual.log" 2>&1 || [ $? -eq 3 ]
$PY -m noulengine.eval --suite accuracy-v1 --tasks $TASKS --sample "$N" --seed 0 --debias contextual \
    --calibration "$OUT/calibration_contextual.json" --output "$OUT/contextual_temperature" --no-progress \
    > "$OUT/contextual_temperature.log" 2>&1
$PY experiments/options_table.py "$OUT"
