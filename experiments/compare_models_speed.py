#!/usr/bin/env python
"""Experiment behind docs/results.md#base-models-on-the-same-short-budget-issue-22-3 ("Base models on the same short budget (issue #22 §3)"); reproduce: `python experiments/compare_models_speed.py --a runs/compare-bases/smollm2 --b default`.

Decisions/s of two models on the bench's workloads, interleaved in one run.

    python experiments/compare_models_speed.py --a runs/old-default --b default [--workloads agnews_1q,typed_decisions]
        [--reps 3] [--threads 2] [--output runs/speed.json]

Both engines are loaded once; each repetition times ``Engine.decide_batch`` on every workload for
A then B (then B then A on the next repetition, so neither always runs on a warmer machine), with
the bench's own workloads (:func:`noulengine.bench.workloads.build_workloads`, full sizes: 6 Typed-Decisions
states of 5 questions, 200 AG News rows). The cross-request prefix store is cleared before every
timed call, so no model reuses prefixes cached by a previous repetition. It prints decisions/s per
model (median over repetitions), the ratio B/A, and each model's accuracy where the workload has
gold labels. Run it on an otherwise idle machine: it is a timing.

``--a``/``--b`` take anything ``Engine.from_pretrained`` takes, or ``default`` for the embedded
default decision model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--workloads", default="agnews_1q,typed_decisions")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)

    import torch

    from noulengine import Engine
    from noulengine.bench.workloads import build_workloads

    if args.threads:
        torch.set_num_threads(args.threads)
    engines = {}
    for key in ("a", "b"):
        spec = getattr(args, key)
        engines[key] = Engine.from_pretrained(None if spec == "default" else spec)
    wanted = args.workloads.split(",")
    workloads = [w for w in build_workloads(quick=False)[0] if w.name in wanted]
    missing = set(wanted) - {w.name for w in workloads}
    if missing:
        raise SystemExit(f"unknown workloads {sorted(missing)}")
    times = {(w.name, k): [] for w in workloads for k in engines}
    acc = {}
    for w in workloads:  # warm-up (and accuracy) once per model, untimed
        for k, e in engines.items():
            out = e.decide_batch(w.requests)
            if w.golds is not None:
                pairs = [(d.answers[f].label, g) for d, gold in zip(out, w.golds) for f, g in gold.items()
                         if d.error is None]
                acc[(w.name, k)] = sum(a == g for a, g in pairs) / len(pairs)
    for rep in range(args.reps):
        order = ("a", "b") if rep % 2 == 0 else ("b", "a")
        for w in workloads:
            for k in order:
                e = engines[k]
                e.reset_prefix_cache()
                t = time.perf_counter()
                e.decide_batch(w.requests)
                times[(w.name, k)].append(time.perf_counter() - t)
    result = {"a": args.a, "b": args.b, "reps": args.reps, "threads": torch.get_num_threads(), "workloads": {}}
    print(f"| workload | decisions | {args.a} dec/s | {args.b} dec/s | B/A | accuracy A | accuracy B |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for w in workloads:
        n = sum(len(r.questions) for r in w.requests)
        ra, rb = (n / statistics.median(times[(w.name, k)]) for k in ("a", "b"))
        entry = {"decisions": n, "a_decisions_per_s": ra, "b_decisions_per_s": rb, "ratio_b_over_a": rb / ra,
                 "a_seconds": times[(w.name, "a")], "b_seconds": times[(w.name, "b")],
                 "a_accuracy": acc.get((w.name, "a")), "b_accuracy": acc.get((w.name, "b"))}
        result["workloads"][w.name] = entry
        fa = "n/a" if entry["a_accuracy"] is None else f"{entry['a_accuracy']:.3f}"
        fb = "n/a" if entry["b_accuracy"] is None else f"{entry['b_accuracy']:.3f}"
        print(f"| {w.name} | {n} | {ra:.2f} | {rb:.2f} | {rb / ra:.3f} | {fa} | {fb} |")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
