"""Experiment behind docs/results.md#readout-options-on-a-fixed-seed-sample-40-rows-per-suite-seed-0 ("Readout options on a fixed-seed sample (40 rows per suite, seed 0)"); reproduce: `bash experiments/compare_options.sh 40 runs/options (which ends by running this table)`.

Print the readout-option comparison table from the run folders of experiments/compare_options.sh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

OPTIONS = ("none", "permute", "contextual", "temperature", "contextual_temperature")


def fmt(x, pct=False):
    return "n/a" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.3f}")


def main(root: str) -> None:
    root = Path(root)
    runs = {o: json.loads((root / o / "metrics.json").read_text()) for o in OPTIONS if (root / o / "metrics.json").is_file()}
    suites = list(next(iter(runs.values())))
    print("| suite | option | decisions | accuracy | NLL | Brier | ECE | flip rate |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in suites:
        for o, run in runs.items():
            m = run[s]["metrics"]
            if not m:
                continue
            print(f"| {s} | {o} | {m['counts']['decisions']} | {fmt(m['accuracy'], True)} | {fmt(m['nll'])} | "
                  f"{fmt(m['brier'])} | {fmt(m['ece'])} | {fmt(m.get('flip_rate'))} |")
    for o in runs:
        meta = json.loads((root / o / "run.json").read_text())
        print(f"\n{o}: {meta['throughput']['requests']} requests in {meta['wall_s']:.0f} s "
              f"(`{meta['command']}`)", end="")
    print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/options")
