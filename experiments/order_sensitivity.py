#!/usr/bin/env python
"""Experiment behind docs/results.md#option-order-reversal-and-rotation-40-rows-per-suite-seed-0 ("Option order: reversal and rotation (40 rows per suite, seed 0)"); reproduce: `python experiments/order_sensitivity.py --sample 40 --seed 0`.

How much a model's answers depend on option order: reversal change share and rotation flip rate,
side by side. A thin wrapper over two ``noulengine eval`` runs on the same fixed-seed sample.

    python experiments/order_sensitivity.py [--model SPEC] [--suites agnews,toolace,...] [--sample 40]
        [--seed 0] [--no-rotations] [--run-dir DIR] [--output runs/order.json]

The two runs (each a normal eval run folder under ``--run-dir``, resumable, with its own
``report.md``; a temporary folder when ``--run-dir`` is not given):

* ``in-order/``: ``eval --probe reverse``: the plain model answers every row, and every choice
  question again with its criteria in reverse order (labels keep their meaning), as extra requests
  of the same batches; ``metrics.json`` has per suite ``reversal_change_share`` and
  ``order_probe`` (changed / items, accuracy in order and reversed);
* ``permute/`` (unless ``--no-rotations``): ``eval --debias permute``, whose ``flip_rate`` per
  suite is the mean share of cyclic rotations whose argmax differs from the in-order argmax.

``eval --probe reverse`` alone gives the reversal change share; the rotation flip rate needs a
second run, because ``--debias permute`` changes the answers themselves. This script runs both
and prints one table: per suite, the choice decisions compared, accuracy in order and reversed,
the share of answers the reversal changed, and the rotation flip rate. A model that reads option
*content* answers the same whatever the order (both near 0); one that answers by *slot* moves its
answer with the options (issue #22's targets: both <= 0.10). Score and noul questions have no
option order and are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_SUITES = "agnews,wildjailbreak,typed_decisions,toolace,jevbench_easy,jevbench_original,jevbench_hard,procedural"


def _metrics(folder: Path) -> dict:
    return {name: m.get("metrics") or {} for name, m in json.loads((folder / "metrics.json").read_text()).items()}


def combine(in_order: dict, permute: dict | None) -> dict:
    """Per suite, the two runs' order numbers (from their ``metrics.json``)."""
    out = {}
    for name, m in in_order.items():
        p = m.get("order_probe") or {}
        out[name] = {"choice_decisions": p.get("items", 0), "errors": p.get("errors", 0),
                     "accuracy_in_order": p.get("accuracy_in_order"), "accuracy_reversed": p.get("accuracy_reversed"),
                     "reversal_change_share": p.get("change_share"),
                     "rotation_flip_rate": (permute or {}).get(name, {}).get("flip_rate")}
    return out


def table(results: dict) -> str:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| suite | choice decisions | accuracy in order | reversed | changed by reversal | rotation flip rate |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['choice_decisions']} | {fmt(r['accuracy_in_order'])} | "
                     f"{fmt(r['accuracy_reversed'])} | {fmt(r['reversal_change_share'])} | "
                     f"{fmt(r['rotation_flip_rate'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model spec (default: the embedded default decision model)")
    ap.add_argument("--suites", default=DEFAULT_SUITES)
    ap.add_argument("--sample", type=int, default=40, help="rows per suite (fixed-seed sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-rotations", action="store_true", help="skip the permute-debiasing run (flip rate)")
    ap.add_argument("--run-dir", default=None, help="keep the two eval run folders here (resumable); default: a "
                    "temporary folder, removed at the end")
    ap.add_argument("--output", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    from noulengine.eval.__main__ import main as eval_main

    common = ["--tasks", args.suites, "--sample", str(args.sample), "--seed", str(args.seed), "--no-plots",
              *(["--model", args.model] if args.model else [])]
    with tempfile.TemporaryDirectory(prefix="order-sensitivity-") as tmp:
        runs = Path(args.run_dir or tmp)
        if eval_main(common + ["--probe", "reverse", "--output", str(runs / "in-order")]) != 0:
            return 1
        in_order = _metrics(runs / "in-order")
        permute = None
        if not args.no_rotations:
            if eval_main(common + ["--debias", "permute", "--output", str(runs / "permute")]) != 0:
                return 1
            permute = _metrics(runs / "permute")
    results = combine(in_order, permute)
    print()
    print(table(results))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"model": args.model or "default", "sample": args.sample,
                                                 "seed": args.seed, "run_dir": args.run_dir,
                                                 "suites": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
