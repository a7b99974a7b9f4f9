"""Experiment behind docs/results.md#known-distribution-pilot-96-questions-exact-reference-distributions ("Known-distribution pilot (96 questions, exact reference distributions)"); reproduce: `python experiments/pilot_options.py --out runs/pilot`.

Score every readout, debiasing and calibration option on the known-distribution pilot.

    python experiments/pilot_options.py [--out runs/pilot] [--calibration-dir runs/options]

Runs ``python -m noulengine.eval.pilot`` once per option (a fresh process each, same model) and
prints one markdown table of the pilot's own contract (SOURCE.md of known_distribution_pilot):
TVD, excess and expected Brier, impossible-outcome mass, 10-bin expected ECE and the
canonical-vs-reversed disagreement, plus a uniform-answer row as the no-model reference. The
temperature rows use the calibration files written by ``experiments/compare_options.sh`` (fitted on
validation-v1 calibration rows only); they are skipped, and the table says so, when absent.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (name, extra CLI flags, calibration file name or None)
OPTIONS = [
    ("auto", ["--readout", "auto"], None),
    ("symbols", ["--readout", "symbols"], None),
    ("label-token", ["--readout", "label-token"], None),
    ("label-sequence", ["--readout", "label-sequence"], None),
    ("auto + permute", ["--readout", "auto", "--debias", "permute"], None),
    ("auto + contextual", ["--readout", "auto", "--debias", "contextual"], None),
    ("auto + temperature", ["--readout", "auto"], "calibration.json"),
    ("auto + contextual + temperature", ["--readout", "auto", "--debias", "contextual"], "calibration_contextual.json"),
]


def uniform_reference() -> dict:
    """The pilot scorer applied to uniform answers (no model)."""
    sys.path.insert(0, str(REPO))
    from noulengine.eval.pilot import FIELD, SUITE, score_pilot
    from noulengine.eval.suites import get_suite

    rows = get_suite(SUITE).load()
    answers = []
    for _, rec in rows:
        labels = next(q.labels for q in rec.request.questions if q.field == FIELD)
        p = 1.0 / len(labels)
        answers.append({"answers": {FIELD: {"probabilities": {lab: p for lab in labels}, "confidence": p}}})
    return score_pilot(rows, answers)


def row(name: str, report: dict, seconds: float | None) -> str:
    o, oo = report["overall"], report["option_order"]
    wall = "" if seconds is None else f"{seconds:.0f}"
    return (f"| {name} | {o['valid']}/{o['n']} | {o['tvd']:.4f} | {o['excess_brier']:.4f} | {o['expected_brier']:.4f} | "
            f"{o['impossible_mass']:.4f} | {o['expected_ece']:.4f} | {oo['mean_tvd']:.4f} | "
            f"{oo['argmax_disagreement']:.4f} | {wall} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/pilot", help="folder for each option's metrics JSON and log")
    ap.add_argument("--calibration-dir", default="runs/options", help="where compare_options.sh wrote calibration files")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines, notes = [], []
    for name, flags, calib in OPTIONS:
        cmd = [sys.executable, "-m", "noulengine.eval.pilot", *flags, "--output", str(out / f"{_slug(name)}.json")]
        if calib is not None:
            path = Path(args.calibration_dir) / calib
            if not path.is_file():
                notes.append(f"{name}: skipped, {path} not found (run experiments/compare_options.sh first)")
                continue
            cmd += ["--calibration", str(path)]
        t0 = time.perf_counter()
        with open(out / f"{_slug(name)}.log", "w", encoding="utf-8") as log:
            rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - t0
        result = out / f"{_slug(name)}.json"
        if not result.is_file():
            notes.append(f"{name}: failed (exit {rc}); see {out / (_slug(name) + '.log')}")
            continue
        lines.append(row(name, json.loads(result.read_text()), seconds))
        print(f"{name}: exit {rc}, {seconds:.0f} s", file=sys.stderr)
    lines.append(row("uniform answers (no model)", uniform_reference(), None))
    print("| option | valid | TVD | excess Brier | expected Brier | impossible mass | ECE(15) | order TVD "
          "| order argmax disagreement | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    for note in notes:
        print(f"\n{note}")
    return 0


def _slug(name: str) -> str:
    return name.replace(" + ", "_").replace("-", "_").replace(" ", "_")


if __name__ == "__main__":
    sys.exit(main())
