#!/usr/bin/env python
"""Experiment behind docs/performance.md#int8-on-cpu-issue-15-opt-in-and-not-worth-it-for-this-model ("int8 on CPU (issue #15): opt-in, and not worth it for this model"); reproduce: `python experiments/bench_int8.py`.

int8 vs float32 on CPU: accuracy on validation-v1's selection rows and decisions/s, one run.

The 700 ``validation_role: selection`` rows of validation-v1 (400 AG News, 300 WildJailbreak;
never fitted on) are answered by the embedded default model twice, in float32 and with
``--dtype int8`` (dynamic int8 linear layers, float32 head). The rows are split into two halves
and timed in the order f32, int8, f32, int8, so both variants see the same machine state. Prints
accuracy per file (with chance and majority), argmax agreement, max |dp| and the speed ratio.

    python experiments/bench_int8.py [--rows N]   # make_validation.py must have prepared the files
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FILES = ("agnews", "wildjailbreak")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=None, help="selection rows per file at most (default all)")
    p.add_argument("--output", default="bench-results/int8.json")
    args = p.parse_args()

    from noulengine import Engine
    from noulengine.records import load_records

    records = []
    for name in FILES:
        path = REPO / "benchmarks" / "validation-v1" / "prepared" / f"{name}.jsonl"
        result = load_records(path)
        result.raise_if_errors()
        rows = [r for r in result.records if r.validation_role == "selection"][:args.rows]
        records += [(name, r) for r in rows]
    engines = {"float32": Engine.from_pretrained(dtype="float32", device="cpu"),
               "int8": Engine.from_pretrained(dtype="int8", device="cpu")}
    for e in engines.values():
        e.decide_batch([records[0][1].request])  # warm-up
    half = len(records) // 2
    parts = [records[:half], records[half:]]
    seconds = {k: 0.0 for k in engines}
    answers = {k: [] for k in engines}
    for part in parts:
        for name, engine in engines.items():
            t = time.perf_counter()
            answers[name] += engine.decide_batch([r.request for _, r in part])
            seconds[name] += time.perf_counter() - t
    out = {"rows": len(records), "seconds": seconds, "files": {}}
    print(f"{len(records)} validation-v1 selection rows, default model, CPU")
    print("| file | rows | float32 accuracy | int8 accuracy | chance | majority | argmax agree | max |dp| |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for fname in FILES:
        idx = [i for i, (n, _) in enumerate(records) if n == fname]
        gold = []
        stats = {}
        for i in idx:
            rec = records[i][1]
            fld, target = next(iter(rec.targets.items()))
            gold.append((fld, target.label))
        for name in engines:
            stats[name] = sum(answers[name][i].answers[f].label == g for i, (f, g) in zip(idx, gold)) / len(idx)
        agree = sum(answers["float32"][i].answers[f].label == answers["int8"][i].answers[f].label
                    for i, (f, _) in zip(idx, gold))
        dp = max(abs(a - b) for i, (f, _) in zip(idx, gold)
                 for a, b in zip(answers["float32"][i].answers[f].probabilities.values(),
                                 answers["int8"][i].answers[f].probabilities.values()))
        labels = [g for _, g in gold]
        k = len(records[idx[0]][1].request.questions[0].labels)
        majority = max(labels.count(x) for x in set(labels)) / len(labels)
        out["files"][fname] = {"rows": len(idx), "accuracy": stats, "chance": 1 / k, "majority": majority,
                               "argmax_agree": agree, "max_abs_dp": dp}
        print(f"| {fname} | {len(idx)} | {100 * stats['float32']:.2f}% | {100 * stats['int8']:.2f}% | "
              f"{100 / k:.1f}% | {100 * majority:.1f}% | {agree}/{len(idx)} | {dp:.3f} |")
    n = len(records)
    print(f"decisions/s: float32 {n / seconds['float32']:.2f}, int8 {n / seconds['int8']:.2f}; "
          f"int8 / float32 = {seconds['float32'] / seconds['int8']:.2f}x")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
