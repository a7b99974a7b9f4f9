#!/usr/bin/env python
"""Experiment behind docs/results.md#v4-for-three-epochs-issue-33-not-adopted ("v4 for three epochs (issue #33; not adopted)"); reproduce: `python experiments/selection_by_kind.py --selection runs/train-v4/data/selection.jsonl --model default`.

Score a model on a recipe's held-out selection rows, per kind: the learning curve's metrics for
any model, so two models are compared on the same rows (e.g. the installed default against a
candidate on mix v4's yes/no and tool rows, which the default never saw in training).

Usage::

    python experiments/selection_by_kind.py --selection runs/train-v4/data/selection.jsonl \\
        --model default --model runs/train-v4/model --kinds noul:,tool: --output runs/sel-v4.json

Each ``--model`` is anything ``Engine.from_pretrained`` takes (``default``: the installed default
decision model; a trained folder is read with its own readout, layout and ``calibration.json``).
Prints one table (accuracy %, NLL, ECE, and for yes/no kinds the ROC AUC of P(yes) against the gold
side, :func:`noulengine.metrics.functional.binary_auc`) and writes the metrics as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--selection", required=True, help="a selection JSONL (every row validation_role: selection)")
    ap.add_argument("--model", action="append", required=True, help="'default' or a model (repeatable)")
    ap.add_argument("--kinds", default=None, help="comma-separated category prefixes to keep (default: all rows)")
    ap.add_argument("--output", default=None, help="write {model: metrics} JSON here")
    args = ap.parse_args(argv)

    from noulengine.engine.engine import Engine
    from noulengine.train.contamination import build_evaluation_index
    from noulengine.train.data import load_training_rows
    from noulengine.train.selection import selection_by_kind

    # the trainer's own checks: a selection row that overlaps an evaluation suite is refused here too
    rows = load_training_rows(args.selection, index=build_evaluation_index(), role="selection")
    if args.kinds:
        prefixes = tuple(args.kinds.split(","))
        rows = [r for r in rows if (r.record.category or "").startswith(prefixes)]
    if not rows:
        raise SystemExit(f"no selection rows of kinds {args.kinds!r} in {args.selection}")
    results = {}
    for spec in dict.fromkeys(args.model):  # a model named twice is scored once
        engine = Engine.from_pretrained(None if spec == "default" else spec)
        results[spec] = {"name": engine.identity.name, "calibrated": engine.calibration is not None,
                         **selection_by_kind(engine, rows)}
        print(f"scored {len(rows)} rows with {spec} ({engine.identity.name})", file=sys.stderr, flush=True)
    kinds = sorted({k for r in results.values() for k in r["kinds"]})
    print("| kind | decisions | " + " | ".join(f"{results[m]['name']} acc / NLL / ECE / yes AUC" for m in results) + " |")
    print("|---|---:|" + "---|" * len(results))
    for kind in kinds:
        cells = []
        for m in results:
            x = results[m]["kinds"].get(kind, {})
            auc = x.get("yes_auc")
            cells.append(f"{100 * x['accuracy']:.1f}% / {x['nll']:.3f} / {x['ece']:.3f}"
                         + (f" / {auc:.3f}" if auc is not None else ""))
        n = next(results[m]["kinds"][kind]["decisions"] for m in results if kind in results[m]["kinds"])
        print(f"| {kind} | {n} | " + " | ".join(cells) + " |")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
